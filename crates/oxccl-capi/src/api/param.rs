//! NCCL 2.30's parameter API over oxccl's settings table: every setting
//! the library reads, by its variable name (`NCCL_*` twin or `OXCCL_*`
//! name), with its value as the library sees it (the environment's, else
//! the default). Handles are never freed (NCCL's contract: valid for the
//! library's lifetime); strings returned are owned here and valid until
//! the same call on the same thread, as NCCL documents.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

use parking_lot::Mutex;

use crate::abi::{NcclResult, SUCCESS};
use crate::error::{guard, guard_value, CError, CResult};

use super::out;

/// What a handle points at: the key it was bound to.
#[derive(Debug)]
struct Bound {
    key: String,
}

/// Keys bound so far: a key's handle is the same on every bind.
static BOUND: Mutex<Option<HashMap<String, &'static Bound>>> = Mutex::new(None);

thread_local! {
    static STR: RefCell<CString> = RefCell::new(CString::default());
    static PARAM: RefCell<CString> = RefCell::new(CString::default());
    static KEYS: RefCell<(Vec<CString>, Vec<*const c_char>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// # Safety
/// `p` null or a NUL-terminated string.
unsafe fn key_arg<'a>(p: *const c_char) -> CResult<&'a str> {
    if p.is_null() {
        return Err(CError::arg("key is NULL"));
    }
    // SAFETY: the caller's NUL-terminated string.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| CError::arg("key is not UTF-8"))
}

fn unknown(key: &str) -> CError {
    CError::arg(format!(
        "{key} is not a parameter of this library (ncclParamGetAllParameterKeys lists them)"
    ))
}

/// The bound key behind handle `h`.
fn bound(h: *const c_void) -> CResult<&'static Bound> {
    if h.is_null() {
        return Err(CError::arg("handle is NULL"));
    }
    BOUND
        .lock()
        .as_ref()
        .and_then(|m| {
            m.values()
                .find(|b| std::ptr::eq(**b, h as *const Bound))
                .copied()
        })
        .ok_or_else(|| CError::arg(format!("{h:p} is not a handle made by ncclParamBind")))
}

fn value_of(h: *const c_void) -> CResult<String> {
    let b = bound(h)?;
    crate::params::value(&b.key).ok_or_else(|| unknown(&b.key))
}

/// Binds `key` (the setting's variable name) to a handle written through
/// `out`; an unknown key is `ncclInvalidArgument` and `out` is untouched.
///
/// # Safety
/// `out` null or writable; `key` null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ncclParamBind(
    out_h: *mut *const c_void,
    key: *const c_char,
) -> NcclResult {
    guard("ncclParamBind", || {
        let p = out(out_h, "out")?;
        // SAFETY: the caller's string.
        let key = unsafe { key_arg(key) }?;
        let canon = crate::params::canonical(key).ok_or_else(|| unknown(key))?;
        let h = *BOUND
            .lock()
            .get_or_insert_with(HashMap::new)
            .entry(canon.to_string())
            .or_insert_with(|| {
                Box::leak(Box::new(Bound {
                    key: canon.to_string(),
                }))
            });
        // SAFETY: checked by `out`.
        unsafe { p.write(h as *const Bound as *const c_void) };
        Ok(SUCCESS)
    })
}

macro_rules! typed_getters {
    ($($name:ident => $t:ty;)*) => {$(
        #[doc = concat!("The parameter as `", stringify!($t), "`; a value that is not such an integer is `ncclInvalidArgument`.")]
        ///
        /// # Safety
        /// `h` from `ncclParamBind`; `out` null or writable.
        #[no_mangle]
        pub unsafe extern "C" fn $name(h: *const c_void, out_v: *mut $t) -> NcclResult {
            guard(stringify!($name), || {
                let p = out(out_v, "out")?;
                let v = value_of(h)?;
                let n: $t = crate::params::integer(&v).ok_or_else(|| {
                    CError::arg(format!("value {v:?} is not a {}", stringify!($t)))
                })?;
                // SAFETY: checked by `out`.
                unsafe { p.write(n) };
                Ok(SUCCESS)
            })
        }
    )*};
}

typed_getters! {
    ncclParamGetI8 => i8;
    ncclParamGetI16 => i16;
    ncclParamGetI32 => i32;
    ncclParamGetI64 => i64;
    ncclParamGetU8 => u8;
    ncclParamGetU16 => u16;
    ncclParamGetU32 => u32;
    ncclParamGetU64 => u64;
}

