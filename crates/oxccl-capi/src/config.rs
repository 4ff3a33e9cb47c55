//! `ncclConfig_t`, read field by field: a caller compiled against any
//! NCCL header from 2.17 to 2.30 passes its own layout, whose `size` and
//! `version` say which fields it has. A field is read only when it lies
//! inside `size` and its release is not newer than `version`; fields this
//! library has no use for are read (to validate) and ignored.

use std::ffi::{c_char, c_int, c_uint, CStr};

use crate::error::{CError, CResult};

/// `NCCL_CONFIG_UNDEF_INT`.
pub const UNDEF_INT: c_int = c_int::MIN;
/// The header's magic.
pub const MAGIC: c_uint = 0xcafe_beef;

/// What this library takes from a caller's configuration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommConfig {
    /// `blocking`: `None` when unset (then blocking, as NCCL).
    pub blocking: Option<bool>,
    /// `maxCTAs`: caps the channel count.
    pub max_ctas: Option<u32>,
    /// `commName`, for logs.
    pub name: Option<String>,
}

impl CommConfig {
    pub fn is_blocking(&self) -> bool {
        self.blocking.unwrap_or(true)
    }
}

/// An int field: its byte offset and the release that added it
/// (`NCCL_VERSION` code).
#[derive(Clone, Copy, Debug)]
struct Field {
    name: &'static str,
    offset: usize,
    since: c_uint,
}

const fn f(name: &'static str, offset: usize, since: c_uint) -> Field {
    Field {
        name,
        offset,
        since,
    }
}

/// Offsets are those of the x86-64 and aarch64 layout (8-byte pointers).
const BLOCKING: Field = f("blocking", 16, 21400);
const CGA: Field = f("cgaClusterSize", 20, 21400);
const MIN_CTAS: Field = f("minCTAs", 24, 21400);
const MAX_CTAS: Field = f("maxCTAs", 28, 21400);
const NET_NAME: Field = f("netName", 32, 21400);
const SPLIT_SHARE: Field = f("splitShare", 40, 21800);
const COMM_NAME: Field = f("commName", 48, 22200);
const LATER_INTS: [Field; 7] = [
    f("trafficClass", 44, 22200),
    f("collnetEnable", 56, 22700),
    f("CTAPolicy", 60, 22700),
    f("shrinkShare", 64, 22700),
    f("nvlsCTAs", 68, 22700),
    f("nChannelsPerNetPeer", 72, 22800),
    f("nvlinkCentricSched", 76, 22800),
];

/// The smallest layout there is: `size`, `magic`, `version`.
const HEADER: usize = 16;
/// Larger than any release's layout by far: a `size` above it is garbage.
const MAX_SIZE: usize = 4096;

