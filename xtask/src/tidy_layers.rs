//! Tidy rule: the files of each crate form layers. A file that names
//! another file's items (`use crate::…`, `use super::…`, or a `crate::…`
//! path in code) depends on it; no two files may depend on each other,
//! directly or around a circle. The crate root (`lib.rs`) is not followed:
//! its re-exports are the crate's public face, not a layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;

/// A module path inside a crate (`["backend", "cuda"]`; the root is empty).
type ModPath = Vec<String>;

/// The module a file under `src/` defines: `a/b.rs` and `a/b/mod.rs` are
/// `a::b`; `lib.rs` and `main.rs` are the root.
pub fn module_of(rel: &str) -> ModPath {
    let rel = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("lib" | "main" | "mod")
    ) {
        parts.pop();
    }
    parts
}

/// `text` without comments and string literals (their contents could look
/// like paths).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' && (i == 0 || b[i - 1] != b'\'') {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The paths a `use` tree names: `crate::{a, b::{c, d}}` gives
/// `crate::a`, `crate::b::c`, `crate::b::d`.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn split_top(s: &str) -> Vec<&str> {
        let (mut depth, mut start, mut out) = (0, 0, Vec::new());
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(&s[start..]);
        out
    }
    fn rec(prefix: &[String], s: &str, out: &mut Vec<Vec<String>>) {
        for part in split_top(s).into_iter().filter(|p| !p.is_empty()) {
            match (part.find('{'), part.rfind('}')) {
                (Some(i), Some(j)) if j > i => {
                    let mut p = prefix.to_vec();
                    p.extend(
                        part[..i]
                            .split("::")
                            .filter(|x| !x.is_empty())
                            .map(String::from),
                    );
                    rec(&p, &part[i + 1..j], out);
                }
                _ => {
                    let name = part.split(" as ").next().unwrap_or(part);
                    let mut p = prefix.to_vec();
                    p.extend(name.split("::").filter(|x| !x.is_empty()).map(String::from));
                    out.push(p);
                }
            }
        }
    }
    let squeezed: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let squeezed = squeezed
        .replace(" ::", "::")
        .replace(":: ", "::")
        .replace(", ", ",");
    let squeezed = squeezed.replace("{ ", "{").replace(" }", "}");
    let mut out = Vec::new();
    rec(&[], &squeezed, &mut out);
    out
}

/// Each path the code of one file names, with the module it is named
/// from (the file's, or an inline `mod x { … }` inside it).
fn named_paths(file_mod: &ModPath, text: &str) -> Vec<(ModPath, Vec<String>)> {
    let code = code_only(text);
    let mut out = Vec::new();
    // Inline modules: (name, brace depth outside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let here = |inline: &[(String, usize)]| {
        let mut m = file_mod.clone();
        m.extend(inline.iter().map(|(n, _)| n.clone()));
        m
    };
    // A `use` tree spans several pieces (its braces); gathered whole.
    let mut pending_use: Option<String> = None;
    for stmt in code.split_inclusive([';', '{', '}']) {
        let t = stmt.trim();
        let starts_use = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .any(|p| t.starts_with(p));
        if pending_use.is_some() || starts_use {
            let u = pending_use.get_or_insert_with(String::new);
            u.push_str(stmt);
            if t.ends_with(';') {
                let u = pending_use.take().unwrap_or_default();
                let from = here(&inline);
                out.extend(paths_in(&u).into_iter().map(|p| (from.clone(), p)));
            }
            continue;
        }
        if t.ends_with('{') {
            let head = t.trim_end_matches('{').trim();
            let words: Vec<&str> = head.split_whitespace().collect();
            if let Some(pos) = words.iter().position(|w| *w == "mod") {
                if pos + 2 == words.len() {
                    inline.push((words[pos + 1].to_string(), depth));
                }
            }
            depth += 1;
        } else if t.ends_with('}') {
            depth = depth.saturating_sub(1);
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
        }
        let from = here(&inline);
        out.extend(paths_in(stmt).into_iter().map(|p| (from.clone(), p)));
    }
    out
}

/// The `crate::`/`super::`/`self::` paths in a piece of code, `use` trees
/// expanded.
fn paths_in(piece: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let t = piece.trim();
    let tree = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
        .iter()
        .find_map(|p| t.strip_prefix(p));
    if let Some(tree) = tree {
        let tree = tree.trim_end_matches(';');
        out.extend(expand_use(tree).into_iter().filter(|p| {
            matches!(
                p.first().map(String::as_str),
                Some("crate" | "super" | "self")
            )
        }));
        return out;
    }
    let b = t.as_bytes();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = t[from..].find(start).map(|i| i + from) {
            from = i + start.len();
            let before = if i == 0 { b' ' } else { b[i - 1] };
            if before.is_ascii_alphanumeric() || before == b'_' || before == b':' {
                continue;
            }
            let end = t[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(t.len(), |e| e + i);
            out.push(
                t[i..end]
                    .split("::")
                    .filter(|x| !x.is_empty())
                    .map(String::from)
                    .collect(),
            );
        }
    }
    out
}

/// The file a path named from module `from` lands in: the longest prefix
/// of the resolved path that is a file's module; `None` for the crate
/// root or the file itself.
fn resolve(
    files: &BTreeSet<ModPath>,
    own: &ModPath,
    from: &ModPath,
    path: &[String],
) -> Option<ModPath> {
    let mut base: ModPath;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            base = from.clone();
            rest = &path[1..];
        }
        Some("super") => {
            base = from.clone();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    (0..=base.len())
        .rev()
        .map(|k| base[..k].to_vec())
        .find(|m| files.contains(m))
        .filter(|m| !m.is_empty() && m != own)
}

