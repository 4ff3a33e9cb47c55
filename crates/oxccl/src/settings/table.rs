//! [`SETTINGS`]: every environment variable oxccl reads, one row each.
//! The README's variable table is generated from it (`cargo xtask
//! settings`), and tidy checks the two agree.

/// Who a variable is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A setting for users, kept stable.
    User,
    /// A knob for measuring alternatives; may change or go.
    Experiment,
    /// Read by a launcher's convention ([`crate::init_from_env`]).
    Launcher,
    /// Makes a test fail instead of skip where the machine must have
    /// something (a GPU, an instruction set).
    Test,
    /// Another program's variable (the CUDA driver's, `tracing`'s) that
    /// oxccl looks at to follow what that program will do.
    Foreign,
}

impl Kind {
    /// The word the README's table uses.
    pub fn word(self) -> &'static str {
        match self {
            Kind::User => "user",
            Kind::Experiment => "experiment",
            Kind::Launcher => "launcher",
            Kind::Test => "test",
            Kind::Foreign => "foreign",
        }
    }
}

/// One environment variable oxccl reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The name oxccl reads first (an `OXCCL_` name where one exists).
    pub name: &'static str,
    /// NCCL's name for the same setting, read where `name` is not set.
    pub nccl: Option<&'static str>,
    /// What applies when neither is set.
    pub default: &'static str,
    /// Unit or form of the value.
    pub unit: &'static str,
    pub kind: Kind,
    /// One line on what it does.
    pub doc: &'static str,
}

const fn s(
    name: &'static str,
    nccl: Option<&'static str>,
    default: &'static str,
    unit: &'static str,
    kind: Kind,
    doc: &'static str,
) -> Setting {
    Setting {
        name,
        nccl,
        default,
        unit,
        kind,
        doc,
    }
}

use Kind::{Experiment, Foreign, Launcher, Test, User};