fn keep(
    cell: &'static std::thread::LocalKey<RefCell<CString>>,
    s: String,
) -> CResult<(*const c_char, usize)> {
    let c = CString::new(s).map_err(|_| CError::arg("the value holds a NUL byte"))?;
    let len = c.as_bytes().len();
    Ok(cell.with(|k| {
        *k.borrow_mut() = c;
        (k.borrow().as_ptr(), len)
    }))
}

/// The parameter as a string, valid until this thread's next call.
///
/// # Safety
/// `h` from `ncclParamBind`; `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclParamGetStr(
    h: *const c_void,
    out_s: *mut *const c_char,
) -> NcclResult {
    guard("ncclParamGetStr", || {
        let p = out(out_s, "out")?;
        let (s, _) = keep(&STR, value_of(h)?)?;
        // SAFETY: checked by `out`.
        unsafe { p.write(s) };
        Ok(SUCCESS)
    })
}

/// The parameter's bytes (its string, without a NUL) copied into `out`;
/// `len` gets the length, or the length needed when `maxLen` is short
/// (then `ncclInvalidArgument`).
///
/// # Safety
/// `h` from `ncclParamBind`; `out` null or `maxLen` writable bytes; `len`
/// null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclParamGet(
    h: *const c_void,
    out_b: *mut c_void,
    max_len: c_int,
    len: *mut c_int,
) -> NcclResult {
    guard("ncclParamGet", || {
        let lp = out(len, "len")?;
        let v = value_of(h)?;
        let need = c_int::try_from(v.len()).map_err(|_| CError::arg("value too long"))?;
        if max_len < need {
            // SAFETY: checked by `out`.
            unsafe { lp.write(need) };
            return Err(CError::arg(format!(
                "maxLen {max_len} is less than the {need} bytes of the value"
            )));
        }
        if need > 0 {
            if out_b.is_null() {
                return Err(CError::arg("out is NULL"));
            }
            // SAFETY: the caller's `maxLen` >= `need` writable bytes.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out_b as *mut u8, v.len()) };
        }
        // SAFETY: checked by `out`.
        unsafe { lp.write(need) };
        Ok(SUCCESS)
    })
}

/// The value of `key` as a string, valid until this thread's next call.
///
/// # Safety
/// `key` a NUL-terminated string; `value` and `value_len` null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclParamGetParameter(
    key: *const c_char,
    value: *mut *const c_char,
    value_len: *mut c_int,
) -> NcclResult {
    guard("ncclParamGetParameter", || {
        // SAFETY: the caller's string.
        let key = unsafe { key_arg(key) }?;
        let vp = out(value, "value")?;
        let lp = out(value_len, "valueLen")?;
        let v = crate::params::canonical(key)
            .and_then(crate::params::value)
            .ok_or_else(|| unknown(key))?;
        let (s, n) = keep(&PARAM, v)?;
        // SAFETY: both checked by `out`.
        unsafe {
            vp.write(s);
            lp.write(n as c_int);
        }
        Ok(SUCCESS)
    })
}

/// Every parameter's key, valid until this thread's next call.
///
/// # Safety
/// `table` and `table_len` null or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclParamGetAllParameterKeys(
    table: *mut *const *const c_char,
    table_len: *mut c_int,
) -> NcclResult {
    guard("ncclParamGetAllParameterKeys", || {
        let tp = out(table, "table")?;
        let lp = out(table_len, "tableLen")?;
        let keys: Vec<CString> = crate::params::keys()
            .into_iter()
            .filter_map(|k| CString::new(k).ok())
            .collect();
        let (ptr, n) = KEYS.with(|k| {
            let mut k = k.borrow_mut();
            k.1 = keys.iter().map(|c| c.as_ptr()).collect();
            k.0 = keys;
            (k.1.as_ptr(), k.1.len())
        });
        // SAFETY: both checked by `out`.
        unsafe {
            tp.write(ptr);
            lp.write(n as c_int);
        }
        Ok(SUCCESS)
    })
}

/// Writes every parameter and its value to the log (INFO).
#[no_mangle]
pub extern "C" fn ncclParamDumpAll() {
    guard_value((), || {
        for k in crate::params::keys() {
            let v = crate::params::value(k).unwrap_or_default();
            tracing::info!(target: "oxccl::param", "{k}={v}");
        }
    })
}
