//! The TCP transport (NCCL's `Socket` net): one device per chosen
//! interface address, connections of `nthreads × nsocks_per_thread`
//! sockets driven by helper threads ([`worker`]), host memory only.

mod conn;
mod io;
mod listen;
mod req;
mod worker;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

pub use req::Waker;

use crate::api::{
    Buf, Comm, ListenComm, MemHandle, MemKind, Net, NetHandle, Posted, Properties, RecvComm,
    Region, Request, SendComm, HANDLE_BYTES,
};
use crate::config::TcpConfig;
use crate::error::NetError;
use crate::ids::Ids;
use crate::wire::Handle;
use conn::Conn;
use listen::Listener;
use req::Req;

/// A registration: which comm, which bytes.
#[derive(Debug, Clone, Copy)]
struct Mr {
    comm: Comm,
    ptr: usize,
    len: usize,
}

#[derive(Debug, Default)]
struct Tables {
    listens: HashMap<u64, Listener>,
    sends: HashMap<u64, Arc<Conn>>,
    recvs: HashMap<u64, Arc<Conn>>,
    reqs: HashMap<u64, Arc<Req>>,
    mrs: HashMap<u64, Mr>,
}

/// NCCL's socket transport over TCP.
pub struct TcpNet {
    cfg: TcpConfig,
    magic: u64,
    /// Every hello's MAC is made with it (see [`crate::wire::Hello`]).
    key: oxccl_bootstrap::Key,
    /// The devices: one address each (the interface's name for properties).
    devs: Vec<(String, IpAddr)>,
    waker: Option<Waker>,
    next: AtomicU64,
    t: Mutex<Tables>,
}

impl std::fmt::Debug for TcpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpNet")
            .field("cfg", &self.cfg)
            .field("devs", &self.devs)
            .finish_non_exhaustive()
    }
}

/// Link speed of interface `name` from sysfs, 0 where unknown (loopback,
/// virtual links).
fn speed_mbps(name: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{name}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .map_or(0, |s| s.min(u32::MAX as i64) as u32)
}

fn pci_path(name: &str) -> Option<String> {
    std::fs::canonicalize(format!("/sys/class/net/{name}/device"))
        .ok()
        .map(|p| p.display().to_string())
}

impl TcpNet {
    /// A transport whose one device is interface `name` at `ip`; every
    /// connection starts with `magic` (the communicator's) and proves `key`
    /// (the communicator's, e.g. `Bootstrap::layer_key("net")`: listeners
    /// drop sockets that cannot), and `waker` (if any) is called whenever a
    /// request completes or fails.
    pub fn new(
        cfg: TcpConfig,
        magic: u64,
        key: [u8; 32],
        name: &str,
        ip: IpAddr,
        waker: Option<Waker>,
    ) -> TcpNet {
        TcpNet {
            cfg,
            magic,
            key: oxccl_bootstrap::Key::from_bytes(key),
            devs: vec![(name.to_string(), ip)],
            waker,
            next: AtomicU64::new(1),
            t: Mutex::new(Tables::default()),
        }
    }

    pub fn config(&self) -> &TcpConfig {
        &self.cfg
    }

    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn dev(&self, dev: usize) -> Result<&(String, IpAddr), NetError> {
        self.devs.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!("device {dev} of {}", self.devs.len()))
        })
    }

    /// Checks that the bytes of `buf` lie in its registration, one of `comm`'s.
    fn inside(&self, comm: Comm, buf: Buf) -> Result<(), NetError> {
        let (ptr, len, mr) = (buf.ptr as usize, buf.len, buf.mr);
        let t = self.t.lock();
        let m = t.mrs.lookup("memory", mr.0)?;
        if m.comm != comm {
            return Err(NetError::InvalidArgument(format!(
                "registration {} belongs to {:?}, not {comm:?}",
                mr.0, m.comm
            )));
        }
        if ptr < m.ptr || ptr.checked_add(len).is_none_or(|e| e > m.ptr + m.len) {
            return Err(NetError::InvalidArgument(format!(
                "{len} bytes at {ptr:#x} are outside registration {} ({} bytes at {:#x})",
                mr.0, m.len, m.ptr
            )));
        }
        Ok(())
    }

    /// Starts listening on device `dev`: [`Net::listen`] with this
    /// transport's own handle.
    pub fn listen(&self, dev: usize) -> Result<(Handle, ListenComm), NetError> {
        let (_, ip) = *self.dev(dev)?;
        let id = self.id();
        let l = Listener::bind(ip, self.magic, self.key, id, self.cfg.nsocks() as u16)?;
        let h = l.handle;
        self.t.lock().listens.insert(id, l);
        Ok((h, ListenComm(id)))
    }

    /// [`Net::connect`] to this transport's own handle (TCP connects at
    /// once: never `None`).
    pub fn connect(&self, dev: usize, handle: &Handle) -> Result<Option<SendComm>, NetError> {
        self.dev(dev)?;
        if handle.magic != self.magic {
            return Err(NetError::Wire {
                conn: format!("connection to {}", handle.addr),
                err: crate::error::WireError::WrongMagic {
                    expected: self.magic,
                    got: handle.magic,
                },
            });
        }
        let socks = listen::connect(handle, &self.key, self.cfg.deadline)?;
        let id = self.id();
        let c = self.start(format!("send connection to {}", handle.addr), socks)?;
        self.t.lock().sends.insert(id, c);
        Ok(Some(SendComm(id)))
    }

    fn start(&self, label: String, socks: Vec<std::net::TcpStream>) -> Result<Arc<Conn>, NetError> {
        Conn::start(label, socks, &self.cfg, self.waker.clone()).map(Arc::new)
    }
}

