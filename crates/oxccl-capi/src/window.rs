//! Window handles (`ncclWindow_t`). Like communicator handles
//! (`handle.rs`), a window handle is a token, never an address: a serial
//! number no other window of this process ever gets, in a range of values
//! that is no user-space address and no communicator handle, so C code
//! that dereferences one faults at once, and a deregistered, foreign or
//! made-up handle is an `ncclInvalidArgument` found in the table, never
//! a dereference. Each entry remembers the communicator that made it: a
//! window is used and deregistered only through that communicator.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::abi::{self, NcclCommT};
use crate::error::{CError, CResult};
use crate::handle;

/// One live window.
#[derive(Debug)]
struct Entry {
    /// The handle of the communicator that registered it.
    comm: usize,
    win: oxccl::Window,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    map: HashMap<usize, Entry>,
}

static WINDOWS: Mutex<Option<Table>> = Mutex::new(None);

/// Where window handles start: bits 53..56 set, 52 and 63..56 clear, so
/// no handle is a canonical user-space address (x86-64, AArch64) or a
/// communicator handle (those have bit 52 set). Serials are shifted by 4
/// (16-byte aligned values, as C code expects of pointers).
const WINDOW_BASE: usize = 0x00e0_0000_0000_0000;
/// Serials that fit below bit 52 once shifted.
const MAX_SERIAL: u64 = (1 << 48) - 1;

fn token(n: u64) -> usize {
    WINDOW_BASE | (n as usize) << 4
}

/// Records `win`, registered through `comm`, and returns its handle.
/// Entries of communicators destroyed since are dropped on the way (their
/// handles are dead for good: communicator handles are never reused).
pub fn publish(comm: NcclCommT, win: oxccl::Window) -> CResult<usize> {
    let mut t = WINDOWS.lock();
    let t = t.get_or_insert_with(Table::default);
    t.map
        .retain(|_, e| handle::lookup(e.comm as NcclCommT).is_ok());
    if t.next >= MAX_SERIAL {
        return Err(CError {
            code: abi::INTERNAL_ERROR,
            msg: "this process has used up its window handles".into(),
        });
    }
    t.next += 1;
    let h = token(t.next);
    t.map.insert(
        h,
        Entry {
            comm: comm as usize,
            win,
        },
    );
    Ok(h)
}

fn unknown(win: usize) -> CError {
    if win == 0 {
        return CError::arg("win is NULL");
    }
    CError::arg(format!(
        "win {win:#x} is not a live window of this communicator (deregistered already, \
         registered through another communicator, or not made by ncclCommWindowRegister)"
    ))
}

/// The registered pointer of `comm`'s window `win`.
pub fn user_ptr(comm: NcclCommT, win: usize) -> CResult<u64> {
    WINDOWS
        .lock()
        .as_ref()
        .and_then(|t| t.map.get(&win))
        .filter(|e| e.comm == comm as usize)
        .map(|e| e.win.addr())
        .ok_or_else(|| unknown(win))
}

/// Takes `comm`'s window `win` out of the table (a window of another
/// communicator stays).
pub fn take(comm: NcclCommT, win: usize) -> CResult<oxccl::Window> {
    let mut t = WINDOWS.lock();
    let t = t.as_mut().ok_or_else(|| unknown(win))?;
    match t.map.get(&win) {
        Some(e) if e.comm == comm as usize => {}
        _ => return Err(unknown(win)),
    }
    t.map
        .remove(&win)
        .map(|e| e.win)
        .ok_or_else(|| unknown(win))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_handles_are_no_addresses_and_no_communicators() {
        let h = token(1);
        assert_eq!(h & 0xf, 0);
        assert!(h >> 47 != 0, "above every user-space address");
        assert_eq!(h >> 56, 0);
        assert_eq!(h & (1 << 52), 0, "communicator handles have bit 52 set");
        let last = token(MAX_SERIAL);
        assert_eq!(last & (1 << 52), 0, "serials never reach bit 52");
        assert_eq!(last & WINDOW_BASE, WINDOW_BASE);
    }

    #[test]
    fn unknown_handles_are_refused() {
        let fake = 0x1234 as NcclCommT;
        assert_eq!(user_ptr(fake, 0).unwrap_err().code, abi::INVALID_ARGUMENT);
        assert_eq!(
            take(fake, token(7)).unwrap_err().code,
            abi::INVALID_ARGUMENT
        );
    }
}
