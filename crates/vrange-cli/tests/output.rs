//! What the command prints holds up where Unix tools' output goes: into a pipe whose reader
//! stops early (`| head`), and onto a terminal narrower than a line (`vrange top` at 80
//! columns).

// ci: host only: pipes and terminals

mod common;
use common::vrange;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A coordinator on a socket of its own, stopped (SIGTERM) when dropped.
struct Daemon {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("coordinator.sock");
        let child = vrange()
            .args(["daemon", "--machine", "--socket"])
            .arg(&socket)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !socket.exists() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(socket.exists(), "the daemon did not start");
        Daemon {
            child,
            socket,
            _dir: dir,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Starts `cmd` with its output into a pipe, reads its first line, closes the pipe as `head -1`
/// does, and returns how the command ended and what it said on stderr.
fn into_head(mut cmd: Command) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty(), "no first line");
    // The reader is gone (dropped above); the next line written meets a closed pipe.
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "still running with its reader gone"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}

/// Ended as `yes | head` does: killed by SIGPIPE, nothing on stderr (not a panic, 101).
fn assert_quiet_sigpipe(status: std::process::ExitStatus, stderr: &str) {
    assert_eq!(
        status.signal(),
        Some(libc::SIGPIPE),
        "{status:?}, stderr:\n{stderr}"
    );
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn top_into_head_ends_quietly_not_with_a_broken_pipe_panic() {
    let d = Daemon::start();
    let mut top = vrange();
    top.args(["top", "--interval", "100ms", "--socket"])
        .arg(&d.socket);
    let (status, err) = into_head(top);
    assert_quiet_sigpipe(status, &err);
}

#[test]
fn stat_watch_into_head_ends_quietly_not_with_a_broken_pipe_panic() {
    let mut sleeper = Command::new("sleep").arg("3600").spawn().unwrap();
    let mut stat = vrange();
    stat.args([
        "stat",
        &sleeper.id().to_string(),
        "--watch",
        "--interval",
        "100ms",
    ]);
    let (status, err) = into_head(stat);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_quiet_sigpipe(status, &err);
}

#[test]
fn features_into_a_closed_pipe_ends_quietly() {
    let mut features = vrange();
    features.arg("features");
    let (status, err) = into_head(features);
    // It may have written everything before the reader went away.
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
        "{status:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// The longest line of `text`, in characters.
fn widest(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

fn top_once(socket: &Path) -> Command {
    let mut c = vrange();
    c.args(["top", "--once", "--socket"]).arg(socket);
    c
}

#[test]
fn top_at_80_columns_cuts_its_lines_instead_of_wrapping() {
    let d = Daemon::start();
    // Wider than 80 uncut: the header names the socket, the titles take 85 columns.
    let wide = top_once(&d.socket).output().unwrap();
    let wide = String::from_utf8_lossy(&wide.stdout).into_owned();
    assert!(widest(&wide) > 80, "the test needs a line over 80:\n{wide}");

    let cut = top_once(&d.socket).env("COLUMNS", "80").output().unwrap();
    assert!(cut.status.success(), "{cut:?}");
    let text = String::from_utf8_lossy(&cut.stdout);
    assert!(widest(&text) <= 80, "{text}");
    assert!(text.starts_with("vrange top: "), "{text}");
    assert!(text.contains("PID"), "{text}");

    // On a real terminal 80 columns wide (TIOCGWINSZ), without COLUMNS.
    if Command::new("script").arg("--version").output().is_err() {
        return vrange_testkit::skip("script(1) missing: no pseudo-terminal");
    }
    let inner = format!(
        "stty cols 80 rows 24; exec '{}' top --once --socket '{}'",
        env!("CARGO_BIN_EXE_vrange"),
        d.socket.display()
    );
    let mut script = Command::new("script");
    script
        .args(["-qec", &inner, "/dev/null"])
        .env_remove("COLUMNS")
        .stdin(Stdio::null());
    vrange_testkit::proc::without_vrange_env(&mut script);
    let tty = script.output().unwrap();
    let text = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.status.success(), "{tty:?}");
    assert!(text.contains("vrange top: "), "{text}");
    assert!(widest(&text.replace('\r', "")) <= 80, "{text}");
}