/// The dependency graph of one crate's files: module → modules it names.
pub fn graph(files: &BTreeMap<ModPath, String>) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mods: BTreeSet<ModPath> = files.keys().cloned().collect();
    let mut g = BTreeMap::new();
    for (m, text) in files {
        let deps: BTreeSet<ModPath> = named_paths(m, text)
            .into_iter()
            .filter_map(|(from, p)| resolve(&mods, m, &from, &p))
            .collect();
        g.insert(m.clone(), deps);
    }
    g
}

/// The circles of `g`: its strongly connected components of two or more
/// files (Tarjan), each sorted.
pub fn circles(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct T<'a> {
        g: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a ModPath) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let Some((w, _)) = g.get_key_value(w) else {
                continue;
            };
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

fn read_src(src: &Path, dir: &Path, out: &mut BTreeMap<ModPath, String>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            read_src(src, &p, out)?;
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p
                .strip_prefix(src)
                .unwrap_or(&p)
                .to_string_lossy()
                .replace('\\', "/");
            // `src/bin/*.rs` are crates of their own.
            if rel.starts_with("bin/") {
                continue;
            }
            out.insert(module_of(&rel), std::fs::read_to_string(&p)?);
        }
    }
    Ok(())
}

fn show(m: &ModPath) -> String {
    format!("{}.rs", m.join("/"))
}

/// Circles not broken yet, as `crate: file, file, …` (the message's
/// form). Tidy fails on any circle not listed here, and on a listed one
/// that is gone (so the list only shrinks).
///
/// The one left: `handle.rs` reads a device PreMulSum scalar through
/// `exec.rs`, which goes once the kernel reads that scalar itself.
pub const NOT_YET_BROKEN: &[&str] = &[];

/// Every circle under `root/crates` that [`NOT_YET_BROKEN`] does not
/// list, and every listed one that no longer exists.
pub fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let found = circles_of(root)?;
    let mut out: Vec<String> = found
        .iter()
        .filter(|c| !NOT_YET_BROKEN.contains(&c.as_str()))
        .map(|c| {
            let (krate, files) = c.split_once(": ").unwrap_or(("?", c));
            format!("{krate}: files that import each other (directly or around a circle): {files}")
        })
        .collect();
    out.extend(
        NOT_YET_BROKEN
            .iter()
            .filter(|k| !found.iter().any(|c| c == *k))
            .map(|k| {
                format!(
                    "{k}: broken now; remove it from NOT_YET_BROKEN in xtask/src/tidy_layers.rs"
                )
            }),
    );
    Ok(out)
}

/// Each crate's circles under `root/crates`, as `crate: file, file, …`.
pub fn circles_of(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root.join("crates")).context("reading crates/")? {
        let dir = e?.path();
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = BTreeMap::new();
        read_src(&src, &src, &mut files)?;
        for c in circles(&graph(&files)) {
            out.push(format!(
                "{}: {}",
                dir.file_name().unwrap_or_default().to_string_lossy(),
                c.iter().map(show).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> BTreeMap<ModPath, String> {
        pairs
            .iter()
            .map(|(p, t)| (module_of(p), t.to_string()))
            .collect()
    }

    fn m(s: &str) -> ModPath {
        s.split("::").map(String::from).collect()
    }

    #[test]
    fn the_crates_form_layers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let v = check(&root).unwrap();
        assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn paths_and_use_trees_are_read() {
        let f = files(&[
            ("lib.rs", "mod a; mod b; pub use a::A;"),
            ("a.rs", "use crate::{b::{B, C}, c as d};\nfn f() { crate::e::g(); }\n// crate::f::h\nconst S: &str = \"crate::f\";"),
            ("b.rs", ""),
            ("c.rs", ""),
            ("e/mod.rs", ""),
            ("f.rs", ""),
        ]);
        let g = graph(&f);
        let want: BTreeSet<ModPath> = [m("b"), m("c"), m("e")].into_iter().collect();
        assert_eq!(g[&m("a")], want);
        // The root's re-exports are not followed.
        assert!(g[&Vec::new()].is_empty());
    }

    #[test]
    fn a_circle_is_caught_and_layers_pass() {
        let circle = files(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "use crate::b::B;"),
            ("b.rs", "pub fn f() { crate::c::g() }"),
            ("c/mod.rs", "mod d;\nuse super::a::A;"),
            ("c/d.rs", "use super::super::b::X;"),
        ]);
        assert_eq!(circles(&graph(&circle)), vec![vec![m("a"), m("b"), m("c")]]);
        let pair = files(&[("x.rs", "use super::y::Y;"), ("y.rs", "use crate::x;")]);
        assert_eq!(circles(&graph(&pair)).len(), 1);
        let layers = files(&[
            ("lib.rs", "pub use a::A; pub use b::B;"),
            ("a.rs", "use crate::b::B; use crate::B as C;"),
            ("b.rs", "#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"),
        ]);
        assert!(circles(&graph(&layers)).is_empty());
    }

    #[test]
    fn super_inside_an_inline_module_names_the_file() {
        // `tests` inside `c/d.rs`: `super` is `c::d`, not `c`.
        let f = files(&[
            ("c/mod.rs", "mod d;\npub use d::D;"),
            ("c/d.rs", "pub struct D;\n#[cfg(test)]\nmod tests {\n    use super::D;\n    fn f() { let _ = super::D; }\n}\n"),
        ]);
        assert!(graph(&f)[&m("c::d")].is_empty());
        assert!(circles(&graph(&f)).is_empty());
    }
}
