//! The host/device layout, defined once: every record the host writes and
//! the kernel reads (steps, operands, channel records, connection and
//! semaphore headers, the error record, the launch descriptor) and every
//! constant both sides use. The Rust types are `#[repr(C)]`; the C
//! definitions the kernels see are generated from the same macro input
//! ([`header`]) and placed first in every module's NVRTC source, so the two
//! cannot drift. The kernel cache key hashes the whole source, generated
//! header included, so a layout change recompiles.
//!
//! A field is declared once, as `name: RustType => "C declaration"`; the
//! tests recompute each C layout from the declarations (natural alignment,
//! as NVRTC lays out a struct) and compare every offset and size with
//! `offset_of!`/`size_of` of the Rust type, and check every constant's
//! `#define` in the generated text.

use oxccl_core::Awaited;
use std::fmt::Write as _;

/// Threads per block of the executor (`OX_THREADS`).
pub const THREADS: u32 = 512;
/// Buffers one rank's plan may name (`OX_MAX_BUFS`).
pub const MAX_BUFS: usize = 64;
/// Sources or destinations one transfer may have (`OX_MAX_OPERANDS`): the
/// direct plans read every rank's input in one step (one-shot, two-shot,
/// all-pairs), so as many as ranks can share a GPU
/// ([`MAX_RESIDENT_KERNELS`](crate::world::MAX_RESIDENT_KERNELS)). A block
/// resolves one operand per thread, so it must not exceed [`THREADS`].
pub const MAX_OPERANDS: usize = 128;
/// Channel records a launch parameter holds, one block each
/// (`OX_MAX_CHANNELS`).
pub const MAX_CHANNELS: usize = 32;
/// Bytes of the counters before a connection's slots (`OX_CONN_HEADER`).
pub const CONN_HEADER: usize = 256;
/// Bytes of an `OxSem`.
pub const SEM_BYTES: usize = 256;

/// Operand kind: `bufs[buf] + off` elements of this rank.
pub const K_LOCAL: u8 = 0;
/// Operand kind: a FIFO connection (`off` = its address, `buf` = the peer).
pub const K_CONN: u8 = 1;
/// Operand kind: buffer `buf` of peer `idx`, `off` elements in.
pub const K_REMOTE: u8 = 2;
/// Step kind: a transfer over operands `[first, first + nsrc + ndst)`.
pub const S_XFER: u8 = 0;
/// Step kind: signal the semaphore at `len` (peer in `first`).
pub const S_SIGNAL: u8 = 1;
/// Step kind: wait on the semaphore at `len` (peer in `first`).
pub const S_WAIT: u8 = 2;
/// Step kind: exchange `len` elements between operand 0 (local) and
/// operand 1 (a peer's buffer); `nsrc = 2`, `ndst = 0`.
pub const S_SWAP: u8 = 3;
/// Operand flag: apply the pre-scale when reading this source.
pub const F_PRE: u8 = 1;
/// Step flag: divide the result by the descriptor's `post_div`.
pub const F_POST: u8 = 1;
/// Descriptor flag: the call has a pre-scale (`scale_bits`).
pub const D_PRE: u32 = 2;
/// Descriptor flag: some peer is on another GPU, so fences and counters
/// need system scope (device scope is enough and cheaper on one GPU).
pub const D_SYS: u32 = 4;
/// Descriptor flag (with [`D_PRE`]): `scale_bits` is the device address
/// of the pre-scale (`ncclScalarDevice`), which the kernel reads when it
/// runs, not the scale's bits.
pub const D_PRE_AT: u32 = 16;
/// Descriptor flag: FIFO connections run LL (`conns` point at LL
/// connections and `slot_bytes` is the LL slot stride).
pub const D_LL: u32 = 8;
/// Descriptor flag: relaunch mode (`world::relaunch`). No block waits for
/// a peer: each starts at its channel's `progress` record, and where a
/// step needs what a peer has not yet sent, signalled or freed, it writes
/// that step (and the peer) there and returns, before the step has any
/// effect; the host launches again until every channel is done.
pub const D_RESUME: u32 = 32;
/// Descriptor flag: the launch is the one-step LL AllReduce
/// (`kernels/oxccl_ll1.cuh`), not a plan: `ll1_*` say where its slots and
/// epoch are, `bufs[0]` and `bufs[1]` are the input and the output.
pub const D_LL1: u32 = 64;
/// `u32` words of a channel's `progress` record: the next step, the peer
/// it waits for, what it waits for (`OXA_*`), one spare.
pub const PROGRESS_WORDS: usize = 4;
/// Error code: a wait passed its deadline.
pub const E_TIMEOUT: u32 = 1;
/// Error code: the host asked to abort.
pub const E_ABORTED: u32 = 2;
/// Error code: another rank failed first.
pub const E_PEER_FAILED: u32 = 3;
/// Error code: a peer's buffer lies in an allocation this process could
/// not map (its delta is [`UNMAPPED`]).
pub const E_UNMAPPED: u32 = 4;
/// Ranks as processes: the published address of a buffer carries, in its
/// top byte, the tag of the owner's allocation it lies in (0: the owner's
/// heap; 1.. an allocation of the caller's the owner shared, see
/// `world::exports`). Local uses mask it off.
pub const TAG_SHIFT: u32 = 56;
/// Tags per rank, the width of a row of the delta table (`OX_MAPS`).
pub const MAPS: usize = 256;
/// A delta table entry whose allocation is not mapped here. Real deltas
/// are differences of allocation bases (multiples of 256), never odd.
pub const UNMAPPED: i64 = 1;

