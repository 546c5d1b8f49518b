//! Real memory pressure in a child memory cgroup: the kernel itself, not MADV_PAGEOUT, decides
//! what to discard, and unmark must still report exactly what it discarded.
//!
//! # Design
//! The test process (the harness, many threads) never joins the limited cgroup. It forks a
//! *worker*, moves that pid into a fresh child cgroup, and only then lets it go on, so that
//! everything the worker allocates is charged to the child cgroup (cgroup v1 does not move
//! charges with a process, so joining must come before allocating). The worker:
//!
//! 1. forks the *hog* first, before the buffer exists. A fork shares every private page
//!    copy-on-write, and the kernel treats shared pages differently (MADV_PAGEOUT skips them,
//!    reclaim has to unmap them from both processes), so a hog forked later would hold the
//!    buffer and change what is being tested. Forked early, it shares nothing of interest,
//!    inherits the cgroup, and waits on a pipe;
//! 2. maps a 128 MiB buffer, fills it with a non-zero pattern and marks every other chunk
//!    volatile (64 MiB);
//! 3. tells the test process, which reads the worker's smaps (the volatile half must be
//!    LazyFree) and says go;
//! 4. releases the hog, which touches 160 MiB of fresh memory and exits. Pinned half plus hog
//!    fit under the 256 MiB limit with 32 MiB to spare; with the volatile half too they are
//!    32 MiB over. There is no swap, so the only memory reclaim can take is the lazy-free
//!    volatile chunks: it must discard at least 32 MiB of them, or the hog is OOM-killed;
//! 5. after the hog is gone, unmarks every volatile chunk, checks every page of it (all zero,
//!    or exactly its pattern) against the reported purge count, checks the pinned chunks byte
//!    for byte, and sends the counts back through the pipe.
//!
//! `cgroup_pressure_discards_pages_shared_after_fork` adds a *sharer*, forked by the worker
//! after marking, which holds the volatile pages through the pressure and unmarks them too.
//! `cgroup_pressure_on_pages_marked_while_shared` forks the sharer before marking; reclaim
//! then cannot free anything, so instead of a hog (which would be OOM-killed) the test process
//! squeezes the cgroup, which fails with EBUSY rather than killing (see [`Pressure::Squeeze`]).
//!
//! Children only do simple things (no locks, no allocation beyond what vrange's mark does with
//! mmap); the harness process reads cgroup files and asserts.

mod common;
use common::Mapping;
use std::fs;
use std::io::{self, Write};
use std::time::{Duration, Instant};
use vrange::{mark_volatile, page_size, unmark, volatile_pages};
use vrange_sys::cgroup::{ChildCgroup, MemCgroup, Version};
use vrange_sys::{mem, procfs};
use vrange_testkit::cgroup::{self, peak};
use vrange_testkit::fork::{fork_linked, Link};
use vrange_testkit::hog;
use vrange_testkit::pattern::{check_at, fill, is_zero};
use vrange_testkit::proc::Exit;
use vrange_testkit::serial;

const MIB: usize = 1 << 20;
/// The child cgroup's hard limit.
const LIMIT: usize = 256 * MIB;
/// The worker's buffer: half pinned, half volatile, in alternating chunks.
const BUF: usize = 128 * MIB;
/// What the hog touches (see the module documentation for the arithmetic).
const HOG: usize = 160 * MIB;
/// Volatile chunks at most (1 MiB chunks).
const MAX_CHUNKS: usize = BUF / MIB / 2;
/// Deadline for each hand-over between processes.
const SYNC: Duration = Duration::from_secs(30);
/// Deadline for the whole run under pressure.
const RUN: Duration = Duration::from_secs(120);

