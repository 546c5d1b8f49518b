//! Child processes for the suites: compiling the C workloads, starting processes inside a
//! memory cgroup, reading their output line by line, and the child cgroups themselves.

use std::io::{BufRead, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};
use vrange_sys::cgroup::{unique_name, ChildCgroup, MemCgroup};

/// Writes `source` as `dir/name.c` and compiles it to `dir/name` with `$CC` (default gcc).
pub fn compile(dir: &Path, name: &str, source: &str) -> Result<PathBuf, String> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).map_err(|e| format!("write {}: {e}", src.display()))?;
    let exe = dir.join(name);
    let cc = std::env::var("CC")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "gcc".into());
    let out = Command::new(&cc)
        .args(["-O2", "-pthread", "-Wall", "-Wextra", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run {cc} (install gcc or set CC): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "compiling {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A fresh child memory cgroup limited to `limit` bytes, or why there cannot be one.
pub fn child_cgroup(prefix: &str, limit: u64) -> Result<ChildCgroup, String> {
    if !is_root() {
        return Err("not root: creating a memory cgroup needs root".into());
    }
    let parent = MemCgroup::current().ok_or("this process has no readable memory cgroup")?;
    parent
        .create_child(&unique_name(prefix), limit)
        .map_err(|e| {
            format!(
                "cannot create a memory cgroup under {}: {e}",
                parent.path().display()
            )
        })
}

/// Makes the child of `cmd` join the cgroup whose `cgroup.procs` is `procs` before it execs,
/// so everything it faults in is charged there.
pub fn join_cgroup_before_exec(cmd: &mut Command, procs: &Path) -> Result<(), String> {
    vrange_sys::cgroup::join_before_exec(cmd, procs)
        .map_err(|e| format!("open {}: {e}", procs.display()))
}

/// Whether a variable steers some allocator (and must not leak into a measured process).
fn steers(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    name == "LD_PRELOAD"
        || name == "GLIBC_TUNABLES"
        || ["MALLOC_", "MIMALLOC_", "VRANGE_", "TCMALLOC_"]
            .iter()
            .any(|p| name.starts_with(p))
}

/// A command for `exe` with every allocator variable of our caller removed, so that each run
/// is exactly its configuration.
pub fn clean_command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    for (name, _) in std::env::vars_os() {
        if steers(&name) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    TimedOut,
}

impl Exit {
    fn of(status: ExitStatus) -> Exit {
        match status.signal() {
            Some(s) => Exit::Signal(s),
            None => Exit::Code(status.code().unwrap_or(-1)),
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit {c}"),
            Exit::Signal(libc::SIGKILL) => write!(f, "SIGKILL"),
            Exit::Signal(libc::SIGSEGV) => write!(f, "SIGSEGV"),
            Exit::Signal(libc::SIGABRT) => write!(f, "SIGABRT"),
            Exit::Signal(s) => write!(f, "signal {s}"),
            Exit::TimedOut => write!(f, "timed out"),
        }
    }
}

/// A running child: stdout read line by line, stderr kept. Dropping it kills and reaps it if
/// it has not ended, so no path leaves one behind (and its cgroup can be removed).
pub struct Proc {
    child: Child,
    pub stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    ended: Option<Exit>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Result<Proc, String> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
        let out = child.stdout.take().expect("piped stdout");
        let mut err = child.stderr.take().expect("piped stderr");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        Ok(Proc {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr: Some(stderr),
            ended: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line starting with `tag`, waiting until `deadline`; earlier lines are
    /// skipped. `None` at the deadline or when the process closed its stdout.
    pub fn line(&self, tag: &str, deadline: Instant) -> Option<String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).ok()?;
            if line.starts_with(tag) {
                return Some(line);
            }
        }
    }

    /// Whether the process has ended (without waiting).
    pub fn ended(&mut self) -> Option<Exit> {
        if self.ended.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.ended = Some(Exit::of(status));
            }
        }
        self.ended
    }

    /// Waits for the process to end, at most `timeout`; past it the process is killed.
    pub fn wait(&mut self, timeout: Duration) -> Exit {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.ended() {
                return e;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                self.ended = Some(Exit::TimedOut);
                return Exit::TimedOut;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Everything the process wrote to stderr (blocks until it closes stderr).
    pub fn stderr(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.ended().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `key=value` words of a line ("done vmpte_kb=608 secs=22.7").
pub fn field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

/// The Rss and LazyFree KiB of a process (zeros once it is gone).
pub fn rss_lazy_kb(pid: u32) -> (u64, u64) {
    vrange_sys::procfs::smaps_rollup(Some(pid as i32))
        .map_or((0, 0), |s| (s.rss_kb, s.lazy_free_kb))
}

/// This process's (minor, major) page faults so far.
pub fn page_faults() -> (u64, u64) {
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    (u.ru_minflt as u64, u.ru_majflt as u64)
}

/// A file holding one number (a cgroup counter).
pub fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The cgroup's peak usage (v1 max_usage_in_bytes, v2 memory.peak).
pub fn cgroup_peak(cg: &MemCgroup) -> Option<u64> {
    ["memory.max_usage_in_bytes", "memory.peak"]
        .iter()
        .find_map(|f| read_u64(&cg.file(f)))
}
