//! No comment, doc or script may send its reader outside the repository:
//! no tracker numbers (the word for a tracker's entry followed by a number,
//! singular or plural, with or without `#`) and no
//! run letters (`run Q`, `Run S's binary`, `runs B and C`). A measurement
//! is named by where it lives and when: "docs/perf/LOG.md, 2026-12-06 06:19
//! H100". `docs/perf/LOG.md` is held to the same rule: its runs are named
//! by date, start time and GPU.
//!
//! The run-letter rule is `run` or `runs`, in either case of its first
//! letter, then one space and a single capital letter that ends the word
//! (`run Q`, `run Q's`, `Runs P and Q`). What it does not catch: a
//! letter after two spaces or a line break, and lower-case letters (`run a
//! sweep` is prose); what it does catch that is not a reference (`run N
//! ranks`, N a placeholder) is rare enough to rephrase (`run n ranks`).
//! Every text file of the repository is read but build output, the VCS and
//! this file (whose self-tests must show violations).

use std::path::Path;

/// Extensions of the files read: code, scripts, docs and data with prose.
const TEXT: &[&str] = &[
    "rs", "md", "sh", "py", "toml", "cu", "cuh", "c", "h", "json", "txt", "yml", "yaml",
];

/// Folders never read (build output, VCS, the device's carried binaries).
const SKIP_DIRS: &[&str] = &["target", ".git", ".gpu", "node_modules"];

/// The one file exempt: this rule's own self-tests quote violations.
const SELF: &str = "xtask/src/tidy/refs.rs";

/// Where `line` refers to an issue number or a run letter: the offending
/// words, in order.
pub fn line_violations(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = line.as_bytes();
    let lower = line.to_ascii_lowercase();
    let lb = lower.as_bytes();
    let word_start = |i: usize| i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    let mut i = 0;
    while i < b.len() {
        if word_start(i) {
            if let Some(end) = issue_at(lb, i) {
                out.push(line[i..end].to_string());
                i = end;
                continue;
            }
            if let Some(end) = run_at(b, lb, i) {
                out.push(line[i..end].to_string());
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// `issue N`, `issues N`, `issue #N` at `i` (lower-cased `lb`): its end.
fn issue_at(lb: &[u8], i: usize) -> Option<usize> {
    let mut j = i + lb.get(i..)?.starts_with(b"issue").then_some(5)?;
    if lb.get(j) == Some(&b's') {
        j += 1;
    }
    let spaces = lb[j..].iter().take_while(|c| **c == b' ').count();
    if spaces == 0 {
        return None;
    }
    j += spaces;
    if lb.get(j) == Some(&b'#') {
        j += 1;
    }
    let digits = lb[j..].iter().take_while(|c| c.is_ascii_digit()).count();
    (digits > 0).then_some(j + digits)
}

/// `run X`, `Run X`, `runs X` at `i`, X one capital letter ending a word.
fn run_at(b: &[u8], lb: &[u8], i: usize) -> Option<usize> {
    let mut j = i + lb.get(i..)?.starts_with(b"run").then_some(3)?;
    if !(b[i] == b'r' || b[i] == b'R') || b[i + 1..j] != *b"un" {
        return None;
    }
    if lb.get(j) == Some(&b's') {
        j += 1;
    }
    if b.get(j) != Some(&b' ') {
        return None;
    }
    let letter = *b.get(j + 1)?;
    let after = b.get(j + 2).copied();
    let ends =
        after.is_none_or(|c| !(c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'/')));
    (letter.is_ascii_uppercase() && ends).then_some(j + 2)
}

/// Every violation in `text`, as `file:line: words: the line`.
pub fn violations(file: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let found = line_violations(line);
        if !found.is_empty() {
            let line = line.trim();
            let line = line.get(..120).unwrap_or(line);
            out.push(format!("{file}:{}: {}: {line}", n + 1, found.join(", ")));
        }
    }
    out
}

/// The rule over every text file under `root`.
pub fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                if !SKIP_DIRS.contains(&name) {
                    dirs.push(p);
                }
                continue;
            }
            let rel = p.strip_prefix(root).unwrap_or(&p);
            let rel = rel.to_string_lossy().replace('\\', "/");
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
            if rel == SELF || !(TEXT.contains(&ext) || ext.is_empty() && is_script(&p)) {
                continue;
            }
            // Binary or non-UTF-8 files are not prose.
            if let Ok(text) = std::fs::read_to_string(&p) {
                out.extend(violations(&rel, &text));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// An extensionless file that starts with `#!` (`.ci/run`).
fn is_script(p: &Path) -> bool {
    std::fs::read(p).is_ok_and(|b| b.starts_with(b"#!"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_numbers_and_run_letters_are_caught() {
        // Built at run time, so this file names no entry of a tracker.
        let (i, ic) = ("issue", "Issue");
        assert_eq!(
            line_violations(&format!("// see {i} 16's figures")),
            [format!("{i} 16")]
        );
        assert_eq!(
            line_violations(&format!("# ({ic}s 10, 11) and {i} #3")),
            [format!("{ic}s 10"), format!("{i} #3")]
        );
        assert_eq!(line_violations("/// measured in run Q (call C)"), ["run Q"]);
        assert_eq!(
            line_violations("Run S's binary; runs B and C"),
            ["Run S", "runs B"]
        );
        assert_eq!(line_violations("(run W)"), ["run W"]);
        let v = violations("a.rs", &format!("fine\n// {i} 33\n"));
        assert_eq!(v.len(), 1);
        assert!(v[0].starts_with(&format!("a.rs:2: {i} 33")), "{}", v[0]);
    }

    #[test]
    fn prose_that_only_looks_alike_passes() {
        let tissue = format!("t{} 4, misissue, issues remain, issue tracker", "issue");
        for ok in [
            "run a sweep, then run `cargo xtask sweep`",
            "the 2026-12-04 17:10 H200 run, call 10 (docs/perf/LOG.md)",
            "rerun X-axis; prune Q; run-time; runs: 5; run ABC",
            tissue.as_str(),
            "fn run(a: SweepArgs); run_on(a); run I/O? no: run I-O",
        ] {
            assert!(
                line_violations(ok).is_empty(),
                "{ok}: {:?}",
                line_violations(ok)
            );
        }
    }

    #[test]
    fn the_repository_names_no_issue_or_run_letter() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let v = check(&root).unwrap();
        assert!(v.is_empty(), "{}", v.join("\n"));
    }
}
