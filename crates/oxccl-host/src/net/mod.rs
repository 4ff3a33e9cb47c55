//! Ranks in processes that talk over the network ([`oxccl_net`]): on
//! different hosts (the bootstrap's host identities differ), or on one
//! host with `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1` (or `OXCCL_` twins,
//! or [`crate::HostConfig::force_network`]).
//!
//! Each link `(channel, from, to)` is an ordinary FIFO in this process:
//! the executor runs unchanged on it, and the proxy thread ([`proxy`])
//! carries its messages to and from the peer's process. Connections are
//! made at setup, for every peer and each of `net_channels` channels, in
//! both directions: every rank listens once per (peer, channel), the
//! handles travel in one bootstrap all-gather, then every rank connects to
//! its peers' listeners and accepts its own (TCP completes a connect
//! before the accept, so no order between ranks is needed). One more
//! connection per ordered pair, the control connection, carries only the
//! reason a rank failed, sent before it closes the others.

mod events;
pub(crate) mod hop;
mod proxy;

pub use events::{ProxyEvents, StepState};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{unbounded, Sender};
use crossbeam::sync::{Parker, Unparker};
use oxccl_bootstrap::Bootstrap;
use oxccl_core::plan::Rank;
use oxccl_net::config::{auto_sockets, Proposal};
use oxccl_net::{
    Buf, ListenComm, Net, NetError, NetHandle, RecvComm, Region, SendComm, TcpConfig, TcpNet,
    HANDLE_BYTES,
};
use parking_lot::Mutex;

use crate::error::HostError;
use crate::fifo::Link;
use crate::HostConfig;
use proxy::{Control, End, Entry, Pump, Shared, REASON_BYTES};

/// The network part of a fabric whose ranks are processes.
#[derive(Debug)]
pub(crate) struct NetPart {
    pub me: Rank,
    pub channels: usize,
    sh: Arc<Shared>,
    sends: HashMap<(usize, Rank), SendComm>,
    recvs: HashMap<(usize, Rank), RecvComm>,
    /// Control connections to each peer (see the module's docs).
    ctl_sends: HashMap<Rank, SendComm>,
    ctl_recvs: Vec<RecvComm>,
    tx: Sender<Entry>,
    /// The proxy's work, which the executor runs too ([`proxy`]).
    pump: Arc<Mutex<Pump>>,
    slots: usize,
    /// Whether sending links let the executor publish by reference.
    send_by_reference: bool,
    /// Whether receiving links let the executor ask for landings.
    land_in_place: bool,
    proxy: Mutex<Option<JoinHandle<()>>>,
    closed: Mutex<bool>,
    /// How long a clean shutdown waits for published messages to leave.
    flush: Duration,
    /// How connections are named in logs: `NET/Socket/0`.
    pub via: String,
    /// This rank's address on the network.
    pub ip: std::net::IpAddr,
    /// The network's bandwidth per host as every rank agreed it (the
    /// slowest rank's [`link_bandwidth`]), GB/s; 0 where unknown.
    pub bw_gbps: f64,
    /// One hop's latency in µs as every rank agreed it, measured once the
    /// fabric can run plans ([`hop::measure`]).
    pub hop_us: std::sync::OnceLock<f64>,
    /// The latency the network's device states, µs, the largest of every
    /// rank's (0 where none states one, as the built-in TCP).
    pub device_latency_us: f64,
    /// The network's device as its transport states it (for the
    /// topology: name, PCI path, speed, latency); `None` where it failed
    /// to say.
    pub device: Option<oxccl_net::Properties>,
    /// Every connection's layout as the ranks agreed it: threads, and
    /// sockets per thread (the built-in TCP transport; `None` over a
    /// plugin, which lays out its own connections).
    pub sockets: Option<(usize, usize)>,
}

/// Bytes of the stream measured where the interface's speed is unknown:
/// enough to leave the slow start behind, short enough for setup.
const PROBE_BYTES: usize = 4 << 20;

/// This rank's network bandwidth, GB/s, for the cost model: the
/// interface's speed (NCCL's `speed`) where the system states one, else
/// (loopback, virtual interfaces) one TCP stream measured on it now, the
/// best of three; 0 if even that fails.
fn link_bandwidth(net: &dyn Net, ip: std::net::IpAddr, deadline: Duration) -> f64 {
    match net.properties(0) {
        Ok(p) if p.speed_mbps > 0 => f64::from(p.speed_mbps) / 8000.0,
        _ => oxccl_net::stream_throughput(ip, PROBE_BYTES, 3, deadline.min(Duration::from_secs(5)))
            .unwrap_or(0.0),
    }
}

