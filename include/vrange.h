/*
 * vrange.h - volatile memory ranges for Linux userspace (C ABI of libvrange)
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 *
 * NAME
 *     vrange, vrange_unmark, vrange_forget, vrange_features, vrange_feature_flags, vrange_alloc,
 *     vrange_free, vrange_set_priority, vrange_shared_fd, vrange_map_shared, vrange_purge,
 *     vrange_stats, vrange_source_name, vrange_set_option, vrange_reclaimer_stop,
 *     vrange_fill, vrange_alloc_refill, vrange_cache_create, vrange_cache_put,
 *     vrange_cache_get, vrange_cache_release, vrange_cache_remove, vrange_cache_stats,
 *     vrange_cache_destroy, vrange_sqlite_pcache, vrange_version - mark memory as discardable
 *     and learn, when taking it back, whether the system discarded it
 *
 * SYNOPSIS
 *     #include <vrange.h>
 *
 *     ssize_t  vrange(unsigned long start, size_t length, int mode, int *purged);
 *     ssize_t  vrange_unmark(void *start, size_t length, size_t *purged_pages);
 *     int      vrange_forget(void *start, size_t length);
 *     int      vrange_fill(void *dst, const void *src, size_t len);
 *     ssize_t  vrange_features(char *buf, size_t len);
 *     uint64_t vrange_feature_flags(void);
 *
 *     void    *vrange_alloc(size_t length, int flags);
 *     int      vrange_free(void *addr, size_t length);
 *     int      vrange_set_priority(void *addr, size_t length, int priority);
 *     int      vrange_shared_fd(void *addr);
 *     void    *vrange_map_shared(int fd, int flags, size_t *length);
 *     void    *vrange_alloc_refill(size_t length, int flags, size_t block,
 *                                  vrange_refill_fn fill, void *ctx);
 *     typedef int (*vrange_refill_fn)(void *ctx, size_t offset, void *buf, size_t len);
 *
 *     size_t   vrange_purge(size_t bytes);
 *     int      vrange_stats(struct vrange_stats *out, size_t size);
 *     const char *vrange_source_name(int source);
 *     int      vrange_set_option(const char *name, const char *value);
 *     void     vrange_reclaimer_stop(void);
 *
 *     struct vrange_cache *vrange_cache_create(const struct vrange_cache_options *options);
 *     int      vrange_cache_put(struct vrange_cache *c, const void *key, size_t klen,
 *                               const void *val, size_t vlen, int priority);
 *     const void *vrange_cache_get(struct vrange_cache *c, const void *key, size_t klen,
 *                                  size_t *vlen);
 *     int      vrange_cache_release(struct vrange_cache *c, const void *value);
 *     int      vrange_cache_remove(struct vrange_cache *c, const void *key, size_t klen);
 *     int      vrange_cache_stats(struct vrange_cache *c, struct vrange_cache_stats *out,
 *                                 size_t size);
 *     void     vrange_cache_destroy(struct vrange_cache *c);
 *
 *     const void *vrange_sqlite_pcache(void);
 *
 *     unsigned vrange_version(void);
 *     VRANGE_VERSION, VRANGE_VERSION_MAJOR, VRANGE_VERSION_MINOR, VRANGE_VERSION_PATCH,
 *     VRANGE_VERSION_STRING
 *
 *     Link with -lvrange: cc ... $(pkg-config --cflags --libs vrange)
 *     (for an uninstalled tree: PKG_CONFIG_PATH=target/release, after
 *     `cargo build --release -p vrange-ffi`).
 *
 * DESCRIPTION
 *     vrange() with mode VRANGE_VOLATILE marks the pages of [start, start + length) volatile:
 *     when memory is short the kernel may discard ("purge") them instead of swapping them out
 *     or killing a process. It is meant for caches whose content can be regenerated. The
 *     range must be private anonymous, readable and writable memory: mmap(MAP_PRIVATE |
 *     MAP_ANONYMOUS), malloc'd memory, a stack or a heap. No registration is needed. Marking
 *     such memory is implemented with MADV_FREE. The range may also lie in a region from
 *     vrange_alloc() or vrange_map_shared(); the region's policy then decides what marking
 *     does (see Regions below), and the range must stay inside the region.
 *
 *     vrange() with mode VRANGE_NOVOLATILE pins the pages again: when it returns, none of
 *     them can be discarded any more. If purged is not NULL, *purged is set to 1 when at
 *     least one page of the range was discarded while volatile, and to 0 otherwise. The
 *     report is exact: a page is reported intact only if its content provably survived.
 *     purged (and purged_pages below) must be NULL or point to writable memory: vrange
 *     writes through it without checking, as the call is async-signal-safe and a check
 *     would cost a system call, so an invalid pointer crashes the caller (there is no
 *     EFAULT).
 *
 *     vrange_unmark() is VRANGE_NOVOLATILE with a pointer argument and a finer report: if
 *     purged_pages is not NULL, *purged_pages is set to the number of pages of the range
 *     that were discarded (0 when nothing was lost).
 *
 *     start must be page-aligned (sysconf(_SC_PAGESIZE)). length is rounded up to a whole
 *     number of pages. A length of 0 does nothing and returns 0 (like madvise(2)); start
 *     must still be aligned and at most 2^48 (the end of the range vrange tracks: the empty
 *     range at 2^48 itself is accepted, vrange(1UL << 48, 0, ...) returns 0, while
 *     vrange((1UL << 48) + 4096, 0, ...) fails with EINVAL), and for VRANGE_NOVOLATILE
 *     *purged is set to 0.
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
 *   SIGBUS mode
 *     What happens on access to memory that is still volatile, without unmarking it first:
 *
 *         access                   purged                 not purged
 *         without unmarking        SIGBUS (SIGBUS mode);  original content
 *                                  zero otherwise
 *         after unmarking          zero, no signal        original content, never lost
 *
 *     Mode VRANGE_VOLATILE | VRANGE_SIGBUS marks a range as VRANGE_VOLATILE does, and until it
 *     is unmarked, a load or store that touches a page the system discarded raises SIGBUS in
 *     the thread that touched it, with si_addr the address touched (si_code BUS_ADRERR),
 *     instead of reading zero. Pages never purged, and every page once unmarked, never signal.
 *     A handler may place content into the purged page with vrange_fill() and return: the
 *     access is retried and succeeds (the decompressor's "patch the page back"). Without a
 *     handler the process dies of the signal, as for any SIGBUS; libvrange installs none.
 *     vrange_alloc() with VRANGE_SIGBUS in flags makes a region whose marks are all in SIGBUS
 *     mode (vrange() then takes either mode). VRANGE_SIGBUS is not accepted with
 *     VRANGE_SCRATCH. Shared regions take it per mapping: vrange_alloc(len, VRANGE_SHARED |
 *     VRANGE_SIGBUS) in the creating process, vrange_map_shared(fd, VRANGE_SIGBUS, ...) in
 *     another; a purge (a hole punched in the file) then raises SIGBUS in each process whose
 *     mapping is in SIGBUS mode and volatile, and reads zero in the others.
 *
 *     vrange_fill() copies len bytes from src into [dst, dst + len) (dst and len page
 *     multiples), filling only pages that are missing, atomically per page, and leaving pages
 *     that are present as they are (in SIGBUS-mode memory, and in a refill region whose fill
 *     failed). It is async-signal-safe. A page it placed counts as
 *     intact at the next unmark (its content is what the handler regenerated).
 *
 *     SIGBUS mode is built on userfaultfd(2) with UFFD_FEATURE_SIGBUS: one descriptor per
 *     process, opened at the first use (placed like every libvrange descriptor, see NOTES),
 *     with the volatile ranges registered in MISSING mode. On arbitrary memory and in
 *     VRANGE_LAZY regions each SIGBUS mark registers the range (one more system call) and the
 *     unmark unregisters it before proving the pages. Managed and hybrid SIGBUS regions are
 *     populated when created (every page faulted in, so only purged pages can fault later)
 *     and registered once; their mark and unmark stay O(1), and the unmark that reports a
 *     purge installs zero pages over the range. Hybrid SIGBUS regions are never armed (they
 *     purge as managed ones). A system call that writes into a purged page of a volatile
 *     SIGBUS range (read(2) into it) fails with EFAULT where this process may use
 *     userfaultfd for kernel-mode faults (privileged, or vm.unprivileged_userfaultfd=1);
 *     elsewhere libvrange opens it with UFFD_USER_MODE_ONLY and such a call faults in a zero
 *     page instead, which the next unmark reports as purged. A fork(2) child inherits no
 *     registration: there, purged pages read zero. If the program closes the descriptor, the
 *     kernel drops the registrations (purged pages read zero) until the next SIGBUS region or
 *     mark opens a new one, which registers the live SIGBUS regions again. Without userfaultfd
 *     (or without the permission to use it) the mark and vrange_alloc() fail with ENOTSUP:
 *     never silently zero.
 *
 *   Refill regions
 *     vrange_alloc_refill() maps a region of length bytes (rounded up to a page) whose content
 *     is whatever fill makes, block by block: fill(ctx, offset, buf, len) writes the len bytes
 *     of the block at offset (block bytes, a page multiple; the last block may be shorter)
 *     into buf and returns 0, or anything else on failure. The region is volatile for as long
 *     as it lives and is never marked: a block is made when a thread first touches it, handed
 *     to the kernel's lazy-free path at once (so the system may take it back whenever memory
 *     is short, and a region may be far larger than the memory the process may use), and made
 *     again when a thread touches it after that. Near the memory cgroup's limit (the block
 *     would leave less than twice the VRANGE_HEADROOM threshold, or its charge would pass the
 *     limit, making the kernel reclaim), a fill first takes the pages of the region's oldest
 *     blocks that the kernel has not taken (counted in refill_recycled_bytes): moved into its
 *     buffer where the kernel moves pages (UFFDIO_MOVE, Linux 6.8), so that the new block is
 *     made in them and charged nothing, else given back, so that it is charged without
 *     reclaim. The touching thread waits in the page fault while libvrange's thread
 *     "vrange-refill" calls fill with a buffer of the region's and puts the whole block in
 *     place in one step (UFFDIO_COPY, or near the limit UFFDIO_MOVE of the buffer's pages:
 *     refill_moved_bytes; VRANGE_REFILL_MOVE=off in the environment keeps to the copy), then
 *     simply continues. A page that was not taken back costs nothing on access. If fill fails, the access raises SIGBUS in the
 *     touching thread with si_addr the address touched (si_code SI_QUEUE: the refill thread
 *     raises it on the touching thread's behalf); a handler may place the content with
 *     vrange_fill() and return, or return without: the access is retried, and fill with it.
 *     fill runs on the refill thread, one call at a time for the whole process; it must not
 *     touch a refill region, nor create or free one. Pages the program writes stay until their
 *     block is made again or recycled (refill regions are meant to be read). vrange() and vrange_unmark()
 *     refuse refill memory (EINVAL: its pages are the refill thread's to drop and make). flags
 *     is 0 or VRANGE_FILL_HERE (below). Free the region with vrange_free(). A fork(2) child inherits no registration: there, pages taken
 *     back read zero. Without userfaultfd vrange_alloc_refill() fails with ENOTSUP.
 *
 *     With VRANGE_FILL_HERE the touching thread fills the block itself: a touch of a missing
 *     page raises SIGBUS on it (userfaultfd's SIGBUS feature), and libvrange's SIGBUS handler
 *     calls fill there with a buffer of the region's, puts the block in place and returns, so
 *     the access is retried and succeeds; no other thread wakes. The first such region installs
 *     that handler for the process (SA_SIGINFO | SA_RESTART, on the thread's own stack), in
 *     front of the SIGBUS action the program had then, to which every other SIGBUS goes:
 *     a signal at another address, and the fault of a failing fill (si_code BUS_ADRERR, si_addr
 *     the address touched: a handler may place the page with vrange_fill() and return); where
 *     the program had none, the process dies of SIGBUS. fill then runs inside a signal handler,
 *     on several threads at once: it must not touch a refill region, and it may allocate or
 *     take a lock only if the code touching the region never holds it while doing so. A
 *     program that installs its own SIGBUS handler later must pass on the signals it does not
 *     handle to the action it replaced. These fills take the oldest blocks' pages near the
 *     cgroup's limit as the refill thread's do, judging the memory short by the headroom
 *     libvrange's reclaimer thread reads at each tick (the first such region starts it; a
 *     signal handler cannot read it) less what fills charged since. At most 64 such regions
 *     live at once (ENOMEM).
 *
 *   Regions
 *     vrange_alloc() maps a region of length bytes (rounded up to a page) owned by libvrange,
 *     zero-filled and pinned (not volatile). Mark and unmark its pages with vrange() and
 *     vrange_unmark() as any memory. The policy in flags decides what a mark does; one of:
 *
 *     VRANGE_LAZY
 *             The kernel path, as for arbitrary memory: every mark is MADV_FREE, the kernel
 *             alone decides which pages to drop under memory pressure, and every unmark proves
 *             each page with its witness word, so that the report counts exactly the pages
 *             lost. Mark and unmark take time proportional to the pages of the range.
 *     VRANGE_MANAGED
 *             Mark and unmark are one atomic operation on the range and a clock read: O(1)
 *             whatever the size, no system call. The pages stay resident while volatile;
 *             libvrange's reclaimer (see Reclaimer) purges whole volatile ranges when memory
 *             is short, and vrange_purge() purges on request. A purged range reads as zero and
 *             its next unmark reports all its pages purged.
 *     VRANGE_HYBRID (0, the default)
 *             Managed, and a range left volatile longer than VRANGE_ARM_DELAY_MS (default
 *             1000 ms) is also handed to the kernel path ("armed": MADV_FREE), so that the
 *             kernel's own reclaim can drop its pages even if the reclaimer reacts too late.
 *             Near the limit (the memory cgroup's headroom, or without a limit MemAvailable,
 *             below what a neighbour faults in within one reclaimer tick: 410 MiB at the
 *             default 100 ms; a pressure event of the process's own cgroup; or before the
 *             reclaimer has measured, or when it is off) the mark itself arms the range, like
 *             a lazy mark, and ranges already volatile are armed at once.
 *             Unmarking an armed range costs what a lazy unmark costs and reports exactly the
 *             pages the kernel dropped (all of them if the reclaimer purged the range).
 *
 *     A region starts as one range. A vrange() call that covers part of a range splits it
 *     first, once (time proportional to the pages split off); later calls on the pieces are
 *     O(1) again.
 *
 *     One of VRANGE_DROP_FIRST, VRANGE_DROP_LOW or VRANGE_DROP_LAST in flags sets the region's
 *     reclaim class (normal without; VRANGE_DROP_NORMAL is 0). The reclaimer and
 *     vrange_purge() purge the lowest class first (drop-first, low, normal, drop-last) and,
 *     within a class, the range marked least recently first. vrange_set_priority() sets the
 *     class of [addr, addr + length), which must lie inside one region, to priority: 0
 *     (VRANGE_DROP_NORMAL) or one VRANGE_DROP_* value (splitting ranges as vrange() does). The
 *     class does not matter in lazy regions (the kernel chooses).
 *
 *     VRANGE_NOHUGE keeps a private region in base pages (MADV_NOHUGEPAGE); VRANGE_HUGE aligns
 *     it to 2 MiB and advises transparent huge pages. Without either, regions of 2 MiB or
 *     more get huge pages when the kernel's THP mode allows them.
 *
 *     vrange_free() unmaps a region, volatile or not (no unmark is needed first): addr must be
 *     the address vrange_alloc() or vrange_map_shared() returned, and length, rounded up to a
 *     page, the region's length.
 *
 *   Scratch regions
 *     vrange_alloc(length, VRANGE_SCRATCH) maps a scratch region: memory that is always
 *     volatile, written or not, with no call to make ever. The kernel may drop any page of it
 *     at any time and a dropped page reads zero; memory pressure never OOM-kills the process
 *     for it. Use it for data that is as good as zero when lost: a sanitizer's shadow, a
 *     recomputable table. It costs address space only until pages are written (no memory,
 *     commit charge or page table up front: reserve a terabyte at start-up if that is the
 *     shadow's size). A fork(2) child sees zeroes there (the mapping is wiped on fork), and
 *     core dumps leave it out. No other flag may be combined with VRANGE_SCRATCH; vrange()
 *     and vrange_unmark() refuse scratch memory (EINVAL: it cannot be pinned); vrange_free()
 *     unmaps it. A process holds at most 64 scratch regions at once.
 *
 *     Scratch regions are MAP_DROPPABLE mappings (Linux 6.11). On older kernels
 *     vrange_alloc() fails with ENOTSUP: no older primitive keeps written memory droppable
 *     without a call after each write (MADV_FREE is undone by the next write), and memory the
 *     kernel cannot take back would bring back the OOM kill scratch memory exists to avoid;
 *     use a hybrid region and mark it there. vrange_stats() counts scratch regions and the
 *     bytes they reserve; the kernel counts no drops per mapping (mincore(2) tells what is
 *     resident).
 *
 *   Shared regions
 *     VRANGE_SHARED makes a region backed by a memfd that other processes can map.
 *     vrange_shared_fd() returns its descriptor, given any address inside the region. The
 *     descriptor is borrowed: do not close it; it stays valid until vrange_free() of the
 *     region, and is close-on-exec. Pass it to another process over a UNIX socket
 *     (SCM_RIGHTS) or let a fork(2) child inherit it, and map the region there with
 *     vrange_map_shared(), which duplicates the descriptor, stores the region's length in
 *     *length (if length is not NULL) and takes the reclaim class from the VRANGE_DROP_* bits
 *     of flags (VRANGE_SHARED and VRANGE_MANAGED are accepted there and change nothing).
 *
 *     Shared regions are always managed (MADV_FREE does not apply to shared memory; without
 *     swap the kernel cannot drop shared pages by itself: a reclaimer or the coordinator
 *     purges them). vrange() works on any page-aligned part of one, as ashmem's ASHMEM_PIN
 *     and ASHMEM_UNPIN and Chromium's DiscardableSharedMemory::Lock and Unlock do: pins are
 *     counted per mapping and per page. A page that any mapping, in any process, holds pinned
 *     is never purged; once every mapping has marked it volatile, any process's reclaimer or
 *     vrange_purge() may purge it (oldest first, in runs of pages marked together), which
 *     frees it for all of them (a hole is punched in the memfd) and makes it read as zero.
 *     Every mapping sees the purge at its own next unmark of that page (*purged = 1), even if
 *     another mapping unmarked and refilled it first. Marking and unmarking cost one atomic
 *     operation per page; the memfd holds 24 bytes of state per page.
 *
 *     vrange_alloc() returns a shared region pinned by the calling process. A mapping made by
 *     vrange_map_shared() holds no pin until its first VRANGE_NOVOLATILE: unmark what it uses
 *     before using it; that unmark reports whether the content was purged. A region takes 32
 *     mappings at most. vrange_free() of a shared region drops its pins, unmaps it and closes
 *     its descriptor; the memory lives on while other processes map it.
 *
 *     Pins die with their holder: each mapping records its process (pid, start time, pid
 *     namespace) in the region, and the pins of a process that died (its pid gone, a zombie,
 *     or reused by a later process) are released by the next reclaimer tick of any process
 *     mapping the region (100 ms, 10 ms near the memory limit), or by the coordinator holding
 *     it; the next purge may then take what only it pinned. A process in another pid
 *     namespace is never judged dead; one that exec()s keeps its pins until it exits.

 *   Caches
 *     vrange_cache_create() makes a thread-safe cache of byte strings under byte-string keys
 *     whose values live in volatile memory: the reclaimer (below) may take them back under
 *     memory pressure, least recently used first within classes, in one order with every
 *     other region of the process, and a value a caller holds is never taken. options may be
 *     NULL for the defaults; otherwise set options->size to sizeof(struct
 *     vrange_cache_options) and leave any field 0 for its default: slab_bytes (256 KiB) is
 *     the size of the regions that hold values (small values share one; a value larger
 *     than a quarter of it gets its own), budget (0: none) the resident bytes this cache
 *     keeps at most (past it, a put evicts the cache's oldest slabs, copying on the values read
 *     since they were written), and flags
 *     0 (hybrid regions) or VRANGE_MANAGED, either with VRANGE_CACHE_NO_PROBATION.
 *
 *     Probation (scan resistance): a key's first value is put in a probation slab, purged
 *     as one class below the value's own (so before every value of its class that was
 *     read); its first get moves it (one copy) into an ordinary slab. A value purged on
 *     probation and then asked for again (the get that says ESTALE) skips probation at its
 *     next put. Values with a region of their own are never on probation.
 *     VRANGE_CACHE_NO_PROBATION turns it off.
 *
 *     vrange_cache_put() copies vlen bytes at val under the klen bytes at key (replacing any
 *     entry) with class priority: 0 or one VRANGE_DROP_* value. vrange_cache_get() returns
 *     the value under key, stores its length in *vlen (if vlen is not NULL) and holds it: it
 *     stays readable, unchanged, until vrange_cache_release(c, value), even if the key is
 *     removed or replaced, or the rest of its slab purged, meanwhile. A held value keeps
 *     only the pages it lies on from a purge, not its slab. Release every value you get,
 *     once; a value is read-only. When there is no value, vrange_cache_get() returns NULL and sets errno to
 *     ENOENT (never inserted, removed, or already reported purged) or ESTALE (the system
 *     purged it; the entry is dropped, so the next get says ENOENT): regenerate it and put
 *     it again. Values are purged whole, in slabs: values put together, and those of one
 *     slab, age together; a get renews the whole slab.
 *
 *     vrange_cache_remove() drops the entry under key. vrange_cache_stats() fills *out (pass
 *     sizeof(struct vrange_cache_stats) as size; later versions only append fields, as for
 *     vrange_stats()) with hits, misses and purges, value and purged bytes, and, also per
 *     class: resident_bytes, the most the cache can hold in memory (the pages values were
 *     written to, whole pages, in slabs not known to be purged: an upper bound, since the
 *     kernel may have taken a lazily freed slab that no get has looked at since, and pages
 *     of a slab never written take no memory), and the overhead (resident bytes holding no
 *     live value: page rounding and removed values in slabs still in use). The totals
 *     mapped_bytes, the address space of those slabs (what resident_bytes counted in earlier
 *     releases), and pinned_bytes, the bytes no purge can take now (the pages under held
 *     values, and whole slabs while a put writes into them), follow, then promoted, per
 *     class: the values a first hit moved off probation, then recycled, per class: the
 *     slabs whose pages a new slab took over while memory was short (their entries count
 *     as purged), then carried, per class: the values read since they were written that the
 *     cache's own evictions (budget, recycling) copied into a new slab instead of dropping. vrange_cache_destroy() frees
 *     the cache; values still held stay readable and are leaked, and every later call with
 *     the handle fails with EINVAL (a destroyed handle keeps 16 bytes so that this holds; no
 *     new cache gets its address).
 *
 *   SQLite's page cache
 *     vrange_sqlite_pcache() returns a page cache for SQLite, a struct
 *     sqlite3_pcache_methods2 (libvrange does not link SQLite): install it with
 *     sqlite3_config(SQLITE_CONFIG_PCACHE2, vrange_sqlite_pcache()) before
 *     sqlite3_initialize(). Pages SQLite unpins (clean pages only) become volatile, one
 *     managed range per page: the reclaimer may take them under memory pressure, in the same
 *     order as all other vrange memory, and SQLite reads a taken page from its file again, as
 *     after its own cache evicted it. Pages of caches that are not purgeable (in-memory and
 *     temporary databases) are never volatile. cache_size is honoured as by SQLite's own
 *     cache: set it large (PRAGMA cache_size = -N KiB) and let memory pressure bound it. A
 *     page is its size rounded up to the system page (pages under 4 KiB waste the rest).
 *
 *   Reclaimer
 *     The first managed or hybrid region (shared ones included) starts a thread,
 *     "vrange-reclaim", that listens to the memory-pressure sources the system offers and
 *     purges whole volatile managed and hybrid ranges in response, lowest class and least
 *     recently used first. The sources, as indexed in struct vrange_stats:
 *
 *     VRANGE_SOURCE_PSI, VRANGE_SOURCE_PSI_CGROUP
 *             A PSI trigger (VRANGE_PSI) on /proc/pressure/memory or on the cgroup v2
 *             memory.pressure file fired: VRANGE_PRESSURE_SHARE percent of the volatile bytes
 *             (at least 2 MiB) are purged per event.
 *     VRANGE_SOURCE_VMPRESSURE_MEDIUM, VRANGE_SOURCE_VMPRESSURE_CRITICAL
 *             A cgroup v1 memory.pressure_level event (VRANGE_VMPRESSURE): the same share, or
 *             everything for critical.
 *     VRANGE_SOURCE_HEADROOM
 *             The cgroup's limit minus its usage, polled every VRANGE_POLL_MS, fell below
 *             VRANGE_HEADROOM: enough to restore twice that headroom.
 *     VRANGE_SOURCE_BUDGET
 *             Resident volatile bytes exceed VRANGE_BUDGET: the excess.
 *     VRANGE_SOURCE_EXPLICIT
 *             vrange_purge(), in the calling thread: what it asks.
 *
 *     The thread also arms hybrid ranges. vrange_reclaimer_stop() stops it and waits for it to
 *     exit; volatile ranges stay volatile, and the next managed mark, new region or
 *     vrange_purge() starts it again (unless VRANGE_RECLAIMER is off).
 *
 *     vrange_purge() purges, in the calling thread, whole volatile managed and hybrid ranges
 *     until at least bytes bytes are freed or none is left, so it may free more than asked.
 *     Lazy regions and arbitrary memory are never purged by it (the kernel decides there).
 *
 *     vrange_stats() fills *out with a snapshot of managed purging in this process (see
 *     struct vrange_stats below): gauges of managed and hybrid ranges by state, totals since
 *     the start, counters per source, indexed by VRANGE_SOURCE_*, and scratch regions. Pass
 *     sizeof(struct vrange_stats) as size: later versions of the struct only append fields,
 *     so programs built against an older header keep working. It writes min(size, its own
 *     sizeof(struct vrange_stats)) bytes, sets out->size to that count, and zeroes the rest of
 *     the caller's size bytes. vrange_source_name() returns the short name of a
 *     VRANGE_SOURCE_* value ("psi", "psi-cgroup", "vmpressure-medium", "vmpressure-critical",
 *     "headroom", "budget", "explicit"), a static string.
 *
 *     vrange_set_option() changes a setting at run time: name is the name of its environment
 *     variable (see ENVIRONMENT), value a string as the variable would hold. The reclaimer
 *     applies the change at its next wake-up. An unknown name or a malformed value changes
 *     nothing.
 *
 *   Versions
 *     The header defines VRANGE_VERSION_MAJOR, VRANGE_VERSION_MINOR and
 *     VRANGE_VERSION_PATCH, the version it belongs to; VRANGE_VERSION, the number MAJOR *
 *     10000 + MINOR * 100 + PATCH (0.1.0 is 100), for comparisons in #if; and
 *     VRANGE_VERSION_STRING, "MAJOR.MINOR.PATCH". vrange_version() returns the number of the
 *     library the program runs with, so a program can tell when it runs with another
 *     library than the one its header describes.
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
 *     vrange_alloc() and vrange_map_shared() return the start of the region (page-aligned),
 *     or NULL with errno set.
 *
 *     vrange_free(), vrange_set_priority(), vrange_stats() and vrange_set_option() return 0,
 *     or -1 with errno set.
 *
 *     vrange_shared_fd() returns the region's descriptor, or -1 with errno set.
 *
 *     vrange_purge() returns the bytes it freed: the sum of the lengths of the ranges it
 *     purged (0 if nothing was volatile, or with errno ENOTRECOVERABLE on an internal error).
 *     A range whose memory could not be freed (a shared region whose hole the kernel refused
 *     to punch through its mapping) is not counted: it stays volatile and intact, and its next
 *     unmark reports it intact. A shared region is punched through its mapping, so a program
 *     that closed the region's descriptor does not stop its purges.
 *
 *     vrange_source_name() returns a static string, or NULL with errno EINVAL when source is
 *     not a VRANGE_SOURCE_* value.
 *
 *     vrange_cache_create() returns the cache, or NULL with errno set. vrange_cache_get()
 *     returns the value, or NULL with errno set. vrange_cache_put(), vrange_cache_release(),
 *     vrange_cache_remove() and vrange_cache_stats() return 0, or -1 with errno set.
 *
 *     vrange_version() returns the library's VRANGE_VERSION; it cannot fail.
 *
 * ERRORS
 *   vrange(), vrange_unmark()
 *     EINVAL  start is not page-aligned; mode is neither VRANGE_VOLATILE nor
 *             VRANGE_NOVOLATILE; start + length (rounded up to a page) overflows the address
 *             space or length exceeds SSIZE_MAX; the range lies (partly) at or above 2^48,
 *             the highest address vrange tracks; the range contains memory that is not
 *             private anonymous read-write memory: MAP_SHARED memory (shared anonymous
 *             memory included), file-backed mappings (even MAP_PRIVATE ones), read-only or
 *             PROT_NONE mappings, MAP_HUGETLB memory (regions from vrange_alloc() and
 *             vrange_map_shared() excepted); scratch regions (always volatile).
 *     EINVAL  The range covers part of a region and memory outside it.
 *     EUSERS  (VRANGE_NOVOLATILE, in a shared region) the mapping is a fork child's, which
 *             takes a holder number of its own at its first unmark, and the region's 32 are
 *             taken.
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
 *   vrange() in SIGBUS mode, vrange_alloc() with VRANGE_SIGBUS, vrange_alloc_refill()
 *     ENOTSUP userfaultfd(2) or its SIGBUS feature is absent, or not allowed to this process:
 *             Docker's default seccomp profile refuses the system call and a container has
 *             no /dev/userfaultfd. `vrange features` says which; allow userfaultfd in the
 *             container's seccomp profile (or give it /dev/userfaultfd), or use a region
 *             without VRANGE_SIGBUS (its purges read as zero and are reported at unmark).
 *     EAGAIN  The process's userfaultfd is opened at the first such call, and 0, 1 or 2 was
 *             closed at that moment (libvrange opens nothing that could take their place:
 *             see NOTES); call again once they are open.
 *     EINVAL  (vrange()) the range lies in a region created without VRANGE_SIGBUS.
 *
 *   vrange_fill()
 *     EINVAL  dst or len is not a page multiple, or [dst, dst + len) is not SIGBUS-mode memory
 *             that is volatile.
 *     EFAULT  src is NULL (with len not 0) or unreadable.
 *     ENOMEM  memory for the pages could not be charged.
 *
 *   vrange_alloc_refill()
 *     EINVAL  length or block is 0, block is not a page multiple, fill is NULL or flags is
 *             neither 0 nor VRANGE_FILL_HERE.
 *     ENOTSUP userfaultfd(2) (with VRANGE_FILL_HERE, its SIGBUS feature) is absent or not
 *             allowed to this process.
 *     ENOMEM  length is too large, or mmap(2) failed, or (VRANGE_FILL_HERE) 64 such regions
 *             live already.
 *
 *   vrange_alloc()
 *     EINVAL  length is 0; flags has a bit no VRANGE_* flag defines, two policies
 *             (VRANGE_LAZY | VRANGE_MANAGED), two VRANGE_DROP_* classes, both VRANGE_HUGE
 *             and VRANGE_NOHUGE, or VRANGE_SHARED with VRANGE_LAZY, VRANGE_HUGE or
 *             VRANGE_NOHUGE.
 *     EINVAL  VRANGE_SCRATCH with any other flag.
 *     ENOMEM  length is too large, or mmap(2) or libvrange's range table ran out of memory,
 *             or (VRANGE_SCRATCH) the process already holds 64 scratch regions.
 *     ENOTSUP (VRANGE_SCRATCH) the kernel has no MAP_DROPPABLE (before Linux 6.11).
 *     EMFILE, ENFILE
 *             (VRANGE_SHARED) memfd_create(2) found no free descriptor.
 *
 *   vrange_free()
 *     EINVAL  addr and length (rounded up to a page) do not name a live region returned by
 *             vrange_alloc() or vrange_map_shared(): NULL, an address inside a region, a
 *             wrong length, a region already freed.
 *
 *   vrange_set_priority()
 *     EINVAL  priority is neither 0 nor one VRANGE_DROP_* value; addr is not inside a region
 *             from vrange_alloc() or vrange_map_shared(), or is not page-aligned; the range
 *             covers part of a shared region.
 *     ENOMEM  The range extends past the end of the region.
 *
 *   vrange_shared_fd()
 *     EINVAL  addr is not inside a region from vrange_alloc() or vrange_map_shared(), or the
 *             region is not shared.
 *
 *   vrange_map_shared()
 *     EBADF   fd is negative or not an open descriptor.
 *     EINVAL  fd does not refer to a libvrange shared region (of this version's layout);
 *             flags has a bit other than a VRANGE_DROP_* class, VRANGE_SHARED, VRANGE_MANAGED
 *             and VRANGE_SIGBUS, or two classes.
 *     EUSERS  32 mappings hold the region already (those of processes that died are
 *             released first).
 *     ENOTSUP (VRANGE_SIGBUS) userfaultfd cannot serve SIGBUS mode here.
 *     EACCES  fd is not open for reading and writing.
 *     ENOMEM, EMFILE
 *             Mapping the region or duplicating the descriptor failed.
 *
 *   vrange_stats()
 *     EINVAL  out is NULL, or size is smaller than the first version of struct vrange_stats.
 *
 *   vrange_set_option()
 *     EINVAL  name or value is NULL or not UTF-8, name is not one of the variables listed in
 *             ENVIRONMENT, or value is malformed or out of range for it. Nothing
 *             changes then.
 *
 *   vrange_cache_*()
 *     EINVAL  c is NULL or not a live cache; key (or val) is NULL with a non-zero length;
 *             options->size is smaller than two fields or options->flags has a bit other
 *             than VRANGE_MANAGED and VRANGE_CACHE_NO_PROBATION; priority is neither 0 nor one VRANGE_DROP_* value; out is NULL
 *             or size smaller than two fields; (vrange_cache_release()) value is not a value
 *             of this cache with a get outstanding (a second release of one get, an address
 *             inside a value, another cache's value); (vrange_cache_create()) slab_bytes is
 *             larger than 128 TiB; (vrange_cache_get(), vrange_cache_remove()) klen is
 *             larger than any object can be.
 *     ENOMEM  (vrange_cache_create(), vrange_cache_put()) mapping memory for values failed;
 *             (vrange_cache_put()) vlen or klen is larger than any memory could hold.
 *     ENOENT  (vrange_cache_get(), vrange_cache_remove()) no entry under key.
 *     ESTALE  (vrange_cache_get()) the system purged the value under memory pressure.
 *
 *   All functions
 *     ENOTRECOVERABLE
 *             An internal bug in libvrange (a Rust panic, caught at the ABI boundary).
 *
 * NOTES
 *   Constants
 *     VRANGE_VOLATILE (0) and VRANGE_NOVOLATILE (1) are the two values of mode;
 *     VRANGE_VOLATILE | VRANGE_SIGBUS marks in SIGBUS mode.
 *     VRANGE_FEATURE_* are the bits of vrange_feature_flags(); vrange_features() gives the
 *     same information (and more) as a human-readable table, as `vrange features` prints it.
 *     Without VRANGE_FEATURE_MADV_FREE marking still works and records state, but the
 *     kernel cannot discard anything: content is always kept and never reported purged.
 *
 *   Async-signal safety
 *     vrange(..., VRANGE_NOVOLATILE, ...) and vrange_unmark() are async-signal-safe: they do
 *     not allocate and take no lock. On arbitrary memory their only system calls are
 *     getpid(2) and an ioctl(PROCMAP_QUERY) on a cached /proc/self/maps descriptor (Linux 6.11
 *     and later; the descriptor is opened with open(2) on first use in a process, and again in
 *     a fork child), or, on kernels before 6.11, open(2)/read(2)/close(2) of /proc/self/maps;
 *     in regions they make none. A range holding whole 2 MiB blocks adds one
 *     ioctl(PAGEMAP_SCAN) per 128 MiB on a cached /proc/self/pagemap descriptor (Linux 6.7;
 *     opened like the maps descriptor): a block one huge-page entry maps is then proven by
 *     one write and plain reads of its other witness words. They may set errno; a signal handler should save and
 *     restore errno around the call.
 *     In a managed or hybrid region (shared ones included), an unmark waits, spinning and
 *     then yielding (sched_yield(2)), while another thread purges, arms, splits or frees the
 *     same range. A signal handler must therefore not unmark a range that the thread it
 *     interrupted may be purging (vrange_purge()), splitting (vrange() or
 *     vrange_set_priority() on part of a range) or freeing: it would wait forever.
 *     vrange(..., VRANGE_VOLATILE, ...) is NOT promised to be async-signal-safe: it may
 *     allocate the page-state table, probes the kernel on first use, and may start the
 *     reclaimer thread. vrange_alloc(), vrange_free(), vrange_set_priority(),
 *     vrange_shared_fd(), vrange_map_shared(), vrange_purge(), vrange_stats(),
 *     vrange_source_name(), vrange_set_option(), vrange_reclaimer_stop(), vrange_features(),
 *     vrange_feature_flags() and the vrange_cache_*() functions are not async-signal-safe
 *     either. vrange_fill() is async-signal-safe (fstat(2) and ioctl(2) calls); in a process
 *     that used SIGBUS mode, an unmark of memory outside managed regions adds one fstat(2)
 *     and one ioctl(2), and the unmark that reports a purge of a managed SIGBUS range adds
 *     the same to install its zero pages.
 *
 *   Threads
 *     All functions are thread-safe. Different threads may mark and unmark different pages
 *     concurrently. Concurrent mark and unmark of the SAME pages by different threads is a
 *     race in the caller: the result (which pages end up volatile, what is reported
 *     purged) is unspecified, but memory-safe.
 *
 *   fork(2)
 *     The child inherits its parent's regions, with their states, but no reclaimer thread:
 *     the child starts its own at its next managed mark, new region or vrange_purge(). The
 *     child's inherited mappings of shared regions hold no pin (the pins were the parent's,
 *     and stay so: the child's exit releases none of them): like a mapping made by
 *     vrange_map_shared(), unmark what it uses before using it; that unmark reports whether
 *     the content was purged.
 *
 *     For arbitrary memory and lazy regions the child inherits the volatile state and the
 *     content of every page. A volatile page is then shared copy-on-write: a purge by the
 *     kernel of a page that is still shared discards it for both processes (each one's next
 *     unmark reports it), and a write by either side, including an unmark (which writes to
 *     the page), gives that side a private copy whose fate is independent of the other's
 *     from then on. (A forced reclaim with MADV_PAGEOUT skips pages that are still shared;
 *     they become discardable again once only one process maps them.)
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
 * ENVIRONMENT
 *     Read once, when libvrange first needs its settings. vrange_set_option() changes them
 *     later, under the same names, and refuses with EINVAL what the environment would report.
 *
 *     A malformed value is reported once per process, in one line on standard error naming
 *     the variable, what it accepts and the value used instead (the default), and the default
 *     is kept:
 *
 *         vrange: VRANGE_POLL_MS=fast is not valid (milliseconds); using 100
 *
 *     Sizes are decimal bytes with an optional unit, B, K, KB, KiB, M, MB, MiB, G, GB, GiB,
 *     T, TB or TiB, in any case, whitespace allowed around the number and the unit ("64MiB",
 *     "2 g"); every unit is a power of 1024 (KB means KiB, as in jemalloc and ulimit). No
 *     sign, no fraction, nothing above 2^64 - 1. Milliseconds and percentages are decimal
 *     digits. Switches are on/off, yes/no, true/false or 1/0; keywords are read in any case.
 *
 *     VRANGE_RECLAIMER       on | off (default on). off: no reclaimer thread; only
 *                            vrange_purge() purges, and hybrid marks arm their ranges
 *                            (nothing else could give them back before the limit).
 *     VRANGE_ARM_DELAY_MS    Milliseconds a hybrid range stays volatile before it is armed
 *                            (default 1000).
 *     VRANGE_BUDGET          Resident volatile bytes of private managed and hybrid ranges
 *                            allowed before the least recently used are purged (default 0:
 *                            no budget).
 *     VRANGE_HEADROOM        auto | off | a size (default auto): purge when the memory
 *                            cgroup's limit minus its usage falls below it; auto is the
 *                            limit / 16, clamped to [4 MiB, 256 MiB].
 *     VRANGE_POLL_MS         Milliseconds between checks of headroom, budget and arming
 *                            (default 100); 0 means 1.
 *     VRANGE_PSI             "some|full STALL_US WINDOW_US" | off (default "some 100000
 *                            2000000"): the PSI trigger on the system and cgroup v2 memory
 *                            pressure files, with 0 < STALL_US <= WINDOW_US <= 10000000.
 *                            The window is rounded up to what the kernel accepts: at least
 *                            500 ms, and a multiple of 2 s without CAP_SYS_RESOURCE.
 *     VRANGE_VMPRESSURE      on | off (default on): cgroup v1 memory.pressure_level medium
 *                            and critical events.
 *     VRANGE_PRESSURE_SHARE  1 to 100 (default 25): percent of the volatile bytes purged per
 *                            PSI or medium event (critical purges everything).
 *     VRANGE_REFILL_MOVE     on | off (default on). off: refill regions copy each block into
 *                            place (UFFDIO_COPY) and give their oldest blocks back near the
 *                            limit, as before Linux 6.8, instead of moving pages
 *                            (UFFDIO_MOVE). Read once, at the first refill region; not an
 *                            option of vrange_set_option().
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
 *     A managed cache, marked and unmarked in O(1) whatever its size (fill() regenerates it):
 *
 *         size_t len = 64 << 20;
 *         char *cache = vrange_alloc(len, VRANGE_MANAGED | VRANGE_DROP_LOW);
 *         int purged;
 *
 *         if (cache == NULL)
 *             return 1;
 *         fill(cache, len);
 *         vrange((unsigned long)cache, len, VRANGE_VOLATILE, NULL);
 *         // ... the reclaimer may purge it when memory is short ...
 *         vrange((unsigned long)cache, len, VRANGE_NOVOLATILE, &purged);
 *         if (purged)
 *             fill(cache, len);                         // purged whole: it reads 0
 *         vrange_free(cache, len);
 *
 * SEE ALSO
 *     madvise(2) (MADV_FREE, MADV_PAGEOUT), mlock(2), memfd_create(2), ashmem (Android),
 *     Chromium's DiscardableSharedMemory, the 2014 volatile ranges patch series (vrange(2)),
 *     the kernel's Documentation/accounting/psi.rst.
 */

