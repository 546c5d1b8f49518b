//! /proc/PID/status and /proc/PID/task/TID/status: a process's (or a thread's) name,
//! credentials, capabilities, blocked signals and memory lines.

use super::{field_line, malformed, read};
use std::io;

/// The four ids of a `Uid:` or `Gid:` line, in the kernel's order.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    /// Real.
    pub real: u32,
    /// Effective.
    pub effective: u32,
    /// Saved set-user-ID (or set-group-ID).
    pub saved: u32,
    /// Filesystem: the one permission checks on files use.
    pub filesystem: u32,
}

/// What /proc/PID/status says of a process. Memory lines are in KiB.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Status {
    /// `Name`: the command name (at most 15 bytes, as the kernel escapes it).
    pub name: String,
    /// `Uid`.
    pub uid: Option<Ids>,
    /// `Gid`.
    pub gid: Option<Ids>,
    /// `CapPrm`: the permitted capability set, a bit per capability.
    pub cap_prm: Option<u64>,
    /// `CapEff`: the effective capability set.
    pub cap_eff: Option<u64>,
    /// `SigBlk`: the signals blocked (of one thread: read a task's status), bit N-1 for signal
    /// N.
    pub sig_blk: Option<u64>,
    /// Whether the process has an address space (a `VmRSS` line): not for a kernel thread,
    /// nor for a process that has exited and not been reaped. Without one, every memory field
    /// below reads zero.
    pub address_space: bool,
    /// `State` is zombie or dead: the process has exited (its address space is gone) and its
    /// parent has not reaped it.
    pub exited: bool,
    /// `VmRSS`.
    pub vm_rss_kb: u64,
    /// Peak resident size (`VmHWM`).
    pub vm_hwm_kb: u64,
    /// Page-table size (`VmPTE`).
    pub vm_pte_kb: u64,
    /// `VmSwap`.
    pub vm_swap_kb: u64,
    /// `RssAnon` (Linux 4.5; zero before).
    pub rss_anon_kb: u64,
    /// `RssFile` (Linux 4.5; zero before).
    pub rss_file_kb: u64,
}

/// /proc/PID/status of process `pid` (this process if `None`).
///
/// # Errors
/// As the module says: the process is gone ([`super::is_gone`]), or the file cannot be read.
pub fn status(pid: Option<u32>) -> io::Result<Status> {
    Ok(parse_status(&read(pid, "status")?))
}

/// /proc/PID/task/TID/status: thread `tid` of process `pid` (this process if `None`); its
/// name, blocked signals and credentials are the thread's own.
///
/// # Errors
/// As [`status`].
pub fn task_status(pid: Option<u32>, tid: u32) -> io::Result<Status> {
    Ok(parse_status(&read(pid, &format!("task/{tid}/status"))?))
}

/// The effective user id of process `pid`.
///
/// # Errors
/// As [`status`]; `InvalidData` for a status without a `Uid:` line.
pub fn euid_of(pid: u32) -> io::Result<u32> {
    status(Some(pid))?
        .uid
        .map(|ids| ids.effective)
        .ok_or_else(|| malformed("status: no Uid line"))
}

/// Parses /proc/PID/status text; missing lines leave their field `None`, or zero.
pub fn parse_status(text: &str) -> Status {
    let mut s = Status::default();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        match name {
            "Name" => s.name = rest.trim().to_string(),
            "State" => s.exited = matches!(rest.trim_start().chars().next(), Some('Z' | 'X')),
            "Uid" => s.uid = ids(rest),
            "Gid" => s.gid = ids(rest),
            // Hexadecimal, unlike every other number here.
            "CapPrm" => s.cap_prm = u64::from_str_radix(rest.trim(), 16).ok(),
            "CapEff" => s.cap_eff = u64::from_str_radix(rest.trim(), 16).ok(),
            "SigBlk" => s.sig_blk = u64::from_str_radix(rest.trim(), 16).ok(),
            _ => {
                let Some((_, v)) = field_line(line) else {
                    continue;
                };
                let slot = match name {
                    "VmRSS" => {
                        s.address_space = true;
                        &mut s.vm_rss_kb
                    }
                    "VmHWM" => &mut s.vm_hwm_kb,
                    "VmPTE" => &mut s.vm_pte_kb,
                    "VmSwap" => &mut s.vm_swap_kb,
                    "RssAnon" => &mut s.rss_anon_kb,
                    "RssFile" => &mut s.rss_file_kb,
                    _ => continue,
                };
                *slot = v;
            }
        }
    }
    s
}

