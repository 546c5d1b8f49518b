//! The README's main job: mark data volatile, create real memory pressure, show what survived.
//!
//! With a memory cgroup it can create, the demo moves itself into a child cgroup with a limit,
//! fills memory, marks every other chunk volatile, and lets a second process allocate past the
//! limit: the kernel must reclaim the volatile pages (there is no swap to fall back on).
//! Without one, it forces the purge with MADV_PAGEOUT instead and says so.

use std::time::Instant;
use vrange::sys::cgroup::{unique_name, ChildCgroup, MemCgroup};
use vrange::sys::mem;
use vrange::{features, page_size, Region};

const MIB: usize = 1 << 20;
const CHUNK: usize = 4 * MIB;
const CHUNKS: usize = 24;
const LIMIT: usize = 128 * MIB;
const HOG: usize = 64 * MIB;

fn word(chunk: usize, i: usize) -> u64 {
    ((chunk as u64) << 40 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn main() {
    let f = features();
    println!(
        "vrange demo: volatile ranges on Linux {} (MADV_FREE {}, THP {:?})",
        kernel_release(),
        if f.madv_free { "yes" } else { "no" },
        f.thp,
    );
    // Charges stay with the cgroup that faulted a page in, so join the child cgroup first.
    let cgroup = enter_child_cgroup();
    // Forced purges (the fallback below) are deterministic only on the CPU that marked.
    let _ = mem::pin_thread_to_current_cpu();

    let region = Region::new(CHUNK * CHUNKS).expect("map the demo region");
    let words = CHUNK / 8;
    for c in 0..CHUNKS {
        let base = region.as_ptr().wrapping_add(c * CHUNK).cast::<u64>();
        for i in 0..words {
            // SAFETY: inside the region, which nothing else references.
            unsafe { base.add(i).write(word(c, i)) };
        }
    }
    let volatile: Vec<usize> = (0..CHUNKS).filter(|c| c % 2 == 1).collect();
    let t = Instant::now();
    for &c in &volatile {
        // SAFETY: no reference into the region is live while chunks are volatile.
        unsafe { region.mark_volatile(c * CHUNK, CHUNK).expect("mark") };
    }
    println!(
        "Wrote {} MiB in {CHUNKS} chunks of {} MiB; marked {} chunks ({} MiB) volatile in {:.2?}.",
        CHUNK * CHUNKS / MIB,
        CHUNK / MIB,
        volatile.len(),
        volatile.len() * CHUNK / MIB,
        t.elapsed()
    );

    match &cgroup {
        Some(child) => hog_in(child),
        None => {
            println!("Pressure: no memory cgroup could be created here; forcing reclaim with MADV_PAGEOUT instead.");
            mem::reclaim_now(region.as_ptr(), region.len()).expect("MADV_PAGEOUT");
        }
    }

    let (mut purged_pages, mut zero_pages, mut whole, mut partly) = (0, 0, 0, 0);
    let page = page_size();
    for &c in &volatile {
        let report = region.unmark(c * CHUNK, CHUNK).expect("unmark");
        purged_pages += report.purged;
        whole += usize::from(report.purged == CHUNK / page);
        partly += usize::from(report.purged > 0 && report.purged < CHUNK / page);
        zero_pages += (0..CHUNK / page)
            .filter(|p| page_is_zero(&region, c * CHUNK + p * page))
            .count();
    }
    let intact_pinned = (0..CHUNKS)
        .filter(|c| c % 2 == 0)
        .filter(|&c| chunk_intact(&region, c))
        .count();
    println!("Unmarked the volatile chunks:");
    println!(
        "  purged: {whole} chunks entirely, {partly} partly: {:.1} MiB discarded (it reads as zero; a real program regenerates it)",
        (purged_pages * page) as f64 / MIB as f64
    );
    println!(
        "  survived: {:.1} MiB of volatile data kept its content and is pinned again",
        ((volatile.len() * CHUNK / page - purged_pages) * page) as f64 / MIB as f64
    );
    println!(
        "  detection: {} pages reported purged, {} pages read zero: {}",
        purged_pages,
        zero_pages,
        if purged_pages == zero_pages {
            "exact"
        } else {
            "MISMATCH"
        }
    );
    println!(
        "Pinned chunks: {intact_pinned} of {} intact byte for byte.",
        CHUNKS - volatile.len()
    );
    drop(cgroup);
    if purged_pages != zero_pages || intact_pinned != CHUNKS - volatile.len() {
        std::process::exit(1);
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn enter_child_cgroup() -> Option<ChildCgroup> {
    let current = MemCgroup::current()?;
    match current.create_child(&unique_name("vrange-demo"), LIMIT as u64) {
        Ok(child) => match child.add_pid(std::process::id() as i32) {
            Ok(()) => Some(child),
            Err(e) => {
                println!("(could not join the demo cgroup: {e})");
                None
            }
        },
        Err(e) => {
            println!("(could not create a memory cgroup: {e})");
            None
        }
    }
}

/// A second process in the same cgroup allocates past the limit; with no swap, only the
/// volatile pages can make room.
fn hog_in(child: &ChildCgroup) {
    let cg = child.cgroup();
    println!(
        "Pressure: this process runs in a memory cgroup limited to {} MiB ({} MiB charged); a second process now allocates {} MiB in it.",
        LIMIT / MIB,
        cg.usage().unwrap_or(0) / MIB as u64,
        HOG / MIB
    );
    let kills_before = cg.oom_kills().unwrap_or(0);
    // SAFETY: the child only maps, touches and exits; it calls nothing that locks.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = mem::map_anon(HOG, page_size()).is_ok_and(|p| {
            for off in (0..HOG).step_by(page_size()) {
                // SAFETY: inside the child's fresh mapping.
                unsafe { p.as_ptr().add(off).write(1) };
            }
            true
        });
        // SAFETY: leaving the forked child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: pid is our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let killed = cg.oom_kills().unwrap_or(0) > kills_before;
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 && !killed {
        println!("  the second process finished normally: the kernel dropped volatile pages instead of OOM-killing it.");
    } else {
        println!("  the second process did not finish (status {status}, OOM kills {killed}).");
    }
}

fn page_is_zero(region: &Region, off: usize) -> bool {
    let p = region.as_ptr().wrapping_add(off).cast::<u64>();
    // SAFETY: inside the region, pinned again.
    (0..page_size() / 8).all(|i| unsafe { p.add(i).read() } == 0)
}

fn chunk_intact(region: &Region, c: usize) -> bool {
    let p = region.as_ptr().wrapping_add(c * CHUNK).cast::<u64>();
    // SAFETY: inside the region; pinned chunks were never volatile.
    (0..CHUNK / 8).all(|i| unsafe { p.add(i).read() } == word(c, i))
}
