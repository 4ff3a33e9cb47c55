//! `cargo xtask tidy`: checks that no crate depends against the arrows of
//! `docs/ARCHITECTURE.md`'s crate table (dependencies point down only),
//! that no comment, doc or script refers to an issue number or a run
//! letter (`refs`), and that the host/device
//! layout has one source: no kernel file defines a record or constant that
//! `crates/oxccl-cuda/src/layout.rs` generates, and its layout test stays;
//! that no Rust function is longer than a reader can hold (`fn_len`).
//!
//! xtask may also use oxccl-topo (for `topo`/`simulate`) and oxccl-core
//! (shared types); both sit below oxccl, so no cycle can form.

use std::path::Path;

use anyhow::{bail, Context};

mod fn_len;
mod refs;

/// Which workspace crates each crate may depend on.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("oxccl-core", &[]),
    ("oxccl-topo", &["oxccl-core"]),
    ("oxccl-bootstrap", &["oxccl-core"]),
    ("oxccl-net", &["oxccl-core", "oxccl-bootstrap"]),
    // The host backend carries FIFO messages between hosts over oxccl-net.
    (
        "oxccl-host",
        &["oxccl-core", "oxccl-bootstrap", "oxccl-net"],
    ),
    ("oxccl-cuda", &["oxccl-core", "oxccl-topo"]),
    (
        "oxccl",
        &[
            "oxccl-core",
            "oxccl-topo",
            "oxccl-bootstrap",
            "oxccl-host",
            "oxccl-cuda",
        ],
    ),
    ("oxccl-capi", &["oxccl"]),
    // Fuzz targets: the decoders of every crate that reads peers' bytes.
    (
        "oxccl-fuzz",
        &["oxccl", "oxccl-host", "oxccl-net", "oxccl-bootstrap"],
    ),
    // Measures the facade and, below it, the CUDA backend's launch alone.
    ("oxccl-bench", &["oxccl", "oxccl-cuda", "oxccl-core"]),
    (
        "xtask",
        &["oxccl", "oxccl-bench", "oxccl-topo", "oxccl-core"],
    ),
    // The criterion benchmarks time the CPU paths of the crates below.
    (
        "oxccl-benches",
        &["oxccl", "oxccl-core", "oxccl-topo", "oxccl-host"],
    ),
];

/// Workspace crates a manifest depends on (any dependency table).
pub fn internal_deps(manifest: &str) -> Vec<String> {
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line.contains("dependencies");
            // `[dependencies.oxccl-core]` form.
            if let Some(name) = line.trim_matches(['[', ']']).split('.').nth(1) {
                if in_deps && is_internal(name) {
                    deps.push(name.to_string());
                }
            }
            continue;
        }
        if !in_deps {
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or("").trim();
        if is_internal(name) {
            deps.push(name.to_string());
        }
    }
    deps.sort();
    deps.dedup();
    deps
}

fn is_internal(name: &str) -> bool {
    name == "oxccl" || name.starts_with("oxccl-")
}

/// Violations of the arrows for crate `name` with `manifest`.
pub fn violations(name: &str, manifest: &str) -> Vec<String> {
    let allowed = ALLOWED.iter().find(|(n, _)| *n == name).map(|(_, a)| *a);
    let Some(allowed) = allowed else {
        return vec![format!(
            "crate {name} is not in docs/ARCHITECTURE.md's table; add it there and to xtask/src/tidy.rs"
        )];
    };
    internal_deps(manifest)
        .into_iter()
        .filter(|d| !allowed.contains(&d.as_str()))
        .map(|d| {
            format!("{name} depends on {d}, against docs/ARCHITECTURE.md's arrows (allowed: {allowed:?})")
        })
        .collect()
}

/// Checks every crate of the workspace rooted at `root`.
pub fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut manifests = vec![
        root.join("xtask/Cargo.toml"),
        root.join("benches/Cargo.toml"),
    ];
    for e in std::fs::read_dir(root.join("crates")).context("reading crates/")? {
        let p = e?.path().join("Cargo.toml");
        if p.exists() {
            manifests.push(p);
        }
    }
    let mut out = Vec::new();
    for m in manifests {
        let text =
            std::fs::read_to_string(&m).with_context(|| format!("reading {}", m.display()))?;
        let name = text
            .lines()
            .find_map(|l| {
                l.trim().strip_prefix("name").map(|r| {
                    r.trim_start_matches([' ', '='])
                        .trim_matches('"')
                        .to_string()
                })
            })
            .with_context(|| format!("{}: no package name", m.display()))?;
        out.extend(violations(&name, &text));
    }
    Ok(out)
}