#ifndef VRANGE_H
#define VRANGE_H

#include <stddef.h>    /* size_t */
#include <stdint.h>    /* uint64_t, UINT64_C */
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header; vrange_version() returns the library's VRANGE_VERSION. */

#define VRANGE_VERSION_MAJOR 0
#define VRANGE_VERSION_MINOR 1
#define VRANGE_VERSION_PATCH 0
/** MAJOR * 10000 + MINOR * 100 + PATCH, as ZSTD_VERSION_NUMBER: 0.1.0 is 100. */
#define VRANGE_VERSION \
    (VRANGE_VERSION_MAJOR * 10000 + VRANGE_VERSION_MINOR * 100 + VRANGE_VERSION_PATCH)
#define VRANGE_QUOTE_(x) #x
#define VRANGE_EXPAND_AND_QUOTE_(x) VRANGE_QUOTE_(x)
/** "MAJOR.MINOR.PATCH", e.g. "0.1.0". */
#define VRANGE_VERSION_STRING                          \
    VRANGE_EXPAND_AND_QUOTE_(VRANGE_VERSION_MAJOR) "." \
    VRANGE_EXPAND_AND_QUOTE_(VRANGE_VERSION_MINOR) "." \
    VRANGE_EXPAND_AND_QUOTE_(VRANGE_VERSION_PATCH)

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
/** PAGEMAP_SCAN ioctl (Linux 6.7): one write proves a whole huge page at unmark. */
#define VRANGE_FEATURE_PAGEMAP_SCAN (UINT64_C(1) << 11)
/** UFFDIO_MOVE (Linux 6.8): refill regions move pages into place instead of copying them. */
#define VRANGE_FEATURE_UFFDIO_MOVE (UINT64_C(1) << 12)

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

