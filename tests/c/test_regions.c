/*
 * C ABI test of libvrange's regions: vrange_alloc() with each policy, managed purging and its
 * order (class, then least recently marked), vrange_stats(), scratch regions, shared regions between processes,
 * and the error cases. Compiled against include/vrange.h, linked with libvrange.so:
 *
 *     cc -std=c11 -Wall -Wextra -Werror tests/c/test_regions.c \
 *        $(PKG_CONFIG_PATH=target/debug pkg-config --cflags --libs vrange) -o test_regions
 *
 * Deterministic: the test first turns off every pressure source of the reclaimer (PSI,
 * vmpressure, headroom, budget) with vrange_set_option(), so that only its own vrange_purge()
 * calls purge managed ranges, and sets a long arm delay so that hybrid ranges are armed only
 * where it asks for it. Kernel purges of lazy pages are forced with madvise(MADV_PAGEOUT), with
 * the process pinned to one CPU (see test_vrange.c). Every check leaves no range volatile
 * behind, so that each vrange_purge() sees only the ranges of its own check.
 *
 * Output is TAP-like: one "ok - ..." or "not ok - ..." line per check, the plan at the end.
 * Exit status is 0 only if every check passed.
 */

#define _GNU_SOURCE

#include <vrange.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

#include "tap.h"

static const char *errname(int e)
{
	switch (e) {
	case EINVAL:
		return "EINVAL";
	case ENOMEM:
		return "ENOMEM";
	case EBADF:
		return "EBADF";
	case ENOTSUP:
		return "ENOTSUP";
	default:
		return "?";
	}
}

/* Checks that a call returned its failure value with errno `want`. */
static void expect_errno(int failed, int err, int want, const char *what)
{
	check(failed && err == want, "%s -> %s (failed %d, errno %d: %s)", what, errname(want),
	      failed, err, strerror(err));
}

static int mark(void *p, size_t len)
{
	return vrange(addr(p), len, VRANGE_VOLATILE, NULL) == (ssize_t)len;
}

/* Unmarks [p, p + len): the *purged report, or -1 if the call failed. */
static int unmark(void *p, size_t len)
{
	int purged = -1;

	if (vrange(addr(p), len, VRANGE_NOVOLATILE, &purged) != (ssize_t)len)
		return -1;
	return purged;
}

/* vrange_alloc() of `pages` pages that must succeed; exits otherwise. */
static char *alloc(size_t pages, int flags)
{
	char *p = vrange_alloc(pages * page, flags);

	if (p == NULL) {
		printf("# vrange_alloc(%zu pages, %#x): %s\n", pages, flags, strerror(errno));
		printf("Bail out! vrange_alloc failed\n");
		exit(2);
	}
	return p;
}

static int release(void *p, size_t pages)
{
	return vrange_free(p, pages * page) == 0;
}

static struct vrange_stats snapshot(void)
{
	struct vrange_stats s;

	memset(&s, 0xA5, sizeof s);
	if (vrange_stats(&s, sizeof s) != 0)
		check(0, "vrange_stats: %s", strerror(errno));
	return s;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------------------------------- */

static void test_options(void)
{
	static const char *const quiet[][2] = {
		{"VRANGE_PSI", "off"},
		{"VRANGE_VMPRESSURE", "off"},
		{"VRANGE_HEADROOM", "off"},
		{"VRANGE_BUDGET", "0"},
		{"VRANGE_ARM_DELAY_MS", "3600000"},
		{"VRANGE_RECLAIMER", "on"},
	};
	/* One grammar for every size (units are powers of 1024, any case), and every malformed
	 * value refused, whatever the option. */
	static const char *const sizes[] = {"64MiB", " 2 gib ", "1KB", "3t", "4096", "16 M"};
	static const char *const bad[][2] = {
		{"VRANGE_BUDGET", "M"},
		{"VRANGE_BUDGET", "-1"},
		{"VRANGE_BUDGET", "1.5G"},
		{"VRANGE_BUDGET", ""},
		{"VRANGE_BUDGET", "99999999999T"},
		{"VRANGE_HEADROOM", "auto-ish"},
		{"VRANGE_POLL_MS", "10ms"},
		{"VRANGE_ARM_DELAY_MS", "-5"},
		{"VRANGE_RECLAIMER", "maybe"},
		{"VRANGE_VMPRESSURE", "2"},
		{"VRANGE_PSI", "some 3 2"},
		{"VRANGE_PRESSURE_SHARE", "101"},
	};
	int ok = 1;
	int r;

	for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++)
		ok &= vrange_set_option(quiet[i][0], quiet[i][1]) == 0;
	check(ok, "vrange_set_option turns the pressure sources off and the arm delay up");

	errno = 0;
	r = vrange_set_option("VRANGE_NO_SUCH_OPTION", "1");
	expect_errno(r == -1, errno, EINVAL, "vrange_set_option with an unknown name");
	errno = 0;
	r = vrange_set_option("VRANGE_PRESSURE_SHARE", "0");
	expect_errno(r == -1, errno, EINVAL, "vrange_set_option with a value out of range");
	errno = 0;
	r = vrange_set_option("VRANGE_BUDGET", "12Q");
	expect_errno(r == -1, errno, EINVAL, "vrange_set_option with a malformed size");
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char what[96];

		snprintf(what, sizeof what, "vrange_set_option(\"%s\", \"%s\")", bad[i][0], bad[i][1]);
		errno = 0;
		r = vrange_set_option(bad[i][0], bad[i][1]);
		expect_errno(r == -1, errno, EINVAL, what);
	}
	ok = 1;
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
		ok &= vrange_set_option("VRANGE_BUDGET", sizes[i]) == 0;
	ok &= vrange_set_option("VRANGE_BUDGET", "0") == 0;
	check(ok, "vrange_set_option takes every size spelling (64MiB, 2 gib, 1KB, ...)");
	errno = 0;
	r = vrange_set_option(NULL, "1");
	expect_errno(r == -1, errno, EINVAL, "vrange_set_option(NULL, ...)");
	errno = 0;
	r = vrange_set_option("VRANGE_BUDGET", NULL);
	expect_errno(r == -1, errno, EINVAL, "vrange_set_option(..., NULL)");
}

static void test_alloc_errors(void)
{
	static const struct {
		int flags;
		const char *what;
	} bad[] = {
		{VRANGE_LAZY | VRANGE_MANAGED, "two policies (VRANGE_LAZY | VRANGE_MANAGED)"},
		{1 << 3, "reserved bit 3"},
		{1 << 20, "unknown bit 20"},
		{-1, "flags -1"},
		{VRANGE_DROP_FIRST | VRANGE_DROP_LAST, "two classes"},
		{VRANGE_DROP_LOW | VRANGE_DROP_FIRST, "two classes (low, first)"},
		{VRANGE_HUGE | VRANGE_NOHUGE, "VRANGE_HUGE | VRANGE_NOHUGE"},
		{VRANGE_SHARED | VRANGE_LAZY, "VRANGE_SHARED | VRANGE_LAZY"},
		{VRANGE_SHARED | VRANGE_HUGE, "VRANGE_SHARED | VRANGE_HUGE"},
	};
	char what[128];
	void *p;

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		errno = 0;
		p = vrange_alloc(page, bad[i].flags);
		snprintf(what, sizeof what, "vrange_alloc with %s", bad[i].what);
		expect_errno(p == NULL, errno, EINVAL, what);
	}
	errno = 0;
	p = vrange_alloc(0, VRANGE_MANAGED);
	expect_errno(p == NULL, errno, EINVAL, "vrange_alloc(0, ...)");
	errno = 0;
	p = vrange_alloc(SIZE_MAX, 0);
	expect_errno(p == NULL, errno, ENOMEM, "vrange_alloc(SIZE_MAX, 0)");
	errno = 0;
	p = vrange_alloc(SIZE_MAX / 2 + 1, VRANGE_LAZY);
	expect_errno(p == NULL, errno, ENOMEM, "vrange_alloc(SIZE_MAX / 2 + 1, VRANGE_LAZY)");
}