/// Every constant the kernels see: `(C name, value, why)`, in header order.
pub const CONSTANTS: &[(&str, u64, &str)] = &[
    ("OX_THREADS", THREADS as u64, "threads per block"),
    ("OX_MAX_BUFS", MAX_BUFS as u64, "buffers per plan"),
    (
        "OX_MAX_OPERANDS",
        MAX_OPERANDS as u64,
        "operands per transfer",
    ),
    (
        "OX_MAX_CHANNELS",
        MAX_CHANNELS as u64,
        "channel records a launch parameter carries (one block each)",
    ),
    (
        "OX_CONN_HEADER",
        CONN_HEADER as u64,
        "counters before a connection's slots",
    ),
    ("OXK_LOCAL", K_LOCAL as u64, "operand kinds"),
    ("OXK_CONN", K_CONN as u64, ""),
    ("OXK_REMOTE", K_REMOTE as u64, ""),
    ("OXS_XFER", S_XFER as u64, "step kinds"),
    ("OXS_SIGNAL", S_SIGNAL as u64, ""),
    ("OXS_WAIT", S_WAIT as u64, ""),
    (
        "OXS_SWAP",
        S_SWAP as u64,
        "operand 0 (local) <-> operand 1 (a peer's); nsrc = 2, ndst = 0",
    ),
    (
        "OXF_PRE",
        F_PRE as u64,
        "operand flag: pre-scale this source",
    ),
    (
        "OXF_POST",
        F_POST as u64,
        "step flag: divide the result by post_div",
    ),
    ("OXD_PRE", D_PRE as u64, "descriptor flags"),
    (
        "OXD_SYS",
        D_SYS as u64,
        "some peer is on another GPU: system-scope fences and counters",
    ),
    (
        "OXD_PRE_AT",
        D_PRE_AT as u64,
        "scale_bits is the pre-scale's device address, read at run time",
    ),
    (
        "OXD_LL",
        D_LL as u64,
        "FIFO connections run LL (kernels/oxccl_ll.cuh)",
    ),
    (
        "OXD_RESUME",
        D_RESUME as u64,
        "relaunch mode: start at progress[], return instead of waiting for a peer",
    ),
    (
        "OXD_LL1",
        D_LL1 as u64,
        "the one-step LL AllReduce (kernels/oxccl_ll1.cuh), not a plan",
    ),
    (
        "OX_PROGRESS_WORDS",
        PROGRESS_WORDS as u64,
        "u32 words of a channel's progress record: step, peer, awaited, spare",
    ),
    (
        "OXE_TIMEOUT",
        E_TIMEOUT as u64,
        "error codes written into OxError.code",
    ),
    ("OXE_ABORTED", E_ABORTED as u64, ""),
    ("OXE_PEER_FAILED", E_PEER_FAILED as u64, ""),
    ("OXE_UNMAPPED", E_UNMAPPED as u64, ""),
    (
        "OX_TAG_SHIFT",
        TAG_SHIFT as u64,
        "a published address's top byte: its allocation's tag (ranks as processes)",
    ),
    ("OX_MAPS", MAPS as u64, "tags per rank: a row of heap_delta"),
    (
        "OX_UNMAPPED",
        UNMAPPED as u64,
        "a heap_delta entry whose allocation is not mapped here",
    ),
    (
        "OXA_MESSAGE",
        Awaited::Message.code() as u64,
        "what a failed wait awaited, written into OxError.awaited",
    ),
    ("OXA_SLOT", Awaited::Slot.code() as u64, ""),
    ("OXA_SIGNAL", Awaited::Signal.code() as u64, ""),
];