/// The value of a `Uid:` or `Gid:` line: real, effective, saved, filesystem.
fn ids(value: &str) -> Option<Ids> {
    let mut words = value.split_whitespace().map(|w| w.parse().ok());
    let mut next = || words.next().flatten();
    Some(Ids {
        real: next()?,
        effective: next()?,
        saved: next()?,
        filesystem: next()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "\
Name:\tmy prog (x)
Umask:\t0022
State:\tS (sleeping)
Tgid:\t4242
Pid:\t4242
Uid:\t1000\t1001\t1002\t1003
Gid:\t100\t100\t100\t100
FDSize:\t64
VmPeak:\t    9000 kB
VmHWM:\t    1000 kB
VmRSS:\t     900 kB
RssAnon:\t     100 kB
RssFile:\t     800 kB
RssShmem:\t       0 kB
VmPTE:\t      48 kB
VmSwap:\t       0 kB
Threads:\t1
SigQ:\t0/63379
SigPnd:\t0000000000000000
ShdPnd:\t0000000000000000
SigBlk:\t0000000000010002
SigIgn:\t0000000000001000
CapInh:\t0000000000000000
CapPrm:\t000001ffffffffff
CapEff:\t0000000000003000
Seccomp:\t0
";

    #[test]
    fn status_fields() {
        assert_eq!(
            parse_status(STATUS),
            Status {
                name: "my prog (x)".into(),
                uid: Some(Ids {
                    real: 1000,
                    effective: 1001,
                    saved: 1002,
                    filesystem: 1003,
                }),
                gid: Some(Ids {
                    real: 100,
                    effective: 100,
                    saved: 100,
                    filesystem: 100,
                }),
                cap_prm: Some(0x1ff_ffff_ffff),
                // Not 3000: capability sets are hexadecimal.
                cap_eff: Some(0x3000),
                // SIGINT (2) and SIGCHLD (17).
                sig_blk: Some(0x10002),
                address_space: true,
                exited: false,
                vm_rss_kb: 900,
                vm_hwm_kb: 1000,
                vm_pte_kb: 48,
                vm_swap_kb: 0,
                rss_anon_kb: 100,
                rss_file_kb: 800,
            }
        );
    }

    #[test]
    fn a_kernel_thread_has_no_address_space() {
        let text = "Name:\tkthreadd\nState:\tS (sleeping)\nUid:\t0\t0\t0\t0\n\
                    Gid:\t0\t0\t0\t0\nThreads:\t1\nCapEff:\t000001ffffffffff\n";
        let s = parse_status(text);
        assert!(!s.address_space);
        assert_eq!((s.vm_rss_kb, s.vm_pte_kb), (0, 0));
        assert_eq!(s.uid.map(|i| i.filesystem), Some(0));
    }

    /// A real child that has exited and is not reaped yet: no address space, and exited (what
    /// tells it from a kernel thread).
    #[test]
    fn an_unreaped_child_has_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let s = loop {
            let s = status(Some(pid)).unwrap();
            if s.exited || std::time::Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        child.wait().unwrap();
        assert!(s.exited && !s.address_space, "{s:?}");
        assert!(!status(None).unwrap().exited);
    }

    #[test]
    fn short_id_lines_are_none() {
        let s = parse_status("Uid:\t1000\t1000\nGid:\tx\t1\t1\t1\n");
        assert_eq!((s.uid, s.gid), (None, None));
        assert_eq!(parse_status(""), Status::default());
    }

    #[test]
    fn real_status() {
        let own = status(None).unwrap();
        assert!(own.address_space && own.vm_rss_kb > 0, "{own:?}");
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid_of(std::process::id()).unwrap(), euid);
        assert_eq!(own.uid.map(|i| i.effective), Some(euid));
        assert!(own.cap_eff.is_some());
        let tid = std::process::id();
        let main = task_status(None, tid).unwrap();
        assert!(main.sig_blk.is_some() && main.uid == own.uid, "{main:?}");
    }
}