/// The cores this rank's socket threads may use (`cfg.net_cores`, else
/// what the system grants this process) and how many ranks share them:
/// the ranks of this host (same host identity, or same address: ranks given
/// different `NCCL_HOSTID`s on one machine still share its cores).
fn share(boot: &Bootstrap, cfg: &HostConfig) -> (usize, usize) {
    let cores = if cfg.net_cores > 0 {
        cfg.net_cores
    } else {
        std::thread::available_parallelism().map_or(1, |c| c.get())
    };
    let descs = boot.descs();
    let mine = &descs[boot.rank() as usize];
    let local = descs
        .iter()
        .filter(|d| d.host == mine.host || d.listen.ip() == mine.listen.ip())
        .count();
    (cores, local.max(1))
}

/// The layout every rank takes, agreed through `boot` before anyone
/// listens: every rank must lay out the same channels (`nch`) and slots,
/// and every connection its sockets alike, so the ranks swap those and
/// their socket proposals (`NCCL_SOCKET_NTHREADS`/`NCCL_NSOCKS_PERTHREAD`
/// where set, else this host's default for `conns` connections) and take
/// [`oxccl_net::config::agree`]'s answer.
fn agree_layout(
    boot: &Bootstrap,
    cfg: &HostConfig,
    nch: usize,
    conns: usize,
    network: &str,
) -> Result<TcpConfig, HostError> {
    let me = boot.rank();
    let key = format!(
        "{nch} channels, {} slots of {} bytes, network {network}",
        cfg.slots, cfg.slot_bytes
    );
    let (cores, local) = share(boot, cfg);
    let auto = auto_sockets(cores, local, conns);
    let mine = Proposal::new(&cfg.net_sockets, auto);
    let mut record = mine.encode().to_vec();
    record.extend_from_slice(key.as_bytes());
    let mut props = Vec::with_capacity(boot.nranks() as usize);
    for (q, rec) in boot.all_gather(&record)?.iter().enumerate() {
        let (p, theirs) = rec.split_at(Proposal::BYTES.min(rec.len()));
        if theirs != key.as_bytes() {
            return Err(HostError::Net(format!(
                "rank {q} configures the network as {:?}, rank {me} as {key:?}: configure every rank alike",
                String::from_utf8_lossy(theirs)
            )));
        }
        props
            .push(Proposal::decode(p).map_err(|e| {
                HostError::Net(format!("rank {q} sent a bad socket proposal: {e}"))
            })?);
    }
    let (nthreads, per_thread) = oxccl_net::config::agree(&props).map_err(net_err)?;
    if network != oxccl_net::plugin::BUILT_IN {
        return Ok(TcpConfig {
            deadline: cfg.deadline,
            ..TcpConfig::default()
        });
    }
    tracing::info!(
        "oxccl-host: NET/Socket : Using {nthreads} threads and {per_thread} sockets per thread \
         per connection (agreed by every rank; rank {me} proposed {} x {}, its default {} x {} \
         for {cores} cores shared by {local} ranks of this host)",
        mine.nthreads,
        mine.nsocks_per_thread,
        auto.0,
        auto.1
    );
    Ok(TcpConfig {
        nthreads,
        nsocks_per_thread: per_thread,
        deadline: cfg.deadline,
        ..TcpConfig::default()
    })
}

fn net_err(e: NetError) -> HostError {
    HostError::Net(e.to_string())
}

/// The interface holding `ip`, for the device's name.
fn iface_name(ip: std::net::IpAddr) -> String {
    oxccl_bootstrap::iface::list()
        .into_iter()
        .find(|i| i.addr == ip)
        .map_or_else(|| ip.to_string(), |i| i.name)
}

/// The slowest rank's bandwidth figure (the first 8 bytes of each rank's
/// setup record), so every rank models the same network; 0 where unknown.
fn slowest_bandwidth(all: &[Vec<u8>]) -> f64 {
    let bw = all
        .iter()
        .map(|rec| word(rec, 0))
        .fold(f64::INFINITY, f64::min);
    if bw.is_finite() {
        bw.max(0.0)
    } else {
        0.0
    }
}

