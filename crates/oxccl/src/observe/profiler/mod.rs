//! NCCL's profiler plugins (`libnccl-profiler*.so`, the tools built on
//! `ncclProfiler_vN`, such as NCCL's Inspector), driven unchanged.
//!
//! `NCCL_PROFILER_PLUGIN` names the plugin as NCCL reads it: a path, or
//! `X` for `libnccl-profiler-X.so`; unset, `libnccl-profiler.so` is tried
//! and its absence is silent; `none` loads nothing. The newest interface
//! the plugin exports of the ones spoken here (v5, then v4) is used. Each
//! communicator gets its own context (`init` with the communicator's
//! identity as its id and hash, the same in hex as its name, one node;
//! `finalize` when dropped),
//! and each launch reports a group event (`ncclProfileGroup`) whose
//! children are its collectives (`ncclProfileColl`: name, count, root,
//! type, algorithm, protocol, channels, sequence number) and Send/Recv
//! (`ncclProfileP2p`), in call order, all stopped when the launch returns
//! (done on the host backend, enqueued on CUDA). Only the types the
//! plugin's activation mask asks for are reported. Over the host
//! backend's network transport the proxy's work is reported too (`proxy`):
//! per call, one `ncclProfileProxyOp` per network link the plan uses and
//! one `ncclProfileProxyStep` per message on it. Proxy control, kernel
//! channel and network plugin events are not reported. A plugin that
//! fails to load or to initialise is a warning, never an error.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use oxccl_core::{Algo, CollKind, DataType, Proto};

mod abi;
mod proxy;

use abi::{Body, DescrV4, DescrV5, InitV4, InitV5, Table};

pub(crate) use proxy::current as proxy_events;

/// Which `init` the plugin has (the only difference between the tables).
#[derive(Clone, Copy, Debug)]
enum Init {
    V4(InitV4),
    V5(InitV5),
}

/// A loaded plugin.
#[derive(Debug)]
pub(crate) struct Plugin {
    _lib: libloading::Library,
    init: Init,
    start: abi::Start,
    stop: abi::Stop,
    /// Optional: without it no state changes are reported.
    record: Option<abi::Record>,
    finalize: abi::Finalize,
}

/// The files `NCCL_PROFILER_PLUGIN`'s value names, and whether it was set
/// (a missing file is then worth a warning).
fn candidates(setting: Option<&str>) -> (Vec<String>, bool) {
    match setting.map(str::trim) {
        None | Some("") => (vec!["libnccl-profiler.so".into()], false),
        Some(v) if v.eq_ignore_ascii_case("none") => (vec![], true),
        Some(v) if v.contains('/') || v.ends_with(".so") => (vec![v.into()], true),
        Some(v) => (vec![format!("libnccl-profiler-{v}.so")], true),
    }
}

impl Plugin {
    /// The plugin `setting` names, if one loads.
    pub(crate) fn load(setting: Option<&str>) -> Option<Plugin> {
        let (files, explicit) = candidates(setting);
        for f in files {
            // SAFETY: loading runs the library's initialisers; the user
            // named it (or NCCL's default name) as a profiler plugin.
            match unsafe { libloading::Library::new(&f) } {
                Ok(lib) => match Plugin::from_lib(lib) {
                    Ok(p) => {
                        tracing::info!(target: "oxccl::profile", "oxccl: profiler plugin {f} loaded");
                        return Some(p);
                    }
                    Err(why) => tracing::warn!("oxccl: profiler plugin {f} not used: {why}"),
                },
                Err(e) if explicit => tracing::warn!("oxccl: profiler plugin {f} not loaded: {e}"),
                Err(_) => {}
            }
        }
        None
    }

