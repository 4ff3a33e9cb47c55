//! The keys and values behind the parameter API (`api::param`): oxccl's
//! settings, by variable name.

/// Every key, in table order.
pub fn keys() -> Vec<&'static str> {
    Vec::new()
}

/// The table's spelling of `key` (an `OXCCL_*` name or its `NCCL_*`
/// twin), if it is a setting.
pub fn canonical(key: &str) -> Option<&'static str> {
    keys().into_iter().find(|k| *k == key)
}

/// The value of setting `key` as the library sees it.
pub fn value(_key: &str) -> Option<String> {
    None
}

/// `s` as an integer of type `T`: decimal, `0x` hexadecimal, or a
/// boolean word (`true`/`false`, `on`/`off`, `yes`/`no`) as 1/0.
pub fn integer<T: TryFrom<i128>>(s: &str) -> Option<T> {
    let t = s.trim();
    let v: i128 = match t.to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" => 1,
        "false" | "off" | "no" => 0,
        l => match l.strip_prefix("0x") {
            Some(h) => i128::from_str_radix(h, 16).ok()?,
            None => l.parse().ok()?,
        },
    };
    T::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::integer;

    #[test]
    fn integers_fit_or_are_refused() {
        assert_eq!(integer::<i32>("42"), Some(42));
        assert_eq!(integer::<u8>("0x10"), Some(16));
        assert_eq!(integer::<u8>("256"), None);
        assert_eq!(integer::<u64>("-1"), None);
        assert_eq!(integer::<i8>("true"), Some(1));
        assert_eq!(integer::<i64>("ring"), None);
    }
}