/// The most latency any rank's network device states, µs: every rank
/// prices the network alike, so every rank's selector picks the same plan
/// (a device that states more on one host than on another would
/// otherwise split the picks at the sizes where the latency decides).
fn largest_latency(all: &[Vec<u8>]) -> f64 {
    all.iter()
        .map(|rec| word(rec, 1))
        .filter(|l| l.is_finite())
        .fold(0.0, f64::max)
}

/// Word `i` (an `f64`) of a rank's record; 0 where the record is short.
fn word(rec: &[u8], i: usize) -> f64 {
    rec.get(8 * i..8 * i + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0.0, f64::from_le_bytes)
}

/// Bytes before the handles in a rank's record: its link bandwidth and
/// its device's stated latency.
const RECORD_HEAD: usize = 16;

/// Every `(channel, peer)` connection of a rank: sending and receiving ends.
type Conns = (
    HashMap<(usize, Rank), SendComm>,
    HashMap<(usize, Rank), RecvComm>,
);

/// Connects to every peer's listener (`dials`, each with the handle it
/// sent) and accepts every peer's connection to this rank's listeners
/// (`listens`, each closed once it has served), all at once and before
/// `deadline`: a plugin's `connect` may complete only once the peer has
/// called `accept` (and TCP's the other way round), so neither side may
/// wait for one before starting the other.
fn connect_all(
    net: &dyn Net,
    mut dials: Vec<((usize, Rank), NetHandle)>,
    mut listens: Vec<((usize, Rank), ListenComm)>,
    deadline: Instant,
    me: Rank,
) -> Result<Conns, HostError> {
    let (mut sends, mut recvs) = (HashMap::new(), HashMap::new());
    while !(dials.is_empty() && listens.is_empty()) {
        let before = dials.len() + listens.len();
        let mut i = 0;
        while i < dials.len() {
            let ((c, q), h) = &mut dials[i];
            let (c, q) = (*c, *q);
            match net.connect(0, h).map_err(|e| {
                HostError::Net(format!(
                    "rank {me}: connecting to rank {q} on channel {c} over NET/{}: {e}",
                    net.name()
                ))
            })? {
                Some(s) => {
                    sends.insert((c, q), s);
                    dials.swap_remove(i);
                }
                None => i += 1,
            }
        }
        let mut i = 0;
        while i < listens.len() {
            let ((c, p), l) = listens[i];
            match net.accept(l).map_err(|e| {
                HostError::Net(format!(
                    "rank {me}: accepting rank {p}'s connection on channel {c} over NET/{}: {e}",
                    net.name()
                ))
            })? {
                Some(r) => {
                    let _ = net.close_listen(l);
                    recvs.insert((c, p), r);
                    listens.swap_remove(i);
                }
                None => i += 1,
            }
        }
        if dials.len() + listens.len() == before {
            let (what, (c, p)) = match (dials.first(), listens.first()) {
                (Some((k, _)), _) => ("connect to", *k),
                (None, Some((k, _))) => ("accept", *k),
                (None, None) => break,
            };
            wait_or_timeout(deadline, me, p, c, what)?;
        }
    }
    Ok((sends, recvs))
}

/// Listens for every peer's `conns` connections, trades the handles
/// (and each rank's measured link bandwidth and its device's stated
/// latency) over `boot`, and connects: the slowest rank's bandwidth in
/// GB/s, the largest stated latency in µs, and every connection's ends.
fn connect_peers(
    net: &dyn Net,
    boot: &Bootstrap,
    cfg: &HostConfig,
    peers: &[Rank],
    conns: usize,
    ip: std::net::IpAddr,
    latency_us: f64,
) -> Result<(f64, f64, Conns), HostError> {
    let me = boot.rank();
    let mut listens = Vec::new();
    let mut record = Vec::with_capacity(RECORD_HEAD + peers.len() * conns * HANDLE_BYTES);
    record.extend_from_slice(&link_bandwidth(net, ip, cfg.deadline).to_le_bytes());
    record.extend_from_slice(&latency_us.to_le_bytes());
    for &p in peers {
        for c in 0..conns {
            let (h, l) = net.listen(0).map_err(net_err)?;
            record.extend_from_slice(&h.0);
            listens.push(((c, p), l));
        }
    }
    let all = boot.all_gather(&record)?;
    let deadline = Instant::now() + cfg.deadline.min(oxccl_bootstrap::MAX_LIMIT);
    let bw_gbps = slowest_bandwidth(&all);
    let latency_us = largest_latency(&all);
    let mut dials = Vec::new();
    for &q in peers {
        let rec = &all[q as usize];
        // Our place among q's peers (q lists every rank but itself).
        let slot = if me < q { me } else { me - 1 } as usize;
        for c in 0..conns {
            let at = RECORD_HEAD + (slot * conns + c) * HANDLE_BYTES;
            let bytes = rec.get(at..at + HANDLE_BYTES).unwrap_or_default();
            let h = NetHandle::from_bytes(bytes).map_err(|e| {
                HostError::Net(format!("rank {q} sent a bad handle for channel {c}: {e}"))
            })?;
            dials.push(((c, q), h));
        }
    }
    Ok((
        bw_gbps,
        latency_us,
        connect_all(net, dials, listens, deadline, me)?,
    ))
}

