//! Library-owned regions and the operations on their ranges: creation and freeing, mark and
//! unmark following the region's policy, splitting a range when a call covers part of it, and
//! the two reclaimer actions (purge, arm).
//!
//! Marking and unmarking a managed or hybrid range is one compare-and-swap on its state word
//! plus a clock read: no system call, no page walk, whatever the size. A call that covers part
//! of a range splits it first, once (cost proportional to the pages split off, for the owner
//! map); later calls on the pieces are O(1) again.

use crate::lazy;
use crate::registry::{self, pause, Policy, Priority, Slot, PURGES};
use crate::shared;
use crate::span::Span;
use crate::state::{self, Found, Marked};
use crate::stats;
use crate::{Error, Huge, Unmarked};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use vrange_sys::{clock, mem};

/// How a new region is made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// How its volatile ranges are purged (default [`Policy::Hybrid`]).
    pub policy: Policy,
    /// Its reclaim class (default [`Priority::Normal`]).
    pub priority: Priority,
    /// memfd-backed and shareable with other processes (always managed).
    pub shared: bool,
    /// Transparent huge pages for private regions (default [`Huge::Auto`]).
    pub huge: Huge,
    /// SIGBUS mode (default off): while a range is volatile, touching a
    /// purged page raises SIGBUS at that address instead of reading zero (see
    /// [`crate::mark_volatile_sigbus`] and [`crate::fill`]). Managed and hybrid regions are
    /// populated when created and registered with the process's userfaultfd; hybrid ones are
    /// then purged as managed ones (never armed); shared ones are populated and registered in
    /// each process that maps them in SIGBUS mode ([`VolatileRegion::open_shared_with`]).
    /// Fails with `Error::Os(ENOTSUP)` without userfaultfd.
    ///
    /// [`VolatileRegion::open_shared_with`]: crate::VolatileRegion::open_shared_with
    pub sigbus: bool,
}

/// Creates a region of `len` bytes (rounded up to a page; content zero, pinned). Returns its
/// start and rounded length.
pub(crate) fn create(len: usize, opts: Options) -> Result<(usize, usize), Error> {
    let len = crate::span::region_len(len)?;
    let new = registry::alloc_slot()?;
    let slot = new.slot();
    let start = if opts.shared {
        create_shared(slot, len, opts)
    } else {
        create_private(slot, len, opts)
    }?;
    if let Err(e) = registry::set_owner(start, start + len, new.idx()) {
        // SAFETY: the region was just created and never handed out.
        unsafe { release_mapping(slot, start, len) };
        return Err(e);
    }
    new.publish();
    Ok((start, len))
}

fn create_private(slot: &Slot, len: usize, opts: Options) -> Result<usize, Error> {
    let (base, huge) = crate::region::map_owned(len, opts.huge)?;
    let start = base.as_ptr() as usize;
    // SIGBUS regions are never armed: the proof of an armed unmark touches every page.
    let policy = match opts.policy {
        Policy::Hybrid if opts.sigbus => Policy::Managed,
        p => p,
    };
    slot.init(policy, opts.priority, start, len);
    slot.set_thp_advice(huge);
    if opts.sigbus {
        slot.set_sigbus();
        // The kernel path registers at each mark; managed ranges for good, populated first so
        // that only purged pages are missing.
        let armed = match policy {
            Policy::Lazy => crate::sigbus::ensure().map(drop),
            _ => crate::sigbus::arm_region(start, len),
        };
        if let Err(e) = armed {
            // SAFETY: just mapped, never handed out.
            unsafe { mem::unmap(base, len) };
            return Err(e);
        }
    }
    Ok(start)
}

