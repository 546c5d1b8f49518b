//! Shared volatile regions: memfd-backed, mappable by any process that receives the descriptor
//! (over a UNIX socket or by inheritance). Owns the file's layout (a header, the holders, a
//! table of pages, then the data) and the operations every process performs on it: claiming
//! and releasing a holder number, pinning and unpinning pages, purging runs of pages, and
//! releasing the pins of holders that died. Never decides which pages to purge: purgers choose
//! by the victim order (`crate::order`) and call [`Table::purge_run`].
//!
//! | part of the file | bytes | what |
//! |---|---|---|
//! | header | [`TABLE_OFFSET`] | magic, version, data length and offset, purges so far, [`HOLDERS`] holder records |
//! | page table | 24 per data page | one [`SharedPage`] per page: its state word (tag, the holders pinning it, generation), when it last became volatile, the holders that have not seen its last purge (`crate::state`) |
//! | (rounded up to a page) | | |
//! | data | the region's length | what the processes share |
//!
//! - **Holders.** Every mapping (in every process) that pins pages claims a holder number: a
//!   record of its process's pid, start time and pid namespace (`vrange_sys::pid::Identity`)
//!   in the header. A page pinned by any holder is never purged; one no holder pins may be
//!   purged by any process's reclaimer, or by a coordinator that holds the descriptor (a hole
//!   punched in the file frees it for every process).
//! - **Per page, not per block.** Pin, unpin, purge and a dead holder's release each change a
//!   page with one compare-and-swap of its word, with nothing else to keep consistent: a block
//!   of pages would need each holder's own count of the pages it pins in the block, which no
//!   single atomic operation can change together with the block's word. The cost is one atomic
//!   operation per page of a call (a 4 MiB range: 1024) and 24 bytes of table per page (0.6 %).
//! - **Exact reports.** A purge sets every holder's lost bit of the page before the page
//!   leaves `PURGING`; a holder's pin clears its own, so every holder that had unpinned the page
//!   learns of the purge at its next pin, page by page, even if another holder pinned and
//!   refilled it first.
//! - **Pins that die with their holder.** A holder whose process is certainly gone (no such
//!   pid, a zombie, or a pid reused by a process that started at another time, in the same pid
//!   namespace: `vrange_sys::pid::is_gone`) has its pins released by the next process that
//!   looks ([`Table::reap`]: each reclaimer once per tick, and a coordinator holding the
//!   region), and its number freed. A holder that exec()s keeps its pins until it exits.
//!
//! Shared regions are always managed: MADV_FREE does not apply to shared memory, and on a
//! machine without swap the kernel cannot drop shmem pages by itself.

use crate::state::{self, PagePin, PageUnpin, SharedPage};
use crate::Error;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use vrange_sys::fd::{GuestFd, Inherit};
use vrange_sys::pid::Identity;
use vrange_sys::{mem, shm};

pub(crate) use crate::state::HOLDERS;

const MAGIC: u64 = u64::from_le_bytes(*b"VRANGESH");
/// 2: page ranges and holders (1 had one state word for the whole region).
const VERSION: u64 = 2;
const NAME: &std::ffi::CStr = c"vrange-shared";
/// Where the page table starts in the file.
const TABLE_OFFSET: usize = 1024;
const _: () = assert!(std::mem::size_of::<Header>() <= TABLE_OFFSET);
const _: () = assert!(std::mem::size_of::<SharedPage>() == 24);

/// A holder record's word: 0 free, else the state in the high half and the pid in the low.
const LIVE: u64 = 1 << 32;
/// Its pins are being released by the process whose pid is in the low half.
const REAPING: u64 = 2 << 32;
const STATE_MASK: u64 = !0 << 32;

/// One holder: who maps the region and may pin its pages.
#[repr(C)]
#[derive(Debug)]
struct Holder {
    word: AtomicU64,
    start_ticks: AtomicU64,
    pid_ns: AtomicU64,
}

impl Holder {
    /// Who the record names, if it is live.
    fn live(&self) -> Option<Identity> {
        let word = self.word.load(Acquire);
        (word & STATE_MASK == LIVE).then(|| Identity {
            pid: word as u32,
            start_ticks: self.start_ticks.load(Relaxed),
            pid_ns: self.pid_ns.load(Relaxed),
        })
    }
}

/// The start of a shared region's file. Every `&Header` points into a mapping of at least the
/// region's [`data_offset`] bytes ([`Mapping`], [`HeaderPage`]), so its page table is mapped
/// too.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Header {
    magic: AtomicU64,
    version: AtomicU64,
    data_len: AtomicU64,
    data_offset: AtomicU64,
    /// Runs of pages purged so far, by any process.
    pub epoch: AtomicU64,
    holders: [Holder; HOLDERS],
}