/// Reads the caller's configuration (`NULL`: the defaults).
///
/// # Safety
/// `cfg` must be null or point to at least `HEADER` readable bytes, and to
/// `cfg->size` readable bytes when that is larger, as NCCL requires.
pub unsafe fn read(cfg: *const u8) -> CResult<CommConfig> {
    if cfg.is_null() {
        return Ok(CommConfig::default());
    }
    if cfg.align_offset(std::mem::align_of::<usize>()) != 0 {
        return Err(CError::arg("config is not aligned for ncclConfig_t"));
    }
    // SAFETY: the caller passes at least the header, aligned (checked).
    let (size, magic, version) = unsafe {
        (
            std::ptr::read(cfg as *const usize),
            std::ptr::read(cfg.add(8) as *const c_uint),
            std::ptr::read(cfg.add(12) as *const c_uint),
        )
    };
    if magic != MAGIC {
        return Err(CError::arg(format!(
            "config magic is {magic:#x}, not {MAGIC:#x}: initialise it with NCCL_CONFIG_INITIALIZER"
        )));
    }
    if !(HEADER..=MAX_SIZE).contains(&size) {
        return Err(CError::arg(format!(
            "config size {size} is not a size any ncclConfig_t has: initialise it with NCCL_CONFIG_INITIALIZER"
        )));
    }
    let has = |fld: Field, width: usize| fld.offset + width <= size && version >= fld.since;
    let int = |fld: Field| {
        has(fld, 4).then(|| {
            // SAFETY: `has` keeps the read inside the caller's `size` bytes;
            // int offsets are 4-aligned in an 8-aligned struct.
            unsafe { std::ptr::read(cfg.add(fld.offset) as *const c_int) }
        })
    };
    let ptr = |fld: Field| {
        has(fld, 8)
            .then(|| {
                // SAFETY: as above, for pointer fields (8-aligned offsets).
                unsafe { std::ptr::read(cfg.add(fld.offset) as *const *const c_char) }
            })
            .filter(|p| !p.is_null())
    };
    let mut out = CommConfig::default();
    match int(BLOCKING) {
        None | Some(UNDEF_INT) => {}
        Some(0) => out.blocking = Some(false),
        Some(1) => out.blocking = Some(true),
        Some(v) => return Err(CError::arg(format!("config blocking is {v}: use 0 or 1"))),
    }
    if let Some(v) = int(MAX_CTAS).filter(|&v| v != UNDEF_INT) {
        out.max_ctas =
            Some(u32::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| {
                CError::arg(format!("config maxCTAs is {v}: use a positive count"))
            })?);
    }
    for fld in [CGA, MIN_CTAS, SPLIT_SHARE].iter().chain(&LATER_INTS) {
        if let Some(v) = int(*fld).filter(|&v| v != UNDEF_INT && v < 0) {
            return Err(CError::arg(format!("config {} is {v}: negative", fld.name)));
        }
    }
    let _ = ptr(NET_NAME); // the network is chosen by oxccl; the name is not needed
    if let Some(p) = ptr(COMM_NAME) {
        // SAFETY: NCCL's contract: a non-null commName is a C string.
        out.name = Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2.28 layout (80 bytes) as the header's initializer makes it.
    #[repr(C)]
    struct V2228 {
        size: usize,
        magic: c_uint,
        version: c_uint,
        ints: [c_int; 4],
        net: *const c_char,
        split: c_int,
        traffic: c_int,
        name: *const c_char,
        later: [c_int; 6],
    }

    fn init(size: usize, version: c_uint) -> V2228 {
        V2228 {
            size,
            magic: MAGIC,
            version,
            ints: [UNDEF_INT; 4],
            net: std::ptr::null(),
            split: UNDEF_INT,
            traffic: UNDEF_INT,
            name: std::ptr::null(),
            later: [UNDEF_INT; 6],
        }
    }

    fn rd(c: &V2228) -> CResult<CommConfig> {
        // SAFETY: a live, aligned struct of 80 bytes.
        unsafe { read(c as *const V2228 as *const u8) }
    }

    #[test]
    fn layout_is_the_2_28_one() {
        assert_eq!(std::mem::size_of::<V2228>(), 80);
    }

    #[test]
    fn defaults_and_fields_are_read_by_size_and_version() {
        assert_eq!(rd(&init(80, 22809)).unwrap(), CommConfig::default());
        let mut c = init(80, 22809);
        c.ints[0] = 0;
        c.ints[3] = 4;
        c.name = c"pg".as_ptr();
        let got = rd(&c).unwrap();
        assert_eq!(got.blocking, Some(false));
        assert_eq!(got.max_ctas, Some(4));
        assert_eq!(got.name.as_deref(), Some("pg"));
        // A 2.17 caller (48 bytes, older version) never has commName read,
        // even when the bytes there hold something.
        let mut old = init(48, 21700);
        old.name = c"garbage".as_ptr();
        assert_eq!(rd(&old).unwrap().name, None);
        // A 2.27 layout (72 bytes) stops before the 2.28 fields: a bad
        // value there is not read.
        let mut c27 = init(72, 22700);
        c27.later[5] = -5;
        assert!(rd(&c27).is_ok());
        c27.size = 80;
        c27.version = 22800;
        assert!(rd(&c27).is_err());
        // Layouts newer than this library (2.29, 2.30) are read as far as it knows.
        assert!(rd(&init(80, 23007)).is_ok());
    }

    #[test]
    fn bad_configs_are_refused() {
        let mut c = init(80, 22809);
        c.magic = 0;
        assert_eq!(rd(&c).unwrap_err().code, crate::abi::INVALID_ARGUMENT);
        let mut c = init(80, 22809);
        c.ints[0] = 2;
        assert!(rd(&c).unwrap_err().msg.contains("blocking"));
        let mut c = init(80, 22809);
        c.ints[3] = 0;
        assert!(rd(&c).is_err());
        assert!(rd(&init(8, 22809)).is_err());
        assert!(rd(&init(1 << 20, 22809)).is_err());
        assert_eq!(
            // SAFETY: null is allowed.
            unsafe { read(std::ptr::null()) }.unwrap(),
            CommConfig::default()
        );
    }
}
