/*
 * vrange.h - volatile memory ranges for Linux userspace (C ABI of libvrange)
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 *
 * NAME
 *     vrange, vrange_unmark, vrange_forget, vrange_features, vrange_feature_flags - mark memory as
 *     discardable and learn, when taking it back, whether the system discarded it
 *
 * SYNOPSIS
 *     #include <vrange.h>
 *
 *     ssize_t  vrange(unsigned long start, size_t length, int mode, int *purged);
 *     ssize_t  vrange_unmark(void *start, size_t length, size_t *purged_pages);
 *     int      vrange_forget(void *start, size_t length);
 *     ssize_t  vrange_features(char *buf, size_t len);
 *     uint64_t vrange_feature_flags(void);
 *
 *     Build with:  cc ... $(pkg-config --cflags --libs vrange)
 *     (for an uninstalled tree: PKG_CONFIG_PATH=target/release, after
 *     `cargo build --release -p vrange-ffi`).
 *
 * DESCRIPTION
 *     vrange() with mode VRANGE_VOLATILE marks the pages of [start, start + length) volatile:
 *     when memory is short the kernel may discard ("purge") them instead of swapping them out
 *     or killing a process. It is meant for caches whose content can be regenerated. The
 *     range must be private anonymous, readable and writable memory: mmap(MAP_PRIVATE |
 *     MAP_ANONYMOUS), malloc'd memory, a stack or a heap. No registration is needed. Marking
 *     is implemented with MADV_FREE.
 *
 *     vrange() with mode VRANGE_NOVOLATILE pins the pages again: when it returns, none of
 *     them can be discarded any more. If purged is not NULL, *purged is set to 1 when at
 *     least one page of the range was discarded while volatile, and to 0 otherwise. The
 *     report is exact: a page is reported intact only if its content provably survived.
 *
 *     vrange_unmark() is VRANGE_NOVOLATILE with a pointer argument and a finer report: if
 *     purged_pages is not NULL, *purged_pages is set to the number of pages of the range
 *     that were discarded (0 when nothing was lost).
 *
 *     start must be page-aligned (sysconf(_SC_PAGESIZE)). length is rounded up to a whole
 *     number of pages. A length of 0 does nothing and returns 0 (like madvise(2)); start
 *     must still be aligned, and for VRANGE_NOVOLATILE *purged is set to 0.
 *
 *     Semantics of the page states (the classic volatile-range rules):
 *
 *     - Marking a range that is already volatile keeps its state: a page discarded before
 *       the second mark is still reported as purged at the next unmark.
 *     - Unmarking a range that is not volatile (never marked, or already unmarked) reports
 *       it as not purged. A purge is reported once, by the first unmark after it.
 *     - Unmarking a range that overlaps any purged page reports the whole call as purged
 *       (*purged = 1), as ashmem's unpin does; vrange_unmark() gives the exact page count.
 *     - Purged pages read as zero (they are fresh zero-filled pages after the unmark).
 *     - Reading volatile memory without unmarking it returns the original bytes until the
 *       page is purged, then zeros. Do not rely on what you read before unmarking.
 *     - A page that was entirely zero when it was marked is reported intact (a zero page
 *       loses nothing) and is left as it is by the unmark: it is not faulted in.
 *     - Writes into a volatile page keep that page: once written, the kernel no longer
 *       discards it, and the write survives until the page is marked again. If the kernel
 *       had already discarded the page before the write, the rest of the page reads as
 *       zero; the next unmark normally reports such a page as purged, but a write that
 *       stores a non-zero value exactly into the page's witness word (the 64-bit word
 *       vrange uses as proof of survival: the first non-zero word the page held when it
 *       was marked) hides the loss. Unmark before writing if you need an exact report.
 *
 * RETURN VALUE
 *     vrange() and vrange_unmark() return the number of bytes processed, which is length
 *     rounded up to the page size, on success. On error they return -1 and set errno;
 *     *purged and *purged_pages are then left unchanged.
 *
 *     vrange_features() returns the full length of the report (excluding the terminating
 *     NUL), like snprintf(3), or -1 with errno ENOTRECOVERABLE on an internal error.
 *
 *     vrange_feature_flags() returns the VRANGE_FEATURE_* bits of this kernel, or 0 on an
 *     internal error.
 *
 * ERRORS
 *     EINVAL  start is not page-aligned; mode is neither VRANGE_VOLATILE nor
 *             VRANGE_NOVOLATILE; start + length (rounded up to a page) overflows the address
 *             space or length exceeds SSIZE_MAX; the range lies (partly) at or above 2^48,
 *             the highest address vrange tracks; the range contains memory that is not
 *             private anonymous read-write memory: MAP_SHARED memory (shared anonymous
 *             memory included), file-backed mappings (even MAP_PRIVATE ones), read-only or
 *             PROT_NONE mappings, MAP_HUGETLB memory.
 *     EINVAL  (VRANGE_VOLATILE only) the kernel refused the purge hint for part of the range,
 *             typically because it is locked with mlock(2), mlockall(2) or MAP_LOCKED. The
 *             whole range is then left not volatile (pinned), including pages that were
 *             volatile before the call: pages that were not discarded keep their content
 *             and can no longer be discarded. Pages found discarded (before or during the
 *             call) keep that state, so the next unmark still reports them.
 *     ENOMEM  The range is not fully mapped.
 *     ENOTRECOVERABLE
 *             An internal bug in libvrange (a Rust panic, caught at the ABI boundary). Never
 *             expected; please report it.
 *
 *     Other errno values from open(2) or read(2) of /proc/self/maps (for example EMFILE
 *     when the process is out of file descriptors) are passed through.
 *
 *     On any error nothing is marked: a failed VRANGE_VOLATILE call leaves no page of the
 *     range newly volatile, and a failed unmark changes nothing.
 *
 * NOTES
 *   Constants
 *     VRANGE_VOLATILE (0) and VRANGE_NOVOLATILE (1) are the two values of mode.
 *     VRANGE_FEATURE_* are the bits of vrange_feature_flags(); vrange_features() gives the
 *     same information (and more) as a human-readable table, as `vrange features` prints it.
 *     Without VRANGE_FEATURE_MADV_FREE marking still works and records state, but the
 *     kernel cannot discard anything: content is always kept and never reported purged.
 *
 *   Async-signal safety
 *     vrange(..., VRANGE_NOVOLATILE, ...) and vrange_unmark() are async-signal-safe: they do
 *     not allocate and take no lock. Their only system calls are getpid(2) and an
 *     ioctl(PROCMAP_QUERY) on a cached /proc/self/maps descriptor (Linux 6.11 and later;
 *     the descriptor is opened with open(2) on first use in a process, and again in a fork
 *     child), or, on kernels before 6.11, open(2)/read(2)/close(2) of /proc/self/maps. They
 *     may set errno; a signal handler should save and restore errno around the call.
 *     vrange(..., VRANGE_VOLATILE, ...) is NOT promised to be async-signal-safe: it may
 *     allocate the page-state table and probes the kernel on first use.
 *     vrange_features() and vrange_feature_flags() are not async-signal-safe either.
 *
 *   Threads
 *     All functions are thread-safe. Different threads may mark and unmark different pages
 *     concurrently. Concurrent mark and unmark of the SAME pages by different threads is a
 *     race in the caller: the result (which pages end up volatile, what is reported
 *     purged) is unspecified, but memory-safe.
 *
 *   fork(2)
 *     The child inherits the volatile state and the content of every page. A volatile page
 *     is then shared copy-on-write: a purge by the kernel of a page that is still shared
 *     discards it for both processes (each one's next unmark reports it), and a write by
 *     either side, including an unmark (which writes to the page), gives that side a
 *     private copy whose fate is independent of the other's from then on. (A forced
 *     reclaim with MADV_PAGEOUT skips pages that are still shared; they become
 *     discardable again once only one process maps them.)
 *
 *   Freeing volatile memory
 *     Before freeing memory that may still be volatile with free(3) or munmap(2), unmark
 *     it, or call vrange_forget(start, length), which drops libvrange's state for the
 *     range without touching the memory (async-signal-safe; the range need not be mapped;
 *     EINVAL for an unaligned start or overflow). libvrange keeps a state per page address;
 *     a later mapping at the same addresses otherwise inherits the old states, and its next
 *     unmark may report pages as purged that were not (never the reverse: a lost page is
 *     never reported intact).
 *
 *   Caveats
 *     The caller must own the memory it passes and must not hold pointers into a volatile
 *     range that assume its content is stable. Unmarking writes to the pages (it rewrites
 *     one word per page atomically with the value it holds), so it needs write access and
 *     does not change the content.
 *     Marking is a hint, like madvise(2): the kernel discards volatile pages only under
 *     memory pressure (or when asked to, with MADV_PAGEOUT).
 *
 * EXAMPLE
 *     #include <stdio.h>
 *     #include <string.h>
 *     #include <sys/mman.h>
 *     #include <unistd.h>
 *     #include <vrange.h>
 *
 *     int main(void)
 *     {
 *         size_t len = 64 * (size_t)sysconf(_SC_PAGESIZE);
 *         char *cache = mmap(NULL, len, PROT_READ | PROT_WRITE,
 *                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
 *         int purged;
 *
 *         if (cache == MAP_FAILED)
 *             return 1;
 *         memset(cache, 'x', len);                      // expensive to regenerate
 *         if (vrange((unsigned long)cache, len, VRANGE_VOLATILE, NULL) < 0) {
 *             perror("vrange");
 *             return 1;
 *         }
 *         // ... the kernel may discard the cache under memory pressure ...
 *         if (vrange((unsigned long)cache, len, VRANGE_NOVOLATILE, &purged) < 0) {
 *             perror("vrange");
 *             return 1;
 *         }
 *         if (purged)
 *             memset(cache, 'x', len);                  // regenerate: lost pages read 0
 *         printf("cache %s\n", purged ? "regenerated" : "intact");
 *         return 0;
 *     }
 *
 * SEE ALSO
 *     madvise(2) (MADV_FREE, MADV_PAGEOUT), mlock(2), ashmem (Android), the 2014 volatile
 *     ranges patch series (vrange(2)).
 */

