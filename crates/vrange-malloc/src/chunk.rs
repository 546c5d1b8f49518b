//! One 2 MiB chunk: its spans, kept as boundary tags (a word at the first and the last page of
//! every span), and the span operations: best-fit allocation from the tail of a free span,
//! freeing with coalescing, shrinking in place.
//!
//! Free spans are volatile ranges. This file decides which range operation each span change
//! needs and leaves the operations to a [`Ranges`] backend: the real one registers them with
//! vrange's reclaimer, a fake one checks the calls in tests. The metadata lives outside the
//! chunk: free memory may be purged at any time, so nothing is ever stored in it.
//!
//! Callers hold the lock of the arena that owns the chunk; only the tags are read without it
//! (`usable_size` of a live block, whose tags no other operation changes).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use vrange::{Content, Policy, Taken};

/// Bytes per chunk: one PMD, so that a fully free chunk purged whole frees its page table.
pub const CHUNK: usize = 2 << 20;
/// Pages per chunk at the smallest supported page size (4 KiB).
pub const MAX_PAGES: usize = CHUNK / 4096;

const LEN_MASK: u64 = 0xFFFF;
const FREE: u64 = 1 << 16;
const START: u64 = 1 << 17;
const END: u64 = 1 << 18;
/// On a live block's first tag: the block sits in a CPU's cache (see `cache`), freed by the
/// program but not yet by the allocator.
const CACHED: u64 = 1 << 19;
const RANGE_SHIFT: u32 = 32;

/// The volatile-range operations free spans need (see `vrange::OwnedRange`). Ids are non-zero;
/// 0 means "no range" (lazy mode, or registration failed: the span is free but not volatile),
/// and every operation on id 0 must be a no-op.
pub trait Ranges {
    /// Registers a free span.
    fn create(&mut self, start: usize, len: usize, content: Content, policy: Policy) -> u32;
    /// Takes a whole free span back.
    fn take(&mut self, id: u32) -> Taken;
    /// Takes the last `len` bytes back.
    fn take_tail(&mut self, id: u32, len: usize) -> Taken;
    /// Grows a range over adjacent freed bytes.
    fn grow(&mut self, id: u32, start: usize, len: usize);
    /// Grows `id` over `other`, adjacent to it.
    fn absorb(&mut self, id: u32, other: u32);
    /// Changes a range's policy.
    fn set_policy(&mut self, id: u32, policy: Policy);
    /// The freed bytes of `[start, start + len)` are given up (lazy mode advises them here).
    fn freed(&mut self, start: usize, len: usize);
    /// The policy a free span of `pages` pages gets in this chunk.
    fn policy(&self, pages: usize, whole_chunk: bool) -> Policy;
}

/// A chunk's metadata. Lives in the metadata arena, never inside the chunk.
#[repr(C, align(64))]
pub struct Chunk {
    /// First byte of the chunk (2 MiB-aligned).
    pub base: usize,
    /// The arena that owns it.
    pub arena: u32,
    /// Pages in the chunk.
    pub pages: u32,
    /// log2 of the page size.
    pub page_shift: u32,
    /// Pages free.
    pub free_pages: u32,
    /// The largest free span, in pages.
    pub max_free: u32,
    /// The arena list the chunk is on (by `max_free`).
    pub class: u32,
    /// Links of that list.
    pub next: *mut Chunk,
    pub prev: *mut Chunk,
    tags: [AtomicU64; MAX_PAGES],
}

/// One span as its first tag describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub first: usize,
    pub pages: usize,
    pub free: bool,
    pub range: u32,
}

/// Where a freed block ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freed {
    /// Pages the block had.
    pub pages: usize,
    /// The free span it is now part of.
    pub span: Span,
}

impl Chunk {
    /// Sets up the metadata of a fresh chunk at `base` (never touched: one free span, zero).
    pub fn init(&mut self, base: usize, page_shift: u32, arena: u32, ranges: &mut impl Ranges) {
        let pages = (CHUNK >> page_shift) as u32;
        self.base = base;
        self.arena = arena;
        self.pages = pages;
        self.page_shift = page_shift;
        self.next = std::ptr::null_mut();
        self.prev = std::ptr::null_mut();
        let policy = ranges.policy(pages as usize, true);
        let id = ranges.create(base, CHUNK, Content::Zero, policy);
        self.set(0, pages as usize, true, id);
        self.free_pages = pages;
        self.max_free = pages;
    }