/// What one process found when it unmarked and checked the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Verdict {
    /// Sum of `Unmarked::volatile` over the volatile chunks.
    volatile: u64,
    /// Sum of `Unmarked::purged`.
    purged: u64,
    /// Pages of volatile chunks that read all zero after unmark.
    zero: u64,
    /// Pages of volatile chunks that hold exactly their pattern.
    intact: u64,
    /// Pages of volatile chunks that hold neither: corrupted.
    bad: u64,
    /// Volatile chunks whose reported purge count differs from their zero pages.
    inexact: u64,
    /// Pinned chunks whose bytes changed.
    bad_pinned: u64,
    /// Pages still volatile after unmarking everything.
    left: u64,
    /// Unmark calls that failed.
    unmark_errors: u64,
    /// Purged pages of each volatile chunk, in order.
    chunk_purged: [u64; MAX_CHUNKS],
}

const VERDICT_WORDS: usize = 9 + MAX_CHUNKS;

impl Verdict {
    fn new() -> Verdict {
        Verdict {
            volatile: 0,
            purged: 0,
            zero: 0,
            intact: 0,
            bad: 0,
            inexact: 0,
            bad_pinned: 0,
            left: 0,
            unmark_errors: 0,
            chunk_purged: [0; MAX_CHUNKS],
        }
    }

    fn encode(&self, out: &mut [u64]) {
        out[..9].copy_from_slice(&[
            self.volatile,
            self.purged,
            self.zero,
            self.intact,
            self.bad,
            self.inexact,
            self.bad_pinned,
            self.left,
            self.unmark_errors,
        ]);
        out[9..VERDICT_WORDS].copy_from_slice(&self.chunk_purged);
    }

    fn decode(w: &[u64]) -> Verdict {
        let mut chunk_purged = [0; MAX_CHUNKS];
        chunk_purged.copy_from_slice(&w[9..VERDICT_WORDS]);
        Verdict {
            volatile: w[0],
            purged: w[1],
            zero: w[2],
            intact: w[3],
            bad: w[4],
            inexact: w[5],
            bad_pinned: w[6],
            left: w[7],
            unmark_errors: w[8],
            chunk_purged,
        }
    }
}

/// The worker's report: header words, then its verdict, then the sharer's (if any).
const HEADER_WORDS: usize = 4;
const REPORT_WORDS: usize = HEADER_WORDS + 2 * VERDICT_WORDS;
/// Header: the step that failed (0: none), a detail for it, the hog's `Exit`, the hog's run
/// time in milliseconds.
const H_FAILED: usize = 0;
const H_DETAIL: usize = 1;
const H_HOG: usize = 2;
const H_HOG_MS: usize = 3;

/// Worker steps that can fail, as reported in `H_FAILED`.
const STEP_JOIN: u64 = 1;
const STEP_MARK: u64 = 2;
const STEP_GO: u64 = 3;
const STEP_SHARER: u64 = 4;

/// Whether, and when, the worker forks a *sharer*: a process that maps the buffer
/// copy-on-write through the pressure and then unmarks and checks it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    No,
    /// Forked after marking: it inherits the volatile state, and clean page-table entries.
    AfterMark,
    /// Forked after filling, before marking: nothing is volatile in the sharer, and its
    /// page-table entries keep the dirty bit fork copied.
    BeforeMark,
}

/// Where the pressure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pressure {
    /// The hog touches 160 MiB.
    Hog,
    /// The test process asks the kernel to reclaim 32 MiB from the cgroup (v1: by lowering the
    /// limit, which fails with EBUSY instead of OOM-killing when reclaim cannot get there; v2:
    /// memory.reclaim). The hog is told to exit without allocating.
    Squeeze,
}

#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Chunk size: every other chunk is volatile.
    chunk: usize,
    /// Ask for transparent huge pages (the buffer is then 2 MiB aligned).
    huge: bool,
    share: Share,
    pressure: Pressure,
    seed: u64,
}

