//! /proc/PID/comm and /proc/PID/task/TID/: a process's name and its threads (their names, and
//! where each waits in the kernel, for reports on a process that hung). Their stat is
//! [`super::task_stat`].

use super::{malformed, path, read};
use std::fmt;
use std::io;

/// The name of process `pid` (this process if `None`) as /proc/PID/comm shows it: the
/// program's file name, or what it set with prctl(PR_SET_NAME), cut to 15 bytes.
///
/// # Errors
/// As the module says.
pub fn comm(pid: Option<u32>) -> io::Result<String> {
    Ok(line(&read(pid, "comm")?))
}

/// The thread ids of process `pid` (this process if `None`), in the kernel's order.
///
/// # Errors
/// The errno of opening or reading /proc/PID/task.
pub fn tasks(pid: Option<u32>) -> io::Result<Vec<u32>> {
    let mut tids = Vec::new();
    for entry in std::fs::read_dir(path(pid, "task"))? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
            tids.push(tid);
        }
    }
    Ok(tids)
}

/// The name of thread `tid` of process `pid` (this process if `None`).
///
/// # Errors
/// As [`comm`].
pub fn task_comm(pid: Option<u32>, tid: u32) -> io::Result<String> {
    Ok(line(&read(pid, &format!("task/{tid}/comm"))?))
}

/// The kernel function thread `tid` waits in ("0" when it is not waiting).
///
/// # Errors
/// As [`comm`].
pub fn task_wchan(pid: Option<u32>, tid: u32) -> io::Result<String> {
    Ok(read(pid, &format!("task/{tid}/wchan"))?.trim().to_string())
}

/// The kernel stack of thread `tid`, a frame a line (root only).
///
/// # Errors
/// As [`comm`]; EACCES without CAP_SYS_ADMIN.
pub fn task_stack(pid: Option<u32>, tid: u32) -> io::Result<String> {
    Ok(read(pid, &format!("task/{tid}/stack"))?.trim().to_string())
}

/// What /proc/PID/task/TID/syscall says a thread is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syscall {
    /// Running (in user mode or in the kernel): no registers to show.
    Running,
    /// Blocked in system call `nr`.
    In {
        /// The system call's number.
        nr: u64,
        /// Its six argument registers.
        args: [u64; 6],
        /// Stack pointer.
        sp: u64,
        /// Program counter, in user space.
        pc: u64,
    },
    /// Blocked outside a system call (a page fault, a stop).
    Blocked {
        /// Stack pointer.
        sp: u64,
        /// Program counter, in user space.
        pc: u64,
    },
}

impl Syscall {
    /// The user program counter where the thread is blocked.
    pub fn pc(&self) -> Option<u64> {
        match *self {
            Syscall::Running => None,
            Syscall::In { pc, .. } | Syscall::Blocked { pc, .. } => Some(pc),
        }
    }
}

/// The text the kernel writes for it.
impl fmt::Display for Syscall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syscall::Running => f.write_str("running"),
            Syscall::In { nr, args, sp, pc } => {
                write!(f, "{nr}")?;
                for a in args {
                    write!(f, " {a:#x}")?;
                }
                write!(f, " {sp:#x} {pc:#x}")
            }
            Syscall::Blocked { sp, pc } => write!(f, "-1 {sp:#x} {pc:#x}"),
        }
    }
}

/// What thread `tid` of process `pid` (this process if `None`) is doing.
///
/// # Errors
/// As [`comm`]; EACCES when the ptrace access check (attach mode) refuses; `InvalidData` for
/// text that does not parse.
pub fn task_syscall(pid: Option<u32>, tid: u32) -> io::Result<Syscall> {
    parse_syscall(&read(pid, &format!("task/{tid}/syscall"))?).ok_or_else(|| malformed("syscall"))
}

/// Parses /proc/PID/syscall text: "running", "-1 SP PC", or "NR ARG1 ... ARG6 SP PC" (the
/// registers in hexadecimal).
pub fn parse_syscall(text: &str) -> Option<Syscall> {
    let text = text.trim();
    if text == "running" {
        return Some(Syscall::Running);
    }
    let mut words = text.split_whitespace();
    let nr = words.next()?;
    let hex: Vec<u64> = words
        .map(|w| u64::from_str_radix(w.strip_prefix("0x")?, 16).ok())
        .collect::<Option<_>>()?;
    match (nr, hex.as_slice()) {
        ("-1", &[sp, pc]) => Some(Syscall::Blocked { sp, pc }),
        (nr, &[a, b, c, d, e, g, sp, pc]) => Some(Syscall::In {
            nr: nr.parse().ok()?,
            args: [a, b, c, d, e, g],
            sp,
            pc,
        }),
        _ => None,
    }
}

/// A one-line file's text without its newline.
fn line(text: &str) -> String {
    text.strip_suffix('\n').unwrap_or(text).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_lines() {
        assert_eq!(parse_syscall("running\n"), Some(Syscall::Running));
        let text =
            "230 0x0 0x0 0x7ffd6d2e7b70 0x7ffd6d2e7b70 0x0 0x0 0x7ffd6d2e7b58 0x7f3c9a0e07fa\n";
        let s = parse_syscall(text).unwrap();
        assert_eq!(
            s,
            Syscall::In {
                nr: 230,
                args: [0, 0, 0x7ffd6d2e7b70, 0x7ffd6d2e7b70, 0, 0],
                sp: 0x7ffd6d2e7b58,
                pc: 0x7f3c9a0e07fa,
            }
        );
        assert_eq!(s.to_string(), text.trim());
        let blocked = parse_syscall("-1 0x7ffd6d2e7b58 0x55d0c0de1000\n").unwrap();
        assert_eq!(blocked.pc(), Some(0x55d0c0de1000));
        assert_eq!(blocked.to_string(), "-1 0x7ffd6d2e7b58 0x55d0c0de1000");
        for bad in [
            "",
            "-1 0x1",
            "7 0x1 0x2",
            "x 0x0 0x0 0x0 0x0 0x0 0x0 0x0 0x0",
        ] {
            assert_eq!(parse_syscall(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn real_threads() {
        let pid = std::process::id();
        let name = "vrange-procfs-t";
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel::<()>();
        // The new thread names itself before it runs this.
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _ = ready_tx.send(());
                let _ = rx.recv();
            })
            .unwrap();
        ready.recv().unwrap();
        let tids = tasks(None).unwrap();
        assert!(tids.contains(&pid), "{tids:?}");
        let named: Vec<u32> = tids
            .iter()
            .copied()
            .filter(|&tid| task_comm(Some(pid), tid).is_ok_and(|c| c == name))
            .collect();
        assert_eq!(named.len(), 1, "{tids:?}");
        // The thread waits in recv: a futex wait, or on its way into it.
        let wchan = task_wchan(None, named[0]).unwrap();
        assert!(!wchan.is_empty());
        drop(tx);
        t.join().unwrap();
        assert!(!comm(None).unwrap().ends_with('\n'));
    }
}
