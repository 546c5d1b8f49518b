//! The classic page-table experiment through the allocator: reserve a huge range (25,600
//! blocks of 2 MiB, 50 GiB of address space), then touch each block (every page faulted in
//! writable; with `VRANGE_PT_SPARSE=1`, as in the CI's emulated guests, one page per block,
//! which makes the same page tables) and free it. Freed blocks
//! are whole chunks; when the reclaimer purges one it uses a single MADV_DONTNEED over the whole
//! PMD, and the kernel frees the page table with it, so VmPTE stays small. The control run frees
//! with MADV_FREE alone (lazy mode): the kernel takes the pages back under the cgroup's limit
//! but keeps every page table (about 100 MiB for 50 GiB).
//!
//! The control runs on a quarter of the range to keep the test short (set
//! `VRANGE_PT_CONTROL_BLOCKS=25600` for the whole range). `VRANGE_PT_BLOCKS` sets the range
//! (the CI's emulated guests use 6,400 blocks, 12.5 GiB: the same tables per block, a quarter
//! of the time). Each run is a re-executed copy of this test binary inside a child memory cgroup (1 GiB), with
//! 4 KiB pages (THP off for the allocator: with huge pages there are no PTE tables to leak).

// ci: guest 6.1 only: the page-table fallback is the same on both guests (neither kernel has PT_RECLAIM) and takes minutes under emulation

use std::time::{Duration, Instant};
use vrange_malloc::heap;
use vrange_sys::cgroup::join_before_exec;
use vrange_testkit::cgroup;
use vrange_testkit::role::{role, role_command, say, Role};

const BLOCK: usize = 2 << 20;
const BLOCKS: usize = 25_600;

/// The blocks of the range: `VRANGE_PT_BLOCKS`, or [`BLOCKS`].
fn blocks() -> usize {
    std::env::var("VRANGE_PT_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BLOCKS)
}

fn status() -> vrange_sys::procfs::Status {
    vrange_sys::procfs::status(None).expect("status")
}

/// The role: runs the loop with the allocator configured by the environment.
#[test]
fn pagetable_role() {
    if role().as_deref() != Some("loop") {
        return;
    }
    let page = vrange::page_size();
    let n = blocks();
    let sparse = std::env::var_os("VRANGE_PT_SPARSE").is_some_and(|v| v == "1");
    let t0 = Instant::now();
    let blocks: Vec<*mut u8> = (0..n)
        .map(|_| heap::alloc(BLOCK, 16).expect("2 MiB block").ptr.as_ptr())
        .collect();
    let mut max_pte = 0;
    for (i, &b) in blocks.iter().enumerate() {
        // Every page faulted in writable: in one call where the kernel has
        // MADV_POPULATE_WRITE (5.14), else page by page. Sparse (the CI's guests, where the
        // kernel's work per page costs minutes under emulation): one page per block, which
        // makes the same page tables (one per block).
        if !sparse && vrange_sys::mem::populate_write(b, BLOCK).is_err() {
            for off in (0..BLOCK).step_by(page) {
                // SAFETY: b is a live 2 MiB block.
                unsafe { b.add(off).write_volatile(1) };
            }
        }
        // SAFETY: as above.
        unsafe { b.write_volatile(1) };
        // SAFETY: live, freed once.
        assert!(unsafe { heap::free(b) });
        if i % 512 == 0 {
            max_pte = max_pte.max(status().vm_pte_kb);
        }
    }
    // Let the reclaimer finish what the last frees asked of it.
    let budget = 64 << 20;
    let deadline = Instant::now() + Duration::from_secs(10);
    while vrange::stats().volatile_bytes > budget && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pte = status().vm_pte_kb;
    let s = vrange::stats();
    say(format!(
        "done vmpte_kb={pte} max_vmpte_kb={} rss_kb={} purged_mib={} secs={:.1}",
        max_pte.max(pte),
        status().vm_rss_kb,
        s.purged_total_bytes >> 20,
        t0.elapsed().as_secs_f64()
    ));
}

struct Run {
    vmpte_kb: u64,
    max_vmpte_kb: u64,
    rss_kb: u64,
}

fn run(mode: &str, blocks: usize) -> Option<Run> {
    let child = match cgroup::child("vrange-pt", 1 << 30) {
        Ok(c) => c,
        Err(why) => {
            vrange_testkit::skip(why);
            return None;
        }
    };
    let mut cmd = role_command("pagetable_role", "loop");
    cmd.env("VRANGE_MALLOC_MODE", mode)
        .env("VRANGE_MALLOC_THP", "never")
        .env("VRANGE_MALLOC_BUDGET", "64M")
        .env("VRANGE_PT_BLOCKS", blocks.to_string());
    join_before_exec(&mut cmd, &child.cgroup().file("cgroup.procs")).expect("join the cgroup");
    let mut role = Role::spawn(mode, cmd);
    // Minutes under emulation: up to 9 on a busy machine (the 6.12 guest of a CI run that
    // overlapped another, with two CPU hogs beside, took longer than 540 s). The guest
    // harness gives a test executable 1300 s, both runs included.
    let r = role.expect("done", Duration::from_secs(1000));
    let exit = role.wait(Duration::from_secs(30));
    println!(
        "{mode}: VmPTE {} kB at the end, {} kB at most; VmRSS {} kB; {} MiB purged; {} s; {exit}",
        r.u64("vmpte_kb"),
        r.u64("max_vmpte_kb"),
        r.u64("rss_kb"),
        r.u64("purged_mib"),
        r.str("secs")
    );
    assert_eq!(
        child.cgroup().oom_kills().unwrap_or(0),
        0,
        "{mode}: OOM kill"
    );
    Some(Run {
        vmpte_kb: r.u64("vmpte_kb"),
        max_vmpte_kb: r.u64("max_vmpte_kb"),
        rss_kb: r.u64("rss_kb"),
    })
}

#[test]
fn freed_chunks_give_back_their_page_tables() {
    if role().is_some() {
        return;
    }
    let blocks = blocks();
    let Some(ours) = run("hybrid", blocks) else {
        return;
    };
    assert!(
        ours.vmpte_kb < 1024,
        "VmPTE {} kB after {} GiB touched and freed",
        ours.vmpte_kb,
        (blocks * BLOCK) >> 30
    );
    assert!(
        ours.max_vmpte_kb < 4096,
        "VmPTE peaked at {} kB",
        ours.max_vmpte_kb
    );
    assert!(ours.rss_kb < 512 << 10, "RSS {} kB", ours.rss_kb);
    // The control on a quarter of the range (it is slow: every page is reclaimed under the
    // cgroup's limit): of 50 GiB, 12.5 GiB leave ~25 MiB of page tables behind.
    let control = std::env::var("VRANGE_PT_CONTROL_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(blocks / 4);
    let Some(lazy) = run("lazy", control) else {
        return;
    };
    // One 4 KiB table per 2 MiB block touched.
    let expected_kb = (control * 4) as u64;
    assert!(
        lazy.vmpte_kb > expected_kb * 3 / 4,
        "the control (MADV_FREE alone) should keep ~{expected_kb} kB of page tables, kept {} kB",
        lazy.vmpte_kb
    );
}
