//! `vrange demo`, the README's main job: mark data volatile, create real memory pressure, show
//! what survived, then show what the allocator's volatile free memory saves.
//!
//! With a memory cgroup it can create, the demo moves itself into a child cgroup with a limit,
//! fills memory, marks every other chunk volatile, and lets a second process allocate past the
//! limit: the kernel must reclaim the volatile pages (there is no swap to fall back on).
//! Without one, it forces the purge with MADV_PAGEOUT instead and says so.
//!
//! The child is made under the demo's own memory cgroup, or under `--cgroup DIR`. On cgroup v2
//! a process's own cgroup usually holds processes (a login session, a service), and a cgroup
//! with processes cannot enable the memory controller for children: there `--cgroup` names a
//! cgroup that can (one delegated to the user, or any cgroup without processes, as root).

use crate::out::count;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use vrange::{features, page_size, Region};
use vrange_sys::cgroup::{unique_name, ChildCgroup, MemCgroup};
use vrange_sys::mem;

const MIB: usize = 1 << 20;
const CHUNK: usize = 4 * MIB;
const CHUNKS: usize = 24;
const LIMIT: usize = 128 * MIB;
const HOG: usize = 64 * MIB;

fn word(chunk: usize, i: usize) -> u64 {
    ((chunk as u64) << 40 | i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

#[derive(Args)]
pub struct DemoArgs {
    /// Make the demo's memory cgroup under DIR instead of under its own (cgroup v2: a cgroup
    /// whose memory controller can be enabled for children, i.e. one without processes).
    #[arg(long, value_name = "DIR")]
    cgroup: Option<PathBuf>,
}

/// Runs the tour; 0 when every check held, 2 when `--cgroup` is not a memory cgroup.
pub fn main(args: &DemoArgs) -> i32 {
    let parent = match &args.cgroup {
        None => MemCgroup::current(),
        Some(dir) => match MemCgroup::at(dir) {
            Some(cg) => Some(cg),
            None => {
                eprintln!("vrange demo: {} is not a memory cgroup", dir.display());
                return 2;
            }
        },
    };
    let f = features();
    println!(
        "vrange demo: volatile ranges on Linux {} (MADV_FREE {}, THP {})",
        kernel_release(),
        if f.madv_free { "yes" } else { "no" },
        f.thp,
    );
    // Charges stay with the cgroup that faulted a page in, so join the child cgroup first.
    // Where this process goes back to before its cgroup is removed: with `--cgroup` that is
    // not the child's parent (on cgroup v2 that one may hold no process).
    let home = MemCgroup::current();
    let cgroup = parent.and_then(|p| enter_child_cgroup(&p));
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
        "Wrote {} MiB in {CHUNKS} chunks of {} MiB; marked {} ({} MiB) volatile in {:.2?}.",
        CHUNK * CHUNKS / MIB,
        CHUNK / MIB,
        count(volatile.len() as u64, "chunk", None),
        volatile.len() * CHUNK / MIB,
        t.elapsed()
    );

    match &cgroup {
        Some(child) => hog_in(child, HOG),
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
        "  purged: {} entirely, {partly} partly: {:.1} MiB discarded (it reads as zero; a real program regenerates it)",
        count(whole as u64, "chunk", None),
        (purged_pages * page) as f64 / MIB as f64
    );
    println!(
        "  survived: {:.1} MiB of volatile data kept its content and is pinned again",
        ((volatile.len() * CHUNK / page - purged_pages) * page) as f64 / MIB as f64
    );
    println!(
        "  detection: {} reported purged, {} read zero: {}",
        count(purged_pages as u64, "page", None),
        count(zero_pages as u64, "page", None),
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
    drop(region);
    let allocator_ok = allocator_tour(cgroup.as_ref());
    if let (Some(_), Some(home)) = (&cgroup, &home) {
        let _ = std::fs::write(home.file("cgroup.procs"), std::process::id().to_string());
    }
    drop(cgroup);
    if purged_pages != zero_pages || intact_pinned != CHUNKS - volatile.len() || !allocator_ok {
        return 1;
    }
    0
}

/// The allocator part: churn large blocks (reused without a page fault), leave a working set
/// free, then let pressure take it back. Returns whether the checks held.
fn allocator_tour(cgroup: Option<&ChildCgroup>) -> bool {
    use vrange_malloc::heap;
    const BLOCK: usize = 512 << 10;
    const BLOCKS: usize = 96;
    println!();
    println!(
        "vrange-malloc: {BLOCKS} blocks of 512 KiB allocated, written and freed, 20 times over."
    );
    let before = vrange::stats().allocator;
    let mut faults = 0;
    for _ in 0..20 {
        let t0 = minor_faults();
        let blocks: Vec<*mut u8> = (0..BLOCKS)
            .filter_map(|_| heap::alloc(BLOCK, 16).map(|b| b.ptr.as_ptr()))
            .collect();
        for &b in &blocks {
            // SAFETY: each block is live and BLOCK bytes long.
            unsafe { b.write_bytes(0x5A, BLOCK) };
        }
        for &b in &blocks {
            // SAFETY: live, freed once.
            unsafe { heap::free(b) };
        }
        faults = minor_faults().saturating_sub(t0);
    }
    let s = vrange::stats();
    let a = s.allocator;
    let mib = |b: u64| b as f64 / MIB as f64;
    println!(
        "  reused without a page fault: {:.0} MiB ({} in the last round); free memory kept resident and volatile: {:.0} MiB",
        mib(a.reused_intact_bytes - before.reused_intact_bytes),
        count(faults, "fault", None),
        mib(s.volatile_bytes),
    );
    let rss_before = rss_mib();
    println!("  this process's RSS: {rss_before} MiB, most of it free memory the allocator keeps for reuse.");
    let purged_before = s.purged_total_bytes;
    match cgroup {
        Some(child) => {
            // After the arm delay (1 s) idle free memory is also handed to the kernel's lazy-free
            // path, so the kernel can take it back itself however fast the pressure comes.
            std::thread::sleep(std::time::Duration::from_millis(1200));
            hog_in(child, 100 * MIB);
        }
        None => {
            println!("  Pressure: none can be created here; purging explicitly instead.");
            vrange::purge(usize::MAX);
        }
    }
    let rss_after = rss_mib();
    let s = vrange::stats();
    println!(
        "  given back: RSS {rss_before} → {rss_after} MiB ({:.0} MiB purged by the reclaimer, the rest dropped by the kernel); glibc keeps such memory, or pays a page fault per 4 KiB on every reuse.",
        mib(s.purged_total_bytes - purged_before)
    );
    rss_after + 16 < rss_before
}

fn rss_mib() -> u64 {
    vrange_sys::procfs::status(None).map_or(0, |s| s.vm_rss_kb) / 1024
}

fn minor_faults() -> u64 {
    vrange_sys::process::page_faults().minor
}

fn kernel_release() -> String {
    vrange_sys::procfs::kernel_release().unwrap_or_else(|_| "?".into())
}

fn enter_child_cgroup(parent: &MemCgroup) -> Option<ChildCgroup> {
    match parent.create_child(&unique_name("vrange-demo"), LIMIT as u64) {
        Ok(child) => match child.add_pid(std::process::id() as i32) {
            Ok(()) => Some(child),
            Err(e) => {
                println!("(could not join the demo cgroup: {e})");
                None
            }
        },
        Err(e) => {
            let hint = if parent.version() == vrange_sys::cgroup::Version::V2 {
                "; on cgroup v2, `--cgroup DIR` names one that can have memory-limited children"
            } else {
                ""
            };
            println!(
                "(could not create a memory cgroup under {}: {e}{hint})",
                parent.path().display()
            );
            None
        }
    }
}

/// A second process in the same cgroup allocates past the limit; with no swap, only the
/// volatile pages can make room.
fn hog_in(child: &ChildCgroup, hog: usize) {
    let cg = child.cgroup();
    println!(
        "Pressure: this process runs in a memory cgroup limited to {} MiB ({} MiB charged); a second process now allocates {} MiB in it.",
        LIMIT / MIB,
        cg.usage().unwrap_or(0) / MIB as u64,
        hog / MIB
    );
    let kills_before = cg.oom_kills().unwrap_or(0);
    // SAFETY: the child only maps, touches and exits; it calls nothing that locks.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = mem::map_anon(hog, page_size()).is_ok_and(|p| {
            for off in (0..hog).step_by(page_size()) {
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