/// One field of a device record: its Rust name, its C declaration, and
/// where the Rust type puts it.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    pub c_decl: &'static str,
    pub offset: usize,
    pub size: usize,
}

/// A record shared with the kernels.
pub trait DeviceRecord {
    /// The C struct name.
    const C_NAME: &'static str;
    /// Comment lines placed above the C struct.
    const DOC: &'static [&'static str];
    /// The fields in declaration order.
    fn fields() -> Vec<Field>;
    /// `size_of` the Rust type.
    const SIZE: usize;
}

/// Declares a `#[repr(C)]` record and its C text from one field list.
macro_rules! device_record {
    (
        $(#[doc = $doc:literal])*
        $name:ident { $($field:ident : $rty:ty => $cdecl:literal),* $(,)? }
    ) => {
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name { $(pub $field: $rty),* }

        impl DeviceRecord for $name {
            const C_NAME: &'static str = stringify!($name);
            const DOC: &'static [&'static str] = &[$($doc),*];
            const SIZE: usize = std::mem::size_of::<$name>();
            fn fields() -> Vec<Field> {
                fn size_of_field<T>(_: fn(&$name) -> &T) -> usize {
                    std::mem::size_of::<T>()
                }
                vec![$(Field {
                    name: stringify!($field),
                    c_decl: $cdecl,
                    offset: std::mem::offset_of!($name, $field),
                    size: size_of_field(|r: &$name| &r.$field),
                }),*]
            }
        }
    };
}

device_record! {
    /// One source or destination of a transfer. LOCAL: `bufs[buf] + off`
    /// elements. CONN: `off` = the OxConn's address (resolved on the host
    /// at upload), `idx` = connection table index, `buf` = peer rank (for
    /// errors). REMOTE: `idx` = peer rank, `buf` = buffer id in the peer's
    /// table.
    OxOperand {
        kind: u8 => "u8 kind",
        flags: u8 => "u8 flags",
        buf: u16 => "u16 buf",
        idx: u32 => "u32 idx",
        off: u64 => "u64 off",
    }
}

device_record! {
    /// One step. XFER, SWAP: operands `[first, first + nsrc + ndst)`, `len`
    /// elements. SIGNAL/WAIT: `len` = the OxSem's address (resolved on the
    /// host at upload), `first` = peer rank (for errors), `nsrc` = steps
    /// left in its run of consecutive signals (waits) from here, at most
    /// 255, `ndst` (waits) = earlier waits of the run on the same
    /// semaphore (encode.rs, mark_runs).
    OxStep {
        op: u8 => "u8 op",
        nsrc: u8 => "u8 nsrc",
        ndst: u8 => "u8 ndst",
        flags: u8 => "u8 flags",
        first: u32 => "u32 first",
        len: u64 => "u64 len",
    }
}

device_record! {
    /// A channel's steps and, contiguous, the operands of its transfers.
    OxChan {
        first: u32 => "u32 first",
        nsteps: u32 => "u32 nsteps",
        op_first: u32 => "u32 op_first",
        nops: u32 => "u32 nops",
    }
}

