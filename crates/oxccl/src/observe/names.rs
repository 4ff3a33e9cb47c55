//! NCCL's names for calls, types and operations, as its tools print them.

use oxccl_core::{CollKind, DataType, RedOp};

use super::Func;

pub(super) fn func(f: Func) -> &'static str {
    match f {
        Func::Coll(k) => match k {
            CollKind::AllReduce => "ncclAllReduce",
            CollKind::Broadcast => "ncclBroadcast",
            CollKind::Reduce => "ncclReduce",
            CollKind::AllGather => "ncclAllGather",
            CollKind::ReduceScatter => "ncclReduceScatter",
            CollKind::AllToAll => "ncclAlltoAll",
            CollKind::Gather => "ncclGather",
            CollKind::Scatter => "ncclScatter",
            CollKind::SendRecv => "ncclSendRecv",
        },
        Func::Send => "ncclSend",
        Func::Recv => "ncclRecv",
        Func::GroupStart => "ncclGroupStart",
        Func::GroupEnd => "ncclGroupEnd",
        Func::CommInitRank => "ncclCommInitRank",
        Func::CommInitAll => "ncclCommInitAll",
        Func::CommSplit => "ncclCommSplit",
        Func::CommShrink => "ncclCommShrink",
        Func::CommDestroy => "ncclCommDestroy",
        Func::CommAbort => "ncclCommAbort",
    }
}

/// The `ncclDataType_t` enumerator's name.
pub fn nccl_dtype(d: DataType) -> &'static str {
    match d {
        DataType::I8 => "ncclInt8",
        DataType::U8 => "ncclUint8",
        DataType::I32 => "ncclInt32",
        DataType::U32 => "ncclUint32",
        DataType::I64 => "ncclInt64",
        DataType::U64 => "ncclUint64",
        DataType::F16 => "ncclFloat16",
        DataType::F32 => "ncclFloat32",
        DataType::F64 => "ncclFloat64",
        DataType::Bf16 => "ncclBfloat16",
        DataType::F8E4M3 => "ncclFloat8e4m3",
        DataType::F8E5M2 => "ncclFloat8e5m2",
    }
}

/// The `ncclRedOp_t` enumerator's name.
pub fn nccl_op(o: RedOp) -> &'static str {
    match o {
        RedOp::Sum => "ncclSum",
        RedOp::Prod => "ncclProd",
        RedOp::Max => "ncclMax",
        RedOp::Min => "ncclMin",
        RedOp::Avg => "ncclAvg",
        RedOp::PreMulSum(_) | RedOp::PreMulSumDevice(_) => "ncclPreMulSum",
    }
}

/// The name NCCL's profiler gives a collective (`AllReduce`).
pub(crate) fn profiler_func(k: CollKind) -> &'static str {
    &func(Func::Coll(k))[4..]
}