/// Unmarks every volatile chunk and checks every page. Allocation-free.
fn verify(ptr: *mut u8, s: &Setup) -> Verdict {
    let page = page_size();
    let mut v = Verdict::new();
    for c in 0..BUF / s.chunk {
        let off = c * s.chunk;
        if c % 2 == 0 {
            v.bad_pinned += u64::from(!check_at(ptr, off, s.chunk, s.seed));
            continue;
        }
        // SAFETY: the worker's own buffer, with no reference into it.
        let Ok(r) = (unsafe { unmark(ptr.wrapping_add(off), s.chunk) }) else {
            v.unmark_errors += 1;
            continue;
        };
        v.volatile += r.volatile as u64;
        v.purged += r.purged as u64;
        v.chunk_purged[c / 2] = r.purged as u64;
        let mut zero = 0;
        for p in (off..off + s.chunk).step_by(page) {
            if is_zero(ptr.wrapping_add(p), page) {
                zero += 1;
            } else if check_at(ptr, p, page, s.seed) {
                v.intact += 1;
            } else {
                v.bad += 1;
            }
        }
        v.zero += zero;
        v.inexact += u64::from(zero != r.purged as u64);
    }
    v.left = volatile_pages(ptr, BUF).map_or(u64::MAX, |n| n as u64);
    v
}

/// The hog: makes itself the OOM killer's first choice (so that if the limit is ever exceeded
/// the hog dies and the worker lives to report it), waits for the word, then (if it is not 0)
/// touches `HOG` bytes of fresh memory, and exits.
fn hog(link: &Link) -> i32 {
    let _ = hog::prefer_oom_kill();
    match link.recv::<1>(RUN) {
        Ok([0]) => return 0,
        Ok(_) => {}
        Err(_) => return 1,
    }
    if hog::touch(HOG, HOG, Duration::ZERO).is_err() {
        return 3;
    }
    0
}

/// The worker process (see the module documentation). Returns its exit code; everything it
/// found goes through `link`.
fn worker(link: &Link, s: &Setup) -> i32 {
    let mut report = [0u64; REPORT_WORDS];
    let fail = |report: &mut [u64; REPORT_WORDS], step: u64, detail: u64| {
        report[H_FAILED] = step;
        report[H_DETAIL] = detail;
        link.send(report);
        1
    };
    // Wait until the test process has moved us into the cgroup.
    if link.recv::<1>(SYNC).is_err() {
        return fail(&mut report, STEP_JOIN, 0);
    }
    // The hog first, before the buffer exists, so that it shares none of it.
    let (mut hog_proc, hog_link) = fork_linked(|l| {
        link.close_inherited();
        hog(l)
    });
    let align = if s.huge { mem::HUGE_PAGE } else { page_size() };
    let m = Mapping::aligned(BUF, align, s.huge);
    fill(m.ptr, BUF, s.seed);
    let fork_sharer = || {
        fork_linked(|l| {
            link.close_inherited();
            hog_link.close_inherited();
            // Hold the buffer, untouched, until the pressure is over.
            if l.recv::<1>(RUN).is_err() {
                return 1;
            }
            let mut words = [0u64; VERDICT_WORDS];
            verify(m.ptr, s).encode(&mut words);
            l.send(&words);
            0
        })
    };
    let mut sharer = (s.share == Share::BeforeMark).then(fork_sharer);
    for c in (1..BUF / s.chunk).step_by(2) {
        // SAFETY: the worker's own buffer, with no reference into it.
        if unsafe { mark_volatile(m.ptr.wrapping_add(c * s.chunk), s.chunk) }.is_err() {
            return fail(&mut report, STEP_MARK, c as u64);
        }
    }
    if s.share == Share::AfterMark {
        sharer = Some(fork_sharer());
    }
    // Ready: the test process inspects us (and squeezes the cgroup), then says go, with 1 if
    // the hog is to run.
    link.send(&[1]);
    let Ok(go) = link.recv::<1>(SYNC) else {
        return fail(&mut report, STEP_GO, 0);
    };
    let started = Instant::now();
    hog_link.send(&go);
    report[H_HOG] = hog_proc.wait(RUN).encode();
    report[H_HOG_MS] = started.elapsed().as_millis() as u64;
    // The sharer unmarks first, while the worker still maps every page; then the worker.
    if let Some((mut proc, l)) = sharer {
        l.send(&[1]);
        match l.recv::<VERDICT_WORDS>(RUN) {
            Ok(words) => report[HEADER_WORDS + VERDICT_WORDS..].copy_from_slice(&words),
            Err(_) => {
                let exit = proc.wait(SYNC);
                return fail(&mut report, STEP_SHARER, exit.encode());
            }
        }
        proc.wait(SYNC);
    }
    verify(m.ptr, s).encode(&mut report[HEADER_WORDS..HEADER_WORDS + VERDICT_WORDS]);
    link.send(&report);
    0
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("?".into(), |b| format!("{} MiB", b >> 20))
}