static void test_free_errors(void)
{
	char *r = alloc(3, VRANGE_MANAGED);
	char *plain = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			   0);
	int ret;

	errno = 0;
	ret = vrange_free(NULL, page);
	expect_errno(ret == -1, errno, EINVAL, "vrange_free(NULL, ...)");
	errno = 0;
	ret = vrange_free(plain, 2 * page);
	expect_errno(ret == -1, errno, EINVAL, "vrange_free of memory vrange_alloc did not return");
	errno = 0;
	ret = vrange_free(r, 2 * page);
	expect_errno(ret == -1, errno, EINVAL, "vrange_free with a shorter length");
	errno = 0;
	ret = vrange_free(r, 4 * page);
	expect_errno(ret == -1, errno, EINVAL, "vrange_free with a longer length");
	errno = 0;
	ret = vrange_free(pg(r, 1), 2 * page);
	expect_errno(ret == -1, errno, EINVAL, "vrange_free of the tail of a region");
	fill(r, 3 * page, 1);
	check(unmark(r, 3 * page) == 0 && intact_at(r, 0, 3 * page, 1),
	      "failed vrange_free calls leave the region usable and intact");
	check(vrange_free(r, 3 * page - 100) == 0,
	      "vrange_free rounds the length up to a page (3 pages - 100 bytes)");
	errno = 0;
	ret = vrange_free(r, 3 * page);
	expect_errno(ret == -1, errno, EINVAL, "vrange_free of a region already freed");
	munmap(plain, 2 * page);
}

/* alloc, mark, unmark and free with one policy; `name` for the messages. */
static void policy_cycle(int flags, const char *name, uint64_t seed)
{
	const size_t n = 8;
	char *p = vrange_alloc(n * page - 1, flags);
	ssize_t r;

	check(p != NULL && addr(p) % page == 0 && is_zero(p, n * page),
	      "vrange_alloc(%s) returns page-aligned zero memory", name);
	if (p == NULL)
		return;
	fill(p, n * page, seed);
	r = vrange(addr(p), n * page, VRANGE_VOLATILE, NULL);
	check(r == (ssize_t)(n * page), "%s: vrange(VRANGE_VOLATILE) marks the region (ret %zd)",
	      name, r);
	check(intact_at(p, 0, n * page, seed), "%s: volatile content reads as written", name);
	int purged = unmark(p, n * page);
	check(purged == 0 && intact_at(p, 0, n * page, seed),
	      "%s: vrange(VRANGE_NOVOLATILE) pins it again, purged=0, content intact (%d)", name,
	      purged);
	check(vrange_free(p, n * page) == 0, "%s: vrange_free", name);
}

static void test_policies(void)
{
	policy_cycle(VRANGE_LAZY | VRANGE_NOHUGE, "VRANGE_LAZY", 10);
	policy_cycle(VRANGE_MANAGED, "VRANGE_MANAGED", 11);
	policy_cycle(VRANGE_HYBRID, "VRANGE_HYBRID (0)", 12);
	policy_cycle(VRANGE_MANAGED | VRANGE_HUGE, "VRANGE_MANAGED | VRANGE_HUGE", 13);
	policy_cycle(VRANGE_SHARED, "VRANGE_SHARED", 14);
}

static void test_lazy(void)
{
	const size_t n = 8;
	char *p = alloc(n, VRANGE_LAZY | VRANGE_NOHUGE);
	size_t count = 99;
	ssize_t r;

	fill(p, n * page, 20);
	check(mark(p, n * page), "lazy: mark");
	check(vrange_purge(SIZE_MAX) == 0, "lazy: vrange_purge never purges lazy regions");
	if (can_purge) {
		madvise(pg(p, 2), page, MADV_PAGEOUT);
		madvise(pg(p, 5), page, MADV_PAGEOUT);
		r = vrange_unmark(p, n * page, &count);
		check(r == (ssize_t)(n * page) && count == 2 && is_zero(pg(p, 2), page) &&
			      is_zero(pg(p, 5), page) && intact_at(p, 0, 2 * page, 20) &&
			      intact_at(p, 3 * page, 2 * page, 20) &&
			      intact_at(p, 6 * page, 2 * page, 20),
		      "lazy: the kernel drops single pages and the unmark counts them (2, got %zu)",
		      count);
	} else {
		r = vrange_unmark(p, n * page, &count);
		check(r == (ssize_t)(n * page) && count == 0 && intact_at(p, 0, n * page, 20),
		      "lazy: unmark without forced purges");
	}
	release(p, n);
}

static void test_managed_purge(int flags, const char *name)
{
	const size_t n = 16;
	char *p = alloc(n, flags);
	size_t count = 99;
	size_t freed;
	ssize_t r;

	fill(p, n * page, 30);
	check(mark(p, n * page), "%s: mark", name);
	freed = vrange_purge(1);
	check(freed == n * page, "%s: vrange_purge(1) purges the whole range (%zu bytes)", name,
	      freed);
	check(is_zero(p, n * page), "%s: a purged range reads zero while volatile", name);
	check(mark(p, n * page), "%s: marking a purged range again keeps the purge", name);
	check(unmark(p, n * page) == 1 && is_zero(p, n * page),
	      "%s: the next unmark reports purged=1 and the range reads zero", name);
	check(unmark(p, n * page) == 0, "%s: the purge is reported once", name);

	fill(p, n * page, 31);
	check(mark(p, n * page), "%s: mark again", name);
	check(vrange_purge(1) == n * page, "%s: vrange_purge", name);
	r = vrange_unmark(p, n * page, &count);
	check(r == (ssize_t)(n * page) && count == n,
	      "%s: vrange_unmark counts every page of a purged range (%zu, got %zu)", name, n,
	      count);

	/* Part of the region: its range is split and only the marked piece is purged. */
	fill(p, n * page, 32);
	check(mark(pg(p, 4), 3 * page), "%s: mark pages 4-6 only", name);
	freed = vrange_purge(SIZE_MAX);
	check(freed == 3 * page, "%s: vrange_purge purges only the marked piece (%zu bytes)", name,
	      freed);
	r = vrange_unmark(p, n * page, &count);
	check(r == (ssize_t)(n * page) && count == 3 && is_zero(pg(p, 4), 3 * page) &&
		      intact_at(p, 0, 4 * page, 32) && intact_at(p, 7 * page, (n - 7) * page, 32),
	      "%s: unmarking the whole region reports the 3 purged pages, the rest intact (got %zu)",
	      name, count);
	check(vrange_purge(SIZE_MAX) == 0, "%s: nothing volatile is left to purge", name);
	check(release(p, n), "%s: vrange_free after splitting", name);
}