/** Makes block [offset, offset + len) of a refill region into buf: 0 on success. */
typedef int (*vrange_refill_fn)(void *ctx, size_t offset, void *buf, size_t len);

/** Maps a refill region of length bytes in blocks of block bytes, made by fill(ctx, ...) on
 *  first access and whenever the system took a block back. flags is 0 or VRANGE_FILL_HERE.
 *  Returns its start, or NULL with errno set. Free it with vrange_free(). */
void *vrange_alloc_refill(size_t length, int flags, size_t block, vrange_refill_fn fill,
                          void *ctx);

/** Places len bytes from src into the purged (missing) pages of [dst, dst + len), SIGBUS-mode
 *  memory, page-aligned; present pages are left alone. Returns 0, or -1 with errno set.
 *  Async-signal-safe: a SIGBUS handler calls it for the faulting page and returns. */
int vrange_fill(void *dst, const void *src, size_t len);

/** Returns the VRANGE_FEATURE_* bits of the running kernel (probed once, then cached). */
uint64_t vrange_feature_flags(void);

/* Flags of vrange_alloc() (and, for the VRANGE_DROP_* bits, of vrange_map_shared() and the
 * priority of vrange_set_priority()). Bits no macro defines are reserved and must be 0. */

/** Policy (bits 0-1), the default: managed, and handed to the kernel after the arm delay. */
#define VRANGE_HYBRID 0
/** Policy: the kernel path (MADV_FREE at every mark, per-page proof at every unmark). */
#define VRANGE_LAZY 1
/** Policy: O(1) atomic mark and unmark; whole ranges purged by the reclaimer. */
#define VRANGE_MANAGED 2
/** A memfd-backed region that other processes can map (always managed). */
#define VRANGE_SHARED (1 << 2)
/** Reclaim class (bits 4-6, at most one): normal, the default. */
#define VRANGE_DROP_NORMAL 0
/** Reclaim class: purged before anything else (cheap to regenerate). */
#define VRANGE_DROP_FIRST (1 << 4)
/** Reclaim class: purged before normal ranges. */
#define VRANGE_DROP_LOW (1 << 5)
/** Reclaim class: purged only when nothing else is left (expensive to regenerate). */
#define VRANGE_DROP_LAST (1 << 6)
/** Private regions: base pages only (MADV_NOHUGEPAGE). */
#define VRANGE_NOHUGE (1 << 8)
/** Private regions: 2 MiB-aligned, transparent huge pages advised. */
#define VRANGE_HUGE (1 << 9)
/** A scratch region: always volatile, never marked; dropped pages read zero. Alone. */
#define VRANGE_SCRATCH (1 << 10)
/** SIGBUS mode: touching a purged page of a volatile range raises SIGBUS (see vrange_fill()).
 *  A vrange_alloc() flag, and a bit of vrange()'s mode with VRANGE_VOLATILE. */