/// NCCL's per-channel INFO lines: which network each connection takes.
fn log_channels(
    me: Rank,
    nch: usize,
    peers: &[Rank],
    via: &str,
    plugin: Option<&str>,
    tcfg: &TcpConfig,
) {
    let layout = match plugin {
        Some(p) => format!("plugin {p}"),
        None => format!(
            "{} sockets: {} threads x {}",
            tcfg.nsocks(),
            tcfg.nthreads,
            tcfg.nsocks_per_thread
        ),
    };
    for c in 0..nch {
        for &p in peers {
            tracing::info!("oxccl-host: Channel {c:02} : {me} -> {p} [send] via {via} ({layout})");
            tracing::info!("oxccl-host: Channel {c:02} : {p} -> {me} [receive] via {via}");
        }
    }
}

impl NetPart {
    /// Connects this rank to every peer over the network through `boot`.
    /// `rank` wakes this process's rank when the proxy moved something.
    pub fn new(boot: &Bootstrap, cfg: &HostConfig, rank: Unparker) -> Result<NetPart, HostError> {
        let me = boot.rank();
        let n = boot.nranks();
        let nch = cfg.net_channels;
        // Channel `nch` is the control connection.
        let conns = nch + 1;
        let ip = boot.descs()[me as usize].listen.ip();
        let send_by_reference = cfg.net_send_by_reference;
        let land_in_place = cfg.net_receive_in_place;
        let peers: Vec<Rank> = (0..n).filter(|&p| p != me).collect();
        // A plugin the user named (or `libnccl-net.so`), else the built-in
        // TCP transport; every rank must end up on the same network.
        let chosen = oxccl_net::plugin::select(
            cfg.net_plugin.as_deref(),
            cfg.net_name.as_deref(),
            boot.magic(),
        )
        .map_err(|e| HostError::Net(format!("rank {me}: choosing the network: {e}")))?;
        let network = chosen
            .net
            .as_ref()
            .map_or(oxccl_net::plugin::BUILT_IN.to_string(), |p| {
                p.name().to_string()
            });
        let tcfg = agree_layout(boot, cfg, nch, peers.len() * conns * 2, &network)?;
        let parker = Parker::new();
        let pu = parker.unparker().clone();
        let rank_waits = Arc::new(AtomicBool::new(false));
        let (waits, ru) = (rank_waits.clone(), rank.clone());
        // A completion wakes whoever runs the next pass: the executor when
        // it is parked on the network (it runs one as it wakes), else the
        // proxy thread.
        let waker: oxccl_net::Waker = Arc::new(move || {
            if waits.load(Ordering::SeqCst) {
                ru.unpark();
            } else {
                pu.unpark();
            }
        });
        let plugin = chosen.net.as_ref().map(|p| {
            let lib = p.lib();
            format!(
                "{} from {}, ncclNetPlugin_v{}",
                lib.name, lib.path, lib.version
            )
        });
        let net: Arc<dyn Net> = match chosen.net {
            Some(p) => p,
            None => Arc::new(TcpNet::new(
                tcfg.clone(),
                boot.magic(),
                boot.layer_key("net"),
                &iface_name(ip),
                ip,
                Some(waker),
            )),
        };
        let props = net.properties(0).ok();
        let device_latency_us = props
            .as_ref()
            .map_or(0.0, |p| p.latency.as_secs_f64() * 1e6);
        if let Some(p) = &props {
            tracing::info!(
                "oxccl-host: rank {me} uses NET/{}/0: {} (pci {}), {} Mb/s, latency {:?}{}",
                net.name(),
                p.name,
                p.pci_path.as_deref().unwrap_or("none"),
                p.speed_mbps,
                p.latency,
                plugin
                    .as_deref()
                    .map(|p| format!(", plugin {p}"))
                    .unwrap_or_default()
            );
        }
        let (bw_gbps, device_latency_us, (mut sends, mut recvs)) =
            connect_peers(&*net, boot, cfg, &peers, conns, ip, device_latency_us)?;
        let ctl_sends: HashMap<Rank, SendComm> = peers
            .iter()
            .filter_map(|&p| sends.remove(&(nch, p)).map(|s| (p, s)))
            .collect();
        let controls: Vec<Control> = peers
            .iter()
            .filter_map(|&p| recvs.remove(&(nch, p)).map(|r| Control::new(p, r)))
            .collect();
        let ctl_recvs = controls.iter().map(|c| c.comm).collect();
        let via = format!("NET/{}/0", net.name());
        log_channels(me, nch, &peers, &via, plugin.as_deref(), &tcfg);
        let sh = Arc::new(Shared {
            polled: !net.wakes(),
            net,
            me,
            lost: (0..n).map(|_| Mutex::new(None)).collect(),
            stop: Default::default(),
            draining: Default::default(),
            drained: Default::default(),
            rank,
            rank_waits,
            proxy: parker.unparker().clone(),
        });
        let (tx, rx) = unbounded();
        let pump = Arc::new(Mutex::new(Pump::new(rx, controls)));
        let (sh2, pump2) = (sh.clone(), pump.clone());
        let proxy = std::thread::Builder::new()
            .name(format!("oxccl-proxy-r{me}"))
            .spawn(move || proxy::run(sh2, pump2, parker))
            .map_err(|e| HostError::Net(format!("spawning the proxy thread: {e}")))?;
        // Nobody sends before every rank has its connections.
        boot.barrier()?;
        Ok(NetPart {
            me,
            channels: nch,
            sh,
            sends,
            recvs,
            ctl_sends,
            ctl_recvs,
            tx,
            pump,
            slots: cfg.slots,
            send_by_reference,
            land_in_place,
            proxy: Mutex::new(Some(proxy)),
            closed: Mutex::new(false),
            flush: cfg.deadline.min(oxccl_bootstrap::MAX_LIMIT),
            via,
            ip,
            bw_gbps,
            hop_us: std::sync::OnceLock::new(),
            device_latency_us,
            device: props,
            sockets: plugin
                .is_none()
                .then_some((tcfg.nthreads, tcfg.nsocks_per_thread)),
        })
    }

