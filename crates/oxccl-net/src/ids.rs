//! The id tables both transports keep (TCP its connections, a plugin the
//! pointers it was given), keyed by the ids the [`crate::Net`] trait hands
//! out: an id not (or no longer) in its table is a `BadHandle` naming the
//! kind of handle it was meant to be.

use std::collections::HashMap;

use crate::error::NetError;

pub(crate) trait Ids<V> {
    /// The entry of `id`, a handle of kind `kind`.
    fn lookup(&self, kind: &'static str, id: u64) -> Result<&V, NetError>;
    fn lookup_mut(&mut self, kind: &'static str, id: u64) -> Result<&mut V, NetError>;
    /// Removes the entry of `id` and answers it.
    fn take(&mut self, kind: &'static str, id: u64) -> Result<V, NetError>;
}

impl<V> Ids<V> for HashMap<u64, V> {
    fn lookup(&self, kind: &'static str, id: u64) -> Result<&V, NetError> {
        self.get(&id).ok_or(NetError::BadHandle { kind, id })
    }

    fn lookup_mut(&mut self, kind: &'static str, id: u64) -> Result<&mut V, NetError> {
        self.get_mut(&id).ok_or(NetError::BadHandle { kind, id })
    }

    fn take(&mut self, kind: &'static str, id: u64) -> Result<V, NetError> {
        self.remove(&id).ok_or(NetError::BadHandle { kind, id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_id_names_its_kind_and_a_taken_one_is_gone() {
        let mut t = HashMap::from([(7u64, "seven")]);
        assert_eq!(t.lookup("send", 7).copied().unwrap(), "seven");
        assert_eq!(t.take("send", 7).unwrap(), "seven");
        let e = t.lookup_mut("recv", 7).unwrap_err();
        assert!(
            matches!(
                e,
                NetError::BadHandle {
                    kind: "recv",
                    id: 7
                }
            ),
            "{e}"
        );
    }
}
