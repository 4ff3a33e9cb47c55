//! The cdylib answers to NCCL's soname, so a program linked against
//! `libnccl.so.2` (PyTorch) loads it; cargo has no soname option.
//! The target triple is passed on for the tests that compile C with `cc`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    for var in ["TARGET", "HOST"] {
        if let Ok(v) = std::env::var(var) {
            println!("cargo:rustc-env=OXCCL_CAPI_{var}={v}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
