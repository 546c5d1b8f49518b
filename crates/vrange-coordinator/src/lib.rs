//! The vrange coordinator: one purge order for a whole container.
//!
//! Every process using vrange purges its own volatile memory, oldest first, when *it* sees
//! pressure. A coordinator (`vrange daemon`) watches a memory cgroup (or the machine) and,
//! under pressure, purges the oldest volatile data of *any* participating process first:
//! lowest priority class first, then oldest across all participants, until the headroom is
//! back. Processes connect on their own when its socket exists
//! ([`vrange::coordination`] has the protocol and the socket paths; `VRANGE_COORDINATOR`
//! overrides them), report a compact inventory when pinged, and obey purge requests; without
//! a coordinator, or when it dies or hangs, each keeps purging on its own.
//!
//! ```no_run
//! let opts = vrange_coordinator::Options::default();
//! let shared = vrange_coordinator::Shared::default();
//! vrange_coordinator::run(&opts, &shared).expect("coordinator");
//! ```

mod metrics;
mod plan;
mod scope;
mod server;

pub use metrics::MetricsAddr;
pub use scope::Scope;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vrange::coordination::{self, Message, Row, Status, MAX_MESSAGE};
use vrange_sys::sock::{self, Recv};

/// How a coordinator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The listening socket (default: [`default_socket`]).
    pub socket: PathBuf,
    /// What it watches (default: its own memory cgroup, else the machine).
    pub scope: Scope,
    /// How often it reads the headroom when no pressure event wakes it (default 50 ms: one
    /// pread of the usage file; each process's own reclaimer reads it every 100 ms, and four
    /// of them out of step see a deficit sooner than one reader at 100 ms).
    pub interval: Duration,
    /// How often it asks participants for their inventory (default 250 ms). A participant takes
    /// the coordinator for gone after three intervals without a message.
    pub ping: Duration,
    /// How long a participant may take to answer a purge request before it is left out of
    /// plans until it speaks again (default 1 s).
    pub request_timeout: Duration,
    /// The headroom to keep (bytes); `None`: the ceiling / 16, between 4 and 256 MiB (as each
    /// process's own `VRANGE_HEADROOM=auto`).
    pub headroom: Option<u64>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<MetricsAddr>,
}

impl Default for Options {
    fn default() -> Options {
        let scope = vrange_sys::cgroup::MemCgroup::current()
            .map_or(Scope::Machine, |cg| Scope::Cgroup(cg.path().to_path_buf()));
        Options {
            socket: default_socket(),
            scope,
            interval: Duration::from_millis(50),
            ping: Duration::from_millis(250),
            request_timeout: Duration::from_secs(1),
            headroom: None,
            metrics: None,
        }
    }
}

/// The socket a coordinator listens on by default: [`coordination::SYSTEM_SOCKET`] for root,
/// else [`coordination::user_socket`] of the effective uid: where participants look.
pub fn default_socket() -> PathBuf {
    match vrange_sys::statsdir::effective_uid() {
        0 => PathBuf::from(coordination::SYSTEM_SOCKET),
        uid => coordination::user_socket(uid),
    }
}

/// What the coordinator shares with the thread serving metrics and with whoever stops it.
#[derive(Default)]
pub struct Shared {
    /// Set to stop [`run`] (it returns within one interval); an `Arc` so that signal
    /// handlers can hold it.
    pub stop: Arc<AtomicBool>,
    pub(crate) snapshot: Mutex<metrics::Snapshot>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, metrics::Snapshot> {
        self.snapshot.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn publish(&self, status: &Status, rows: Vec<Row>, oom_kills: Option<u64>) {
        let mut s = self.lock();
        s.status = *status;
        s.rows = rows;
        s.oom_kills = oom_kills;
    }

    pub(crate) fn room_asked(&self) {
        self.lock().rooms += 1;
    }

    pub(crate) fn event(&self, e: scope::Event) {
        self.lock().events[e as usize] += 1;
    }

    pub(crate) fn round_done(&self, took: Duration, cut: plan::Cut) {
        let mut s = self.lock();
        s.rounds_done += 1;
        s.last_response = took;
        s.last_cut = Some(cut);
    }

    /// The last snapshot in Prometheus text format.
    pub fn metrics(&self) -> String {
        metrics::render(&self.lock())
    }
}

/// Runs a coordinator until `shared.stop` is set: listens at `opts.socket` (a stale socket of
/// a dead coordinator is replaced; a live one is an error), serves metrics if asked, and
/// removes its socket on return.
///
/// # Errors
/// AddrInUse when another coordinator answers at the socket; the errno of making the socket's
/// directory, binding, or opening the scope's files.
pub fn run(opts: &Options, shared: &Shared) -> io::Result<()> {
    let listener = bind(&opts.socket)?;
    let result = std::thread::scope(|s| {
        let metrics = match &opts.metrics {
            Some(addr) => Some(metrics::Server::bind(addr)?),
            None => None,
        };
        if let Some(m) = metrics {
            s.spawn(move || m.serve(shared));
        }
        let r = server::Server::new(opts, shared, listener).and_then(|mut srv| srv.run());
        shared
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
        r
    });
    let _ = std::fs::remove_file(&opts.socket);
    result
}

/// Binds the socket: makes its directory if missing (0755 for the system socket's, 0700
/// otherwise), replaces a socket nobody answers at.
fn bind(path: &Path) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    let system = path == Path::new(coordination::SYSTEM_SOCKET);
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(if system { 0o755 } else { 0o700 })
                .create(dir)?;
        }
        // A directory another user owns or may write to would let them replace the socket.
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir)?;
        let me = vrange_sys::statsdir::effective_uid();
        let foreign = meta.uid() != me && meta.uid() != 0;
        let open = meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0;
        if foreign || open {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: owned by uid {} with mode {:o}; the socket's directory must be this \
                     user's or root's and not writable by others",
                    dir.display(),
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            ));
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if sock::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a coordinator already listens at {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    // The system socket takes every user's processes (root checks each one's cgroup).
    sock::listen(path, if system { 0o666 } else { 0o600 })
}

/// Asks the coordinator at `socket` for its totals and one row per participant (what
/// `vrange top` shows).
///
/// # Errors
/// The errno of connecting; TimedOut if the answer does not come within two seconds;
/// InvalidData for a malformed answer.
pub fn query(socket: &Path) -> io::Result<(Status, Vec<Row>)> {
    let conn = sock::connect(socket)?;
    let fd = conn.get().ok_or_else(|| io::Error::other("socket lost"))?;
    let mut buf = [0u8; MAX_MESSAGE];
    let n = Message::Monitor.encode(&mut buf);
    sock::send(fd, &buf[..n])?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut status, mut rows) = (None, Vec::new());
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::from(io::ErrorKind::TimedOut));
        }
        let mut p = [sock::poll_in(conn.raw())];
        sock::poll(&mut p, left.as_millis().max(1) as i32)?;
        let n = match sock::recv(fd, &mut buf)? {
            Recv::Message(n) => n,
            Recv::Empty => continue,
            Recv::Closed | Recv::TooLong => {
                return Err(io::Error::from(io::ErrorKind::InvalidData))
            }
        };
        match Message::decode(&buf[..n]) {
            Ok(Message::Status(s)) if status.is_none() => status = Some(s),
            Ok(Message::Row(r)) if status.is_some() => rows.push(*r),
            Ok(Message::End) if status.is_some() => break,
            _ => return Err(io::Error::from(io::ErrorKind::InvalidData)),
        }
    }
    Ok((status.unwrap_or_default(), rows))
}