/// The cgroup's numbers, for failure messages.
fn numbers(cg: &MemCgroup) -> String {
    format!(
        "limit {}, usage {}, peak {}, oom_kills {:?}",
        mib(cg.limit()),
        mib(cg.usage().ok()),
        mib(peak(cg)),
        cg.oom_kills().ok()
    )
}

/// Asks the kernel to reclaim `bytes` from the cgroup without OOM-killing anyone (see
/// [`Pressure::Squeeze`]). Returns the usage before and after, and the kernel's answer.
fn squeeze(child: &ChildCgroup, bytes: u64) -> (u64, u64, io::Result<()>) {
    let cg = child.cgroup();
    let before = cg.usage().expect("read usage");
    let answer = match cg.version() {
        Version::V1 => child.set_limit(before.saturating_sub(bytes)),
        Version::V2 => fs::OpenOptions::new()
            .write(true)
            .open(cg.file("memory.reclaim"))
            .and_then(|mut f| f.write_all(bytes.to_string().as_bytes())),
    };
    let after = cg.usage().expect("read usage");
    if cg.version() == Version::V1 {
        child.set_limit(LIMIT as u64).expect("restore the limit");
    }
    (before, after, answer)
}

/// What a run found.
struct Outcome {
    worker: Verdict,
    sharer: Option<Verdict>,
    /// Usage before and after the squeeze, and what the kernel answered.
    squeezed: Option<(u64, u64, io::Result<()>)>,
    /// The worker's smaps before the pressure.
    before: procfs::Smaps,
    /// Pages per chunk.
    chunk_pages: u64,
}