    fn from_lib(lib: libloading::Library) -> Result<Plugin, String> {
        /// The table's functions, checked present.
        fn fns<I: Copy>(t: &Table<I>) -> Option<(I, abi::Start, abi::Stop, abi::Finalize)> {
            Some((t.init?, t.start?, t.stop?, t.finalize?))
        }
        // SAFETY: a data symbol: its address is the plugin's table, which
        // lives as long as the library (kept in the plugin).
        if let Ok(sym) = unsafe { lib.get::<*const Table<InitV5>>(b"ncclProfiler_v5\0") } {
            // SAFETY: as above; read once, fields copied out.
            let t = unsafe { &**sym };
            let (init, start, stop, finalize) =
                fns(t).ok_or("its ncclProfiler_v5 lacks a function")?;
            return Ok(Plugin {
                init: Init::V5(init),
                start,
                stop,
                record: t.record,
                finalize,
                _lib: lib,
            });
        }
        // SAFETY: as for v5.
        if let Ok(sym) = unsafe { lib.get::<*const Table<InitV4>>(b"ncclProfiler_v4\0") } {
            // SAFETY: as for v5.
            let t = unsafe { &**sym };
            let (init, start, stop, finalize) =
                fns(t).ok_or("its ncclProfiler_v4 lacks a function")?;
            return Ok(Plugin {
                init: Init::V4(init),
                start,
                stop,
                record: t.record,
                finalize,
                _lib: lib,
            });
        }
        Err("it exports neither ncclProfiler_v5 nor ncclProfiler_v4".into())
    }
}

/// The plugin's logger: the message's format, at debug under PROFILE.
///
/// # Safety
/// Called by the plugin with null or NUL-terminated strings.
unsafe extern "C" fn log(
    _level: c_int,
    _flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
) {
    if fmt.is_null() {
        return;
    }
    // SAFETY: the plugin passes a C string.
    let s = unsafe { CStr::from_ptr(fmt) }.to_string_lossy();
    tracing::debug!(target: "oxccl::profile", "profiler plugin: {s}");
}

/// One communicator's context in the plugin.
#[derive(Debug)]
pub(crate) struct Ctx {
    plugin: &'static Plugin,
    ctx: *mut c_void,
    mask: u64,
    rank: c_int,
    seq: AtomicU64,
}

// SAFETY: the context is the plugin's, which NCCL (whose contract plugins
// are written to) calls from whichever thread runs an operation.
unsafe impl Send for Ctx {}
// SAFETY: as above; our own state is atomic.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Initialises the plugin for rank `rank` of `nranks` of the
    /// communicator `comm`; `None` when it declines (a warning).
    pub(crate) fn new(plugin: &'static Plugin, comm: u64, nranks: u32, rank: u32) -> Option<Ctx> {
        let mut ctx = ptr::null_mut();
        let mut mask: c_int = 0;
        let name = CString::new(format!("{comm:#x}")).ok()?;
        let (n, r) = (nranks as c_int, rank as c_int);
        // SAFETY: the plugin's init with valid out pointers; the name
        // outlives the call, which copies what it keeps.
        let res = unsafe {
            match plugin.init {
                Init::V5(f) => f(&mut ctx, comm, &mut mask, name.as_ptr(), 1, n, r, log),
                Init::V4(f) => f(&mut ctx, &mut mask, name.as_ptr(), comm, 1, n, r, log),
            }
        };
        if res != abi::SUCCESS {
            tracing::warn!(
                "oxccl: the profiler plugin's init failed ({res}) on rank {rank}: no events"
            );
            return None;
        }
        Some(Ctx {
            plugin,
            ctx,
            mask: mask as u32 as u64,
            rank: r,
            seq: AtomicU64::new(0),
        })
    }

    /// Starts an event of `kind` under `parent`; null where the mask
    /// leaves it out or the plugin made none.
    fn start(&self, kind: u64, parent: *mut c_void, body: Body) -> *mut c_void {
        self.start_gated(kind, kind, parent, body)
    }

    /// Starts an event of `kind` if the mask has any bit of `gate`.
    fn start_gated(&self, kind: u64, gate: u64, parent: *mut c_void, body: Body) -> *mut c_void {
        if self.mask & gate == 0 {
            return ptr::null_mut();
        }
        let mut h = ptr::null_mut();
        let (mut v5, mut v4);
        let d: *mut c_void = match self.plugin.init {
            Init::V5(_) => {
                v5 = DescrV5 {
                    kind,
                    parent,
                    rank: self.rank,
                    body,
                };
                &mut v5 as *mut DescrV5 as *mut c_void
            }
            Init::V4(_) => {
                v4 = DescrV4 {
                    kind: kind as u8,
                    parent,
                    rank: self.rank,
                    body,
                };
                &mut v4 as *mut DescrV4 as *mut c_void
            }
        };
        // SAFETY: the plugin's startEvent with its context, a valid out
        // pointer and a descriptor of its version alive for the call.
        let r = unsafe { (self.plugin.start)(self.ctx, &mut h, d) };
        if r == abi::SUCCESS {
            h
        } else {
            ptr::null_mut()
        }
    }

    fn stop(&self, h: *mut c_void) {
        if !h.is_null() {
            // SAFETY: a handle the plugin's startEvent returned, stopped once.
            unsafe { (self.plugin.stop)(h) };
        }
    }

    /// Reports state `state` of the live event `h`, with `args`.
    fn record(&self, h: *mut c_void, state: c_int, mut args: abi::StateArgs) {
        if let (false, Some(f)) = (h.is_null(), self.plugin.record) {
            // SAFETY: a live handle of the plugin's (not yet stopped) and
            // arguments alive for the call.
            unsafe { f(h, state, &mut args as *mut abi::StateArgs as *mut c_void) };
        }
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the context init returned, finalised once.
        unsafe { (self.plugin.finalize)(self.ctx) };
    }
}

