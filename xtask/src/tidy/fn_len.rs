//! No Rust function longer than [`MAX_FN_LINES`] lines, from its `fn` line
//! to its closing brace: a function a reader can hold. Kernels (CUDA) and
//! generated code are not Rust sources here, so they are not read.
//!
//! The scan is lexical: it strips comments, string, byte-string, raw-string
//! and character literals (telling a lifetime `'a` from a char `'a'`), then
//! matches braces from each `fn` item's first `{`. A declaration without a
//! body (`fn f();` in a trait or an `extern` block) is not a function here.

use std::path::Path;

/// The longest a function may be, in lines.
pub const MAX_FN_LINES: usize = 150;

/// `text` with comments and literals blanked (newlines kept, so line
/// numbers hold): only code braces remain.
pub fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    // Keeps newlines of a skipped span so that line numbers survive.
    let blank = |out: &mut Vec<u8>, span: &[u8]| {
        out.extend(span.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }));
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            // Block comments nest in Rust.
            let (mut depth, mut j) = (0usize, 0);
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &rest[..j]);
            i += j;
        } else if let Some(len) = raw_string_len(rest, i == 0 || !ident(b[i - 1])) {
            blank(&mut out, &rest[..len]);
            i += len;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let len = (j + 1).min(rest.len());
            blank(&mut out, &rest[..len]);
            i += len;
        } else if rest[0] == b'\'' {
            let len = char_literal_len(rest);
            blank(&mut out, &rest[..len]);
            i += len;
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The length of a raw (byte) string literal starting at `s`, if one does:
/// `r"…"`, `r#"…"#`, `br##"…"##`. `word_start`: no identifier character
/// before `s` (so `for"` or `bar#` is not one).
fn raw_string_len(s: &[u8], word_start: bool) -> Option<usize> {
    if !word_start {
        return None;
    }
    let mut j = usize::from(s.first() == Some(&b'b'));
    if s.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = s[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if s.get(j) != Some(&b'"') {
        return None;
    }
    j += 1;
    let close: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let end = s[j..]
        .windows(close.len())
        .position(|w| w == close.as_slice());
    Some(end.map_or(s.len(), |e| j + e + close.len()))
}

/// The length of the character literal at `s` (`'a'`, `'\n'`, `'\u{1F600}'`,
/// `'{'`), or 1 for a lifetime's or label's quote (`'a`, `'static`).
fn char_literal_len(s: &[u8]) -> usize {
    if s.get(1) == Some(&b'\\') {
        // An escape: up to the closing quote.
        return s[2..]
            .iter()
            .position(|&c| c == b'\'')
            .map_or(s.len(), |p| p + 3);
    }
    // One character (possibly several UTF-8 bytes), then a quote.
    let ch_len = std::str::from_utf8(&s[1..s.len().min(5)])
        .ok()
        .or_else(|| {
            (2..=5)
                .rev()
                .find_map(|n| std::str::from_utf8(s.get(1..n)?).ok())
        })
        .and_then(|t| t.chars().next())
        .map_or(1, char::len_utf8);
    if s.get(1 + ch_len) == Some(&b'\'') {
        2 + ch_len
    } else {
        1
    }
}

/// Functions of `text` longer than `max` lines: `(first line, lines, name)`.
pub fn long_functions(text: &str, max: usize) -> Vec<(usize, usize, String)> {
    let code = code_only(text);
    let b = code.as_bytes();
    let line_at = |i: usize| b[..i].iter().filter(|&&c| c == b'\n').count() + 1;
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = code[i..].find("fn ") {
        let at = i + p;
        i = at + 3;
        if at > 0 && ident(b[at - 1]) {
            continue;
        }
        let name: String = code[at + 3..]
            .trim_start()
            .chars()
            .take_while(|&c| c.is_alphanumeric() || c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body's `{`, unless a `;` ends a bodiless declaration first.
        let Some(open) = code[at..].find(['{', ';']).map(|o| at + o) else {
            break;
        };
        if b[open] == b';' {
            continue;
        }
        let mut depth = 0usize;
        let mut close = None;
        for (k, &c) in b.iter().enumerate().skip(open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { break };
        let (first, last) = (line_at(at), line_at(close));
        if last - first + 1 > max {
            out.push((first, last - first + 1, name));
        }
    }
    out
}

/// Every function of the workspace's Rust files longer than
/// [`MAX_FN_LINES`], as `path:line: fn name is N lines`.
pub fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    crate::tidy_settings::rust_files(root, &mut files)?;
    let mut out = Vec::new();
    for p in files {
        let text = std::fs::read_to_string(&p)?;
        let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
        for (line, n, f) in long_functions(&text, MAX_FN_LINES) {
            out.push(format!("{rel}:{line}: fn {f} is {n} lines"));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_has_no_long_function() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let v = check(&root).unwrap();
        assert!(v.is_empty(), "{}", v.join("\n"));
    }

    #[test]
    fn a_long_function_is_caught_and_literals_do_not_fool_the_count() {
        let body = "    let x = 1;\n".repeat(MAX_FN_LINES - 1);
        let long = format!("fn long() {{\n{body}}}\n");
        assert_eq!(
            long_functions(&long, MAX_FN_LINES),
            [(1, MAX_FN_LINES + 1, "long".into())]
        );
        let fits = format!(
            "fn fits() {{\n{}}}\n",
            "    x();\n".repeat(MAX_FN_LINES - 2)
        );
        assert!(long_functions(&fits, MAX_FN_LINES).is_empty());
        // Braces inside literals and comments, lifetimes, and a bodiless
        // declaration before a real function.
        let tricky = "trait T { fn f(&self); }\n\
            fn g<'a>(s: &'a str) -> char {\n\
            let _ = \"}}}\"; let _ = r#\"}\"#; // }\n\
            /* } /* } */ } */ let c = '}'; let _e = '\\'';\n\
            c\n\
            }\n\
            fn h() {}\n";
        let v = long_functions(tricky, 4);
        assert_eq!(v, [(2, 5, "g".into())], "{}", code_only(tricky));
        assert!(long_functions(tricky, 5).is_empty());
    }
}
