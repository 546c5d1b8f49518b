//! UNIX sequenced-packet sockets for the coordinator and its participants: one message per
//! `send`, one per `recv`, never more than the caller's buffer (a longer one is reported as
//! [`Recv::TooLong`], never read in pieces).
//!
//! The participant's end lives inside a program vrange did not write, so it is a
//! [`GuestFd`] (above the floor, close-on-exec, verified before each use);
//! every send passes `MSG_NOSIGNAL` (a coordinator that died never raises SIGPIPE in the
//! program) and `MSG_DONTWAIT` (a coordinator that stopped reading never blocks it). The
//! coordinator's ends are its own descriptors ([`OwnedFd`]).

use crate::fd::{self, GuestFd, Inherit};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// The credentials of the process at the other end, as the kernel recorded them when it
/// connected (SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Its pid (in the reader's pid namespace; 0 if it is not visible there).
    pub pid: i32,
    /// Its effective uid.
    pub uid: u32,
    /// Its effective gid.
    pub gid: u32,
}

/// What one [`recv`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recv {
    /// One whole message of this many bytes.
    Message(usize),
    /// Nothing waiting now.
    Empty,
    /// The other end closed the connection.
    Closed,
    /// A message longer than the buffer (discarded by the kernel).
    TooLong,
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; all zero is a valid (empty) address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn socket() -> libc::c_int {
    // SAFETY: socket(2) has no memory effects.
    unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    }
}

