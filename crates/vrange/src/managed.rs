//! Library-owned regions and the operations on their ranges: creation and freeing, mark and
//! unmark following the region's policy, splitting a range when a call covers part of it, and
//! the two reclaimer actions (purge, arm).
//!
//! Marking and unmarking a managed or hybrid range is one compare-and-swap on its state word
//! plus a clock read: no system call, no page walk, whatever the size. A call that covers part
//! of a range splits it first, once (cost proportional to the pages split off, for the owner
//! map); later calls on the pieces are O(1) again.
//!
//! A shared region is one range in each process that maps it and is never split: its pages'
//! states live in its file (`crate::shared`), and a call on any page-aligned part of it pins
//! or unpins those pages for this mapping's holder number, one compare-and-swap per page.

use crate::lazy;
use crate::registry::{self, pause, Policy, Priority, Slot, PURGES};
use crate::shared::{self, Table};
use crate::span::Span;
use crate::state::{self, Found, Marked};
use crate::stats;
use crate::{Error, Huge, Unmarked};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use vrange_sys::pid::{self, Identity};
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
    let m = shared::create(len, &pid::identity())?;
    let (header, data, fd) = m.into_parts();
    let start = data as usize;
    slot.init(Policy::Managed, opts.priority, start, len);
    slot.header.store(header, Release);
    count_shared(len, true);
    slot.fd.store(fd, Relaxed);
    // The creator is holder 0, pinning every page.
    slot.holder.store(1, Relaxed);
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
/// mapping claims a holder number but holds no pin: unmark it before use.
pub(crate) fn open_shared(
    fd: BorrowedFd<'_>,
    priority: Priority,
    sigbus: bool,
) -> Result<(usize, usize), Error> {
    let m = shared::open(fd)?;
    let (len, total) = (m.len, m.total);
    let me = pid::identity();
    // Every number taken: holders that died and are not reaped yet give theirs back first.
    let claimed = match m.header().claim(&me) {
        Err(Error::Os(libc::EUSERS)) if m.header().reap_gone(&me, clock::now_ns()) > 0 => {
            m.header().claim(&me)
        }
        claimed => claimed,
    };
    let new = match claimed.and_then(|h| Ok((h, registry::alloc_slot()?))) {
        Ok(s) => s,
        Err(e) => {
            if let Ok(h) = claimed {
                m.header().release(h, clock::now_ns());
            }
            // SAFETY: the mapping was just created and never handed out.
            unsafe { mem::unmap(m.base, total) };
            return Err(e);
        }
    };
    let (h, new) = new;
    let slot = new.slot();
    let (header, data, fd) = m.into_parts();
    let start = data as usize;
    slot.init(Policy::Managed, priority, start, len);
    slot.header.store(header, Release);
    count_shared(len, true);
    slot.fd.store(fd, Relaxed);
    slot.holder.store(h + 1, Relaxed);
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
    let header = slot.header.load(Acquire);
    if header.is_null() {
        let base = std::ptr::NonNull::new(start as *mut u8).expect("region start");
        // SAFETY: the caller gives up the region, which this module mapped.
        unsafe { mem::unmap(base, len) };
    } else {
        count_shared(len, false);
        release_holder(slot);
        // No slot points into the mapping once it is gone (see `registry::Slot::header`).
        slot.header.store(std::ptr::null_mut(), Release);
        let base = std::ptr::NonNull::new(header.cast::<u8>()).expect("header");
        // SAFETY: as above; the shared mapping is the header and table, then the data.
        unsafe { mem::unmap(base, start - header as usize + len) };
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
    if let Some(h) = first.1.header() {
        // A mapping that never pinned (no holder number yet) has no pin to drop.
        if let Some(holder) = held_as(first.1) {
            let (at, n) = pages_of(first.1, span);
            h.unpin(holder, at, n, now);
        }
        return Ok(());
    }
    for_each_range(first, span, |idx, slot| {
        mark_range(idx, slot, now);
        Ok(())
    })
}

fn mark_range(idx: u32, slot: &Slot, now: u64) {
    let previous = slot.last_used();
    slot.touch(now);
    if slot.state().mark() == Marked::Now {
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
    if first.1.header().is_some() {
        return unmark_shared(first.1, span);
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

/// The pages of `span` in the shared region of `slot` (never split: the slot is the region):
/// (first page index, pages).
fn pages_of(slot: &Slot, span: Span) -> (usize, usize) {
    let page = mem::page_size();
    let (start, _) = slot.extent();
    ((span.start - start) / page, span.len() / page)
}

/// The holder number this mapping of a shared region pins pages as, if it has one.
fn held_as(slot: &Slot) -> Option<u32> {
    slot.holder.load(Acquire).checked_sub(1)
}

/// The holder number of this mapping, claimed now if it has none (a fork child's inherited
/// mapping, whose parent's number is the parent's). Async-signal-safe.
fn holder(slot: &Slot) -> Result<(u32, Table<'_>), Error> {
    let h = slot.header().ok_or(Error::NotRegion)?;
    if let Some(n) = held_as(slot) {
        return Ok((n, h));
    }
    let mine = h.claim(&pid::identity())?;
    match slot.holder.compare_exchange(0, mine + 1, AcqRel, Acquire) {
        Ok(_) => Ok((mine, h)),
        Err(theirs) => {
            // Another thread of this process claimed one first: give this one back.
            h.release(mine, clock::now_ns());
            Ok((theirs - 1, h))
        }
    }
}

/// Drops every pin of this mapping of a shared region and frees its holder number (the
/// region being freed). The caller holds the purge lock or owns the region.
fn release_holder(slot: &Slot) {
    let (Some(h), Some(n)) = (slot.header(), held_as(slot)) else {
        return;
    };
    slot.holder.store(0, Relaxed);
    h.release(n, clock::now_ns());
}

/// Pins `span` of a shared region for this mapping and reports, page by page, what it had not
/// pinned (volatile) and what of that was purged since it last held it.
fn unmark_shared(slot: &Slot, span: Span) -> Result<Unmarked, Error> {
    let (h, header) = holder(slot)?;
    let (first, n) = pages_of(slot, span);
    let page = mem::page_size();
    let (start, _) = slot.extent();
    let sigbus = slot.sigbus();
    let mut holes = 0;
    let found = header.pin(h, first, n, |at, pages| {
        if sigbus {
            // Pinned memory never signals: the holes read zero from now on. Pages a handler
            // placed with `fill` are not holes: they count as intact.
            holes += crate::sigbus::zero_fill(start + at * page, pages * page).unwrap_or(pages);
        }
    });
    if found.purged > 0 {
        stats::count_purge_seen();
    }
    Ok(Unmarked {
        pages: n,
        volatile: found.volatile,
        purged: if sigbus { holes } else { found.purged },
    })
}

fn unmark_range(idx: u32, slot: &Slot) -> Unmarked {
    let (start, len) = slot.extent();
    let pages = len / mem::page_size();
    let pinned = Unmarked {
        pages,
        ..Unmarked::default()
    };
    match slot.state().unmark() {
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
    let first = first_of(span)?;
    if let Some(h) = first.1.header() {
        let (at, n) = pages_of(first.1, span);
        return Ok(h.census(None, at, n).purged > 0);
    }
    let mut purged = false;
    for_each_range(first, span, |_, slot| {
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
    if first.1.header().is_some() {
        let (at, n) = pages_of(first.1, span);
        let bytes = purge_shared(first.1, at, n, None).unwrap_or(0);
        return Ok((u64::from(bytes > 0), bytes as u64));
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
    if first.1.header().is_some() {
        // One class per mapping: it orders the region's pages among this process's memory.
        if first.1.extent() != (span.start, span.len()) {
            return Err(Error::Partial);
        }
        first.1.set_priority(priority);
        return Ok(());
    }
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
            // This mapping's pins go (others' reclaimers may purge what it alone pinned), and
            // its holder number with them.
            release_holder(slot);
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

/// Shared regions mapped by this process, and their pages.
static SHARED_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static SHARED_PAGES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn count_shared(len: usize, more: bool) {
    let pages = len / mem::page_size();
    if more {
        SHARED_LIVE.fetch_add(1, Relaxed);
        SHARED_PAGES.fetch_add(pages, Relaxed);
    } else {
        SHARED_LIVE.fetch_sub(1, Relaxed);
        SHARED_PAGES.fetch_sub(pages, Relaxed);
    }
}

/// Whether this process maps any shared region (whose volatile bytes the private gauge of
/// `stats::volatile_resident` does not count).
pub(crate) fn maps_shared() -> bool {
    SHARED_LIVE.load(Relaxed) != 0
}

/// Pages of the shared regions this process maps: a bound on their purge candidates (runs of
/// volatile pages).
pub(crate) fn shared_pages() -> usize {
    SHARED_PAGES.load(Relaxed)
}

/// Volatile bytes of the shared regions this process maps (pages no mapping pins, resident):
/// what its reclaimer could purge there. One pass over their page tables, under the purge
/// lock; for pressure events and the like, not every tick.
pub(crate) fn shared_volatile_bytes() -> u64 {
    if !maps_shared() {
        return 0;
    }
    let page = mem::page_size() as u64;
    let mut bytes = 0;
    let p = pause();
    registry::for_each_live(|_, slot| {
        if let Some(h) = slot.header() {
            bytes += h.census(None, 0, h.pages().len()).volatile * page;
        }
    });
    drop(p);
    bytes
}

/// Distinct holders of other processes looked at per call of [`reap_dead`].
const REAP_AT_ONCE: usize = 64;

/// Releases the pins of every holder of the shared regions this process maps whose process is
/// certainly gone (`vrange_sys::pid::is_gone`), so that the next purge may take what only they
/// pinned. Reads `/proc` and allocates, outside the purge lock (looking and releasing take it
/// briefly); at most [`REAP_AT_ONCE`] distinct processes are judged per call. For the
/// reclaimer's tick. Returns the holders released.
pub(crate) fn reap_dead() -> usize {
    if !maps_shared() {
        return 0;
    }
    let me = pid::identity();
    let mut others = [Identity::default(); REAP_AT_ONCE];
    let mut n = 0;
    let p = pause();
    registry::for_each_live(|_, slot| {
        if let Some(h) = slot.header() {
            n = h.others(&me, &mut others, n);
        }
    });
    drop(p);
    let mut dead = [Identity::default(); REAP_AT_ONCE];
    let mut d = 0;
    for who in &others[..n] {
        if pid::is_gone(who) {
            dead[d] = *who;
            d += 1;
        }
    }
    if d == 0 {
        return 0;
    }
    let now = clock::now_ns();
    let mut released = 0;
    let p = pause();
    registry::for_each_live(|_, slot| {
        if let Some(h) = slot.header() {
            released += h.reap(&dead[..d], &me, now);
        }
    });
    drop(p);
    stats::count_holders_released(released);
    released
}

/// How long the region holding `addr` has been volatile, if every page of it is (a shared
/// region: since its most recently used page became volatile).
pub(crate) fn idle(addr: usize, now: u64) -> Option<u64> {
    let (_, slot) = registry::owner_of(addr)?;
    let Some(h) = slot.header() else {
        let word = slot.state().load();
        return state::is_purgeable(word).then(|| now.saturating_sub(slot.last_used()));
    };
    let (at, n) = pages_of(slot, Span::new(slot.extent().0, slot.extent().1).ok()?);
    let pages = &h.pages()[at..at + n];
    if pages
        .iter()
        .any(|p| state::tag(p.load()) != state::VOLATILE)
    {
        return None;
    }
    let newest = pages.iter().map(|p| p.used()).max()?;
    Some(now.saturating_sub(newest))
}

/// Purges the pages `[first, first + n)` of the shared region of `slot` that are still
/// volatile (and last used at `used`, if given: the age the purger chose them by), for every
/// process mapping it; the caller holds the purge lock ([`pause`]). Returns the bytes purged;
/// `None` if none was (all pinned or used since, the region freed, or the hole refused: those
/// pages stay volatile and intact, and are not counted as freed).
pub(crate) fn purge_shared(
    slot: &Slot,
    first: usize,
    n: usize,
    used: Option<u64>,
) -> Option<usize> {
    // A region freed since the snapshot has its header unmapped; the caller holds the purge
    // lock, so a live one stays mapped until this returns.
    if !slot.is_live() {
        return None;
    }
    let h = slot.header()?;
    let page = mem::page_size();
    // The extent of a shared region never changes.
    let (start, _) = slot.extent();
    let pages = h.purge_run(first, n, used, |at, k| {
        // SAFETY: the pages are PURGING, and the region stays mapped (freeing it takes the
        // purge lock).
        unsafe { shared::punch(start + at * page, k * page) }
    });
    let bytes = pages * page;
    if bytes == 0 {
        return None;
    }
    stats::count_purged(bytes);
    Some(bytes)
}

/// Purges one private range if it is still exactly as the reclaimer saw it (`seen`); the
/// caller holds the purge lock ([`pause`]). Returns the bytes purged; `None` if the range
/// changed or was freed.
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
    // A range freed since the snapshot: its word is claimed.
    if !slot.is_live() {
        return None;
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
