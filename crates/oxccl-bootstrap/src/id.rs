//! The unique id: 128 bytes that tell every rank where the root listens,
//! which magic its connections must start with, and the communicator's
//! secret key, which every hello proves knowledge of ([`crate::auth`]).
//!
//! Layout (the rest is zero): bytes 0..8 the magic (little-endian), byte 8
//! the root's address family (0: no address, 4, 6), byte 9 flags (bit 0:
//! rank 0 runs the root, as with `NCCL_COMM_ID`), bytes 10..12 the port
//! (big-endian), bytes 12..28 the IP (IPv4 in the first four), bytes
//! 28..60 the key (32 random bytes from the OS; with `NCCL_COMM_ID`,
//! derived from `OXCCL_COMM_SECRET`, or public when that is not set).
//!
//! So an id is a credential: whoever holds it may join the communicator,
//! and it must travel only to the job's own ranks (as NCCL's users already
//! pass it: over their launcher's own channel, or a shared file).

use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::auth::{Key, KEY_BYTES};
use crate::env::BadVar;
use crate::error::BootstrapError;
use crate::{iface, root, sock, BootstrapSettings};

/// NCCL's magic for ids made from `NCCL_COMM_ID` (every rank computes the
/// same id on its own, so the magic cannot be random).
pub const COMM_ID_MAGIC: u64 = 0x0280_0280_0280_0280;

const FLAG_ROOT_IN_RANK0: u8 = 1;
/// Where the key lies in the id's bytes.
const KEY_AT: std::ops::Range<usize> = 28..28 + KEY_BYTES;

/// A communicator's unique id (NCCL's `ncclUniqueId`: 128 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId([u8; UniqueId::BYTES]);

/// What a valid id says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdInfo {
    pub magic: u64,
    pub root: SocketAddr,
    /// The communicator's key: every hello proves it (never printed).
    pub key: Key,
    /// Rank 0 starts the root inside its init (`NCCL_COMM_ID`); otherwise
    /// the process that made the id already runs it.
    pub root_in_rank0: bool,
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.info() {
            Ok(i) => write!(f, "UniqueId({:#018x} @ {})", i.magic, i.root),
            Err(_) => write!(f, "UniqueId(<not a generated id>)"),
        }
    }
}

impl UniqueId {
    pub const BYTES: usize = 128;

    /// A new id with the default settings: [`UniqueId::new_with`].
    pub fn new(limit: Duration) -> Result<UniqueId, BootstrapError> {
        UniqueId::new_with(limit, &BootstrapSettings::default())
    }

    /// A new id. With `s.comm_id` (`NCCL_COMM_ID=host:port`), the id of
    /// that address (rank 0 will run the root there); otherwise a random
    /// magic and a root started now, in this process, on the interface
    /// `s.iface` chooses. The root serves one rendezvous and gives up after
    /// `limit`; every root of the process shares one thread.
    pub fn new_with(limit: Duration, s: &BootstrapSettings) -> Result<UniqueId, BootstrapError> {
        if let Some(v) = s.comm_id.as_deref().filter(|v| !v.is_empty()) {
            return UniqueId::from_comm_id_in(v, s.iface.family, s.comm_secret.as_deref());
        }
        let ip = iface::local_addr(&s.iface)?.addr;
        let magic = random_magic();
        let key = Key::random()?;
        let l = sock::listen(SocketAddr::new(ip, 0), u32::MAX)?;
        let addr = l
            .local_addr()
            .map_err(|e| BootstrapError::io(u32::MAX, "reading the root's address", &e))?;
        root::spawn(l, magic, key, limit, s.wait_warn)?;
        Ok(UniqueId::encode(magic, key, addr, 0))
    }

    /// The id for `NCCL_COMM_ID`'s `host:port` (`[v6]:port` for IPv6). Its
    /// key is public (anyone who can reach the root can join, as with
    /// NCCL); [`UniqueId::from_comm_id_with`] takes `OXCCL_COMM_SECRET`.
    pub fn from_comm_id(v: &str) -> Result<UniqueId, BootstrapError> {
        UniqueId::from_comm_id_in(v, None, None)
    }