    /// A new link `(channel, from, to)` (one end is this rank): hands it
    /// to the proxy.
    pub fn attach(&self, link: &Arc<Link>, channel: usize, from: Rank, to: Rank) {
        let (end, peer) = if from == self.me {
            match self.sends.get(&(channel, to)) {
                Some(&s) => {
                    if self.send_by_reference {
                        link.send_by_reference();
                    }
                    (End::Send(s), to)
                }
                None => return,
            }
        } else {
            match self.recvs.get(&(channel, from)) {
                Some(&r) => {
                    if self.land_in_place {
                        link.land_in_place();
                    }
                    (End::Recv(r), from)
                }
                None => return,
            }
        };
        let _ = self
            .tx
            .send(Entry::new(link.clone(), end, peer, channel, self.slots));
        self.kick();
    }

    /// An observed call begins on `links` (each with its message count).
    pub fn open_windows(&self, events: &Arc<dyn ProxyEvents>, links: &[(Arc<Link>, u64)]) {
        self.pump.lock().open_windows(events, links);
    }

    /// The observed call returned.
    pub fn close_windows(&self) {
        self.pump.lock().close_windows();
    }

    /// The executor published or drained a slot: it runs a pass itself
    /// (a small message leaves from this thread, no wake-up), or, when the
    /// proxy thread is in one, makes that thread run another.
    pub fn kick(&self) {
        match self.pump.try_lock() {
            Some(mut p) => {
                p.pass(&self.sh);
            }
            None => self.sh.proxy.unpark(),
        }
    }

