//! Helpers shared by the integration tests: deterministic content and forced purges.

// Plays the program vrange is a guest in: closes, duplicates and inspects descriptors by
// number, which vrange's own code may only do through vrange_sys (clippy.toml).
#![allow(clippy::disallowed_methods)]
#![allow(dead_code)]

use vrange_sys::{mem, procfs};

/// The word `fill` writes at word index `i`: never zero, distinct per seed and position, so
/// that lost pages (zero) and misplaced pages are both visible.
pub fn pattern(seed: u64, i: usize) -> u64 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1
}

/// Fills `[ptr, ptr + len)` with `pattern(seed, word index from ptr)`.
pub fn fill(ptr: *mut u8, len: usize, seed: u64) {
    for i in 0..len / 8 {
        // SAFETY: test-owned memory; ptr..ptr+len is the test's own mapping.
        unsafe { (ptr as *mut u64).add(i).write(pattern(seed, i)) };
    }
}

/// Whether `[base + off, base + off + len)` still holds what `fill(base, _, seed)` wrote.
pub fn check_at(base: *const u8, off: usize, len: usize, seed: u64) -> bool {
    (off / 8..(off + len) / 8).all(|i| {
        // SAFETY: test-owned memory; the test's own mapping.
        unsafe { (base as *const u64).add(i).read_volatile() == pattern(seed, i) }
    })
}

/// Whether `[ptr, ptr + len)` holds exactly what `fill(ptr, len, seed)` wrote.
pub fn check(ptr: *const u8, len: usize, seed: u64) -> bool {
    check_at(ptr, 0, len, seed)
}

/// Whether every byte of the range is zero.
pub fn is_zero(ptr: *const u8, len: usize) -> bool {
    // SAFETY: test-owned memory; the test's own mapping.
    (0..len / 8).all(|i| unsafe { (ptr as *const u64).add(i).read_volatile() } == 0)
}

/// Forces the kernel to reclaim the range now: every clean lazy page is discarded, provided
/// the calling thread marked the pages on the CPU it runs on now (see [`pin_cpu`]).
pub fn force_purge(ptr: *mut u8, len: usize) {
    pin_cpu();
    mem::reclaim_now(ptr, len).expect("MADV_PAGEOUT");
}