    /// [`UniqueId::from_comm_id`] with the secret given (`None` or empty:
    /// the public key).
    pub fn from_comm_id_with(v: &str, secret: Option<&str>) -> Result<UniqueId, BootstrapError> {
        UniqueId::from_comm_id_in(v, None, secret)
    }

    /// [`UniqueId::from_comm_id_with`], resolving to an address of `fam`
    /// (`NCCL_SOCKET_FAMILY`; `None`: either).
    pub fn from_comm_id_in(
        v: &str,
        fam: Option<iface::Family>,
        secret: Option<&str>,
    ) -> Result<UniqueId, BootstrapError> {
        let bad = |reason: String| {
            BootstrapError::Config(BadVar {
                var: "NCCL_COMM_ID",
                value: v.into(),
                reason,
            })
        };
        let addrs: Vec<SocketAddr> = v
            .to_socket_addrs()
            .map_err(|e| bad(format!("expected host:port ({e})")))?
            .collect();
        let addr = addrs
            .iter()
            .find(|a| match fam {
                Some(iface::Family::V4) => a.is_ipv4(),
                Some(iface::Family::V6) => a.is_ipv6(),
                None => true,
            })
            .ok_or_else(|| bad("resolves to no address of NCCL_SOCKET_FAMILY".into()))?;
        if addr.port() == 0 {
            return Err(bad("port 0 cannot be agreed on; name a port".into()));
        }
        let key = match secret.filter(|s| !s.is_empty()) {
            Some(s) => Key::from_secret(s.as_bytes()),
            None => Key::public(),
        };
        Ok(UniqueId::encode(
            COMM_ID_MAGIC,
            key,
            *addr,
            FLAG_ROOT_IN_RANK0,
        ))
    }

    /// The id of a root already serving (`magic`, `key`) at `addr`.
    pub(crate) fn for_root(magic: u64, key: Key, addr: SocketAddr) -> UniqueId {
        UniqueId::encode(magic, key, addr, 0)
    }

    fn encode(magic: u64, key: Key, addr: SocketAddr, flags: u8) -> UniqueId {
        let mut b = [0u8; UniqueId::BYTES];
        b[..8].copy_from_slice(&magic.to_le_bytes());
        b[KEY_AT].copy_from_slice(&key.to_bytes());
        b[9] = flags;
        b[10..12].copy_from_slice(&addr.port().to_be_bytes());
        match addr.ip() {
            IpAddr::V4(v4) => {
                b[8] = 4;
                b[12..16].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                b[8] = 6;
                b[12..28].copy_from_slice(&v6.octets());
            }
        }
        UniqueId(b)
    }

    /// The raw bytes, e.g. to broadcast them to the other ranks.
    pub fn to_bytes(&self) -> [u8; UniqueId::BYTES] {
        self.0
    }

    /// An id from bytes made by [`UniqueId::to_bytes`]: exactly 128 bytes
    /// that parse ([`UniqueId::info`]).
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId, BootstrapError> {
        let raw: [u8; UniqueId::BYTES] = b.try_into().map_err(|_| {
            BootstrapError::InvalidId(format!(
                "{} bytes, a unique id has {}",
                b.len(),
                UniqueId::BYTES
            ))
        })?;
        let id = UniqueId(raw);
        id.info()?;
        Ok(id)
    }

    /// Any 128 bytes, unchecked: a 1-rank communicator never reads its id
    /// (frameworks make those from ids nobody generated); a larger one
    /// checks it at init.
    pub fn from_raw(raw: [u8; UniqueId::BYTES]) -> UniqueId {
        UniqueId(raw)
    }

