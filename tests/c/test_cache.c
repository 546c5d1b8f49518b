/*
 * C ABI test of libvrange's caches: vrange_cache_create/put/get/release/remove/stats/destroy,
 * absent (ENOENT) versus purged (ESTALE), pins surviving vrange_purge(), classes, threads, and
 * the error cases. Compiled against include/vrange.h, linked with libvrange.so (see
 * crates/vrange-ffi/tests/c_abi.rs).
 *
 * Deterministic: the pressure sources are turned off first, so only this test's vrange_purge()
 * calls purge anything.
 *
 * Output is TAP-like; exit status 0 only if every check passed.
 */

#define _GNU_SOURCE

#include <vrange.h>

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"

/* The value for key number k, len bytes: never all zero, distinct per key. */
static void make_value(unsigned char *v, size_t len, unsigned k)
{
	for (size_t i = 0; i < len; i++)
		v[i] = (unsigned char)((k * 131 + i * 7) | 1);
}

static int value_ok(const unsigned char *v, size_t len, unsigned k)
{
	for (size_t i = 0; i < len; i++)
		if (v[i] != (unsigned char)((k * 131 + i * 7) | 1))
			return 0;
	return 1;
}

static size_t value_len(unsigned k)
{
	return 100 + (k * 997) % 20000;
}

static void quiet(void)
{
	static const char *settings[][2] = {
		{"VRANGE_PSI", "off"},     {"VRANGE_VMPRESSURE", "0"},
		{"VRANGE_HEADROOM", "0"},  {"VRANGE_BUDGET", "0"},
		{"VRANGE_ARM_DELAY_MS", "3600000"},
	};
	int ok = 1;

	for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
		ok &= vrange_set_option(settings[i][0], settings[i][1]) == 0;
	check(ok, "pressure sources off");
}

static void test_basics(void)
{
	struct vrange_cache *c = vrange_cache_create(NULL);
	unsigned char buf[20200];
	int ok = 1;

	check(c != NULL, "vrange_cache_create(NULL) makes a cache");
	for (unsigned k = 0; k < 500; k++) {
		make_value(buf, value_len(k), k);
		ok &= vrange_cache_put(c, &k, sizeof k, buf, value_len(k), 0) == 0;
	}
	check(ok, "500 values put");
	ok = 1;
	for (unsigned k = 0; k < 500; k++) {
		size_t len = 0;
		const unsigned char *v = vrange_cache_get(c, &k, sizeof k, &len);

		ok &= v != NULL && len == value_len(k) && value_ok(v, len, k);
		ok &= v != NULL && vrange_cache_release(c, v) == 0;
	}
	check(ok, "each value reads back byte for byte, and releases");

	unsigned missing = 100000;
	size_t len = 7;
	errno = 0;
	const void *v = vrange_cache_get(c, &missing, sizeof missing, &len);
	check(v == NULL && errno == ENOENT && len == 7, "absent key: NULL, ENOENT, *vlen untouched");

	unsigned k = 3;
	check(vrange_cache_remove(c, &k, sizeof k) == 0, "remove an entry");
	errno = 0;
	check(vrange_cache_remove(c, &k, sizeof k) == -1 && errno == ENOENT,
	      "remove it again: ENOENT");
	errno = 0;
	check(vrange_cache_get(c, &k, sizeof k, NULL) == NULL && errno == ENOENT,
	      "a removed key: ENOENT");

	/* Replacing a value while a reader holds the old one. */
	k = 4;
	const unsigned char *old = vrange_cache_get(c, &k, sizeof k, &len);
	check(vrange_cache_put(c, &k, sizeof k, "new", 3, VRANGE_DROP_LAST) == 0, "replace a value");
	check(old != NULL && value_ok(old, value_len(4), 4),
	      "the old value stays readable while held");
	const char *now = vrange_cache_get(c, &k, sizeof k, &len);
	check(now != NULL && len == 3 && memcmp(now, "new", 3) == 0, "the new value is found");
	vrange_cache_release(c, now);
	vrange_cache_release(c, old);

	/* Empty keys and values. */
	check(vrange_cache_put(c, NULL, 0, NULL, 0, 0) == 0, "an empty key and value");
	const void *e = vrange_cache_get(c, NULL, 0, &len);
	check(e != NULL && len == 0, "the empty value is found, length 0");
	vrange_cache_release(c, e);

	struct vrange_cache_stats st;
	check(vrange_cache_stats(c, &st, sizeof st) == 0 && st.size == sizeof st, "stats");
	check(st.entries == 500 && st.hits == 503 && st.misses == 2,
	      "stats: 500 entries, 503 hits, 2 misses (%llu, %llu, %llu)",
	      (unsigned long long)st.entries, (unsigned long long)st.hits,
	      (unsigned long long)st.misses);
	check(st.resident_bytes >= st.value_bytes && st.value_bytes > 0 &&
		      st.overhead_bytes == st.resident_bytes - st.value_bytes,
	      "stats: resident = values + overhead");
	check(st.classes[3].inserts == 1 && st.classes[2].inserts == 501,
	      "stats by class: 1 drop-last insert, 501 normal");
	vrange_cache_destroy(c);
}