static void test_boundaries(void)
{
	char *p = alloc(4, VRANGE_MANAGED);
	ssize_t r;

	errno = 0;
	r = vrange(addr(p) - page, 2 * page, VRANGE_VOLATILE, NULL);
	expect_errno(r == -1, errno, EINVAL, "vrange over the start of a region and memory before");
	errno = 0;
	r = vrange(addr(pg(p, 3)), 2 * page, VRANGE_VOLATILE, NULL);
	expect_errno(r == -1, errno, EINVAL, "vrange over the end of a region and memory after");
	errno = 0;
	r = vrange(addr(pg(p, 3)), 2 * page, VRANGE_NOVOLATILE, NULL);
	expect_errno(r == -1, errno, EINVAL, "unmark over the end of a region");
	check(vrange_purge(SIZE_MAX) == 0, "failed marks made nothing volatile");
	check(release(p, 4), "vrange_free");
}

/* Marks a, then b (b is the more recent), and checks that vrange_purge(1) purges `want`. */
static void purge_order(char *a, size_t a_pages, char *b, size_t b_pages, char *want,
			const char *what)
{
	size_t want_pages = want == a ? a_pages : b_pages;
	size_t freed;
	int ok;

	fill(a, a_pages * page, 40);
	fill(b, b_pages * page, 41);
	ok = mark(a, a_pages * page);
	sleep_ms(2); /* distinct mark times even with a coarse clock */
	ok &= mark(b, b_pages * page);
	freed = vrange_purge(1);
	int pa = unmark(a, a_pages * page), pb = unmark(b, b_pages * page);
	check(ok && freed == want_pages * page && pa == (want == a) && pb == (want == b) &&
		      (want == a ? intact_at(b, 0, b_pages * page, 41)
				 : intact_at(a, 0, a_pages * page, 40)),
	      "%s: vrange_purge(1) purges exactly that range (freed %zu, purged %d/%d)", what,
	      freed, pa, pb);
}

static void test_priority(void)
{
	char *normal = alloc(4, VRANGE_MANAGED);
	char *first = alloc(2, VRANGE_MANAGED | VRANGE_DROP_FIRST);
	char *low = alloc(5, VRANGE_DROP_LOW); /* hybrid */
	char *last = alloc(3, VRANGE_MANAGED | VRANGE_DROP_LAST);
	char *other = alloc(6, VRANGE_MANAGED);
	size_t count = 99;
	size_t freed;

	purge_order(normal, 4, first, 2, first, "VRANGE_DROP_FIRST marked after a normal range");
	purge_order(normal, 4, low, 5, low, "VRANGE_DROP_LOW marked after a normal range");
	purge_order(first, 2, low, 5, first, "VRANGE_DROP_FIRST before VRANGE_DROP_LOW");
	purge_order(last, 3, normal, 4, normal, "a normal range marked after VRANGE_DROP_LAST");
	purge_order(normal, 4, other, 6, normal, "same class: the least recently marked first");
	purge_order(other, 6, normal, 4, other, "same class, the other order");

	/* Re-marking refreshes a range's age. */
	fill(normal, 4 * page, 42);
	fill(other, 6 * page, 43);
	int ok = mark(normal, 4 * page);
	sleep_ms(2);
	ok &= mark(other, 6 * page) && unmark(normal, 4 * page) == 0;
	sleep_ms(2);
	ok &= mark(normal, 4 * page);
	freed = vrange_purge(1);
	check(ok && freed == 6 * page && unmark(other, 6 * page) == 1 &&
		      unmark(normal, 4 * page) == 0 && intact_at(normal, 0, 4 * page, 42),
	      "a range unmarked and marked again is younger: the other goes first (freed %zu)",
	      freed);

	/* Whole ranges: asking for one byte more than a range purges the next one too. */
	fill(normal, 4 * page, 44);
	fill(other, 6 * page, 45);
	ok = mark(normal, 4 * page);
	sleep_ms(2);
	ok &= mark(other, 6 * page);
	freed = vrange_purge(0);
	ok &= freed == 0;
	freed = vrange_purge(4 * page + 1);
	check(ok && freed == 10 * page && unmark(normal, 4 * page) == 1 &&
		      unmark(other, 6 * page) == 1,
	      "vrange_purge(0) purges nothing; vrange_purge(4 pages + 1) purges whole ranges "
	      "(freed %zu = 10 pages)",
	      freed);

	/* vrange_set_priority on a whole region and on part of one. */
	check(vrange_set_priority(other, 6 * page, VRANGE_DROP_FIRST) == 0,
	      "vrange_set_priority(VRANGE_DROP_FIRST) on a whole region");
	purge_order(other, 6, normal, 4, other, "after vrange_set_priority(VRANGE_DROP_FIRST)");
	check(vrange_set_priority(other, 6 * page, VRANGE_DROP_NORMAL) == 0 &&
		      vrange_set_priority(pg(normal, 2), 2 * page, VRANGE_DROP_LAST) == 0,
	      "vrange_set_priority back to normal, and VRANGE_DROP_LAST on pages 2-3 of a region");
	fill(normal, 4 * page, 46);
	fill(other, 6 * page, 47);
	ok = mark(normal, 4 * page);
	sleep_ms(2);
	ok &= mark(other, 6 * page);
	freed = vrange_purge(1);
	ok &= freed == 2 * page;
	freed = vrange_purge(1);
	ok &= freed == 6 * page;
	freed = vrange_purge(1);
	ok &= freed == 2 * page;
	ok &= vrange_unmark(normal, 4 * page, &count) == (ssize_t)(4 * page) && count == 4;
	check(ok && unmark(other, 6 * page) == 1,
	      "the normal half of a region goes first, then the other region, then the "
	      "VRANGE_DROP_LAST half");

	int r;
	errno = 0;
	r = vrange_set_priority(normal, 4 * page, 3);
	expect_errno(r == -1, errno, EINVAL, "vrange_set_priority with priority 3");
	errno = 0;
	r = vrange_set_priority(normal, 4 * page, VRANGE_DROP_FIRST | VRANGE_DROP_LAST);
	expect_errno(r == -1, errno, EINVAL, "vrange_set_priority with two classes");
	errno = 0;
	r = vrange_set_priority(normal, 4 * page, VRANGE_SHARED);
	expect_errno(r == -1, errno, EINVAL, "vrange_set_priority with a non-class flag");
	errno = 0;
	r = vrange_set_priority(normal + 8, page, VRANGE_DROP_LOW);
	expect_errno(r == -1, errno, EINVAL, "vrange_set_priority at an unaligned address");
	errno = 0;
	r = vrange_set_priority(pg(normal, 2), 4 * page, VRANGE_DROP_LOW);
	expect_errno(r == -1, errno, ENOMEM, "vrange_set_priority past the end of the region");
	void *plain = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	errno = 0;
	r = vrange_set_priority(plain, page, VRANGE_DROP_LOW);
	expect_errno(r == -1, errno, EINVAL, "vrange_set_priority outside any region");
	munmap(plain, page);

	check(release(normal, 4) && release(first, 2) && release(low, 5) && release(last, 3) &&
		      release(other, 6),
	      "vrange_free of every region");
}

