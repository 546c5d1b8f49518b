//! Spawned processes: how a process ended ([`Exit`]), a running process read line by line and
//! reaped on every path ([`Proc`]), the environment a started process must not inherit, and
//! small helpers for commands a test runs to completion. The tests and vrange-bench's suites
//! use the same ones.

// `inherit_fd` clears close-on-exec on a descriptor by number in the child between fork and
// exec: the test plays the program that passes a descriptor on, not vrange.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `exit(code)` or `_exit(code)`.
    Code(i32),
    /// Killed by this signal (`SIGKILL` is also what the OOM killer sends: a test that expects
    /// an OOM kill checks the cgroup's count too).
    Signal(i32),
    /// Still running at the deadline; it was killed with SIGKILL and reaped.
    TimedOut,
}

impl Exit {
    /// The exit code a forked child uses when its body panicked ([`crate::fork::fork_linked`]):
    /// the one Rust's runtime exits with after a panic in `main`, so that it reads the same for
    /// a spawned Rust program, and a program's usage error (2) is not taken for a panic.
    pub const PANICKED: i32 = 101;

    /// From a `waitpid` status. Allocation-free.
    pub fn from_wait_status(status: i32) -> Exit {
        if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            Exit::Code(libc::WEXITSTATUS(status))
        }
    }

    /// From what [`std::process::Child`] reports.
    pub fn from_status(status: ExitStatus) -> Exit {
        match status.signal() {
            Some(s) => Exit::Signal(s),
            None => Exit::Code(status.code().unwrap_or(-1)),
        }
    }

    /// As one word, for passing through a [`crate::fork::Link`].
    pub fn encode(self) -> u64 {
        match self {
            Exit::Code(c) => c as u32 as u64,
            Exit::Signal(s) => 1 << 32 | s as u32 as u64,
            Exit::TimedOut => 2 << 32,
        }
    }

    /// The inverse of [`Exit::encode`].
    pub fn decode(word: u64) -> Exit {
        match word >> 32 {
            0 => Exit::Code(word as u32 as i32),
            1 => Exit::Signal(word as u32 as i32),
            _ => Exit::TimedOut,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(Exit::PANICKED) => write!(f, "exit {} (a panic)", Exit::PANICKED),
            Exit::Code(c) => write!(f, "exit {c}"),
            Exit::Signal(libc::SIGKILL) => write!(f, "SIGKILL"),
            Exit::Signal(libc::SIGSEGV) => write!(f, "SIGSEGV"),
            Exit::Signal(libc::SIGABRT) => write!(f, "SIGABRT"),
            Exit::Signal(s) => write!(f, "signal {s}"),
            Exit::TimedOut => write!(f, "timed out (killed)"),
        }
    }
}

/// A spawned process with piped stdio: its stdout read line by line, its stderr kept. Dropping
/// it kills (SIGKILL) and reaps the process if it has not ended, so no path of a failing test
/// leaves one behind (and its cgroup can be removed).
pub struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stderr_reader: Option<JoinHandle<()>>,
    ended: Option<Exit>,
}