/// Runs the worker in a fresh child cgroup and checks what every run must satisfy. `None` if
/// this environment cannot create memory cgroups.
fn run(s: Setup) -> Option<Outcome> {
    let _serial = serial();
    let child = match cgroup::child("vrange-pressure-", LIMIT as u64) {
        Ok(child) => child,
        Err(why) => {
            vrange_testkit::skip(why);
            return None;
        }
    };
    let cg = child.cgroup().clone();
    let started = Instant::now();

    let (mut worker_proc, link) = fork_linked(|l| worker(l, &s));
    child
        .add_pid(worker_proc.pid())
        .expect("move the worker into the child cgroup");
    let own = MemCgroup::current().expect("this process's memory cgroup");
    assert!(
        !cg.contains(&own),
        "the test process stays out: it is in {}",
        own.path().display()
    );
    link.send(&[1]);

    let ready = link.recv::<1>(SYNC);
    assert!(
        ready.is_ok(),
        "worker not ready ({ready:?}); it ended with {}; {}",
        worker_proc.wait(SYNC),
        numbers(&cg)
    );
    let before = procfs::smaps_rollup(Some(worker_proc.pid() as u32)).unwrap();
    let squeezed = (s.pressure == Pressure::Squeeze).then(|| squeeze(&child, 32 * MIB as u64));
    link.send(&[u64::from(s.pressure == Pressure::Hog)]);
    let words = link.recv::<REPORT_WORDS>(RUN);
    let words = words.unwrap_or_else(|e| {
        panic!(
            "no report from the worker ({e:?}); it ended with {}; {}",
            worker_proc.wait(SYNC),
            numbers(&cg)
        )
    });
    let exit = worker_proc.wait(SYNC);
    let oom_kills = cg.oom_kills().expect("read the OOM kill count");
    let summary = numbers(&cg);
    let elapsed = started.elapsed();

    cgroup::remove(child);

    assert_eq!(
        words[H_FAILED], 0,
        "worker failed at step {} (detail {}); {summary}",
        words[H_FAILED], words[H_DETAIL]
    );
    assert_eq!(exit, Exit::Code(0), "worker ended with {exit}; {summary}");
    let hog = Exit::decode(words[H_HOG]);
    assert!(
        hog == Exit::Code(0) && oom_kills == 0,
        "the hog ({} MiB) and the pinned half ({} MiB) must fit once the volatile chunks are \
         discarded, but the hog ended with {hog} ({oom_kills} OOM kills): {summary}",
        HOG >> 20,
        BUF >> 21
    );

    let page = page_size() as u64;
    let chunk_pages = (s.chunk / page_size()) as u64;
    let marked = (BUF / 2 / page_size()) as u64;
    // MADV_FREE parks the last few (up to 31) small folios in a per-CPU batch before they
    // become lazy; huge folios never wait there.
    let slack = if s.huge { 0 } else { 31 * page / 1024 };
    let lazy = (BUF / 2 / 1024) as u64;
    assert!(
        before.lazy_free_kb + slack >= lazy && before.lazy_free_kb <= lazy,
        "the volatile half is lazy-free before the pressure: {before:?}"
    );

    let worker = Verdict::decode(&words[HEADER_WORDS..HEADER_WORDS + VERDICT_WORDS]);
    let sharer =
        (s.share != Share::No).then(|| Verdict::decode(&words[HEADER_WORDS + VERDICT_WORDS..]));
    // A sharer forked before marking has nothing volatile; its own test checks it.
    let inherited = sharer.filter(|_| s.share == Share::AfterMark);
    for (who, v) in [("worker", Some(worker)), ("sharer", inherited)] {
        let Some(v) = v else { continue };
        assert_eq!(v.unmark_errors, 0, "{who}: unmark failed");
        assert_eq!(v.volatile, marked, "{who}: volatile pages");
        assert_eq!(v.left, 0, "{who}: nothing left volatile");
        assert_eq!(v.bad_pinned, 0, "{who}: pinned chunks intact");
        assert_eq!(v.bad, 0, "{who}: every volatile page is intact or zero");
        assert!(
            v.purged > 0,
            "{who}: the pressure purged nothing; {summary}"
        );
        assert_eq!(
            (v.purged, v.inexact),
            (v.zero, 0),
            "{who}: exactly the zero-reading pages are reported purged"
        );
        assert_eq!(v.purged + v.intact, marked, "{who}");
    }
    println!(
        "{}: purged {} of {} volatile pages ({} MiB); hog {} ms; whole run {} ms; \
         before pressure {before:?}; {summary}",
        if s.huge { "THP" } else { "4 KiB" },
        worker.purged,
        marked,
        (worker.purged * page) >> 20,
        words[H_HOG_MS],
        elapsed.as_millis()
    );
    Some(Outcome {
        worker,
        sharer,
        squeezed,
        before,
        chunk_pages,
    })
}

/// 1 MiB chunks of small pages: reclaim discards some 33 of the 64 volatile MiB, the hog
/// fits, and unmark reports exactly the zero-reading pages.
#[test]
fn cgroup_pressure_purges_volatile_and_keeps_pinned() {
    run(Setup {
        chunk: MIB,
        huge: false,
        share: Share::No,
        pressure: Pressure::Hog,
        seed: 21,
    });
}

