//! Prometheus text metrics, served over HTTP on a loopback address or a UNIX socket.
//!
//! The server is written by hand: one endpoint (`GET /metrics`; other methods get 405), one
//! request per connection, a request read to at most 8 KiB within two seconds, so that a slow
//! or hostile scraper cannot hold the coordinator's memory or its loop (it runs in a thread of
//! its own). A scrape is answered as soon as it connects (the thread waits in poll(2), not in
//! a sleep) and in one write with Nagle off: a response written in pieces waits for the
//! scraper's delayed ACK, which is how scrapes took 80–90 ms.
//!
//! The loop (`server.rs`) hands its figures in ([`Snapshot`], counted by [`Refusal`] and the
//! like); nothing here reaches back into it. Besides the coordinator's own figures:
//! `vrange_build_info` and the standard `process_*` self-metrics of Prometheus client
//! libraries, read from `/proc/self`.

use crate::plan::Cut;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use vrange::coordination::{Row, Status};

/// Where metrics are served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsAddr {
    /// A loopback TCP address (`127.0.0.1:9464`, `[::1]:9464`).
    Tcp(SocketAddr),
    /// A UNIX stream socket (`unix:/run/vrange/metrics.sock`).
    Unix(PathBuf),
}

/// As it is written on the command line: `127.0.0.1:9464`, `unix:/run/vrange/metrics.sock`.
impl std::fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricsAddr::Tcp(a) => write!(f, "{a}"),
            MetricsAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Why a metrics address was refused (the text says which rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadMetricsAddr {
    /// `unix:` with a relative path.
    RelativePath(String),
    /// Neither `ADDRESS:PORT` nor `unix:/PATH`.
    Unparsable(String),
    /// A TCP address that is not loopback.
    NotLoopback(String),
}

impl std::fmt::Display for BadMetricsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadMetricsAddr::RelativePath(s) => write!(f, "{s}: the socket path must be absolute"),
            BadMetricsAddr::Unparsable(s) => write!(f, "{s}: not ADDRESS:PORT or unix:/PATH"),
            BadMetricsAddr::NotLoopback(s) => write!(
                f,
                "{s}: metrics are served on loopback only (or a UNIX socket)"
            ),
        }
    }
}

impl std::error::Error for BadMetricsAddr {}

impl std::str::FromStr for MetricsAddr {
    type Err = BadMetricsAddr;

    fn from_str(s: &str) -> Result<MetricsAddr, BadMetricsAddr> {
        if let Some(path) = s.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(BadMetricsAddr::RelativePath(s.to_string()));
            }
            return Ok(MetricsAddr::Unix(PathBuf::from(path)));
        }
        let addr: SocketAddr = s
            .parse()
            .map_err(|_| BadMetricsAddr::Unparsable(s.to_string()))?;
        if !addr.ip().is_loopback() {
            return Err(BadMetricsAddr::NotLoopback(s.to_string()));
        }
        Ok(MetricsAddr::Tcp(addr))
    }
}

/// One participant as metrics show it.
#[derive(Debug, Clone)]
pub(crate) struct Participant {
    pub row: Row,
    /// Its memory cgroup's directory ("" if unknown).
    pub cgroup: String,
}

/// Why a connection was refused or dropped (the `reason` label of
/// `vrange_coordinator_refused_total`): on a root coordinator's socket, other jobs' processes
/// knocking (`other_cgroup`) are routine, a malformed message (`protocol`) is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Another user's process, and the coordinator is not root.
    OtherUser = 0,
    /// A process outside the coordinated cgroup.
    OtherCgroup = 1,
    /// A malformed, oversized or unexpected message.
    Protocol = 2,
    /// A shared region's descriptor that is not the region named, or one too many.
    Descriptor = 3,
}

/// Kinds of [`Refusal`].
pub(crate) const REFUSALS: usize = 4;