    fn page_addr(&self, page: usize) -> usize {
        self.base + (page << self.page_shift)
    }

    /// The page index of `addr` inside the chunk.
    pub fn page_of(&self, addr: usize) -> usize {
        (addr - self.base) >> self.page_shift
    }

    fn tag(&self, page: usize) -> u64 {
        self.tags[page].load(Relaxed)
    }

    fn set(&self, first: usize, pages: usize, free: bool, range: u32) {
        let flag = if free { FREE } else { 0 };
        let last = first + pages - 1;
        let head = pages as u64 | flag | START | (u64::from(range) << RANGE_SHIFT);
        if last == first {
            self.tags[first].store(head | END, Relaxed);
        } else {
            self.tags[first].store(head, Relaxed);
            self.tags[last].store(pages as u64 | flag | END, Relaxed);
        }
    }

    fn clear(&self, page: usize) {
        self.tags[page].store(0, Relaxed);
    }

    /// The span starting at `first` (which must be a span start).
    pub fn span(&self, first: usize) -> Span {
        let t = self.tag(first);
        debug_assert!(t & START != 0, "span start");
        Span {
            first,
            pages: (t & LEN_MASK) as usize,
            free: t & FREE != 0,
            range: (t >> RANGE_SHIFT) as u32,
        }
    }

    /// The live block starting at `addr`, in pages, if `addr` starts an allocated span.
    /// Lock-free for a live block (its tags change only when it is freed or resized).
    pub fn block_pages(&self, addr: usize) -> Option<usize> {
        if addr < self.base || addr >= self.base + CHUNK || addr & ((1 << self.page_shift) - 1) != 0
        {
            return None;
        }
        let t = self.tag(self.page_of(addr));
        (t & START != 0 && t & FREE == 0).then_some((t & LEN_MASK) as usize)
    }

    /// Marks the live block at `addr` cached. `false` if it already was: it is being freed a
    /// second time. A plain load and store, no locked instruction: a live block's first tag is
    /// written only by whoever holds the block (its owner freeing it, or the cache slot's
    /// claimant taking it back), and the cache slot's compare-and-swap orders those hand-overs.
    /// Two threads freeing the same block at the same instant may both pass, as with glibc.
    pub fn mark_cached(&self, addr: usize) -> bool {
        let tag = &self.tags[self.page_of(addr)];
        let t = tag.load(Relaxed);
        tag.store(t | CACHED, Relaxed);
        t & CACHED == 0
    }

    /// Clears the cached mark of the live block at `addr` (its holder only, as above).
    pub fn clear_cached(&self, addr: usize) {
        let tag = &self.tags[self.page_of(addr)];
        tag.store(tag.load(Relaxed) & !CACHED, Relaxed);
    }

    /// Calls `f` on every span in address order.
    pub fn for_each_span(&self, mut f: impl FnMut(Span)) {
        let mut p = 0;
        while p < self.pages as usize {
            let s = self.span(p);
            f(s);
            p += s.pages;
        }
    }

    /// Recomputes `free_pages` and `max_free`.
    fn recount(&mut self) {
        let (mut free, mut max) = (0, 0);
        self.for_each_span(|s| {
            if s.free {
                free += s.pages;
                max = max.max(s.pages);
            }
        });
        self.free_pages = free as u32;
        self.max_free = max as u32;
    }

    /// The best-fitting free span for `pages` pages starting at a multiple of `align_pages`
    /// (placed at the span's tail), and that start.
    fn fit(&self, pages: usize, align_pages: usize) -> Option<(Span, usize)> {
        let mut best: Option<(Span, usize)> = None;
        self.for_each_span(|s| {
            if !s.free || s.pages < pages || best.is_some_and(|(b, _)| b.pages <= s.pages) {
                return;
            }
            let at = (s.first + s.pages - pages) & !(align_pages - 1);
            if at >= s.first {
                best = Some((s, at));
            }
        });
        best
    }