fn create_shared(slot: &Slot, len: usize, opts: Options) -> Result<usize, Error> {
    let m = shared::create(len)?;
    let epoch = m.header().epoch.load(Acquire);
    let (header, data, fd) = m.into_parts();
    let start = data as usize;
    slot.init(Policy::Managed, opts.priority, start, len);
    slot.header.store(header, Release);
    SHARED_LIVE.fetch_add(1, Relaxed);
    slot.fd.store(fd, Relaxed);
    slot.seen_epoch.store(epoch, Relaxed);
    if opts.sigbus {
        slot.set_sigbus();
        // Every page of the file allocated, so that only punched holes (purges) are missing.
        if let Err(e) = crate::sigbus::arm_region(start, len) {
            // SAFETY: just created, never handed out.
            unsafe { release_mapping(slot, start, len) };
            return Err(e);
        }
    }
    Ok(start)
}

/// Maps a shared region from a descriptor another process (or this one) created. The new
/// mapping does not hold a pin: unmark it before use.
pub(crate) fn open_shared(
    fd: BorrowedFd<'_>,
    priority: Priority,
    sigbus: bool,
) -> Result<(usize, usize), Error> {
    let m = shared::open(fd)?;
    let len = m.len;
    let epoch = m.header().epoch.load(Acquire);
    let new = match registry::alloc_slot() {
        Ok(s) => s,
        Err(e) => {
            // SAFETY: the mapping was just created and never handed out.
            unsafe { mem::unmap(m.base, len + mem::page_size()) };
            return Err(e);
        }
    };
    let slot = new.slot();
    let (header, data, fd) = m.into_parts();
    let start = data as usize;
    slot.init(Policy::Managed, priority, start, len);
    slot.header.store(header, Release);
    SHARED_LIVE.fetch_add(1, Relaxed);
    slot.fd.store(fd, Relaxed);
    slot.holding.store(false, Relaxed);
    slot.seen_epoch.store(epoch, Relaxed);
    if sigbus {
        slot.set_sigbus();
        // The file's pages exist (its creator allocated them): only holes are missing.
        let registered = crate::sigbus::ensure()
            .and_then(|fd| crate::sigbus::register(fd, Span::new(start, len)?));
        if let Err(e) = registered {
            // SAFETY: just mapped, never handed out.
            unsafe { release_mapping(slot, start, len) };
            return Err(e);
        }
    }
    if let Err(e) = registry::set_owner(start, start + len, new.idx()) {
        // SAFETY: the region was just mapped and never handed out.
        unsafe { release_mapping(slot, start, len) };
        return Err(e);
    }
    new.publish();
    Ok((start, len))
}

/// # Safety
/// Nobody may use the region any more.
unsafe fn release_mapping(slot: &Slot, start: usize, len: usize) {
    let page = mem::page_size();
    let header = slot.header.load(Acquire);
    if header.is_null() {
        let base = std::ptr::NonNull::new(start as *mut u8).expect("region start");
        // SAFETY: the caller gives up the region, which this module mapped.
        unsafe { mem::unmap(base, len) };
    } else {
        SHARED_LIVE.fetch_sub(1, Relaxed);
        // No slot points into the mapping once it is gone (see `registry::Slot::header`).
        slot.header.store(std::ptr::null_mut(), Release);
        let base = std::ptr::NonNull::new(header.cast::<u8>()).expect("header");
        // SAFETY: as above; the shared mapping is the header page plus the data.
        unsafe { mem::unmap(base, len + page) };
        let fd = slot.fd.swap(std::ptr::null_mut(), Relaxed);
        if !fd.is_null() {
            // SAFETY: the slot owned this box (from `Mapping::into_parts`) and gives it up; the
            // descriptor is closed only if it is still the region's (see `vrange_sys::fd`).
            drop(unsafe { Box::from_raw(fd) });
        }
    }
}

