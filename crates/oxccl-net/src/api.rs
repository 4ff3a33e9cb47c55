//! The transport interface, shaped like NCCL's network plugin API
//! (`ncclNet_v8`): devices and their properties, listen/connect/accept,
//! memory registration, and non-blocking isend/irecv completed by test.
//!
//! Communicators, requests and registrations are opaque ids, as NCCL's
//! `void*` handles are, so the trait is object-safe (`dyn Net`) and an
//! adapter over a C plugin maps pointers to ids one to one. What differs
//! from v8 and why is in the crate's docs (`NET.md`).

use std::fmt::Debug;
use std::time::Duration;

use crate::error::NetError;

/// Most bytes a listen handle may take (NCCL's `NCCL_NET_HANDLE_MAXSIZE`):
/// what the layer above exchanges over the bootstrap for every listener.
pub const HANDLE_BYTES: usize = 128;

/// A listener's handle as the layer above carries it: opaque bytes, of
/// which each transport reads its own layout (TCP its [`crate::wire::Handle`],
/// a plugin whatever it wrote).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NetHandle(pub [u8; HANDLE_BYTES]);

impl NetHandle {
    /// The handle in `bytes`, which must be exactly [`HANDLE_BYTES`] long.
    pub fn from_bytes(bytes: &[u8]) -> Result<NetHandle, NetError> {
        bytes.try_into().map(NetHandle).map_err(|_| {
            NetError::InvalidArgument(format!(
                "a network handle is {HANDLE_BYTES} bytes, not {}",
                bytes.len()
            ))
        })
    }
}

impl Debug for NetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(f, "NetHandle({used} bytes)")
    }
}

macro_rules! id {
    ($($(#[$m:meta])* $name:ident),*) => {$(
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $name(pub u64);
    )*};
}

id!(
    /// A listening endpoint (NCCL's `listenComm`).
    ListenComm,
    /// The sending end of a connection (NCCL's `sendComm`).
    SendComm,
    /// The receiving end of a connection (NCCL's `recvComm`).
    RecvComm,
    /// A pending isend or irecv (NCCL's `request`).
    Request,
    /// A memory registration (NCCL's `mhandle`).
    MemHandle
);

/// Either end of a connection, for registrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Comm {
    Send(SendComm),
    Recv(RecvComm),
}

/// Where registered memory lives (NCCL's `NCCL_PTR_HOST`/`NCCL_PTR_CUDA`;
/// DMA-BUF registrations need a file descriptor from the CUDA driver and
/// are not made: CUDA memory is registered by pointer, or staged).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    Host,
    Cuda,
}

/// Memory to register: `len` bytes at `ptr`, of kind `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub ptr: *mut u8,
    pub len: usize,
    pub kind: MemKind,
}

impl Region {
    /// `len` bytes of host memory at `ptr`.
    pub fn host(ptr: *mut u8, len: usize) -> Region {
        Region {
            ptr,
            len,
            kind: MemKind::Host,
        }
    }
}

/// Bytes a request reads or writes: `len` bytes at `ptr`, inside the
/// registration `mr` (an isend only reads them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf {
    pub ptr: *mut u8,
    pub len: usize,
    pub mr: MemHandle,
}

impl Buf {
    pub fn new(ptr: *mut u8, len: usize, mr: MemHandle) -> Buf {
        Buf { ptr, len, mr }
    }
}

/// What posting a request answers: the request, `None` for "not now"
/// (post it again later), or the error that failed the connection.
pub type Posted = Result<Option<Request>, NetError>;

/// What a device is and can do (NCCL's `ncclNetProperties_v8_t`).
#[derive(Clone, Debug, PartialEq)]
pub struct Properties {
    /// The interface's name (`eth0`, `lo`, `mlx5_0`).
    pub name: String,
    /// The PCI path of the NIC in sysfs, where there is one (the topology
    /// places NICs by it).
    pub pci_path: Option<String>,
    /// A globally unique id of the NIC (several devices of one NIC share it).
    pub guid: u64,
    /// Which memory isend/irecv accept without staging.
    pub ptr_host: bool,
    pub ptr_cuda: bool,
    /// Whether CUDA memory may be registered through a DMA-BUF descriptor.
    pub ptr_dmabuf: bool,
    /// Whether every receive into CUDA memory must be flushed.
    pub force_flush: bool,
    /// Whether one registration serves every connection.
    pub reg_is_global: bool,
    /// Link speed in Mb/s (NCCL's `speed`), 0 where unknown.
    pub speed_mbps: u32,
    pub port: u16,
    /// Expected one-way latency, for the cost model.
    pub latency: Duration,
    /// Most connections the device sustains.
    pub max_comms: usize,
    /// Most buffers one irecv may take (NCCL's grouped receives).
    pub max_recvs: usize,
}