/// 2 MiB chunks of transparent huge pages. Linux 6.18 discards a lazy-free THP whole: reclaim
/// splits the PMD mapping (`thp_split_pmd` counts one per discarded chunk) but not the folio
/// (`thp_split_page` stays 0) and frees all 512 pages at once, so every chunk reports 0 or 512
/// purged. The chunk refaults as small pages afterwards (its page table is now a PTE table).
#[test]
fn cgroup_pressure_thp() {
    let Some(out) = run(Setup {
        chunk: mem::HUGE_PAGE,
        huge: true,
        share: Share::No,
        pressure: Pressure::Hog,
        seed: 22,
    }) else {
        return;
    };
    let chunks = &out.worker.chunk_purged[..(BUF / mem::HUGE_PAGE / 2)];
    println!("THP chunks purged: {chunks:?}");
    if out.before.anon_huge_kb < (BUF / 1024) as u64 {
        vrange_testkit::skip(format_args!(
            "whole-THP discard check: only {} kB of the buffer got huge pages \
             (exactness was still checked)",
            out.before.anon_huge_kb
        ));
        return;
    }
    for (i, &n) in chunks.iter().enumerate() {
        assert!(
            n == 0 || n == out.chunk_pages,
            "huge chunk {i}: {n} pages purged; a lazy-free THP is discarded whole"
        );
    }
}

/// The worker forks a *sharer* after marking, so both map every volatile page (clean,
/// copy-on-write) during the pressure. MADV_PAGEOUT would skip such pages (see fork.rs); real
/// reclaim unmaps them from both processes and discards them: both report the same pages
/// purged, each exactly.
#[test]
fn cgroup_pressure_discards_pages_shared_after_fork() {
    let Some(out) = run(Setup {
        chunk: MIB,
        huge: false,
        share: Share::AfterMark,
        pressure: Pressure::Hog,
        seed: 23,
    }) else {
        return;
    };
    let sharer = out.sharer.unwrap();
    println!(
        "shared: worker purged {}, sharer purged {}",
        out.worker.purged, sharer.purged
    );
    assert_eq!(
        sharer.chunk_purged, out.worker.chunk_purged,
        "reclaim discards a shared lazy-free page from both processes at once"
    );
}

/// The sharer is forked *before* marking (fork first, then mark while the pages are shared).
/// MADV_FREE still makes the pages lazy-free and cleans the worker's page-table entries, but
/// the sharer's entries stay dirty. Reclaim then unmaps the worker's clean entries, finds the
/// sharer's dirty one, keeps the page for the sharer and makes it ordinary anonymous memory
/// again: the worker loses its view of the pages (and reports exactly that), the sharer loses
/// nothing, and no memory is freed, so a hog would be OOM-killed; the test squeezes the
/// cgroup instead.
#[test]
fn cgroup_pressure_on_pages_marked_while_shared() {
    let Some(out) = run(Setup {
        chunk: MIB,
        huge: false,
        share: Share::BeforeMark,
        pressure: Pressure::Squeeze,
        seed: 24,
    }) else {
        return;
    };
    let (before, after, answer) = out.squeezed.unwrap();
    let sharer = out.sharer.unwrap();
    let marked = (BUF / 2 / page_size()) as u64;
    println!(
        "marked while shared: worker purged {} of {marked}, sharer kept {}; usage {} -> {} \
         MiB, squeeze answered {answer:?}",
        out.worker.purged,
        sharer.intact,
        before >> 20,
        after >> 20
    );
    assert_eq!(
        (sharer.volatile, sharer.zero, sharer.bad, sharer.bad_pinned),
        (0, 0, 0, 0),
        "the sharer has nothing volatile and loses nothing"
    );
    assert_eq!(sharer.intact, marked, "the sharer keeps every page");
    assert!(
        before - after.min(before) < 8 * MIB as u64,
        "reclaim frees nothing: the sharer keeps the pages ({} -> {} bytes)",
        before,
        after
    );
}
