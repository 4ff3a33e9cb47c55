//! Finding and opening a plugin library, and taking the newest function
//! table it exports that oxccl speaks. Libraries are opened once per
//! process and never closed: comms of every communicator point into them.

use std::ffi::{c_char, CStr};
use std::sync::{Arc, OnceLock};

use libloading::Library;
use parking_lot::Mutex;

use super::abi::{NetV10, NetV11, NetV12, NetV8, NetV9};

/// Newest and oldest table versions oxccl speaks.
pub const NEWEST: u32 = 12;
pub const OLDEST: u32 = 8;

/// A plugin's table, of the version it exports.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Api {
    V8(NetV8),
    V9(NetV9),
    V10(NetV10),
    V11(NetV11),
    V12(NetV12),
}

/// One opened plugin library.
#[derive(Debug)]
pub struct PluginLib {
    /// What was opened (`libnccl-net-ours.so`, a path).
    pub path: String,
    /// The table's version (8 to 12).
    pub version: u32,
    /// The network's name as the plugin gives it (`IB`, `AWS Libfabric`).
    pub name: String,
    pub(crate) api: Api,
    /// Versions 8 to 10 initialise once per process: the outcome, kept.
    pub(crate) once: OnceLock<Result<(), String>>,
    _lib: Library,
}

// SAFETY: the table is function pointers and a name into a library that
// stays loaded for the process's life; NCCL calls plugins from several
// threads (the proxy and the communicator's), as oxccl does.
unsafe impl Send for PluginLib {}
// SAFETY: as above; nothing in it is mutated after loading but `once`,
// which synchronizes itself.
unsafe impl Sync for PluginLib {}

/// Libraries opened so far in this process, by the entry that named them.
type Cache = Mutex<Vec<(String, Arc<PluginLib>)>>;

fn cache() -> &'static Cache {
    static C: OnceLock<Cache> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// The file names an `NCCL_NET_PLUGIN` entry stands for: a path or a
/// library's file name (`/opt/x/libp.so`, `libnccl-net-ofi.so`) as it
/// is; a name `X` as `libnccl-net-X.so`, found on the loader's path.
pub fn candidates(entry: &str) -> Vec<String> {
    if entry.contains('/') || entry.contains(".so") {
        vec![entry.to_string()]
    } else {
        vec![format!("libnccl-net-{entry}.so")]
    }
}

/// Why a library could not be used: (file tried, reason) for each file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    pub tried: Vec<(String, String)>,
    /// Some file was found (but could not be used).
    pub found: bool,
}

impl std::fmt::Display for LoadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .tried
            .iter()
            .map(|(file, why)| format!("{file}: {why}"))
            .collect();
        f.write_str(&parts.join("; "))
    }
}

/// Opens the plugin `entry` names (or takes it from this process's
/// cache) and picks its newest supported table.
pub fn open(entry: &str) -> Result<Arc<PluginLib>, LoadFailure> {
    let mut cache = cache().lock();
    if let Some((_, lib)) = cache.iter().find(|(e, _)| e == entry) {
        return Ok(lib.clone());
    }
    let mut fail = LoadFailure {
        tried: Vec::new(),
        found: false,
    };
    for file in candidates(entry) {
        // SAFETY: opening a library runs its initialisers: loading a
        // plugin is what the user asked for by naming it, as with NCCL.
        let lib = match unsafe { Library::new(&file) } {
            Ok(l) => l,
            Err(e) => {
                fail.tried.push((file, e.to_string()));
                continue;
            }
        };
        fail.found = true;
        match table(&lib) {
            Ok((version, api)) => {
                let name = api_name(&api);
                let lib = Arc::new(PluginLib {
                    path: file,
                    version,
                    name,
                    api,
                    once: OnceLock::new(),
                    _lib: lib,
                });
                cache.push((entry.to_string(), lib.clone()));
                return Ok(lib);
            }
            Err(why) => fail.tried.push((file, why)),
        }
    }
    Err(fail)
}