#define VRANGE_SIGBUS (1 << 11)
/** struct vrange_cache_options flags: no probation (see vrange_cache_create()). */
#define VRANGE_CACHE_NO_PROBATION (1 << 12)
/** vrange_alloc_refill() flag: fill each block on the thread that touches it, in libvrange's
 *  SIGBUS handler (see vrange(3), Refill regions). */
#define VRANGE_FILL_HERE (1 << 13)

/** What made the reclaimer purge: the indices of struct vrange_stats's sources. */
enum vrange_source {
    VRANGE_SOURCE_PSI = 0,                 /**< PSI trigger on /proc/pressure/memory */
    VRANGE_SOURCE_PSI_CGROUP = 1,          /**< PSI trigger on the cgroup v2 memory.pressure */
    VRANGE_SOURCE_VMPRESSURE_MEDIUM = 2,   /**< cgroup v1 memory.pressure_level medium */
    VRANGE_SOURCE_VMPRESSURE_CRITICAL = 3, /**< cgroup v1 memory.pressure_level critical */
    VRANGE_SOURCE_HEADROOM = 4,            /**< cgroup limit minus usage under VRANGE_HEADROOM */
    VRANGE_SOURCE_BUDGET = 5,              /**< resident volatile bytes over VRANGE_BUDGET */
    VRANGE_SOURCE_EXPLICIT = 6,            /**< vrange_purge() */
    VRANGE_SOURCE_COUNT = 7                /**< number of sources */
};