/// Bytes before the data of a region of `len` bytes: header and page table, rounded up to a
/// page.
fn data_offset(len: usize) -> Result<usize, Error> {
    let page = mem::page_size();
    let table = (len / page)
        .checked_mul(std::mem::size_of::<SharedPage>())
        .and_then(|t| t.checked_add(TABLE_OFFSET))
        .ok_or(Error::Overflow)?;
    table.checked_next_multiple_of(page).ok_or(Error::Overflow)
}

/// Pages of a run, in a census.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Census {
    /// Pinned by some holder.
    pub pinned: u64,
    /// Pinned by the holder asked about (part of `pinned`).
    pub mine: u64,
    /// Volatile and resident.
    pub volatile: u64,
    /// Purged (or being purged).
    pub purged: u64,
}

/// What [`Table::pin`] found over a run of pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pinned {
    /// Pages the holder did not pin before.
    pub volatile: usize,
    /// Pages among them lost since the holder last held them.
    pub purged: usize,
}

impl Header {
    fn is_valid(&self, len: usize, total: usize) -> bool {
        let offset = data_offset(len).ok();
        self.magic.load(Acquire) == MAGIC
            && self.version.load(Acquire) == VERSION
            && self.data_len.load(Acquire) == len as u64
            && offset.is_some_and(|o| self.data_offset.load(Acquire) == o as u64)
            && offset.and_then(|o| o.checked_add(len)) == Some(total)
    }
}

/// A shared region's header with its page table, as long as this process found the region
/// when it mapped it. The length written in the file is any mapping process's to overwrite: it
/// is checked once, when the region is mapped ([`layout`], `Header::is_valid`), and never read
/// again, so that no writer can make another process (or a coordinator) read past its mapping.
#[derive(Clone, Copy)]
pub(crate) struct Table<'a> {
    header: &'a Header,
    pages: &'a [SharedPage],
}

impl std::ops::Deref for Table<'_> {
    type Target = Header;

    fn deref(&self) -> &Header {
        self.header
    }
}

impl<'a> Table<'a> {
    /// The header at `header` with the table of a region of `len` bytes.
    ///
    /// # Safety
    /// `header` lies at the start of a live mapping of at least `data_offset(len)` bytes of
    /// the region's file, which stays mapped for `'a`.
    pub unsafe fn new(header: &'a Header, len: usize) -> Table<'a> {
        let n = len / mem::page_size();
        // SAFETY: per the contract, the mapping holds the table at TABLE_OFFSET, 8-aligned,
        // `n` entries of atomics only, for `'a`.
        let pages = unsafe {
            std::slice::from_raw_parts(
                (header as *const Header)
                    .cast::<u8>()
                    .add(TABLE_OFFSET)
                    .cast::<SharedPage>(),
                n,
            )
        };
        Table { header, pages }
    }

    /// Bytes of data.
    pub fn len(&self) -> usize {
        self.pages.len() * mem::page_size()
    }

    /// The page table: one entry per data page.
    pub fn pages(&self) -> &'a [SharedPage] {
        self.pages
    }

    /// Claims a free holder number for `me`, with no pins and no lost page.
    ///
    /// # Errors
    /// `Error::Os(EUSERS)` when [`HOLDERS`] mappings hold numbers already.
    pub fn claim(&self, me: &Identity) -> Result<u32, Error> {
        for (h, holder) in self.holders.iter().enumerate() {
            if holder
                .word
                .compare_exchange(0, LIVE | u64::from(me.pid), AcqRel, Relaxed)
                .is_ok()
            {
                // Read with the word by reapers, which judge nothing from a zero namespace.
                holder.start_ticks.store(me.start_ticks, Relaxed);
                holder.pid_ns.store(me.pid_ns, Release);
                // A purge may have left this number's lost bits set since its last holder.
                for p in self.pages() {
                    p.forget(h as u32);
                }
                return Ok(h as u32);
            }
        }
        Err(Error::Os(libc::EUSERS))
    }

    /// Drops every pin of holder `h` (a mapping going away, or a holder that died: see
    /// [`Table::reap`]) and frees its number. Pages it was the last to pin become volatile,
    /// last used at `now`.
    pub fn release(&self, h: u32, now: u64) {
        let holder = &self.holders[h as usize];
        for p in self.pages() {
            p.unpin(h, now);
        }
        holder.start_ticks.store(0, Relaxed);
        holder.pid_ns.store(0, Relaxed);
        holder.word.store(0, Release);
    }

