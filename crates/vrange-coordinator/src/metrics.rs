//! Prometheus text metrics, served over HTTP on a loopback address or a UNIX socket.
//!
//! The server is written by hand: one endpoint (`GET /metrics`), one request per connection, a
//! request read to at most 8 KiB within two seconds, so that a slow or hostile scraper cannot
//! hold the coordinator's memory or its loop (it runs in a thread of its own).

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

impl std::str::FromStr for MetricsAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<MetricsAddr, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if !path.starts_with('/') {
                return Err(format!("{s}: the socket path must be absolute"));
            }
            return Ok(MetricsAddr::Unix(PathBuf::from(path)));
        }
        let addr: SocketAddr = s
            .parse()
            .map_err(|_| format!("{s}: not ADDRESS:PORT or unix:/PATH"))?;
        if !addr.ip().is_loopback() {
            return Err(format!(
                "{s}: metrics are served on loopback only (or a UNIX socket)"
            ));
        }
        Ok(MetricsAddr::Tcp(addr))
    }
}

/// What the coordinator's loop last published.
#[derive(Default)]
pub(crate) struct Snapshot {
    pub status: Status,
    pub rows: Vec<Row>,
    /// Pressure events by `scope::Event`.
    pub events: [u64; 3],
    pub rounds_done: u64,
    /// `Room` requests received (participants about to map memory, their headroom short).
    pub rooms: u64,
    pub last_response: Duration,
    pub last_cut: Option<Cut>,
    /// OOM kills in the coordinated cgroup (`None`: the machine, or no counter).
    pub oom_kills: Option<u64>,
}

fn escape(label: &[u8]) -> String {
    let text = String::from_utf8_lossy(label);
    let text = text.trim_end_matches('\0');
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

/// The snapshot in Prometheus text exposition format (version 0.0.4).
pub(crate) fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in samples {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let one = |v: u64| vec![(String::new(), v as f64)];
    let st = &s.status;
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
        "Connections refused or dropped (credentials, malformed messages).",
        &one(st.refused),
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
            s.last_cut.map_or(0.0, |c| c.min_age_ms as f64 / 1000.0),
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
    let per = |f: fn(&Row) -> u64| -> Vec<(String, f64)> {
        s.rows
            .iter()
            .map(|r| {
                (
                    format!("{{pid=\"{}\",name=\"{}\"}}", r.pid, escape(&r.name)),
                    f(r) as f64,
                )
            })
            .collect()
    };
    for (name, kind, help, f) in [
        (
            "vrange_participant_volatile_bytes",
            "gauge",
            "Volatile bytes the participant holds.",
            (|r: &Row| r.volatile) as fn(&Row) -> u64,
        ),
        (
            "vrange_participant_pinned_bytes",
            "gauge",
            "Managed bytes in use.",
            |r: &Row| r.pinned,
        ),
        (
            "vrange_participant_purged_bytes",
            "gauge",
            "Purged bytes not yet reused.",
            |r: &Row| r.purged,
        ),
        (
            "vrange_participant_requests_obeyed_total",
            "counter",
            "Purge requests obeyed.",
            |r: &Row| r.obeyed,
        ),
        (
            "vrange_participant_freed_bytes_total",
            "counter",
            "Bytes freed for the coordinator.",
            |r: &Row| r.freed,
        ),
        (
            "vrange_participant_responsive",
            "gauge",
            "1 if the participant answers its requests in time.",
            |r: &Row| u64::from(r.responsive),
        ),
    ] {
        metric(name, kind, help, &per(f));
    }
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
                let _ = std::fs::remove_file(p);
                Server::Unix(UnixListener::bind(p)?, p.clone())
            }
        };
        match &s {
            Server::Tcp(l) => l.set_nonblocking(true)?,
            Server::Unix(l, _) => l.set_nonblocking(true)?,
        }
        Ok(s)
    }

    /// Answers scrapes until the coordinator stops (checked every 100 ms).
    pub fn serve(self, shared: &crate::Shared) {
        while !shared.stop.load(Relaxed) {
            let accepted: io::Result<Box<dyn Stream>> = match &self {
                Server::Tcp(l) => l.accept().map(|(c, _)| Box::new(c) as Box<dyn Stream>),
                Server::Unix(l, _) => l.accept().map(|(c, _)| Box::new(c) as Box<dyn Stream>),
            };
            match accepted {
                Ok(mut c) => {
                    let _ = answer(&mut *c, shared);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        if let Server::Unix(_, p) = &self {
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
    let line = req.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, body) = if line.starts_with(b"GET /metrics ") || line.starts_with(b"GET / ") {
        ("200 OK", shared.metrics())
    } else {
        ("404 Not Found", "only GET /metrics is served\n".to_string())
    };
    write!(
        c,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
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
        s.rows.push(Row {
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
        });
        let text = render(&s);
        assert!(
            text.contains("vrange_participant_volatile_bytes{pid=\"7\",name=\"a\\\"b\\\\\"} 42")
        );
        assert!(text.contains("# TYPE vrange_coordinator_freed_bytes_total counter"));
    }
}