/** Counters of one pressure source, since the process started. */
struct vrange_source_stats {
    uint64_t events;            /**< times it fired (polled ones: was found over threshold) */
    uint64_t ranges;            /**< ranges purged in response */
    uint64_t bytes;             /**< bytes purged in response */
    uint64_t reaction_last_ns;  /**< signal to bytes freed, last event that purged anything */
    uint64_t reaction_max_ns;   /**< the slowest such reaction */
    uint64_t reaction_total_ns; /**< sum over events that purged; divide by purging_events */
    uint64_t purging_events;    /**< events that purged anything */
};

/** A snapshot of managed purging in this process; see vrange_stats(). Gauges count managed and
 *  hybrid ranges (shared ones included; lazy regions and arbitrary memory are not counted). */
struct vrange_stats {
    uint64_t size;               /**< bytes vrange_stats() filled in */
    uint64_t volatile_ranges;    /**< volatile now (armed ones included) */
    uint64_t volatile_bytes;
    uint64_t armed_ranges;       /**< of those, handed to the kernel path (hybrid) */
    uint64_t armed_bytes;        /**< bytes handed to the kernel path in them */
    uint64_t purged_ranges;      /**< purged and not yet unmarked */
    uint64_t purged_bytes;
    uint64_t pinned_ranges;      /**< not volatile */
    uint64_t pinned_bytes;
    uint64_t purged_total_bytes; /**< purged by this process since it started, all sources */
    uint64_t armed_total_bytes;  /**< handed to the kernel path since the start */
    uint64_t losses_reported;    /**< unmarks of managed ranges that reported a purge */
    uint64_t reclaimer_running;  /**< 1 if the reclaimer thread runs, else 0 */
    uint64_t reclaimer_sources;  /**< bit (1 << VRANGE_SOURCE_*) per source it listens to */
    struct vrange_source_stats sources[VRANGE_SOURCE_COUNT]; /**< by VRANGE_SOURCE_* */
    /* Version 2 (appended; a caller passing the first version's size gets the fields above) */
    uint64_t scratch_regions;    /**< scratch regions live now */
    uint64_t scratch_bytes;      /**< bytes they reserve (address space, not resident memory) */
    uint64_t refill_fills;       /**< blocks of refill regions filled since the start */
    uint64_t refill_bytes;       /**< their bytes */
    uint64_t refill_failures;    /**< fills that failed (each raised SIGBUS) */
    /* Version 3 (appended) */
    uint64_t refill_recycled_bytes; /**< refill blocks' pages given back before a fill */
    /* Version 4 (appended) */
    uint64_t reserve_bytes;      /**< the armed reserve the reclaimer aimed for at its last look */
    uint64_t refill_moved_bytes; /**< refill blocks put in place by moving pages (UFFDIO_MOVE) */
};

