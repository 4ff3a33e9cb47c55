//! The last program a rank compiled, reused while the call repeats.
//!
//! Lowering a plan allocates (every channel's steps, every transfer's
//! operand lists, the connection table) and a repeated call, the common
//! case, lowers the same plan over the same buffers each time. A rank
//! keeps its last [`Program`] with what it was made from, and reuses it
//! when a call brings the same plan (compared by value, so a plan freed
//! and another made at its address is never mistaken for it), the same
//! buffers and the same element size. One entry only: compiling anything
//! else may move the rank's scratch, which the kept program addresses,
//! so every compile replaces it.

use oxccl_core::plan::RankPlan;

use crate::compile::{compile, Program, Scratch};
use crate::error::HostError;
use crate::view::FabricView;
use crate::HostBuf;

/// A rank's last program and its inputs.
#[derive(Debug, Default)]
pub(crate) struct ProgramCache {
    last: Option<Entry>,
    /// Programs compiled (misses): for tests and diagnostics.
    compiles: u64,
}

#[derive(Debug)]
struct Entry {
    plan: RankPlan,
    bufs: Vec<HostBuf>,
    elem: usize,
    prog: Program,
}

impl ProgramCache {
    /// The program for `plan` over `bufs`: the kept one when it was made
    /// from the same inputs (checks included: same inputs, same verdict),
    /// else a fresh compile, which is kept in its place. A failed compile
    /// keeps nothing.
    pub(crate) fn get(
        &mut self,
        fab: &impl FabricView,
        plan: &RankPlan,
        bufs: &[HostBuf],
        elem: usize,
        scratch: &mut Scratch,
    ) -> Result<&Program, HostError> {
        let hit = self
            .last
            .as_ref()
            .is_some_and(|e| e.elem == elem && e.bufs == bufs && e.plan == *plan);
        if !hit {
            // Drop the old entry first: it may address scratch this compile moves.
            self.last = None;
            let prog = compile(fab, plan, bufs, elem, scratch)?;
            self.compiles += 1;
            self.last = Some(Entry {
                plan: plan.clone(),
                bufs: bufs.to_vec(),
                elem,
                prog,
            });
        }
        Ok(&self.last.as_ref().expect("kept above").prog)
    }

    /// Programs compiled so far (calls that found none to reuse).
    #[cfg(test)]
    pub(crate) fn compiles(&self) -> u64 {
        self.compiles
    }
}

#[cfg(test)]
mod tests {
    use oxccl_core::plan::{BufRole, Plan};
    use oxccl_core::{generate, Algo, CollKind, Collective, DataType, PlanRequest, RedOp};

    use crate::{HostBuf, HostConfig, HostError, HostFabric};

    fn plan(count: usize) -> Plan {
        let req = PlanRequest::new(
            Collective::new(CollKind::AllReduce, count, 0),
            1,
            Algo::Ring,
        );
        generate(&req).expect("a one-rank ring AllReduce")
    }

    /// Runs rank 0's part of `plan` from `send` into `recv`.
    fn run(fab: &HostFabric, plan: &Plan, send: &[f32], recv: &mut [f32]) -> Result<(), HostError> {
        let rp = &plan.ranks[0];
        let (send, recv) = (HostBuf::from_slice(send), HostBuf::from_mut_slice(recv));
        let bufs: Vec<HostBuf> = rp
            .bufs
            .iter()
            .filter_map(|b| match b.role {
                BufRole::Input => Some(send),
                BufRole::Output => Some(recv),
                BufRole::Scratch => None,
            })
            .collect();
        let op = RedOp::Sum.lower(DataType::F32, 1);
        // SAFETY: both slices outlive the call; `recv` is borrowed mutably.
        unsafe { fab.execute(rp, &bufs, DataType::F32, &op) }.map(|_| ())
    }

    #[test]
    fn a_repeated_call_reuses_its_program_and_anything_else_compiles() {
        let fab = HostFabric::new(1, HostConfig::default());
        let p4 = plan(4);
        let mut send = [1.0f32, 2.0, 3.0, 4.0];
        let mut recv = [0.0f32; 4];
        run(&fab, &p4, &send, &mut recv).unwrap();
        assert_eq!(recv, send);
        assert_eq!(fab.programs_compiled(0), 1);
        // Same plan, same buffers: reused, and it still reads the input.
        send[0] = 9.0;
        run(&fab, &p4, &send, &mut recv).unwrap();
        assert_eq!(recv, [9.0, 2.0, 3.0, 4.0]);
        assert_eq!(fab.programs_compiled(0), 1);
        // Another output buffer: compiled, and written there.
        let mut other = [0.0f32; 4];
        run(&fab, &p4, &send, &mut other).unwrap();
        assert_eq!(other, [9.0, 2.0, 3.0, 4.0]);
        assert_eq!(fab.programs_compiled(0), 2);
        // An equal plan made anew is the same plan: reused.
        run(&fab, &plan(4), &send, &mut other).unwrap();
        assert_eq!(fab.programs_compiled(0), 2);
        // Another plan over the same buffers: compiled.
        other = [0.0; 4];
        run(&fab, &plan(2), &send, &mut other).unwrap();
        assert_eq!(other, [9.0, 2.0, 0.0, 0.0]);
        assert_eq!(fab.programs_compiled(0), 3);
    }

    #[test]
    fn a_refused_call_keeps_no_program() {
        let fab = HostFabric::new(1, HostConfig::default());
        let p4 = plan(4);
        let send = [1.0f32; 4];
        let mut recv = [0.0f32; 4];
        run(&fab, &p4, &send, &mut recv).unwrap();
        // Too short an output: refused, nothing written, nothing kept ...
        let mut short = [0.0f32; 2];
        assert!(run(&fab, &p4, &send, &mut short[..]).is_err());
        assert_eq!(short, [0.0; 2]);
        // ... so the first call compiles again rather than reusing.
        recv = [0.0; 4];
        run(&fab, &p4, &send, &mut recv).unwrap();
        assert_eq!(recv, [1.0; 4]);
        assert_eq!(fab.programs_compiled(0), 2);
    }
}
