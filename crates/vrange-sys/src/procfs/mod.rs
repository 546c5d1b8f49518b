//! The one parser of /proc text: a process's smaps, maps, status, stat, limits and threads, and
//! the system's meminfo, vmstat, stat, loadavg, cpuinfo and kernel release, as typed values for
//! memory reporting, the command, the coordinator's metrics, benchmarks and tests. No other
//! crate reads /proc text of its own.
//!
//! Never use it on a hot path or from a signal handler: it reads whole files into freshly
//! allocated strings. What must not allocate reads /proc elsewhere, without parsing into
//! strings: `vma` (/proc/self/maps through a stack buffer), `pagemap`, `pid` (the start time
//! in /proc/self/stat, through a stack buffer); `cgroup` parses
//! /proc/PID/cgroup and mountinfo with the cgroup rules it serves.
//!
//! # Contract
//! - One module per file family; each has a parser pure over `&str` (unit-tested on text as the
//!   kernel writes it) and a reader that takes the process: `None` for this one, `Some(pid)` for
//!   another (a `u32`, as `std::process::id` and `Child::id` give it).
//! - Errors are `io::Result`: the errno of open or read (ENOENT, or ESRCH in the middle of a
//!   read, once the process is gone, which [`is_gone`] tells; EACCES when the kernel's ptrace
//!   access check refuses a file of another user's process); `InvalidData` for text that does
//!   not parse. Counters missing from a file that has them only on some kernels read as zero,
//!   and each type says which.
//!
//! # References
//! proc(5); the kernel's `Documentation/filesystems/proc.rst`.

use std::io;

mod limits;
mod meminfo;
mod smaps;
mod stat;
mod status;
mod system;
mod task;

pub use limits::{open_fds, open_files_limit, parse_limit, Limit};
pub use meminfo::{mem_available_kb, meminfo_kb, parse_meminfo, parse_vmstat, vmstat};
pub use smaps::{
    maps, parse_maps, parse_smaps_block, smaps_of, smaps_range, smaps_rollup, smaps_vmas, Mapping,
    Smaps, VmaSmaps,
};
pub use stat::{parse_stat, start_ticks, stat, task_stat, ticks_per_second, Stat};
pub use status::{euid_of, parse_status, status, task_status, Ids, Status};
pub use system::{
    boot_time, cpu_model, kernel_release, kernel_version, last_pid, loadavg, parse_boot_time,
    parse_cpu_model, parse_kernel_version, parse_loadavg, KernelVersion, LoadAvg,
};
pub use task::{
    comm, parse_syscall, task_comm, task_stack, task_syscall, task_wchan, tasks, Syscall,
};

/// The path of file `name` of process `pid` (this process for `None`): `/proc/PID/name` or
/// `/proc/self/name`. For messages that name the file a reader could not read.
pub fn path(pid: Option<u32>, name: &str) -> String {
    match pid {
        Some(pid) => format!("/proc/{pid}/{name}"),
        None => format!("/proc/self/{name}"),
    }
}

/// Whether a reader's error says that the process is gone: ENOENT when it had exited (and was
/// reaped) before the open, ESRCH when it exited between the open and the read.
pub fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// Reads file `name` of process `pid` (this process for `None`).
fn read(pid: Option<u32>, name: &str) -> io::Result<String> {
    crate::fd::read_file(path(pid, name))
}

/// A "Name:   123 kB" line as its name and number; `None` for headers and for lines whose
/// value is not a number ("VmFlags: rd wr").
fn field_line(line: &str) -> Option<(&str, u64)> {
    let (name, rest) = line.split_once(':')?;
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name.trim(), value))
}

/// The error of text that does not have the shape its file must have.
fn malformed(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_gone() {
        assert_eq!(path(None, "status"), "/proc/self/status");
        assert_eq!(path(Some(42), "smaps_rollup"), "/proc/42/smaps_rollup");
        assert!(is_gone(&io::Error::from_raw_os_error(libc::ESRCH)));
        assert!(is_gone(&io::Error::from_raw_os_error(libc::ENOENT)));
        assert!(!is_gone(&io::Error::from_raw_os_error(libc::EACCES)));
        // A pid no process can have (above PID_MAX_LIMIT, 2^22).
        assert!(is_gone(&status(Some(4_000_000_000)).unwrap_err()));
    }

    #[test]
    fn field_lines() {
        assert_eq!(field_line("VmRSS:\t     900 kB"), Some(("VmRSS", 900)));
        assert_eq!(
            field_line("HugePages_Total:       0"),
            Some(("HugePages_Total", 0))
        );
        assert_eq!(field_line("VmFlags: rd wr mr"), None);
        assert_eq!(field_line("Name:\tcat"), None);
    }
}