device_record! {
    /// A FIFO connection's header, in the receiver's memory; the slots
    /// follow. Counters only grow: no reset between calls or graph
    /// replays. An LL connection has the same header; its receiver polls
    /// the slots' flags instead of `tail`, which only its sender reads.
    OxConn {
        tail: u64 => "u64 tail",
        pad0: [u64; 15] => "u64 pad0[15]",
        head: u64 => "u64 head",
        pad1: [u64; 15] => "u64 pad1[15]",
    }
}

device_record! {
    /// A one-sided semaphore (channel, from -> to), in the waiter's memory:
    /// `posted` bumped by the signaller, `consumed` written by the waiter.
    OxSem {
        posted: u64 => "u64 posted",
        pad0: [u64; 15] => "u64 pad0[15]",
        consumed: u64 => "u64 consumed",
        pad1: [u64; 15] => "u64 pad1[15]",
    }
}

device_record! {
    /// The first error of a launch, in the rank's device memory, read by
    /// the host.
    OxError {
        code: u32 => "u32 code",
        rank: u32 => "u32 rank",
        peer: u32 => "u32 peer",
        channel: u32 => "u32 channel",
        step: u32 => "u32 step",
        awaited: u32 => "u32 awaited",
        waited_ns: u64 => "u64 waited_ns",
    }
}

device_record! {
    /// The per-launch descriptor, the kernel's only parameter, passed by
    /// value (`__grid_constant__`). The channel records ride in it (read
    /// from the constant bank, no memory round trip before a block knows
    /// where its steps are); steps and operands are in the uploaded blob.
    /// `ptr_table`: `[nranks][OX_MAX_BUFS]` buffer bases, for remote steps;
    /// `abort_flag`: host-mapped, non-zero aborts; `world_fail`: set by
    /// any rank that failed, polled by all; `scale_bits`: the pre-scale as
    /// the element type's bits; `heap_delta`: null when ranks are threads
    /// of one process, else `[nranks][OX_MAPS]` byte offsets added to a
    /// peer's published base, by the tag in its top byte: the allocation's
    /// address here minus its address in the peer's own process (ranks as
    /// processes: each maps the others' heaps, and the caller's allocations
    /// they share, where its driver chose); `OX_UNMAPPED` where none is.
    /// `trace`: null unless a step trace is asked for, else two
    /// `%globaltimer` stamps (start, end) per step of the plan, indexed as
    /// the steps are. `progress`: with `OXD_RESUME`, host-mapped,
    /// `OX_PROGRESS_WORDS` words per channel (where its block starts, and
    /// where and on whom it stopped); null otherwise.
    OxDesc {
        steps: u64 => "const OxStep* steps",
        ops: u64 => "const OxOperand* ops",
        ptr_table: u64 => "u64* ptr_table",
        abort_flag: u64 => "const volatile u32* abort_flag",
        world_fail: u64 => "volatile u32* world_fail",
        err: u64 => "OxError* err",
        scale_bits: u64 => "u64 scale_bits",
        timeout_ns: u64 => "u64 timeout_ns",
        slot_bytes: u64 => "u64 slot_bytes",
        heap_delta: u64 => "const i64* heap_delta",
        trace: u64 => "u64* trace",
        progress: u64 => "volatile u32* progress",
        ll1_slots: u64 => "const u64* ll1_slots",
        ll1_epoch: u64 => "u64* ll1_epoch",
        ll1_count: u64 => "u64 ll1_count",
        ll1_lines: u64 => "u64 ll1_lines",
        rank: u32 => "u32 rank",
        nranks: u32 => "u32 nranks",
        nbufs: u32 => "u32 nbufs",
        flags: u32 => "u32 flags",
        post_div: u32 => "u32 post_div",
        nslots: u32 => "u32 nslots",
        bufs: [u64; MAX_BUFS] => "u64 bufs[OX_MAX_BUFS]",
        chans: [OxChan; MAX_CHANNELS] => "OxChan chans[OX_MAX_CHANNELS]",
    }
}

