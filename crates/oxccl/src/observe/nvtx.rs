//! NVTX ranges without linking NVTX: the injection protocol of NVTX v3,
//! spoken from this side.
//!
//! A profiler (Nsight Systems, or any NVTX tool) names its library in
//! `NVTX_INJECTION64_PATH`. At first use we load it and call its
//! `InitializeInjectionNvtx2` with our export-table getter; the tool asks
//! that getter for the callback table, asks it for each module's function
//! table, and writes its own function pointers into the slots. We then
//! create the domain `NCCL` through the tool's `DomainCreateA` and push and
//! pop ranges through its `DomainRangePushEx`/`DomainRangePop`. With no
//! path set nothing is loaded, and a range is one branch.
//!
//! What we honour, checked against NVTX's public headers (`nvtxTypes.h`,
//! `nvtxImpl.h`, `nvtxInit.h`):
//! - `InitializeInjectionNvtx2(getter)` is called once; a return of 0 is a
//!   refusal (no ranges, a warning), as NVTX treats it.
//! - The getter answers `NVTX_ETID_CALLBACKS` (1) with
//!   `{struct_size, GetModuleFunctionTable}` and `NVTX_ETID_VERSIONINFO`
//!   (3) with `{struct_size, version = 3, reserved0, SetInjectionNvtxVersion}`;
//!   any other id (2 is reserved) gets null.
//! - `GetModuleFunctionTable` serves every module id of NVTX v3: CORE (1,
//!   16 ids), CUDA (2, 9), OPENCL (3, 15), CUDART (4, 7), CORE2 (5, 16),
//!   SYNC (6, 7): a table of `size + 1` pointers, entry 0 (each module's
//!   invalid id) null, entries `1..size` the addresses of our slots,
//!   entry `size` a null sentinel, and `*out_size = size` (NVTX's own
//!   `sizeof(table)/sizeof(entry) - 1`); an unknown module returns 0. So
//!   a tool (Nsight Systems fills every slot it implements) writes only
//!   into our slots.
//! - Of the filled slots we call only CORE2's `DomainCreateA` (12),
//!   `DomainRangePushEx` (4) and `DomainRangePop` (5); the others are
//!   kept and never called. A tool that leaves one of the three null
//!   attaches no ranges (a warning).
//!
//! A range's message is the NCCL call's name followed by its arguments
//! (`ncclAllReduce count=1024 datatype=ncclFloat32 op=ncclSum
//! comm=0x… rank=0 nranks=4`), and its 64-bit unsigned payload is the
//! count: the fields NCCL sends through NVTX's payload extension, kept in
//! the core API (which every tool reads).

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A function pointer slot a tool fills (NVTX's generic function type).
type Slot = AtomicPtr<c_void>;

/// Module numbers of the callback table.
const MODULE_CORE: c_int = 1;
const MODULE_CUDA: c_int = 2;
const MODULE_OPENCL: c_int = 3;
const MODULE_CUDART: c_int = 4;
const MODULE_CORE2: c_int = 5;
const MODULE_SYNC: c_int = 6;

/// Export table ids.
const ETID_CALLBACKS: u32 = 1;
const ETID_VERSIONINFO: u32 = 3;

/// Callback ids of the domain module (`CORE2`) we call.
const CORE2_RANGE_PUSH_EX: usize = 4;
const CORE2_RANGE_POP: usize = 5;
const CORE2_DOMAIN_CREATE_A: usize = 12;

/// Slots per module (each module's highest id plus one), so a tool that
/// fills every slot it knows writes only into ours.
const SLOTS_CORE: usize = 16;
const SLOTS_CUDA: usize = 9;
const SLOTS_OPENCL: usize = 15;
const SLOTS_CUDART: usize = 7;
const SLOTS_CORE2: usize = 16;
const SLOTS_SYNC: usize = 7;

/// The NVTX API version this side speaks.
const NVTX_VERSION: u32 = 3;

/// `nvtxEventAttributes_t` (version 3 of the API, 48 bytes).
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_char,
}

/// How our ranges are described: an ARGB colour (NCCL's green, so ours
/// look like NCCL's), a u64 payload and an ASCII message (each kind is 1
/// in its NVTX enumeration).
const ATTR_KINDS: (i32, i32, i32) = (1, 1, 1);
const NCCL_COLOR: u32 = 0xff76_b900;

/// The callback export table.
#[repr(C)]
struct CallbacksTable {
    struct_size: usize,
    get_module_function_table: unsafe extern "C" fn(
        module: c_int,
        out_table: *mut *mut *mut Slot,
        out_size: *mut c_uint,
    ) -> c_int,
}

