//! What a call's fingerprint holds, how it packs into the board's words and
//! how it reads in an error message.

use std::fmt;

use oxccl_core::{CollKind, DataType, RedOp};

/// One rank's collective-sequence call, as its peers compare it. The
/// PreMulSum scalar is not part of it: NCCL lets every rank bring its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    /// One collective.
    Coll(CollCall),
    /// A group holding `colls` collectives, compared by a digest of their
    /// fingerprints in issue order.
    Group { colls: u32, digest: u64 },
    /// [`crate::Communicator::barrier`].
    Barrier,
    /// Not a call: this rank gave up on a Send/Recv whose peer never posted
    /// the other side and entered this collective instead; it poisons the
    /// collective so the peer's call fails too, naming the operation.
    Blocked {
        peer: u32,
        send: bool,
        count: u64,
        dtype: DataType,
    },
    /// Not a call: this rank's call failed validation (reason a
    /// [`super::refusal`] code); peers fail at once naming it.
    Refused { reason: u8 },
}

/// One collective as its fingerprint holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CollCall {
    kind: CollKind,
    dtype: DataType,
    count: u64,
    /// The op's kind (`RedOp::name` index); `None` for non-reductions.
    op: Option<u8>,
    root: Option<u32>,
}

/// Names of the ops in the order of their code in a fingerprint.
const OPS: [&str; 6] = ["sum", "prod", "max", "min", "avg", "premulsum"];

/// The op's code in a fingerprint (its kind, without a PreMulSum scalar).
pub(crate) fn op_code(op: RedOp) -> u8 {
    match op {
        RedOp::Sum => 0,
        RedOp::Prod => 1,
        RedOp::Max => 2,
        RedOp::Min => 3,
        RedOp::Avg => 4,
        RedOp::PreMulSum(_) | RedOp::PreMulSumDevice(_) => 5,
    }
}

const TAG_COLL: u64 = 1;
const TAG_GROUP: u64 = 2;
const TAG_BARRIER: u64 = 3;
const TAG_BLOCKED: u64 = 4;
const TAG_REFUSED: u64 = 5;
/// Bit of word 0 saying the rank's buffers are all backend memory (not
/// compared: ranks agree on registration by AND-ing it).
const REGISTERED: u64 = 1 << 40;

impl Call {
    /// A collective's fingerprint (`op` ignored for non-reductions,
    /// `root` for rootless collectives).
    pub fn coll(kind: CollKind, dtype: DataType, count: usize, op: RedOp, root: u32) -> Call {
        Call::Coll(CollCall {
            kind,
            dtype,
            count: count as u64,
            op: kind.is_reduction().then(|| op_code(op)),
            root: kind.has_root().then_some(root),
        })
    }