/// Every variable the library reads, in the README's order.
pub static SETTINGS: &[Setting] = &[
    // The facade's configuration (`Config`).
    s("OXCCL_BACKEND", None, "auto", "host | cuda | auto", User, "Which backend runs a communicator; auto takes CUDA where every rank has a device."),
    s("OXCCL_ALGO", Some("NCCL_ALGO"), "all", "NCCL_ALGO syntax", User, "Algorithms the selector may choose, per collective (`ring,tree`, `^ring`, `allreduce:tree`); NCCL's `nvls`, `collnet*`, `pat` are ignored with a warning."),
    s("OXCCL_PROTO", Some("NCCL_PROTO"), "all", "NCCL_PROTO syntax", User, "Protocols the selector may choose (`simple`, `ll`; NCCL's `ll128` is ignored with a warning), per collective."),
    s("OXCCL_CHANNELS", Some("NCCL_MAX_NCHANNELS"), "the selector's", "count", User, "Caps the channel count of every call."),
    s("OXCCL_DEADLINE_MS", None, "300000 (none through the C ABI)", "ms, 0, off or none", User, "Every wait gives up after this long with an error naming rank, peer and step; 0, off or none waits for ever."),
    s("OXCCL_WAIT_WARN_MS", None, "10000", "ms", User, "A wait for peers that have not reached a call, a call enqueued on a GPU that has not completed, or a rendezvous at init whose ranks have not all joined, warns on stderr after this long, naming them and the call."),
    s("OXCCL_WAIT_WARN_EVERY_MS", None, "60000", "ms", User, "How often that warning repeats while the wait goes on."),
    s("OXCCL_CHUNK_BYTES", None, "the backend's slot", "bytes (64K, 1M)", User, "Piece size plans pipeline in."),
    s("OXCCL_LL1_BYTES", None, "64K", "bytes (K/M), 0 off", User, "Largest AllReduce per rank the one-step LL path (`ll1`) serves; each rank's LL slots take 2 × ranks × twice this, at most 16 MiB (the limit shrinks to fit at many ranks; every process of a communicator must set the same); larger calls forced to `ll1` run the FIFO one-shot."),
    s("OXCCL_DETERMINISTIC", None, "0", "0 | 1", User, "AllReduce, Reduce and ReduceScatter reduce every element in rank order from the original inputs, so results are bit-identical whatever the algorithm, protocol, channels, piece or call size; the selector keeps to such plans (every rank must agree)."),
    s("OXCCL_CHECK_CALLS", None, "1", "0 | 1 | all", User, "Compare every call with the peers' before data moves; all extends it to ranks over the network."),
    s("OXCCL_DEBUG", Some("NCCL_DEBUG"), "none", "NONE | VERSION | WARN | ABORT | INFO | TRACE", User, "Logging to stderr through `tracing`."),
    s("OXCCL_DEBUG_SUBSYS", Some("NCCL_DEBUG_SUBSYS"), "INIT,BOOTSTRAP,ENV", "NCCL_DEBUG_SUBSYS syntax", User, "Subsystems whose INFO lines show (`INIT,COLL`, `ALL`, `^NET`): INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV, ALLOC, CALL, PROXY, BOOTSTRAP, PROFILE; per-call lines are COLL's."),
    // Tools that watch the library.
    s("NCCL_NVTX_DISABLE", None, "0", "0 | 1", User, "1 turns off the NVTX ranges (one per API call, domain NCCL) an attached profiler would see."),
    s("NCCL_PROFILER_PLUGIN", None, "libnccl-profiler.so where present", "name or path", User, "NCCL profiler plugin to drive: `X` loads libnccl-profiler-X.so, a path loads that file; one that fails to load is a warning."),
    s("OXCCL_TRACE", None, "off", "path", User, "Writes a Chrome trace (Perfetto, chrome://tracing) of every rank's calls and plan steps there; ranks as processes add `.rankN`."),
    s("OXCCL_TRACE_CALLS", None, "64", "count", User, "Calls per rank the trace records (from the first)."),
    s("OXCCL_TOPO_FILE", Some("NCCL_TOPO_FILE"), "detect", "path", User, "An NCCL topology XML file describing the machine instead of detecting it."),
    // The bootstrap.
    s("NCCL_COMM_ID", None, "a root in the calling process", "host:port", User, "Where rank 0 runs the rendezvous root; every rank derives the id from it."),
    s("OXCCL_COMM_SECRET", None, "none", "string", User, "A secret every rank of the job shares, which the rendezvous proves membership with."),
    s("NCCL_SOCKET_IFNAME", None, "any, best first", "prefixes, ^ or =", User, "Interfaces the bootstrap listens on (`eth`, `^docker`, `=ib0`)."),
    s("NCCL_SOCKET_FAMILY", None, "either", "AF_INET | AF_INET6", User, "Address family the bootstrap listens on."),
    s("OXCCL_HOSTID", Some("NCCL_HOSTID"), "host name and boot id", "string", User, "Replaces this machine's identity: ranks given different ids talk as if on different hosts."),
    // The host backend and its network transport.
    s("OXCCL_NET_CHANNELS", None, "4", "1 to 32", User, "Channels connected per peer over the network."),
    s("OXCCL_SOCKET_NTHREADS", Some("NCCL_SOCKET_NTHREADS"), "from the cores", "1 to 16", User, "Helper threads per network connection (every rank must agree)."),
    s("OXCCL_NSOCKS_PERTHREAD", Some("NCCL_NSOCKS_PERTHREAD"), "2", "1 to 64", User, "Sockets per helper thread; threads times sockets at most 64."),
    s("OXCCL_P2P_DISABLE", Some("NCCL_P2P_DISABLE"), "0", "0 | 1", User, "With the SHM twin also 1: ranks of one host talk over the network."),
    s("OXCCL_SHM_DISABLE", Some("NCCL_SHM_DISABLE"), "0", "0 | 1", User, "With the P2P twin also 1: ranks of one host talk over the network."),
    s("NCCL_NET_PLUGIN", None, "libnccl-net.so if the loader finds it", "names, paths or none", User, "Network plugins to load (`X` is `libnccl-net-X.so`); `none`: the built-in TCP."),
    s("NCCL_NET", None, "the first plugin that loads, else Socket", "a network's name", User, "Which network to use by name: a loaded plugin's, or `Socket` (built-in TCP)."),
    s("OXCCL_NET_SEND_BY_REF", None, "1", "0 | 1", Experiment, "Network sends leave straight from the rank's buffers where they can."),
    s("OXCCL_NET_RECV_IN_PLACE", None, "1", "0 | 1", Experiment, "Network receives land straight in the rank's buffers where they can."),
    // Plans.
    s("OXCCL_PUSH_GROUP", None, "the generators'", "count", Experiment, "Most outputs one pushing step writes."),
    s("OXCCL_P2P_DIRECT", None, "1", "0 | 1", Experiment, "Direct Send/Recv plans; 0 sends through the FIFOs."),
    // The CUDA backend.
    s("OXCCL_CACHE_DIR", None, "$XDG_CACHE_HOME/oxccl", "path", User, "Where compiled kernels are cached."),
    s("OXCCL_PROC_HEAP", None, "a share of the device", "bytes (K/M/G)", User, "Each rank's device heap when ranks are processes."),
    s("OXCCL_CUDA_PROCS", None, "from MPS and sharing", "device | staged", Experiment, "Forces the path of CUDA ranks as processes."),
    s("OXCCL_LAUNCH_GATE", None, "auto", "auto | on | off", Experiment, "Whether a launch waits for the launches its kernel depends on."),
    s("OXCCL_BLOCK_SMEM", None, "0", "bytes", Experiment, "Shared memory each executor block reserves and does not use."),
    s("OXCCL_RELAUNCH", None, "0", "0 | 1", User, "CUDA kernels never wait for a peer's: a block stops where a peer is not ready and the host launches again until the call is done (for compute-sanitizer, which runs kernels one at a time); calls are synchronous and cannot be captured."),
    // Launchers (`init_from_env`).
    s("RANK", None, "", "integer", Launcher, "torchrun: this process's rank."),
    s("WORLD_SIZE", None, "", "integer", Launcher, "torchrun: the rank count."),
    s("LOCAL_RANK", None, "0", "integer", Launcher, "torchrun: the rank on this host."),
    s("OMPI_COMM_WORLD_RANK", None, "", "integer", Launcher, "Open MPI: this process's rank."),
    s("OMPI_COMM_WORLD_SIZE", None, "", "integer", Launcher, "Open MPI: the rank count."),
    s("OMPI_COMM_WORLD_LOCAL_RANK", None, "0", "integer", Launcher, "Open MPI: the rank on this host."),
    s("PMI_RANK", None, "", "integer", Launcher, "PMI launchers (MPICH's Hydra and others): this process's rank."),
    s("PMI_SIZE", None, "", "integer", Launcher, "PMI launchers: the rank count."),
    s("MPI_LOCALRANKID", None, "0", "integer", Launcher, "PMI launchers (Hydra): the rank on this host."),
    s("SLURM_PROCID", None, "", "integer", Launcher, "Slurm: this process's rank."),
    s("SLURM_NTASKS", None, "", "integer", Launcher, "Slurm: the rank count."),
    s("SLURM_LOCALID", None, "0", "integer", Launcher, "Slurm: the rank on this host."),
    s("MASTER_ADDR", None, "", "host", Launcher, "With MASTER_PORT: rank 0's root listens at MASTER_PORT + 1 there (NCCL_COMM_ID wins)."),
    s("MASTER_PORT", None, "", "port", Launcher, "See MASTER_ADDR."),
    // Tests.
    s("OXCCL_REQUIRE_GPU", None, "0", "0 | 1", Test, "GPU tests fail instead of skipping where no device is found."),
    s("OXCCL_REQUIRE_FP16", None, "0", "0 | 1", Test, "The AVX-512 FP16 tests fail instead of skipping on a CPU without it."),
    // Other programs' variables.
    s("CUDA_DEVICE_MAX_CONNECTIONS", None, "set to fit the ranks", "count", Foreign, "The driver's hardware queues per context; oxccl sets it before cuInit unless the user did."),
    s("CUDA_MODULE_LOADING", None, "EAGER on old drivers", "LAZY | EAGER", Foreign, "The driver's module loading; oxccl asks for EAGER before cuInit where it cannot preload, unless the user chose."),
    s("CUDA_MPS_PIPE_DIRECTORY", None, "/tmp/nvidia-mps", "path", Foreign, "Where oxccl looks for a running MPS daemon."),
    s("NVTX_INJECTION64_PATH", None, "", "path", Foreign, "The NVTX tool a profiler attaches (Nsight Systems sets it); oxccl loads it for its ranges."),
    s("RUST_LOG", None, "", "tracing filter", Foreign, "Refines the OXCCL_DEBUG filter."),
];

/// The row of `name` (an `OXCCL_`/first name or an NCCL twin).
pub fn setting(name: &str) -> Option<&'static Setting> {
    SETTINGS
        .iter()
        .find(|s| s.name == name || s.nccl == Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_rows_are_complete() {
        let mut names: Vec<&str> = SETTINGS
            .iter()
            .flat_map(|s| std::iter::once(s.name).chain(s.nccl))
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a name appears twice");
        for s in SETTINGS {
            assert!(!s.doc.is_empty() && !s.unit.is_empty(), "{}", s.name);
        }
    }
}