    /// Allocates `pages` pages aligned to `align_pages` (a power of two). Returns the block's
    /// address and what its bytes hold.
    pub fn alloc(
        &mut self,
        pages: usize,
        align_pages: usize,
        ranges: &mut impl Ranges,
    ) -> Option<(usize, Taken)> {
        if (self.max_free as usize) < pages {
            return None;
        }
        let (s, at) = self.fit(pages, align_pages)?;
        let page = 1 << self.page_shift;
        let head = at - s.first;
        let tail = s.pages - head - pages;
        // The range keeps the head; the block and whatever follows it leave it.
        let taken = if head == 0 {
            ranges.take(s.range)
        } else {
            ranges.take_tail(s.range, (s.pages - head) * page)
        };
        if head > 0 {
            self.set(s.first, head, true, s.range);
            let policy = ranges.policy(head, false);
            ranges.set_policy(s.range, policy);
        }
        self.set(at, pages, false, 0);
        self.free_rest(at + pages, tail, taken.zero, ranges);
        self.recount();
        let taken = Taken {
            pages,
            purged: taken.purged.min(pages),
            zero: taken.zero,
        };
        Some((self.page_addr(at), taken))
    }

    /// Frees the block starting at page `first`, coalescing it with free neighbours.
    pub fn free(&mut self, first: usize, ranges: &mut impl Ranges) -> Freed {
        let block = self.span(first);
        debug_assert!(!block.free);
        let page = 1 << self.page_shift;
        ranges.freed(self.page_addr(first), block.pages * page);
        let left = (first > 0)
            .then(|| self.span_ending_at(first - 1))
            .filter(|s| s.free);
        let end = first + block.pages;
        let right = (end < self.pages as usize)
            .then(|| self.span(end))
            .filter(|s| s.free);
        let start = left.map_or(first, |l| l.first);
        let stop = right.map_or(end, |r| r.first + r.pages);
        let pages = stop - start;
        let (addr, len) = (self.page_addr(start), pages * page);
        let lid = left.map_or(0, |s| s.range);
        let rid = right.map_or(0, |s| s.range);
        let policy = ranges.policy(pages, pages == self.pages as usize);
        let id = match (lid, rid) {
            (0, 0) => ranges.create(addr, len, Content::Dirty, policy),
            (l, 0) | (0, l) => {
                ranges.grow(l, addr, len);
                l
            }
            (l, r) => {
                ranges.grow(l, addr, (end - start) * page);
                ranges.absorb(l, r);
                l
            }
        };
        if id != 0 {
            ranges.set_policy(id, policy);
        }
        // Boundaries that are now inside the merged span stop looking like span starts.
        if left.is_some() {
            self.clear(first);
            self.clear(first - 1);
        }
        if right.is_some() {
            self.clear(end - 1);
            self.clear(end);
        }
        self.set(start, pages, true, id);
        self.recount();
        Freed {
            pages: block.pages,
            span: self.span(start),
        }
    }

    /// Shrinks the block at `first` to `pages` pages, freeing the rest (coalesced).
    pub fn shrink(&mut self, first: usize, pages: usize, ranges: &mut impl Ranges) {
        let block = self.span(first);
        debug_assert!(!block.free && pages > 0 && pages < block.pages);
        self.set(first, pages, false, 0);
        self.set(first + pages, block.pages - pages, false, 0);
        self.free(first + pages, ranges);
    }

    /// Grows the block at `first` to `pages` pages in place, into the free span right after
    /// it: the head of that span leaves its range (taken whole, the rest registered again).
    /// `false`, nothing changed, when the next span is not free or too short.
    pub fn grow(&mut self, first: usize, pages: usize, ranges: &mut impl Ranges) -> bool {
        let block = self.span(first);
        debug_assert!(!block.free && pages > block.pages);
        let end = first + block.pages;
        if end >= self.pages as usize {
            return false;
        }
        let next = self.span(end);
        let more = pages - block.pages;
        if !next.free || next.pages < more {
            return false;
        }
        let taken = ranges.take(next.range);
        let rest = next.pages - more;
        self.clear(first + block.pages - 1);
        self.clear(end);
        self.clear(end + next.pages - 1);
        self.set(first, pages, false, 0);
        self.free_rest(first + pages, rest, taken.zero, ranges);
        self.recount();
        true
    }

    /// Whether the whole chunk is one free span.
    /// What an allocation left of the free span it took from: `pages` pages from `first`,
    /// a free range of their own (zero if the span was).
    fn free_rest(&mut self, first: usize, pages: usize, zero: bool, ranges: &mut impl Ranges) {
        if pages == 0 {
            return;
        }
        let content = if zero { Content::Zero } else { Content::Dirty };
        let policy = ranges.policy(pages, false);
        let len = pages << self.page_shift;
        let id = ranges.create(self.page_addr(first), len, content, policy);
        self.set(first, pages, true, id);
    }

