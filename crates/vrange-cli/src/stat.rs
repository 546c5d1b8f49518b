//! `vrange stat PID`: what a process's memory really is. RSS alone misleads once pages are
//! lazily freed (they count in RSS until the kernel takes them), so this shows LazyFree and
//! page-table memory beside it, and the process's vrange statistics when it publishes them
//! (see `vrange::publish`).
//!
//! Exit status: 0 when everything was read, 1 when there is no such process, 3 when the process
//! exists but this user may not read its memory (/proc/PID/smaps_rollup needs the same user or
//! root); what could be read is printed all the same. 2 is a usage error (clap's).

use std::io::ErrorKind;
use std::time::Duration;

/// The exit status for a process whose memory this user may not read.
pub const NOT_PERMITTED: i32 = 3;

fn kb(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// One report, and why part of it is missing if it is.
struct Report {
    text: String,
    denied: Option<String>,
}

/// Reads /proc/PID/`file`: `Ok(None)` when the process is gone.
fn proc_file(pid: u32, file: &str) -> Result<Option<String>, String> {
    let path = format!("/proc/{pid}/{file}");
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text)),
        // ESRCH: the process exited between open and read.
        Err(e) if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            Ok(None)
        }
        Err(e) => {
            let owner = vrange_sys::procfs::effective_uid(pid).map_or(String::new(), |uid| {
                format!(" (pid {pid} belongs to uid {uid}; run as that user or as root)")
            });
            Err(format!(
                "cannot read {path}: {}{owner}",
                vrange_sys::statsdir::plain(&e)
            ))
        }
    }
}

/// One report; `None` when the process is gone.
fn report(pid: u32) -> Option<Report> {
    let status = match proc_file(pid, "status") {
        Ok(text) => text?,
        Err(why) => {
            return Some(Report {
                text: String::new(),
                denied: Some(why),
            })
        }
    };
    let name = status
        .lines()
        .find_map(|l| l.strip_prefix("Name:"))
        .unwrap_or("")
        .trim()
        .to_string();
    let Some(rss) = kb(&status, "VmRSS:") else {
        return Some(Report {
            text: format!("pid {pid} ({name}): a kernel thread, no user memory\n"),
            denied: None,
        });
    };
    let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
    let of = |key: &str| mib(kb(&status, key).unwrap_or(0));
    let (rollup, denied) = match proc_file(pid, "smaps_rollup") {
        Ok(text) => (text?, None),
        Err(why) => (String::new(), Some(why)),
    };
    let mut out = format!(
        "pid {pid} ({name}): RSS {} MiB (anon {}, file {}), ",
        mib(rss),
        of("RssAnon:"),
        of("RssFile:"),
    );
    if denied.is_none() {
        out.push_str(&format!(
            "LazyFree {} MiB, AnonHugePages {} MiB, ",
            mib(kb(&rollup, "LazyFree:").unwrap_or(0)),
            mib(kb(&rollup, "AnonHugePages:").unwrap_or(0)),
        ));
    }
    out.push_str(&format!("page tables (VmPTE) {} MiB\n", of("VmPTE:")));
    if let Some(why) = &denied {
        out.push_str(&format!("  LazyFree and AnonHugePages unknown: {why}\n"));
    }
    match vrange::publish::read(pid) {
        // Whether a process this user may not read uses vrange is not for us to guess.
        Err(e) if e.is_absent() && denied.is_none() => out.push_str(&format!(
            "  vrange: {e} (the process runs no vrange reclaimer: no managed or hybrid memory, \
             no vrange-malloc; or it publishes elsewhere, see VRANGE_STATS_DIR)\n"
        )),
        Err(e) => out.push_str(&format!("  vrange: {e}\n")),
        Ok(v) => {
            let get = |k: &str| v.iter().find(|(n, _)| n == k).map_or(0, |(_, x)| *x);
            let m = |b: u64| b as f64 / (1 << 20) as f64;
            out.push_str(&format!(
                "  vrange: volatile {:.1} MiB (armed {:.1}), not resident (purged or never touched) {:.1} MiB, pinned {:.1} MiB; purged in all {:.1} MiB; losses reported {}\n",
                m(get("volatile_bytes")),
                m(get("armed_bytes")),
                m(get("purged_bytes")),
                m(get("pinned_bytes")),
                m(get("purged_total_bytes")),
                get("losses_reported"),
            ));
            if get("alloc_allocations") > 0 {
                out.push_str(&format!(
                    "  vrange-malloc: live {:.1} MiB, free {:.1} MiB of {:.1} MiB mapped; reused without a fault {:.1} MiB, zero-filled {:.1} MiB\n",
                    m(get("alloc_allocated_bytes")),
                    m(get("alloc_free_bytes")),
                    m(get("alloc_mapped_bytes")),
                    m(get("alloc_reused_intact_bytes")),
                    m(get("alloc_zero_filled_bytes")),
                ));
            }
        }
    }
    Some(Report { text: out, denied })
}

pub fn main(pid: u32, watch: bool, interval_ms: u64) -> i32 {
    let Some(first) = report(pid) else {
        // A process killed before its exit handler ran leaves its file behind.
        vrange::publish::sweep();
        eprintln!("vrange stat: no process {pid}");
        return 1;
    };
    print!("{}", first.text);
    if let Some(why) = first.denied {
        eprintln!("vrange stat: {why}");
        return NOT_PERMITTED;
    }
    if watch {
        while let Some(r) = {
            std::thread::sleep(Duration::from_millis(interval_ms.max(50)));
            report(pid)
        } {
            print!("{}", r.text);
        }
    }
    0
}
