//! File descriptors between ranks: both kinds of link (threads of one
//! process, and a socket pair per pair of processes, which the tests get
//! from a table that does not say the peers share this process), and
//! strangers' datagrams: forged, from another user, and floods.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use oxccl_bootstrap::{BootstrapError, FdMailbox, Key, RankDesc};

const SENT: i32 = 0;
const REFUSED: i32 = 6;

fn own_pidns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// `n` ranks of this machine, every one this process. With `sockets`,
/// the table leaves their pid namespace unknown, so ranks are joined by
/// socket pairs (and only the uid is checked) as ranks of other processes
/// are.
fn table(n: u32, sockets: bool) -> Vec<RankDesc> {
    (0..n)
        .map(|rank| RankDesc {
            rank,
            host: String::new(),
            pid: std::process::id(),
            pidns: if sockets { 0 } else { own_pidns() },
            device: -1,
            bus_id: String::new(),
            listen: "127.0.0.1:1".parse().unwrap(),
        })
        .collect()
}

fn mailboxes(key: &Key, scope: u16, descs: &[RankDesc]) -> Vec<FdMailbox> {
    (0..descs.len() as u32)
        .map(|r| FdMailbox::new(key, scope, r, descs).unwrap())
        .collect()
}

fn memfd(bytes: &[u8]) -> std::os::fd::OwnedFd {
    let fd = rustix::fs::memfd_create("oxccl-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::io::write(&fd, bytes).unwrap();
    fd
}

fn read12(fd: &std::os::fd::OwnedFd) -> [u8; 12] {
    let mut buf = [0u8; 12];
    rustix::io::pread(fd, &mut buf, 0).unwrap();
    buf
}

#[test]
fn file_descriptors_travel_by_either_link() {
    for (scope, sockets) in [(1, true), (2, false)] {
        let key = Key::random().unwrap();
        let descs = table(2, sockets);
        let m = mailboxes(&key, scope, &descs);
        assert_eq!(
            m[0].address(1).is_empty(),
            !sockets,
            "link kind (sockets: {sockets})"
        );
        let fd = memfd(b"shared bytes");
        let deadline = Instant::now() + Duration::from_secs(5);
        m[0].send(1, 7, &[fd.as_fd()], deadline).unwrap();
        m[0].send(1, 8, &[], deadline).unwrap();
        // Tags are matched: 8 first, 7 kept meanwhile.
        assert!(m[1].recv(0, 8, deadline).unwrap().is_empty());
        let got = m[1].recv(0, 7, deadline).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(&read12(&got[0]), b"shared bytes");
        // Nothing more: a bounded wait, naming the time waited.
        let r = m[1].recv(0, 9, Instant::now() + Duration::from_millis(200));
        let Err(BootstrapError::Timeout { limit, .. }) = r else {
            panic!("{r:?}")
        };
        assert!(limit >= Duration::from_millis(200), "{limit:?}");
        // Not to itself, nor to a rank the table lacks.
        assert!(matches!(
            m[0].send(0, 1, &[], deadline),
            Err(BootstrapError::InvalidArgument(_))
        ));
        assert!(matches!(
            m[0].recv(2, 1, deadline),
            Err(BootstrapError::InvalidArgument(_))
        ));
        if sockets {
            // A second mailbox under one name is refused.
            assert!(FdMailbox::new(&key, scope, 1, &descs).is_err());
        }
    }
}

#[test]
fn ranks_of_another_machine_are_refused() {
    let key = Key::random().unwrap();
    let mut descs = table(2, true);
    descs[1].host = "elsewhere".into();
    let m = FdMailbox::new(&key, 3, 0, &descs).unwrap();
    assert!(m.address(1).is_empty(), "a socket for a remote rank");
    let r = m.send(1, 1, &[], Instant::now() + Duration::from_secs(1));
    assert!(
        matches!(&r, Err(BootstrapError::InvalidArgument(w)) if w.contains("another machine")),
        "{r:?}"
    );
}

/// Every mailbox sends a descriptor to every peer before receiving any
/// (the host fabric's segment exchange): with one queue per rank, more
/// peers than a queue holds (`net.unix.max_dgram_qlen`, 10 by default)
/// used to wait on each other's full queues until the deadline.
#[test]
fn every_mailbox_sends_to_every_peer_before_receiving() {
    for (n, sockets) in [(16u32, true), (32, false)] {
        let key = Key::random().unwrap();
        let descs = table(n, sockets);
        let boxes = mailboxes(&key, 4, &descs);
        let deadline = Instant::now() + Duration::from_secs(30);
        std::thread::scope(|s| {
            for (me, b) in boxes.iter().enumerate() {
                let me = me as u32;
                s.spawn(move || {
                    let fd = memfd(&[me as u8; 12]);
                    for p in (0..n).filter(|&p| p != me) {
                        b.send(p, 3, &[fd.as_fd()], deadline).unwrap();
                    }
                    for p in (0..n).filter(|&p| p != me) {
                        let got = b.recv(p, 3, deadline).unwrap();
                        assert_eq!(read12(&got[0]), [p as u8; 12], "sockets: {sockets}");
                    }
                });
            }
        });
    }
}

/// Once both ends of a pair are bound, each is connected to the other and
/// the kernel refuses every other sender, of our uid or (when the test
/// runs as root) of another; the real message still arrives.
#[test]
fn a_connected_link_refuses_every_other_sender() {
    let key = Key::random().unwrap();
    let descs = table(2, true);
    let m = mailboxes(&key, 5, &descs);
    let deadline = Instant::now() + Duration::from_secs(5);
    // Rank 1 bound last and connected at once; rank 0 connects at its
    // first send.
    assert!(m[1].is_connected(0));
    m[0].send(1, 1, &[], deadline).unwrap();
    assert!(m[0].is_connected(1));
    let mut forgers = vec![None];
    if rustix::process::getuid().is_root() {
        forgers.push(Some(65534));
    } else {
        eprintln!("skipped: not root (the forger of another uid needs setuid)");
    }
    for uid in forgers {
        for (to, from) in [(1, 0), (0, 1)] {
            let msg = FdMailbox::datagram(&key, from, 7);
            assert_eq!(
                forge(&m[to as usize].address(from), msg, uid),
                REFUSED,
                "a forger ({uid:?}) reached rank {to}'s link to rank {from}"
            );
        }
    }
    assert!(m[1].recv(0, 1, deadline).unwrap().is_empty());
    let fd = memfd(b"real bytes!!");
    m[0].send(1, 7, &[fd.as_fd()], deadline).unwrap();
    assert_eq!(
        &read12(&m[1].recv(0, 7, deadline).unwrap()[0]),
        b"real bytes!!"
    );
}

/// Before the peer binds its end, a rank's end takes anyone's datagrams:
/// a stranger who fills its queue (from the name in `/proc/net/unix`)
/// does not stall the rank; the junk is dropped and the peer's message,
/// sent once it binds, arrives.
#[test]
fn a_flood_before_the_peer_binds_does_not_stall_the_link() {
    use rustix::net::{
        sendmsg_addr, socket, AddressFamily, SendAncillaryBuffer, SendFlags, SocketAddrUnix,
        SocketType,
    };
    let key = Key::random().unwrap();
    let descs = table(2, true);
    let a = FdMailbox::new(&key, 6, 0, &descs).unwrap();
    assert!(!a.is_connected(1));
    let addr = SocketAddrUnix::new_abstract_name(a.address(1).as_bytes()).unwrap();
    let s = socket(AddressFamily::UNIX, SocketType::DGRAM, None).unwrap();
    let mut queued = 0;
    let junk = [[0x41u8; 20], FdMailbox::datagram(&key, 1, 9)];
    for i in 0..10_000 {
        match sendmsg_addr(
            &s,
            &addr,
            &[std::io::IoSlice::new(&junk[i % 2])],
            &mut SendAncillaryBuffer::default(),
            SendFlags::DONTWAIT,
        ) {
            Ok(_) => queued += 1,
            Err(_) => break,
        }
    }
    assert!((1..10_000).contains(&queued), "the queue took {queued}");
    let deadline = Instant::now() + Duration::from_secs(10);
    // The peer binds and sends while the rank waits to receive.
    let b = FdMailbox::new(&key, 6, 1, &descs).unwrap();
    std::thread::scope(|t| {
        t.spawn(|| {
            let fd = memfd(b"after flood!");
            b.send(0, 3, &[fd.as_fd()], deadline).unwrap();
        });
        assert_eq!(
            &read12(&a.recv(1, 3, deadline).unwrap()[0]),
            b"after flood!"
        );
    });
    assert!(a.is_connected(1));
    // Connected now: the stranger is refused.
    let r = sendmsg_addr(
        &s,
        &addr,
        &[std::io::IoSlice::new(&junk[0])],
        &mut SendAncillaryBuffer::default(),
        SendFlags::DONTWAIT,
    );
    assert_eq!(r.err(), Some(rustix::io::Errno::PERM));
}

/// The pid check: rank 1's table says rank 0 is pid 1 in our pid
/// namespace, so a message from a process of our uid with any other pid
/// is dropped before rank 0 binds; the same forgery is taken where the
/// table cannot tell pids (so the check is what refused it).
#[test]
fn the_pid_check_refuses_a_same_uid_forger_before_the_peer_binds() {
    for (scope, pid_known) in [(7, true), (8, false)] {
        let key = Key::random().unwrap();
        let mut descs = table(2, true);
        if pid_known {
            descs[0].pid = 1;
            descs[0].pidns = own_pidns();
        }
        let b = FdMailbox::new(&key, scope, 1, &descs).unwrap();
        assert_eq!(
            forge(&b.address(0), FdMailbox::datagram(&key, 0, 3), None),
            SENT
        );
        let r = b.recv(0, 3, Instant::now() + Duration::from_millis(300));
        if pid_known {
            assert!(matches!(r, Err(BootstrapError::Timeout { .. })), "{r:?}");
        } else {
            assert_eq!(r.unwrap().len(), 1);
        }
    }
}

/// Sends `msg`, from a forked child (as `uid` if given), to the abstract
/// socket `to` with a descriptor of the child's own, without waiting;
/// returns how the child exited: [`SENT`], [`REFUSED`] (the kernel's
/// `EPERM`: the socket is connected to another), or another code.
fn forge(to: &str, msg: [u8; 20], uid: Option<u32>) -> i32 {
    use rustix::net::{
        sendmsg_addr, socket, AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
        SocketAddrUnix, SocketType,
    };
    let addr = SocketAddrUnix::new_abstract_name(to.as_bytes()).unwrap();
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    // SAFETY: the child runs system calls only (no allocation, no locks)
    // on what the parent prepared, and leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = (|| {
            if let Some(u) = uid {
                // SAFETY: plain system calls in the forked child.
                if unsafe { libc::setgid(u) } != 0 || unsafe { libc::setuid(u) } != 0 {
                    return 3;
                }
            }
            let Ok(fd) = rustix::fs::memfd_create(c"forged", rustix::fs::MemfdFlags::CLOEXEC)
            else {
                return 4;
            };
            let _ = rustix::io::write(&fd, b"forged bytes");
            let Ok(s) = socket(AddressFamily::UNIX, SocketType::DGRAM, None) else {
                return 5;
            };
            let fds = [fd.as_fd()];
            let mut anc = SendAncillaryBuffer::new(&mut space);
            anc.push(SendAncillaryMessage::ScmRights(&fds));
            match sendmsg_addr(
                &s,
                &addr,
                &[std::io::IoSlice::new(&msg)],
                &mut anc,
                SendFlags::DONTWAIT,
            ) {
                Ok(_) => SENT,
                Err(e) if e == rustix::io::Errno::PERM => REFUSED,
                Err(_) => 2,
            }
        })();
        // SAFETY: leaves the forked child without running the parent's
        // destructors or atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    }
}