    /// The executor's park while it waits (`park` sleeps): a pass first
    /// (what it waits for may be in), then, parked, the transport's
    /// completions wake this rank, which runs the pass that publishes them.
    /// A completion between the pass and the flag went to the proxy thread,
    /// whose pass unparks the rank: nothing is missed.
    pub fn park(&self, park: impl FnOnce()) {
        if self.pump.lock().pass(&self.sh) {
            return;
        }
        self.sh.rank_waits.store(true, Ordering::SeqCst);
        park();
        self.sh.rank_waits.store(false, Ordering::SeqCst);
        self.pump.lock().pass(&self.sh);
    }

    /// Why `peer` is lost, once it is (and that is settled), and the rank
    /// to name for it (see `Shared::lost`).
    pub fn lost(&self, peer: Rank) -> Option<(Rank, String)> {
        self.sh.lost(peer)
    }

    /// Tells every peer why this rank failed (if it did: `reason`), closes
    /// every connection (peers see them closed), then stops the proxy.
    /// Idempotent.
    pub fn shutdown(&self, reason: Option<&str>) {
        let mut closed = self.closed.lock();
        if *closed {
            return;
        }
        *closed = true;
        let net = &*self.sh.net;
        if reason.is_none() {
            self.flush_sends();
        }
        if let Some(reason) = reason {
            let mut bytes = reason.as_bytes().to_vec();
            bytes.truncate(REASON_BYTES);
            let mut reqs = Vec::new();
            for &s in self.ctl_sends.values() {
                let ptr = bytes.as_mut_ptr();
                let sent = net
                    .reg_mr(oxccl_net::Comm::Send(s), Region::host(ptr, bytes.len()))
                    // SAFETY: `bytes` lives until every connection is
                    // closed below.
                    .and_then(|mr| unsafe {
                        net.isend(s, Buf::new(ptr, bytes.len(), mr), u32::MAX)
                    });
                if let Ok(Some(r)) = sent {
                    reqs.push(r);
                }
            }
            // A few bytes into each socket's buffer: short, but bounded.
            let until = Instant::now() + Duration::from_millis(500);
            while !reqs.is_empty() && Instant::now() < until {
                reqs.retain(|&r| matches!(net.test(r), Ok(None)));
                std::thread::yield_now();
            }
        }
        for &s in self.sends.values().chain(self.ctl_sends.values()) {
            let _ = net.close_send(s);
        }
        for &r in self.recvs.values().chain(&self.ctl_recvs) {
            let _ = net.close_recv(r);
        }
        self.sh.stop.store(true, Ordering::Release);
        self.sh.proxy.unpark();
        if let Some(h) = self.proxy.lock().take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl NetPart {
    /// A clean shutdown first lets the proxy send every message the
    /// executor published: a rank's last Send may still sit in its FIFO
    /// when its communicator is dropped (a send completes once its data is
    /// in the FIFO, as in NCCL), and closing at once would lose it, so the
    /// peer would see the connection closed instead of its data. Bounded by
    /// the communicator's deadline; a failed connection counts as flushed.
    fn flush_sends(&self) {
        let on_proxy = self
            .proxy
            .lock()
            .as_ref()
            .is_none_or(|h| h.thread().id() == std::thread::current().id() || h.is_finished());
        if on_proxy {
            return;
        }
        self.sh.draining.store(true, Ordering::Release);
        let until = Instant::now() + self.flush;
        while !self.sh.drained.load(Ordering::Acquire) && Instant::now() < until {
            self.kick();
            std::thread::sleep(Duration::from_millis(1));
        }
        if !self.sh.drained.load(Ordering::Acquire) {
            tracing::warn!(
                rank = self.me,
                "oxccl-host: closing network connections with messages unsent after {:?}",
                self.flush
            );
        }
    }
}

impl Drop for NetPart {
    fn drop(&mut self) {
        self.shutdown(None);
    }
}

/// Sleeps a little before asking the transport again, or fails once
/// `deadline` has passed.
fn wait_or_timeout(
    deadline: Instant,
    me: Rank,
    peer: Rank,
    channel: usize,
    what: &str,
) -> Result<(), HostError> {
    if Instant::now() >= deadline {
        return Err(HostError::Net(format!(
            "rank {me}: deadline expired waiting to {what} rank {peer}'s connection on channel {channel}"
        )));
    }
    std::thread::sleep(Duration::from_millis(1));
    Ok(())
}
