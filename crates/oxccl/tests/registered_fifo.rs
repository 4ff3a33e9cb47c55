//! Registered buffers may run a FIFO plan: with the built-in H200
//! calibration the selector gives an 8 B AllReduce on 8 ranks the FIFO
//! one-shot under LL, and a large one the direct two-shot. Both must give
//! exact results through the facade.
//!
//! No GPU here: the host backend runs the plans, wrapped so the facade
//! sees what the CUDA backend reports (kind, Simple and LL, 16 channels),
//! with the topology of one H200 given in the configuration so the
//! calibration applies whatever machine runs the test (nothing reads the
//! live driver, sysfs or the environment). The host executor runs an LL
//! plan's FIFOs as Simple ones, which changes timing only.

use std::sync::Arc;
use std::time::Duration;

use oxccl::backend::{self, Backend, Launch, PreparedPlan, RawBuf, Timer};
use oxccl::core::Plan;
use oxccl::{Algo, BackendKind, CollKind, Config, DataType, Error, Proto, RedOp};

/// The host backend, reporting itself as a GPU backend running Simple and
/// LL on 16 channels.
#[derive(Debug)]
struct HostAsGpu(Arc<dyn Backend>);

impl Backend for HostAsGpu {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn describe(&self) -> String {
        format!("{} (reported as a GPU backend)", self.0.describe())
    }
    fn blocking(&self) -> bool {
        self.0.blocking()
    }
    fn registered_alloc(&self) -> bool {
        self.0.registered_alloc()
    }
    fn chunk_bytes(&self) -> usize {
        self.0.chunk_bytes()
    }
    fn max_channels(&self) -> u32 {
        16
    }
    fn protocols(&self) -> &'static [Proto] {
        &[Proto::Simple, Proto::LL]
    }
    fn prepare_plan(&self, plan: &Plan, elem_size: usize, proto: Proto) -> PreparedPlan {
        self.0.prepare_plan(plan, elem_size, proto)
    }
    unsafe fn execute(&self, launch: &Launch<'_>) -> Result<(), Error> {
        // SAFETY: the caller's guarantees are passed on unchanged.
        unsafe { self.0.execute(launch) }
    }
    fn alloc(&self, rank: u32, bytes: usize) -> Result<RawBuf, Error> {
        self.0.alloc(rank, bytes)
    }
    unsafe fn free(&self, rank: u32, buf: RawBuf) {
        // SAFETY: as above.
        unsafe { self.0.free(rank, buf) }
    }
    unsafe fn write(&self, rank: u32, dst: RawBuf, src: &[u8]) -> Result<(), Error> {
        // SAFETY: as above.
        unsafe { self.0.write(rank, dst, src) }
    }
    unsafe fn read(&self, rank: u32, src: RawBuf, dst: &mut [u8]) -> Result<(), Error> {
        // SAFETY: as above.
        unsafe { self.0.read(rank, src, dst) }
    }
    fn synchronize(&self, rank: u32) -> Result<(), Error> {
        self.0.synchronize(rank)
    }
    fn abort(&self, why: &str) {
        self.0.abort(why)
    }
    fn failure(&self) -> Option<Error> {
        self.0.failure()
    }
    fn timer(&self, rank: u32) -> Result<Box<dyn Timer>, Error> {
        self.0.timer(rank)
    }
    fn copy_bandwidth(&self, bytes: usize) -> Result<f64, Error> {
        self.0.copy_bandwidth(bytes)
    }
}

/// Runs an f32 AllReduce of `count` elements on registered buffers on
/// every rank (in place or not), checks every element exactly, and
/// returns rank 0's choice.
fn all_reduce(comms: &[oxccl::Communicator], count: usize, in_place: bool) -> oxccl::Choice {
    let n = comms.len();
    std::thread::scope(|s| {
        for (r, c) in comms.iter().enumerate() {
            s.spawn(move || {
                // Distinct small integers: sums are exact in f32.
                let input: Vec<f32> = (0..count).map(|i| ((i * 7 + r) % 13) as f32).collect();
                let want: Vec<f32> = (0..count)
                    .map(|i| (0..n).map(|q| ((i * 7 + q) % 13) as f32).sum())
                    .collect();
                let send = c.alloc::<f32>(count).unwrap();
                send.copy_from_slice(&input).unwrap();
                if in_place {
                    c.all_reduce(&send, &send, RedOp::Sum).unwrap();
                    assert_eq!(send.to_vec().unwrap(), want, "rank {r}, {count} in place");
                } else {
                    let recv = c.alloc::<f32>(count).unwrap();
                    c.all_reduce(&send, &recv, RedOp::Sum).unwrap();
                    assert_eq!(recv.to_vec().unwrap(), want, "rank {r}, {count}");
                }
            });
        }
    });
    comms[0].last_choice().expect("a collective ran")
}

/// Eight communicators on the wrapped host backend, modelled as ranks
/// sharing one H200 (`config.topology` replaces detection).
fn communicators(config: Config) -> Vec<oxccl::Communicator> {
    let config = Config {
        topology: Some(oxccl_topo::Topology::preset("single-gpu", 1).unwrap()),
        ..config
    };
    let opts = Config {
        deadline: Duration::from_secs(60),
        ..config.clone()
    }
    .backend_options(8);
    let host = backend::host::create(&opts).unwrap();
    oxccl::init_all_on(8, Arc::new(HostAsGpu(host)), config).unwrap()
}

/// `NCCL_ALGO=oneshot`.
fn oneshot_config() -> Config {
    Config {
        algo: oxccl::config::parse_algo_filter("NCCL_ALGO", "oneshot").unwrap(),
        ..Config::default()
    }
}

#[test]
fn registered_all_reduce_is_exact_on_the_fifo_and_the_direct_plan() {
    // One-shot alone (NCCL_ALGO=oneshot), 2 f32: 8 B, its FIFO plan under
    // LL on registered buffers (docs/perf/LOG.md, 2026-12-04 20:28 H200: 30.5-32.5 µs, faster than the
    // direct plan's barriers at that size).
    let comms = communicators(oneshot_config());
    for in_place in [false, true] {
        let c = all_reduce(&comms, 2, in_place);
        assert_eq!(
            (c.algo, c.proto, c.is_direct()),
            (Algo::OneShot, Proto::LL, false),
            "{c}"
        );
    }
    assert_eq!(
        comms[0]
            .choice_for(CollKind::AllReduce, 2, DataType::F32)
            .unwrap(),
        all_reduce(&comms, 2, false)
    );
    // 1 MiB, every algorithm allowed: the direct two-shot on every channel.
    let comms = communicators(Config::default());
    for in_place in [false, true] {
        let c = all_reduce(&comms, 1 << 18, in_place);
        assert_eq!(
            (c.algo, c.proto, c.is_direct()),
            (Algo::TwoShot, Proto::Simple, true),
            "{c}"
        );
    }
    // Sizes between, whatever each picks.
    for count in [1, 3, 256, 1024, 4097, 16 << 10] {
        all_reduce(&comms, count, false);
    }
    // NCCL_PROTO=simple brings the direct one-shot back at 8 B.
    let config = Config {
        proto: oxccl::config::parse_proto_filter("NCCL_PROTO", "simple").unwrap(),
        ..oneshot_config()
    };
    let comms = communicators(config);
    let c = all_reduce(&comms, 2, false);
    assert_eq!(
        (c.algo, c.proto, c.is_direct()),
        (Algo::OneShot, Proto::Simple, true),
        "{c}"
    );
}