/// Pins the calling thread to the CPU it runs on (once per thread), so that MADV_FREE and
/// MADV_PAGEOUT share a CPU and forced purges are deterministic (see
/// `vrange_sys::mem::reclaim_now`). Mappings made by the helpers below call it first.
pub fn pin_cpu() {
    thread_local!(static PINNED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if PINNED.with(|p| p.replace(true)) {
        return;
    }
    mem::pin_thread_to_current_cpu().expect("pin the test thread to its CPU");
}

/// LazyFree kB of the mapping containing `ptr`.
pub fn lazy_free_kb(ptr: *const u8) -> u64 {
    procfs::smaps_of(ptr as usize)
        .unwrap()
        .expect("mapped")
        .lazy_free_kb
}

/// A private anonymous mapping owned by a test, unmapped on drop.
pub struct Mapping {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Mapping {
    pub fn new(len: usize) -> Mapping {
        Mapping::aligned(len, mem::page_size(), false)
    }

    pub fn aligned(len: usize, align: usize, huge: bool) -> Mapping {
        pin_cpu();
        let ptr = mem::map_anon(len, align).expect("mmap").as_ptr();
        mem::advise_huge(ptr, len, huge).ok();
        Mapping { ptr, len }
    }

    pub fn page(&self, i: usize) -> *mut u8 {
        self.ptr.wrapping_add(i * mem::page_size())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Memory unmapped while volatile must be forgotten, or a later mapping at the same
        // address would inherit its page states.
        // SAFETY: test-owned memory; the mapping is owned by this value and about to go.
        unsafe { vrange::forget(self.ptr, self.len).unwrap() };
        // SAFETY: test-owned memory; the mapping is owned by this value.
        unsafe { mem::unmap(std::ptr::NonNull::new(self.ptr).unwrap(), self.len) };
    }
}

// ---- Forked processes (fork.rs, pressure.rs) ----
//
// A test process has many threads (libtest runs tests in parallel), so a forked child may only
// do simple things: no allocation it can avoid, no locks (no println!). Everything below that a
// child calls makes system calls only.

/// Serialises the tests of one binary that fork: a fork copies every mapping of the process, so
/// a concurrent test's pages would be shared (and MADV_FREE/MADV_PAGEOUT skip shared pages),
/// and its pipe descriptors would be held open by the wrong child.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Why [`Link::recv`] returned no message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkError {
    /// The other end closed (exited or crashed) after sending this many bytes of the message.
    Closed(usize),
    /// Nothing complete arrived in time.
    Timeout,
    /// poll(2) or read(2) failed with this errno.
    Os(i32),
}

/// One end of a two-way channel between forked processes: messages of `u64` words over a pair
/// of pipes. Allocation-free, so a forked child may use it. Closes its descriptors on drop.
#[derive(Debug)]
pub struct Link {
    rx: i32,
    tx: i32,
}

impl Link {
    /// A connected pair: what one end sends, the other receives.
    pub fn pair() -> (Link, Link) {
        let (mut a, mut b) = ([0i32; 2], [0i32; 2]);
        // SAFETY: pipe2 writes two descriptors into each two-element array.
        let ok = unsafe {
            libc::pipe2(a.as_mut_ptr(), libc::O_CLOEXEC) == 0
                && libc::pipe2(b.as_mut_ptr(), libc::O_CLOEXEC) == 0
        };
        assert!(ok, "pipe2: {}", std::io::Error::last_os_error());
        (Link { rx: a[0], tx: b[1] }, Link { rx: b[0], tx: a[1] })
    }

    /// Sends `words` as one write(2), atomic below PIPE_BUF; false if the other end is gone.
    pub fn send(&self, words: &[u64]) -> bool {
        let bytes = std::mem::size_of_val(words);
        debug_assert!(bytes <= libc::PIPE_BUF);
        loop {
            // SAFETY: words is readable for `bytes` bytes.
            let n = unsafe { libc::write(self.tx, words.as_ptr().cast(), bytes) };
            if n < 0 && last_errno() == libc::EINTR {
                continue;
            }
            return n == bytes as isize;
        }
    }

    /// Receives one message of `N` words, waiting at most `timeout` for all of it.
    pub fn recv<const N: usize>(
        &self,
        timeout: std::time::Duration,
    ) -> Result<[u64; N], LinkError> {
        let deadline = std::time::Instant::now() + timeout;
        let mut words = [0u64; N];
        let total = std::mem::size_of_val(&words);
        let mut got = 0;
        while got < total {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.rx,
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: pfd is one valid pollfd.
            match unsafe { libc::poll(&mut pfd, 1, ms) } {
                0 => return Err(LinkError::Timeout),
                rc if rc < 0 && last_errno() == libc::EINTR => continue,
                rc if rc < 0 => return Err(LinkError::Os(last_errno())),
                _ => {}
            }
            // SAFETY: the destination is the unfilled tail of `words`, total - got bytes long.
            let n = unsafe {
                libc::read(
                    self.rx,
                    words.as_mut_ptr().cast::<u8>().add(got).cast(),
                    total - got,
                )
            };
            match n {
                0 => return Err(LinkError::Closed(got)),
                n if n < 0 && last_errno() == libc::EINTR => continue,
                n if n < 0 => return Err(LinkError::Os(last_errno())),
                n => got += n as usize,
            }
        }
        Ok(words)
    }

    /// Closes this end's descriptors in a forked process that inherited a link it does not use
    /// and will leave with `_exit` (so `Drop` never runs there).
    pub fn close_inherited(&self) {
        // SAFETY: closing descriptors this process owns; nothing in it uses them afterwards.
        unsafe {
            libc::close(self.rx);
            libc::close(self.tx);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.close_inherited();
    }
}

/// How a child process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `_exit(code)`.
    Code(i32),
    /// Killed by this signal (9 is also what the OOM killer sends).
    Signal(i32),
    /// Still running at the deadline; it was killed with SIGKILL and reaped.
    TimedOut,
}

impl Exit {
    /// The exit code a forked child uses when its body panicked.
    pub const PANICKED: i32 = 2;

    /// As one word, for passing through a [`Link`].
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
            Exit::Code(Exit::PANICKED) => write!(f, "exit code {} (panicked)", Exit::PANICKED),
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => write!(f, "killed by signal {s}"),
            Exit::TimedOut => write!(f, "still running at the deadline (killed)"),
        }
    }
}