/// The layout's source and the test that compares both sides.
const LAYOUT: &str = "crates/oxccl-cuda/src/layout.rs";
const LAYOUT_TEST: &str = "fn every_record_has_the_same_layout_on_both_sides";

/// Names `layout.rs` generates: its constants' C names and its records.
pub fn generated_names(layout: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in layout.lines().map(str::trim) {
        // `("OX_MAX_BUFS", MAX_BUFS as u64, "…"),`
        if let Some(rest) = line.strip_prefix("(\"") {
            if let Some((name, _)) = rest.split_once('"') {
                if name.starts_with("OX") {
                    names.push(name.to_string());
                }
            }
        }
        // `OxDesc {` inside a `device_record!`.
        if let Some(name) = line.strip_suffix(" {") {
            if name.starts_with("Ox") && name.chars().all(char::is_alphanumeric) {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// Definitions in a kernel file of names the layout generates.
pub fn layout_violations(file: &str, text: &str, generated: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        let defined = line
            .strip_prefix("#define ")
            .or_else(|| line.strip_prefix("struct "))
            .and_then(|r| r.split([' ', '{', '(']).next());
        if let Some(name) = defined {
            if generated.iter().any(|g| g == name) {
                out.push(format!(
                    "{file} defines {name}, which {LAYOUT} generates: define it there only"
                ));
            }
        }
    }
    out
}

/// The layout checks over the tree rooted at `root`.
pub fn check_layout(root: &Path) -> anyhow::Result<Vec<String>> {
    let layout = std::fs::read_to_string(root.join(LAYOUT)).context("reading the layout")?;
    let generated = generated_names(&layout);
    let mut out = Vec::new();
    if generated.len() < 10 || !layout.contains(LAYOUT_TEST) {
        out.push(format!(
            "{LAYOUT}: its records, constants or its test `{LAYOUT_TEST}` are gone"
        ));
    }
    for e in std::fs::read_dir(root.join("kernels")).context("reading kernels/")? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "cuh" || x == "cu") {
            let text = std::fs::read_to_string(&p)?;
            out.extend(layout_violations(
                &p.display().to_string(),
                &text,
                &generated,
            ));
        }
    }
    Ok(out)
}

/// The map of the code: at most this many lines.
const MAP: &str = "docs/ARCHITECTURE.md";
const MAP_LINES: usize = 300;

/// What keeps `docs/ARCHITECTURE.md` a map rather than a log: its length,
/// and no dates or commit hashes (figures and history live in
/// `docs/PERFORMANCE.md` and `docs/perf/LOG.md`).
pub fn map_violations(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    let lines = text.lines().count();
    if lines > MAP_LINES {
        v.push(format!("{MAP}: {lines} lines, at most {MAP_LINES}"));
    }
    for (i, line) in text.lines().enumerate() {
        let b = line.as_bytes();
        let is_date = |w: &[u8]| {
            w.len() == 10
                && w.iter().enumerate().all(|(k, c)| {
                    if k == 4 || k == 7 {
                        *c == b'-'
                    } else {
                        c.is_ascii_digit()
                    }
                })
        };
        if b.windows(10).any(is_date) {
            v.push(format!("{MAP}:{}: a date: {line}", i + 1));
        }
        let hash = line.split(|c: char| !c.is_ascii_alphanumeric()).find(|w| {
            (7..=40).contains(&w.len())
                && w.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                && w.chars().any(|c| c.is_ascii_digit())
                && w.chars().any(|c| c.is_ascii_alphabetic())
        });
        if let Some(h) = hash {
            v.push(format!("{MAP}:{}: a commit hash? `{h}`", i + 1));
        }
    }
    v
}

/// The workspace root.
pub fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn run() -> anyhow::Result<()> {
    let root = root();
    let map = std::fs::read_to_string(root.join(MAP)).with_context(|| format!("reading {MAP}"))?;
    let v = map_violations(&map);
    if !v.is_empty() {
        bail!("the architecture map grew a log:\n{}", v.join("\n"));
    }
    println!("tidy: {MAP} is a map ({} lines)", map.lines().count());
    let v = refs::check(&root)?;
    if !v.is_empty() {
        bail!(
            "references outside the repository (name a measurement by where it lives and when, e.g. \"docs/perf/LOG.md, 2026-12-06 H100\"):\n{}",
            v.join("\n")
        );
    }
    println!("tidy: no issue numbers or run letters");
    let v = check_layout(&root)?;
    if !v.is_empty() {
        bail!("host/device layout defined twice:\n{}", v.join("\n"));
    }
    println!("tidy: host/device layout defined once");
    let v = check(&root)?;
    if !v.is_empty() {
        bail!("dependency arrows broken:\n{}", v.join("\n"));
    }
    println!("tidy: crate dependency arrows OK");
    let v = crate::tidy_settings::check(&root)?;
    if !v.is_empty() {
        bail!("settings rules broken:\n{}", v.join("\n"));
    }
    println!("tidy: only the settings module reads the environment; the README's table is current");
    let v = crate::tidy_layers::check(&root)?;
    if !v.is_empty() {
        bail!("files of a crate import each other:\n{}", v.join("\n"));
    }
    let v = fn_len::check(&root)?;
    if !v.is_empty() {
        bail!(
            "functions longer than {} lines (split them by job):\n{}",
            fn_len::MAX_FN_LINES,
            v.join("\n")
        );
    }
    println!("tidy: no function over {} lines", fn_len::MAX_FN_LINES);
    let left = crate::tidy_layers::NOT_YET_BROKEN.len();
    println!(
        "tidy: the files of each crate form layers ({left} circle{} left to break)",
        if left == 1 { "" } else { "s" }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_follows_the_arrows() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let v = check(&root).unwrap();
        assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn the_map_stays_a_map_and_a_log_is_caught() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let map = std::fs::read_to_string(root.join(MAP)).unwrap();
        let v = map_violations(&map);
        assert!(v.is_empty(), "{}", v.join("\n"));
        assert_eq!(map_violations("measured 2026-12-04 at 6901d29\n").len(), 2);
        assert!(map_violations("a decade, defaced; sm_90, 8 ranks, deadbeef\n").is_empty());
        assert_eq!(map_violations(&"x\n".repeat(MAP_LINES + 1)).len(), 1);
    }

    #[test]
    fn kernels_define_no_layout_twice() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let v = check_layout(&root).unwrap();
        assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn a_layout_defined_in_a_kernel_is_caught() {
        let layout = "    (\"OX_MAX_BUFS\", MAX_BUFS as u64, \"x\"),\n    OxStep {\n";
        let g = generated_names(layout);
        assert_eq!(g, ["OX_MAX_BUFS", "OxStep"]);
        let cuh = "#define OX_MAX_BUFS 64\nstruct OxStep {\n#define OX_STAGE_OPS 512\n";
        assert_eq!(layout_violations("k.cuh", cuh, &g).len(), 2);
        assert!(layout_violations("k.cuh", "#define OX_UNROLL 4\n", &g).is_empty());
    }

    #[test]
    fn an_upward_dependency_is_caught() {
        let m = "[package]\nname = \"oxccl-core\"\n[dependencies]\noxccl-host.workspace = true\nthiserror = \"2\"\n";
        assert_eq!(violations("oxccl-core", m).len(), 1);
        let m = "[package]\nname = \"oxccl-host\"\n[dependencies.oxccl-cuda]\npath = \"x\"\n";
        assert_eq!(violations("oxccl-host", m).len(), 1);
        let m = "[package]\nname = \"oxccl-topo\"\n[dev-dependencies]\noxccl = { path = \"..\" }\n";
        assert_eq!(violations("oxccl-topo", m).len(), 1);
        let ok = "[package]\nname = \"oxccl-cuda\"\n[dependencies]\noxccl-core.workspace = true\noxccl-topo.workspace = true\n";
        assert!(violations("oxccl-cuda", ok).is_empty());
    }
}