    pub fn is_empty(&self) -> bool {
        self.free_pages == self.pages
    }

    fn span_ending_at(&self, last: usize) -> Span {
        let t = self.tag(last);
        debug_assert!(t & END != 0, "span end");
        let first = last + 1 - (t & LEN_MASK) as usize;
        self.span(first)
    }
}

#[cfg(test)]
mod tests {
    //! The span logic against a fake backend that checks every range call and keeps the
    //! registered extents, compared after each step with the free spans the tags describe.

    use super::*;
    use std::collections::BTreeMap;

    const BASE: usize = 64 * CHUNK;
    const PAGE: usize = 4096;

    #[derive(Default)]
    struct Fake {
        next: u32,
        /// id → (start, len, zero)
        live: BTreeMap<u32, (usize, usize, bool)>,
    }

    impl Ranges for Fake {
        fn create(&mut self, start: usize, len: usize, content: Content, _: Policy) -> u32 {
            self.next += 1;
            let zero = content == Content::Zero;
            self.live.insert(self.next, (start, len, zero));
            self.next
        }
        fn take(&mut self, id: u32) -> Taken {
            let (_, len, zero) = self.live.remove(&id).expect("take: live id");
            Taken {
                pages: len / PAGE,
                purged: if zero { len / PAGE } else { 0 },
                zero,
            }
        }
        fn take_tail(&mut self, id: u32, len: usize) -> Taken {
            let r = self.live.get_mut(&id).expect("take_tail: live id");
            assert!(len > 0 && len < r.1, "take_tail strictly inside");
            r.1 -= len;
            Taken {
                pages: len / PAGE,
                purged: if r.2 { len / PAGE } else { 0 },
                zero: r.2,
            }
        }
        fn grow(&mut self, id: u32, start: usize, len: usize) {
            let r = self.live.get_mut(&id).expect("grow: live id");
            assert!(start <= r.0 && r.0 + r.1 <= start + len, "grow contains");
            *r = (start, len, false);
        }
        fn absorb(&mut self, id: u32, other: u32) {
            let (os, ol, _) = self.live.remove(&other).expect("absorb: live other");
            let r = self.live.get_mut(&id).expect("absorb: live id");
            assert!(os == r.0 + r.1 || os + ol == r.0, "absorb adjacent");
            *r = (r.0.min(os), r.1 + ol, false);
        }
        fn set_policy(&mut self, id: u32, _: Policy) {
            assert!(self.live.contains_key(&id));
        }
        fn freed(&mut self, _: usize, _: usize) {}
        fn policy(&self, _: usize, _: bool) -> Policy {
            Policy::Hybrid
        }
    }

    fn chunk(fake: &mut Fake) -> Box<Chunk> {
        let layout = std::alloc::Layout::new::<Chunk>();
        // SAFETY: a zeroed Chunk is valid (integers, null pointers, atomics); the Box takes
        // ownership of memory allocated with the matching layout.
        let mut c = unsafe { Box::from_raw(std::alloc::alloc_zeroed(layout).cast::<Chunk>()) };
        c.init(BASE, 12, 0, fake);
        c
    }

    /// Free spans (as tags say) equal the registered extents; counts are right.
    fn check(c: &Chunk, fake: &Fake) {
        let mut spans = BTreeMap::new();
        let (mut free, mut max, mut total) = (0, 0, 0);
        c.for_each_span(|s| {
            total += s.pages;
            if s.free {
                free += s.pages;
                max = max.max(s.pages);
                spans.insert(s.range, (c.page_addr(s.first), s.pages * PAGE));
            }
        });
        assert_eq!(total, c.pages as usize);
        assert_eq!(free, c.free_pages as usize);
        assert_eq!(max, c.max_free as usize);
        let registered: BTreeMap<u32, (usize, usize)> =
            fake.live.iter().map(|(k, v)| (*k, (v.0, v.1))).collect();
        assert_eq!(spans, registered);
    }