impl Refusal {
    /// The label value, by index.
    pub(crate) const NAMES: [&'static str; REFUSALS] =
        ["other_user", "other_cgroup", "protocol", "descriptor"];
}

/// What the coordinator's loop last published.
#[derive(Default)]
pub(crate) struct Snapshot {
    pub status: Status,
    pub rows: Vec<Participant>,
    /// Whether participants are labelled by pid too (`Options::metrics_pid`).
    pub with_pid: bool,
    /// Refusals by [`Refusal`].
    pub refused: [u64; REFUSALS],
    /// Pressure events by `scope::Event`.
    pub events: [u64; 3],
    pub rounds_done: u64,
    /// `Room` requests received (participants about to map memory, their headroom short).
    pub rooms: u64,
    pub last_response: Duration,
    pub last_cut: Option<Cut>,
    /// OOM kills in the coordinated cgroup (`None`: the machine, or no counter).
    pub oom_kills: Option<u64>,
    /// The proactive mode's report (`None`: off).
    pub proactive: Option<crate::ProactiveReport>,
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn name_of(r: &Row) -> String {
    String::from_utf8_lossy(&r.name)
        .trim_end_matches('\0')
        .to_string()
}

/// The participants' figures by label set: program name and cgroup (and pid if asked), which
/// survive a restart; processes sharing them are summed, so that no series is duplicated.
#[derive(Default)]
struct Group {
    processes: u64,
    responsive: u64,
    volatile: u64,
    pinned: u64,
    purged: u64,
    obeyed: u64,
    freed: u64,
}

fn groups(s: &Snapshot) -> std::collections::BTreeMap<String, Group> {
    let mut out = std::collections::BTreeMap::<String, Group>::new();
    for p in &s.rows {
        let r = &p.row;
        let mut labels = format!(
            "name=\"{}\",cgroup=\"{}\"",
            escape(&name_of(r)),
            escape(&p.cgroup)
        );
        if s.with_pid {
            let _ = write!(labels, ",pid=\"{}\"", r.pid);
        }
        let g = out.entry(format!("{{{labels}}}")).or_default();
        g.processes += 1;
        g.responsive += u64::from(r.responsive);
        g.volatile = g.volatile.saturating_add(r.volatile);
        g.pinned = g.pinned.saturating_add(r.pinned);
        g.purged = g.purged.saturating_add(r.purged);
        g.obeyed = g.obeyed.saturating_add(r.obeyed);
        g.freed = g.freed.saturating_add(r.freed);
    }
    out
}

/// The snapshot in Prometheus text exposition format (version 0.0.4).
pub(crate) fn render(s: &Snapshot) -> String {
    let mut out = String::with_capacity(8192);
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let one = |v: u64| vec![(String::new(), v as f64)];
    let st = &s.status;
    metric(
        "vrange_build_info",
        "gauge",
        "The coordinator's build: always 1.",
        &[(
            format!(
                "{{version=\"{}\",arch=\"{}\"}}",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::ARCH
            ),
            1.0,
        )],
    );
    metric(
        "vrange_coordinator_participants",
        "gauge",
        "Processes connected to the coordinator.",
        &one(s.rows.len() as u64),
    );
    metric(
        "vrange_coordinator_headroom_bytes",
        "gauge",
        "Limit minus usage of the coordinated cgroup (MemAvailable for the machine).",
        &one(st.headroom),
    );
    metric(
        "vrange_coordinator_limit_bytes",
        "gauge",
        "The ceiling the headroom is measured against (0: none).",
        &one(st.limit),
    );
    metric(
        "vrange_coordinator_rounds_total",
        "counter",
        "Purge rounds started (pressure answered with requests).",
        &one(st.rounds),
    );
    metric(
        "vrange_coordinator_requests_total",
        "counter",
        "Purge requests sent to participants.",
        &one(st.requests),
    );
    metric(
        "vrange_coordinator_room_requests_total",
        "counter",
        "Requests for room from participants about to map memory (answered in the global order).",
        &one(s.rooms),
    );
    metric(
        "vrange_coordinator_freed_bytes_total",
        "counter",
        "Bytes participants reported freed for the coordinator.",
        &one(st.freed),
    );
    metric(
        "vrange_coordinator_refused_total",
        "counter",
        "Connections refused or dropped, by reason: other_user (not the coordinator's user, \
         which is not root), other_cgroup (outside the coordinated cgroup: routine on a shared \
         socket), protocol (malformed, oversized or unexpected message), descriptor (a shared \
         region's descriptor refused).",
        &Refusal::NAMES
            .iter()
            .zip(s.refused)
            .map(|(why, n)| (format!("{{reason=\"{why}\"}}"), n as f64))
            .collect::<Vec<_>>(),
    );
    metric(
        "vrange_coordinator_pressure_events_total",
        "counter",
        "Pressure events seen, by source.",
        &["psi", "vmpressure-medium", "vmpressure-critical"]
            .iter()
            .zip(s.events)
            .map(|(src, n)| (format!("{{source=\"{src}\"}}"), n as f64))
            .collect::<Vec<_>>(),
    );
    metric(
        "vrange_coordinator_last_response_seconds",
        "gauge",
        "From pressure seen to the last participant's answer, last round.",
        &[(String::new(), s.last_response.as_secs_f64())],
    );
    metric(
        "vrange_coordinator_last_cut_age_seconds",
        "gauge",
        "The youngest age purged in the last round's class (where the global order was cut).",
        &[(
            String::new(),
            s.last_cut.map_or(0.0, |c| c.at.min_idle as f64 / 1000.0),
        )],
    );
    if let Some(n) = s.oom_kills {
        metric(
            "vrange_coordinator_oom_kills_total",
            "counter",
            "Processes the kernel's OOM killer killed in the coordinated cgroup.",
            &one(n),
        );
    }
    if let Some(p) = s.proactive {
        for (name, kind, help, v) in [
            (
                "vrange_proactive_saved_bytes_total",
                "counter",
                "Bytes the proactive mode freed before any pressure (purged cold volatile memory, and on cgroup v2 page cache reclaimed at its request).",
                p.saved,
            ),
            (
                "vrange_proactive_target_bytes",
                "gauge",
                "The usage the proactive mode aims for now (the usage less a step while it steps, the usage while it holds).",
                p.target,
            ),
            (
                "vrange_proactive_stalls_total",
                "counter",
                "Looks of the proactive mode that found a stall above its target, pressure or refaults, and held.",
                p.stalls,
            ),
            (
                "vrange_proactive_steps_total",
                "counter",
                "Steps the proactive mode took.",
                p.steps,
            ),
        ] {
            metric(name, kind, help, &one(v));
        }
    }
    let groups = groups(s);
    let per = |f: fn(&Group) -> u64| -> Vec<(String, f64)> {
        groups
            .iter()
            .map(|(labels, g)| (labels.clone(), f(g) as f64))
            .collect()
    };
    for (name, kind, help, f) in [
        (
            "vrange_participant_processes",
            "gauge",
            "Processes connected with this program name and cgroup.",
            (|g: &Group| g.processes) as fn(&Group) -> u64,
        ),
        (
            "vrange_participant_volatile_bytes",
            "gauge",
            "Volatile bytes the participants hold.",
            |g: &Group| g.volatile,
        ),
        (
            "vrange_participant_pinned_bytes",
            "gauge",
            "Managed bytes in use.",
            |g: &Group| g.pinned,
        ),
        (
            "vrange_participant_purged_bytes",
            "gauge",
            "Purged bytes not yet reused.",
            |g: &Group| g.purged,
        ),
        (
            "vrange_participant_requests_obeyed_total",
            "counter",
            "Purge requests obeyed (summed over the processes connected now).",
            |g: &Group| g.obeyed,
        ),
        (
            "vrange_participant_freed_bytes_total",
            "counter",
            "Bytes freed for the coordinator (summed over the processes connected now).",
            |g: &Group| g.freed,
        ),
        (
            "vrange_participant_responsive",
            "gauge",
            "Processes that answer their requests in time.",
            |g: &Group| g.responsive,
        ),
    ] {
        metric(name, kind, help, &per(f));
    }
    crate::procself::render(&mut out);
    out
}

/// A bound metrics listener.
pub(crate) enum Server {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Server {
    pub fn bind(addr: &MetricsAddr) -> io::Result<Server> {
        let s = match addr {
            MetricsAddr::Tcp(a) => Server::Tcp(TcpListener::bind(a)?),
            MetricsAddr::Unix(p) => {
                // As the coordinator's socket: a stale one is replaced, a live one (another
                // daemon's) or another file is not.
                use std::os::unix::fs::FileTypeExt;
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    if !meta.file_type().is_socket() {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            "exists and is not a socket",
                        ));
                    }
                    if std::os::unix::net::UnixStream::connect(p).is_ok() {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            "a metrics server already listens there",
                        ));
                    }
                    std::fs::remove_file(p)?;
                }
                Server::Unix(UnixListener::bind(p)?, p.clone())
            }
        };
        match &s {
            Server::Tcp(l) => l.set_nonblocking(true)?,
            Server::Unix(l, _) => l.set_nonblocking(true)?,
        }
        Ok(s)
    }

    /// Where it listens (the port the kernel chose, for port 0).
    pub fn addr(&self) -> MetricsAddr {
        match self {
            Server::Tcp(l) => l.local_addr().map_or_else(
                |_| MetricsAddr::Tcp(([127, 0, 0, 1], 0).into()),
                MetricsAddr::Tcp,
            ),
            Server::Unix(_, p) => MetricsAddr::Unix(p.clone()),
        }
    }

    /// Answers scrapes until the coordinator stops (checked every 100 ms): waits in poll(2)
    /// for the next connection, so that a scrape is answered at once.
    pub fn serve(self, shared: &crate::Shared) {
        use std::os::fd::AsRawFd;
        let fd = match &self {
            Server::Tcp(l) => l.as_raw_fd(),
            Server::Unix(l, _) => l.as_raw_fd(),
        };
        while !shared.stop.load(Relaxed) {
            let mut p = [vrange_sys::sock::poll_in(fd)];
            if vrange_sys::sock::poll(&mut p, 100).is_err() || !vrange_sys::sock::poll_ready(&p[0])
            {
                continue;
            }
            let accepted: io::Result<Box<dyn Stream>> = match &self {
                Server::Tcp(l) => l.accept().map(|(c, _)| {
                    let _ = c.set_nodelay(true);
                    Box::new(c) as Box<dyn Stream>
                }),
                Server::Unix(l, _) => l.accept().map(|(c, _)| Box::new(c) as Box<dyn Stream>),
            };
            if let Ok(mut c) = accepted {
                let _ = answer(&mut *c, shared);
            }
        }
    }
}

