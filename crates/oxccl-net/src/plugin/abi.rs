//! The C ABI of NCCL's network plugins, versions 8 to 12: the function
//! tables a plugin exports as `ncclNetPlugin_vN` and the device properties
//! each version fills in, written from the published layout (field order,
//! C types) as `#[repr(C)]` Rust. Every function pointer is an `Option`
//! (a null entry reads as `None`), and nothing here is called: `net.rs`
//! makes the calls.

use std::ffi::{c_char, c_float, c_int, c_ulong, c_void};

/// NCCL's `ncclResult_t`: 0 is success.
pub type Res = c_int;

/// Bytes of a listen handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_MAXSIZE: usize = 128;

/// `ptrSupport` bits.
pub const PTR_HOST: c_int = 1;
pub const PTR_CUDA: c_int = 2;
pub const PTR_DMABUF: c_int = 4;

/// The debug logger NCCL passes to `init`: level, subsystem flags, file,
/// line, then a printf format and its arguments.
pub type Logger = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

/// The profiler callback of v10 and later: event handle out, event type,
/// parent handle, plugin id, extra data.
pub type Profiler =
    unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> Res;

/// `ncclNetCommConfig_vN` (v10 and later): the traffic class, -1 unset.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CommConfig {
    pub traffic_class: c_int,
}

/// `ncclNetVDeviceProps` with room for `N` devices.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VDevProps<const N: usize> {
    pub ndevs: c_int,
    pub devs: [c_int; N],
}