    /// The fingerprint of a group of collectives, in issue order.
    pub fn group(colls: &[Call]) -> Call {
        // FNV-1a over the words: order and every field count.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for c in colls {
            for w in c.encode(false) {
                for b in w.to_le_bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
            }
        }
        Call::Group {
            colls: colls.len() as u32,
            digest: h,
        }
    }

    /// Packs the call (and whether the rank's buffers are registered) into
    /// three words.
    pub fn encode(&self, registered: bool) -> [u64; 3] {
        let reg = if registered { REGISTERED } else { 0 };
        match *self {
            Call::Coll(c) => [
                TAG_COLL
                    | (c.kind as u64) << 8
                    | (c.dtype as u64) << 16
                    | u64::from(c.op.map_or(0xff, |o| o)) << 24
                    | u64::from(c.root.is_some()) << 32
                    | reg,
                c.count,
                u64::from(c.root.unwrap_or(0)),
            ],
            Call::Group { colls, digest } => [TAG_GROUP | reg, digest, u64::from(colls)],
            Call::Barrier => [TAG_BARRIER | reg, 0, 0],
            Call::Blocked {
                peer,
                send,
                count,
                dtype,
            } => [
                TAG_BLOCKED | (dtype as u64) << 16 | u64::from(send) << 32 | reg,
                count,
                u64::from(peer),
            ],
            Call::Refused { reason } => [TAG_REFUSED | reg, u64::from(reason), 0],
        }
    }

    /// Unpacks [`Call::encode`]'s words: the call and the registered bit.
    /// `None` for words no rank writes.
    pub fn decode(w: [u64; 3]) -> Option<(Call, bool)> {
        let byte = |shift: u32| (w[0] >> shift) as u8;
        let dtype = || DataType::ALL.get(usize::from(byte(16))).copied();
        let call = match w[0] & 0xff {
            TAG_COLL => Call::Coll(CollCall {
                kind: *CollKind::ALL.get(usize::from(byte(8)))?,
                dtype: dtype()?,
                count: w[1],
                op: (byte(24) != 0xff).then(|| byte(24)),
                root: (w[0] >> 32 & 1 == 1).then_some(w[2] as u32),
            }),
            TAG_GROUP => Call::Group {
                colls: w[2] as u32,
                digest: w[1],
            },
            TAG_BARRIER => Call::Barrier,
            TAG_BLOCKED => Call::Blocked {
                peer: w[2] as u32,
                send: w[0] >> 32 & 1 == 1,
                count: w[1],
                dtype: dtype()?,
            },
            TAG_REFUSED => Call::Refused {
                reason: u8::try_from(w[1]).ok()?,
            },
            _ => return None,
        };
        Some((call, w[0] & REGISTERED != 0))
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Call::Coll(c) => {
                write!(f, "{}", c.kind)?;
                match (c.op, c.root) {
                    (Some(o), Some(r)) => write!(f, "({}, root {r})", OPS[usize::from(o)])?,
                    (Some(o), None) => write!(f, "({})", OPS[usize::from(o)])?,
                    (None, Some(r)) => write!(f, "(root {r})")?,
                    (None, None) => {}
                }
                write!(f, " of {} x {}", c.count, c.dtype)
            }
            Call::Group { colls, digest } => {
                write!(f, "a group of {colls} collective(s) [digest {digest:016x}]")
            }
            Call::Barrier => f.write_str("barrier"),
            Call::Blocked {
                peer,
                send,
                count,
                dtype,
            } => {
                let (verb, dir) = if send {
                    ("send", "to")
                } else {
                    ("recv", "from")
                };
                write!(
                    f,
                    "no collective: it waits in a {verb} of {count} x {dtype} {dir} rank {peer} that rank {peer} never matched (it entered this collective instead)"
                )
            }
            Call::Refused { reason } => {
                write!(
                    f,
                    "no call: its call was refused ({})",
                    super::refusal::phrase(reason)
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_survives_its_words() {
        let calls = [
            Call::coll(CollKind::AllReduce, DataType::F32, 1024, RedOp::Avg, 3),
            Call::coll(CollKind::Broadcast, DataType::Bf16, 7, RedOp::Max, 2),
            Call::coll(
                CollKind::Reduce,
                DataType::U8,
                1 << 40,
                RedOp::PreMulSum(2.0),
                1,
            ),
            Call::group(&[Call::Barrier]),
            Call::Barrier,
            Call::Blocked {
                peer: 5,
                send: true,
                count: 16,
                dtype: DataType::F8E5M2,
            },
        ];
        for c in calls {
            for reg in [false, true] {
                assert_eq!(Call::decode(c.encode(reg)), Some((c, reg)), "{c}");
            }
        }
        assert_eq!(Call::decode([0, 0, 0]), None, "an empty slot is no call");
    }

    #[test]
    fn fields_that_differ_make_fingerprints_differ() {
        let base = Call::coll(CollKind::Reduce, DataType::F32, 8, RedOp::Sum, 0);
        let others = [
            Call::coll(CollKind::AllReduce, DataType::F32, 8, RedOp::Sum, 0),
            Call::coll(CollKind::Reduce, DataType::F64, 8, RedOp::Sum, 0),
            Call::coll(CollKind::Reduce, DataType::F32, 9, RedOp::Sum, 0),
            Call::coll(CollKind::Reduce, DataType::F32, 8, RedOp::Max, 0),
            Call::coll(CollKind::Reduce, DataType::F32, 8, RedOp::Sum, 1),
        ];
        for o in others {
            assert_ne!(base, o);
        }
        // What the collective ignores is not compared; the PreMulSum scalar
        // is each rank's own.
        assert_eq!(
            Call::coll(CollKind::AllGather, DataType::F32, 8, RedOp::Sum, 0),
            Call::coll(CollKind::AllGather, DataType::F32, 8, RedOp::Max, 3)
        );
        assert_eq!(
            Call::coll(
                CollKind::AllReduce,
                DataType::F32,
                8,
                RedOp::PreMulSum(1.0),
                0
            ),
            Call::coll(
                CollKind::AllReduce,
                DataType::F32,
                8,
                RedOp::PreMulSum(4.0),
                0
            )
        );
        let (a, b) = (
            Call::group(&[base, others[0]]),
            Call::group(&[others[0], base]),
        );
        assert_ne!(a, b, "a group's order counts");
    }

    #[test]
    fn messages_name_what_the_call_has() {
        for (k, op, root, want) in [
            (CollKind::AllReduce, RedOp::Sum, 2, "allreduce(sum)"),
            (CollKind::Broadcast, RedOp::Sum, 2, "broadcast(root 2)"),
            (CollKind::Reduce, RedOp::Min, 1, "reduce(min, root 1)"),
            (CollKind::AllGather, RedOp::Sum, 1, "allgather"),
        ] {
            let got = Call::coll(k, DataType::F32, 1024, op, root).to_string();
            assert_eq!(got, format!("{want} of 1024 x float"));
        }
    }
}