    /// What the id says, or why these bytes are not an id.
    pub fn info(&self) -> Result<IdInfo, BootstrapError> {
        let b = &self.0;
        let bad = |m: &str| Err(BootstrapError::InvalidId(m.into()));
        if b[KEY_AT.end..].iter().any(|&x| x != 0) || b[9] & !FLAG_ROOT_IN_RANK0 != 0 {
            return bad("reserved bytes are set: not an id made by UniqueId::new");
        }
        let port = u16::from_be_bytes([b[10], b[11]]);
        let ip = match b[8] {
            4 if b[16..28].iter().all(|&x| x == 0) => {
                IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
            }
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&b[12..28]).expect("16 bytes"),
            )),
            0 => {
                return bad("an empty id (never generated): only a 1-rank communicator may use it")
            }
            _ => return bad("unknown address family"),
        };
        if port == 0 {
            return bad("the root's port is 0");
        }
        Ok(IdInfo {
            magic: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            root: SocketAddr::new(ip, port),
            root_in_rank0: b[9] & FLAG_ROOT_IN_RANK0 != 0,
            key: Key::from_bytes(b[KEY_AT].try_into().expect("32 bytes")),
        })
    }
}

/// A random non-zero magic: std's randomly keyed SipHash over the time and
/// the pid (no new dependency; ids need uniqueness, not secrecy).
pub(crate) fn random_magic() -> u64 {
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        let m = h.finish();
        if m != 0 && m != COMM_ID_MAGIC {
            return m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_garbage_is_refused() {
        let key = Key::random().unwrap();
        let id = UniqueId::encode(0x1234, key, "10.1.2.3:4567".parse().unwrap(), 0);
        let back = UniqueId::from_bytes(&id.to_bytes()).unwrap();
        assert_eq!(back, id);
        let i = back.info().unwrap();
        assert_eq!(
            (i.magic, i.root.to_string(), i.root_in_rank0),
            (0x1234, "10.1.2.3:4567".into(), false)
        );
        assert_eq!(i.key, key);
        let shown = format!("{id:?} {i:?}");
        let hex: String = key.to_bytes()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(
            !shown.contains(&hex) && shown.contains("<secret>"),
            "{shown}"
        );
        let v6 = UniqueId::encode(7, key, "[fd00::5]:99".parse().unwrap(), 0);
        assert_eq!(v6.info().unwrap().root.to_string(), "[fd00::5]:99");
        assert!(matches!(
            UniqueId::from_bytes(&[0; 127]),
            Err(BootstrapError::InvalidId(_))
        ));
        assert!(matches!(
            UniqueId::from_bytes(&[0; 128]),
            Err(BootstrapError::InvalidId(_))
        ));
        let mut b = id.to_bytes();
        b[100] = 1;
        assert!(UniqueId::from_bytes(&b).is_err());
        let mut b = id.to_bytes();
        b[8] = 5;
        assert!(UniqueId::from_bytes(&b).is_err());
    }

    #[test]
    fn comm_id_is_deterministic_and_checked() {
        let a = UniqueId::from_comm_id("127.0.0.1:29500").unwrap();
        assert_eq!(a, UniqueId::from_comm_id("127.0.0.1:29500").unwrap());
        let i = a.info().unwrap();
        assert!(i.root_in_rank0);
        assert_eq!(i.magic, COMM_ID_MAGIC);
        // The key: public without a secret, the secret's with one.
        let with = |s| UniqueId::from_comm_id_with("127.0.0.1:29500", s).unwrap();
        assert_eq!(with(None).info().unwrap().key, Key::public());
        assert_eq!(with(Some("")).info().unwrap().key, Key::public());
        assert_eq!(
            with(Some("s3cret")).info().unwrap().key,
            Key::from_secret(b"s3cret")
        );
        assert_ne!(with(Some("s3cret")), with(Some("other")));
        for bad in ["nohost", "127.0.0.1:0", "127.0.0.1:notaport"] {
            assert!(
                matches!(UniqueId::from_comm_id(bad), Err(BootstrapError::Config(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn magics_differ() {
        assert_ne!(random_magic(), random_magic());
    }
}
