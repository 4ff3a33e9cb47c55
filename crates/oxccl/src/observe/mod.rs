//! What tools outside the library see of its calls: NVTX ranges for
//! profilers such as Nsight Systems ([`range`]), NCCL's profiler plugins
//! (`profiler`), and the step trace (`trace`).
//!
//! Tools are found once per process, at the first call that would report
//! to them, from the settings table's variables (`NVTX_INJECTION64_PATH`,
//! `NCCL_NVTX_DISABLE`). With no tool attached a range costs one branch.
//! One range is made per outermost API call on a thread: a Rust entry
//! point reached from a C entry point that already opened a range (a
//! collective inside `ncclGroupEnd`, say) opens none of its own.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::OnceLock;

use oxccl_core::{CollKind, DataType, RedOp};

use crate::settings::Environment;

mod names;
mod nvtx;
pub(crate) mod profiler;
mod trace;

pub(crate) use trace::{CallTrace, Tracer};

pub use names::{nccl_dtype, nccl_op};

/// An API call as NCCL names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    Coll(CollKind),
    Send,
    Recv,
    GroupStart,
    GroupEnd,
    CommInitRank,
    CommInitAll,
    CommSplit,
    CommShrink,
    CommDestroy,
    CommAbort,
}

impl Func {
    /// NCCL's function name (`ncclAllReduce`).
    pub fn nccl_name(self) -> &'static str {
        names::func(self)
    }
}

/// What a call is about, for the tools: all optional but the
/// communicator's identity.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Args {
    pub count: Option<usize>,
    pub dtype: Option<DataType>,
    pub op: Option<RedOp>,
    /// Root of a rooted collective.
    pub root: Option<u32>,
    /// Peer of a Send/Recv.
    pub peer: Option<u32>,
    /// The communicator's identity (equal on every rank of it).
    pub comm: u64,
    pub rank: u32,
    pub nranks: u32,
}

impl Args {
    /// A collective's arguments on the communicator `base` describes
    /// ([`crate::Communicator::tool_args`]): `count` as NCCL counts it
    /// (per rank), the op of reductions, the root of rooted collectives.
    pub fn coll(
        base: Args,
        kind: CollKind,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: u32,
    ) -> Args {
        Args {
            count: Some(count),
            dtype: Some(dtype),
            op: kind.is_reduction().then_some(op),
            root: kind.has_root().then_some(root),
            ..base
        }
    }

    /// NVTX's message: the name, then each field that is set.
    fn message(&self, func: Func) -> String {
        use std::fmt::Write;
        let mut m = String::from(func.nccl_name());
        if let Some(c) = self.count {
            let _ = write!(m, " count={c}");
        }
        if let Some(d) = self.dtype {
            let _ = write!(m, " datatype={}", nccl_dtype(d));
        }
        if let Some(o) = self.op {
            let _ = write!(m, " op={}", nccl_op(o));
        }
        if let Some(r) = self.root {
            let _ = write!(m, " root={r}");
        }
        if let Some(p) = self.peer {
            let _ = write!(m, " peer={p}");
        }
        if self.comm != 0 {
            let _ = write!(m, " comm={:#x}", self.comm);
        }
        if self.nranks > 0 {
            let _ = write!(m, " rank={} nranks={}", self.rank, self.nranks);
        }
        m
    }
}

/// The tools attached to this process.
#[derive(Debug)]
struct Tools {
    nvtx: Option<nvtx::Nvtx>,
    profiler: Option<profiler::Plugin>,
}

static TOOLS: OnceLock<Tools> = OnceLock::new();

fn tools() -> &'static Tools {
    TOOLS.get_or_init(|| {
        let env = Environment::capture();
        Tools {
            nvtx: attach_nvtx(&env),
            profiler: profiler::Plugin::load(env.get("NCCL_PROFILER_PLUGIN").as_deref()),
        }
    })
}