static void test_stats(void)
{
	const size_t n = 8;
	struct vrange_stats s0, s1, s2, s3, s4, s5;
	const struct vrange_source_stats *e0, *e3;
	int r;

	s0 = snapshot();
	check(s0.size == sizeof s0, "vrange_stats sets size to sizeof(struct vrange_stats) (%llu)",
	      (unsigned long long)s0.size);
	check(s0.reclaimer_running == 1 &&
		      (s0.reclaimer_sources & (1u << VRANGE_SOURCE_EXPLICIT)) != 0,
	      "the reclaimer runs and counts explicit purges (sources %#llx)",
	      (unsigned long long)s0.reclaimer_sources);
	int quiet = 0;
	for (int i = 0; i < 50 && !quiet; i++) {
		struct vrange_stats s = snapshot();
		quiet = (s.reclaimer_sources &
			 ((1u << VRANGE_SOURCE_PSI) | (1u << VRANGE_SOURCE_PSI_CGROUP) |
			  (1u << VRANGE_SOURCE_VMPRESSURE_MEDIUM) |
			  (1u << VRANGE_SOURCE_VMPRESSURE_CRITICAL) | (1u << VRANGE_SOURCE_HEADROOM) |
			  (1u << VRANGE_SOURCE_BUDGET))) == 0;
		if (!quiet)
			sleep_ms(20);
	}
	check(quiet, "with the sources off the reclaimer listens to none of them");

	char *p = alloc(n, VRANGE_MANAGED);
	s1 = snapshot();
	check(s1.pinned_ranges == s0.pinned_ranges + 1 && s1.pinned_bytes == s0.pinned_bytes + n * page,
	      "a new region counts as one pinned range of its length");
	fill(p, n * page, 50);
	mark(p, n * page);
	s2 = snapshot();
	check(s2.volatile_ranges == s0.volatile_ranges + 1 &&
		      s2.volatile_bytes == s0.volatile_bytes + n * page &&
		      s2.pinned_ranges == s0.pinned_ranges,
	      "marked: one volatile range of %zu bytes (volatile_bytes %llu -> %llu)", n * page,
	      (unsigned long long)s0.volatile_bytes, (unsigned long long)s2.volatile_bytes);
	size_t freed = vrange_purge(1);
	s3 = snapshot();
	e0 = &s0.sources[VRANGE_SOURCE_EXPLICIT];
	e3 = &s3.sources[VRANGE_SOURCE_EXPLICIT];
	check(freed == n * page && s3.volatile_bytes == s0.volatile_bytes &&
		      s3.purged_ranges == s0.purged_ranges + 1 &&
		      s3.purged_bytes == s0.purged_bytes + n * page &&
		      s3.purged_total_bytes == s0.purged_total_bytes + n * page,
	      "purged: the range moves from volatile to purged, purged_total_bytes grows");
	check(e3->events == e0->events + 1 && e3->ranges == e0->ranges + 1 &&
		      e3->bytes == e0->bytes + n * page && e3->purging_events == e0->purging_events + 1,
	      "explicit source: one more event, purging event, range and %zu bytes", n * page);
	check(e3->reaction_last_ns > 0 && e3->reaction_max_ns >= e3->reaction_last_ns &&
		      e3->reaction_total_ns >= e0->reaction_total_ns + e3->reaction_last_ns,
	      "explicit source: reaction times (last %llu ns, max %llu ns)",
	      (unsigned long long)e3->reaction_last_ns, (unsigned long long)e3->reaction_max_ns);
	int others = 1;
	for (int i = 0; i < VRANGE_SOURCE_COUNT; i++)
		if (i != VRANGE_SOURCE_EXPLICIT)
			others &= s3.sources[i].events == s0.sources[i].events &&
				  s3.sources[i].bytes == s0.sources[i].bytes;
	check(others, "no other source fired");

	r = unmark(p, n * page);
	s4 = snapshot();
	check(r == 1 && s4.losses_reported == s0.losses_reported + 1 &&
		      s4.purged_ranges == s0.purged_ranges && s4.pinned_ranges == s1.pinned_ranges,
	      "the unmark that reports the purge counts one loss; the range is pinned again");
	vrange_purge(1);
	s5 = snapshot();
	check(s5.sources[VRANGE_SOURCE_EXPLICIT].events == e3->events + 1 &&
		      s5.sources[VRANGE_SOURCE_EXPLICIT].purging_events == e3->purging_events &&
		      s5.purged_total_bytes == s3.purged_total_bytes,
	      "a vrange_purge that finds nothing counts an event, not a purging event");
	check(release(p, n), "vrange_free");
	s5 = snapshot();
	check(s5.pinned_ranges == s0.pinned_ranges && s5.pinned_bytes == s0.pinned_bytes,
	      "a freed region is no longer counted");

	/* Versioning by size. */
	unsigned char big[sizeof(struct vrange_stats) + 32];
	memset(big, 0xA5, sizeof big);
	int zero_tail = 1;
	r = vrange_stats((struct vrange_stats *)(void *)big, sizeof big);
	for (size_t i = sizeof(struct vrange_stats); i < sizeof big; i++)
		zero_tail &= big[i] == 0;
	check(r == 0 && zero_tail && ((struct vrange_stats *)(void *)big)->size == sizeof s0,
	      "a larger size (newer header): ours filled, size says how much, the rest zeroed");
	errno = 0;
	r = vrange_stats(NULL, sizeof s0);
	expect_errno(r == -1, errno, EINVAL, "vrange_stats(NULL, ...)");
	errno = 0;
	r = vrange_stats(&s0, 8);
	expect_errno(r == -1, errno, EINVAL, "vrange_stats with a size of 8");
	/* A caller built against the first version passes its size: it gets that much. */
	size_t first = offsetof(struct vrange_stats, scratch_regions);
	memset(big, 0xA5, sizeof big);
	r = vrange_stats((struct vrange_stats *)(void *)big, first);
	check(r == 0 && ((struct vrange_stats *)(void *)big)->size == first && big[first] == 0xA5,
	      "the first version's size (%zu): that much filled, nothing beyond", first);
	errno = 0;
	r = vrange_stats(&s0, first - 8);
	expect_errno(r == -1, errno, EINVAL, "vrange_stats with a size one field short of the first version");
}

static void pin_to_one_cpu(void);

/* SIGBUS mode: the handler regenerates the touched page (byte value: its page index + 1)
 * with vrange_fill() and returns. */
static char *sig_base;
static size_t sig_len;
static volatile sig_atomic_t sig_count;
static volatile uintptr_t sig_addr;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	uintptr_t a = (uintptr_t)si->si_addr;
	static unsigned char buf[65536];
	if (a < (uintptr_t)sig_base || a >= (uintptr_t)sig_base + sig_len || page > sizeof buf) {
		signal(sig, SIG_DFL);
		return;
	}
	sig_count++;
	sig_addr = a;
	uintptr_t at = a & ~(uintptr_t)(page - 1);
	memset(buf, (int)((at - (uintptr_t)sig_base) / page + 1), page);
	if (vrange_fill((void *)at, buf, page) != 0)
		signal(sig, SIG_DFL);
}