impl Drop for Server {
    /// Removes its UNIX socket, whether it served or not.
    fn drop(&mut self) {
        if let Server::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

trait Stream: Read + Write {
    fn prepare(&self) -> io::Result<()>;
}

impl Stream for std::net::TcpStream {
    fn prepare(&self) -> io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(Duration::from_secs(2)))?;
        self.set_write_timeout(Some(Duration::from_secs(2)))
    }
}

impl Stream for std::os::unix::net::UnixStream {
    fn prepare(&self) -> io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(Duration::from_secs(2)))?;
        self.set_write_timeout(Some(Duration::from_secs(2)))
    }
}

/// The status line, extra headers and body for one request (its head, up to the blank line).
fn respond(head: &[u8], shared: &crate::Shared) -> (&'static str, &'static str, String) {
    let line = head
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, target) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    if method != b"GET" {
        return (
            "405 Method Not Allowed",
            "Allow: GET\r\n",
            "only GET is served\n".to_string(),
        );
    }
    if path == b"/metrics" || path == b"/" {
        ("200 OK", "", shared.metrics())
    } else {
        (
            "404 Not Found",
            "",
            "only GET /metrics is served\n".to_string(),
        )
    }
}

fn answer(c: &mut dyn Stream, shared: &crate::Shared) -> io::Result<()> {
    c.prepare()?;
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let (status, headers, body) = respond(&req, shared);
    // One write: pieces would each wait for the scraper's delayed ACK.
    let mut out = String::with_capacity(body.len() + 160);
    let _ = write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         {headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(out.as_bytes())?;
    c.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_loopback_or_unix() {
        assert!("127.0.0.1:9464".parse::<MetricsAddr>().is_ok());
        assert!("[::1]:9464".parse::<MetricsAddr>().is_ok());
        assert!("0.0.0.0:9464".parse::<MetricsAddr>().is_err());
        assert!("unix:/tmp/m.sock".parse::<MetricsAddr>().is_ok());
        assert!("unix:m.sock".parse::<MetricsAddr>().is_err());
    }

    #[test]
    fn text_format_escapes_labels() {
        let mut s = Snapshot::default();
        let mut name = [0u8; 16];
        name[..4].copy_from_slice(b"a\"b\\");
        let row = Row {
            pid: 7,
            uid: 0,
            name,
            volatile: 42,
            pinned: 0,
            purged: 0,
            obeyed: 0,
            freed: 0,
            quiet_ms: 0,
            responsive: 1,
        };
        s.rows.push(Participant {
            row,
            cgroup: "/sys/fs/cgroup/memory/app".into(),
        });
        let text = render(&s);
        assert!(text.contains(
            "vrange_participant_volatile_bytes{name=\"a\\\"b\\\\\",cgroup=\"/sys/fs/cgroup/memory/app\"} 42"
        ), "{text}");
        assert!(text.contains("# TYPE vrange_coordinator_freed_bytes_total counter"));
    }
}