#ifndef VRANGE_H
#define VRANGE_H

#include <stddef.h>    /* size_t */
#include <stdint.h>    /* uint64_t, UINT64_C */
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Values of vrange()'s mode argument. */

/** The kernel may discard the pages of the range under memory pressure. */
#define VRANGE_VOLATILE 0
/** Pin the pages of the range again; *purged says whether any was discarded. */
#define VRANGE_NOVOLATILE 1

/* Bits of vrange_feature_flags(), in the order libvrange reports them. */

/** MADV_FREE (Linux 4.5): the purge path. Without it nothing is ever discarded. */
#define VRANGE_FEATURE_MADV_FREE (UINT64_C(1) << 0)
/** MADV_PAGEOUT (Linux 5.4): purges can be forced, for tests and demos. */
#define VRANGE_FEATURE_MADV_PAGEOUT (UINT64_C(1) << 1)
/** MADV_POPULATE_WRITE (Linux 5.14): prefaulting without writing. */
#define VRANGE_FEATURE_MADV_POPULATE_WRITE (UINT64_C(1) << 2)
/** Transparent huge pages enabled ("always" or "madvise"). */
#define VRANGE_FEATURE_THP (UINT64_C(1) << 3)
/** Page tables of fully dropped 2 MiB blocks are freed (PT_RECLAIM), as measured. */
#define VRANGE_FEATURE_PT_RECLAIM (UINT64_C(1) << 4)
/** PROCMAP_QUERY ioctl (Linux 6.11): range checks without parsing /proc/self/maps. */
#define VRANGE_FEATURE_PROCMAP_QUERY (UINT64_C(1) << 5)
/** userfaultfd(2) is usable by this process (user-mode faults). */
#define VRANGE_FEATURE_USERFAULTFD (UINT64_C(1) << 6)
/** MAP_DROPPABLE mappings (Linux 6.11) can be created. */
#define VRANGE_FEATURE_MAP_DROPPABLE (UINT64_C(1) << 7)
/** process_madvise(2) (Linux 5.10) works on this process. */
#define VRANGE_FEATURE_PROCESS_MADVISE (UINT64_C(1) << 8)
/** Pressure stall information (/proc/pressure/memory) is readable. */
#define VRANGE_FEATURE_PSI (UINT64_C(1) << 9)
/** The process is in a memory cgroup that vrange found. */
#define VRANGE_FEATURE_MEMCG (UINT64_C(1) << 10)

