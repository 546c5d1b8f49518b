/*
 * C ABI test of libvrange: compiled against include/vrange.h, linked with libvrange.so.
 *
 *     cc -std=c11 -Wall -Wextra -Werror tests/c/test_vrange.c \
 *        $(PKG_CONFIG_PATH=target/debug pkg-config --cflags --libs vrange) -o test_vrange
 *
 * Purges are forced deterministically with madvise(MADV_PAGEOUT): a volatile (lazy-free),
 * clean page is discarded at once, while a dirty or pinned page is kept. The process pins
 * itself to one CPU so that the kernel's per-CPU LRU batches that MADV_FREE fills are drained
 * by the MADV_PAGEOUT that follows.
 *
 * Output is TAP-like: one "ok - ..." or "not ok - ..." line per check, the plan at the end.
 * Exit status is 0 only if every check passed.
 */

#define _GNU_SOURCE

#include <vrange.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#ifndef MADV_NOHUGEPAGE
#define MADV_NOHUGEPAGE 15
#endif

#include "tap.h"

static void *map_flags(size_t pages, int prot, int flags)
{
	void *p = mmap(NULL, pages * page, prot, flags, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	/* Keep every mapping in base pages so that single-page purges are exact. */
	(void)madvise(p, pages * page, MADV_NOHUGEPAGE);
	return p;
}

static void *map_anon(size_t pages)
{
	return map_flags(pages, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
}

static void unmap(void *p, size_t pages)
{
	munmap(p, pages * page);
}

/* Forces the kernel to reclaim one page now: a clean volatile page is discarded. */
static int force_purge(void *p, size_t pages)
{
	return madvise(p, pages * page, MADV_PAGEOUT) == 0;
}

static int mark(void *p, size_t len)
{
	return vrange(addr(p), len, VRANGE_VOLATILE, NULL) == (ssize_t)len;
}

/* Checks that ret is -1 with errno `want`. */
static void expect_error(ssize_t ret, int err, int want, const char *what)
{
	check(ret == -1 && err == want, "%s -> -1/%s (got %zd, errno %d: %s)", what,
	      want == EINVAL ? "EINVAL" : want == ENOMEM ? "ENOMEM" : "?", ret, err,
	      strerror(err));
}

/* ---------------------------------------------------------------------------------------- */

/* Calls vrange() and expects it to fail with errno `want`. */
static void expect_vrange_error(unsigned long start, size_t length, int mode, int *purged, int want,
				const char *what)
{
	ssize_t r;

	errno = 0;
	r = vrange(start, length, mode, purged);
	expect_error(r, errno, want, what);
}

static void test_mark_and_purge(void)
{
	const size_t n = 16;
	char *a = map_anon(n);
	char *c = map_anon(n);
	size_t count = 99;
	int purged = 42;
	ssize_t r;

	fill(a, n * page, 1);
	fill(c, n * page, 2);
	r = vrange(addr(a), n * page, VRANGE_VOLATILE, NULL);
	check(r == (ssize_t)(n * page), "mark returns the byte count (%zd)", r);
	r = vrange(addr(c), 3 * page + 1, VRANGE_VOLATILE, NULL);
	check(r == (ssize_t)(4 * page), "mark rounds the length up to a page (%zd)", r);
	check(mark(c, n * page), "marking an overlapping, partly volatile range succeeds");
	check(intact_at(a, 0, n * page, 1), "reading volatile memory shows the original bytes");

	if (!can_purge) {
		skip("forced purges are reported exactly", "MADV_FREE or MADV_PAGEOUT missing");
		vrange_unmark(a, n * page, NULL); /* never unmap volatile memory */
		vrange_unmark(c, n * page, NULL);
		unmap(a, n);
		unmap(c, n);
		return;
	}

	/* Purge the even pages of a and pages {1, 5, 6, 7, 12} of c. */
	int ok = 1;
	for (size_t i = 0; i < n; i += 2)
		ok &= force_purge(pg(a, i), 1);
	ok &= force_purge(pg(c, 1), 1) & force_purge(pg(c, 5), 3) & force_purge(pg(c, 12), 1);
	check(ok, "madvise(MADV_PAGEOUT) accepted");
	ok = 1;
	for (size_t i = 0; i < n; i += 2)
		ok &= is_zero(pg(a, i), page);
	check(ok, "purged pages read zero while still volatile");

	r = vrange(addr(a), 2 * page, VRANGE_NOVOLATILE, &purged);
	check(r == (ssize_t)(2 * page) && purged == 1,
	      "VRANGE_NOVOLATILE over one purged and one intact page: purged=1 (ret %zd, purged %d)",
	      r, purged);
	r = vrange_unmark(pg(a, 2), (n - 2) * page, &count);
	check(r == (ssize_t)((n - 2) * page) && count == 7,
	      "vrange_unmark counts exactly the purged pages (7, got %zu, ret %zd)", count, r);
	r = vrange_unmark(a, n * page, &count);
	check(r == (ssize_t)(n * page) && count == 0,
	      "a purge is reported once: unmarking the pinned range reports 0 (got %zu)", count);
	ok = 1;
	for (size_t i = 0; i < n; i++)
		ok &= i % 2 ? intact_at(a, i * page, page, 1) : is_zero(pg(a, i), page);
	check(ok, "after unmark: purged pages read zero, the others kept their bytes");

	r = vrange_unmark(c, n * page, &count);
	check(r == (ssize_t)(n * page) && count == 5,
	      "vrange_unmark of a whole range: exact purged page count (5, got %zu)", count);
	ok = 1;
	for (size_t i = 0; i < n; i++) {
		int lost = i == 1 || (i >= 5 && i <= 7) || i == 12;
		ok &= lost ? is_zero(pg(c, i), page) : intact_at(c, i * page, page, 2);
	}
	check(ok, "vrange_unmark: purged pages zero, others intact");

	/* Whole range through vrange(): purged = 1. */
	fill(a, n * page, 3);
	check(mark(a, n * page), "re-marking an unmarked range");
	ok = force_purge(pg(a, 9), 1);
	purged = 42;
	r = vrange(addr(a), n * page, VRANGE_NOVOLATILE, &purged);
	check(ok && r == (ssize_t)(n * page) && purged == 1,
	      "VRANGE_NOVOLATILE of a range with one purged page: purged=1 (got %d)", purged);
	check(is_zero(pg(a, 9), page) && intact_at(a, 0, 9 * page, 3) &&
		      intact_at(a, 10 * page, 6 * page, 3),
	      "only the purged page lost its bytes");

	unmap(a, n);
	unmap(c, n);
}

static void test_no_purge(void)
{
	const size_t n = 8;
	char *a = map_anon(n);
	int purged = 42;
	size_t count = 99;
	ssize_t r;

	fill(a, n * page, 4);
	check(mark(a, n * page), "mark without pressure");
	r = vrange(addr(a), n * page, VRANGE_NOVOLATILE, &purged);
	check(r == (ssize_t)(n * page) && purged == 0,
	      "mark + unmark without purge: purged=0 (ret %zd, purged %d)", r, purged);
	check(intact_at(a, 0, n * page, 4), "mark + unmark without purge: content intact");

	check(mark(a, n * page), "mark again");
	r = vrange_unmark(a, n * page, &count);
	check(r == (ssize_t)(n * page) && count == 0, "vrange_unmark without purge: 0 pages");

	if (can_purge) {
		/* Pinned pages are not discarded by a forced reclaim (no swap: they stay). */
		force_purge(a, n);
		check(intact_at(a, 0, n * page, 4), "unmarked pages survive MADV_PAGEOUT");
	}

	purged = 42;
	r = vrange(addr(a), n * page, VRANGE_NOVOLATILE, &purged);
	check(r == (ssize_t)(n * page) && purged == 0, "unmarking a pinned range: purged=0");

	char *b = map_anon(2);
	purged = 42;
	r = vrange(addr(b), 2 * page, VRANGE_NOVOLATILE, &purged);
	check(r == (ssize_t)(2 * page) && purged == 0, "unmarking never-marked memory: purged=0");

	unmap(a, n);
	unmap(b, 2);
}

static void test_semantics(void)
{
	size_t count = 99;
	ssize_t r;

	if (!can_purge) {
		skip("re-mark, zero-page and write semantics", "MADV_FREE or MADV_PAGEOUT missing");
		return;
	}

	/* Marking an already volatile range keeps a purge for the next unmark. */
	char *a = map_anon(4);
	fill(a, 4 * page, 5);
	check(mark(a, 4 * page), "mark");
	force_purge(pg(a, 3), 1);
	check(mark(a, 4 * page), "mark the same range again after a purge");
	r = vrange_unmark(a, 4 * page, &count);
	check(r == (ssize_t)(4 * page) && count == 1,
	      "re-marking keeps the purge: reported at the next unmark (1, got %zu)", count);
	check(is_zero(pg(a, 3), page) && intact_at(a, 0, 3 * page, 5),
	      "re-marked range: purged page zero, others intact");
	unmap(a, 4);

	/* A page all zero when marked is reported intact. */
	char *z = map_anon(4);
	fill(z, page, 6); /* page 0 has data; pages 1-3 are zero (page 1 touched, 2-3 not) */
	memset(pg(z, 1), 0, page);
	check(mark(z, 4 * page), "mark a range of mostly zero pages");
	force_purge(z, 4);
	r = vrange_unmark(z, 4 * page, &count);
	check(r == (ssize_t)(4 * page) && count == 1,
	      "zero pages are reported intact; only the data page is purged (1, got %zu)", count);
	check(is_zero(z, 4 * page), "everything reads zero afterwards");
	unmap(z, 4);

	/* Writes into a volatile page keep that page. */
	char *w = map_anon(4);
	fill(w, 4 * page, 7);
	check(mark(w, 4 * page), "mark");
	((volatile uint64_t *)pg(w, 1))[5] = 0x1234;
	force_purge(w, 4);
	r = vrange_unmark(w, 4 * page, &count);
	((uint64_t *)pg(w, 1))[5] = pattern(7, page / 8 + 5); /* restore for the comparison */
	check(r == (ssize_t)(4 * page) && count == 3,
	      "a page written while volatile is kept; the other 3 are purged (got %zu)", count);
	check(intact_at(w, page, page, 7), "the written page kept its bytes");
	unmap(w, 4);
}

static void test_errors(void)
{
	char *a = map_anon(4);
	int purged = 42;
	size_t count = 42;
	ssize_t r;
	int e;

	fill(a, 4 * page, 8);

	expect_vrange_error(addr(a) + 8, page, VRANGE_VOLATILE, NULL, EINVAL, "unaligned start (VRANGE_VOLATILE)");
	expect_vrange_error(addr(a) + 8, page, VRANGE_NOVOLATILE, &purged, EINVAL, "unaligned start (VRANGE_NOVOLATILE)");
	check(purged == 42, "*purged is left unchanged on error");
	errno = 0;
	r = vrange_unmark(a + 8, page, &count);
	e = errno;
	expect_error(r, e, EINVAL, "unaligned start (vrange_unmark)");
	check(count == 42, "*purged_pages is left unchanged on error");
	expect_vrange_error(addr(a), page, 7, &purged, EINVAL, "bad mode 7");
	expect_vrange_error(addr(a), page, -1, NULL, EINVAL, "bad mode -1");
	expect_vrange_error(ULONG_MAX & ~(unsigned long)(page - 1), page, VRANGE_VOLATILE, NULL, EINVAL, "overflow: start near ULONG_MAX");
	expect_vrange_error(addr(a), SIZE_MAX, VRANGE_NOVOLATILE, NULL, EINVAL, "overflow: length SIZE_MAX");
	expect_vrange_error(addr(a), (size_t)SSIZE_MAX + 1, VRANGE_VOLATILE, NULL, EINVAL, "length above SSIZE_MAX");
#if ULONG_MAX > 0xffffffffUL
	expect_vrange_error(1UL << 48, page, VRANGE_VOLATILE, NULL, EINVAL, "range at 2^48");
#endif
	if (can_purge)
		force_purge(a, 4);
	count = 99;
	check(intact_at(a, 0, 4 * page, 8) && vrange_unmark(a, 4 * page, &count) > 0 && count == 0,
	      "failed calls marked nothing");

	/* A hole: the middle page of three is unmapped. */
	char *h = map_anon(3);
	fill(h, 3 * page, 9);
	munmap(pg(h, 1), page);
	expect_vrange_error(addr(h), 3 * page, VRANGE_VOLATILE, NULL, ENOMEM, "range with an unmapped page (VRANGE_VOLATILE)");
	expect_vrange_error(addr(h), 3 * page, VRANGE_NOVOLATILE, &purged, ENOMEM, "range with an unmapped page (VRANGE_NOVOLATILE)");
	errno = 0;
	r = vrange_unmark(pg(h, 1), page, NULL);
	e = errno;
	expect_error(r, e, ENOMEM, "unmapped page (vrange_unmark)");
	if (can_purge) {
		force_purge(h, 1);
		check(intact_at(h, 0, page, 9), "nothing was marked by the failed call");
	}
	munmap(h, page);
	munmap(pg(h, 2), page);

	/* Shared anonymous memory. */
	char *s = map_flags(2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS);
	expect_vrange_error(addr(s), 2 * page, VRANGE_VOLATILE, NULL, EINVAL, "MAP_SHARED anonymous memory (VRANGE_VOLATILE)");
	expect_vrange_error(addr(s), 2 * page, VRANGE_NOVOLATILE, NULL, EINVAL, "MAP_SHARED anonymous memory (VRANGE_NOVOLATILE)");
	unmap(s, 2);

	/* Read-only and PROT_NONE memory. */
	char *ro = map_flags(2, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS);
	expect_vrange_error(addr(ro), 2 * page, VRANGE_VOLATILE, NULL, EINVAL, "read-only mapping");
	unmap(ro, 2);
	char *none = map_flags(2, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS);
	expect_vrange_error(addr(none), 2 * page, VRANGE_VOLATILE, NULL, EINVAL, "PROT_NONE mapping");
	unmap(none, 2);

	/* A range whose middle page is read-only: nothing is marked. */
	char *m = map_anon(3);
	fill(m, 3 * page, 10);
	mprotect(pg(m, 1), page, PROT_READ);
	expect_vrange_error(addr(m), 3 * page, VRANGE_VOLATILE, NULL, EINVAL, "range with a read-only page in the middle");
	if (can_purge)
		force_purge(m, 1);
	count = 99;
	check(vrange_unmark(m, page, &count) == (ssize_t)page && count == 0 &&
		      intact_at(m, 0, page, 10),
	      "its first page was not marked");
	unmap(m, 3);

	/* A private file mapping. */
	const char *tmp = getenv("TMPDIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/vrange-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	int fd = mkstemp(path);
	if (fd < 0 || ftruncate(fd, (off_t)(2 * page)) != 0) {
		check(0, "create a temporary file: %s", strerror(errno));
	} else {
		char *f = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
		if (f == MAP_FAILED) {
			check(0, "mmap a temporary file: %s", strerror(errno));
		} else {
			f[0] = 1; /* a private copy of the first page: still file-backed */
			errno = 0;
			r = vrange(addr(f), 2 * page, VRANGE_VOLATILE, NULL);
			e = errno;
			expect_error(r, e, EINVAL, "file-backed MAP_PRIVATE mapping");
			errno = 0;
			r = vrange_unmark(f, 2 * page, NULL);
			e = errno;
			expect_error(r, e, EINVAL, "file-backed MAP_PRIVATE mapping (vrange_unmark)");
			munmap(f, 2 * page);
		}
	}
	if (fd >= 0) {
		close(fd);
		unlink(path);
	}

	unmap(a, 4);
}

static void test_mlock(void)
{
	char *a = map_anon(4);
	int purged = 42;
	size_t count = 42;
	ssize_t r;
	int e;

	fill(a, 4 * page, 11);
	if (mlock(a, 4 * page) != 0) {
		skip("mlock'd memory is refused", strerror(errno));
		unmap(a, 4);
		return;
	}
	expect_vrange_error(addr(a), 4 * page, VRANGE_VOLATILE, NULL, EINVAL, "mlock'd memory (VRANGE_VOLATILE)");
	r = vrange(addr(a), 4 * page, VRANGE_NOVOLATILE, &purged);
	check(r == (ssize_t)(4 * page) && purged == 0 && intact_at(a, 0, 4 * page, 11),
	      "mlock'd memory is left not volatile: unmark reports purged=0, data intact");
	munlock(a, 4 * page);

	/* Only page 2 locked: madvise may free pages 0-1 before failing; they must be pinned. */
	if (mlock(pg(a, 2), page) != 0) {
		skip("partly mlock'd range", strerror(errno));
		unmap(a, 4);
		return;
	}
	expect_vrange_error(addr(a), 4 * page, VRANGE_VOLATILE, NULL, EINVAL, "range with one mlock'd page");
	if (can_purge)
		force_purge(a, 2);
	r = vrange_unmark(a, 4 * page, &count);
	check(r == (ssize_t)(4 * page) && count == 0 && intact_at(a, 0, 4 * page, 11),
	      "the whole range was pinned again: forced reclaim lost nothing (purged %zu)", count);
	munlock(pg(a, 2), page);

	/* A purge that happened before a refused mark must still be reported. */
	if (can_purge && mlock(pg(a, 3), page) == 0) {
		fill(a, 4 * page, 16);
		check(mark(a, 2 * page), "mark pages 0-1");
		force_purge(a, 1);
		errno = 0;
		r = vrange(addr(a), 4 * page, VRANGE_VOLATILE, NULL);
		e = errno;
		expect_error(r, e, EINVAL, "re-mark over an mlock'd page");
		count = 99;
		r = vrange_unmark(a, 4 * page, &count);
		check(r == (ssize_t)(4 * page) && count == 1 && is_zero(a, page),
		      "a purge before a refused mark is still reported at the next unmark");
		munlock(pg(a, 3), page);
	}
	unmap(a, 4);
}

static void test_forget(void)
{
	char *a = map_anon(4);
	size_t count = 99;
	ssize_t r;
	int e;

	fill(a, 4 * page, 17);
	check(mark(a, 4 * page), "mark 4 pages before forgetting them");
	if (can_purge)
		force_purge(a, 4);
	check(vrange_forget(a, 4 * page) == 0, "vrange_forget returns 0");
	r = vrange_unmark(a, 4 * page, &count);
	check(r == (ssize_t)(4 * page) && count == 0, "after vrange_forget no state is left to report");
	errno = 0;
	r = vrange_forget(a + 1, page);
	e = errno;
	expect_error(r, e, EINVAL, "vrange_forget with an unaligned start");
	unmap(a, 4);
	check(vrange_forget(a, 4 * page) == 0, "vrange_forget accepts unmapped memory");
}

static void test_zero_length_and_null(void)
{
	char *a = map_anon(2);
	int purged = 42;
	size_t count = 42;
	ssize_t r;

	fill(a, 2 * page, 12);
	check(vrange(addr(a), 0, VRANGE_VOLATILE, NULL) == 0, "zero length: mark returns 0");
	r = vrange(addr(a), 0, VRANGE_NOVOLATILE, &purged);
	check(r == 0 && purged == 0, "zero length: unmark returns 0, purged=0");
	r = vrange_unmark(a, 0, &count);
	check(r == 0 && count == 0, "zero length: vrange_unmark returns 0, 0 pages");

	char *gone = map_anon(1);
	unmap(gone, 1);
	check(vrange(addr(gone), 0, VRANGE_VOLATILE, NULL) == 0,
	      "zero length does nothing, even on unmapped memory");
	errno = 0;
	r = vrange(addr(a) + 1, 0, VRANGE_VOLATILE, NULL);
	int e = errno;
	expect_error(r, e, EINVAL, "zero length with an unaligned start");

	check(mark(a, 2 * page), "mark");
	check(vrange(addr(a), page, VRANGE_NOVOLATILE, NULL) == (ssize_t)page,
	      "purged NULL accepted by vrange");
	check(vrange_unmark(pg(a, 1), page, NULL) == (ssize_t)page,
	      "purged_pages NULL accepted by vrange_unmark");
	check(intact_at(a, 0, 2 * page, 12), "content intact");
	unmap(a, 2);
}

static void test_malloc(void)
{
	const size_t n = 16;
	void *mem = NULL;
	size_t count = 99;
	ssize_t r;

	if (posix_memalign(&mem, page, n * page) != 0) {
		check(0, "posix_memalign");
		return;
	}
	char *a = mem;
	(void)madvise(a, n * page, MADV_NOHUGEPAGE);
	fill(a, n * page, 13);
	r = vrange(addr(a), n * page, VRANGE_VOLATILE, NULL);
	check(r == (ssize_t)(n * page), "malloc'd memory can be marked (ret %zd)", r);
	if (can_purge) {
		for (size_t i = 0; i < n; i += 2)
			force_purge(pg(a, i), 1);
		r = vrange_unmark(a, n * page, &count);
		check(r == (ssize_t)(n * page) && count == n / 2,
		      "malloc'd memory: exact purged count (%zu, got %zu)", n / 2, count);
		int ok = 1;
		for (size_t i = 0; i < n; i++)
			ok &= i % 2 ? intact_at(a, i * page, page, 13) : is_zero(pg(a, i), page);
		check(ok, "malloc'd memory: purged pages zero, others intact");
	} else {
		r = vrange_unmark(a, n * page, &count);
		check(r == (ssize_t)(n * page) && count == 0 && intact_at(a, 0, n * page, 13),
		      "malloc'd memory: unmark");
	}
	free(mem);
}

static void test_fork(void)
{
	char *a = map_anon(4);
	fill(a, 4 * page, 14);
	check(mark(a, 4 * page), "mark before fork");

	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		check(0, "fork: %s", strerror(errno));
		unmap(a, 4);
		return;
	}
	if (pid == 0) {
		/* Child: its first call must check the child's mappings, not its parent's (the
		 * cached /proc/self/maps descriptor names the parent)... */
		size_t count = 99;
		int status = 0;
		munmap(pg(a, 3), page);
		errno = 0;
		if (vrange_unmark(a, 4 * page, NULL) != -1 || errno != ENOMEM)
			status |= 4;
		/* ...and the state and content are inherited. */
		if (vrange_unmark(a, 3 * page, &count) != (ssize_t)(3 * page) || count != 0)
			status |= 1;
		if (!intact_at(a, 0, 3 * page, 14))
			status |= 2;
		_exit(status);
	}
	int status = -1;
	waitpid(pid, &status, 0);
	check(WIFEXITED(status) && (WEXITSTATUS(status) & 1) == 0,
	      "fork child: unmark reports nothing purged");
	check(WIFEXITED(status) && (WEXITSTATUS(status) & 2) == 0,
	      "fork child: inherited content intact");
	check(WIFEXITED(status) && (WEXITSTATUS(status) & 4) == 0,
	      "fork child: range checks see the child's own mappings (ENOMEM after munmap)");
	size_t count = 99;
	ssize_t r = vrange_unmark(a, 4 * page, &count);
	check(r == (ssize_t)(4 * page) && count == 0 && intact_at(a, 0, 4 * page, 14),
	      "parent after fork: its range is unaffected by the child");
	unmap(a, 4);
}

static char *sig_range;
static volatile sig_atomic_t sig_ret1, sig_ret2, sig_purged, sig_count;

static void on_signal(int sig)
{
	int saved = errno;
	int purged = -1;
	size_t count = 99;

	(void)sig;
	sig_ret1 = (sig_atomic_t)vrange(addr(sig_range), 2 * page, VRANGE_NOVOLATILE, &purged);
	sig_purged = purged;
	sig_ret2 = (sig_atomic_t)vrange_unmark(pg(sig_range, 2), 2 * page, &count);
	sig_count = (sig_atomic_t)count;
	errno = saved;
}

static void test_signal(void)
{
	struct sigaction sa;

	sig_range = map_anon(4);
	fill(sig_range, 4 * page, 15);
	check(mark(sig_range, 4 * page), "mark before the signal");
	if (can_purge)
		force_purge(sig_range, 1);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	raise(SIGUSR1);
	signal(SIGUSR1, SIG_DFL);
	check(sig_ret1 == (sig_atomic_t)(2 * page) && sig_purged == (can_purge ? 1 : 0),
	      "VRANGE_NOVOLATILE from a signal handler (ret %d, purged %d)", (int)sig_ret1,
	      (int)sig_purged);
	check(sig_ret2 == (sig_atomic_t)(2 * page) && sig_count == 0,
	      "vrange_unmark from a signal handler (ret %d, count %d)", (int)sig_ret2,
	      (int)sig_count);
	check(intact_at(sig_range, page, 3 * page, 15), "content intact");
	unmap(sig_range, 4);
}

/*
 * The value column of the row `name` of the feature report, or NULL. Rows are
 * "name: value", the values aligned.
 */
static const char *row(const char *text, const char *name)
{
	size_t len = strlen(name);

	for (const char *line = text; line && *line;) {
		if (strncmp(line, name, len) == 0 && line[len] == ':') {
			const char *v = line + len + 1;
			while (*v == ' ')
				v++;
			return v;
		}
		line = strchr(line, '\n');
		if (line)
			line++;
	}
	return NULL;
}

static int starts(const char *s, const char *prefix)
{
	return s && strncmp(s, prefix, strlen(prefix)) == 0;
}

static void test_features(uint64_t flags)
{
	ssize_t n = vrange_features(NULL, 0);
	check(n > 0, "vrange_features(NULL, 0) returns the report length (%zd)", n);
	if (n <= 0)
		return;

	char *buf = malloc((size_t)n + 1);
	memset(buf, 'x', (size_t)n + 1);
	ssize_t m = vrange_features(buf, (size_t)n + 1);
	check(m == n && strlen(buf) == (size_t)n && strstr(buf, "MADV_FREE") != NULL,
	      "vrange_features fills the buffer, NUL-terminated");

	char small[16];
	memset(small, 'x', sizeof small);
	m = vrange_features(small, sizeof small);
	check(m == n && strlen(small) == sizeof small - 1 &&
		      strncmp(small, buf, sizeof small - 1) == 0,
	      "vrange_features truncates like snprintf and returns the full length");

	check((flags & VRANGE_FEATURE_MADV_FREE) != 0, "vrange_feature_flags has MADV_FREE");
	check((flags >> 13) == 0, "no feature bits above VRANGE_FEATURE_UFFDIO_MOVE (flags %#llx)",
	      (unsigned long long)flags);

	/* Each bit agrees with its row of the report: the bit order of the header is right. */
	const char *thp = row(buf, "THP");
	const char *memcg = row(buf, "memory cgroup");
	struct {
		const char *name;
		uint64_t bit;
		int on;
	} rows[] = {
		{"MADV_FREE", VRANGE_FEATURE_MADV_FREE, starts(row(buf, "MADV_FREE"), "yes")},
		{"MADV_PAGEOUT", VRANGE_FEATURE_MADV_PAGEOUT, starts(row(buf, "MADV_PAGEOUT"), "yes")},
		{"MADV_POPULATE_WRITE", VRANGE_FEATURE_MADV_POPULATE_WRITE,
		 starts(row(buf, "MADV_POPULATE_WRITE"), "yes")},
		{"THP", VRANGE_FEATURE_THP, starts(thp, "always") || starts(thp, "madvise")},
		{"PT_RECLAIM", VRANGE_FEATURE_PT_RECLAIM, starts(row(buf, "PT_RECLAIM"), "yes")},
		{"PROCMAP_QUERY", VRANGE_FEATURE_PROCMAP_QUERY,
		 starts(row(buf, "PROCMAP_QUERY"), "yes")},
		{"userfaultfd", VRANGE_FEATURE_USERFAULTFD, starts(row(buf, "userfaultfd"), "yes")},
		{"MAP_DROPPABLE", VRANGE_FEATURE_MAP_DROPPABLE,
		 starts(row(buf, "MAP_DROPPABLE"), "yes")},
		{"process_madvise", VRANGE_FEATURE_PROCESS_MADVISE,
		 starts(row(buf, "process_madvise"), "yes")},
		{"PSI", VRANGE_FEATURE_PSI, starts(row(buf, "PSI"), "yes")},
		{"memory cgroup", VRANGE_FEATURE_MEMCG, memcg != NULL && !starts(memcg, "none")},
		{"PAGEMAP_SCAN", VRANGE_FEATURE_PAGEMAP_SCAN, starts(row(buf, "PAGEMAP_SCAN"), "yes")},
		{"UFFDIO_MOVE", VRANGE_FEATURE_UFFDIO_MOVE, starts(row(buf, "UFFDIO_MOVE"), "yes")},
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
		check(((flags & rows[i].bit) != 0) == (rows[i].on != 0),
		      "feature bit %s (%#llx) matches the report (%s)", rows[i].name,
		      (unsigned long long)rows[i].bit, rows[i].on ? "yes" : "no");
	free(buf);
}

static void pin_to_one_cpu(void)
{
	int cpu = sched_getcpu();
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	(void)sched_setaffinity(0, sizeof set, &set);
}

int main(void)
{
	page = (size_t)sysconf(_SC_PAGESIZE);
	pin_to_one_cpu();
	check(VRANGE_VOLATILE == 0 && VRANGE_NOVOLATILE == 1, "mode constants");

	uint64_t flags = vrange_feature_flags();
	can_purge = (flags & VRANGE_FEATURE_MADV_FREE) && (flags & VRANGE_FEATURE_MADV_PAGEOUT);

	test_features(flags);
	test_mark_and_purge();
	test_no_purge();
	test_semantics();
	test_errors();
	test_mlock();
	test_zero_length_and_null();
	test_forget();
	test_malloc();
	test_fork();
	test_signal();

	printf("1..%d\n", checks);
	if (failures)
		printf("# %d of %d checks failed\n", failures, checks);
	return failures ? 1 : 0;
}
