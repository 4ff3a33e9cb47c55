//! Buffers: memory a communicator's backend owns, and the argument types
//! collectives accept. The user-facing account is on [`Buffer`], [`In`]
//! and [`Out`] (this module is private).

use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use oxccl_core::Element;

use crate::backend::{Backend, RawBuf};
use crate::error::{Error, Result};

/// Memory of one rank, allocated by [`crate::Communicator::alloc`].
///
/// Host memory on the host backend, `cuMemAlloc` device memory on CUDA,
/// registered on both (so the registered one-shot, two-shot and all-pairs
/// plans may use it, as with `ncclMemAlloc`). It is reached through copies
/// ([`Buffer::copy_from_slice`], [`Buffer::to_vec`]; on CUDA ordered on the
/// rank's stream after work already issued) and, on the host backend,
/// zero-copy views borrowed mutably ([`Buffer::as_slice`],
/// [`Buffer::as_mut_slice`]); [`Buffer::slice`] takes a view at any element
/// offset.
///
/// Because no shared reference into it outlives a borrow of the buffer,
/// two views of one buffer may be passed to one call: that is how in-place
/// calls are written (`comm.all_reduce(&buf, &buf, op)`), and overlapping
/// views that are not NCCL's in-place layout are refused
/// ([`crate::Error::InvalidInPlace`]). A buffer is `Send` but not `Sync`:
/// one thread uses it at a time.
#[derive(Debug)]
pub struct Buffer<T: Element> {
    backend: Arc<dyn Backend>,
    clique: u64,
    rank: u32,
    raw: RawBuf,
    len: usize,
    /// `Cell<()>` makes the buffer `!Sync`; `T` ties it to its element type.
    _marker: PhantomData<(T, Cell<()>)>,
}

impl<T: Element> Buffer<T> {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        clique: u64,
        rank: u32,
        len: usize,
    ) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::Backend(format!("buffer of {len} elements overflows")))?;
        let raw = if bytes == 0 {
            RawBuf::NULL
        } else {
            backend.alloc(rank, bytes)?
        };
        Ok(Buffer {
            backend,
            clique,
            rank,
            raw,
            len,
            _marker: PhantomData,
        })
    }

    /// Length in elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The rank whose memory this is.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// A view of elements `range`. Panics if the range is out of bounds,
    /// as slice indexing does.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Slice<'_, T> {
        self.full().slice(range)
    }

    /// A view of the whole buffer.
    pub fn full(&self) -> Slice<'_, T> {
        Slice {
            buf: self,
            off: 0,
            len: self.len,
        }
    }

    /// Overwrites the buffer's start with `src` (which may be shorter).
    pub fn copy_from_slice(&self, src: &[T]) -> Result<()> {
        self.full().copy_from_slice(src)
    }

    /// Copies the buffer out.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.full().to_vec()
    }

    /// The buffer as a slice, without a copy, on backends whose memory the
    /// host addresses (the host backend); on CUDA an error (use
    /// [`Buffer::to_vec`]). Borrowing the buffer mutably keeps every call
    /// that could write it away while the view lives, and host calls are
    /// complete when they return, so the view never sees a write:
    ///
    /// ```
    /// # let comms = oxccl::init_all_with(1, oxccl::Config::builder()
    /// #     .backend(oxccl::BackendKind::Host).build().unwrap()).unwrap();
    /// # let c = &comms[0];
    /// let mut b = c.alloc::<f32>(4).unwrap();
    /// b.as_mut_slice().unwrap().fill(2.0);
    /// c.all_reduce_in_place(&b, oxccl::RedOp::Sum).unwrap();
    /// assert_eq!(b.as_slice().unwrap(), &[2.0; 4]);
    /// ```
    ///
    /// and a call while a view lives does not compile:
    ///
    /// ```compile_fail
    /// # let comms = oxccl::init_all(1).unwrap();
    /// # let c = &comms[0];
    /// let mut b = c.alloc::<f32>(4).unwrap();
    /// let view = b.as_slice().unwrap();
    /// c.all_reduce_in_place(&b, oxccl::RedOp::Sum).unwrap();
    /// println!("{}", view[0]);
    /// ```
    pub fn as_slice(&mut self) -> Result<&[T]> {
        let p = self.host_ptr()?;
        // SAFETY: `host_ptr` vouches that `raw` is host memory of this
        // process holding `len` initialised, aligned elements (zeroed at
        // allocation; any bit pattern is a valid `Element`); `&mut self`
        // excludes every other view and call on this buffer meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(p, self.len) })
    }

    /// The buffer as a mutable slice, without a copy (as [`Buffer::as_slice`]).
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        let p = self.host_ptr()?;
        // SAFETY: as in `as_slice`; the `&mut self` borrow makes this the
        // only access to the memory while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, self.len) })
    }

    /// The start of the memory, where the host may address it.
    fn host_ptr(&self) -> Result<*mut T> {
        if !self.backend.host_addressable() {
            return Err(Error::ForeignBuffer {
                what: "Buffer::as_slice",
                detail: format!(
                    "this buffer is {} memory, which the host cannot address; copy it with to_vec()/copy_from_slice()",
                    self.backend.kind()
                ),
            });
        }
        if self.len == 0 {
            return Ok(std::ptr::NonNull::dangling().as_ptr());
        }
        Ok(self.raw.addr as usize as *mut T)
    }
}