static void test_purge(void)
{
	struct vrange_cache *c = vrange_cache_create(NULL);
	unsigned char buf[20200];
	size_t len;

	for (unsigned k = 0; k < 200; k++) {
		make_value(buf, value_len(k), k);
		vrange_cache_put(c, &k, sizeof k, buf, value_len(k), k < 100 ? VRANGE_DROP_FIRST : 0);
	}
	/* Read as a program reads: a value's first hit moves it off probation, into a slab of
	 * the values read since; 150 shares one with its neighbours. */
	for (unsigned k = 140; k < 160; k++)
		vrange_cache_release(c, vrange_cache_get(c, &k, sizeof k, NULL));
	unsigned held_key = 150;
	const unsigned char *held = vrange_cache_get(c, &held_key, sizeof held_key, &len);
	size_t freed = vrange_purge((size_t)-1);
	check(freed > 0, "vrange_purge frees the unpinned slabs (%zu bytes)", freed);
	check(held != NULL && value_ok(held, len, 150), "a held value survives the purge intact");

	unsigned k = 0;
	errno = 0;
	check(vrange_cache_get(c, &k, sizeof k, NULL) == NULL && errno == ESTALE,
	      "a purged value: NULL, ESTALE");
	errno = 0;
	check(vrange_cache_get(c, &k, sizeof k, NULL) == NULL && errno == ENOENT,
	      "the purge is reported once: then ENOENT");
	/* A held value keeps its own pages, not its slab: the slab was purged around it, and
	 * its entry went with the slab. */
	errno = 0;
	check(vrange_cache_get(c, &held_key, sizeof held_key, NULL) == NULL && errno == ESTALE,
	      "the held value's entry went with its slab: ESTALE");
	check(value_ok(held, len, 150), "the held value is still intact");
	vrange_cache_release(c, held);

	struct vrange_cache_stats st;
	vrange_cache_stats(c, &st, sizeof st);
	check(st.purged_lookups == 2 && st.classes[0].purged_lookups == 1,
	      "stats count the purged lookups in their classes");
	check(st.classes[0].purged_entries == 100 && st.classes[0].resident_bytes == 0,
	      "every drop-first entry purged (%llu), nothing of that class resident",
	      (unsigned long long)st.classes[0].purged_entries);
	check(st.entries < 200, "purged entries no longer count as held (%llu)",
	      (unsigned long long)st.entries);

	/* Classes: a small purge takes drop-first slabs before normal ones. */
	for (unsigned k = 0; k < 200; k++) {
		make_value(buf, value_len(k), k);
		vrange_cache_put(c, &k, sizeof k, buf, value_len(k), k < 100 ? 0 : VRANGE_DROP_FIRST);
	}
	vrange_purge(1);
	int first_gone = 0, normal_kept = 1;
	for (unsigned k = 0; k < 200; k++) {
		const unsigned char *v = vrange_cache_get(c, &k, sizeof k, &len);
		if (k >= 100 && v == NULL && errno == ESTALE)
			first_gone++;
		if (k < 100)
			normal_kept &= v != NULL && value_ok(v, len, k);
		if (v)
			vrange_cache_release(c, v);
	}
	check(first_gone > 0 && normal_kept,
	      "a small purge takes drop-first values (%d) and no normal one", first_gone);
	vrange_cache_destroy(c);
}

struct worker {
	struct vrange_cache *c;
	unsigned id;
	int bad;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	unsigned char buf[20200];
	unsigned seed = w->id * 7919 + 1;

	for (int i = 0; i < 20000; i++) {
		seed = seed * 1103515245 + 12345;
		unsigned k = (seed >> 8) % 300;
		size_t len;

		switch ((seed >> 4) % 4) {
		case 0:
			make_value(buf, value_len(k), k);
			vrange_cache_put(w->c, &k, sizeof k, buf, value_len(k), 0);
			break;
		case 1:
			vrange_cache_remove(w->c, &k, sizeof k);
			break;
		default: {
			const unsigned char *v = vrange_cache_get(w->c, &k, sizeof k, &len);
			if (v) {
				w->bad += !(len == value_len(k) && value_ok(v, len, k));
				vrange_cache_release(w->c, v);
			} else if (errno != ENOENT && errno != ESTALE) {
				w->bad++;
			}
		}
		}
		if (w->id == 0 && i % 2000 == 0)
			vrange_purge((size_t)-1);
	}
	return NULL;
}