/// What this process reports to, in a few words (`NVTX tool attached`,
/// `NVTX off (NCCL_NVTX_DISABLE)`, `no NVTX tool`; then the profiler
/// plugin's state), for benchmarks to print beside their figures: the
/// first call attaches the tools as any API call would.
pub fn tools_summary() -> String {
    let env = Environment::capture();
    let t = tools();
    let nvtx = if t.nvtx.is_some() {
        "NVTX tool attached"
    } else if nvtx_disabled(env.get("NCCL_NVTX_DISABLE").as_deref()) {
        "NVTX off (NCCL_NVTX_DISABLE)"
    } else {
        "NVTX on, no tool attached"
    };
    let prof = if t.profiler.is_some() {
        "profiler plugin loaded"
    } else {
        "no profiler plugin"
    };
    format!("{nvtx}, {prof}")
}

/// The profiler plugin's context for rank `rank` of `nranks` of the
/// communicator `comm` (its identity), if a plugin is attached and takes
/// it.
pub(crate) fn profiler_ctx(comm: u64, nranks: u32, rank: u32) -> Option<profiler::Ctx> {
    let plugin = tools().profiler.as_ref()?;
    profiler::Ctx::new(plugin, comm, nranks, rank)
}

/// The NVTX tool `NVTX_INJECTION64_PATH` names, unless
/// `NCCL_NVTX_DISABLE=1`; a tool that fails to attach is a warning.
fn attach_nvtx(env: &Environment) -> Option<nvtx::Nvtx> {
    let path = env.get("NVTX_INJECTION64_PATH").filter(|p| !p.is_empty())?;
    if nvtx_disabled(env.get("NCCL_NVTX_DISABLE").as_deref()) {
        return None;
    }
    nvtx::Nvtx::attach(&path)
        .inspect_err(|why| {
            tracing::warn!("oxccl: NVTX tool {path:?} not attached: {why}; no ranges")
        })
        .ok()
}

/// `NCCL_NVTX_DISABLE`'s value: anything but unset, empty or 0 disables.
fn nvtx_disabled(v: Option<&str>) -> bool {
    v.is_some_and(|v| !matches!(v.trim(), "" | "0"))
}

thread_local! {
    /// Ranges this thread has open (only the outermost is made).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// An open NVTX range, closed when dropped (on the thread that opened it).
#[derive(Debug)]
#[must_use = "the range closes when this is dropped"]
pub struct Range {
    open: bool,
    _thread: PhantomData<*const ()>,
}

/// Opens the range of `func` with the arguments `args` builds (built only
/// where a tool listens).
pub fn range(func: Func, args: impl FnOnce() -> Args) -> Range {
    let Some(n) = tools().nvtx.as_ref() else {
        return Range {
            open: false,
            _thread: PhantomData,
        };
    };
    let outer = DEPTH.with(|d| {
        let v = d.get();
        d.set(v + 1);
        v == 0
    });
    if outer {
        let a = args();
        n.push(&a.message(func), a.count.unwrap_or(0) as u64);
    }
    Range {
        open: outer,
        _thread: PhantomData,
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        let Some(n) = TOOLS.get().and_then(|t| t.nvtx.as_ref()) else {
            return;
        };
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        if self.open {
            n.pop();
        }
    }
}

/// A range that ends at once (NCCL's `ncclGroupStart`).
pub fn mark(func: Func, args: impl FnOnce() -> Args) {
    drop(range(func, args));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvtx_disable_reads_as_nccl() {
        assert!(!nvtx_disabled(None));
        assert!(!nvtx_disabled(Some("0")));
        assert!(!nvtx_disabled(Some("")));
        assert!(nvtx_disabled(Some("1")));
    }

    #[test]
    fn messages_name_the_call_and_its_arguments() {
        let a = Args {
            count: Some(1024),
            dtype: Some(DataType::F32),
            op: Some(RedOp::Sum),
            comm: 0xab,
            rank: 1,
            nranks: 4,
            ..Args::default()
        };
        assert_eq!(
            a.message(Func::Coll(CollKind::AllReduce)),
            "ncclAllReduce count=1024 datatype=ncclFloat32 op=ncclSum comm=0xab rank=1 nranks=4"
        );
        assert_eq!(Args::default().message(Func::GroupEnd), "ncclGroupEnd");
    }
}
