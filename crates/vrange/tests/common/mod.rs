//! What only the core's integration tests share: test-owned mappings and forced purges. The
//! tooling every crate's tests share (page patterns, forked and re-executed processes, cgroups,
//! the serial lock) is `vrange-testkit`'s.
#![allow(dead_code)] // each test file uses its own subset

use vrange_sys::mem;

/// Forces the kernel to reclaim the range now: every clean lazy page is discarded, provided
/// the calling thread marked the pages on the CPU it runs on now (see [`pin_cpu`]).
pub fn force_purge(ptr: *mut u8, len: usize) {
    pin_cpu();
    mem::reclaim_now(ptr, len).expect("MADV_PAGEOUT");
}

/// [`force_purge`] until no page of the range is resident (at most 50 tries, 10 ms apart):
/// for a test that expects every lazily freed page discarded, where a page the kernel has
/// isolated for a moment (compaction, migration) is skipped by that one MADV_PAGEOUT. Returns
/// the pages still resident (0 unless something keeps them).
pub fn force_purge_all(ptr: *mut u8, len: usize) -> usize {
    let mut resident = usize::MAX;
    for _ in 0..50 {
        force_purge(ptr, len);
        resident = mem::resident_pages(ptr, len).expect("mincore");
        if resident == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    resident
}

/// Pins the calling thread to the CPU it runs on (once per thread), so that MADV_FREE and
/// MADV_PAGEOUT share a CPU and forced purges are deterministic (see
/// `vrange_sys::mem::reclaim_now`). Mappings made by the helpers below call it first.
pub fn pin_cpu() {
    thread_local!(static PINNED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if PINNED.with(|p| p.replace(true)) {
        return;
    }
    mem::pin_thread_to_current_cpu().expect("pin the test thread to its CPU");
}

/// A private anonymous mapping owned by a test, unmapped on drop.
pub struct Mapping {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Mapping {
    pub fn new(len: usize) -> Mapping {
        Mapping::aligned(len, mem::page_size(), false)
    }

    pub fn aligned(len: usize, align: usize, huge: bool) -> Mapping {
        pin_cpu();
        let ptr = mem::map_anon(len, align).expect("mmap").as_ptr();
        mem::advise_huge(ptr, len, huge).ok();
        Mapping { ptr, len }
    }

    pub fn page(&self, i: usize) -> *mut u8 {
        self.ptr.wrapping_add(i * mem::page_size())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Memory unmapped while volatile must be forgotten, or a later mapping at the same
        // address would inherit its page states.
        // SAFETY: test-owned memory; the mapping is owned by this value and about to go.
        unsafe { vrange::forget(self.ptr, self.len).unwrap() };
        // SAFETY: test-owned memory; the mapping is owned by this value.
        unsafe { mem::unmap(std::ptr::NonNull::new(self.ptr).unwrap(), self.len) };
    }
}

/// Only explicit purges (and the ones a test enables) from here on: the pressure sources and
/// the budget off, hybrid ranges not armed for an hour.
pub fn quiet() {
    for (name, value) in [
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "off"),
        ("VRANGE_BUDGET", "0"),
        ("VRANGE_ARM_DELAY_MS", "3600000"),
        ("VRANGE_POLL_MS", "100"),
    ] {
        vrange::set_option(name, value).unwrap();
    }
}

/// Writes the words of the pattern with `seed` at `offset` (bytes, a multiple of 8) into `buf`:
/// a refill region's generator.
pub fn generate(seed: u64, offset: usize, buf: &mut [u8]) {
    for (j, chunk) in buf.chunks_exact_mut(8).enumerate() {
        chunk
            .copy_from_slice(&vrange_testkit::pattern::pattern(seed, offset / 8 + j).to_ne_bytes());
    }
}

/// A small deterministic generator of offsets (xorshift; no dependency for a test's dice).
pub fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Closes every descriptor at or above vrange's floor, as a daemon's closefrom would: the
/// program taking vrange's descriptors away.
pub fn close_from_floor() {
    // SAFETY: close_range on descriptors this test process does not use itself (vrange's, at
    // and above the floor).
    #[allow(clippy::disallowed_methods)]
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            vrange_sys::fd::floor() as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
    assert_eq!(rc, 0, "close_range");
}

/// Word `i` of a refill region, read through it (a missing block is filled first).
/// Reads through the first `len` bytes of `r` (a word of each page, in order) and waits for
/// them to be lazily freed, which they must be within a moment of the last fill (blocks made
/// one after another are freed in runs: `crate::refill_lazy`), so that the kernel could take
/// them. Allows what the kernel keeps in its per-CPU batches (31 pages on each of 2 CPUs) and
/// what the kernel took already.
pub fn assert_lazily_freed_soon(r: &vrange::RefillRegion, len: usize) {
    let page = vrange::page_size();
    for at in (0..len).step_by(page) {
        read_word(r, at / 8);
    }
    let slack = 62 * page as u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let lazy = vrange_testkit::procfs::lazy_free_kb(r.as_ptr()) << 10;
        let resident = (vrange_sys::mem::resident_pages(r.as_ptr(), len).unwrap() * page) as u64;
        if lazy + slack >= resident && lazy > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} KiB of {} KiB resident lazily freed",
            lazy >> 10,
            resident >> 10
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub fn read_word(r: &vrange::RefillRegion, i: usize) -> u64 {
    assert!(i * 8 < r.len());
    // SAFETY: inside the region; reading fills its block first if it is missing.
    unsafe { (r.as_ptr() as *const u64).add(i).read_volatile() }
}

/// A refill region just made, or None (with a printed reason, a skip) where userfaultfd is not
/// available to this process.
pub fn refill_or_skip(
    made: Result<vrange::RefillRegion, vrange::Error>,
) -> Option<vrange::RefillRegion> {
    match made {
        Ok(r) => Some(r),
        Err(vrange::Error::Os(libc::ENOTSUP)) => {
            vrange_testkit::skip("userfaultfd is not available to this process");
            None
        }
        Err(e) => panic!("a refill region: {e}"),
    }
}

/// The closed-descriptor scenario of both refill kinds: region `a` (seed 11, `make(seed)` gives
/// a region of at least two blocks of `block` bytes holding `pattern(seed, _)`) is read, the
/// program closes every descriptor from vrange's floor up (the kernel drops the registrations),
/// region `b` (seed 12) opens a new descriptor, and then `a`'s purged block must be made again
/// within `within` (zero: at once). Until `a` is registered again, a missing page of it reads
/// zero, so the block is taken and read again every 100 ms until the deadline.
pub fn registered_again_after_closefrom(
    block: usize,
    make: impl Fn(u64) -> Option<vrange::RefillRegion>,
    within: std::time::Duration,
) {
    use vrange_testkit::pattern::pattern;
    let Some(a) = make(11) else {
        return;
    };
    assert_eq!(read_word(&a, 0), pattern(11, 0));
    close_from_floor();
    let Some(b) = make(12) else {
        return;
    };
    assert_eq!(read_word(&b, 1), pattern(12, 1));
    let deadline = std::time::Instant::now() + within;
    loop {
        // SAFETY: the region's content is the generator's: nothing is lost.
        unsafe { mem::purge_forced(a.as_ptr(), block) }.unwrap();
        if read_word(&a, 1) == pattern(11, 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first region was not registered again within {within:?}: its pages read zero"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Both refill kinds refuse a block that is not a page multiple and a zero length;
/// `make(len, block)` makes a region of the kind.
pub fn refill_refuses_bad_arguments(
    make: impl Fn(usize, usize) -> Result<vrange::RefillRegion, vrange::Error>,
) {
    let page = vrange::page_size();
    assert_eq!(
        make(16 * page, page + 1).err(),
        Some(vrange::Error::Unaligned)
    );
    assert_eq!(make(0, page).err(), Some(vrange::Error::NotRegion));
}

/// The memory cgroup limit of the refill kinds' pressure scenario, and their region: four times
/// as large.
pub const PRESSURE_LIMIT: usize = 64 << 20;
pub const PRESSURE_REGION: usize = 4 * PRESSURE_LIMIT;
/// The seed of its generator.
pub const PRESSURE_SEED: u64 = 8;

/// The pressure scenario's reader, in a role process inside the small cgroup: makes a region of
/// [`PRESSURE_REGION`] bytes with `make(len)` (holding `pattern(PRESSURE_SEED, _)`), reads it
/// whole in order (four times the limit), then 1,000 random words, each checked against the
/// generator. With `forked`, a child forked after the first pass shares every page the region
/// holds while the random words are read (the kernel refuses to move a shared page: those
/// blocks are copied instead). Says how many words were wrong, the fills, the blocks, and the
/// bytes recycled and moved.
pub fn pressure_reader(
    make: impl FnOnce(usize) -> vrange::RefillRegion,
    block: usize,
    forked: bool,
) {
    use vrange_testkit::pattern::pattern;
    let before = vrange::stats();
    let r = make(PRESSURE_REGION);
    let mut wrong = 0u64;
    for i in (0..PRESSURE_REGION / 8).step_by(vrange::page_size() / 8) {
        wrong += u64::from(read_word(&r, i) != pattern(PRESSURE_SEED, i));
    }
    let at_fork = vrange::stats();
    let child = forked.then(|| {
        vrange_testkit::fork::fork_linked(|link| {
            // Holds the parent's pages until it is done (or gone).
            let _ = link.recv::<1>(std::time::Duration::from_secs(120));
            0
        })
    });
    let mut dice = 0x1234_5678_9abc_def1u64;
    for _ in 0..1000 {
        let i = next(&mut dice) as usize % (PRESSURE_REGION / 8);
        wrong += u64::from(read_word(&r, i) != pattern(PRESSURE_SEED, i));
    }
    if let Some((mut child, link)) = child {
        drop(link);
        child.wait(std::time::Duration::from_secs(30));
    }
    let after = vrange::stats();
    vrange_testkit::role::say(format_args!(
        "DONE wrong={wrong} fills={} blocks={} recycled={} kept={} moved={} late_recycled={} \
         late_kept={}",
        after.refill_fills - before.refill_fills,
        PRESSURE_REGION / block,
        after.refill_recycled_bytes - before.refill_recycled_bytes,
        after.refill_recycled_moved_bytes - before.refill_recycled_moved_bytes,
        after.refill_moved_bytes - before.refill_moved_bytes,
        after.refill_recycled_bytes - at_fork.refill_recycled_bytes,
        after.refill_recycled_moved_bytes - at_fork.refill_recycled_moved_bytes,
    ));
}

/// The pressure scenario's test: runs role `role` of test `test` (whose reader is
/// [`pressure_reader`]) in a child memory cgroup of [`PRESSURE_LIMIT`], with `env` set
/// (skips without userfaultfd or a cgroup), and checks that every word was the generator's, no process was OOM-killed, blocks were made
/// again, the fills near the limit recycled the oldest blocks, and pages were moved into place
/// where the kernel moves them and moves are not turned off (`moves`), else none.
pub fn pressure_test(test: &str, role: &str, env: &[(&str, &str)], moves: bool, forked: bool) {
    use vrange_testkit::{cgroup, role::Role};
    if !vrange::features().userfaultfd && vrange::features().userfaultfd_dev.is_err() {
        return vrange_testkit::skip("userfaultfd is not available to this process");
    }
    let child = match cgroup::child("vrange-refill-", PRESSURE_LIMIT as u64) {
        Ok(c) => c,
        Err(why) => return vrange_testkit::skip(why),
    };
    let cg = child.cgroup().clone();
    let mut cmd = vrange_testkit::role::role_command(test, role);
    cmd.envs(env.iter().copied());
    vrange_sys::cgroup::join_before_exec(&mut cmd, &cg.file("cgroup.procs"))
        .expect("open cgroup.procs");
    let mut p = Role::spawn(role, cmd);
    let reply = p.next(std::time::Duration::from_secs(120));
    let exit = p.wait(std::time::Duration::from_secs(30));
    let kills = cg.oom_kills().expect("the OOM kill count");
    let diagnostics = p.diagnostics();
    drop(p);
    cgroup::remove(child);
    let reply = reply.unwrap_or_else(|e| panic!("the reader: {e}; {exit}\n{diagnostics}"));
    println!(
        "{role}: {} MiB region under a {} MiB limit: {} fills of {} blocks, {} MiB recycled, \
         {} MiB moved ({} KiB recycled after a fork, if any, {} KiB of them moved), {} wrong words, \
         OOM kills {kills}",
        PRESSURE_REGION >> 20,
        PRESSURE_LIMIT >> 20,
        reply.u64("fills"),
        reply.u64("blocks"),
        reply.u64("recycled") >> 20,
        reply.u64("moved") >> 20,
        reply.u64("late_recycled") >> 10,
        reply.u64("late_kept") >> 10,
        reply.u64("wrong")
    );
    assert_eq!(exit, vrange_testkit::proc::Exit::Code(0));
    assert_eq!(kills, 0);
    assert_eq!(reply.u64("wrong"), 0, "every word is the generator's");
    assert!(
        reply.u64("fills") > reply.u64("blocks"),
        "blocks were taken back and made again"
    );
    // At the limit, fills take the oldest blocks' pages first (the pages kept): the
    // sequential pass alone fills three limits' worth past the first.
    assert!(
        reply.u64("recycled") >= PRESSURE_LIMIT as u64,
        "fills near the limit recycled the oldest blocks: {reply:?}"
    );
    if moves {
        assert!(
            reply.u64("moved") >= PRESSURE_LIMIT as u64,
            "blocks were moved into place: {reply:?}"
        );
        assert!(
            reply.u64("kept") >= PRESSURE_LIMIT as u64,
            "recycled blocks' pages were moved into the fill's buffer: {reply:?}"
        );
    } else {
        assert_eq!(reply.u64("moved"), 0, "every block was copied: {reply:?}");
        assert_eq!(
            reply.u64("kept"),
            0,
            "recycled blocks were given back: {reply:?}"
        );
    }
    // After the fork (the random pass), the oldest blocks' pages are shared with the child:
    // recycling goes on, and where the kernel moves pages it refuses those (EBUSY), so some
    // recycled blocks were given back rather than moved into the fill's buffer (blocks
    // filled after the fork are the parent's alone and move as before).
    if forked {
        assert!(
            reply.u64("late_recycled") > 0,
            "recycling went on: {reply:?}"
        );
        if moves {
            assert!(
                reply.u64("late_recycled") > reply.u64("late_kept"),
                "shared pages were not moved: {reply:?}"
            );
        }
    }
}

/// The pressure scenario with moves as the kernel allows (`VRANGE_REFILL_MOVE=on`, whatever
/// the test process's own environment says) or turned off; `forked` as [`pressure_reader`].
/// Runs the reader, `reader(forked)`, when this process is that role.
pub fn pressure(test: &str, role: &str, moves: bool, forked: bool, reader: impl FnOnce(bool)) {
    if vrange_testkit::role::role().as_deref() == Some(role) {
        return reader(forked);
    }
    let _s = vrange_testkit::serial();
    let setting = if moves { "on" } else { "off" };
    pressure_test(
        test,
        role,
        &[("VRANGE_REFILL_MOVE", setting)],
        moves && vrange::features().uffd_move,
        forked,
    );
}

/// The pressure scenarios of a refill kind, as tests of the file that invokes it (with
/// `#[macro_use] mod common;`): moves as the kernel allows, moves off, and a fork child sharing
/// the region's pages. `$role` names the reader's role; `$make(len)` makes a region of the kind
/// of `len` bytes in blocks of `$block`, holding `pattern(PRESSURE_SEED, _)`.
#[allow(unused_macros)] // the refill kinds' files use it
macro_rules! pressure_tests {
    ($role:expr, $block:expr, $make:expr) => {
        /// The reader of the pressure scenarios (`common::pressure_reader`).
        fn pressure_reader(forked: bool) {
            common::pressure_reader($make, $block, forked);
        }

        /// Four times the memory the region may use, read whole and at random: every word is
        /// the generator's, nothing is OOM-killed, and near the limit each fill takes the oldest
        /// block's pages, moved into its buffer and the buffer moved into place where the
        /// kernel moves pages.
        #[test]
        fn a_region_four_times_its_cgroup_limit_reads_the_generator_without_oom() {
            let test = "a_region_four_times_its_cgroup_limit_reads_the_generator_without_oom";
            common::pressure(test, $role, true, false, pressure_reader);
        }

        /// The same with moves turned off (`VRANGE_REFILL_MOVE=off`): the copy path of kernels
        /// before 6.8, on any kernel. The oldest blocks are given back instead, and every block
        /// is copied.
        #[test]
        fn with_moves_off_blocks_are_copied_and_the_oldest_given_back() {
            let test = "with_moves_off_blocks_are_copied_and_the_oldest_given_back";
            common::pressure(test, $role, false, false, pressure_reader);
        }

        /// The region's pages shared with a fork child while it is read again: the kernel
        /// refuses to move a shared page (EBUSY), and those blocks are given back and copied
        /// instead.
        #[test]
        fn pages_shared_with_a_fork_child_are_recycled_without_moving() {
            let test = "pages_shared_with_a_fork_child_are_recycled_without_moving";
            common::pressure(test, $role, true, true, pressure_reader);
        }
    };
}