static void test_threads(void)
{
	struct vrange_cache *c = vrange_cache_create(NULL);
	struct worker w[4];
	pthread_t t[4];
	int bad = 0;

	for (unsigned i = 0; i < 4; i++) {
		w[i] = (struct worker){c, i, 0};
		pthread_create(&t[i], NULL, work, &w[i]);
	}
	for (unsigned i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		bad += w[i].bad;
	}
	check(bad == 0, "4 threads mixing put, get, remove and purges: every value right (%d bad)",
	      bad);
	vrange_cache_destroy(c);
}

static void test_errors(void)
{
	struct vrange_cache_options o = {sizeof o, 0, 0, 7};
	int k = 1;

	errno = 0;
	check(vrange_cache_create(&o) == NULL && errno == EINVAL, "bad flags: EINVAL");
	o = (struct vrange_cache_options){4, 0, 0, 0};
	errno = 0;
	check(vrange_cache_create(&o) == NULL && errno == EINVAL, "a too small options size: EINVAL");
	o = (struct vrange_cache_options){sizeof o, 64 << 10, 1 << 20, VRANGE_MANAGED};
	struct vrange_cache *c = vrange_cache_create(&o);
	check(c != NULL, "options: 64 KiB slabs, a 1 MiB budget, managed");

	errno = 0;
	check(vrange_cache_put(NULL, &k, sizeof k, "x", 1, 0) == -1 && errno == EINVAL,
	      "NULL cache: EINVAL");
	errno = 0;
	check(vrange_cache_put(c, &k, sizeof k, "x", 1, 3) == -1 && errno == EINVAL,
	      "bad priority: EINVAL");
	errno = 0;
	check(vrange_cache_put(c, NULL, 4, "x", 1, 0) == -1 && errno == EINVAL,
	      "NULL key with a length: EINVAL");
	errno = 0;
	check(vrange_cache_release(c, &k) == -1 && errno == EINVAL,
	      "releasing a pointer that is no value: EINVAL");
	vrange_cache_put(c, &k, sizeof k, "x", 1, 0);
	const void *v = vrange_cache_get(c, &k, sizeof k, NULL);
	check(vrange_cache_release(c, v) == 0, "release once");
	errno = 0;
	check(vrange_cache_release(c, v) == -1 && errno == EINVAL, "release twice: EINVAL");
	errno = 0;
	check(vrange_cache_stats(c, NULL, 100) == -1 && errno == EINVAL, "stats into NULL: EINVAL");

	/* The budget: 4 MiB put into a cache that keeps 1 MiB. */
	unsigned char buf[16384];
	for (unsigned i = 0; i < 256; i++) {
		make_value(buf, sizeof buf, i);
		vrange_cache_put(c, &i, sizeof i, buf, sizeof buf, 0);
	}
	struct vrange_cache_stats st;
	vrange_cache_stats(c, &st, sizeof st);
	check(st.resident_bytes <= (1 << 20) && st.classes[2].purged_entries > 0,
	      "the cache keeps its budget (%llu bytes resident)",
	      (unsigned long long)st.resident_bytes);
	unsigned last = 255;
	size_t len;
	const unsigned char *newest = vrange_cache_get(c, &last, sizeof last, &len);
	check(newest != NULL && value_ok(newest, len, 255), "the newest value is kept");
	vrange_cache_release(c, newest);
	vrange_cache_destroy(c);
}

/*
 * Regression: a second release of one value, or a release of an address inside a value,
 * returned 0 and dropped the pin of another value of the slab, so vrange_purge() purged the
 * slab under a live reader (va[0] read 0) and the real release failed with EINVAL.
 */
