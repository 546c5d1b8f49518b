//! Anonymous mappings and the madvise purge hints, named after what they guarantee.
//!
//! Owns `mmap`, `munmap` and `madvise` for the whole crate. Never decides policy: callers say
//! which guarantee they need.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Size of the 2 MiB block a PMD maps on x86-64 and arm64 with 4 KiB pages.
pub const HUGE_PAGE: usize = 2 << 20;

static PAGE_SIZE: AtomicUsize = AtomicUsize::new(0);

/// The base page size. Async-signal-safe after its first call (a relaxed atomic load).
#[inline]
pub fn page_size() -> usize {
    let cached = PAGE_SIZE.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let size = if size > 0 { size as usize } else { 4096 };
    PAGE_SIZE.store(size, Ordering::Relaxed);
    size
}

/// Maps `len` bytes (a page multiple) of private anonymous read-write memory whose start is
/// aligned to `align` (a power of two, at least a page). Content is zero.
///
/// The mapping is accounted (no MAP_NORESERVE), like glibc's: memory handed to a program must
/// be refused by the kernel's overcommit policy at the mmap, not OOM-kill the program on first
/// touch. A request larger than memory and swap fails here under the default heuristic.
///
/// # Errors
/// The errno of mmap(2) (ENOMEM when the address space or overcommit limit is exhausted).
pub fn map_anon(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    map(len, align, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
}

/// Maps `len` bytes (a page multiple) of droppable anonymous memory (MAP_DROPPABLE, Linux
/// 6.11), aligned to `align` (a power of two, at least a page). Content is zero.
///
/// The kernel may drop any page of it at any time, written or not, and a dropped page reads
/// zero; the kernel charges no commit for it (a TiB costs nothing until touched), never
/// OOM-kills for it, keeps it out of core dumps and gives a fork child zeroes (wipe on fork).
///
/// # Errors
/// The errno of mmap(2): EINVAL on kernels without MAP_DROPPABLE (it is one of the map types
/// there), ENOMEM when the address space is exhausted.
///
/// # References
/// mmap(2) MAP_DROPPABLE; Linux commit 9651fcedf7b9 ("mm: add MAP_DROPPABLE for designating
/// always lazily freeable mappings").
pub fn map_droppable(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    map(len, align, libc::MAP_DROPPABLE | libc::MAP_ANONYMOUS)
}

fn map(len: usize, align: usize, flags: libc::c_int) -> io::Result<NonNull<u8>> {
    let page = page_size();
    debug_assert!(align.is_power_of_two() && align >= page && len % page == 0);
    let slack = align - page;
    let total = len
        .checked_add(slack)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing aliases nothing.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let start = raw as usize;
    let aligned = (start + align - 1) & !(align - 1);
    let head = aligned - start;
    let tail = slack - head;
    // SAFETY: both trims lie inside the mapping just created, which nothing else knows of yet.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
    }
    NonNull::new(aligned as *mut u8).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Maps the first `len` bytes of `file` read-only and shared (its page cache), for readers of
/// a file the kernel caches (the peer of vrange-bench's `refill`).
///
/// # Errors
/// The errno of mmap(2).
pub fn map_file_readonly(file: &std::fs::File, len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a new read-only shared mapping of an open file at an address of the kernel's
    // choosing aliases nothing of ours.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(file),
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(raw.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Moves the mapping `[ptr, ptr + len)` to a fresh address aligned to `align` (a power of two,
/// at least a page) and grows it to `new_len` bytes (a page multiple above `len`): its pages
/// move with their page tables (mremap(2), no copy) and the bytes past `len` are fresh zero
/// memory, accounted like [`map_anon`]'s. Returns the new address; the old range is no longer
/// mapped.
///
/// # Errors
/// mmap's or mremap's errno (ENOMEM when the address space or overcommit limit is exhausted);
/// the old mapping is then unchanged.
///
/// # Safety
/// The range must be one private anonymous mapping (or part of one) that the caller owns, with
/// no live references into it, not registered with userfaultfd.
///
/// # References
/// mremap(2) MREMAP_MAYMOVE, MREMAP_FIXED; mm/mremap.c `move_page_tables`.
pub unsafe fn move_grow(
    ptr: NonNull<u8>,
    len: usize,
    new_len: usize,
    align: usize,
) -> io::Result<NonNull<u8>> {
    debug_assert!(new_len > len);
    // An aligned reservation that the move replaces whole.
    let target = map_anon(new_len, align)?;
    // SAFETY: the caller owns the old range; the target is the fresh mapping just made, which
    // MREMAP_FIXED replaces and nothing else knows of.
    let moved = unsafe {
        libc::mremap(
            ptr.as_ptr().cast(),
            len,
            new_len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            target.as_ptr().cast::<libc::c_void>(),
        )
    };
    if moved == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: the reservation is ours and unused (whatever of it the failed call left).
        unsafe { unmap(target, new_len) };
        return Err(e);
    }
    Ok(target)
}

/// Unmaps `[ptr, ptr + len)`.
///
/// # Safety
/// The range must be a mapping (or part of one) that the caller owns, with no live references
/// into it.
pub unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: the caller owns the mapping and nothing refers into it.
    unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
}

fn advise(ptr: *mut u8, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: madvise validates the range itself and fails with ENOMEM on holes; the advices
    // used here cannot make memory unsafe to access, only change its content as documented by
    // the caller-facing function, whose own contract covers that.
    let rc = unsafe { libc::madvise(ptr.cast(), len, advice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Lets the kernel discard the pages in the range when memory is short (MADV_FREE). Until it
/// does, content stays readable and a write to a page keeps that page. On a page still shared
/// with a fork child it cleans only this process's PTE: the page can then be discarded from
/// under this process while the child's mapping keeps it allocated.
///
/// # Errors
/// EINVAL for locked, shared or file-backed memory, ENOMEM for holes (the rest of the range is
/// still advised, as madvise(2) does).
///
/// # Safety
/// The caller must be prepared for every page of the range to read as zero at any later time
/// until the page is written again.
///
/// # References
/// madvise(2) MADV_FREE; mm/madvise.c `madvise_free_single_vma`.
pub unsafe fn purge_lazy(ptr: *mut u8, len: usize) -> io::Result<()> {
    advise(ptr, len, libc::MADV_FREE)
}

/// Whether MADV_FREE works on this kernel (4.5+), tried once on a scratch page and cached.
/// Allocates nothing, so marking can ask on every call. Without it, marking records state but
/// hands nothing to the kernel: content is always kept.
pub fn lazy_free_supported() -> bool {
    static STATE: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 yes, 2 no
    match STATE.load(Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    let page = page_size();
    let works = map_anon(page, page).is_ok_and(|p| {
        // SAFETY: a fresh one-page mapping owned here; its content does not matter.
        let ok = unsafe {
            p.as_ptr().write(1);
            purge_lazy(p.as_ptr(), page).is_ok()
        };
        // SAFETY: the scratch mapping is owned here and nothing refers into it.
        unsafe { unmap(p, page) };
        ok
    });
    STATE.store(if works { 1 } else { 2 }, Ordering::Relaxed);
    works
}

/// Pins the calling thread to the CPU it is running on. Makes [`reclaim_now`] deterministic
/// for pages this thread marks afterwards (see there); for tests and demonstrations.
///
/// # Errors
/// The errno of sched_getcpu(3) or sched_setaffinity(2).
pub fn pin_thread_to_current_cpu() -> io::Result<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: cpu_set_t is plain data (zeroed is the empty set); cpu < CPU_SETSIZE as the
    // kernel just reported it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(cpu as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Drops the pages in the range now (MADV_DONTNEED): they read as zero afterwards. A call
/// covering a whole 2 MiB block lets a kernel with PT_RECLAIM free its page table too.
///
/// # Errors
/// EINVAL for locked memory, ENOMEM for holes.
///
/// # Safety
/// The caller must own the range and hold no reference that expects its content.
///
/// # References
/// madvise(2) MADV_DONTNEED; Documentation/mm/process_addrs.rst (PT_RECLAIM).
pub unsafe fn purge_forced(ptr: *mut u8, len: usize) -> io::Result<()> {
    advise(ptr, len, libc::MADV_DONTNEED)
}

/// Drops the pages of `[ptr, ptr + len)` (whole 2 MiB blocks of one private anonymous mapping
/// made by [`map_anon`]) and their page tables, on any kernel: the blocks are replaced with a
/// fresh private anonymous mapping (mmap MAP_FIXED) given THP advice `huge`, and munmap frees
/// the page tables of whole blocks, which MADV_DONTNEED frees only with PT_RECLAIM. The fresh
/// mapping has the flags of the old one (as [`map_anon`] and [`advise_huge`] made it), so it
/// merges with its neighbours again: the mapping count does not grow. Anything else the
/// caller had set on the range with madvise or mlock is gone with it.
///
/// # Errors
/// mmap's errno. MAP_FIXED unmaps before it maps, so after a failure (ENOMEM: the mapping
/// count or commit limit reached) the range may be unmapped; one retry is made first.
///
/// # Safety
/// As [`purge_forced`]; the range must not be registered with userfaultfd (the registration
/// would be lost).
///
/// # References
/// mmap(2) MAP_FIXED; mm/mmap.c `free_pgtables` (page tables of unmapped whole PMDs).
pub unsafe fn purge_remap(ptr: *mut u8, len: usize, huge: bool) -> io::Result<()> {
    debug_assert!(ptr as usize % HUGE_PAGE == 0 && len % HUGE_PAGE == 0);
    let map = || {
        // SAFETY: the caller owns the range and gives up its content; MAP_FIXED replaces
        // exactly it.
        let p = unsafe {
            libc::mmap(
                ptr.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    map().or_else(|_| map())?;
    // Advice failure only costs performance, as when the mapping was made.
    let _ = advise_huge(ptr, len, huge);
    Ok(())
}

/// Asks the kernel to reclaim the range now (MADV_PAGEOUT). Clean lazy (purge_lazy) pages are
/// discarded at once; dirty anonymous pages stay resident on a machine without swap. Pinned
/// content is never lost.
///
/// Deterministic only on the CPU that ran [`purge_lazy`]: MADV_FREE parks up to 31 folios in a
/// per-CPU batch before they become lazy, and MADV_PAGEOUT drains only its own CPU's batch.
/// Called from another CPU it skips those folios, and isolating them before the batch drains
/// leaves them ordinary (not lazy) anonymous memory for good: kept, never discarded. Tests pin
/// their thread to one CPU for this reason.
///
/// # Errors
/// EINVAL where the kernel lacks MADV_PAGEOUT (before 5.4) or for locked memory, ENOMEM for
/// holes.
pub fn reclaim_now(ptr: *mut u8, len: usize) -> io::Result<()> {
    advise(ptr, len, libc::MADV_PAGEOUT)
}

/// Faults in every page of the range writable without changing content
/// (MADV_POPULATE_WRITE, Linux 5.14).
///
/// # Errors
/// EINVAL where unsupported, ENOMEM for holes or when memory runs out.
pub fn populate_write(ptr: *mut u8, len: usize) -> io::Result<()> {
    advise(ptr, len, libc::MADV_POPULATE_WRITE)
}

/// Asks for (or against) transparent huge pages on the range; content is kept.
///
/// # Errors
/// EINVAL where THP is not built in.
pub fn advise_huge(ptr: *mut u8, len: usize, huge: bool) -> io::Result<()> {
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    advise(ptr, len, advice)
}

/// Rebuilds the range's 2 MiB blocks as huge pages now (MADV_COLLAPSE, Linux 6.1): content is
/// copied into a new huge page, pages never written read zero. The kernel's khugepaged does the
/// same in the background; tests use this to do it at a chosen moment.
///
/// # Errors
/// EINVAL where unsupported, EAGAIN or ENOMEM when no huge page could be had.
///
/// # References
/// madvise(2) MADV_COLLAPSE.
pub fn collapse_huge(ptr: *mut u8, len: usize) -> io::Result<()> {
    advise(ptr, len, libc::MADV_COLLAPSE)
}

/// Number of resident pages of the range, from mincore(2). For tests and reports.
///
/// # Errors
/// ENOMEM for holes.
pub fn resident_pages(ptr: *mut u8, len: usize) -> io::Result<usize> {
    let page = page_size();
    let mut resident = 0;
    let mut buf = [0u8; RESIDENCY_PAGES];
    let mut off = 0;
    while off < len {
        let chunk = (len - off).min(buf.len() * page);
        residency(ptr.wrapping_add(off), chunk, &mut buf)?;
        let pages = chunk.div_ceil(page);
        resident += buf[..pages].iter().filter(|b| **b & 1 != 0).count();
        off += chunk;
    }
    Ok(resident)
}

/// Pages one [`residency`] call into a stack buffer of this many bytes covers (16 MiB of
/// 4 KiB pages).
pub const RESIDENCY_PAGES: usize = 4096;

/// Which pages of the range are resident, one byte per page into `out` (bit 0 set: resident),
/// from one mincore(2): for a caller that counts many ranges of one mapping with one call.
///
/// # Errors
/// ENOMEM for holes; EINVAL if `out` has fewer bytes than the range has pages or `ptr` is not
/// page-aligned.
pub fn residency(ptr: *mut u8, len: usize, out: &mut [u8]) -> io::Result<()> {
    if len.div_ceil(page_size()) > out.len() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: out holds one byte per page of the range (checked above); mincore writes only
    // those and reports holes as ENOMEM rather than touching them.
    let rc = unsafe { libc::mincore(ptr.cast(), len, out.as_mut_ptr().cast::<libc::c_uchar>()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs;

    /// The pages move, not copies: resident before, resident after, with their bytes; the added
    /// bytes read zero and are not resident; the old address is a hole.
    #[test]
    fn move_grow_moves_the_pages_and_adds_zero_bytes() {
        let page = page_size();
        let (len, new_len) = (HUGE_PAGE, 3 * HUGE_PAGE);
        let old = map_anon(len, HUGE_PAGE).unwrap();
        // SAFETY: the test's own mapping, len bytes.
        unsafe { old.as_ptr().write_bytes(0x5a, len) };
        // SAFETY: the test's mapping, unused from here, not registered with userfaultfd.
        let new = unsafe { move_grow(old, len, new_len, HUGE_PAGE) }.unwrap();
        assert_eq!(new.as_ptr() as usize % HUGE_PAGE, 0, "aligned as asked");
        assert_eq!(resident_pages(new.as_ptr(), len).unwrap(), len / page);
        assert_eq!(
            resident_pages(old.as_ptr(), page).map_err(|e| e.raw_os_error()),
            Err(Some(libc::ENOMEM)),
            "the old address is no longer mapped"
        );
        // SAFETY: the grown mapping is new_len bytes.
        let bytes = unsafe { std::slice::from_raw_parts(new.as_ptr(), new_len) };
        assert!(bytes[..len].iter().all(|b| *b == 0x5a), "the bytes moved");
        // SAFETY: inside the grown mapping.
        let added = unsafe { new.as_ptr().add(len) };
        assert_eq!(resident_pages(added, new_len - len).unwrap(), 0);
        assert!(
            bytes[len..].iter().all(|b| *b == 0),
            "the added bytes read zero"
        );
        // SAFETY: the test's mapping, no longer used.
        unsafe { unmap(new, new_len) };
    }

    /// On any kernel, with or without PT_RECLAIM: 64 blocks with a page touched in each hold
    /// 64 page tables (256 KiB of VmPTE on x86-64); replacing the blocks frees them, the
    /// content reads zero, and the mapping is whole again (one mapping, not 64 pieces).
    #[test]
    fn purge_remap_frees_the_page_tables_of_whole_blocks_on_any_kernel() {
        const BLOCKS: usize = 64;
        let len = BLOCKS * HUGE_PAGE;
        let map = map_anon(len, HUGE_PAGE).unwrap();
        let base = map.as_ptr();
        advise_huge(base, len, false).unwrap();
        let pte = || procfs::status(None).unwrap().vm_pte_kb;
        // VmPTE is the whole process's: another test of this binary mapping meanwhile blurs
        // one round, so up to three are made.
        let mut rounds = Vec::new();
        for _ in 0..3 {
            let before = pte();
            for i in 0..BLOCKS {
                // SAFETY: inside the test's own mapping.
                unsafe { base.add(i * HUGE_PAGE + 4096).write(7) };
            }
            let touched = pte();
            // SAFETY: the mapping is the test's; its content is not needed; no userfaultfd.
            unsafe { purge_remap(base, len, false).unwrap() };
            let after = pte();
            rounds.push((before, touched, after));
            if touched >= before + 200 && after + 200 <= touched {
                break;
            }
        }
        let &(before, touched, after) = rounds.last().unwrap();
        assert!(
            touched >= before + 200 && after + 200 <= touched,
            "VmPTE (before, touched, after the remap) in kB: {rounds:?}"
        );
        for i in 0..BLOCKS {
            // SAFETY: as above; the range is mapped again.
            assert_eq!(unsafe { base.add(i * HUGE_PAGE + 4096).read() }, 0);
        }
        let (lo, hi) = (base as usize, base as usize + len);
        let maps = procfs::maps(None).unwrap();
        let holding = maps.iter().find(|m| m.start <= lo && lo < m.end);
        let m = holding.expect("the range is mapped");
        assert!(
            m.end >= hi,
            "the fresh mapping merged back into one: {}",
            m.line
        );
        // SAFETY: the test's mapping, no longer used.
        unsafe { unmap(map, len) };
    }
}