impl Default for OxChan {
    /// An empty channel: a block that launches and does nothing.
    fn default() -> Self {
        OxChan {
            first: 0,
            nsteps: 0,
            op_first: 0,
            nops: 0,
        }
    }
}

const _: () = assert!(std::mem::size_of::<OxConn>() == CONN_HEADER);
// A thread per operand of a step, and the step record's u8 counts.
const _: () = assert!(2 * MAX_OPERANDS <= THREADS as usize && MAX_OPERANDS <= u8::MAX as usize);
// The core's pushing plans have one destination (two-shot: and one source)
// per rank up to this many ranks.
const _: () = assert!(oxccl_core::gen::MAX_PUSH_RANKS as usize <= MAX_OPERANDS);
const _: () = assert!(std::mem::size_of::<OxSem>() == SEM_BYTES);

/// Copies `bytes` into `b` at `at`.
fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut w = [0u8; N];
    w.copy_from_slice(&b[at..at + N]);
    w
}

impl OxStep {
    /// The record's little-endian bytes, as the kernel reads them.
    pub fn to_le_bytes(&self) -> [u8; std::mem::size_of::<OxStep>()] {
        use std::mem::offset_of;
        let mut b = [0u8; std::mem::size_of::<OxStep>()];
        b[offset_of!(OxStep, op)] = self.op;
        b[offset_of!(OxStep, nsrc)] = self.nsrc;
        b[offset_of!(OxStep, ndst)] = self.ndst;
        b[offset_of!(OxStep, flags)] = self.flags;
        put(&mut b, offset_of!(OxStep, first), &self.first.to_le_bytes());
        put(&mut b, offset_of!(OxStep, len), &self.len.to_le_bytes());
        b
    }
}

impl OxOperand {
    /// The record's little-endian bytes, as the kernel reads them.
    pub fn to_le_bytes(&self) -> [u8; std::mem::size_of::<OxOperand>()] {
        use std::mem::offset_of;
        let mut b = [0u8; std::mem::size_of::<OxOperand>()];
        b[offset_of!(OxOperand, kind)] = self.kind;
        b[offset_of!(OxOperand, flags)] = self.flags;
        put(&mut b, offset_of!(OxOperand, buf), &self.buf.to_le_bytes());
        put(&mut b, offset_of!(OxOperand, idx), &self.idx.to_le_bytes());
        put(&mut b, offset_of!(OxOperand, off), &self.off.to_le_bytes());
        b
    }
}

impl OxError {
    /// The record's little-endian bytes, as the kernel writes them (the
    /// host records a failure of its own there in relaunch mode).
    pub fn to_le_bytes(&self) -> [u8; std::mem::size_of::<OxError>()] {
        use std::mem::offset_of;
        let mut b = [0u8; std::mem::size_of::<OxError>()];
        put(&mut b, offset_of!(OxError, code), &self.code.to_le_bytes());
        put(&mut b, offset_of!(OxError, rank), &self.rank.to_le_bytes());
        put(&mut b, offset_of!(OxError, peer), &self.peer.to_le_bytes());
        put(
            &mut b,
            offset_of!(OxError, channel),
            &self.channel.to_le_bytes(),
        );
        put(&mut b, offset_of!(OxError, step), &self.step.to_le_bytes());
        put(
            &mut b,
            offset_of!(OxError, awaited),
            &self.awaited.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(OxError, waited_ns),
            &self.waited_ns.to_le_bytes(),
        );
        b
    }

    /// Reads a record from the little-endian bytes the kernel wrote.
    pub fn from_le_bytes(b: &[u8; std::mem::size_of::<OxError>()]) -> OxError {
        use std::mem::offset_of;
        let w = |at: usize| u32::from_le_bytes(get(b, at));
        OxError {
            code: w(offset_of!(OxError, code)),
            rank: w(offset_of!(OxError, rank)),
            peer: w(offset_of!(OxError, peer)),
            channel: w(offset_of!(OxError, channel)),
            step: w(offset_of!(OxError, step)),
            awaited: w(offset_of!(OxError, awaited)),
            waited_ns: u64::from_le_bytes(get(b, offset_of!(OxError, waited_ns))),
        }
    }
}