/**
 * Maps a region of length bytes (rounded up to a page), zero-filled and pinned, with the
 * policy, class and huge-page choice of flags (0: hybrid, normal class, automatic huge pages).
 * Returns its page-aligned start, or NULL with errno set. Free it with vrange_free().
 */
void *vrange_alloc(size_t length, int flags);

/** Unmaps the region that addr and length (rounded up to a page) name exactly, volatile or
 *  not. Returns 0, or -1 with errno EINVAL if they name no live region. */
int vrange_free(void *addr, size_t length);

/** Sets the reclaim class of [addr, addr + length), inside one region, to priority: 0 or one
 *  VRANGE_DROP_* value. Returns 0, or -1 with errno set. */
int vrange_set_priority(void *addr, size_t length, int priority);

/** Returns the memfd of the shared region holding addr (borrowed: do not close it; valid until
 *  vrange_free() of the region), or -1 with errno EINVAL for any other address. */
int vrange_shared_fd(void *addr);

/**
 * Maps the shared region behind fd (from vrange_shared_fd(), in this or another process) with
 * the class of flags' VRANGE_DROP_* bit, stores its length in *length (if not NULL) and returns
 * its start, or NULL with errno set. The mapping holds no pin: unmark it before use.
 */
void *vrange_map_shared(int fd, int flags, size_t *length);

