//! `vrange stat PID`: what a process's memory really is. RSS alone misleads once pages are
//! lazily freed (they count in RSS until the kernel takes them), so this shows LazyFree and
//! page-table memory beside it, and the process's vrange statistics when it publishes them
//! (see `vrange::publish`).

use std::time::Duration;

fn kb(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// One report; `None` when the process is gone.
fn report(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let name = status
        .lines()
        .find_map(|l| l.strip_prefix("Name:"))
        .unwrap_or("?")
        .trim()
        .to_string();
    let mib = |k: Option<u64>| k.map_or("?".to_string(), |v| format!("{:.1}", v as f64 / 1024.0));
    let mut out = format!(
        "pid {pid} ({name}): RSS {} MiB (anon {}, file {}), LazyFree {} MiB, AnonHugePages {} MiB, page tables (VmPTE) {} MiB\n",
        mib(kb(&status, "VmRSS:")),
        mib(kb(&status, "RssAnon:")),
        mib(kb(&status, "RssFile:")),
        mib(kb(&rollup, "LazyFree:")),
        mib(kb(&rollup, "AnonHugePages:")),
        mib(kb(&status, "VmPTE:")),
    );
    match vrange::publish::read(pid) {
        Err(e) if e.is_absent() => out.push_str(&format!(
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
    Some(out)
}

pub fn main(pid: u32, watch: bool, interval_ms: u64) -> i32 {
    let Some(first) = report(pid) else {
        // A process killed before its exit handler ran leaves its file behind.
        vrange::publish::sweep();
        eprintln!("vrange stat: no process {pid}");
        return 1;
    };
    print!("{first}");
    if watch {
        while let Some(r) = {
            std::thread::sleep(Duration::from_millis(interval_ms.max(50)));
            report(pid)
        } {
            print!("{r}");
        }
    }
    0
}