impl<T: Element> Drop for Buffer<T> {
    fn drop(&mut self) {
        if self.raw.bytes > 0 {
            // SAFETY: `raw` came from `alloc` on this backend for `rank`,
            // and every view borrows `self`, so nothing issued after this
            // point can name it. Work already enqueued on it may still run:
            // the backend's `free` reuses the memory only after that work
            // (and the peers' accesses within it) completed.
            unsafe { self.backend.free(self.rank, self.raw) };
        }
    }
}

/// A view of part of a [`Buffer`], at any element offset.
#[derive(Debug)]
pub struct Slice<'a, T: Element> {
    buf: &'a Buffer<T>,
    off: usize,
    len: usize,
}

impl<T: Element> Clone for Slice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Element> Copy for Slice<'_, T> {}

impl<'a, T: Element> Slice<'a, T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A sub-view, `range` relative to this view.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Slice<'a, T> {
        let lo = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let hi = match range.end_bound() {
            Bound::Included(&e) => e + 1,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        assert!(
            lo <= hi && hi <= self.len,
            "slice {lo}..{hi} out of range for a view of {} elements",
            self.len
        );
        Slice {
            buf: self.buf,
            off: self.off + lo,
            len: hi - lo,
        }
    }

    fn raw(&self) -> RawBuf {
        let es = std::mem::size_of::<T>();
        if self.len == 0 {
            return RawBuf {
                addr: self.buf.raw.addr + (self.off * es) as u64,
                bytes: 0,
            };
        }
        self.buf.raw.sub(self.off * es, self.len * es)
    }

    /// Address of the view's first element in the rank's address space:
    /// a `CUdeviceptr` on CUDA, a host pointer on the host backend. For
    /// handing the memory to another library (the sweep's NCCL baseline);
    /// using it is the caller's `unsafe` business.
    pub fn addr(&self) -> u64 {
        self.raw().addr
    }

    /// Overwrites the view's start with `src`.
    pub fn copy_from_slice(&self, src: &[T]) -> Result<()> {
        if src.len() > self.len {
            return Err(Error::TooLong {
                what: "source slice",
                max: self.len,
                got: src.len(),
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        let dst = self.slice(..src.len()).raw();
        // SAFETY: `Element` types are plain data (no padding, no
        // invariants), so viewing them as bytes is sound.
        let bytes = unsafe {
            std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), std::mem::size_of_val(src))
        };
        // SAFETY: `dst` lies inside the buffer's allocation, of this rank.
        unsafe { self.buf.backend.write(self.buf.rank, dst, bytes) }
    }

    /// Copies the view out.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.len];
        if self.len == 0 {
            return Ok(out);
        }
        // SAFETY: as in `copy_from_slice`; every bit pattern written by
        // the backend was produced from values of `T` or is zeroed memory,
        // and all-zero bytes are a valid value of every `Element` type.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(&out[..]),
            )
        };
        // SAFETY: the view lies inside the buffer's allocation, of this rank.
        unsafe { self.buf.backend.read(self.buf.rank, self.raw(), bytes)? };
        Ok(out)
    }
}