/** Purges whole volatile managed and hybrid ranges, lowest class and least recently used
 *  first, until at least bytes bytes are freed or none is left. Returns the bytes freed. */
size_t vrange_purge(size_t bytes);

/** Fills *out (size: sizeof(struct vrange_stats)) with a snapshot of managed purging. Returns
 *  0, or -1 with errno EINVAL for a NULL out or a size smaller than the first version. */
int vrange_stats(struct vrange_stats *out, size_t size);

/** The short name of a VRANGE_SOURCE_* value (a static string), or NULL with errno EINVAL. */
const char *vrange_source_name(int source);

/** Sets a VRANGE_* setting (see ENVIRONMENT) at run time. Returns 0, or -1 with errno EINVAL
 *  for an unknown name or a malformed value. */
int vrange_set_option(const char *name, const char *value);

/** Stops the reclaimer thread and waits for it; the next managed mark, new region or
 *  vrange_purge() starts it again (unless VRANGE_RECLAIMER is off). */
void vrange_reclaimer_stop(void);

/** A cache of byte strings in volatile memory; see Caches in vrange(3). Opaque. */
struct vrange_cache;

/** How vrange_cache_create() makes a cache; a 0 field means its default. */
struct vrange_cache_options {
    uint64_t size;       /**< sizeof(struct vrange_cache_options) */
    uint64_t slab_bytes; /**< bytes per slab (default 256 KiB, 64 KiB to 128 TiB) */
    uint64_t budget;     /**< resident bytes kept at most by the cache itself (0: none) */
    uint64_t flags;      /**< 0 (hybrid slabs) or VRANGE_MANAGED, | VRANGE_CACHE_NO_PROBATION */
};