static void sigbus_table(char *p, size_t n, int in_region, const char *what)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	for (size_t i = 0; i < n; i++)
		memset(p + i * page, (int)(i + 1), page);
	sig_base = p;
	sig_len = n * page;
	sig_count = 0;
	ssize_t r = vrange(addr(p), n * page, VRANGE_VOLATILE | VRANGE_SIGBUS, NULL);
	check(r == (ssize_t)(n * page), "%s: vrange(VRANGE_VOLATILE | VRANGE_SIGBUS) (%s)", what,
	      r < 0 ? strerror(errno) : "ok");
	check(p[page] == 2 && sig_count == 0, "%s: a page not purged reads its content, no signal",
	      what);
	if (in_region) {
		check(vrange_purge((size_t)-1) >= n * page, "%s: purged", what);
	} else {
		pin_to_one_cpu();
		check(madvise(p, n * page, MADV_PAGEOUT) == 0, "%s: MADV_PAGEOUT", what);
	}
	volatile char *q = p + 3 * page + 5;
	char c = *q;
	check(c == 4 && sig_count == 1 && sig_addr == (uintptr_t)q,
	      "%s: a purged page raises SIGBUS at its address; the handler's vrange_fill lets the "
	      "read continue (read %d, %d signals)",
	      what, c, (int)sig_count);
	int purged = -1;
	r = vrange(addr(p), n * page, VRANGE_NOVOLATILE, &purged);
	check(r == (ssize_t)(n * page) && purged == 1, "%s: the unmark reports the purge", what);
	check(p[5 * page] == 0 && p[3 * page] == 4 && sig_count == 1,
	      "%s: after unmark purged pages read zero, placed pages their content, no signal", what);
	signal(SIGBUS, SIG_DFL);
}

static void test_sigbus(void)
{
	size_t n = 8;
	char *p = vrange_alloc(n * page, VRANGE_MANAGED | VRANGE_SIGBUS);

	if (p == NULL && errno == ENOTSUP) {
		check(!(vrange_feature_flags() & VRANGE_FEATURE_USERFAULTFD),
		      "SIGBUS mode refused with ENOTSUP only where userfaultfd is unusable");
		return;
	}
	check(p != NULL, "vrange_alloc(VRANGE_MANAGED | VRANGE_SIGBUS) (%s)",
	      p ? "ok" : strerror(errno));
	if (p == NULL)
		return;
	sigbus_table(p, n, 1, "managed SIGBUS region");
	check(release(p, n), "vrange_free of the SIGBUS region");

	char *m = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	check(m != MAP_FAILED, "mmap");
	if (m == MAP_FAILED)
		return;
	if (can_purge)
		sigbus_table(m, n, 0, "classic call on mmap'd memory");
	else
		skip("classic call in SIGBUS mode", "MADV_FREE or MADV_PAGEOUT is missing");
	munmap(m, n * page);

	int r;
	static char buf[65536];
	char *shared = vrange_alloc(n * page, VRANGE_SHARED | VRANGE_SIGBUS);
	check(shared != NULL, "vrange_alloc(VRANGE_SHARED | VRANGE_SIGBUS) (%s)",
	      shared ? "ok" : strerror(errno));
	if (shared) {
		sigbus_table(shared, n, 1, "shared SIGBUS region");
		check(release(shared, n), "vrange_free of the shared SIGBUS region");
	}
	errno = 0;
	void *q = vrange_alloc(page, VRANGE_SCRATCH | VRANGE_SIGBUS);
	expect_errno(q == NULL, errno, EINVAL, "VRANGE_SCRATCH | VRANGE_SIGBUS");
	char *plain = alloc(2, VRANGE_MANAGED);
	errno = 0;
	r = (int)vrange(addr(plain), page, VRANGE_VOLATILE | VRANGE_SIGBUS, NULL);
	expect_errno(r == -1, errno, EINVAL, "SIGBUS mode in a region made without VRANGE_SIGBUS");
	errno = 0;
	r = vrange_fill(plain + 8, buf, page);
	expect_errno(r == -1, errno, EINVAL, "vrange_fill at a misaligned address");
	errno = 0;
	r = vrange_fill(plain, buf, page);
	expect_errno(r == -1, errno, EINVAL, "vrange_fill into memory not in SIGBUS mode");
	check(release(plain, 2), "vrange_free");
}

/* Refill regions: every byte is what the fill function makes, block by block. */
static int fills;

static int make_block(void *ctx, size_t offset, void *buf, size_t len)
{
	unsigned char *b = buf;
	fills++;
	for (size_t i = 0; i < len; i++)
		b[i] = (unsigned char)((offset + i) * 7 + (uintptr_t)ctx);
	return 0;
}

/* Refill regions of either kind: flags 0 (filled by libvrange's refill thread) or
 * VRANGE_FILL_HERE (filled on the touching thread, here the test's only one). */
static void test_refill(int flags)
{
	size_t block = 16 * page, n = 64 * page;
	struct vrange_stats s0 = snapshot();
	fills = 0;
	unsigned char *p = vrange_alloc_refill(n, flags, block, make_block, (void *)3);

	if (p == NULL && errno == ENOTSUP) {
		check(!(vrange_feature_flags() & VRANGE_FEATURE_USERFAULTFD),
		      "refill regions refused with ENOTSUP only where userfaultfd is unusable");
		return;
	}
	check(p != NULL, "vrange_alloc_refill (%s)", p ? "ok" : strerror(errno));
	if (p == NULL)
		return;
	check(fills == 0, "nothing is made before it is touched");
	int right = 1;
	for (size_t i = 0; i < n; i += 97)
		right &= p[i] == (unsigned char)(i * 7 + 3);
	check(right && fills == 4, "every byte read is the fill's; one fill per block (%d fills)",
	      fills);
	check(madvise(p + block, page, MADV_DONTNEED) == 0, "a page taken back");
	check(p[block + 5] == (unsigned char)((block + 5) * 7 + 3) && fills == 5,
	      "its block is made again when touched (%d fills)", fills);
	struct vrange_stats s = snapshot();
	check(s.refill_fills - s0.refill_fills == 5 && s.refill_bytes - s0.refill_bytes == 5 * block &&
		      s.refill_failures == s0.refill_failures,
	      "vrange_stats counts the fills");
	check(vrange_free(p, n) == 0, "vrange_free of the refill region");
	errno = 0;
	void *q = vrange_alloc_refill(n, 0, page + 1, make_block, NULL);
	expect_errno(q == NULL, errno, EINVAL, "vrange_alloc_refill with a block not a page multiple");
	errno = 0;
	q = vrange_alloc_refill(n, 0, block, NULL, NULL);
	expect_errno(q == NULL, errno, EINVAL, "vrange_alloc_refill without a fill function");
	errno = 0;
	q = vrange_alloc_refill(n, flags | VRANGE_MANAGED, block, make_block, NULL);
	expect_errno(q == NULL, errno, EINVAL, "vrange_alloc_refill with other flags");
}

/* Scratch regions: always volatile, never marked (MAP_DROPPABLE); refused with ENOTSUP where
 * the kernel lacks it. */