/// A forked child process. Dropping it without [`Forked::wait`] kills (SIGKILL) and reaps it,
/// so a failing test never leaves one behind.
#[derive(Debug)]
pub struct Forked {
    pid: i32,
    reaped: bool,
}

impl Forked {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the child to end, at most `timeout`; past it the child is killed and reaped
    /// and [`Exit::TimedOut`] returned. Allocation-free.
    pub fn wait(&mut self, timeout: std::time::Duration) -> Exit {
        let deadline = std::time::Instant::now() + timeout;
        let mut status = 0;
        loop {
            // SAFETY: status is a valid int; pid is our unreaped child.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if rc == self.pid {
                self.reaped = true;
                return if libc::WIFSIGNALED(status) {
                    Exit::Signal(libc::WTERMSIG(status))
                } else {
                    Exit::Code(libc::WEXITSTATUS(status))
                };
            }
            if rc < 0 && last_errno() != libc::EINTR {
                self.reaped = true;
                return Exit::Code(-1);
            }
            if std::time::Instant::now() >= deadline {
                self.kill();
                return Exit::TimedOut;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn kill(&mut self) {
        // SAFETY: pid is our unreaped child, so it cannot have been recycled; status may be
        // null.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
        self.reaped = true;
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill();
        }
    }
}

/// Forks. The child runs `body` with its end of a fresh [`Link`] and leaves with
/// `_exit(body's result)`, or `_exit(Exit::PANICKED)` if it panics; it never returns into the
/// test harness. The parent gets the child and its own end of the link.
pub fn fork_linked(body: impl FnOnce(&Link) -> i32) -> (Forked, Link) {
    let (ours, theirs) = Link::pair();
    // SAFETY: the child below only runs `body` (which the caller keeps to simple,
    // allocation-free work) and leaves with _exit, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        drop(ours);
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&theirs)))
            .unwrap_or(Exit::PANICKED);
        // SAFETY: _exit ends this process at once, without running the parent's atexit
        // handlers or destructors.
        unsafe { libc::_exit(code) };
    }
    drop(theirs);
    (Forked { pid, reaped: false }, ours)
}

// ---- Re-executed role processes (managed_pressure.rs, shared.rs) ----
//
// A fork of the multi-threaded harness may only make system calls. A test that needs a child
// with a runtime of its own (its own reclaimer thread, its own cgroup from its first
// allocation) re-executes the test binary instead: [`role_command`] runs only the named test,
// with `VRANGE_TEST_ROLE` naming the role, and the test function calls [`role`] first and plays
// the role instead of running the test. The processes talk in lines: the test writes commands
// to the child's stdin ([`Role::send`]), the child answers on stdout with [`say`] ("VRT TAG
// key=value ..."). Everything else the child prints is kept for failure messages.

/// The environment variable naming the role of a re-executed test process.
pub const ROLE_ENV: &str = "VRANGE_TEST_ROLE";

/// The role this process was started to play, if it is a re-executed role process.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// A command that re-executes this test binary to run only `test` as `role`, with piped stdio
/// and no `VRANGE_*` setting inherited from the test's environment.
pub fn role_command(test: &str, role: &str) -> std::process::Command {
    use std::process::Stdio;
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in vrange::OPTIONS {
        cmd.env_remove(name);
    }
    cmd
}

/// Makes the child of `cmd` join the cgroup whose `cgroup.procs` file is `procs` between fork
/// and exec, so that everything the new program allocates is charged to it (cgroup v1 does not
/// move charges with a process). Writing "0" moves the writer itself.
pub fn join_cgroup_before_exec(
    cmd: &mut std::process::Command,
    procs: &std::path::Path,
) -> std::io::Result<()> {
    vrange_sys::cgroup::join_before_exec(cmd, procs)
}

/// Keeps descriptor `fd` open across exec in the child of `cmd` (clears close-on-exec on the
/// child's copy only). The caller must keep `fd` open until the child is spawned.
pub fn inherit_fd(cmd: &mut std::process::Command, fd: i32) {
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

/// In a role process: one answer line to the test process, "VRT " and `line`.
pub fn say(line: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "VRT {line}")
        .and_then(|_| out.flush())
        .expect("stdout");
}

/// In a role process: the next command line from the test process (trimmed); `None` at end of
/// input (the test process is gone or done).
pub fn command() -> Option<String> {
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim().to_string()),
    }
}

