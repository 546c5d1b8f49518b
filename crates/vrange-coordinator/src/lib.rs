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
//!
//! [`check`] refuses options that cannot work before anything is bound (a cgroup that is not
//! one, a headroom at or above the limit); [`Coordinator::bind`] then binds the socket and the
//! metrics listener, so that a caller can say where it listens only once it does.

mod metrics;
mod plan;
mod proactive;
mod procself;
mod scope;
mod server;

pub use metrics::{BadMetricsAddr, MetricsAddr};
pub use proactive::{Proactive, Report as ProactiveReport};
pub use scope::Scope;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vrange::coordination::{self, Message, Row, SharedRow, Status, MAX_MESSAGE};
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
    /// Whether each participant's metrics carry its pid as a label (default: no; they are
    /// labelled by program name and cgroup, which survive a restart, and processes sharing
    /// both are summed).
    pub metrics_pid: bool,
    /// Proactive mode: memory back before anyone asks ([`Proactive`]; default `None`: off).
    pub proactive: Option<Proactive>,
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
            metrics_pid: false,
            proactive: None,
        }
    }
}

/// Options a coordinator refuses before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The directory is not a memory cgroup (missing, or no memory controller).
    NotACgroup(PathBuf),
    /// The headroom to keep is at or above the ceiling: every tick would find it short and
    /// purge all volatile memory, for ever.
    HeadroomAtLimit {
        headroom: u64,
        limit: u64,
        scope: String,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::NotACgroup(p) => write!(f, "{} is not a memory cgroup", p.display()),
            ConfigError::HeadroomAtLimit {
                headroom,
                limit,
                scope,
            } => write!(
                f,
                "headroom {} is not below the limit of {scope} ({}): every tick would purge \
                 all volatile memory",
                size(*headroom),
                size(*limit)
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for io::Error {
    fn from(e: ConfigError) -> io::Error {
        let kind = match e {
            ConfigError::NotACgroup(_) => io::ErrorKind::NotFound,
            ConfigError::HeadroomAtLimit { .. } => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// A size for people: whole units where exact, else one decimal.
pub(crate) fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ];
    let (unit, n) = UNITS
        .into_iter()
        .find(|(_, n)| bytes >= *n)
        .unwrap_or(("B", 1));
    if bytes % n == 0 {
        format!("{} {unit}", bytes / n)
    } else {
        format!("{:.1} {unit}", bytes as f64 / n as f64)
    }
}

/// What the coordinator's scope is, for messages: `cgroup PATH` or `the machine`.
pub fn describe(scope: &Scope) -> String {
    match scope {
        Scope::Machine => "the machine".to_string(),
        Scope::Cgroup(p) => format!("cgroup {}", p.display()),
    }
}

/// Checks options before anything is bound: the cgroup is a memory cgroup, and a headroom
/// given is below its limit (or the machine's memory). Returns a warning (one line) for a
/// headroom above half the limit: purges then start while most of the memory is free.
///
/// # Errors
/// [`ConfigError`] for options a coordinator cannot run with.
pub fn check(opts: &Options) -> Result<Option<String>, ConfigError> {
    let limit = match &opts.scope {
        Scope::Cgroup(p) => {
            let cg = vrange_sys::cgroup::MemCgroup::at(p)
                .ok_or_else(|| ConfigError::NotACgroup(p.clone()))?;
            match (cg.limit(), cg.high()) {
                (Some(l), Some(h)) => Some(l.min(h)),
                (l, h) => l.or(h),
            }
        }
        Scope::Machine => vrange_sys::procfs::meminfo_kb("MemTotal")
            .ok()
            .flatten()
            .map(|kb| kb.saturating_mul(1024)),
    };
    let (Some(headroom), Some(limit)) = (opts.headroom, limit) else {
        return Ok(None);
    };
    let scope = describe(&opts.scope);
    if headroom >= limit {
        return Err(ConfigError::HeadroomAtLimit {
            headroom,
            limit,
            scope,
        });
    }
    Ok((headroom > limit / 2).then(|| {
        format!(
            "headroom {} is more than half the limit of {scope} ({}): purges start while most \
             of it is free",
            size(headroom),
            size(limit)
        )
    }))
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

    pub(crate) fn publish(
        &self,
        status: &Status,
        rows: Vec<metrics::Participant>,
        oom_kills: Option<u64>,
    ) {
        let mut s = self.lock();
        s.status = *status;
        s.rows = rows;
        s.oom_kills = oom_kills;
    }

    pub(crate) fn room_asked(&self) {
        self.lock().rooms += 1;
    }

    pub(crate) fn refused(&self, counts: [u64; metrics::REFUSALS]) {
        self.lock().refused = counts;
    }

    pub(crate) fn event(&self, e: scope::Event) {
        self.lock().events[e as usize] += 1;
    }

    pub(crate) fn proactive(&self, report: Option<ProactiveReport>) {
        self.lock().proactive = report;
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

/// Runs a coordinator until `shared.stop` is set: [`Coordinator::bind`], then
/// [`Coordinator::run`].
///
/// # Errors
/// As [`Coordinator::bind`] and [`Coordinator::run`].
pub fn run(opts: &Options, shared: &Shared) -> io::Result<()> {
    Coordinator::bind(opts)?.run(shared)
}

/// A coordinator bound to its socket (and metrics address), not running yet. Dropped, it
/// removes its socket.
pub struct Coordinator<'o> {
    opts: &'o Options,
    listener: Option<std::os::fd::OwnedFd>,
    watch: Option<scope::Watch>,
    metrics: Option<metrics::Server>,
}

impl<'o> Coordinator<'o> {
    /// Checks the options ([`check`]), opens the scope's pressure sources, listens at
    /// `opts.socket` (a stale socket of a dead coordinator is replaced; a live one is an
    /// error) and binds the metrics address if any. Each error says which of them failed.
    ///
    /// # Errors
    /// [`ConfigError`] as an `io::Error` (NotFound, InvalidInput); AddrInUse when another
    /// coordinator answers at the socket or the metrics address is taken; the errno of making
    /// the socket's directory, binding, or opening the scope's files.
    pub fn bind(opts: &'o Options) -> io::Result<Coordinator<'o>> {
        check(opts)?;
        let watch = scope::Watch::open(&opts.scope)?;
        let context =
            |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        let listener =
            bind(&opts.socket).map_err(context(format!("socket {}", opts.socket.display())))?;
        let mut me = Coordinator {
            opts,
            listener: Some(listener),
            watch: Some(watch),
            metrics: None,
        };
        if let Some(addr) = &opts.metrics {
            me.metrics =
                Some(metrics::Server::bind(addr).map_err(context(format!("metrics at {addr}")))?);
        }
        Ok(me)
    }

    /// Where metrics are served (the port the kernel chose for port 0), if anywhere.
    pub fn metrics_addr(&self) -> Option<MetricsAddr> {
        self.metrics.as_ref().map(metrics::Server::addr)
    }

    /// Runs until `shared.stop` is set, serving metrics in a thread of its own; removes the
    /// socket on return.
    ///
    /// # Errors
    /// The errno of poll(2) on the coordinator's descriptors.
    pub fn run(mut self, shared: &Shared) -> io::Result<()> {
        let (Some(listener), Some(watch)) = (self.listener.take(), self.watch.take()) else {
            return Err(io::Error::other("coordinator already ran"));
        };
        let metrics = self.metrics.take();
        let opts = self.opts;
        std::thread::scope(|s| {
            if let Some(m) = metrics {
                s.spawn(move || m.serve(shared));
            }
            let r = server::Server::new(opts, shared, listener, watch).run();
            shared
                .stop
                .store(true, std::sync::atomic::Ordering::Relaxed);
            r
        })
    }
}

impl Drop for Coordinator<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.opts.socket);
    }
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
                "a coordinator already listens there",
            ));
        }
        std::fs::remove_file(path)?;
    }
    // The system socket takes every user's processes (root checks each one's cgroup).
    sock::listen(path, if system { 0o666 } else { 0o600 })
}