/// The version export table.
#[repr(C)]
struct VersionTable {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: extern "C" fn(version: u32),
}

/// A module's slots and the table of pointers to them the tool receives
/// (one more entry, null, past the end).
struct Module<const N: usize> {
    slots: [Slot; N],
    table: std::sync::OnceLock<TableOf>,
}

/// A table of slot addresses (raw pointers into a `'static` module).
struct TableOf(Box<[*mut Slot]>);
// SAFETY: the pointers address `'static` atomics; sharing their addresses
// between threads is what atomics are for.
unsafe impl Send for TableOf {}
// SAFETY: as above; the table itself is never written after it is built.
unsafe impl Sync for TableOf {}

impl<const N: usize> Module<N> {
    const fn new() -> Self {
        Module {
            slots: [const { AtomicPtr::new(ptr::null_mut()) }; N],
            table: std::sync::OnceLock::new(),
        }
    }

    /// The table the tool writes through, and its entry count (without the
    /// null sentinel).
    fn table(&'static self) -> (*mut *mut Slot, c_uint) {
        let t = self.table.get_or_init(|| {
            // Entry 0 is the module's invalid id: null, as in NVTX's own
            // tables, so a tool walking ids 1.. never writes through it.
            let mut v: Vec<*mut Slot> = std::iter::once(ptr::null_mut())
                .chain(
                    self.slots[1..]
                        .iter()
                        .map(|s| s as *const Slot as *mut Slot),
                )
                .collect();
            v.push(ptr::null_mut());
            TableOf(v.into_boxed_slice())
        });
        (t.0.as_ptr() as *mut *mut Slot, N as c_uint)
    }

    fn get(&self, id: usize) -> *mut c_void {
        self.slots[id].load(Ordering::Acquire)
    }
}

static CORE: Module<SLOTS_CORE> = Module::new();
static CUDA: Module<SLOTS_CUDA> = Module::new();
static OPENCL: Module<SLOTS_OPENCL> = Module::new();
static CUDART: Module<SLOTS_CUDART> = Module::new();
static CORE2: Module<SLOTS_CORE2> = Module::new();
static SYNC: Module<SLOTS_SYNC> = Module::new();

/// # Safety
/// Called by the tool with writable (or null) out pointers.
unsafe extern "C" fn get_module_function_table(
    module: c_int,
    out_table: *mut *mut *mut Slot,
    out_size: *mut c_uint,
) -> c_int {
    let (table, size) = match module {
        MODULE_CORE => CORE.table(),
        MODULE_CUDA => CUDA.table(),
        MODULE_OPENCL => OPENCL.table(),
        MODULE_CUDART => CUDART.table(),
        MODULE_CORE2 => CORE2.table(),
        MODULE_SYNC => SYNC.table(),
        _ => return 0,
    };
    if !out_table.is_null() {
        // SAFETY: the tool passed a writable pointer (the protocol's contract).
        unsafe { *out_table = table };
    }
    if !out_size.is_null() {
        // SAFETY: as above.
        unsafe { *out_size = size };
    }
    1
}

extern "C" fn set_injection_nvtx_version(_version: u32) {}

static CALLBACKS: CallbacksTable = CallbacksTable {
    struct_size: size_of::<CallbacksTable>(),
    get_module_function_table,
};

static VERSION: VersionTable = VersionTable {
    struct_size: size_of::<VersionTable>(),
    version: NVTX_VERSION,
    reserved0: 0,
    set_injection_nvtx_version,
};

extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        ETID_CALLBACKS => &CALLBACKS as *const CallbacksTable as *const c_void,
        ETID_VERSIONINFO => &VERSION as *const VersionTable as *const c_void,
        _ => ptr::null(),
    }
}

type InitFn = unsafe extern "C" fn(get: extern "C" fn(u32) -> *const c_void) -> c_int;
type DomainCreateA = unsafe extern "C" fn(name: *const c_char) -> *mut c_void;
type RangePushEx = unsafe extern "C" fn(domain: *mut c_void, attr: *const EventAttributes) -> c_int;
type RangePop = unsafe extern "C" fn(domain: *mut c_void) -> c_int;

/// An attached tool: its library (kept loaded for the process) and the
/// domain it made for us.
#[derive(Debug)]
pub(crate) struct Nvtx {
    _lib: libloading::Library,
    domain: usize,
    push: RangePushEx,
    pop: RangePop,
}

