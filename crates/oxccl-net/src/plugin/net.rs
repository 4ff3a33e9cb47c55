//! [`PluginNet`]: a loaded plugin behind the [`Net`] interface. The
//! plugin's `void*` comms, requests and registrations are kept in tables
//! and handed out as ids, as the trait's are; every call into the plugin
//! is here, each with the reason it is sound.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::abi::{self, CommConfig, Res, PTR_CUDA, PTR_DMABUF, PTR_HOST};
use super::load::{Api, PluginLib};
use super::log::{logger, profiler};
use crate::api::{
    Buf, Comm, ListenComm, MemHandle, MemKind, Net, NetHandle, Posted, Properties, RecvComm,
    Region, Request, SendComm,
};
use crate::error::NetError;
use crate::ids::Ids;

/// Calls entry `$f` (the same type in every version) of `$api`.
macro_rules! common {
    ($api:expr, $f:ident) => {
        match $api {
            Api::V8(t) => t.$f,
            Api::V9(t) => t.$f,
            Api::V10(t) => t.$f,
            Api::V11(t) => t.$f,
            Api::V12(t) => t.$f,
        }
    };
}

#[derive(Debug, Default)]
struct Tables {
    /// Listen comm pointer and the device it listens on.
    listens: HashMap<u64, (usize, usize)>,
    /// Comm pointer and the device it is on.
    sends: HashMap<u64, (usize, usize)>,
    recvs: HashMap<u64, (usize, usize)>,
    /// Request pointer and the comm it belongs to.
    reqs: HashMap<u64, (usize, Comm)>,
    /// Registration pointer and the comm it belongs to.
    mrs: HashMap<u64, (usize, Comm)>,
}

impl Tables {
    fn comm(&self, comm: Comm) -> Result<(usize, usize), NetError> {
        match comm {
            Comm::Send(s) => self.sends.lookup("send", s.0).copied(),
            Comm::Recv(r) => self.recvs.lookup("recv", r.0).copied(),
        }
    }

    fn mr(&self, mr: MemHandle) -> Result<usize, NetError> {
        self.mrs.lookup("memory", mr.0).map(|m| m.0)
    }

    /// Forgets a closed comm's requests and registrations: the plugin
    /// freed them with it, so they must never reach it again.
    fn forget(&mut self, comm: Comm) {
        self.reqs.retain(|_, r| r.1 != comm);
        self.mrs.retain(|_, m| m.1 != comm);
    }
}

/// A plugin's network for one communicator. Every call into the plugin
/// is made holding the tables' lock, so the plugin never sees two calls
/// at once from this communicator (a close racing a test, say): plugins
/// are written for NCCL's one proxy thread per communicator.
pub struct PluginNet {
    lib: Arc<PluginLib>,
    /// The context `init` gave (v11 and later), as an address.
    ctx: usize,
    props: Vec<Properties>,
    next: AtomicU64,
    t: Mutex<Tables>,
}

impl std::fmt::Debug for PluginNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginNet")
            .field("name", &self.lib.name)
            .field("path", &self.lib.path)
            .field("version", &self.lib.version)
            .field("devices", &self.props.len())
            .finish_non_exhaustive()
    }
}

/// How a failed call reads.
fn failed(lib: &PluginLib, call: &str, r: Res) -> NetError {
    NetError::Plugin {
        plugin: format!("{} ({}, v{})", lib.name, lib.path, lib.version),
        what: format!("{call} failed: {} ({r})", abi::result_name(r)),
    }
}