/// Calls `f` on every range of the region covering `span`, splitting ranges at the span's ends
/// first so that each range `f` sees lies inside the span.
/// The range holding a span's first page, found by the region table (`crate::regions`).
pub(crate) type First = (u32, &'static Slot);

/// The range holding the first page of `span`, which must lie in one region of ranges.
fn first_of(span: Span) -> Result<First, Error> {
    crate::regions::ranges_of(span)?.ok_or(Error::NotRegion)
}

/// Calls `f` on every range of `span` in turn, from `first` (the range holding its first page),
/// splitting the ranges at the span's ends first.
fn for_each_range(
    first: First,
    span: Span,
    mut f: impl FnMut(u32, &'static Slot) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut known = Some(first);
    let mut addr = span.start;
    while addr < span.end {
        let (idx, slot) = match known.take() {
            Some(range) => range,
            None => registry::owner_of(addr).ok_or(Error::NotMapped)?,
        };
        let (start, len) = slot.extent();
        if start < addr {
            split(idx, slot, addr)?;
            continue;
        }
        if start + len > span.end {
            split(idx, slot, span.end)?;
        }
        f(idx, slot)?;
        addr = start + slot.len.load(Acquire);
    }
    Ok(())
}

/// Splits the range of `slot` at `at` (strictly inside it) into two ranges in the same state.
fn split(idx: u32, slot: &'static Slot, at: usize) -> Result<(), Error> {
    let word = slot.state().claim();
    let (start, len) = slot.extent();
    if at <= start || at >= start + len {
        // Another thread split it first.
        slot.state().release(word);
        return Ok(());
    }
    let new = match registry::alloc_slot() {
        Ok(s) => s,
        Err(e) => {
            slot.state().release(word);
            return Err(e);
        }
    };
    let (nidx, piece) = (new.idx(), new.slot());
    let head = at - start;
    let tail = len - head;
    let armed = slot.armed.load(Relaxed);
    piece.init_split(slot, word, at, tail, armed.saturating_sub(head));
    if let Err(e) = registry::set_owner(at, start + len, nidx) {
        drop(new);
        slot.state().release(word);
        return Err(e);
    }
    slot.armed.store(armed.min(head), Relaxed);
    slot.len.store(head, Release);
    if counts_as_volatile(word) {
        stats::volatile_sub(idx, tail);
        stats::volatile_add(nidx, tail);
    }
    new.publish();
    slot.state().release(word);
    Ok(())
}

fn counts_as_volatile(word: u64) -> bool {
    state::is_purgeable(word)
}

/// Marks `span` (inside one region) volatile following the region's policy.
///
/// # Safety
/// As [`crate::mark_volatile`]: no reference into the span may assume stable content.
pub(crate) unsafe fn mark(span: Span) -> Result<(), Error> {
    // SAFETY: forwarded contract.
    unsafe { mark_in(first_of(span)?, span) }
}

/// [`mark`] with the range holding the span's first page already found.
///
/// # Safety
/// As [`mark`].
pub(crate) unsafe fn mark_in(first: First, span: Span) -> Result<(), Error> {
    if first.1.policy() == Policy::Lazy {
        // SAFETY: the span lies inside a private anonymous region this library mapped.
        return unsafe {
            if first.1.sigbus() {
                lazy::mark_span_sigbus(span)
            } else {
                lazy::mark_span(span)
            }
        };
    }
    let now = clock::now_ns();
    for_each_range(first, span, |idx, slot| {
        mark_range(idx, slot, now);
        Ok(())
    })
}

fn mark_range(idx: u32, slot: &Slot, now: u64) {
    if slot.header().is_some() && !slot.holding.swap(false, Relaxed) {
        return; // this process holds no pin to drop
    }
    let previous = slot.last_used();
    slot.touch(now);
    if slot.state().mark() == Marked::Now && slot.header().is_none() {
        stats::volatile_add(idx, slot.len.load(Relaxed));
        let hot = crate::approach::is_hot(previous, now);
        slot.hot.store(hot, Relaxed);
        if crate::approach::arm_at_mark(hot, slot.len.load(Relaxed)) {
            arm_now(slot, now);
        }
    }
}

/// Hands a hybrid range just marked to the kernel's lazy-free path in the marking thread, while
/// memory is tight and the armed reserve short (`crate::approach`), unless it is hot (marked
/// again within `approach::HOT`). Skipped while a purge holds the purge lock (a flush hook
/// marking inside one): the reclaimer's next pass, at most 10 ms away, keeps the reserve.
fn arm_now(slot: &Slot, now: u64) {
    let word = slot.state().load();
    if !due_for_arming(slot, word, now, 0) {
        return;
    }
    // Held so that a fork never copies a range half armed (`vrange_sys::lock`).
    if let Some(_p) = PURGES.try_lock() {
        stats::count_armed(arm(slot, word));
    }
}

/// Pins `span` (inside one region) again and reports what was purged.
pub(crate) fn unmark(span: Span) -> Result<Unmarked, Error> {
    unmark_in(first_of(span)?, span)
}

/// [`unmark`] with the range holding the span's first page already found.
pub(crate) fn unmark_in(first: First, span: Span) -> Result<Unmarked, Error> {
    if first.1.policy() == Policy::Lazy {
        if first.1.sigbus() {
            // Stops signalling first: the proof reads every page.
            crate::sigbus::disarm(span);
        }
        // SAFETY: the span lies inside a private anonymous region this library mapped.
        return Ok(unsafe { lazy::unmark_span(span) });
    }
    let mut total = Unmarked::default();
    for_each_range(first, span, |idx, slot| {
        let u = unmark_range(idx, slot);
        total.pages += u.pages;
        total.volatile += u.volatile;
        total.purged += u.purged;
        Ok(())
    })?;
    Ok(total)
}

fn unmark_range(idx: u32, slot: &Slot) -> Unmarked {
    let (start, len) = slot.extent();
    let pages = len / mem::page_size();
    let pinned = Unmarked {
        pages,
        ..Unmarked::default()
    };
    if let Some(h) = slot.header() {
        if slot.holding.swap(true, Relaxed) {
            return pinned;
        }
        let found = slot.state().unmark(true);
        // A purge bumps the epoch before its word leaves PURGING, and none can start while this
        // process holds its pin, so the epoch read now covers every purge.
        let epoch = h.epoch.load(Acquire);
        // Always record the epoch seen, even when the word itself says purged.
        let missed = epoch != slot.seen_epoch.swap(epoch, Relaxed);
        let lost = found == Found::Purged || missed;
        let mut purged = 0;
        if lost {
            stats::count_purge_seen();
            purged = pages;
            if slot.sigbus() {
                // Pinned memory never signals: the holes read zero from now on. Pages a
                // handler placed with `fill` are not holes: they count as intact.
                purged = crate::sigbus::zero_fill(start, len).unwrap_or(pages);
            }
        }
        return Unmarked {
            pages,
            volatile: pages,
            purged,
        };
    }
    match slot.state().unmark(false) {
        Found::Pinned => pinned,
        Found::Intact => {
            stats::volatile_sub(idx, len);
            Unmarked {
                pages,
                volatile: pages,
                purged: 0,
            }
        }
        Found::Purged => {
            stats::count_purge_seen();
            let purged = if slot.sigbus() {
                // Pinned memory never signals: purged pages read zero from now on. Pages a
                // handler placed with `fill` are not holes: they count as intact.
                crate::sigbus::zero_fill(start, len).unwrap_or(pages)
            } else {
                pages
            };
            Unmarked {
                pages,
                volatile: pages,
                purged,
            }
        }
        Found::Armed => {
            let armed = slot.armed.swap(0, Relaxed);
            let proof = match Span::new(start, armed) {
                // SAFETY: the armed prefix lies inside this private region, which stays mapped
                // while the range is BUSY (freeing claims it first).
                Ok(s) => unsafe { lazy::unmark_span(s) },
                Err(_) => Unmarked::default(),
            };
            slot.state().finish_unmark();
            stats::volatile_sub(idx, len);
            if proof.purged > 0 {
                stats::count_purge_seen();
            }
            Unmarked {
                pages,
                volatile: pages,
                purged: proof.purged,
            }
        }
    }
}

/// Whether the reclaimer purged any range of `span` (a word in `PURGING` or `PURGED`). Reads
/// only: no range changes state, so a volatile range keeps its age.
pub(crate) fn is_purged(span: Span) -> Result<bool, Error> {
    let mut purged = false;
    for_each_range(first_of(span)?, span, |_, slot| {
        purged |= matches!(
            state::tag(slot.state().load()),
            state::PURGING | state::PURGED
        );
        Ok(())
    })?;
    Ok(purged)
}

/// Purges every volatile range of `span` now, as the reclaimer would. Returns (ranges, bytes).
/// The caller holds the purge lock ([`pause`]).
pub(crate) fn purge_span(span: Span) -> Result<(u64, u64), Error> {
    let first = first_of(span)?;
    if first.1.policy() == Policy::Lazy {
        return Err(Error::Unsupported);
    }
    let (mut ranges, mut bytes) = (0, 0);
    for_each_range(first, span, |idx, slot| {
        let word = slot.state().load();
        if purgeable(slot, word) {
            if let Some(n) = purge(idx, slot, word) {
                ranges += 1;
                bytes += n as u64;
            }
        }
        Ok(())
    })?;
    Ok((ranges, bytes))
}

/// Sets the reclaim class of every range of `span`.
pub(crate) fn set_priority(span: Span, priority: Priority) -> Result<(), Error> {
    set_priority_in(first_of(span)?, span, priority)
}

/// [`set_priority`] with the range holding the span's first page already found.
pub(crate) fn set_priority_in(first: First, span: Span, priority: Priority) -> Result<(), Error> {
    for_each_range(first, span, |_, slot| {
        slot.set_priority(priority);
        Ok(())
    })
}

/// The descriptor of the shared region holding `addr`.
pub(crate) fn shared_fd(addr: usize) -> Option<BorrowedFd<'static>> {
    let (_, slot) = registry::owner_of(addr)?;
    // SAFETY: the slot owns the descriptor until the region is freed; the caller's borrow must
    // not outlive the region (documented on the public functions).
    let fd = unsafe { slot.fd.load(Relaxed).as_ref() }?.get()?;
    // SAFETY: verified just now; lives as long as the region, as above.
    Some(unsafe { BorrowedFd::borrow_raw(fd.as_raw_fd()) })
}

/// Frees a region: `start` and `len` must name it exactly (`len` rounded up to a page).
///
/// # Safety
/// Nothing may use the region afterwards.
pub(crate) unsafe fn free(start: usize, len: usize) -> Result<(), Error> {
    let span = Span::new(start, len)?;
    let (_, first) = registry::owner_of(span.start).ok_or(Error::NotRegion)?;
    let (rs, rl) = (
        first.region_start.load(Relaxed),
        first.region_len.load(Relaxed),
    );
    if rs != span.start || rl != span.len() {
        return Err(Error::NotRegion);
    }
    let lazy = first.policy() == Policy::Lazy;
    // A shared header must not be unmapped while this process's reclaimer is purging through it.
    let _quiet = first.header().is_some().then(pause);
    let mut addr = rs;
    let mut mapping_owner = None;
    while addr < rs + rl {
        let (idx, slot) = registry::owner_of(addr).ok_or(Error::NotRegion)?;
        let (start, len) = slot.extent();
        if slot.header().is_some() {
            if slot.holding.load(Relaxed) {
                // Drop this process's pin so that the others' reclaimers may purge the range.
                slot.state().mark();
            }
        } else {
            // Waits out a purge or arming, and keeps the reclaimer off the range for good: the
            // slot is retired in BUSY and only a new generation can follow.
            let word = slot.state().claim();
            if counts_as_volatile(word) {
                stats::volatile_sub(idx, len);
            }
            let armed = slot.armed.swap(0, Relaxed);
            if armed > 0 {
                crate::shadow::forget(start, start + armed);
            }
        }
        addr = start + len;
        if start == rs {
            mapping_owner = Some(idx);
        } else {
            registry::free_slot(idx);
        }
    }
    if lazy {
        crate::shadow::forget(rs, rs + rl);
    }
    registry::clear_owner(rs, rs + rl);
    if let Some(idx) = mapping_owner {
        let slot = registry::slot(idx);
        // SAFETY: the caller gives up the region; every range was claimed and retired.
        unsafe { release_mapping(slot, rs, rl) };
        registry::free_slot(idx);
    }
    Ok(())
}

/// Shared regions mapped by this process.
static SHARED_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether this process maps any shared region (whose volatile bytes the private gauge of
/// `stats::volatile_resident` does not count).
pub(crate) fn maps_shared() -> bool {
    SHARED_LIVE.load(Relaxed) != 0
}

/// Purges one range if it is still exactly as the reclaimer saw it (`seen`); the caller holds
/// the purge lock ([`pause`]). Returns the bytes purged; `None` if the range changed or was
/// freed, or if a shared range's hole could not be punched: it then stays volatile and intact,
/// and is not counted as freed.
pub(crate) fn purge(idx: u32, slot: &Slot, seen: u64) -> Option<usize> {
    let len = take(idx, slot, seen)?;
    stats::count_purged(len);
    Some(len)
}

/// Settles an armed range the kernel has emptied already (every page discarded): it becomes
/// PURGED as [`purge`] would make it, but its bytes are the kernel's purge, not this process's,
/// so they are not counted as purged here (they are not attributed to any pressure source).
pub(crate) fn settle(idx: u32, slot: &Slot, seen: u64) -> Option<usize> {
    take(idx, slot, seen)
}

/// [`purge`] without the count.
fn take(idx: u32, slot: &Slot, seen: u64) -> Option<usize> {
    // A range freed since the snapshot: a shared one's header is unmapped (its slot's word is
    // not the one seen), a private one's word is claimed. The caller holds the purge lock, so a
    // live shared range stays mapped until this returns.
    if !slot.is_live() {
        return None;
    }
    if let Some(h) = slot.header() {
        let mut len = 0;
        let purged = h.purge(seen, || {
            // The extent is stable once the range is PURGING: splitting and freeing claim the
            // range first.
            let (start, n) = slot.extent();
            len = n;
            // SAFETY: the range is PURGING, and the region stays mapped (freeing claims the
            // range first).
            unsafe { shared::punch(start, n) }
        });
        if !purged {
            return None;
        }
        return Some(len);
    }
    if !slot.state().begin_purge(seen) {
        return None;
    }
    // The extent is stable from here: splitting and freeing claim the range first.
    let (start, len) = slot.extent();
    // SAFETY: the range is PURGING: its owner neither uses it nor can until it is PURGED, and
    // the region stays mapped (freeing claims the range first).
    if unsafe { mem::purge_forced(start as *mut u8, len) }.is_ok() {
        give_back_tables(slot, start, len);
    }
    let armed = slot.armed.swap(0, Relaxed);
    if armed > 0 {
        crate::shadow::forget(start, start + armed);
    }
    slot.state().finish_purge();
    stats::volatile_sub(idx, len);
    Some(len)
}

/// Frees the page tables of the whole 2 MiB blocks of a range just purged, on kernels whose
/// MADV_DONTNEED keeps them (before PT_RECLAIM: Linux 6.1 keeps ~2 KiB of tables per MiB ever
/// touched, 100 MiB after 50 GiB), by replacing those blocks with a fresh mapping
/// (`mem::purge_remap`). Only where the range's THP advice is known (the fresh mapping must
/// get the same, or it would not merge back and could get huge pages its owner refused) and
/// no userfaultfd registration would be lost (SIGBUS mode). The caller holds the range PURGING.
fn give_back_tables(slot: &Slot, start: usize, len: usize) {
    let Some(huge) = slot.thp_advice() else {
        return;
    };
    let lo = start.next_multiple_of(mem::HUGE_PAGE);
    let hi = (start + len) & !(mem::HUGE_PAGE - 1);
    if hi <= lo || slot.sigbus() || vrange_sys::probe::frees_page_tables() {
        return;
    }
    // SAFETY: whole blocks of the PURGING range (private anonymous memory the library or the
    // client mapped with `map_anon`), not registered with userfaultfd; their content is gone.
    let _ = unsafe { mem::purge_remap(lo as *mut u8, hi - lo, huge) };
}

/// Bytes handed to the kernel path per step of arming; an unmark waits at most one step.
const ARM_STEP: usize = mem::HUGE_PAGE;

/// Hands a hybrid range that is still as the reclaimer saw it to the kernel's lazy-free path,
/// a block at a time, stopping early if an unmark asks. Returns the bytes armed.
/// Armings begun and armings finished ([`arm`]): one is in progress while they differ. An
/// explicit purge reads both around its snapshot of candidates, which cannot see a range
/// mid-arming (see `reclaim::purge`).
pub(crate) static ARMS_BEGUN: AtomicU64 = AtomicU64::new(0);
pub(crate) static ARMS_DONE: AtomicU64 = AtomicU64::new(0);

pub(crate) fn arm(slot: &Slot, seen: u64) -> usize {
    if !slot.state().begin_arm(seen) {
        return 0;
    }
    ARMS_BEGUN.fetch_add(1, SeqCst);
    let done = arm_begun(slot);
    ARMS_DONE.fetch_add(1, SeqCst);
    done
}

/// The arming of a range whose state is ARMING.
fn arm_begun(slot: &Slot) -> usize {
    let (start, len) = slot.extent();
    let mut done = 0;
    while done < len && !slot.state().arm_cancelled() {
        let step = ARM_STEP.min(len - done);
        let Ok(span) = Span::new(start + done, step) else {
            break;
        };
        // SAFETY: the span lies inside this private region, which stays mapped while the range
        // is ARMING; its owner does not touch it (it is volatile).
        if unsafe { lazy::mark_span(span) }.is_err() {
            // Refused (locked memory): keep what was armed; the rest stays managed.
            break;
        }
        done += step;
        slot.armed.store(done, Release);
    }
    slot.state().finish_arm();
    done
}

/// Whether a hybrid range should be armed at `now` given the arm delay.
pub(crate) fn due_for_arming(slot: &Slot, word: u64, now: u64, delay_ns: u64) -> bool {
    slot.policy() == Policy::Hybrid
        && slot.header().is_none()
        && state::tag(word) == state::VOLATILE
        && now.saturating_sub(slot.last_used()) >= delay_ns
}

/// Bytes of the range handed to the kernel's lazy-free path, if its `word` says it is armed (or
/// being armed): what the kernel can take of it by itself.
pub(crate) fn armed_bytes(slot: &Slot, word: u64) -> usize {
    match state::tag(word) {
        state::ARMING | state::ARMED => slot.armed.load(Relaxed),
        _ => 0,
    }
}

/// [`armed_bytes`], less the pages the kernel has discarded since (one mincore(2)). A stale
/// `word` reads at worst a range that has changed since: its count is a guess either way, and
/// the next look corrects it.
pub(crate) fn armed_resident(slot: &Slot, word: u64) -> usize {
    let armed = armed_bytes(slot, word);
    if armed == 0 {
        return 0;
    }
    let start = slot.start.load(Acquire);
    // A range being freed is claimed (BUSY) first, so an armed word's range is mapped here
    // unless it changed since the word was read; mincore of a hole fails (ENOMEM), counted 0.
    mem::resident_pages(start as *mut u8, armed).map_or(0, |n| n * mem::page_size())
}

/// Whether `idx`'s range is managed memory whose `seen` word makes it a purge candidate.
pub(crate) fn purgeable(slot: &Slot, word: u64) -> bool {
    slot.policy() != Policy::Lazy && state::is_purgeable(word)
}