static void test_release_drops_no_other_pin(void)
{
	struct vrange_cache *c = vrange_cache_create(NULL);
	struct vrange_cache *other = vrange_cache_create(NULL);
	unsigned char a[100], b[100];
	size_t la = 0;

	make_value(a, sizeof a, 1);
	make_value(b, sizeof b, 2);
	vrange_cache_put(c, "a", 1, a, sizeof a, 0);
	vrange_cache_put(c, "b", 1, b, sizeof b, 0);
	const unsigned char *va = vrange_cache_get(c, "a", 1, &la);
	const unsigned char *vb = vrange_cache_get(c, "b", 1, NULL);
	check(va != NULL && vb != NULL, "two values of one slab got");
	check(vrange_cache_release(c, vb) == 0, "release b");
	errno = 0;
	check(vrange_cache_release(c, vb) == -1 && errno == EINVAL, "release b again: EINVAL");
	errno = 0;
	check(vrange_cache_release(c, va + 1) == -1 && errno == EINVAL,
	      "release of an address inside a held value: EINVAL");
	errno = 0;
	check(vrange_cache_release(other, va) == -1 && errno == EINVAL,
	      "release of another cache's value: EINVAL");
	vrange_purge((size_t)-1);
	check(value_ok(va, la, 1), "the held value survives a purge after the bad releases");
	check(vrange_cache_release(c, va) == 0, "the real release of a succeeds");
	errno = 0;
	check(vrange_cache_release(c, va) == -1 && errno == EINVAL, "and only once");

	/* One value got twice is released twice. */
	const void *v1 = vrange_cache_get(c, "a", 1, NULL);
	const void *v2 = vrange_cache_get(c, "a", 1, NULL);
	check(v1 == v2 && vrange_cache_release(c, v1) == 0 && vrange_cache_release(c, v2) == 0,
	      "a value got twice releases twice");
	errno = 0;
	check(vrange_cache_release(c, v1) == -1 && errno == EINVAL, "a third time: EINVAL");
	vrange_cache_destroy(other);
	vrange_cache_destroy(c);
}

/*
 * Regression: vrange_cache_put() of SIZE_MAX bytes overflowed the cache's size arithmetic and
 * segfaulted in the copy instead of failing with ENOMEM; an impossible slab_bytes made a cache
 * whose every put failed.
 */
static void test_impossible_sizes(void)
{
	struct vrange_cache *c = vrange_cache_create(NULL);
	static const size_t huge[] = {SIZE_MAX, SIZE_MAX - 10, SIZE_MAX / 2, (size_t)1 << 62};

	check(vrange_cache_put(c, "x", 1, "x", 1, 0) == 0, "a first put");
	for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
		errno = 0;
		check(vrange_cache_put(c, "k", 1, "v", huge[i], 0) == -1 && errno == ENOMEM,
		      "a put of %zu bytes: ENOMEM", huge[i]);
	}
	errno = 0;
	check(vrange_cache_get(c, "k", 1, NULL) == NULL && errno == ENOENT, "nothing was put");
	vrange_cache_destroy(c);

	struct vrange_cache_options o = {sizeof o, (uint64_t)1 << 62, 0, 0};
	errno = 0;
	check(vrange_cache_create(&o) == NULL && errno == EINVAL,
	      "slab_bytes of 2^62: NULL, EINVAL at creation");
	o.slab_bytes = UINT64_MAX;
	errno = 0;
	check(vrange_cache_create(&o) == NULL && errno == EINVAL, "slab_bytes of 2^64-1: EINVAL");
}

/* Regression: a call with a destroyed handle read the freed handle. */
static void test_after_destroy(void)
{
	struct vrange_cache *c = vrange_cache_create(NULL);
	size_t len;

	vrange_cache_put(c, "a", 1, "held", 4, 0);
	const char *held = vrange_cache_get(c, "a", 1, &len);
	vrange_cache_destroy(c);
	check(held != NULL && len == 4 && memcmp(held, "held", 4) == 0,
	      "a value held at destroy stays readable");
	/* The allocator would hand a freed handle's memory to the next cache. */
	struct vrange_cache *next = vrange_cache_create(NULL);
	vrange_cache_put(next, "a", 1, "next", 4, 0);
	check(next != c, "a new cache never gets a destroyed handle's address");
	errno = 0;
	check(vrange_cache_release(c, held) == -1 && errno == EINVAL,
	      "release after destroy: EINVAL");
	errno = 0;
	check(vrange_cache_get(c, "a", 1, NULL) == NULL && errno == EINVAL,
	      "get after destroy: EINVAL");
	errno = 0;
	check(vrange_cache_put(c, "a", 1, "x", 1, 0) == -1 && errno == EINVAL,
	      "put after destroy: EINVAL");
	struct vrange_cache_stats st;
	errno = 0;
	check(vrange_cache_stats(c, &st, sizeof st) == -1 && errno == EINVAL,
	      "stats after destroy: EINVAL");
	vrange_cache_destroy(c); /* a second destroy does nothing */
	const char *v = vrange_cache_get(next, "a", 1, NULL);
	check(v != NULL && memcmp(v, "next", 4) == 0, "the new cache is untouched");
	vrange_cache_release(next, v);
	vrange_cache_destroy(next);
}