    /// Pins pages `[first, first + n)` for holder `h`.
    pub fn pin(
        &self,
        h: u32,
        first: usize,
        n: usize,
        mut lost: impl FnMut(usize, usize),
    ) -> Pinned {
        let mut out = Pinned::default();
        let mut run: Option<(usize, usize)> = None;
        for (i, p) in self.pages()[first..first + n].iter().enumerate() {
            let found = p.pin(h);
            if found != PagePin::Held {
                out.volatile += 1;
            }
            if found == PagePin::Purged {
                out.purged += 1;
                run = match run {
                    Some((at, len)) if at + len == first + i => Some((at, len + 1)),
                    Some((at, len)) => {
                        lost(at, len);
                        Some((first + i, 1))
                    }
                    None => Some((first + i, 1)),
                };
            }
        }
        if let Some((at, len)) = run {
            lost(at, len);
        }
        out
    }

    /// Unpins pages `[first, first + n)` for holder `h`, last used at `now`. Returns the pages
    /// that became volatile.
    pub fn unpin(&self, h: u32, first: usize, n: usize, now: u64) -> usize {
        self.pages()[first..first + n]
            .iter()
            .filter(|p| p.unpin(h, now) == PageUnpin::Now)
            .count()
    }

    /// Counts pages `[first, first + n)` by state (`mine`: those holder `h` pins).
    pub fn census(&self, h: Option<u32>, first: usize, n: usize) -> Census {
        let mut c = Census::default();
        for p in &self.pages()[first..first + n] {
            let word = p.load();
            match state::tag(word) {
                state::VOLATILE => c.volatile += 1,
                state::PURGING | state::PURGED => c.purged += 1,
                _ => {
                    c.pinned += 1;
                    if h.is_some_and(|h| p.is_held_by(h)) {
                        c.mine += 1;
                    }
                }
            }
        }
        c
    }

    /// Calls `f(first, pages, used)` for every run of volatile pages last used at the same
    /// moment (one unmark's, typically): the purge candidates of the region, in page order.
    pub fn volatile_runs(&self, mut f: impl FnMut(usize, usize, u64)) {
        let mut run: Option<(usize, usize, u64)> = None;
        for (i, p) in self.pages().iter().enumerate() {
            let page = (state::tag(p.load()) == state::VOLATILE).then(|| p.used());
            run = match (run, page) {
                (Some((at, n, used)), Some(u)) if u == used => Some((at, n + 1, used)),
                (Some((at, n, used)), next) => {
                    f(at, n, used);
                    next.map(|u| (i, 1, u))
                }
                (None, next) => next.map(|u| (i, 1, u)),
            };
        }
        if let Some((at, n, used)) = run {
            f(at, n, used);
        }
    }

    /// Purges the pages of `[first, first + n)` that are still volatile (and, if `used` is
    /// given, still last used then: the age the purger chose them by), for every process:
    /// each contiguous run of them moves to `PURGING` (no holder can pin it until it leaves),
    /// `punch(first, pages)` frees its data, and the pages become `PURGED` with every holder's
    /// lost bit set. A run `punch` fails for goes back to volatile, intact. Returns the pages
    /// purged.
    pub fn purge_run<E>(
        &self,
        first: usize,
        n: usize,
        used: Option<u64>,
        mut punch: impl FnMut(usize, usize) -> Result<(), E>,
    ) -> usize {
        let pages = &self.pages()[first..first + n];
        let mut purged = 0;
        let mut i = 0;
        while i < pages.len() {
            let start = i;
            while i < pages.len() {
                let p = &pages[i];
                let seen = p.load();
                let chosen = used.is_none_or(|u| p.used() == u);
                if !(chosen && p.begin_purge(seen)) {
                    break;
                }
                i += 1;
            }
            let taken = &pages[start..i];
            if !taken.is_empty() {
                if punch(first + start, taken.len()).is_ok() {
                    self.epoch.fetch_add(1, Release);
                    taken.iter().for_each(SharedPage::finish_purge);
                    purged += taken.len();
                } else {
                    taken.iter().for_each(SharedPage::abort_purge);
                }
            }
            // The page that ended the run (pinned, or used since) is skipped.
            i += usize::from(i == start);
        }
        purged
    }

    /// The live holders other than the calling process's, by identity, into `out` (at most
    /// its length, each once); returns how many were written.
    pub fn others(&self, me: &Identity, out: &mut [Identity], mut n: usize) -> usize {
        for holder in &self.holders {
            let Some(who) = holder.live() else {
                continue;
            };
            if (who.pid == me.pid && who.pid_ns == me.pid_ns) || out[..n].contains(&who) {
                continue;
            }
            if n == out.len() {
                break;
            }
            out[n] = who;
            n += 1;
        }
        n
    }

