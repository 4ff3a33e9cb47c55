//! The sweep's buffers: per data type, every rank's two buffers,
//! allocated once at the sweep's largest size (plus the check's guard) so
//! that no row allocates device memory while peers' kernels spin.

use anyhow::Context;
use oxccl::{Buffer, Communicator, DataType, Element};

use super::check;
use super::external::{self, Memory};

/// Per data type, every rank's two buffers (main and out-of-place output),
/// allocated once at the sweep's largest size plus the check's guard.
#[derive(Default)]
pub(crate) struct Pools(
    std::collections::HashMap<DataType, Box<dyn std::any::Any>>,
    /// The mirrors' registrations, by communicator index: ended before
    /// their memory is dropped.
    Vec<(usize, oxccl::Registration)>,
);

/// One rank's sweep buffers: the call's input (and in place its output)
/// lies in `main`, an out-of-place output in `other`; with `--memory
/// external` the calls run on `mirror`'s copies of both instead.
pub(crate) struct RankBufs<T: Element> {
    pub(crate) main: Buffer<T>,
    pub(crate) other: Buffer<T>,
    pub(crate) mirror: Option<external::Mirror>,
    /// Whether this row's calls run on `mirror`.
    pub(crate) external: bool,
}

/// One data type's buffers, by rank.
pub(crate) type Pool<T> = Vec<Option<RankBufs<T>>>;

impl Pools {
    /// [`Pools::get`] for calls on `memory`: external memory mirrors the
    /// buffers (allocated and registered on first use).
    pub(crate) fn get_for<T: Element>(
        &mut self,
        comms: &[Communicator],
        elems: usize,
        memory: Memory,
    ) -> anyhow::Result<&mut Pool<T>> {
        let pool = self.get::<T>(comms, elems)?;
        let external = memory == Memory::External;
        let mut regs = Vec::new();
        for (i, (c, slot)) in comms.iter().zip(pool.iter_mut()).enumerate() {
            let b = slot.as_mut().context("sweep buffers missing")?;
            if external && b.mirror.is_none() {
                let at = [b.main.full().addr(), b.other.full().addr()];
                let bytes = b.main.len() * T::DTYPE.size();
                let (m, r) = external::Mirror::new(c, at, bytes)?;
                b.mirror = Some(m);
                regs.extend(r.into_iter().map(|r| (i, r)));
            }
            b.external = external;
        }
        self.1.extend(regs);
        self.get::<T>(comms, elems)
    }

    /// Ends every mirror's registrations (their calls are complete: each
    /// row synchronizes).
    pub(crate) fn release(&mut self, comms: &[Communicator]) -> anyhow::Result<()> {
        for (i, r) in self.1.drain(..) {
            comms[i].deregister(r)?;
        }
        Ok(())
    }

    pub(crate) fn get<T: Element>(
        &mut self,
        comms: &[Communicator],
        elems: usize,
    ) -> anyhow::Result<&mut Pool<T>> {
        if !self.0.contains_key(&T::DTYPE) {
            // Drop other types' buffers first: only one type runs at a time.
            self.release(comms)?;
            self.0.clear();
            let pool: Pool<T> = comms
                .iter()
                .map(|c| {
                    // Room for the check's guard past the largest output.
                    let len = elems + check::GUARD;
                    Ok(Some(RankBufs {
                        main: c.alloc::<T>(len)?,
                        other: c.alloc::<T>(len)?,
                        mirror: None,
                        external: false,
                    }))
                })
                .collect::<oxccl::Result<_>>()?;
            self.0.insert(T::DTYPE, Box::new(pool));
        }
        self.0
            .get_mut(&T::DTYPE)
            .and_then(|b| b.downcast_mut::<Pool<T>>())
            .context("sweep buffer pool of the wrong type")
    }
}
