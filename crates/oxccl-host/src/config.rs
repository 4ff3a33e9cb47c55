//! Tuning knobs of a [`crate::HostFabric`].

use std::time::Duration;

/// How a host fabric sizes its connections and how long it waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Longest any single wait (for a message, a free slot or a signal) may
    /// last before the collective fails with [`crate::HostError::Deadline`].
    /// Default 300 s: generous, because a slow peer is not a hung one.
    /// [`crate::HostFabric::set_deadline`] changes it on a live fabric.
    pub deadline: Duration,
    /// A wait inside a plan warns on stderr (with or without a `tracing`
    /// subscriber) after this long, naming what it waits for and the ranks
    /// not yet in the call; default 10 s.
    pub warn_after: Duration,
    /// Then again every this long while it goes on; default a minute.
    pub warn_every: Duration,
    /// Message slots per connection. At least
    /// [`oxccl_core::interp::MIN_FIFO_DEPTH`] (the depth plans are checked
    /// at); default 8.
    pub slots: usize,
    /// Bytes per slot: the largest message a plan may send. Default 512 KiB;
    /// callers size the plan's chunk as `slot_bytes / elem_size`.
    pub slot_bytes: usize,
    /// Idle rounds spent spinning (crossbeam `Backoff::snooze`, which spins
    /// then yields) before a rank parks until a peer wakes it. Ranks over
    /// the network park at once (see `HostFabric::spin`).
    pub spin: u32,
    /// Ranks in several processes: bytes of each rank's shared heap
    /// (registered buffers and scratch). Reserved, not committed: pages
    /// cost memory only once touched. Default 16 GiB.
    pub shm_heap_bytes: usize,
    /// Ranks over the network: channels connected per peer at setup (each
    /// a connection per direction); plans may use at most this many.
    /// Default 4 (a ring needs about that many to keep a link busy:
    /// `oxccl_topo::policy::NET_CHANNELS_TO_FILL`), at most 32;
    /// `OXCCL_NET_CHANNELS` sets it through the facade.
    pub net_channels: usize,
    /// Ranks as processes of one host: use the network transport anyway
    /// (as `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1` do). Ranks on different
    /// hosts always use it.
    pub force_network: bool,
    /// Ranks over the network: the proxy sends a message straight from the
    /// rank's buffers where the step that makes it leaves it there (a copy
    /// of a local range, or a result also written locally), instead of
    /// from a FIFO slot the executor copied it into: one memory pass less
    /// per byte sent. Default on; `OXCCL_NET_SEND_BY_REF=0` turns it off.
    pub net_send_by_reference: bool,
    /// Ranks over the network: the proxy receives a message straight into
    /// the local range the step consuming it copies it to, where no other
    /// step of the call touches that range, instead of into a FIFO slot
    /// the executor copies from: one memory pass less per byte received.
    /// Default on; `OXCCL_NET_RECV_IN_PLACE=0` turns it off.
    pub net_receive_in_place: bool,
    /// Ranks over the network: the cores this rank's socket threads may
    /// use, from which each rank proposes its connections' default layout
    /// (`oxccl_net::config::auto_sockets`; the ranks then agree on one).
    /// Default 0: what the system grants the process
    /// (`std::thread::available_parallelism`).
    pub net_cores: usize,
    /// Ranks over the network: the socket layout the user set
    /// (`NCCL_SOCKET_NTHREADS`, `NCCL_NSOCKS_PERTHREAD`), proposed to the
    /// peers in place of this rank's default.
    pub net_sockets: oxccl_net::config::SocketSettings,
    /// Ranks over the network: the network plugins to load
    /// (`NCCL_NET_PLUGIN`: a comma-separated list of names or paths, or
    /// `none`). `None`: unset, so `libnccl-net.so` is used if the loader
    /// finds one (as NCCL does), else the built-in TCP transport.
    pub net_plugin: Option<String>,
    /// Ranks over the network: the network to use by name (`NCCL_NET`: a
    /// loaded plugin's, or `Socket` for the built-in one). `None`: the
    /// first plugin that loads, else the built-in one.
    pub net_name: Option<String>,
}

/// Most channels per peer over the network ([`HostConfig::net_channels`]).
pub const MAX_NET_CHANNELS: usize = crate::shm::MAX_CHANNELS;

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            deadline: oxccl_bootstrap::DEFAULT_DEADLINE,
            warn_after: Duration::from_secs(10),
            warn_every: Duration::from_secs(60),
            slots: 8,
            slot_bytes: oxccl_core::interp::DEFAULT_SLOT_BYTES,
            spin: 64,
            shm_heap_bytes: 16 << 30,
            net_channels: 4,
            force_network: false,
            net_send_by_reference: true,
            net_receive_in_place: true,
            net_cores: 0,
            net_sockets: oxccl_net::config::SocketSettings::default(),
            net_plugin: None,
            net_name: None,
        }
    }
}

impl HostConfig {
    /// `self` with every field forced into its legal range: at least
    /// `MIN_FIFO_DEPTH` slots (and at most `shm::MAX_SLOTS`) and at least 8 bytes per slot (one element of
    /// the widest type), so a config can never make a fabric that deadlocks
    /// a checked plan.
    pub(crate) fn sanitized(mut self) -> Self {
        self.slots = self
            .slots
            .clamp(oxccl_core::interp::MIN_FIFO_DEPTH, crate::shm::MAX_SLOTS);
        self.slot_bytes = self.slot_bytes.max(8);
        self.net_channels = self.net_channels.clamp(1, crate::shm::MAX_CHANNELS);
        self
    }
}