/// One operation of a launch, as the plugin hears of it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Part {
    Coll {
        kind: CollKind,
        count: usize,
        root: u32,
        dtype: DataType,
        send: u64,
        recv: u64,
        algo: Algo,
        proto: Proto,
        channels: u32,
    },
    P2p {
        send: bool,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: u32,
        channels: u32,
    },
}

/// A launch's events, stopped children first when dropped.
#[derive(Debug)]
pub(crate) struct Launch<'a> {
    ctx: &'a std::sync::Arc<Ctx>,
    group: *mut c_void,
    ops: Vec<*mut c_void>,
    /// Strings the descriptors pointed at (plugins may keep them until
    /// the event stops).
    _strings: Vec<CString>,
}

impl<'a> Launch<'a> {
    /// Starts the group event and one event per part.
    pub(crate) fn start(ctx: &'a std::sync::Arc<Ctx>, parts: &[Part]) -> Launch<'a> {
        let group = ctx.start(abi::EV_GROUP, ptr::null_mut(), Body::EMPTY);
        let mut strings = Vec::new();
        let mut cstr = |s: &str| {
            let c = CString::new(s).unwrap_or_default();
            let p = c.as_ptr();
            strings.push(c);
            p
        };
        let ops = parts
            .iter()
            .map(|p| match *p {
                Part::Coll {
                    kind,
                    count,
                    root,
                    dtype,
                    send,
                    recv,
                    algo,
                    proto,
                    channels,
                } => {
                    let coll = abi::Coll {
                        seq: ctx.seq.fetch_add(1, Ordering::Relaxed),
                        func: cstr(super::names::profiler_func(kind)),
                        send: send as *const c_void,
                        recv: recv as *mut c_void,
                        count,
                        root: root as c_int,
                        datatype: cstr(super::nccl_dtype(dtype)),
                        n_channels: channels.min(255) as u8,
                        n_warps: 0,
                        algo: cstr(&algo.name().to_ascii_uppercase()),
                        proto: cstr(&proto.name().to_ascii_uppercase()),
                        parent_group: group,
                    };
                    ctx.start(abi::EV_COLL, group, Body { coll })
                }
                Part::P2p {
                    send,
                    buf,
                    count,
                    dtype,
                    peer,
                    channels,
                } => {
                    let p2p = abi::P2p {
                        func: cstr(if send { "Send" } else { "Recv" }),
                        buff: buf as *mut c_void,
                        datatype: cstr(super::nccl_dtype(dtype)),
                        count,
                        peer: peer as c_int,
                        n_channels: channels.min(255) as u8,
                        parent_group: group,
                    };
                    ctx.start(abi::EV_P2P, group, Body { p2p })
                }
            })
            .collect::<Vec<_>>();
        // The proxy's operations are children of the launch's first
        // operation (NCCL's: of their collective or Send/Recv).
        proxy::begin(ctx, ops.first().copied().unwrap_or(ptr::null_mut()));
        Launch {
            ctx,
            group,
            ops,
            _strings: strings,
        }
    }
}

impl Drop for Launch<'_> {
    fn drop(&mut self) {
        proxy::end();
        for &h in &self.ops {
            self.ctx.stop(h);
        }
        self.ctx.stop(self.group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_names_files_as_nccl() {
        assert_eq!(
            candidates(None),
            (vec!["libnccl-profiler.so".to_string()], false)
        );
        assert_eq!(
            candidates(Some("inspector")),
            (vec!["libnccl-profiler-inspector.so".to_string()], true)
        );
        assert_eq!(
            candidates(Some("/opt/p.so")),
            (vec!["/opt/p.so".to_string()], true)
        );
        assert_eq!(candidates(Some("none")), (vec![], true));
    }
}