static void test_scratch(void)
{
	const size_t tib = (size_t)1 << 40;
	struct vrange_stats s0 = snapshot(), s1, s2;
	int r;

	errno = 0;
	char *p = vrange_alloc(tib, VRANGE_SCRATCH);
	if (!(vrange_feature_flags() & VRANGE_FEATURE_MAP_DROPPABLE)) {
		check(p == NULL && errno == ENOTSUP,
		      "without MAP_DROPPABLE a scratch region is refused with ENOTSUP (errno %d)", errno);
		return;
	}
	check(p != NULL && addr(p) % page == 0, "a 1 TiB scratch region (%s)",
	      p ? "mapped" : strerror(errno));
	if (p == NULL)
		return;
	s1 = snapshot();
	check(s1.scratch_regions == s0.scratch_regions + 1 &&
		      s1.scratch_bytes == s0.scratch_bytes + tib,
	      "vrange_stats counts it and the bytes it reserves");
	int kept_or_zero = 1;
	for (size_t gib = 0; gib < 1024; gib += 37) {
		p[gib << 30] = (char)(gib | 1);
		char c = p[gib << 30];
		kept_or_zero &= c == (char)(gib | 1) || c == 0;
	}
	check(kept_or_zero, "written pages read back their content (or zero, once dropped)");
	errno = 0;
	r = (int)vrange(addr(p), page, VRANGE_VOLATILE, NULL);
	expect_errno(r == -1, errno, EINVAL, "vrange(VRANGE_VOLATILE) on scratch memory");
	size_t purged_pages = 0;
	errno = 0;
	r = (int)vrange_unmark(p + page, page, &purged_pages);
	expect_errno(r == -1, errno, EINVAL, "vrange_unmark on scratch memory");
	errno = 0;
	void *q = vrange_alloc(page, VRANGE_SCRATCH | VRANGE_MANAGED);
	expect_errno(q == NULL, errno, EINVAL, "VRANGE_SCRATCH | VRANGE_MANAGED");
	errno = 0;
	q = vrange_alloc(page, VRANGE_SCRATCH | VRANGE_SHARED);
	expect_errno(q == NULL, errno, EINVAL, "VRANGE_SCRATCH | VRANGE_SHARED");
	errno = 0;
	r = vrange_set_priority(p, page, VRANGE_DROP_FIRST);
	expect_errno(r == -1, errno, EINVAL, "vrange_set_priority on scratch memory");
	errno = 0;
	r = vrange_free(p, tib / 2);
	expect_errno(r == -1, errno, EINVAL, "vrange_free of a scratch region with a wrong length");
	check(vrange_free(p, tib) == 0, "vrange_free of the scratch region");
	errno = 0;
	r = vrange_free(p, tib);
	expect_errno(r == -1, errno, EINVAL, "vrange_free of a scratch region already freed");
	s2 = snapshot();
	check(s2.scratch_regions == s0.scratch_regions && s2.scratch_bytes == s0.scratch_bytes,
	      "a freed scratch region is no longer counted");
}

static void test_source_names(void)
{
	static const char *const names[VRANGE_SOURCE_COUNT] = {
		[VRANGE_SOURCE_PSI] = "psi",
		[VRANGE_SOURCE_PSI_CGROUP] = "psi-cgroup",
		[VRANGE_SOURCE_VMPRESSURE_MEDIUM] = "vmpressure-medium",
		[VRANGE_SOURCE_VMPRESSURE_CRITICAL] = "vmpressure-critical",
		[VRANGE_SOURCE_HEADROOM] = "headroom",
		[VRANGE_SOURCE_BUDGET] = "budget",
		[VRANGE_SOURCE_EXPLICIT] = "explicit",
	};
	int ok = 1;

	for (int i = 0; i < VRANGE_SOURCE_COUNT; i++) {
		const char *name = vrange_source_name(i);
		ok &= name != NULL && strcmp(name, names[i]) == 0 && name == vrange_source_name(i);
	}
	check(ok, "vrange_source_name names every source (static strings)");
	errno = 0;
	const char *n = vrange_source_name(VRANGE_SOURCE_COUNT);
	expect_errno(n == NULL, errno, EINVAL, "vrange_source_name(VRANGE_SOURCE_COUNT)");
	errno = 0;
	n = vrange_source_name(-1);
	expect_errno(n == NULL, errno, EINVAL, "vrange_source_name(-1)");
}

static void test_hybrid_arming(void)
{
	const size_t n = 64;
	char *p = alloc(n, VRANGE_HYBRID | VRANGE_NOHUGE);
	struct vrange_stats s0 = snapshot(), s;
	size_t count = 99;
	ssize_t r;
	int armed = 0;

	fill(p, n * page, 60);
	check(vrange_set_option("VRANGE_ARM_DELAY_MS", "0") == 0 &&
		      vrange_set_option("VRANGE_POLL_MS", "10") == 0,
	      "arm delay 0, poll every 10 ms");
	check(mark(p, n * page), "hybrid: mark");
	for (int i = 0; i < 300 && !armed; i++) {
		s = snapshot();
		armed = s.armed_ranges == s0.armed_ranges + 1 &&
			s.armed_bytes == s0.armed_bytes + n * page;
		if (!armed)
			sleep_ms(10);
	}
	s = snapshot();
	check(armed && s.armed_total_bytes >= s0.armed_total_bytes + n * page &&
		      s.volatile_ranges == s0.volatile_ranges + 1,
	      "hybrid: after the arm delay the reclaimer arms the whole range (armed %llu bytes; "
	      "armed in all %llu more, volatile ranges %llu then %llu)",
	      (unsigned long long)(s.armed_bytes - s0.armed_bytes),
	      (unsigned long long)(s.armed_total_bytes - s0.armed_total_bytes),
	      (unsigned long long)s0.volatile_ranges, (unsigned long long)s.volatile_ranges);
	vrange_set_option("VRANGE_ARM_DELAY_MS", "3600000");
	vrange_set_option("VRANGE_POLL_MS", "100");
	if (armed && can_purge) {
		madvise(pg(p, 7), page, MADV_PAGEOUT);
		r = vrange_unmark(p, n * page, &count);
		check(r == (ssize_t)(n * page) && count == 1 && is_zero(pg(p, 7), page) &&
			      intact_at(p, 0, 7 * page, 60) &&
			      intact_at(p, 8 * page, (n - 8) * page, 60),
		      "hybrid: an armed range loses single pages to the kernel, counted exactly "
		      "(1, got %zu)",
		      count);
	} else {
		r = vrange_unmark(p, n * page, &count);
		check(r == (ssize_t)(n * page) && count == 0 && intact_at(p, 0, n * page, 60),
		      "hybrid: unmark of an armed range without forced purges");
	}
	s = snapshot();
	check(s.armed_ranges == s0.armed_ranges && s.volatile_ranges == s0.volatile_ranges,
	      "hybrid: unmarked, nothing armed or volatile is left");

	/* vrange_purge purges an armed range whole. */
	fill(p, n * page, 61);
	vrange_set_option("VRANGE_ARM_DELAY_MS", "0");
	mark(p, n * page);
	armed = 0;
	for (int i = 0; i < 300 && !armed; i++) {
		armed = snapshot().armed_ranges == s0.armed_ranges + 1;
		if (!armed)
			sleep_ms(10);
	}
	vrange_set_option("VRANGE_ARM_DELAY_MS", "3600000");
	s = snapshot();
	size_t freed = vrange_purge(1);
	r = vrange_unmark(p, n * page, &count);
	check(armed && freed == n * page && count == n && is_zero(p, n * page),
	      "hybrid: vrange_purge purges an armed range whole (freed %zu, %zu pages reported; "
	      "armed seen %d, then %llu ranges volatile, %llu armed)",
	      freed, count, armed, (unsigned long long)s.volatile_ranges,
	      (unsigned long long)s.armed_ranges);
	check(release(p, n), "hybrid: vrange_free");
}