/**
 * Marks (mode VRANGE_VOLATILE) or unmarks (mode VRANGE_NOVOLATILE) the pages of
 * [start, start + length). For VRANGE_NOVOLATILE, *purged (if purged is not NULL) is set to
 * 1 if any page was discarded while volatile, else 0; purged is ignored for VRANGE_VOLATILE.
 * Returns length rounded up to the page size, or -1 with errno set.
 */
ssize_t vrange(unsigned long start, size_t length, int mode, int *purged);

/**
 * Unmarks like vrange(start, length, VRANGE_NOVOLATILE, ...) and stores the number of
 * discarded pages in *purged_pages (if not NULL). Returns length rounded up to the page
 * size, or -1 with errno set. Async-signal-safe.
 */
ssize_t vrange_unmark(void *start, size_t length, size_t *purged_pages);

/**
 * Writes the human-readable feature report into buf (if buf is not NULL and len > 0),
 * truncated to len - 1 bytes and NUL-terminated. Returns the full length of the report,
 * excluding the NUL (call with NULL, 0 to size the buffer), or -1 with errno set.
 */
ssize_t vrange_features(char *buf, size_t len);

/** Drops libvrange's state for [start, start + length) without touching the memory; call it
 *  before freeing memory that may still be volatile. Returns 0, or -1 with errno EINVAL. */
int vrange_forget(void *start, size_t length);

/** Returns the VRANGE_FEATURE_* bits of the running kernel (probed once, then cached). */
uint64_t vrange_feature_flags(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* VRANGE_H */
