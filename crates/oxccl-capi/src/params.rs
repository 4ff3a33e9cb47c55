//! The keys and values behind the parameter API (`api::param`): oxccl's
//! settings table (`oxccl::settings::SETTINGS`), by variable name.

use oxccl::settings::{setting, Environment, SETTINGS};

/// Every key, in table order: each setting's name, then its NCCL twin.
pub fn keys() -> Vec<&'static str> {
    SETTINGS
        .iter()
        .flat_map(|s| std::iter::once(s.name).chain(s.nccl))
        .collect()
}

/// The table's spelling of `key` (an `OXCCL_*` name or its `NCCL_*`
/// twin), if it is a setting.
pub fn canonical(key: &str) -> Option<&'static str> {
    keys().into_iter().find(|k| *k == key)
}

/// The value of setting `key` as the library sees it now: the
/// environment's (the setting's own name first, then its NCCL twin), else
/// the table's default.
pub fn value(key: &str) -> Option<String> {
    let s = setting(key)?;
    let env = Environment::capture();
    env.get(s.name)
        .or_else(|| s.nccl.and_then(|n| env.get(n)))
        .or_else(|| Some(s.default.to_string()))
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
    use super::*;

    #[test]
    fn integers_fit_or_are_refused() {
        assert_eq!(integer::<i32>("42"), Some(42));
        assert_eq!(integer::<u8>("0x10"), Some(16));
        assert_eq!(integer::<u8>("256"), None);
        assert_eq!(integer::<u64>("-1"), None);
        assert_eq!(integer::<i8>("true"), Some(1));
        assert_eq!(integer::<i64>("ring"), None);
    }

    #[test]
    fn keys_are_the_table_and_its_twins() {
        let k = keys();
        assert!(k.contains(&"OXCCL_DEADLINE_MS") && k.contains(&"NCCL_ALGO"));
        assert_eq!(canonical("NCCL_PROTO"), Some("NCCL_PROTO"));
        assert_eq!(canonical("NCCL_NO_SUCH_THING"), None);
        assert!(value("NCCL_NO_SUCH_THING").is_none());
        // The deterministic switch has no ncclConfig_t field: C programs
        // read it back through the parameter API.
        assert_eq!(
            canonical("OXCCL_DETERMINISTIC"),
            Some("OXCCL_DETERMINISTIC")
        );
    }
}