impl Nvtx {
    /// Loads the tool at `path` and creates the `NCCL` domain; `Err` says
    /// why no tool is attached.
    pub(crate) fn attach(path: &str) -> Result<Nvtx, String> {
        // SAFETY: loading a library runs its initialisers; the user named
        // it as an NVTX tool, which is what NVTX itself would load.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
        // SAFETY: the symbol's type is NVTX's injection entry point.
        let init: InitFn = *unsafe { lib.get::<InitFn>(b"InitializeInjectionNvtx2\0") }
            .map_err(|e| e.to_string())?;
        // SAFETY: the tool's entry point, called once with a getter whose
        // tables live for the process.
        if unsafe { init(get_export_table) } == 0 {
            return Err("its InitializeInjectionNvtx2 returned 0".into());
        }
        let (create, push, pop) = (
            CORE2.get(CORE2_DOMAIN_CREATE_A),
            CORE2.get(CORE2_RANGE_PUSH_EX),
            CORE2.get(CORE2_RANGE_POP),
        );
        if create.is_null() || push.is_null() || pop.is_null() {
            return Err("it takes no domain ranges (DomainCreateA, DomainRangePushEx or DomainRangePop unset)".into());
        }
        // SAFETY: the tool wrote these slots with its DomainCreateA,
        // DomainRangePushEx and DomainRangePop, of these types.
        let (create, push, pop) = unsafe {
            (
                std::mem::transmute::<*mut c_void, DomainCreateA>(create),
                std::mem::transmute::<*mut c_void, RangePushEx>(push),
                std::mem::transmute::<*mut c_void, RangePop>(pop),
            )
        };
        // SAFETY: a NUL-terminated name, as DomainCreateA takes.
        let domain = unsafe { create(c"NCCL".as_ptr()) };
        Ok(Nvtx {
            _lib: lib,
            domain: domain as usize,
            push,
            pop,
        })
    }

    /// Pushes a range named `message` with `payload` on this thread.
    pub(crate) fn push(&self, message: &str, payload: u64) {
        let Ok(msg) = CString::new(message) else {
            return;
        };
        let attr = EventAttributes {
            version: NVTX_VERSION as u16,
            size: size_of::<EventAttributes>() as u16,
            category: 0,
            color_type: ATTR_KINDS.0,
            color: NCCL_COLOR,
            payload_type: ATTR_KINDS.1,
            reserved0: 0,
            payload,
            message_type: ATTR_KINDS.2,
            message: msg.as_ptr(),
        };
        // SAFETY: `push` is the tool's DomainRangePushEx (checked non-null
        // at attach); the attributes and message outlive the call, which
        // copies what it keeps.
        unsafe { (self.push)(self.domain as *mut c_void, &attr) };
    }

    /// Pops this thread's innermost range.
    pub(crate) fn pop(&self) {
        // SAFETY: `pop` is the tool's DomainRangePop (non-null at attach).
        unsafe { (self.pop)(self.domain as *mut c_void) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attributes_have_nvtx_v3_layout() {
        assert_eq!(size_of::<EventAttributes>(), 48);
        assert_eq!(std::mem::offset_of!(EventAttributes, payload), 24);
        assert_eq!(std::mem::offset_of!(EventAttributes, message), 40);
    }

    #[test]
    fn module_tables_end_in_null_and_report_their_size() {
        let (mut t, mut n) = (ptr::null_mut(), 0);
        // SAFETY: valid out pointers.
        let ok = unsafe { get_module_function_table(MODULE_CORE2, &mut t, &mut n) };
        assert_eq!(ok, 1);
        assert_eq!(n as usize, SLOTS_CORE2);
        // SAFETY: the table has `n + 1` entries.
        assert!(unsafe { *t.add(n as usize) }.is_null());
        // SAFETY: as above: id 0 (invalid) is null, ids 1..n are slots.
        assert!(unsafe { *t }.is_null());
        // SAFETY: as above.
        let push = unsafe { *t.add(CORE2_RANGE_PUSH_EX) };
        assert_eq!(
            push as *const Slot,
            &CORE2.slots[CORE2_RANGE_PUSH_EX] as *const Slot
        );
        for (m, size) in [
            (MODULE_CORE, 16),
            (MODULE_CUDA, 9),
            (MODULE_OPENCL, 15),
            (MODULE_CUDART, 7),
            (MODULE_CORE2, 16),
            (MODULE_SYNC, 7),
        ] {
            // SAFETY: valid out pointers.
            assert_eq!(unsafe { get_module_function_table(m, &mut t, &mut n) }, 1);
            assert_eq!(n, size, "module {m}");
        }
        // SAFETY: valid out pointers; an unknown module is refused.
        assert_eq!(unsafe { get_module_function_table(99, &mut t, &mut n) }, 0);
        assert!(get_export_table(2).is_null());
    }
}