/*
 * Regression: resident_bytes counted whole slabs not known to be purged (34 bytes of values
 * reported 256 KiB); stats showed no pinned bytes.
 */
static void test_stats_figures(void)
{
	struct vrange_cache *c = vrange_cache_create(NULL);
	struct vrange_cache_stats st;
	char v[17];

	memset(v, 'v', sizeof v);
	vrange_cache_put(c, "a", 1, v, sizeof v, 0);
	vrange_cache_put(c, "b", 1, v, sizeof v, 0);
	vrange_cache_stats(c, &st, sizeof st);
	check(st.value_bytes == 34 && st.resident_bytes == page,
	      "34 bytes of values: one page resident (%llu)", (unsigned long long)st.resident_bytes);
	check(st.mapped_bytes == 256 << 10, "the slab's 256 KiB are mapped (%llu)",
	      (unsigned long long)st.mapped_bytes);
	check(st.pinned_bytes == 0, "nothing pinned");
	const void *held = vrange_cache_get(c, "a", 1, NULL);
	vrange_cache_stats(c, &st, sizeof st);
	check(st.pinned_bytes == page, "a held value pins its own page (%llu)",
	      (unsigned long long)st.pinned_bytes);
	vrange_cache_release(c, held);
	vrange_cache_stats(c, &st, sizeof st);
	check(st.pinned_bytes == 0, "released: nothing pinned");

	/* An older caller's smaller struct gets the fields it knows. */
	struct vrange_cache_stats old;
	size_t old_size = offsetof(struct vrange_cache_stats, mapped_bytes);
	memset(&old, 0xff, sizeof old);
	check(vrange_cache_stats(c, &old, old_size) == 0 && old.size == old_size &&
		      old.value_bytes == 34 && old.mapped_bytes == UINT64_MAX,
	      "a smaller size fills only the fields it covers");
	vrange_cache_destroy(c);
}

/* Probation: a value read once outlives a younger scan of values never read; without it,
 * the oldest slab goes first. */
static int scan_then_purge(uint64_t flags, uint64_t *promoted)
{
	struct vrange_cache_options o = {sizeof o, 64 << 10, 0, flags};
	struct vrange_cache *c = vrange_cache_create(&o);
	unsigned char buf[4096];
	for (unsigned k = 0; k < 8; k++) {
		make_value(buf, sizeof buf, k);
		vrange_cache_put(c, &k, sizeof k, buf, sizeof buf, 0);
	}
	for (unsigned k = 0; k < 8; k++)
		vrange_cache_release(c, vrange_cache_get(c, &k, sizeof k, NULL));
	struct vrange_cache_stats st;
	vrange_cache_stats(c, &st, sizeof st);
	*promoted = st.promoted[2];
	for (unsigned k = 100; k < 200; k++) {
		make_value(buf, sizeof buf, k);
		vrange_cache_put(c, &k, sizeof k, buf, sizeof buf, 0);
	}
	vrange_purge(1);
	unsigned k = 0;
	const void *v = vrange_cache_get(c, &k, sizeof k, NULL);
	int kept = v != NULL;
	if (v)
		vrange_cache_release(c, v);
	vrange_cache_destroy(c);
	return kept;
}

static void test_probation(void)
{
	uint64_t promoted;
	vrange_purge((size_t)-1);
	check(scan_then_purge(0, &promoted), "probation: a value read once outlives a younger scan");
	check(promoted == 8, "probation: each value's first hit moved it (promoted[2] = 8)");
	vrange_purge((size_t)-1);
	check(!scan_then_purge(VRANGE_CACHE_NO_PROBATION, &promoted),
	      "VRANGE_CACHE_NO_PROBATION: the oldest slab goes first");
	check(promoted == 0, "VRANGE_CACHE_NO_PROBATION: nothing promoted");
	struct vrange_cache_options o = {sizeof o, 0, 0, (uint64_t)1 << 13};
	errno = 0;
	check(vrange_cache_create(&o) == NULL && errno == EINVAL, "an unknown cache flag: EINVAL");
}

int main(void)
{
	page = (size_t)sysconf(_SC_PAGESIZE);
	quiet();
	test_basics();
	test_purge();
	test_threads();
	test_errors();
	test_release_drops_no_other_pin();
	test_impossible_sizes();
	test_after_destroy();
	test_stats_figures();
	test_probation();
	printf("1..%d\n", checks);
	return failures ? 1 : 0;
}