    /// Releases the pins of every holder that `dead` names (identities judged gone by
    /// `vrange_sys::pid::is_gone`) and frees their numbers; `me` does the work (its pid is
    /// recorded meanwhile, so that no other process starts on the same holder). Pages only
    /// those holders pinned become volatile, last used at `now`. Returns the holders released.
    pub fn reap(&self, dead: &[Identity], me: &Identity, now: u64) -> usize {
        let mut released = 0;
        for (h, holder) in self.holders.iter().enumerate() {
            let Some(who) = holder.live() else {
                continue;
            };
            if !dead.contains(&who) {
                continue;
            }
            let claimed = holder
                .word
                .compare_exchange(
                    LIVE | u64::from(who.pid),
                    REAPING | u64::from(me.pid),
                    AcqRel,
                    Relaxed,
                )
                .is_ok();
            if claimed {
                self.release(h as u32, now);
                released += 1;
            }
        }
        released
    }

    /// Releases the pins of the holders whose process is certainly gone
    /// (`vrange_sys::pid::is_gone`: reads `/proc` and allocates), `me` doing the work, as
    /// [`Table::reap`]. Returns the holders released.
    pub fn reap_gone(&self, me: &Identity, now: u64) -> usize {
        let mut others = [Identity::default(); HOLDERS];
        let n = self.others(me, &mut others, 0);
        let mut dead = [Identity::default(); HOLDERS];
        let mut d = 0;
        for who in others[..n].iter().filter(|w| vrange_sys::pid::is_gone(w)) {
            dead[d] = *who;
            d += 1;
        }
        if d == 0 {
            0
        } else {
            self.reap(&dead[..d], me, now)
        }
    }

    /// Holders with a number now (live, or being released).
    pub fn holders(&self) -> usize {
        self.holders
            .iter()
            .filter(|h| h.word.load(Relaxed) != 0)
            .count()
    }
}

/// The data bytes of the shared region file `fd`, and their offset, read from a mapping of
/// its first page (unmapped again).
fn layout(fd: BorrowedFd<'_>) -> Result<(usize, usize, usize), Error> {
    let page = mem::page_size();
    let total = shm::size(fd).map_err(Error::from)?;
    if total < 2 * page || total % page != 0 {
        return Err(Error::Unsupported);
    }
    let first = shm::map(fd, page).map_err(Error::from)?;
    // SAFETY: a live shared mapping of one page, page-aligned; the header's first fields
    // (atomics) fit in it. The table is not read.
    let (len, valid) = unsafe {
        let h = &*first.as_ptr().cast::<Header>();
        let len = h.data_len.load(Acquire) as usize;
        (
            len,
            h.magic.load(Acquire) == MAGIC && h.version.load(Acquire) == VERSION,
        )
    };
    // SAFETY: mapped just above, referred to by nothing else.
    unsafe { mem::unmap(first, page) };
    let offset = data_offset(len).map_err(|_| Error::Unsupported)?;
    if !valid || len == 0 || len % page != 0 || offset.checked_add(len) != Some(total) {
        return Err(Error::Unsupported);
    }
    Ok((len, offset, total))
}

/// A shared mapping: header and page table, then `len` bytes of data.
pub(crate) struct Mapping {
    pub base: NonNull<u8>,
    pub len: usize,
    /// Bytes mapped: the data's offset plus `len`.
    pub total: usize,
    pub fd: GuestFd,
}

impl Mapping {
    pub fn header(&self) -> Table<'_> {
        // SAFETY: base is the start of a live shared mapping of the whole file, page-aligned
        // (the data's offset and `len` bytes, checked when it was mapped); Header (atomics
        // only) fits before the table.
        unsafe { Table::new(&*self.base.as_ptr().cast::<Header>(), self.len) }
    }

    pub fn data(&self) -> *mut u8 {
        // SAFETY: the data follows the table inside the mapping.
        unsafe { self.base.as_ptr().add(self.total - self.len) }
    }

    /// Gives up the mapping's ownership to the registry: (header address, data, descriptor
    /// from `Box::into_raw`).
    pub fn into_parts(self) -> (*mut Header, *mut u8, *mut GuestFd) {
        let data = self.data();
        (
            self.base.as_ptr().cast(),
            data,
            Box::into_raw(Box::new(self.fd)),
        )
    }
}