/// The fields every version's properties have, in order: the ones v9
/// added in the middle (`force_flush`) and at the end come in as `$mid`
/// and `$tail`; the `vdevs` form is v9 and later, `N` devices a NIC.
macro_rules! props {
    ($(#[$m:meta])* $name:ident { $($mid:tt)* } { $($tail:tt)* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            pub name: *mut c_char,
            pub pci_path: *mut c_char,
            pub guid: u64,
            pub ptr_support: c_int,
            pub reg_is_global: c_int,
            $($mid)*
            pub speed: c_int,
            pub port: c_int,
            pub latency: c_float,
            pub max_comms: c_int,
            pub max_recvs: c_int,
            pub net_device_type: c_int,
            pub net_device_version: c_int,
            $($tail)*
        }
    };
    ($(#[$m:meta])* $name:ident, vdevs: $n:literal { $($tail:tt)* }) => {
        props!(
            $(#[$m])*
            $name { pub force_flush: c_int, } {
                pub vprops: VDevProps<$n>,
                pub max_p2p_bytes: usize,
                pub max_coll_bytes: usize,
                $($tail)*
            }
        );
    };
}

props!(
    /// `ncclNetProperties_v8_t`.
    PropsV8 {} {}
);

props!(
    /// `ncclNetProperties_v9_t` and `_v10_t` (the same layout).
    PropsV9, vdevs: 4 {}
);

props!(
    /// `ncclNetProperties_v11_t`.
    PropsV11, vdevs: 4 { pub max_multi_request_size: c_int, }
);

props!(
    /// `ncclNetProperties_v12_t`.
    PropsV12, vdevs: 8 {
        pub max_multi_request_size: c_int,
        pub rail_id: i16,
        pub plane_id: i16,
    }
);

type P = *mut c_void;
type Pp = *mut *mut c_void;

/// The entries every version shares, in order, after the ones that differ
/// (`name` through `connect`, and `isend`/`irecv` further on).
macro_rules! net {
    (
        $(#[$m:meta])* $name:ident, $props:ty,
        init: ($($init:ty),*),
        listen: ($($listen:ty),*),
        connect: ($($connect:ty),*),
        isend: ($($isend:ty),*),
        irecv: ($($irecv:ty),*),
        tail: { $($tail:tt)* }
    ) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            pub name: *const c_char,
            pub init: Option<unsafe extern "C" fn($($init),*) -> Res>,
            pub devices: Option<unsafe extern "C" fn(*mut c_int) -> Res>,
            pub get_properties: Option<unsafe extern "C" fn(c_int, *mut $props) -> Res>,
            pub listen: Option<unsafe extern "C" fn($($listen),*) -> Res>,
            pub connect: Option<unsafe extern "C" fn($($connect),*) -> Res>,
            pub accept: Option<unsafe extern "C" fn(P, Pp, Pp) -> Res>,
            pub reg_mr: Option<unsafe extern "C" fn(P, P, usize, c_int, Pp) -> Res>,
            pub reg_mr_dma_buf:
                Option<unsafe extern "C" fn(P, P, usize, c_int, u64, c_int, Pp) -> Res>,
            pub dereg_mr: Option<unsafe extern "C" fn(P, P) -> Res>,
            pub isend: Option<unsafe extern "C" fn($($isend),*) -> Res>,
            pub irecv: Option<unsafe extern "C" fn($($irecv),*) -> Res>,
            pub iflush:
                Option<unsafe extern "C" fn(P, c_int, Pp, *mut c_int, Pp, Pp) -> Res>,
            pub test: Option<unsafe extern "C" fn(P, *mut c_int, *mut c_int) -> Res>,
            pub close_send: Option<unsafe extern "C" fn(P) -> Res>,
            pub close_recv: Option<unsafe extern "C" fn(P) -> Res>,
            pub close_listen: Option<unsafe extern "C" fn(P) -> Res>,
            pub get_device_mr: Option<unsafe extern "C" fn(P, P, Pp) -> Res>,
            pub irecv_consumed: Option<unsafe extern "C" fn(P, c_int, P) -> Res>,
            $($tail)*
        }
    };
    // v11 and later: a context per communicator, `N` devices a virtual NIC.
    ($(#[$m:meta])* $name:ident, $props:ty, context, vdevs: $n:literal) => {
        net!(
            $(#[$m])*
            $name, $props,
            init: (Pp, u64, *mut CommConfig, Option<Logger>, Option<Profiler>),
            listen: (P, c_int, P, Pp),
            connect: (P, c_int, P, Pp, Pp),
            isend: (P, P, usize, c_int, P, P, Pp),
            irecv: (P, c_int, Pp, *mut usize, *mut c_int, Pp, Pp, Pp),
            tail: {
                pub make_vdevice:
                    Option<unsafe extern "C" fn(*mut c_int, *mut VDevProps<$n>) -> Res>,
                pub finalize: Option<unsafe extern "C" fn(P) -> Res>,
                pub set_net_attr: Option<unsafe extern "C" fn(P, P) -> Res>,
            }
        );
    };
    // v8 and v9: one `init` a process, no config; sizes are `$size`.
    ($(#[$m:meta])* $name:ident, $props:ty, size: $size:ty, tail: { $($tail:tt)* }) => {
        net!(
            $(#[$m])*
            $name, $props,
            init: (Option<Logger>),
            listen: (c_int, P, Pp),
            connect: (c_int, P, Pp, Pp),
            isend: (P, P, $size, c_int, P, Pp),
            irecv: (P, c_int, Pp, *mut $size, *mut c_int, Pp, Pp),
            tail: { $($tail)* }
        );
    };
}

net!(
    /// `ncclNet_v8_t`.
    NetV8, PropsV8, size: c_int, tail: {}
);

net!(
    /// `ncclNet_v9_t`: sizes become `size_t`, virtual NICs appear.
    NetV9, PropsV9, size: usize,
    tail: {
        pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, *mut VDevProps<4>) -> Res>,
    }
);

net!(
    /// `ncclNet_v10_t`: a profiler callback, a comm config on connect,
    /// profiler handles on isend/irecv.
    NetV10, PropsV9,
    init: (Option<Logger>, Option<Profiler>),
    listen: (c_int, P, Pp),
    connect: (c_int, *mut CommConfig, P, Pp, Pp),
    isend: (P, P, usize, c_int, P, P, Pp),
    irecv: (P, c_int, Pp, *mut usize, *mut c_int, Pp, Pp, Pp),
    tail: {
        pub make_vdevice: Option<unsafe extern "C" fn(*mut c_int, *mut VDevProps<4>) -> Res>,
    }
);

net!(
    /// `ncclNet_v11_t`: a context per communicator (from `init`, passed to
    /// `listen` and `connect`, ended by `finalize`).
    NetV11, PropsV11, context, vdevs: 4
);

net!(
    /// `ncclNet_v12_t`: v11 with eight devices per virtual NIC and rail and
    /// plane ids in the properties.
    NetV12, PropsV12, context, vdevs: 8
);

/// NCCL's name for a result code, for messages.
pub fn result_name(r: Res) -> &'static str {
    match r {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "an unknown result",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layouts as a C compiler lays them out on LP64 (the sizes and
    /// offsets that follow from the published field order).
    #[test]
    fn layouts_match_lp64_c() {
        assert_eq!(size_of::<PropsV8>(), 64);
        assert_eq!(offset_of!(PropsV8, latency), 40);
        assert_eq!(offset_of!(PropsV9, vprops), 64);
        assert_eq!(offset_of!(PropsV9, max_p2p_bytes), 88);
        assert_eq!(size_of::<PropsV9>(), 104);
        assert_eq!(size_of::<PropsV11>(), 112);
        assert_eq!(offset_of!(PropsV12, max_p2p_bytes), 104);
        assert_eq!(offset_of!(PropsV12, rail_id), 124);
        assert_eq!(size_of::<PropsV12>(), 128);
        let p = size_of::<usize>();
        assert_eq!(size_of::<NetV8>(), 19 * p);
        assert_eq!(size_of::<NetV9>(), 20 * p);
        assert_eq!(size_of::<NetV10>(), 20 * p);
        assert_eq!(size_of::<NetV11>(), 22 * p);
        assert_eq!(size_of::<NetV12>(), 22 * p);
    }
}