/// Connects to the listening socket at `path`, as a guest: the descriptor is created only while
/// 0, 1 and 2 are open, placed above the floor, close-on-exec and non-blocking, and closed in a
/// fork child ([`Inherit::Private`]). A listener whose backlog is full refuses at once (EAGAIN).
///
/// # Errors
/// The errno of socket(2) or connect(2); EAGAIN as above; ENAMETOOLONG for a path that does not
/// fit a socket address.
pub fn connect(path: &Path) -> io::Result<GuestFd> {
    let (addr, len) = sockaddr(path)?;
    let owned = fd::create_guarded(socket)?;
    // SAFETY: `addr` is an initialised sockaddr_un of `len` bytes that lives across the call.
    let rc = unsafe {
        libc::connect(
            owned.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    GuestFd::adopt(owned, Inherit::Private)
}

/// A listening socket at `path` (which must not exist), for a coordinator: non-blocking,
/// close-on-exec, file mode `mode`. The file is created owner-only and then given `mode`, so
/// nobody else can connect before: Linux creates it with the socket's own inode mode (set
/// here with fchmod) less the umask. The process's umask is left alone (changing it, even
/// briefly, changes the mode of every file another thread creates meanwhile).
///
/// # Errors
/// The errno of socket(2), bind(2), chmod(2) or listen(2).
pub fn listen(path: &Path, mode: u32) -> io::Result<OwnedFd> {
    use std::os::unix::fs::PermissionsExt;
    let (addr, len) = sockaddr(path)?;
    let raw = socket();
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just created, owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fchmod(2) on our own socket's inode.
    if unsafe { libc::fchmod(raw, 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `addr` is an initialised sockaddr_un of `len` bytes that lives across the call.
    if unsafe { libc::bind(raw, (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    // SAFETY: listen(2) on our own socket.
    if unsafe { libc::listen(raw, 128) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

/// Accepts one pending connection (non-blocking, close-on-exec); `None` if none is waiting.
///
/// # Errors
/// The errno of accept4(2) other than EAGAIN (and ECONNABORTED, which is `None`).
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    // SAFETY: accept4 with null address pointers writes nothing of ours.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN | libc::ECONNABORTED | libc::EINTR) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: just created by accept4, owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The peer's credentials (SO_PEERCRED).
///
/// # Errors
/// The errno of getsockopt(2).
pub fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which lives across the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Sends one message without blocking and without SIGPIPE. Returns whether it was sent:
/// `false` when the peer's queue is full (it is not reading).
///
/// # Errors
/// The errno of send(2) other than EAGAIN (EPIPE, ECONNRESET: the peer is gone).
pub fn send(sock: BorrowedFd<'_>, msg: &[u8]) -> io::Result<bool> {
    // SAFETY: `msg` is readable for its length across the call.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(true)
}

/// Sends one message with a descriptor attached (SCM_RIGHTS), as [`send`] does.
///
/// # Errors
/// As [`send`].
pub fn send_fd(sock: BorrowedFd<'_>, msg: &[u8], fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    let mut control = Control::default();
    // SAFETY: msghdr is plain data; all zero means no address and no control data.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.buf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    hdr.msg_controllen = unsafe { libc::CMSG_SPACE(FD_LEN) } as usize;
    // SAFETY: the control buffer is aligned and CMSG_SPACE(one fd) long, so the first header
    // and its data (one int) lie inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&hdr);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(FD_LEN) as usize;
        libc::CMSG_DATA(cmsg)
            .cast::<libc::c_int>()
            .write_unaligned(fd.as_raw_fd());
    }
    // SAFETY: every pointer in `hdr` refers to live locals for the call; the kernel only reads.
    let n = unsafe {
        libc::sendmsg(
            sock.as_raw_fd(),
            &hdr,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(true)
}

const FD_LEN: u32 = std::mem::size_of::<libc::c_int>() as u32;

/// Room for one control message carrying one descriptor, aligned for cmsghdr.
#[repr(C, align(8))]
struct Control {
    buf: [u8; 64],
}

impl Default for Control {
    fn default() -> Control {
        Control { buf: [0; 64] }
    }
}

/// Receives one message into `buf` without blocking. Descriptors sent with it are discarded by
/// the kernel (no room is offered for them): a peer cannot plant one in this process.
///
/// # Errors
/// The errno of recvmsg(2) other than EAGAIN and EINTR.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Recv> {
    recv_inner(sock, buf, None)
}

/// [`recv`], also taking one descriptor sent with the message (close-on-exec); any more are
/// closed. For a coordinator receiving shared regions.
///
/// # Errors
/// As [`recv`].
pub fn recv_fd(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(Recv, Option<OwnedFd>)> {
    let mut fd = None;
    let r = recv_inner(sock, buf, Some(&mut fd))?;
    Ok((r, fd))
}

fn recv_inner(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fd_out: Option<&mut Option<OwnedFd>>,
) -> io::Result<Recv> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = Control::default();
    // SAFETY: msghdr is plain data; all zero means no address and no control data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if fd_out.is_some() {
        msg.msg_control = control.buf.as_mut_ptr().cast();
        msg.msg_controllen = control.buf.len();
    }
    // SAFETY: the iovec points at `buf` and the control pointer (if any) at `control`, both
    // writable for their lengths across the call.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => Ok(Recv::Empty),
            _ => Err(e),
        };
    }
    if let Some(out) = fd_out {
        // SAFETY: the kernel filled `msg_controllen` bytes of `control` with well-formed
        // headers; CMSG_FIRSTHDR/NXTHDR stay inside them, and SCM_RIGHTS data are ints, each a
        // new descriptor of this process that nothing else refers to.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                    let count = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / FD_LEN as usize;
                    for i in 0..count {
                        let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                        if out.is_none() {
                            *out = Some(fd);
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Ok(Recv::TooLong);
    }
    Ok(match n {
        0 => Recv::Closed,
        n => Recv::Message(n as usize),
    })
}

/// One entry of a [`poll`] set.
pub type PollFd = libc::pollfd;

/// A poll entry waiting for input on `fd`.
pub fn poll_in(fd: RawFd) -> PollFd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Whether a polled entry has input, or its peer hung up or failed (read it to find out).
pub fn poll_ready(p: &PollFd) -> bool {
    p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Waits up to `timeout_ms` (-1: forever) for any of `fds`; returns how many are ready (0 on a
/// timeout or an interrupted wait).
///
/// # Errors
/// The errno of poll(2) other than EINTR.
pub fn poll(fds: &mut [PollFd], timeout_ms: i32) -> io::Result<usize> {
    for p in fds.iter_mut() {
        p.revents = 0;
    }
    // SAFETY: `fds` is a slice of initialised pollfds borrowed mutably for the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EINTR) {
            Ok(0)
        } else {
            Err(e)
        };
    }
    Ok(rc as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn one_message_per_recv_and_too_long_is_reported() {
        let dir = std::env::temp_dir().join(format!("vrange-sock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("s");
        let listener = listen(&path, 0o600).unwrap();
        assert_eq!(accept(listener.as_fd()).unwrap().map(|_| ()), None);
        let client = connect(&path).unwrap();
        let server = accept(listener.as_fd()).unwrap().unwrap();
        let cred = peer_cred(server.as_fd()).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        let c = client.get().unwrap();
        assert!(send(c, b"hello").unwrap());
        assert!(send(c, &[7u8; 100]).unwrap());
        let mut buf = [0u8; 16];
        assert_eq!(recv(server.as_fd(), &mut buf).unwrap(), Recv::Message(5));
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(recv(server.as_fd(), &mut buf).unwrap(), Recv::TooLong);
        assert_eq!(recv(server.as_fd(), &mut buf).unwrap(), Recv::Empty);
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        assert!(send_fd(c, b"fd", file.as_fd()).unwrap());
        // Offered no room, the descriptor is dropped by the kernel; offered room, it arrives.
        assert!(send_fd(c, b"fd", file.as_fd()).unwrap());
        assert_eq!(recv(server.as_fd(), &mut buf).unwrap(), Recv::Message(2));
        let (r, fd) = recv_fd(server.as_fd(), &mut buf).unwrap();
        assert_eq!(r, Recv::Message(2));
        let (a, b) = (
            file.metadata().unwrap(),
            std::fs::File::from(fd.unwrap()).metadata().unwrap(),
        );
        use std::os::unix::fs::MetadataExt;
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));
        drop(client);
        assert_eq!(recv(server.as_fd(), &mut buf).unwrap(), Recv::Closed);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