/// Creates a shared region of `len` bytes (a page multiple), every page pinned by holder 0,
/// claimed by `me`.
pub(crate) fn create(len: usize, me: &Identity) -> Result<Mapping, Error> {
    let offset = data_offset(len)?;
    let total = len.checked_add(offset).ok_or(Error::Overflow)?;
    let fd = shm::create(NAME, total).map_err(Error::from)?;
    let fd = GuestFd::adopt(fd, Inherit::Keep).map_err(Error::from)?;
    let base = map(&fd, total)?;
    let m = Mapping {
        base,
        len,
        total,
        fd,
    };
    let h = m.header();
    h.data_len.store(len as u64, Release);
    h.data_offset.store(offset as u64, Release);
    for p in h.pages() {
        p.init(0);
    }
    let holder = &h.holders[0];
    holder.start_ticks.store(me.start_ticks, Relaxed);
    holder.pid_ns.store(me.pid_ns, Relaxed);
    holder.word.store(LIVE | u64::from(me.pid), Release);
    h.version.store(VERSION, Release);
    h.magic.store(MAGIC, Release);
    Ok(m)
}

/// Maps a shared region created by [`create`] (in this or another process) from its descriptor.
/// The descriptor is duplicated; the caller keeps its own.
pub(crate) fn open(fd: BorrowedFd<'_>) -> Result<Mapping, Error> {
    let (len, _, total) = layout(fd)?;
    let fd = shm::dup(fd).map_err(Error::from)?;
    let fd = GuestFd::adopt(fd, Inherit::Keep).map_err(Error::from)?;
    let base = map(&fd, total)?;
    let m = Mapping {
        base,
        len,
        total,
        fd,
    };
    if !m.header().is_valid(len, total) {
        // SAFETY: the mapping was created above and nothing refers into it.
        unsafe { mem::unmap(m.base, total) };
        return Err(Error::Unsupported);
    }
    Ok(m)
}

fn map(fd: &GuestFd, total: usize) -> Result<NonNull<u8>, Error> {
    let fd = fd.get().ok_or(Error::Os(libc::EBADF))?;
    shm::map(fd, total).map_err(Error::from)
}

/// Frees data of a region being purged, for every process: a hole punched through this
/// process's mapping (so that it works from a thread whose descriptor table holds none of the
/// program's, and even after the program closed the region's descriptor).
///
/// # Errors
/// The errno of madvise(2) MADV_REMOVE.
///
/// # Safety
/// The caller must have moved every page of `data..data + len` to `PURGING`; it lies in the
/// region's data in this process's mapping.
pub(crate) unsafe fn punch(data: usize, len: usize) -> Result<(), Error> {
    // SAFETY: the pages are PURGING: no process holds them pinned, and none can pin them until
    // the purge finishes; the mapping is shared and writable (see `map`).
    unsafe { shm::punch_mapped(data as *mut u8, len) }.map_err(Error::from)
}

/// The header and page table of a shared region's file, mapped alone (a coordinator purging
/// regions participants handed it, without mapping their data). Unmapped on drop.
pub(crate) struct HeaderPage {
    base: NonNull<u8>,
    /// Bytes mapped: the header and the table.
    mapped: usize,
    /// Bytes of data, as checked when it was mapped.
    len: usize,
}

// SAFETY: the pages hold atomics only, shared with other processes anyway.
unsafe impl Send for HeaderPage {}
// SAFETY: as above.
unsafe impl Sync for HeaderPage {}

impl HeaderPage {
    /// Maps and checks the header and table of the shared region `fd`.
    pub fn open(fd: BorrowedFd<'_>) -> Result<HeaderPage, Error> {
        let (len, offset, total) = layout(fd)?;
        let base = shm::map(fd, offset).map_err(Error::from)?;
        let h = HeaderPage {
            base,
            mapped: offset,
            len,
        };
        if h.header().is_valid(len, total) {
            Ok(h)
        } else {
            Err(Error::Unsupported)
        }
    }

    pub fn header(&self) -> Table<'_> {
        // SAFETY: base is a live, page-aligned mapping of the header and the whole table of a
        // region of `len` bytes (`data_offset(len)` bytes).
        unsafe { Table::new(&*self.base.as_ptr().cast::<Header>(), self.len) }
    }

    /// Where the data starts in the file.
    pub fn data_offset(&self) -> usize {
        self.mapped
    }
}

impl Drop for HeaderPage {
    fn drop(&mut self) {
        // SAFETY: mapped by `open`, referred to by nothing once the handle goes.
        unsafe { mem::unmap(self.base, self.mapped) };
    }
}