    #[test]
    fn fresh_chunk_hands_out_zero_memory_from_its_tail() {
        let mut f = Fake::default();
        let mut c = chunk(&mut f);
        let (a, t) = c.alloc(16, 1, &mut f).unwrap();
        assert_eq!(a, BASE + CHUNK - 16 * PAGE);
        assert!(t.zero);
        check(&c, &f);
        let f2 = c.free(c.page_of(a), &mut f);
        assert_eq!(f2.pages, 16);
        assert!(c.is_empty());
        check(&c, &f);
        // Coalesced: one range over the whole chunk, no longer known zero.
        assert_eq!(f.live.len(), 1);
        let (_, t) = c.alloc(512, 1, &mut f).unwrap();
        assert!(!t.zero);
        assert_eq!(c.max_free, 0);
        check(&c, &f);
    }

    #[test]
    fn coalesces_both_sides_and_respects_alignment() {
        let mut f = Fake::default();
        let mut c = chunk(&mut f);
        let blocks: Vec<usize> = (0..8).map(|_| c.alloc(64, 1, &mut f).unwrap().0).collect();
        check(&c, &f);
        assert_eq!(c.free_pages, 0);
        for i in [1, 3, 2] {
            c.free(c.page_of(blocks[i]), &mut f);
            check(&c, &f);
        }
        assert_eq!(c.max_free, 192);
        let (a, _) = c.alloc(20, 32, &mut f).unwrap();
        assert_eq!((a - BASE) / PAGE % 32, 0);
        check(&c, &f);
        c.shrink(c.page_of(blocks[0]), 10, &mut f);
        check(&c, &f);
        assert_eq!(c.block_pages(blocks[0]), Some(10));
        assert_eq!(c.block_pages(blocks[0] + PAGE), None);
    }

    #[test]
    fn grows_in_place_into_a_free_neighbour_only() {
        let mut f = Fake::default();
        let mut c = chunk(&mut f);
        let a = c.alloc(16, 1, &mut f).unwrap().0;
        let b = c.alloc(16, 1, &mut f).unwrap().0;
        // b sits right before a (tails first): b cannot grow into the live a.
        assert_eq!(b + 16 * PAGE, a);
        assert!(!c.grow(c.page_of(b), 20, &mut f));
        check(&c, &f);
        // a is at the chunk's end: nothing after it.
        assert!(!c.grow(c.page_of(a), 20, &mut f));
        c.free(c.page_of(a), &mut f);
        check(&c, &f);
        // Now b grows over part of a's old span, then over all of it.
        assert!(c.grow(c.page_of(b), 20, &mut f));
        assert_eq!(c.block_pages(b), Some(20));
        check(&c, &f);
        assert!(c.grow(c.page_of(b), 32, &mut f));
        assert_eq!(c.block_pages(b), Some(32));
        check(&c, &f);
        assert!(!c.grow(c.page_of(b), 33, &mut f));
        c.free(c.page_of(b), &mut f);
        assert!(c.is_empty());
        check(&c, &f);
    }

    #[test]
    fn random_sequences_keep_tags_and_ranges_in_step() {
        let mut f = Fake::default();
        let mut c = chunk(&mut f);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pages = 1 + (x % 96) as usize;
            if x % 3 != 0 || live.is_empty() {
                let align = 1 << ((x >> 20) % 5);
                if let Some((a, _)) = c.alloc(pages, align, &mut f) {
                    assert_eq!((a - BASE) / PAGE % align, 0);
                    for &(b, n) in &live {
                        assert!(a + pages * PAGE <= b || b + n * PAGE <= a, "overlap");
                    }
                    live.push((a, pages));
                }
            } else {
                let (a, n) = live.swap_remove((x >> 8) as usize % live.len());
                if x % 11 == 0 {
                    let grown = n + 1 + (x >> 40) as usize % 8;
                    let ok = c.grow(c.page_of(a), grown, &mut f);
                    live.push((a, if ok { grown } else { n }));
                    assert_eq!(c.block_pages(a), Some(if ok { grown } else { n }));
                    for &(b, m) in &live[..live.len() - 1] {
                        assert!(a + grown * PAGE <= b || b + m * PAGE <= a || !ok, "overlap");
                    }
                } else if x % 7 == 0 && n > 1 {
                    c.shrink(c.page_of(a), n / 2, &mut f);
                    live.push((a, n / 2));
                } else {
                    c.free(c.page_of(a), &mut f);
                }
            }
            check(&c, &f);
        }
    }
}