fn c_struct<R: DeviceRecord>(out: &mut String) {
    for line in R::DOC {
        let _ = writeln!(out, "//{line}");
    }
    let _ = writeln!(out, "struct {} {{", R::C_NAME);
    for f in R::fields() {
        let _ = writeln!(out, "  {};", f.c_decl);
    }
    let _ = writeln!(out, "}};");
    let _ = writeln!(
        out,
        "static_assert(sizeof({0}) == {1}, \"{0} layout (generated from layout.rs)\");\n",
        R::C_NAME,
        R::SIZE
    );
}

/// The C definitions of every constant and record, generated from this
/// module: the first part of every kernel module's source.
pub fn header() -> String {
    let mut s = String::from(
        "// Generated from crates/oxccl-cuda/src/layout.rs: edit that file, not this text.\n\n\
         typedef signed char i8;\ntypedef unsigned char u8;\ntypedef short i16;\n\
         typedef unsigned short u16;\ntypedef int i32;\ntypedef unsigned int u32;\n\
         typedef long long i64;\ntypedef unsigned long long u64;\n\n",
    );
    for (name, value, why) in CONSTANTS {
        if !why.is_empty() {
            let _ = writeln!(s, "// {why}");
        }
        let _ = writeln!(s, "#define {name} {value}");
    }
    s.push('\n');
    c_struct::<OxOperand>(&mut s);
    c_struct::<OxStep>(&mut s);
    c_struct::<OxChan>(&mut s);
    c_struct::<OxConn>(&mut s);
    c_struct::<OxSem>(&mut s);
    c_struct::<OxError>(&mut s);
    c_struct::<OxDesc>(&mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Size and alignment of a C type as NVRTC lays it out (LP64).
    fn c_type(ty: &str) -> (usize, usize) {
        if ty.ends_with('*') {
            return (8, 8);
        }
        match ty {
            "u8" | "i8" => (1, 1),
            "u16" | "i16" => (2, 2),
            "u32" | "i32" => (4, 4),
            "u64" | "i64" => (8, 8),
            "OxChan" => (16, 4),
            other => panic!("no C layout for type {other}"),
        }
    }

    fn constant(name: &str) -> usize {
        if let Ok(n) = name.parse() {
            return n;
        }
        CONSTANTS
            .iter()
            .find(|c| c.0 == name)
            .map(|c| c.1 as usize)
            .unwrap_or_else(|| panic!("no constant {name}"))
    }

    /// Parses `"const volatile u32* abort_flag"` or `"u64 bufs[OX_MAX_BUFS]"`
    /// into (field name, size, alignment).
    fn c_field(decl: &str) -> (String, usize, usize) {
        let (ty, name) = decl.rsplit_once(' ').expect("type and name");
        let ty = ty
            .trim_start_matches("const ")
            .trim_start_matches("volatile ");
        let ty = ty.replace(" *", "*");
        let (elem, align) = c_type(&ty);
        match name.split_once('[') {
            Some((n, count)) => {
                let count = constant(count.trim_end_matches(']'));
                (n.to_string(), elem * count, align)
            }
            None => (name.to_string(), elem, align),
        }
    }

    /// Every field's C offset (natural alignment) equals the Rust offset,
    /// and the C size equals the Rust size; returns the C size.
    fn check<R: DeviceRecord>() -> usize {
        let mut off = 0usize;
        let mut max_align = 1;
        for f in R::fields() {
            let (name, size, align) = c_field(f.c_decl);
            assert_eq!(name, f.name, "{}: C field name", R::C_NAME);
            off = off.div_ceil(align) * align;
            assert_eq!(off, f.offset, "{}.{}: C offset vs Rust", R::C_NAME, f.name);
            assert_eq!(size, f.size, "{}.{}: C size vs Rust", R::C_NAME, f.name);
            off += size;
            max_align = max_align.max(align);
        }
        let size = off.div_ceil(max_align) * max_align;
        assert_eq!(size, R::SIZE, "{}: C size vs Rust", R::C_NAME);
        size
    }

    #[test]
    fn every_record_has_the_same_layout_on_both_sides() {
        assert_eq!(check::<OxOperand>(), 16);
        assert_eq!(check::<OxStep>(), 16);
        assert_eq!(check::<OxChan>(), 16);
        assert_eq!(check::<OxConn>(), CONN_HEADER);
        assert_eq!(check::<OxSem>(), SEM_BYTES);
        assert_eq!(check::<OxError>(), 32);
        assert_eq!(check::<OxDesc>(), 1176);
        // Offsets the host relies on when it reads device memory.
        assert_eq!(std::mem::offset_of!(OxConn, head), 128);
        assert_eq!(std::mem::offset_of!(OxError, waited_ns), 24);
        assert_eq!(std::mem::offset_of!(OxDesc, chans), 664);
    }

    #[test]
    fn the_checker_catches_a_wrong_declaration() {
        // A C field one size too small shifts every later offset.
        let (_, size, _) = c_field("u32 first");
        assert_ne!(size, 8);
        let (name, size, align) = c_field("OxChan chans[OX_MAX_CHANNELS]");
        assert_eq!(
            (name.as_str(), size, align),
            ("chans", 16 * MAX_CHANNELS, 4)
        );
        let (_, size, align) = c_field("const volatile u32* abort_flag");
        assert_eq!((size, align), (8, 8));
    }

    #[test]
    fn the_header_declares_every_constant_and_field() {
        let h = header();
        for (name, value, _) in CONSTANTS {
            assert_eq!(
                h.matches(&format!("#define {name} {value}\n")).count(),
                1,
                "{name}"
            );
        }
        let names: Vec<&str> = CONSTANTS.iter().map(|c| c.0).collect();
        let mut dedup = names.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len(), "a constant named twice");
        for f in OxDesc::fields() {
            assert!(h.contains(&format!("  {};\n", f.c_decl)), "{}", f.name);
        }
        assert!(h.contains("static_assert(sizeof(OxDesc) == 1176,"));
    }

    #[test]
    fn records_serialize_at_their_offsets() {
        let s = OxStep {
            op: S_SWAP,
            nsrc: 2,
            ndst: 0,
            flags: F_POST,
            first: 0x0102_0304,
            len: 0x1122_3344_5566_7788,
        };
        let b = s.to_le_bytes();
        assert_eq!(b[std::mem::offset_of!(OxStep, flags)], F_POST);
        let at = std::mem::offset_of!(OxStep, len);
        assert_eq!(b[at..at + 8], 0x1122_3344_5566_7788u64.to_le_bytes());
        let o = OxOperand {
            kind: K_REMOTE,
            flags: F_PRE,
            buf: 0x0a0b,
            idx: 7,
            off: 9,
        };
        let b = o.to_le_bytes();
        let at = std::mem::offset_of!(OxOperand, buf);
        assert_eq!(b[at..at + 2], 0x0a0bu16.to_le_bytes());
        let at = std::mem::offset_of!(OxOperand, idx);
        assert_eq!(b[at..at + 4], 7u32.to_le_bytes());
        let mut rec = [0u8; 32];
        rec[8..12].copy_from_slice(&5u32.to_le_bytes());
        rec[24..32].copy_from_slice(&3_000_000u64.to_le_bytes());
        let e = OxError::from_le_bytes(&rec);
        assert_eq!((e.peer, e.waited_ns, e.code), (5, 3_000_000, 0));
        // The host's own record (relaunch mode) reads back as written.
        let mine = OxError {
            code: E_TIMEOUT,
            rank: 3,
            peer: 1,
            channel: 2,
            step: 41,
            awaited: 2,
            waited_ns: 7,
        };
        assert_eq!(OxError::from_le_bytes(&mine.to_le_bytes()), mine);
        assert_eq!(mine.to_le_bytes()[8..12], 1u32.to_le_bytes());
    }
}