impl Net for TcpNet {
    fn name(&self) -> &str {
        "Socket"
    }

    fn wakes(&self) -> bool {
        self.waker.is_some()
    }

    fn devices(&self) -> usize {
        self.devs.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties, NetError> {
        let (name, _) = self.dev(dev)?;
        Ok(Properties {
            name: name.clone(),
            pci_path: pci_path(name),
            guid: dev as u64,
            ptr_host: true,
            ptr_cuda: false,
            ptr_dmabuf: false,
            force_flush: false,
            reg_is_global: false,
            speed_mbps: speed_mbps(name),
            port: 0,
            latency: Duration::ZERO,
            max_comms: 65536,
            max_recvs: 1,
        })
    }

    fn listen(&self, dev: usize) -> Result<(NetHandle, ListenComm), NetError> {
        let (h, l) = TcpNet::listen(self, dev)?;
        let mut bytes = [0u8; HANDLE_BYTES];
        bytes[..Handle::BYTES].copy_from_slice(&h.encode());
        Ok((NetHandle(bytes), l))
    }

    fn connect(&self, dev: usize, handle: &mut NetHandle) -> Result<Option<SendComm>, NetError> {
        let h = Handle::decode(&handle.0[..Handle::BYTES], self.magic).map_err(|err| {
            NetError::Wire {
                conn: "a listener's handle".into(),
                err,
            }
        })?;
        TcpNet::connect(self, dev, &h)
    }

    fn accept(&self, listen: ListenComm) -> Result<Option<RecvComm>, NetError> {
        let (socks, addr) = {
            let mut t = self.t.lock();
            let l = t.listens.lookup_mut("listen", listen.0)?;
            let addr = l.handle.addr;
            match l.accept(self.cfg.deadline)? {
                Some(s) => (s, addr),
                None => return Ok(None),
            }
        };
        let id = self.id();
        let c = self.start(format!("receive connection at {addr}"), socks)?;
        self.t.lock().recvs.insert(id, c);
        Ok(Some(RecvComm(id)))
    }

    fn reg_mr(&self, comm: Comm, mem: Region) -> Result<MemHandle, NetError> {
        let Region { ptr, len, kind } = mem;
        if kind == MemKind::Cuda {
            return Err(NetError::Unsupported {
                net: "Socket",
                what: "CUDA memory (stage it through host memory)".into(),
            });
        }
        let known = {
            let t = self.t.lock();
            match comm {
                Comm::Send(s) => t.sends.contains_key(&s.0),
                Comm::Recv(r) => t.recvs.contains_key(&r.0),
            }
        };
        if !known {
            return Err(NetError::BadHandle {
                kind: "comm",
                id: match comm {
                    Comm::Send(SendComm(i)) | Comm::Recv(RecvComm(i)) => i,
                },
            });
        }
        let id = self.id();
        self.t.lock().mrs.insert(
            id,
            Mr {
                comm,
                ptr: ptr as usize,
                len,
            },
        );
        Ok(MemHandle(id))
    }

    fn dereg_mr(&self, _comm: Comm, mr: MemHandle) -> Result<(), NetError> {
        self.t.lock().mrs.take("memory", mr.0).map(|_| ())
    }

    unsafe fn isend(&self, comm: SendComm, buf: Buf, tag: u32) -> Posted {
        self.inside(Comm::Send(comm), buf)?;
        let c = self.t.lock().sends.lookup("send", comm.0)?.clone();
        let req = c.send(buf.ptr as usize, buf.len, tag)?;
        let id = self.id();
        self.t.lock().reqs.insert(id, req);
        Ok(Some(Request(id)))
    }

    unsafe fn irecv(&self, comm: RecvComm, buf: Buf, tag: u32) -> Posted {
        self.inside(Comm::Recv(comm), buf)?;
        let c = self.t.lock().recvs.lookup("recv", comm.0)?.clone();
        let req = c.recv(buf.ptr as usize, buf.len, tag)?;
        let id = self.id();
        self.t.lock().reqs.insert(id, req);
        Ok(Some(Request(id)))
    }

    fn test(&self, req: Request) -> Result<Option<usize>, NetError> {
        let mut t = self.t.lock();
        let r = t.reqs.lookup("request", req.0)?;
        let res = r.poll();
        if !matches!(res, Ok(None)) {
            t.reqs.remove(&req.0);
        }
        res
    }

    fn close_send(&self, comm: SendComm) -> Result<(), NetError> {
        let c = self.t.lock().sends.take("send", comm.0)?;
        c.close();
        Ok(())
    }

    fn close_recv(&self, comm: RecvComm) -> Result<(), NetError> {
        let c = self.t.lock().recvs.take("recv", comm.0)?;
        c.close();
        Ok(())
    }

    fn close_listen(&self, listen: ListenComm) -> Result<(), NetError> {
        self.t.lock().listens.take("listen", listen.0).map(|_| ())
    }
}
