//! Rank descriptors: what every rank learns about every other at init,
//! and the messages of the rendezvous that carry them.

use std::net::SocketAddr;

use crate::error::WireError;
use crate::wire::{Reader, Writer};

/// Largest rank count a rendezvous accepts (a table must fit a frame).
pub const MAX_RANKS: u32 = 1 << 14;

/// What one rank tells the others about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankDesc {
    pub rank: u32,
    /// Which machine (host name and boot id): ranks with equal `host` share
    /// memory and may pass file descriptors.
    pub host: String,
    pub pid: u32,
    /// The rank's pid namespace (the inode of `/proc/self/ns/pid`, 0 where
    /// unknown): an fd mailbox checks a sender's pid against `pid` only
    /// when it shares the namespace, where the kernel reports pids alike.
    pub pidns: u64,
    /// CUDA device ordinal, or -1 for none (host backend).
    pub device: i32,
    /// PCI bus id of the device (`0000:19:00.0`), empty for none.
    pub bus_id: String,
    /// The rank's bootstrap listening address (its ring predecessor
    /// connects there).
    pub listen: SocketAddr,
}

/// Local facts about a rank for its descriptor: the device it drives,
/// and where it says it is (its host identity and the interface it
/// listens on, from the facade's settings; defaults: the machine, any
/// interface).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    pub device: Option<i32>,
    pub bus_id: String,
    /// Replaces the machine's identity ([`host_identity`]).
    pub host_id: Option<String>,
    /// The interface ring listeners use when the root is not on loopback.
    pub iface: crate::iface::IfaceSettings,
    /// When a root this rank runs warns that ranks have not joined.
    pub wait_warn: crate::WaitWarn,
}

impl RankDesc {
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u32(self.rank)
            .str(&self.host)
            .u32(self.pid)
            .u64(self.pidns)
            .i32(self.device)
            .str(&self.bus_id)
            .addr(self.listen);
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<RankDesc, WireError> {
        Ok(RankDesc {
            rank: r.u32()?,
            host: r.str()?,
            pid: r.u32()?,
            pidns: r.u64()?,
            device: r.i32()?,
            bus_id: r.str()?,
            listen: r.addr()?,
        })
    }
}

/// Which machine this is: host name plus the kernel's boot id, so two
/// containers sharing a host name but not a kernel are told apart.
/// `host_id` (`OXCCL_HOSTID` or NCCL's `NCCL_HOSTID`, as the facade read
/// them), when given and not empty, replaces it, as NCCL's does: ranks
/// given different ids are placed, and talk, as if on different hosts
/// (over the network), which lets one machine stand for several.
pub fn host_identity(host_id: Option<&str>) -> String {
    if let Some(id) = host_id.map(str::trim).filter(|v| !v.is_empty()) {
        return format!("hostid:{id}");
    }
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "{}/{}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/random/boot_id")
    )
}

/// The version of everything ranks say to each other: bootstrap frames,
/// network messages (`oxccl-net`), the call check's shared records. Bump
/// it with any change to one of them; the root refuses a hello of another
/// version, naming the rank, so ranks of two builds fail at init with the
/// reason instead of misreading each other later. 2: network messages
/// travel only on the sockets that carry their bytes (4e59e2e). 3: CUDA
/// ranks as processes share the caller's allocations through a second
/// shared region, and kernels publish tagged addresses. 4: the host
/// backend's network setup swaps each rank's socket proposal (threads and
/// sockets per connection, set or default) before its listen handles, and
/// every rank takes the layout they agree on. 5: every hello proves the
/// id's key over a challenge (`Challenge` and `Ack` frames), descriptors
/// carry the pid namespace, and network hellos carry a MAC.
pub const PROTOCOL: u32 = 5;

/// A rank's first message to the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The sender's [`PROTOCOL`].
    pub protocol: u32,
    pub nranks: u32,
    pub desc: RankDesc,
}

impl Hello {
    /// A hello of this build's protocol.
    pub fn new(nranks: u32, desc: RankDesc) -> Hello {
        Hello {
            protocol: PROTOCOL,
            nranks,
            desc,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.protocol);
        w.u32(self.nranks);
        self.desc.encode(&mut w);
        w.0
    }

    pub fn decode(b: &[u8]) -> Result<Hello, WireError> {
        let mut r = Reader::new(b, "hello");
        let h = Hello {
            protocol: r.u32()?,
            nranks: r.u32()?,
            desc: RankDesc::decode(&mut r)?,
        };
        r.finish()?;
        Ok(h)
    }
}

/// The root's answer: every rank's descriptor, in rank order.
pub fn encode_table(descs: &[RankDesc]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(descs.len() as u32);
    for d in descs {
        d.encode(&mut w);
    }
    w.0
}

/// Decodes a table of exactly `nranks` descriptors, `descs[i].rank == i`.
pub fn decode_table(b: &[u8], nranks: u32) -> Result<Vec<RankDesc>, WireError> {
    let v = decode_descs(b)?;
    let r = Reader::new(b, "table");
    if v.len() != nranks as usize {
        return Err(r.malformed(format!("{} descriptors for {nranks} ranks", v.len())));
    }
    if let Some((i, d)) = v.iter().enumerate().find(|(i, d)| d.rank != *i as u32) {
        return Err(r.malformed(format!("descriptor {i} is for rank {}", d.rank)));
    }
    Ok(v)
}

/// Decodes descriptors written by [`encode_table`], in their order.
pub fn decode_descs(b: &[u8]) -> Result<Vec<RankDesc>, WireError> {
    let mut r = Reader::new(b, "table");
    let n = r.u32()?;
    if n > MAX_RANKS {
        return Err(r.malformed(format!("{n} descriptors (at most {MAX_RANKS})")));
    }
    let mut v = Vec::with_capacity(n as usize);
    for _ in 0..n {
        v.push(RankDesc::decode(&mut r)?);
    }
    r.finish()?;
    Ok(v)
}

/// A ring connection's first message: who is calling.
pub fn encode_peer(rank: u32, nranks: u32) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(rank).u32(nranks);
    w.0
}

pub fn decode_peer(b: &[u8]) -> Result<(u32, u32), WireError> {
    let mut r = Reader::new(b, "peer hello");
    let v = (r.u32()?, r.u32()?);
    r.finish()?;
    Ok(v)
}

/// A refusal's reason.
pub fn decode_fail(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(crate::wire::MAX_STR)]).into_owned()
}

#[cfg(test)]
mod host_tests {
    use super::host_identity;

    #[test]
    fn a_host_id_replaces_the_machine() {
        let machine = host_identity(None);
        assert!(machine.contains('/'), "{machine}");
        assert_eq!(host_identity(Some("a")), "hostid:a");
        // Trimmed; an empty value is no value.
        assert_eq!(host_identity(Some(" b ")), "hostid:b");
        assert_eq!(host_identity(Some(" ")), machine);
        assert_ne!(host_identity(Some("a")), host_identity(Some("b")));
    }
}