/// Where an argument's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    /// A user slice in host memory.
    Host,
    /// Backend memory of a clique's rank.
    Backend { clique: u64, rank: u32 },
    /// Memory the caller allocated, passed through a raw entry point
    /// (`raw.rs`); `registered` when it lies in a range the rank
    /// registered (so every rank may address it: direct plans apply).
    External { registered: bool },
}

/// A resolved argument: raw span, element count and memory space.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arg {
    pub space: Space,
    pub raw: RawBuf,
    pub len: usize,
}

/// A send (read-only) argument. Every entry point takes `impl Into<In<T>>`,
/// so any of these can be passed as it is:
///
/// | you pass | backends |
/// | --- | --- |
/// | `&Buffer<T>` (the whole buffer), `Slice<T>` or `&Slice<T>` | all |
/// | `&[T]`, `&Vec<T>`, `&[T; N]` | host only: not registered, so only FIFO plans; CUDA refuses them with [`crate::Error::ForeignBuffer`] |
///
/// ```
/// # let comms = oxccl::init_all_with(1, oxccl::Config::builder()
/// #     .backend(oxccl::BackendKind::Host).build().unwrap()).unwrap();
/// # let c = &comms[0];
/// let send = vec![1.0f32; 4];
/// let mut recv = vec![0.0f32; 4];
/// c.all_reduce(&send, &mut recv, oxccl::RedOp::Sum).unwrap(); // &Vec<f32>, &mut Vec<f32>
/// assert_eq!(recv, send);
/// ```
#[derive(Debug)]
pub struct In<'a, T> {
    pub(crate) arg: Arg,
    _marker: PhantomData<&'a [T]>,
}

/// A receive argument. Every entry point takes `impl Into<Out<T>>`:
///
/// | you pass | backends |
/// | --- | --- |
/// | `&Buffer<T>` (the whole buffer), `Slice<T>` or `&Slice<T>` | all |
/// | `&mut [T]`, `&mut Vec<T>`, `&mut [T; N]` | host only (as for [`In`]) |
///
/// The same buffer may be both [`In`] and `Out` of one call (in place);
/// plain slices cannot, as the borrow checker keeps them disjoint: use the
/// `*_in_place` methods for those.
#[derive(Debug)]
pub struct Out<'a, T> {
    pub(crate) arg: Arg,
    _marker: PhantomData<&'a mut [T]>,
}

fn slice_arg<T: Element>(s: &Slice<'_, T>) -> Arg {
    Arg {
        space: Space::Backend {
            clique: s.buf.clique,
            rank: s.buf.rank,
        },
        raw: s.raw(),
        len: s.len,
    }
}

fn host_arg<T>(ptr: *const T, len: usize) -> Arg {
    Arg {
        space: Space::Host,
        raw: RawBuf {
            addr: ptr as usize as u64,
            bytes: len * std::mem::size_of::<T>(),
        },
        len,
    }
}

macro_rules! arg_from {
    ($ty:ident) => {
        impl<'a, T: Element> From<Slice<'a, T>> for $ty<'a, T> {
            fn from(s: Slice<'a, T>) -> Self {
                $ty {
                    arg: slice_arg(&s),
                    _marker: PhantomData,
                }
            }
        }
        impl<'a, T: Element> From<&'a Slice<'a, T>> for $ty<'a, T> {
            fn from(s: &'a Slice<'a, T>) -> Self {
                (*s).into()
            }
        }
        impl<'a, T: Element> From<&'a Buffer<T>> for $ty<'a, T> {
            fn from(b: &'a Buffer<T>) -> Self {
                b.full().into()
            }
        }
    };
}
arg_from!(In);
arg_from!(Out);