/* ---------------------------------------------------------------------------------------- */

/* One byte through a pipe; 0 on EOF, error or after 20 s. */
static int send_byte(int fd, char c)
{
	return write(fd, &c, 1) == 1;
}

static int expect_byte(int fd, char want)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	char c = 0;

	if (poll(&p, 1, 20000) != 1)
		return 0;
	return read(fd, &c, 1) == 1 && c == want;
}

static void test_shared_in_process(void)
{
	const size_t n = 8;
	char *s = alloc(n, VRANGE_SHARED);
	size_t len = 0;
	int fd = vrange_shared_fd(s);
	ssize_t r;

	check(fd >= 0 && fcntl(fd, F_GETFD) == FD_CLOEXEC,
	      "vrange_shared_fd returns the region's descriptor, close-on-exec (%d)", fd);
	check(vrange_shared_fd(pg(s, n - 1) + 5) == fd,
	      "vrange_shared_fd accepts any address inside the region");
	fill(s, n * page, 70);

	/* Page ranges (ashmem's ASHMEM_UNPIN and ASHMEM_PIN): part of the region on its own. */
	check(mark(pg(s, 1), 2 * page), "vrange(VRANGE_VOLATILE) on two pages of a shared region");
	check(unmark(pg(s, 4), 2 * page) == 0, "vrange(VRANGE_NOVOLATILE) on pages still pinned: 0");
	check(vrange_purge(SIZE_MAX) == 2 * page,
	      "shared: vrange_purge takes the two pages no mapping pins, and nothing else");
	check(unmark(s, n * page) == 1 && is_zero(pg(s, 1), 2 * page) && intact_at(s, 0, page, 70) &&
		      intact_at(s, 3 * page, (n - 3) * page, 70),
	      "shared: the whole region's unmark reports those pages purged; the rest is intact");
	check(unmark(pg(s, 1), page) == 0, "shared: a page range's purge is reported once");
	fill(s, n * page, 70);
	errno = 0;
	r = vrange_set_priority(s, page, VRANGE_DROP_LOW);
	expect_errno(r == -1, errno, EINVAL, "vrange_set_priority on part of a shared region");

	char *m = vrange_map_shared(fd, VRANGE_DROP_FIRST, &len);
	check(m != NULL && m != s && len == n * page,
	      "vrange_map_shared maps the region a second time (length %zu)", len);
	if (m == NULL) {
		release(s, n);
		return;
	}
	check(unmark(m, n * page) == 0 && intact_at(m, 0, n * page, 70),
	      "the new mapping's first unmark: purged=0, it shows the region's content");
	((volatile uint64_t *)s)[3] = 12345;
	check(((volatile uint64_t *)m)[3] == 12345, "a write through one mapping shows in the other");
	fill(s, n * page, 71);

	/* Each mapping holds a pin; the region is purged only once both marked it. */
	check(mark(s, n * page), "shared: the first mapping marks the region");
	check(vrange_purge(SIZE_MAX) == 0, "shared: a pin held by the other mapping blocks purging");
	check(unmark(s, n * page) == 0 && intact_at(s, 0, n * page, 71),
	      "shared: the first mapping pins it again, intact");
	check(mark(m, n * page) && vrange_purge(SIZE_MAX) == 0,
	      "shared: and the other way round");
	check(mark(s, n * page) && vrange_purge(1) == n * page,
	      "shared: once both marked it, vrange_purge purges the region");
	check(unmark(m, n * page) == 1 && unmark(s, n * page) == 1 && is_zero(s, n * page) &&
		      is_zero(m, n * page),
	      "shared: both mappings see the purge at their next unmark, and read zero");
	check(unmark(s, n * page) == 0, "shared: reported once per mapping");

	/* A fresh mapping holds no pin: it does not keep the region from being purged. */
	check(release(m, n), "vrange_free of the second mapping");
	fill(s, n * page, 72);
	m = vrange_map_shared(fd, 0, &len);
	check(m != NULL && mark(s, n * page) && vrange_purge(SIZE_MAX) == n * page,
	      "shared: a mapping that was never unmarked holds no pin");
	check(m != NULL && unmark(m, n * page) == 1 && unmark(s, n * page) == 1,
	      "shared: its first unmark reports the purge");
	if (m != NULL)
		release(m, n);

	errno = 0;
	void *bad = vrange_map_shared(fd, VRANGE_LAZY, &len);
	expect_errno(bad == NULL, errno, EINVAL, "vrange_map_shared with VRANGE_LAZY");
	errno = 0;
	bad = vrange_map_shared(fd, VRANGE_DROP_FIRST | VRANGE_DROP_LOW, &len);
	expect_errno(bad == NULL, errno, EINVAL, "vrange_map_shared with two classes");
	bad = vrange_map_shared(fd, VRANGE_SHARED | VRANGE_MANAGED | VRANGE_DROP_LAST, NULL);
	check(bad != NULL && unmark(bad, n * page) == 0 && release(bad, n),
	      "vrange_map_shared accepts VRANGE_SHARED | VRANGE_MANAGED and a NULL length");
	check(release(s, n), "vrange_free of the shared region");
}

static void test_shared_errors(void)
{
	char *priv = alloc(2, VRANGE_MANAGED);
	void *plain = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	size_t len = 99;
	int fd;
	void *m;

	errno = 0;
	fd = vrange_shared_fd(priv);
	expect_errno(fd == -1, errno, EINVAL, "vrange_shared_fd of a private region");
	errno = 0;
	fd = vrange_shared_fd(plain);
	expect_errno(fd == -1, errno, EINVAL, "vrange_shared_fd of memory outside any region");
	errno = 0;
	fd = vrange_shared_fd(NULL);
	expect_errno(fd == -1, errno, EINVAL, "vrange_shared_fd(NULL)");

	errno = 0;
	m = vrange_map_shared(-1, 0, &len);
	expect_errno(m == NULL, errno, EBADF, "vrange_map_shared(-1)");
	int other = memfd_create("not-vrange", MFD_CLOEXEC);
	if (other >= 0 && ftruncate(other, (off_t)(4 * page)) == 0) {
		errno = 0;
		m = vrange_map_shared(other, 0, &len);
		expect_errno(m == NULL && len == 99, errno, EINVAL,
			     "vrange_map_shared of a memfd libvrange did not make");
		close(other);
		errno = 0;
		m = vrange_map_shared(other, 0, &len);
		expect_errno(m == NULL, errno, EBADF, "vrange_map_shared of a closed descriptor");
	} else {
		skip("vrange_map_shared of a foreign memfd", strerror(errno));
		skip("vrange_map_shared of a closed descriptor", "no memfd");
	}
	munmap(plain, page);
	release(priv, 2);
}