/** A cache's figures for one reclaim class. */
struct vrange_cache_class_stats {
    uint64_t hits;           /**< gets that returned a value of this class */
    uint64_t inserts;        /**< values put */
    uint64_t purged_lookups; /**< gets that found the value purged (ESTALE) */
    uint64_t purged_entries; /**< entries the system purged (looked up or not) */
    uint64_t purged_bytes;   /**< their value bytes */
    uint64_t resident_bytes; /**< at most resident: written pages of slabs not known purged */
    uint64_t value_bytes;    /**< value bytes of live entries in them */
    uint64_t slabs;          /**< slabs (regions) */
};

/** A cache's statistics; see vrange_cache_stats(). */
struct vrange_cache_stats {
    uint64_t size;           /**< bytes vrange_cache_stats() filled in */
    uint64_t entries;        /**< entries held (purged ones not yet looked up excluded) */
    uint64_t hits;
    uint64_t misses;         /**< gets that said ENOENT */
    uint64_t purged_lookups; /**< gets that said ESTALE */
    uint64_t resident_bytes; /**< at most resident: written pages of slabs not known purged */
    uint64_t value_bytes;
    uint64_t overhead_bytes; /**< resident bytes holding no live value */
    uint64_t purged_bytes;
    uint64_t dropped_purged; /**< purged entries dropped unseen (too many piled up) */
    struct vrange_cache_class_stats classes[4]; /**< DROP_FIRST, DROP_LOW, normal, DROP_LAST */
    /* Appended after the first release: a smaller size leaves them out. */
    uint64_t mapped_bytes;   /**< address space of slabs not known purged (not memory use) */
    uint64_t pinned_bytes;   /**< bytes no purge can take now: pages under held values */
    uint64_t promoted[4];    /**< per class (as classes): values moved off probation by a hit */
    uint64_t recycled[4];    /**< per class: slabs whose pages a new slab took, memory short */
    uint64_t carried[4];     /**< per class: read values an eviction copied into a new slab */
};

/** Makes a cache (options NULL: the defaults). Returns it, or NULL with errno set. */
struct vrange_cache *vrange_cache_create(const struct vrange_cache_options *options);

/** Copies vlen bytes at val under the klen bytes at key, class priority (0 or a VRANGE_DROP_*
 *  value). Returns 0, or -1 with errno set. */
int vrange_cache_put(struct vrange_cache *c, const void *key, size_t klen, const void *val,
                     size_t vlen, int priority);

/** The value under key, pinned until vrange_cache_release(); its length in *vlen. NULL with
 *  errno ENOENT (absent) or ESTALE (purged by the system; the entry is dropped). */
const void *vrange_cache_get(struct vrange_cache *c, const void *key, size_t klen,
                             size_t *vlen);

/** Releases a value from vrange_cache_get(), once per get. Returns 0, or -1 with errno EINVAL
 *  (not a value of this cache with a get outstanding; no other value's pin is touched). */
int vrange_cache_release(struct vrange_cache *c, const void *value);

/** Removes the entry under key. Returns 0, or -1 with errno ENOENT if there was none. */
int vrange_cache_remove(struct vrange_cache *c, const void *key, size_t klen);

/** Fills *out (size: sizeof(struct vrange_cache_stats)). Returns 0, or -1 with errno set. */
int vrange_cache_stats(struct vrange_cache *c, struct vrange_cache_stats *out, size_t size);

/** Frees the cache. Values still held stay readable and are leaked; every later call with c
 *  fails with EINVAL (the handle's 16 bytes stay allocated for that). */
void vrange_cache_destroy(struct vrange_cache *c);

/** A page cache for SQLite whose unpinned pages are volatile: a `const struct
 *  sqlite3_pcache_methods2 *` for sqlite3_config(SQLITE_CONFIG_PCACHE2, ...). */
const void *vrange_sqlite_pcache(void);

/** The running library's version: its VRANGE_VERSION (compare with this header's). */
unsigned vrange_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* VRANGE_H */
