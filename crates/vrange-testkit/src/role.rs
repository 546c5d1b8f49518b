//! The test binary re-executed to play a role.
//!
//! A fork of the multi-threaded harness may only make system calls ([`crate::fork`]). A test
//! that needs a child with a runtime of its own (its own reclaimer thread, its own cgroup from
//! its first allocation) re-executes the test binary instead: [`role_command`] runs only the
//! named test, with `VRANGE_TEST_ROLE` naming the role, and the test function calls [`role`]
//! first and plays the role instead of running the test. The processes talk in lines: the test
//! writes commands to the child's stdin ([`Role::send`]), the child answers on stdout with
//! [`say`] ("VRT TAG key=value ..."). Everything else the child prints is kept for failure
//! messages.
//!
//! [`Reply`] reads such a line, and any line of the same shape: vrange-bench's processes and C
//! workloads report in `TAG key=value ...` lines too ([`field`]), its services one a second.

use crate::proc::{without_vrange_env, Exit, Proc};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// The environment variable naming the role of a re-executed test process.
pub const ROLE_ENV: &str = "VRANGE_TEST_ROLE";

/// The role this process was started to play, if it is a re-executed role process.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// A command that re-executes this test binary to run only `test` as `role`, with piped stdio
/// and no `VRANGE_*` setting inherited from the test's environment.
pub fn role_command(test: &str, role: &str) -> Command {
    role_command_at(
        &std::env::current_exe().expect("the test binary's path"),
        test,
        role,
    )
}

/// [`role_command`] for a copy of this test binary at `exe`.
pub fn role_command_at(exe: &std::path::Path, test: &str, role: &str) -> Command {
    let mut cmd = Command::new(exe);
    without_vrange_env(&mut cmd)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// In a role process: one answer line to the test process, "VRT " and `line`.
pub fn say(line: impl std::fmt::Display) {
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

/// One answer of a role process, or any line of the same shape: a tag and `key=value` fields
/// ("sec n=3 req=120 hit=97"; a line whose first word has a `=` has no tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub tag: String,
    pub fields: Vec<(String, String)>,
}

impl Reply {
    /// Reads `line`: the tag, then the fields (a word without `=` is a field with an empty
    /// value).
    pub fn parse(line: &str) -> Reply {
        let mut words = line.split_whitespace().peekable();
        let tag = match words.peek() {
            Some(w) if !w.contains('=') => words.next().unwrap_or_default().to_string(),
            _ => String::new(),
        };
        let fields = words
            .map(|w| match w.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (w.to_string(), String::new()),
            })
            .collect();
        Reply { tag, fields }
    }

    /// The field `key` as a `T`, if the line has it and it parses.
    pub fn get<T: std::str::FromStr>(&self, key: &str) -> Option<T> {
        self.value(key)?.parse().ok()
    }

    fn value(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The field `key` as text.
    pub fn str(&self, key: &str) -> &str {
        self.value(key)
            .unwrap_or_else(|| panic!("no field {key} in {self:?}"))
    }

    /// The field `key` as a number.
    pub fn u64(&self, key: &str) -> u64 {
        let v = self.str(key);
        v.parse()
            .unwrap_or_else(|_| panic!("field {key}={v:?} is not a number in {self:?}"))
    }
}

/// A running role process: a [`Proc`] that answers in "VRT" lines. Dropping it kills (SIGKILL)
/// and reaps the process if it has not been waited for.
pub struct Role {
    name: String,
    proc: Proc,
    transcript: Vec<String>,
}

impl Role {
    /// Spawns `cmd` (made by [`role_command`]), calling the process `name` in messages.
    pub fn spawn(name: &str, cmd: Command) -> Role {
        Role {
            name: name.to_string(),
            proc: Proc::spawn(cmd),
            transcript: Vec::new(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.proc.pid()
    }

    /// Sends one command line; false if the process no longer reads.
    pub fn send(&mut self, line: &str) -> bool {
        self.proc.send(line)
    }

    /// The next answer, waiting at most `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Result<Reply, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.proc.next_line(left) {
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
                // What each of its threads is doing, before anyone kills it: the report of a
                // role that hung.
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "no answer within {timeout:?}; its threads then:\n{}",
                        crate::proc::task_states(self.pid())
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => return Err("its stdout closed".to_string()),
            }
        }
    }

    /// The next answer, which must be tagged `tag`; panics with the process's output otherwise.
    pub fn expect(&mut self, tag: &str, timeout: Duration) -> Reply {
        match self.next(timeout) {
            Ok(r) if r.tag == tag => r,
            Ok(r) => {
                let diagnostics = self.diagnostics();
                panic!("{}: expected {tag}, got {r:?}\n{diagnostics}", self.name)
            }
            Err(e) => {
                let exit = self.wait(Duration::from_secs(5));
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
        self.proc.close_stdin();
    }

    /// Waits for the process to end, at most `timeout`; past it the process is killed and
    /// reaped and [`Exit::TimedOut`] returned.
    pub fn wait(&mut self, timeout: Duration) -> Exit {
        self.proc.wait(timeout)
    }

    /// What the process printed besides its answers, and its stderr, for failure messages.
    pub fn diagnostics(&mut self) -> String {
        // Whatever is still in the pipe.
        let (lines, closed) = self.proc.pending_lines();
        self.transcript.extend(lines);
        // A process that closed its stdout has ended or is ending: say how (a signal, an OOM
        // kill, a panic), waiting a moment for it; a live one is left running.
        let ended = match self.proc.ended() {
            Some(e) => format!("it ended with {e}"),
            None if closed => {
                std::thread::sleep(Duration::from_millis(200));
                match self.proc.ended() {
                    Some(e) => format!("it ended with {e}"),
                    None => "its stdout is closed; it is still running".to_string(),
                }
            }
            None => "it is still running".to_string(),
        };
        format!(
            "--- {} ({ended}) stdout ---\n{}\n--- {} stderr ---\n{}",
            self.name,
            self.transcript.join("\n"),
            self.name,
            self.proc.stderr_so_far()
        )
    }
}

/// The field `key` of a `TAG key=value ...` line as a `T` (`done vmpte_kb=608 secs=22.7`):
/// [`Reply::parse`] then [`Reply::get`].
pub fn field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    Reply::parse(line).get(key)
}

#[cfg(test)]
mod tests {
    use super::{field, Reply};

    #[test]
    fn lines_with_and_without_a_tag() {
        let r = Reply::parse("sec n=3 req=120 hit=97 note");
        assert_eq!(r.tag, "sec");
        assert_eq!(r.get::<u64>("req"), Some(120));
        assert_eq!(r.str("note"), "");
        assert_eq!(r.get::<u64>("miss"), None);
        let r = Reply::parse("records_per_s=1234 seconds=0.301");
        assert_eq!(r.tag, "");
        assert_eq!(r.get::<f64>("seconds"), Some(0.301));
        assert_eq!(field::<u64>("done us=-1", "us"), None);
        assert_eq!(field::<i64>("done us=-1", "us"), Some(-1));
    }
}
