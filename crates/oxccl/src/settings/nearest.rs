//! The known name nearest an unknown one (edit distance), for the warning
//! about a misspelt `OXCCL_*` variable.

use super::SETTINGS;

/// Levenshtein distance between `a` and `b` (bytes; names are ASCII).
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &y) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(x != y))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The `OXCCL_*` name of [`SETTINGS`] nearest `name` (the first of the
/// nearest, in table order).
pub fn nearest(name: &str) -> &'static str {
    SETTINGS
        .iter()
        .map(|s| s.name)
        .filter(|n| n.starts_with("OXCCL_"))
        .min_by_key(|n| distance(name, n))
        .unwrap_or("OXCCL_DEBUG")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("same", "same"), 0);
    }

    #[test]
    fn misspellings_find_their_setting() {
        assert_eq!(nearest("OXCCL_CHANELS"), "OXCCL_CHANNELS");
        assert_eq!(nearest("OXCCL_DEBUGG"), "OXCCL_DEBUG");
        assert_eq!(nearest("OXCCL_TOPOFILE"), "OXCCL_TOPO_FILE");
    }
}