/// `p` as an owned string, empty for null.
///
/// # Safety
/// `p` is null or a NUL-terminated string alive for the call.
unsafe fn owned(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (the caller's promise).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl PluginNet {
    /// Initialises `lib` for a communicator (`comm_id` names it to v11 and
    /// later; older versions initialise once per process) and reads its
    /// devices' properties.
    pub fn new(lib: Arc<PluginLib>, comm_id: u64) -> Result<PluginNet, NetError> {
        let ctx = init(&lib, comm_id)?;
        let mut net = PluginNet {
            lib,
            ctx,
            props: Vec::new(),
            next: AtomicU64::new(1),
            t: Mutex::new(Tables::default()),
        };
        let mut n: c_int = 0;
        let devices = common!(net.lib.api, devices).expect("checked at load");
        // SAFETY: `n` is a valid out-pointer for the call.
        let r = unsafe { devices(&mut n) };
        if r != 0 {
            return Err(failed(&net.lib, "devices", r));
        }
        for dev in 0..n.max(0) {
            let p = net.read_properties(dev)?;
            net.props.push(p);
        }
        Ok(net)
    }

    /// The library this network comes from.
    pub fn lib(&self) -> &PluginLib {
        &self.lib
    }

    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn read_properties(&self, dev: c_int) -> Result<Properties, NetError> {
        macro_rules! read {
            ($t:expr, $ty:ty, $flush:expr) => {{
                // SAFETY: all-zero is a valid value of these plain C structs
                // (null pointers, zero numbers).
                let mut p: $ty = unsafe { std::mem::zeroed() };
                let get = $t.get_properties.expect("checked at load");
                // SAFETY: `p` is this version's properties struct, as the
                // entry expects; the strings it fills in belong to the
                // plugin and are copied at once.
                let r = unsafe { get(dev, &mut p) };
                if r != 0 {
                    return Err(failed(&self.lib, "getProperties", r));
                }
                #[allow(clippy::redundant_closure_call)]
                let force_flush = ($flush)(&p);
                // SAFETY: null or NUL-terminated strings of the plugin's.
                let (name, pci) = unsafe { (owned(p.name), owned(p.pci_path)) };
                (
                    name,
                    pci,
                    p.guid,
                    p.ptr_support,
                    p.reg_is_global,
                    force_flush,
                    p.speed,
                    p.port,
                    p.latency,
                    p.max_comms,
                    p.max_recvs,
                )
            }};
        }
        let (name, pci, guid, ptr, global, flush, speed, port, lat, comms, recvs) =
            match &self.lib.api {
                Api::V8(t) => read!(t, abi::PropsV8, |_: &abi::PropsV8| 0),
                Api::V9(t) => read!(t, abi::PropsV9, |p: &abi::PropsV9| p.force_flush),
                Api::V10(t) => read!(t, abi::PropsV9, |p: &abi::PropsV9| p.force_flush),
                Api::V11(t) => read!(t, abi::PropsV11, |p: &abi::PropsV11| p.force_flush),
                Api::V12(t) => read!(t, abi::PropsV12, |p: &abi::PropsV12| p.force_flush),
            };
        Ok(Properties {
            name,
            pci_path: (!pci.is_empty()).then_some(pci),
            guid,
            ptr_host: ptr & PTR_HOST != 0,
            ptr_cuda: ptr & PTR_CUDA != 0,
            ptr_dmabuf: ptr & PTR_DMABUF != 0,
            force_flush: flush != 0,
            reg_is_global: global != 0,
            speed_mbps: speed.max(0) as u32,
            port: port.clamp(0, u16::MAX as c_int) as u16,
            latency: Duration::from_secs_f64(f64::from(lat).max(0.0) / 1e6),
            max_comms: comms.max(0) as usize,
            max_recvs: recvs.max(1) as usize,
        })
    }

    fn props(&self, dev: usize) -> Result<&Properties, NetError> {
        self.props.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!(
                "device {dev} of the {} plugin's {}",
                self.lib.name,
                self.props.len()
            ))
        })
    }

    /// A new request id for `req` of `comm`, or `None` for the plugin's
    /// "not now".
    fn request(&self, t: &mut Tables, req: *mut c_void, comm: Comm) -> Option<Request> {
        if req.is_null() {
            return None;
        }
        let id = self.id();
        t.reqs.insert(id, (req as usize, comm));
        Some(Request(id))
    }
}