/// Asks the coordinator at `socket` for its totals and one row per participant.
///
/// # Errors
/// As [`query_all`].
pub fn query(socket: &Path) -> io::Result<(Status, Vec<Row>)> {
    query_all(socket).map(|(status, rows, _)| (status, rows))
}

/// Asks the coordinator at `socket` for its totals, one row per participant and one per shared
/// region it holds (what `vrange top` shows).
///
/// # Errors
/// The errno of connecting; TimedOut if the answer does not come within two seconds;
/// InvalidData for a malformed answer.
pub fn query_all(socket: &Path) -> io::Result<(Status, Vec<Row>, Vec<SharedRow>)> {
    let conn = sock::connect(socket)?;
    let fd = conn.get().ok_or_else(|| io::Error::other("socket lost"))?;
    let mut buf = [0u8; MAX_MESSAGE];
    let n = Message::Monitor.encode(&mut buf);
    sock::send(fd, &buf[..n])?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut status, mut rows, mut regions) = (None, Vec::new(), Vec::new());
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
            Ok(Message::SharedRow(r)) if status.is_some() => regions.push(r),
            Ok(Message::End) if status.is_some() => break,
            _ => return Err(io::Error::from(io::ErrorKind::InvalidData)),
        }
    }
    Ok((status.unwrap_or_default(), rows, regions))
}
