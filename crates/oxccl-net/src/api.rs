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
use crate::wire::Handle;

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

/// Where registered memory lives (NCCL's `NCCL_PTR_HOST`/`NCCL_PTR_CUDA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    Host,
    Cuda,
}

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
    /// The transport's name as NCCL logs it (`Socket`, `IB`).
    fn name(&self) -> &'static str;

    /// How many devices (NICs) there are.
    fn devices(&self) -> usize;

    fn properties(&self, dev: usize) -> Result<Properties, NetError>;

    /// Starts listening on device `dev`: the handle goes to the peer out of
    /// band, the listen comm stays here for `accept`.
    fn listen(&self, dev: usize) -> Result<(Handle, ListenComm), NetError>;

    /// Connects to a listener's handle from device `dev`; `None`: not yet.
    fn connect(&self, dev: usize, handle: &Handle) -> Result<Option<SendComm>, NetError>;

    /// The next connection to `listen`; `None`: not arrived yet.
    fn accept(&self, listen: ListenComm) -> Result<Option<RecvComm>, NetError>;

    /// Registers `len` bytes at `ptr` of kind `kind` for `comm`.
    fn reg_mr(
        &self,
        comm: Comm,
        ptr: *mut u8,
        len: usize,
        kind: MemKind,
    ) -> Result<MemHandle, NetError>;

    fn dereg_mr(&self, comm: Comm, mr: MemHandle) -> Result<(), NetError>;

    /// Starts sending `len` bytes at `ptr` (inside `mr`) with `tag`;
    /// `None`: try again later.
    ///
    /// # Safety
    /// The bytes stay valid and unwritten until `test` reports the request
    /// done, or until `comm` is closed.
    unsafe fn isend(
        &self,
        comm: SendComm,
        ptr: *const u8,
        len: usize,
        tag: u32,
        mr: MemHandle,
    ) -> Result<Option<Request>, NetError>;

    /// Starts receiving one message of at most `cap` bytes into `ptr`
    /// (inside `mr`); its tag must be `tag`. `None`: try again later.
    ///
    /// # Safety
    /// The `cap` bytes stay valid and untouched by anyone else until
    /// `test` reports the request done, or until `comm` is closed.
    unsafe fn irecv(
        &self,
        comm: RecvComm,
        ptr: *mut u8,
        cap: usize,
        tag: u32,
        mr: MemHandle,
    ) -> Result<Option<Request>, NetError>;

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