/// A network transport: NCCL's `ncclNet_v8` as a Rust trait.
///
/// The calls never block for long: `connect` and `accept` may answer
/// `None` (call again, as NCCL's `*sendComm == NULL`), `isend`/`irecv` may
/// answer `None` when the transport cannot take more requests now, and
/// `test` reports completion. Errors are typed and name the connection;
/// the layer above adds the rank, peer, channel and step.
pub trait Net: Send + Sync + Debug {
    /// The transport's name as NCCL logs it (`Socket`, `IB`, a plugin's).
    fn name(&self) -> &str;

    /// Whether the transport calls a waker when a request completes
    /// (`TcpNet` does): if not, whoever waits on it must keep calling
    /// `test`, as NCCL's proxy polls a plugin.
    fn wakes(&self) -> bool {
        false
    }

    /// How many devices (NICs) there are.
    fn devices(&self) -> usize;

    fn properties(&self, dev: usize) -> Result<Properties, NetError>;

    /// Starts listening on device `dev`: the handle goes to the peer out of
    /// band, the listen comm stays here for `accept`.
    fn listen(&self, dev: usize) -> Result<(NetHandle, ListenComm), NetError>;

    /// Connects to a listener's handle from device `dev`; `None`: not yet
    /// (call again with the same handle: a plugin may keep its progress
    /// in it, as NCCL's own do; the peer may have to `accept` first).
    fn connect(&self, dev: usize, handle: &mut NetHandle) -> Result<Option<SendComm>, NetError>;

    /// The next connection to `listen`; `None`: not arrived yet.
    fn accept(&self, listen: ListenComm) -> Result<Option<RecvComm>, NetError>;

    /// Registers `mem` for `comm`.
    fn reg_mr(&self, comm: Comm, mem: Region) -> Result<MemHandle, NetError>;

    fn dereg_mr(&self, comm: Comm, mr: MemHandle) -> Result<(), NetError>;

    /// Starts sending the bytes of `buf` with `tag`; `None`: try again
    /// later.
    ///
    /// # Safety
    /// The bytes stay valid and unwritten until `test` reports the request
    /// done, or until `comm` is closed.
    unsafe fn isend(&self, comm: SendComm, buf: Buf, tag: u32) -> Posted;

    /// Starts receiving one message of at most `buf.len` bytes into `buf`;
    /// its tag must be `tag`. `None`: try again later.
    ///
    /// # Safety
    /// The `buf.len` bytes stay valid and untouched by anyone else until
    /// `test` reports the request done, or until `comm` is closed.
    unsafe fn irecv(&self, comm: RecvComm, buf: Buf, tag: u32) -> Posted;

    /// Makes the bytes a completed receive wrote into `buf` visible to
    /// the GPU: needed only for CUDA memory. `None`: nothing to flush
    /// (NCCL's `NULL` request); else test the request.
    ///
    /// # Safety
    /// As for `irecv`: the bytes stay valid until the request is done.
    unsafe fn iflush(&self, comm: RecvComm, buf: Buf) -> Posted {
        let _ = (comm, buf);
        Ok(None)
    }

    /// `Some(bytes)` once `req` is done (the request is then gone), `None`
    /// while it runs; an error fails the connection.
    fn test(&self, req: Request) -> Result<Option<usize>, NetError>;

    /// Closes a connection end; pending requests are abandoned (the memory
    /// they named is no longer touched once this returns), and the peer
    /// sees the connection closed.
    fn close_send(&self, comm: SendComm) -> Result<(), NetError>;
    fn close_recv(&self, comm: RecvComm) -> Result<(), NetError>;
    fn close_listen(&self, listen: ListenComm) -> Result<(), NetError>;
}
