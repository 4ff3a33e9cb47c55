//! NCCL's profiler plugin interface, versions 4 and 5, as `repr(C)` types
//! of our own (from the layouts NCCL documents for plugin authors).

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// Event types (the bits of the activation mask).
pub(crate) const EV_GROUP: u64 = 1 << 0;
pub(crate) const EV_COLL: u64 = 1 << 1;
pub(crate) const EV_P2P: u64 = 1 << 2;
pub(crate) const EV_PROXY_OP: u64 = 1 << 3;
pub(crate) const EV_PROXY_STEP: u64 = 1 << 4;

/// Proxy step states (`ncclProfilerProxyStep*`).
pub(crate) const STATE_SEND_WAIT: c_int = 9;
pub(crate) const STATE_RECV_WAIT: c_int = 10;
pub(crate) const STATE_RECV_GPU_WAIT: c_int = 12;

/// `ncclSuccess`.
pub(crate) const SUCCESS: c_int = 0;

/// A collective's fields (v5 appends `parent_group`; v4 plugins stop
/// reading before it).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Coll {
    pub seq: u64,
    pub func: *const c_char,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    pub parent_group: *mut c_void,
}

/// A Send or Recv's fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct P2p {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    pub parent_group: *mut c_void,
}

/// A proxy operation's fields: one network link's part in a call.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProxyOp {
    /// The process that started the parent event (`pid_t`).
    pub pid: i32,
    pub channel_id: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

/// A proxy step's fields: its number in its operation.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ProxyStep {
    pub step: c_int,
}

/// The descriptor's union: as large as NCCL's largest member, so a plugin
/// copying the whole descriptor reads only ours.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union Body {
    pub coll: Coll,
    pub p2p: P2p,
    pub proxy_op: ProxyOp,
    pub proxy_step: ProxyStep,
    pad: [u64; 16],
}

/// `recordEventState`'s arguments (`ncclProfilerEventStateArgs_v5_t`,
/// v4 alike): every member is one 8-byte field.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union StateArgs {
    /// `proxyStep.transSize`: the bytes the step moved.
    pub trans_size: usize,
    pad: u64,
}

impl Body {
    pub(crate) const EMPTY: Body = Body { pad: [0; 16] };
}

/// `ncclProfilerEventDescr_v5_t`.
#[repr(C)]
pub(crate) struct DescrV5 {
    pub kind: u64,
    pub parent: *mut c_void,
    pub rank: c_int,
    pub body: Body,
}

/// `ncclProfilerEventDescr_v4_t`: the type is one byte.
#[repr(C)]
pub(crate) struct DescrV4 {
    pub kind: u8,
    pub parent: *mut c_void,
    pub rank: c_int,
    pub body: Body,
}

/// NCCL's logger: variadic in C. Ours takes the fixed arguments only,
/// which the C calling conventions of the 64-bit Linux targets pass alike
/// either way; the format is logged unformatted.
pub(crate) type Logger = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
);

pub(crate) type InitV5 = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: Logger,
) -> c_int;

pub(crate) type InitV4 = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: Logger,
) -> c_int;

pub(crate) type Start =
    unsafe extern "C" fn(ctx: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int;
pub(crate) type Stop = unsafe extern "C" fn(handle: *mut c_void) -> c_int;
pub(crate) type Record =
    unsafe extern "C" fn(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int;
pub(crate) type Finalize = unsafe extern "C" fn(ctx: *mut c_void) -> c_int;

/// `ncclProfiler_v5_t` and `ncclProfiler_v4_t`: the same fields, `init`
/// typed per version.
#[repr(C)]
pub(crate) struct Table<I> {
    pub name: *const c_char,
    pub init: Option<I>,
    pub start: Option<Start>,
    pub stop: Option<Stop>,
    pub record: Option<Record>,
    pub finalize: Option<Finalize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn layouts_match_nccls() {
        assert_eq!(offset_of!(Coll, root), 40);
        assert_eq!(offset_of!(Coll, datatype), 48);
        assert_eq!(offset_of!(Coll, n_channels), 56);
        assert_eq!(offset_of!(Coll, algo), 64);
        assert_eq!(offset_of!(Coll, parent_group), 80);
        assert_eq!(offset_of!(P2p, peer), 32);
        assert_eq!(offset_of!(P2p, parent_group), 40);
        assert_eq!(offset_of!(DescrV5, body), 24);
        assert_eq!(offset_of!(DescrV4, parent), 8);
        assert_eq!(offset_of!(DescrV4, body), 24);
        assert_eq!(offset_of!(Table<InitV5>, finalize), 40);
        assert_eq!(offset_of!(ProxyOp, channel_id), 4);
        assert_eq!(offset_of!(ProxyOp, peer), 8);
        assert_eq!(offset_of!(ProxyOp, n_steps), 12);
        assert_eq!(offset_of!(ProxyOp, chunk_size), 16);
        assert_eq!(offset_of!(ProxyOp, is_send), 20);
        assert_eq!(size_of::<ProxyOp>(), 24);
        assert_eq!(size_of::<StateArgs>(), 8);
    }
}