impl<'a, T: Element> From<&'a [T]> for In<'a, T> {
    fn from(s: &'a [T]) -> Self {
        In {
            arg: host_arg(s.as_ptr(), s.len()),
            _marker: PhantomData,
        }
    }
}
impl<'a, T: Element> From<&'a Vec<T>> for In<'a, T> {
    fn from(s: &'a Vec<T>) -> Self {
        s.as_slice().into()
    }
}
impl<'a, T: Element, const N: usize> From<&'a [T; N]> for In<'a, T> {
    fn from(s: &'a [T; N]) -> Self {
        s.as_slice().into()
    }
}
impl<'a, T: Element> From<&'a mut [T]> for Out<'a, T> {
    fn from(s: &'a mut [T]) -> Self {
        Out {
            arg: host_arg(s.as_mut_ptr(), s.len()),
            _marker: PhantomData,
        }
    }
}
impl<'a, T: Element> From<&'a mut Vec<T>> for Out<'a, T> {
    fn from(s: &'a mut Vec<T>) -> Self {
        s.as_mut_slice().into()
    }
}
impl<'a, T: Element, const N: usize> From<&'a mut [T; N]> for Out<'a, T> {
    fn from(s: &'a mut [T; N]) -> Self {
        s.as_mut_slice().into()
    }
}

impl<'a, T> In<'a, T> {
    /// A raw argument (the caller's `unsafe` contract covers the memory).
    pub(crate) fn from_arg(arg: Arg) -> Self {
        In {
            arg,
            _marker: PhantomData,
        }
    }

    /// Elements in the argument.
    pub(crate) fn len(&self) -> usize {
        self.arg.len
    }

    /// `len` elements from element `off` (the caller checked the range).
    pub(crate) fn part(&self, off: usize, len: usize, es: usize) -> In<'a, T> {
        In {
            arg: part_of(&self.arg, off, len, es),
            _marker: PhantomData,
        }
    }

    /// Whether the two arguments share memory.
    pub(crate) fn overlaps(&self, o: &Out<'_, T>) -> bool {
        let (a, b) = (self.arg.raw, o.arg.raw);
        self.arg.space == o.arg.space
            && a.bytes > 0
            && b.bytes > 0
            && a.addr < b.end()
            && b.addr < a.end()
    }
}

/// `len` elements of `arg` from element `off`.
fn part_of(arg: &Arg, off: usize, len: usize, es: usize) -> Arg {
    Arg {
        space: arg.space,
        raw: arg.raw.sub(off * es, len * es),
        len,
    }
}

impl<'a, T> Out<'a, T> {
    /// A raw argument (the caller's `unsafe` contract covers the memory).
    pub(crate) fn from_arg(arg: Arg) -> Self {
        Out {
            arg,
            _marker: PhantomData,
        }
    }

    /// Elements in the argument.
    pub(crate) fn len(&self) -> usize {
        self.arg.len
    }

    /// `len` elements from element `off` (the caller checked the range).
    pub(crate) fn part(&self, off: usize, len: usize, es: usize) -> Out<'a, T> {
        Out {
            arg: part_of(&self.arg, off, len, es),
            _marker: PhantomData,
        }
    }

    /// Block `i` of `n` equal blocks (in-place AllGather's send buffer).
    pub(crate) fn block(&self, i: usize, n: usize, es: usize) -> Result<In<'a, T>> {
        Ok(In {
            arg: block_of(&self.arg, i, n, es)?,
            _marker: PhantomData,
        })
    }

    /// Block `i` of `n` as a receive argument (in-place ReduceScatter).
    pub(crate) fn block_out(&self, i: usize, n: usize, es: usize) -> Result<Out<'a, T>> {
        Ok(Out {
            arg: block_of(&self.arg, i, n, es)?,
            _marker: PhantomData,
        })
    }

    /// The same memory as a send argument, for in-place forms. The
    /// returned value is only used while `self` is, inside one call.
    pub(crate) fn as_in(&self) -> In<'a, T> {
        In {
            arg: self.arg,
            _marker: PhantomData,
        }
    }
}

fn block_of(arg: &Arg, i: usize, n: usize, es: usize) -> Result<Arg> {
    if !arg.len.is_multiple_of(n) {
        return Err(Error::NotMultiple {
            what: "in-place buffer",
            len: arg.len,
            nranks: n as u32,
        });
    }
    let len = arg.len / n;
    Ok(Arg {
        space: arg.space,
        raw: RawBuf {
            addr: arg.raw.addr + (i * len * es) as u64,
            bytes: len * es,
        },
        len,
    })
}