/// The address of data symbol `name` in `lib`, if exported and not null.
fn symbol<T>(lib: &Library, name: &str) -> Option<*const T> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    // SAFETY: the symbol is read as an address only (a pointer to the
    // table), never called through this type.
    let sym = unsafe { lib.get::<*const T>(&bytes) }.ok()?;
    let p: *const T = *sym;
    (!p.is_null()).then_some(p)
}

/// The newest `ncclNetPlugin_vN` that `lib` exports and oxccl speaks,
/// copied, with its version; or why there is none.
fn table(lib: &Library) -> Result<(u32, Api), String> {
    macro_rules! take {
        ($v:literal, $t:ty, $variant:ident) => {
            if let Some(p) = symbol::<$t>(lib, concat!("ncclNetPlugin_v", $v)) {
                // SAFETY: a plugin exporting this symbol promises a table of
                // this version's layout there, alive while loaded.
                let t = unsafe { p.read() };
                return complete(&Api::$variant(t)).map(|()| ($v, Api::$variant(t)));
            }
        };
    }
    take!(12, NetV12, V12);
    take!(11, NetV11, V11);
    take!(10, NetV10, V10);
    take!(9, NetV9, V9);
    take!(8, NetV8, V8);
    let older: Vec<String> = (2..OLDEST)
        .rev()
        .map(|v| format!("ncclNetPlugin_v{v}"))
        .filter(|s| symbol::<u8>(lib, s).is_some())
        .collect();
    if older.is_empty() {
        Err(format!(
            "exports none of ncclNetPlugin_v{NEWEST} to ncclNetPlugin_v{OLDEST}, the versions oxccl supports"
        ))
    } else {
        Err(format!(
            "exports only {}, older than oxccl supports (v{OLDEST} to v{NEWEST})",
            older.join(", ")
        ))
    }
}

/// Checks that every entry oxccl calls is there.
fn complete(api: &Api) -> Result<(), String> {
    macro_rules! check {
        ($t:expr, $($f:ident),*) => {{
            let mut missing = Vec::new();
            $(if $t.$f.is_none() { missing.push(stringify!($f)); })*
            missing
        }};
    }
    macro_rules! all {
        ($t:expr) => {
            check!(
                $t,
                init,
                devices,
                get_properties,
                listen,
                connect,
                accept,
                reg_mr,
                dereg_mr,
                isend,
                irecv,
                test,
                close_send,
                close_recv,
                close_listen
            )
        };
    }
    let missing = match api {
        Api::V8(t) => all!(t),
        Api::V9(t) => all!(t),
        Api::V10(t) => all!(t),
        Api::V11(t) => all!(t),
        Api::V12(t) => all!(t),
    };
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("its table has no {}", missing.join(", ")))
    }
}

/// The table's `name`, or a stand-in where it has none.
fn api_name(api: &Api) -> String {
    let p: *const c_char = match api {
        Api::V8(t) => t.name,
        Api::V9(t) => t.name,
        Api::V10(t) => t.name,
        Api::V11(t) => t.name,
        Api::V12(t) => t.name,
    };
    if p.is_null() {
        return "unnamed".into();
    }
    // SAFETY: a non-null `name` is a NUL-terminated string in the loaded
    // library, which is never unloaded.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_name_files_as_nccl_does() {
        assert_eq!(candidates("ofi"), vec!["libnccl-net-ofi.so"]);
        assert_eq!(candidates("/opt/x/libp.so"), vec!["/opt/x/libp.so"]);
        assert_eq!(candidates("libnccl-net-aws.so"), vec!["libnccl-net-aws.so"]);
    }

    #[test]
    fn a_missing_library_says_what_was_tried() {
        let e = open("surely-not-installed-here").unwrap_err();
        assert!(!e.found);
        assert!(e
            .to_string()
            .contains("libnccl-net-surely-not-installed-here.so"));
    }
}