/* Bits of the fork child's exit status, one per check it makes. */
enum {
	CHILD_MAPPED = 1,        /* vrange_map_shared works, the length is right */
	CHILD_FIRST_UNMARK = 2,  /* its first unmark: purged=0, the parent's content */
	CHILD_BLOCKED = 4,       /* its vrange_purge found the parent's pin: 0 bytes */
	CHILD_SEES_PURGE = 8,    /* it sees the parent's purge at its next unmark */
	CHILD_PURGES = 16,       /* its own vrange_purge purges the region */
	CHILD_FREED = 32,        /* vrange_free of its mapping */
};

static int shared_child(int fd, size_t n, int to_parent, int from_parent)
{
	size_t len = 0;
	int status = 0;
	char *c = vrange_map_shared(fd, VRANGE_DROP_LOW, &len);

	if (c == NULL || len != n * page)
		return status;
	status |= CHILD_MAPPED;
	if (unmark(c, n * page) == 0 && intact_at(c, 0, n * page, 80))
		status |= CHILD_FIRST_UNMARK;
	/* a: pinned by both. The parent marks and tries to purge. */
	if (!send_byte(to_parent, 'a') || !expect_byte(from_parent, 'b'))
		return status;
	/* b: the parent pinned it again. */
	if (mark(c, n * page) && vrange_purge(SIZE_MAX) == 0)
		status |= CHILD_BLOCKED;
	if (!send_byte(to_parent, 'c') || !expect_byte(from_parent, 'd'))
		return status;
	/* d: the parent marked it too and purged it. */
	int purged = unmark(c, n * page);
	if (purged == 1 && is_zero(c, n * page))
		status |= CHILD_SEES_PURGE;
	fill(c, n * page, 81);
	if (!send_byte(to_parent, 'e') || !expect_byte(from_parent, 'f'))
		return status;
	/* f: the parent saw the new content and marked the region; purge it from here. */
	if (mark(c, n * page) && vrange_purge(SIZE_MAX) == n * page)
		status |= CHILD_PURGES;
	if (!send_byte(to_parent, 'g') || !expect_byte(from_parent, 'h'))
		return status;
	if (vrange_free(c, n * page) == 0)
		status |= CHILD_FREED;
	return status;
}

static void test_shared_fork(void)
{
	const size_t n = 16;
	char *s = alloc(n, VRANGE_SHARED | VRANGE_DROP_FIRST);
	int fd = vrange_shared_fd(s);
	int up[2], down[2];

	fill(s, n * page, 80);
	if (fd < 0 || pipe(up) != 0 || pipe(down) != 0) {
		check(0, "shared fork test setup: %s", strerror(errno));
		release(s, n);
		return;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		check(0, "fork: %s", strerror(errno));
		release(s, n);
		return;
	}
	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		alarm(60);
		_exit(shared_child(fd, n, up[1], down[0]));
	}
	close(up[1]);
	close(down[0]);
	int to = down[1], from = up[0];

	int sync = expect_byte(from, 'a');
	check(sync && mark(s, n * page) && vrange_purge(SIZE_MAX) == 0,
	      "fork: the child's pin keeps the parent's vrange_purge from purging the region");
	check(unmark(s, n * page) == 0 && intact_at(s, 0, n * page, 80),
	      "fork: the parent pins it again, intact");
	sync &= send_byte(to, 'b') && expect_byte(from, 'c');
	/* c: the child marked it and failed to purge it. */
	check(sync && mark(s, n * page) && vrange_purge(SIZE_MAX) == n * page,
	      "fork: once both processes marked it, the parent's vrange_purge purges it");
	check(unmark(s, n * page) == 1 && is_zero(s, n * page),
	      "fork: the parent's next unmark reports the purge, the region reads zero");
	sync &= send_byte(to, 'd') && expect_byte(from, 'e');
	/* e: the child saw the purge and refilled the region. */
	check(sync && intact_at(s, 0, n * page, 81), "fork: the child's refill shows in the parent");
	check(mark(s, n * page), "fork: the parent marks the region");
	sync &= send_byte(to, 'f') && expect_byte(from, 'g');
	/* g: the child marked and purged it. */
	check(sync && unmark(s, n * page) == 1 && is_zero(s, n * page),
	      "fork: a purge by the child is seen by the parent at its next unmark");
	send_byte(to, 'h');

	int status = -1;
	waitpid(pid, &status, 0);
	int bits = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
	if (!WIFEXITED(status))
		printf("# child status %#x\n", status);
	check(bits & CHILD_MAPPED, "fork child: vrange_map_shared of the inherited descriptor");
	check(bits & CHILD_FIRST_UNMARK, "fork child: first unmark purged=0, the parent's content");
	check(bits & CHILD_BLOCKED, "fork child: the parent's pin blocks the child's vrange_purge");
	check(bits & CHILD_SEES_PURGE, "fork child: sees the parent's purge at its next unmark");
	check(bits & CHILD_PURGES, "fork child: its vrange_purge purges once both marked it");
	check(bits & CHILD_FREED, "fork child: vrange_free of its mapping");
	close(to);
	close(from);

	/*
	 * The inherited mapping holds no pin in the child (the pin is the parent's): marking it in
	 * the child must not drop the parent's pin.
	 */
	fill(s, n * page, 82);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		_exit(mark(s, n * page) ? 0 : 1);
	}
	status = -1;
	waitpid(pid, &status, 0);
	size_t freed = vrange_purge(SIZE_MAX);
	int intact = intact_at(s, 0, n * page, 82);
	check(WIFEXITED(status) && freed == 0 && intact,
	      "fork: a child marking the inherited mapping does not unpin the parent's region");
	check(release(s, n), "vrange_free of the shared region in the parent");
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
	/* Before any region: the reclaimer thread inherits the CPU, so that its MADV_FREE (arming)
	 * and this thread's MADV_PAGEOUT share one per-CPU batch. */
	pin_to_one_cpu();
	uint64_t flags = vrange_feature_flags();
	can_purge = (flags & VRANGE_FEATURE_MADV_FREE) && (flags & VRANGE_FEATURE_MADV_PAGEOUT);

	test_options();
	test_alloc_errors();
	test_free_errors();
	test_policies();
	test_lazy();
	test_managed_purge(VRANGE_MANAGED, "managed");
	test_managed_purge(VRANGE_HYBRID, "hybrid");
	test_managed_purge(VRANGE_MANAGED | VRANGE_HUGE, "managed, huge pages");
	test_boundaries();
	test_priority();
	test_stats();
	test_source_names();
	test_scratch();
	test_sigbus();
	test_refill(0);
	test_refill(VRANGE_FILL_HERE);
	test_hybrid_arming();
	test_shared_errors();
	test_shared_in_process();
	test_shared_fork();

	vrange_reclaimer_stop();
	check(snapshot().reclaimer_running == 0, "vrange_reclaimer_stop stops the thread");
	char *p = alloc(1, VRANGE_MANAGED);
	check(snapshot().reclaimer_running == 1, "a new managed region starts it again");
	release(p, 1);

	printf("1..%d\n", checks);
	if (failures)
		printf("# %d of %d checks failed\n", failures, checks);
	return failures ? 1 : 0;
}
