//! The debug logger a plugin's `init` receives, forwarded to `tracing`.
//! The variadic entry point is C (`csrc/plugin_log.c`, built by
//! `build.rs`): it formats the message with `vsnprintf` into a bounded
//! buffer and calls [`sink`] with it.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::sync::Once;

use super::abi::{Logger, Profiler, Res};

type Sink = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char);

extern "C" {
    fn oxccl_net_set_log_sink(sink: Option<Sink>);
    fn oxccl_net_plugin_log(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
}

/// NCCL's log levels (`ncclDebugLogLevel`).
const VERSION: c_int = 1;
const WARN: c_int = 2;
const INFO: c_int = 3;
const ABORT: c_int = 4;

/// `p` as text: empty for null.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that outlives the call.
unsafe fn text<'a>(p: *const c_char) -> std::borrow::Cow<'a, str> {
    if p.is_null() {
        return "".into();
    }
    // SAFETY: non-null and NUL-terminated (the caller's promise).
    unsafe { CStr::from_ptr(p) }.to_string_lossy()
}

/// Where the C logger sends each formatted message.
unsafe extern "C" fn sink(
    level: c_int,
    _flags: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
) {
    // A panic must not unwind into the plugin's C frames.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the C half passes its own NUL-terminated buffer and the
        // plugin's `file` (a string literal, or null), both alive for
        // this call.
        let (file, msg) = unsafe { (text(file), text(msg)) };
        let msg = msg.trim_end();
        match level {
            WARN => tracing::warn!("NET/Plugin: {msg} ({file}:{line})"),
            ABORT => tracing::error!("NET/Plugin: {msg} ({file}:{line})"),
            VERSION | INFO => tracing::info!("NET/Plugin: {msg}"),
            _ => tracing::trace!("NET/Plugin: {msg} ({file}:{line})"),
        }
    });
}

/// The logger to pass to a plugin's `init`.
pub(crate) fn logger() -> Logger {
    static SET: Once = Once::new();
    // SAFETY: stores a function pointer that lives as long as the process.
    SET.call_once(|| unsafe { oxccl_net_set_log_sink(Some(sink)) });
    oxccl_net_plugin_log
}

/// The profiler callback passed to v10 and later: oxccl records no
/// plugin events, so every event gets no handle.
pub(crate) unsafe extern "C" fn no_profiler(
    handle: *mut *mut c_void,
    _kind: c_int,
    _parent: *mut c_void,
    _plugin: i64,
    _data: *mut c_void,
) -> Res {
    if !handle.is_null() {
        // SAFETY: the plugin passes where to store the event's handle.
        unsafe { *handle = std::ptr::null_mut() };
    }
    0
}

/// [`no_profiler`] with its type.
pub(crate) fn profiler() -> Profiler {
    no_profiler
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C logger formats its arguments and reaches the sink without
    /// crashing, null format and file included.
    #[test]
    fn the_c_logger_formats_and_tolerates_nulls() {
        let log = logger();
        // SAFETY: a format with matching arguments, then nulls, which the
        // C half checks for.
        unsafe {
            log(
                INFO,
                0,
                c"x.c".as_ptr(),
                7,
                c"%s has %d devices".as_ptr(),
                c"ours".as_ptr(),
                3 as c_int,
            );
            log(WARN, 0, std::ptr::null(), 0, std::ptr::null());
        }
    }
}
