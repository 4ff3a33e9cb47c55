//! `cargo xtask tidy`: checks that no crate depends against the arrows of
//! DESIGN.md (dependencies point down only).
//!
//! xtask may also use oxccl-topo (for `topo`/`simulate`) and oxccl-core
//! (shared types); both sit below oxccl, so no cycle can form.

use std::path::Path;

use anyhow::{bail, Context};

/// Which workspace crates each crate may depend on.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("oxccl-core", &[]),
    ("oxccl-topo", &["oxccl-core"]),
    ("oxccl-bootstrap", &["oxccl-core"]),
    ("oxccl-host", &["oxccl-core"]),
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
    ("xtask", &["oxccl", "oxccl-topo", "oxccl-core"]),
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
            "crate {name} is not in DESIGN.md's table; add it to xtask/src/tidy.rs"
        )];
    };
    internal_deps(manifest)
        .into_iter()
        .filter(|d| !allowed.contains(&d.as_str()))
        .map(|d| {
            format!("{name} depends on {d}, against DESIGN.md's arrows (allowed: {allowed:?})")
        })
        .collect()
}

/// Checks every crate of the workspace rooted at `root`.
pub fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut manifests = vec![root.join("xtask/Cargo.toml")];
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

pub fn run() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let v = check(&root)?;
    if !v.is_empty() {
        bail!("dependency arrows broken:\n{}", v.join("\n"));
    }
    println!("tidy: crate dependency arrows OK");
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