/// Runs the plugin's `init` for a communicator: once per process for v8
/// to v10 (the outcome kept), per communicator for v11 and later (the
/// context it returns).
fn init(lib: &PluginLib, comm_id: u64) -> Result<usize, NetError> {
    let log = Some(logger());
    let prof = Some(profiler());
    let once = |f: &dyn Fn() -> Res| -> Result<usize, NetError> {
        lib.once
            .get_or_init(|| match f() {
                0 => Ok(()),
                r => Err(format!("init failed: {} ({r})", abi::result_name(r))),
            })
            .clone()
            .map(|()| 0)
            .map_err(|what| NetError::Plugin {
                plugin: format!("{} ({}, v{})", lib.name, lib.path, lib.version),
                what,
            })
    };
    let mut config = CommConfig { traffic_class: -1 };
    let mut ctx: *mut c_void = null_mut();
    // Every arm: the entry is this version's `init`, given the logger (a
    // C function that lives as long as the process), the profiler
    // callback (likewise) and valid out-pointers.
    let r = match &lib.api {
        Api::V8(t) => {
            let f = t.init.expect("checked at load");
            // SAFETY: as above.
            return once(&|| unsafe { f(log) });
        }
        Api::V9(t) => {
            let f = t.init.expect("checked at load");
            // SAFETY: as above.
            return once(&|| unsafe { f(log) });
        }
        Api::V10(t) => {
            let f = t.init.expect("checked at load");
            // SAFETY: as above.
            return once(&|| unsafe { f(log, prof) });
        }
        // SAFETY: as above.
        Api::V11(t) => unsafe {
            t.init.expect("checked")(&mut ctx, comm_id, &mut config, log, prof)
        },
        // SAFETY: as above.
        Api::V12(t) => unsafe {
            t.init.expect("checked")(&mut ctx, comm_id, &mut config, log, prof)
        },
    };
    if r != 0 {
        return Err(failed(lib, "init", r));
    }
    Ok(ctx as usize)
}

impl Drop for PluginNet {
    fn drop(&mut self) {
        let fin = match &self.lib.api {
            Api::V11(t) => t.finalize,
            Api::V12(t) => t.finalize,
            _ => None,
        };
        if let Some(fin) = fin {
            // SAFETY: the context `init` returned for this communicator,
            // finalized once, after every comm of it (the host backend
            // closes them before letting go of the network).
            let _ = unsafe { fin(self.ctx as *mut c_void) };
        }
    }
}

impl Net for PluginNet {
    fn name(&self) -> &str {
        &self.lib.name
    }