/// One answer of a role process: a tag and `key=value` fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub tag: String,
    pub fields: Vec<(String, String)>,
}

impl Reply {
    fn parse(line: &str) -> Reply {
        let mut words = line.split_whitespace();
        let tag = words.next().unwrap_or_default().to_string();
        let fields = words
            .map(|w| match w.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (w.to_string(), String::new()),
            })
            .collect();
        Reply { tag, fields }
    }

    /// The field `key` as text.
    pub fn str(&self, key: &str) -> &str {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no field {key} in {self:?}"))
    }

    /// The field `key` as a number.
    pub fn u64(&self, key: &str) -> u64 {
        let v = self.str(key);
        v.parse()
            .unwrap_or_else(|_| panic!("field {key}={v:?} is not a number in {self:?}"))
    }
}

/// A running role process. Dropping it kills (SIGKILL) and reaps the process if it has not
/// been waited for, so a failing test never leaves one behind.
pub struct Role {
    name: String,
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    transcript: Vec<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    ended: Option<Exit>,
}

impl Role {
    /// Spawns `cmd` (made by [`role_command`]), calling the process `name` in messages.
    pub fn spawn(name: &str, mut cmd: std::process::Command) -> Role {
        use std::io::BufRead;
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn the {name} process: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr_pipe = child.stderr.take().expect("piped stderr");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr_pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        Role {
            name: name.to_string(),
            stdin: child.stdin.take(),
            child,
            lines,
            transcript: Vec::new(),
            stderr,
            ended: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends one command line; false if the process no longer reads.
    pub fn send(&mut self, line: &str) -> bool {
        use std::io::Write;
        match self.stdin.as_mut() {
            Some(s) => writeln!(s, "{line}").and_then(|_| s.flush()).is_ok(),
            None => false,
        }
    }

    /// The next answer, waiting at most `timeout`.
    pub fn next(&mut self, timeout: std::time::Duration) -> Result<Reply, String> {
        use std::sync::mpsc::RecvTimeoutError;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                // libtest may have printed "test name ... " without a newline just before.
                Ok(line) => match line.find("VRT ") {
                    Some(at) => {
                        if at > 0 {
                            self.transcript.push(line[..at].to_string());
                        }
                        return Ok(Reply::parse(&line[at + 4..]));
                    }
                    None => self.transcript.push(line),
                },
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!("no answer within {timeout:?}"))
                }
                Err(RecvTimeoutError::Disconnected) => return Err("its stdout closed".to_string()),
            }
        }
    }

    /// The next answer, which must be tagged `tag`; panics with the process's output otherwise.
    pub fn expect(&mut self, tag: &str, timeout: std::time::Duration) -> Reply {
        match self.next(timeout) {
            Ok(r) if r.tag == tag => r,
            Ok(r) => {
                let diagnostics = self.diagnostics();
                panic!("{}: expected {tag}, got {r:?}\n{diagnostics}", self.name)
            }
            Err(e) => {
                let exit = self.wait(std::time::Duration::from_secs(5));
                let diagnostics = self.diagnostics();
                panic!(
                    "{}: expected {tag}: {e}; it ended with {exit}\n{diagnostics}",
                    self.name
                )
            }
        }
    }

    /// Closes the process's stdin (its [`command`] returns `None`).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process to end, at most `timeout`; past it the process is killed and
    /// reaped and [`Exit::TimedOut`] returned.
    pub fn wait(&mut self, timeout: std::time::Duration) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        if let Some(e) = self.ended {
            return e;
        }
        let deadline = std::time::Instant::now() + timeout;
        let exit = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    break match status.signal() {
                        Some(s) => Exit::Signal(s),
                        None => Exit::Code(status.code().unwrap_or(-1)),
                    }
                }
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(2))
                }
                Ok(None) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break Exit::TimedOut;
                }
                Err(_) => break Exit::Code(-1),
            }
        };
        self.ended = Some(exit);
        exit
    }

    /// What the process printed besides its answers, and its stderr, for failure messages.
    pub fn diagnostics(&mut self) -> String {
        // Whatever is still in the pipe.
        while let Ok(line) = self.lines.try_recv() {
            self.transcript.push(line);
        }
        let stderr = self
            .stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        format!(
            "--- {} stdout ---\n{}\n--- {} stderr ---\n{}",
            self.name,
            self.transcript.join("\n"),
            self.name,
            stderr
        )
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if self.ended.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
