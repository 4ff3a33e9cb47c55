//! Compiles the plugin logger's C half (`csrc/plugin_log.c`): NCCL hands a
//! net plugin a C-variadic logging function, which stable Rust cannot
//! define, so a few lines of C format the message and pass it to Rust.
fn main() {
    println!("cargo:rerun-if-changed=csrc/plugin_log.c");
    println!("cargo:rerun-if-changed=build.rs");
    cc::Build::new()
        .file("csrc/plugin_log.c")
        .warnings(true)
        .compile("oxccl_net_plugin_log");
}