    fn devices(&self) -> usize {
        self.props.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties, NetError> {
        self.props(dev).cloned()
    }

    fn listen(&self, dev: usize) -> Result<(NetHandle, ListenComm), NetError> {
        self.props(dev)?;
        let mut handle = NetHandle([0; abi::HANDLE_MAXSIZE]);
        let h = handle.0.as_mut_ptr().cast::<c_void>();
        let mut l: *mut c_void = null_mut();
        let d = dev as c_int;
        let ctx = self.ctx as *mut c_void;
        let mut t = self.t.lock();
        // SAFETY: (every arm) `h` has NCCL_NET_HANDLE_MAXSIZE bytes for the
        // plugin to write, `l` is a valid out-pointer, `ctx` is this
        // communicator's context (v11 and later).
        let r = unsafe {
            match &self.lib.api {
                Api::V8(t) => t.listen.expect("checked")(d, h, &mut l),
                Api::V9(t) => t.listen.expect("checked")(d, h, &mut l),
                Api::V10(t) => t.listen.expect("checked")(d, h, &mut l),
                Api::V11(t) => t.listen.expect("checked")(ctx, d, h, &mut l),
                Api::V12(t) => t.listen.expect("checked")(ctx, d, h, &mut l),
            }
        };
        if r != 0 || l.is_null() {
            return Err(failed(&self.lib, "listen", r));
        }
        let id = self.id();
        t.listens.insert(id, (l as usize, dev));
        Ok((handle, ListenComm(id)))
    }

    fn connect(&self, dev: usize, handle: &mut NetHandle) -> Result<Option<SendComm>, NetError> {
        self.props(dev)?;
        // The plugin may keep its progress in the handle between calls:
        // the caller's buffer, the same on every retry.
        let hp = handle.0.as_mut_ptr().cast::<c_void>();
        let mut s: *mut c_void = null_mut();
        // No device offload: a pointer to a null device handle.
        let mut dev_comm: *mut c_void = null_mut();
        let dc: *mut *mut c_void = &mut dev_comm;
        let d = dev as c_int;
        let ctx = self.ctx as *mut c_void;
        let mut config = CommConfig { traffic_class: -1 };
        let mut t = self.t.lock();
        // SAFETY: (every arm) the handle's 128 bytes, valid out-pointers,
        // this communicator's context and a config that outlive the call.
        let r = unsafe {
            match &self.lib.api {
                Api::V8(t) => t.connect.expect("checked")(d, hp, &mut s, dc.cast()),
                Api::V9(t) => t.connect.expect("checked")(d, hp, &mut s, dc.cast()),
                Api::V10(t) => t.connect.expect("checked")(d, &mut config, hp, &mut s, dc.cast()),
                Api::V11(t) => t.connect.expect("checked")(ctx, d, hp, &mut s, dc.cast()),
                Api::V12(t) => t.connect.expect("checked")(ctx, d, hp, &mut s, dc.cast()),
            }
        };
        if r != 0 {
            return Err(failed(&self.lib, "connect", r));
        }
        if s.is_null() {
            return Ok(None);
        }
        let id = self.id();
        t.sends.insert(id, (s as usize, dev));
        Ok(Some(SendComm(id)))
    }

    fn accept(&self, listen: ListenComm) -> Result<Option<RecvComm>, NetError> {
        let mut t = self.t.lock();
        let (l, dev) = *t.listens.lookup("listen", listen.0)?;
        let mut r: *mut c_void = null_mut();
        let mut dev_comm: *mut c_void = null_mut();
        let accept = common!(self.lib.api, accept).expect("checked at load");
        // SAFETY: `l` is a live listen comm of this plugin, the others
        // valid out-pointers.
        let res = unsafe { accept(l as *mut c_void, &mut r, &mut dev_comm) };
        if res != 0 {
            return Err(failed(&self.lib, "accept", res));
        }
        if r.is_null() {
            return Ok(None);
        }
        let id = self.id();
        t.recvs.insert(id, (r as usize, dev));
        Ok(Some(RecvComm(id)))
    }

    fn reg_mr(&self, comm: Comm, mem: Region) -> Result<MemHandle, NetError> {
        let Region { ptr, len, kind } = mem;
        let mut t = self.t.lock();
        let (c, dev) = t.comm(comm)?;
        let p = self.props(dev)?;
        let (ok, ty) = match kind {
            MemKind::Host => (p.ptr_host, PTR_HOST),
            MemKind::Cuda => (p.ptr_cuda, PTR_CUDA),
        };
        if !ok {
            return Err(NetError::Plugin {
                plugin: self.lib.name.clone(),
                what: format!("device {dev} ({}) does not take {kind:?} memory", p.name),
            });
        }
        let mut mh: *mut c_void = null_mut();
        let reg = common!(self.lib.api, reg_mr).expect("checked at load");
        // SAFETY: a live comm, the caller's range (kept valid while
        // registered, the trait's contract) and a valid out-pointer.
        let r = unsafe { reg(c as *mut c_void, ptr.cast(), len, ty, &mut mh) };
        if r != 0 {
            return Err(failed(&self.lib, "regMr", r));
        }
        let id = self.id();
        t.mrs.insert(id, (mh as usize, comm));
        Ok(MemHandle(id))
    }

    fn dereg_mr(&self, comm: Comm, mr: MemHandle) -> Result<(), NetError> {
        let mut t = self.t.lock();
        let (c, _) = t.comm(comm)?;
        let (mh, _) = t.mrs.take("memory", mr.0)?;
        let dereg = common!(self.lib.api, dereg_mr).expect("checked at load");
        // SAFETY: a registration this comm made, deregistered once.
        let r = unsafe { dereg(c as *mut c_void, mh as *mut c_void) };
        if r != 0 {
            return Err(failed(&self.lib, "deregMr", r));
        }
        Ok(())
    }

    unsafe fn isend(&self, comm: SendComm, buf: Buf, tag: u32) -> Posted {
        let Buf { ptr, len, mr } = buf;
        let mut t = self.t.lock();
        let (c, _) = t.comm(Comm::Send(comm))?;
        let mh = t.mr(mr)? as *mut c_void;
        let (c, data) = (c as *mut c_void, ptr.cast::<c_void>());
        // Tags are C ints: ours pass through bit for bit.
        let tag = tag as c_int;
        let mut req: *mut c_void = null_mut();
        let small = c_int::try_from(len).map_err(|_| {
            NetError::InvalidArgument(format!("{len} bytes exceed a v8 plugin's int size"))
        });
        // SAFETY: (every arm) a live send comm, the caller's bytes (valid
        // until the request completes or the comm closes: this function's
        // contract), its registration, no profiler handle, and a valid
        // out-pointer.
        let r = unsafe {
            match &self.lib.api {
                Api::V8(t) => t.isend.expect("checked")(c, data, small?, tag, mh, &mut req),
                Api::V9(t) => t.isend.expect("checked")(c, data, len, tag, mh, &mut req),
                Api::V10(t) => {
                    t.isend.expect("checked")(c, data, len, tag, mh, null_mut(), &mut req)
                }
                Api::V11(t) => {
                    t.isend.expect("checked")(c, data, len, tag, mh, null_mut(), &mut req)
                }
                Api::V12(t) => {
                    t.isend.expect("checked")(c, data, len, tag, mh, null_mut(), &mut req)
                }
            }
        };
        if r != 0 {
            return Err(failed(&self.lib, "isend", r));
        }
        Ok(self.request(&mut t, req, Comm::Send(comm)))
    }

    unsafe fn irecv(&self, comm: RecvComm, buf: Buf, tag: u32) -> Posted {
        let Buf { ptr, len: cap, mr } = buf;
        let mut t = self.t.lock();
        let (c, _) = t.comm(Comm::Recv(comm))?;
        let c = c as *mut c_void;
        // One buffer per receive (within every plugin's maxRecvs).
        let mut data = [ptr.cast::<c_void>()];
        let mut mh = [t.mr(mr)? as *mut c_void];
        let mut tags = [tag as c_int];
        let mut ph: [*mut c_void; 1] = [null_mut()];
        let mut req: *mut c_void = null_mut();
        let mut small = [c_int::try_from(cap).map_err(|_| {
            NetError::InvalidArgument(format!("{cap} bytes exceed a v8 plugin's int size"))
        })?];
        let mut sizes = [cap];
        let (d, m, tg, p) = (
            data.as_mut_ptr(),
            mh.as_mut_ptr(),
            tags.as_mut_ptr(),
            ph.as_mut_ptr(),
        );
        // SAFETY: (every arm) a live receive comm and arrays of one entry
        // each (n = 1) that outlive the call; the buffer stays valid until
        // the request completes or the comm closes (this function's
        // contract).
        let r = unsafe {
            match &self.lib.api {
                Api::V8(t) => {
                    t.irecv.expect("checked")(c, 1, d, small.as_mut_ptr(), tg, m, &mut req)
                }
                Api::V9(t) => {
                    t.irecv.expect("checked")(c, 1, d, sizes.as_mut_ptr(), tg, m, &mut req)
                }
                Api::V10(t) => {
                    t.irecv.expect("checked")(c, 1, d, sizes.as_mut_ptr(), tg, m, p, &mut req)
                }
                Api::V11(t) => {
                    t.irecv.expect("checked")(c, 1, d, sizes.as_mut_ptr(), tg, m, p, &mut req)
                }
                Api::V12(t) => {
                    t.irecv.expect("checked")(c, 1, d, sizes.as_mut_ptr(), tg, m, p, &mut req)
                }
            }
        };
        if r != 0 {
            return Err(failed(&self.lib, "irecv", r));
        }
        Ok(self.request(&mut t, req, Comm::Recv(comm)))
    }

    unsafe fn iflush(&self, comm: RecvComm, buf: Buf) -> Posted {
        let Buf { ptr, len, mr } = buf;
        let Some(flush) = common!(self.lib.api, iflush) else {
            return Ok(None);
        };
        let mut t = self.t.lock();
        let (c, _) = t.comm(Comm::Recv(comm))?;
        let mut data = [ptr.cast::<c_void>()];
        let mut sizes = [c_int::try_from(len).map_err(|_| {
            NetError::InvalidArgument(format!("{len} bytes exceed a flush's int size"))
        })?];
        let mut mh = [t.mr(mr)? as *mut c_void];
        let mut req: *mut c_void = null_mut();
        // SAFETY: a live receive comm, arrays of one entry that outlive
        // the call, and the received bytes (valid: this function's
        // contract).
        let r = unsafe {
            flush(
                c as *mut c_void,
                1,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mh.as_mut_ptr(),
                &mut req,
            )
        };
        if r != 0 {
            return Err(failed(&self.lib, "iflush", r));
        }
        Ok(self.request(&mut t, req, Comm::Recv(comm)))
    }

    fn test(&self, req: Request) -> Result<Option<usize>, NetError> {
        let mut t = self.t.lock();
        let (p, _) = *t.reqs.lookup("request", req.0)?;
        let (mut done, mut size): (c_int, c_int) = (0, 0);
        let test = common!(self.lib.api, test).expect("checked at load");
        // SAFETY: a live request of this plugin (dropped from the table
        // once done or failed, so never tested again) and out-pointers.
        let r = unsafe { test(p as *mut c_void, &mut done, &mut size) };
        if r != 0 {
            t.reqs.remove(&req.0);
            return Err(failed(&self.lib, "test", r));
        }
        if done == 0 {
            return Ok(None);
        }
        t.reqs.remove(&req.0);
        Ok(Some(size.max(0) as usize))
    }

    fn close_send(&self, comm: SendComm) -> Result<(), NetError> {
        let mut t = self.t.lock();
        let (c, _) = t.sends.take("send", comm.0)?;
        t.forget(Comm::Send(comm));
        let close = common!(self.lib.api, close_send).expect("checked at load");
        // SAFETY: a live send comm, closed once (removed from the table).
        let r = unsafe { close(c as *mut c_void) };
        (r == 0)
            .then_some(())
            .ok_or_else(|| failed(&self.lib, "closeSend", r))
    }

    fn close_recv(&self, comm: RecvComm) -> Result<(), NetError> {
        let mut t = self.t.lock();
        let (c, _) = t.recvs.take("recv", comm.0)?;
        t.forget(Comm::Recv(comm));
        let close = common!(self.lib.api, close_recv).expect("checked at load");
        // SAFETY: a live receive comm, closed once (removed from the table).
        let r = unsafe { close(c as *mut c_void) };
        (r == 0)
            .then_some(())
            .ok_or_else(|| failed(&self.lib, "closeRecv", r))
    }

    fn close_listen(&self, listen: ListenComm) -> Result<(), NetError> {
        let mut t = self.t.lock();
        let (l, _) = t.listens.take("listen", listen.0)?;
        let close = common!(self.lib.api, close_listen).expect("checked at load");
        // SAFETY: a live listen comm, closed once (removed from the table).
        let r = unsafe { close(l as *mut c_void) };
        (r == 0)
            .then_some(())
            .ok_or_else(|| failed(&self.lib, "closeListen", r))
    }
}
