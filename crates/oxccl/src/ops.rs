//! Operations next to the collectives: a barrier, and the PreMulSum op
//! whose scalar lives in backend memory.

use oxccl_core::{Element, RedOp};

use crate::backend::{RawBuf, RawStream};
use crate::buffer::Buffer;
use crate::check::Call;
use crate::comm::Communicator;
use crate::error::{Error, Result};

impl Communicator {
    /// Returns once every rank has reached its `barrier` and the work each
    /// rank issued before it has completed (each rank waits for its own
    /// stream, then for the others' arrival; on the host backend only the
    /// arrival). Every rank must call it, in the same place among its
    /// calls (a rank calling a collective instead is a mismatch on both).
    /// Bounded by the deadline like every wait.
    pub fn barrier(&self) -> Result<()> {
        self.synchronize()?;
        if self.nranks() == 1 {
            return Ok(());
        }
        let mut seq = self.call_lock();
        self.agree(&mut seq, Call::Barrier, true, 0).map(drop)
    }

    /// NCCL's `ncclRedOpCreatePreMulSum` with the scalar in memory
    /// (`ncclScalarDevice`): the op multiplying this rank's input by the
    /// first element of `scalar` before the sum. The value is read when
    /// this is called, in stream order (after the work already issued on
    /// this rank, so a scalar computed by earlier work is seen), which on
    /// CUDA waits for that work; read it once per value, not per call.
    pub fn premul_sum_op<T: Element>(&self, scalar: &Buffer<T>) -> Result<RedOp> {
        self.check_usable()?;
        if scalar.is_empty() {
            return Err(Error::LengthMismatch {
                what: "PreMulSum scalar buffer",
                expected: 1,
                got: 0,
            });
        }
        let v = scalar.slice(0..1).to_vec()?[0].to_f64();
        let op = RedOp::PreMulSum(v);
        crate::validate::check_op(op, T::DTYPE)?;
        Ok(op)
    }

    /// Whether a [`RedOp::PreMulSumDevice`] op can be given to this
    /// communicator's raw calls: its kernels read the scalar themselves
    /// when the call runs (CUDA with kernels on the device). Where not (the
    /// host backend, CUDA processes staged through the host), read the
    /// value ([`Communicator::read_raw`]) and pass [`RedOp::PreMulSum`].
    pub fn reads_device_scalars(&self) -> bool {
        self.clique().backend.reads_device_scalars()
    }

    /// Reads `dst.len()` bytes at `addr` (device memory of this rank's
    /// device on CUDA, host memory on the host backend) after the work
    /// issued so far on `stream` has completed, which this waits for: the
    /// C ABI's read of an `ncclScalarDevice` scalar at each call. Refused,
    /// with nothing changed, on a stream being captured into a graph.
    ///
    /// # Safety
    /// `addr` holds `dst.len()` bytes this rank may read; `stream` as in
    /// [`Communicator::collective_raw`].
    pub unsafe fn read_raw(&self, stream: RawStream, addr: u64, dst: &mut [u8]) -> Result<()> {
        let raw = RawBuf {
            addr,
            bytes: dst.len(),
        };
        let backend = &self.clique().backend;
        // SAFETY: caller's contract (memory and stream).
        unsafe { self.on_stream(stream, || backend.read(self.rank(), raw, dst)) }
    }
}