impl Proc {
    /// Spawns `cmd` with piped stdin, stdout and stderr; panics if it cannot be started.
    pub fn spawn(cmd: Command) -> Proc {
        Proc::try_spawn(cmd).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Spawns `cmd` with piped stdin, stdout and stderr, or says why it cannot be started (a
    /// benchmark reports it and goes on).
    pub fn try_spawn(mut cmd: Command) -> Result<Proc, String> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr_pipe = child.stderr.take().expect("piped stderr");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match stderr_pipe.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sink
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_str(&String::from_utf8_lossy(&buf[..n])),
                }
            }
        });
        Ok(Proc {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
            ended: None,
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends one line to the process's stdin; false if it no longer reads.
    pub fn send(&mut self, line: &str) -> bool {
        match self.stdin.as_mut() {
            Some(s) => writeln!(s, "{line}").and_then(|_| s.flush()).is_ok(),
            None => false,
        }
    }

    /// Closes the process's stdin: it reads end of file.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next stdout line, waiting at most `timeout`.
    pub fn next_line(&self, timeout: Duration) -> Result<String, RecvTimeoutError> {
        self.lines.recv_timeout(timeout)
    }

    /// The stdout lines already received, without waiting, and whether stdout is closed (the
    /// process has ended or is ending).
    pub fn pending_lines(&self) -> (Vec<String>, bool) {
        let mut lines = Vec::new();
        loop {
            match self.lines.try_recv() {
                Ok(line) => lines.push(line),
                Err(TryRecvError::Empty) => return (lines, false),
                Err(TryRecvError::Disconnected) => return (lines, true),
            }
        }
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

    /// How the process ended, if it has (without waiting).
    pub fn ended(&mut self) -> Option<Exit> {
        if self.ended.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.ended = Some(Exit::from_status(status));
            }
        }
        self.ended
    }

    /// Waits for the process to end, at most `timeout`; past it the process is killed and
    /// reaped and [`Exit::TimedOut`] returned.
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
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Everything the process wrote to stderr: waits until it closes stderr (it has ended).
    pub fn stderr(&mut self) -> String {
        if let Some(t) = self.stderr_reader.take() {
            let _ = t.join();
        }
        self.stderr_so_far()
    }

    /// What the process has written to stderr so far.
    pub fn stderr_so_far(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

/// Runs `cmd` to completion, capturing its output; panics if it cannot be started.
pub fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// A command's exit status, stdout and stderr, for failure messages.
pub fn show(out: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Keeps every `VRANGE_*` variable of the test's own environment out of `cmd`: each test
/// decides the settings of the processes it starts.
pub fn without_vrange_env(cmd: &mut Command) -> &mut Command {
    without_env(cmd, |n| n.starts_with("VRANGE_"))
}

/// Keeps every variable that steers some allocator out of `cmd` (`LD_PRELOAD`,
/// `GLIBC_TUNABLES`, `MALLOC_*`, `MIMALLOC_*`, `TCMALLOC_*`, `VRANGE_*`): a benchmark's run is
/// exactly its configuration, whatever the caller's environment.
pub fn without_allocator_env(cmd: &mut Command) -> &mut Command {
    without_env(cmd, |n| {
        n == "LD_PRELOAD"
            || n == "GLIBC_TUNABLES"
            || ["MALLOC_", "MIMALLOC_", "TCMALLOC_", "VRANGE_"]
                .iter()
                .any(|p| n.starts_with(p))
    })
}

/// A command for `program` without any allocator variable of this process's environment
/// ([`without_allocator_env`]).
pub fn clean_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    without_allocator_env(&mut cmd);
    cmd
}

/// Removes from `cmd` the variables of this process's environment whose names `steers`.
fn without_env(cmd: &mut Command, steers: impl Fn(&str) -> bool) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if steers(&name.to_string_lossy()) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Keeps descriptor `fd` open across exec in the child of `cmd` (clears close-on-exec on the
/// child's copy only). The caller must keep `fd` open until the child is spawned.
pub fn inherit_fd(cmd: &mut Command, fd: i32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook only calls fcntl(2) and builds an io::Error from errno.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// What every thread of process `pid` is doing, a line each: its name, state, the kernel
/// function it waits in, its system call line (number, arguments, stack pointer and program
/// counter: see proc(5)) with the mapping that holds the program counter, and its kernel stack
/// where readable (root). For the report of a test whose process hung, read before it is
/// killed.
pub fn task_states(pid: i32) -> String {
    use vrange_sys::procfs::{self, Syscall};
    let pid = pid as u32;
    let shown = |text: std::io::Result<String>| text.unwrap_or_else(|e| format!("({e})"));
    let maps = procfs::maps(Some(pid)).unwrap_or_default();
    let mapping_of = |pc: u64| {
        maps.iter()
            .find(|m| (m.start as u64..m.end as u64).contains(&pc))
            .map_or("", |m| m.line.as_str())
            .to_string()
    };
    let Ok(tids) = procfs::tasks(Some(pid)) else {
        return format!("process {pid} has no /proc entry (it ended)");
    };
    let mut out = String::new();
    for tid in tids {
        let syscall = procfs::task_syscall(Some(pid), tid);
        let (call, at) = match &syscall {
            Ok(s) => (s.to_string(), s.pc().map(&mapping_of).unwrap_or_default()),
            Err(e) => (format!("({e})"), String::new()),
        };
        out += &format!(
            "{} {} state={} wchan={} syscall={call} at {at}\n{}\n",
            procfs::path(Some(pid), &format!("task/{tid}")),
            shown(procfs::task_comm(Some(pid), tid)),
            procfs::task_stat(Some(pid), tid).map_or('?', |s| s.state),
            shown(procfs::task_wchan(Some(pid), tid)),
            shown(procfs::task_stack(Some(pid), tid)),
        );
        // A thread running in user mode has no system call line: where it spins, sampled.
        if let Ok(Syscall::Running) = syscall {
            for _ in 0..4 {
                if let Some(pc) = sample_pc(tid as i32) {
                    out += &format!("  user pc {pc:#x} in {}\n", mapping_of(pc));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    out
}

/// The user-mode program counter of thread `tid` (x86_64), read with ptrace: the thread is
/// stopped for the reading and let go. None where ptrace is not allowed (root may; the
/// thread's own parent may under Yama's default) or on another architecture.
fn sample_pc(tid: i32) -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: ptrace on a thread of a process this test made; `regs` is a valid out-
        // parameter of the size PTRACE_GETREGS writes; the thread is detached before return.
        unsafe {
            let none = std::ptr::null_mut::<libc::c_void>();
            if libc::ptrace(libc::PTRACE_SEIZE, tid, none, none) != 0 {
                return None;
            }
            libc::ptrace(libc::PTRACE_INTERRUPT, tid, none, none);
            let mut status = 0;
            libc::waitpid(tid, &mut status, libc::__WALL);
            let mut regs: libc::user_regs_struct = std::mem::zeroed();
            let got = libc::ptrace(
                libc::PTRACE_GETREGS,
                tid,
                none,
                &mut regs as *mut libc::user_regs_struct as *mut libc::c_void,
            ) == 0;
            libc::ptrace(libc::PTRACE_DETACH, tid, none, none);
            got.then_some(regs.rip)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = tid;
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    /// Runs `cmd` and describes it ([`super::task_states`]) until the description holds every
    /// one of `wanted` (a started process takes a moment to exec and settle, longer in an emulated
    /// guest under load: starting `sh` over 9p took more than 20 s), at most 60 s; then kills
    /// it. Returns the last description and the pid.
    fn described_until(cmd: &mut std::process::Command, wanted: &[&str]) -> (String, i32) {
        let mut child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(60);
        let states = loop {
            let s = super::task_states(pid);
            if wanted.iter().all(|w| s.contains(w)) || Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        (states, pid)
    }

    #[test]
    fn a_spinning_thread_is_sampled() {
        let (states, _) = described_until(
            std::process::Command::new("sh").args(["-c", "while :; do :; done"]),
            // Its user pc is sampled in any state (a task blocked loading its program over
            // 9p has one too): running is the state asked for.
            &["state=R", "user pc 0x"],
        );
        assert!(states.contains("state=R"), "{states}");
        assert!(states.contains("user pc 0x"), "{states}");
    }

    #[test]
    fn task_states_name_each_thread_and_where_it_waits() {
        let (states, pid) = described_until(
            std::process::Command::new("sleep").arg("30"),
            &["sleep state=S"],
        );
        assert!(states.contains("sleep state=S"), "{states}");
        assert!(states.contains("syscall="), "{states}");
        assert!(super::task_states(pid).contains("no /proc entry"));
    }
}
