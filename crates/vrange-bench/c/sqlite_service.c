/*
 * The sqlite suite's service (crates/vrange-bench/src/sqlite.rs): one SQLite connection
 * answering a mix in the manner of SQLite's speedtest1 (indexed lookups, range scans and
 * small write transactions) over a file database, on one of three page caches.
 *
 *   sqlite_service create DB ROWS
 *       makes the database: t(id INTEGER PRIMARY KEY, k INTEGER, ver INTEGER, v TEXT) with an
 *       index on k, ROWS rows of 100 to 1,299 bytes of text; WAL journal. Prints
 *       "created sqlite=VERSION" (the library's).
 *   sqlite_service serve DB CACHE EPOCH_NS END_NS [LIBVRANGE]
 *       CACHE: "default" (SQLite's own page cache at its default cache_size, -2000: 2 MB),
 *       "all:KIB" (SQLite's own page cache, cache_size -KIB), or "vrange:KIB"
 *       (vrange_sqlite_pcache() from LIBVRANGE, loaded with dlopen, cache_size -KIB).
 *       Drops the file's pages from the kernel's page cache first (so that what it reads is
 *       charged to its own memory cgroup), waits for EPOCH_NS (CLOCK_MONOTONIC), then works
 *       until END_NS, printing for every second after the epoch
 *       "sec n=N ops=... reads=... disk_kib=... wrong=... rss_kib=...": operations done,
 *       read system calls (SQLite's reads of the file), KiB read from the disk (not the
 *       kernel's page cache), rows whose text did not match their id and version, and its
 *       resident memory at the second's end; "done" at the end.
 *
 * One operation is, at random, an indexed lookup of one row by k (75 %), a range scan of 20
 * rows by id (20 %), or a transaction updating 5 rows (5 %). Every row read is checked. It
 * makes itself the OOM killer's first choice (oom_score_adj 1000), so that the neighbour is
 * spared. Exit status 0 at the end, 1 on an SQLite error, 2 on bad arguments.
 */

#define _GNU_SOURCE

#ifdef VRANGE_BENCH_NO_SQLITE
/* Built where libsqlite3-dev was missing (build.rs). */
#include <stdio.h>
int main(void)
{
	fputs("sqlite_service: built without SQLite (install libsqlite3-dev and rebuild)\n", stderr);
	return 3;
}
#else

#include "prng.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

/* The key of row id: a bijection of 1..2^32, so k's order is not id's. */
static int64_t key_of(int64_t id)
{
	return (int64_t)(((uint64_t)id * 2654435761ULL) & 0xffffffffULL);
}

/* The text of row id at version ver: 100 to 1,299 bytes, its id and version, then a letter of
 * both repeated. */
static size_t text_of(char *out, int64_t id, int64_t ver)
{
	size_t len = 100 + (size_t)((uint64_t)id * 7919 % 1200);
	int head = snprintf(out, len + 1, "row %lld version %lld ", (long long)id,
			    (long long)ver);
	memset(out + head, 'a' + (int)((id + ver) % 26), len - (size_t)head);
	out[len] = 0;
	return len;
}

static void die(sqlite3 *db, const char *what)
{
	fprintf(stderr, "sqlite_service: %s: %s\n", what, db ? sqlite3_errmsg(db) : "?");
	exit(1);
}

static void exec(sqlite3 *db, const char *sql)
{
	if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
		die(db, sql);
}

static sqlite3_stmt *prepare(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *s;
	if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
		die(db, sql);
	return s;
}

static int create(const char *path, int64_t rows)
{
	sqlite3 *db;
	static char text[1400];
	unlink(path);
	if (sqlite3_open(path, &db) != SQLITE_OK)
		die(db, "open");
	exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;"
		 "CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, ver INTEGER, v TEXT);"
		 "BEGIN");
	sqlite3_stmt *ins = prepare(db, "INSERT INTO t VALUES (?, ?, 0, ?)");
	for (int64_t id = 1; id <= rows; id++) {
		size_t len = text_of(text, id, 0);
		sqlite3_bind_int64(ins, 1, id);
		sqlite3_bind_int64(ins, 2, key_of(id));
		sqlite3_bind_text(ins, 3, text, (int)len, SQLITE_STATIC);
		if (sqlite3_step(ins) != SQLITE_DONE)
			die(db, "insert");
		sqlite3_reset(ins);
	}
	sqlite3_finalize(ins);
	exec(db, "COMMIT; CREATE INDEX tk ON t(k); PRAGMA wal_checkpoint(TRUNCATE)");
	sqlite3_close(db);
	printf("created sqlite=%s\n", sqlite3_libversion());
	return 0;
}

/* The process's counters of /proc/self/io and /proc/self/statm. */
static void io_counts(uint64_t *syscr, uint64_t *read_bytes)
{
	char line[128];
	FILE *f = fopen("/proc/self/io", "r");
	*syscr = *read_bytes = 0;
	if (!f)
		return;
	while (fgets(line, sizeof line, f)) {
		unsigned long long v;
		if (sscanf(line, "syscr: %llu", &v) == 1)
			*syscr = v;
		else if (sscanf(line, "read_bytes: %llu", &v) == 1)
			*read_bytes = v;
	}
	fclose(f);
}

static uint64_t rss_kib(void)
{
	unsigned long long size = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%llu %llu", &size, &resident) != 2)
			resident = 0;
		fclose(f);
	}
	return resident * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
}

struct second {
	uint64_t ops, wrong;
};

/* Checks a row the statement holds (columns id, ver, v). */
static int row_ok(sqlite3_stmt *s, int64_t want_id)
{
	static char want[1400];
	int64_t id = sqlite3_column_int64(s, 0);
	int64_t ver = sqlite3_column_int64(s, 1);
	const char *v = (const char *)sqlite3_column_text(s, 2);
	size_t len = text_of(want, id, ver);
	return (want_id == 0 || id == want_id) && v &&
	       (size_t)sqlite3_column_bytes(s, 2) == len && memcmp(v, want, len) == 0;
}

static int serve(const char *path, const char *cache, uint64_t epoch, uint64_t end,
		 const char *lib)
{
	long kib = 0;
	FILE *adj = fopen("/proc/self/oom_score_adj", "w");
	if (adj) {
		fputs("1000", adj);
		fclose(adj);
	}
	if (strncmp(cache, "vrange:", 7) == 0) {
		kib = atol(cache + 7);
		void *h = lib ? dlopen(lib, RTLD_NOW) : NULL;
		const void *(*pcache)(void) = h ? (const void *(*)(void))dlsym(h, "vrange_sqlite_pcache") : NULL;
		if (!pcache) {
			fprintf(stderr, "sqlite_service: vrange_sqlite_pcache from %s: %s\n",
				lib ? lib : "(no library given)", dlerror());
			return 2;
		}
		if (sqlite3_config(SQLITE_CONFIG_PCACHE2, pcache()) != SQLITE_OK) {
			fprintf(stderr, "sqlite_service: SQLITE_CONFIG_PCACHE2 refused\n");
			return 1;
		}
	} else if (strncmp(cache, "all:", 4) == 0) {
		kib = atol(cache + 4);
	} else if (strcmp(cache, "default") != 0) {
		fprintf(stderr, "sqlite_service: unknown cache %s\n", cache);
		return 2;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
	}
	sqlite3 *db;
	if (sqlite3_open(path, &db) != SQLITE_OK)
		die(db, "open");
	exec(db, "PRAGMA synchronous = OFF");
	if (kib > 0) {
		char sql[64];
		snprintf(sql, sizeof sql, "PRAGMA cache_size = -%ld", kib);
		exec(db, sql);
	}
	sqlite3_stmt *count = prepare(db, "SELECT max(id) FROM t");
	if (sqlite3_step(count) != SQLITE_ROW)
		die(db, "max(id)");
	int64_t rows = sqlite3_column_int64(count, 0);
	sqlite3_finalize(count);
	sqlite3_stmt *lookup = prepare(db, "SELECT id, ver, v FROM t WHERE k = ?");
	sqlite3_stmt *range = prepare(db, "SELECT id, ver, v FROM t WHERE id BETWEEN ? AND ?");
	sqlite3_stmt *ver = prepare(db, "SELECT ver FROM t WHERE id = ?");
	sqlite3_stmt *set = prepare(db, "UPDATE t SET ver = ?, v = ? WHERE id = ?");
	uint64_t rng = prng_seed((uint64_t)getpid() ^ epoch);
	static char text[1400];

	while (now_ns() < epoch)
		usleep(1000);
	uint64_t t = now_ns();
	uint64_t sec = (t - epoch) / 1000000000ULL;
	struct second c = {0, 0};
	uint64_t syscr0, disk0;
	io_counts(&syscr0, &disk0);
	for (;;) {
		for (int i = 0; i < 16; i++) {
			unsigned dice = (unsigned)(prng_next(&rng) % 100);
			int64_t id = 1 + (int64_t)(prng_next(&rng) % (uint64_t)rows);
			if (dice < 75) {
				sqlite3_bind_int64(lookup, 1, key_of(id));
				int rc = sqlite3_step(lookup);
				if (rc != SQLITE_ROW)
					die(db, "lookup");
				c.wrong += !row_ok(lookup, id);
				sqlite3_reset(lookup);
			} else if (dice < 95) {
				int64_t n = 0;
				sqlite3_bind_int64(range, 1, id);
				sqlite3_bind_int64(range, 2, id + 19);
				while (sqlite3_step(range) == SQLITE_ROW) {
					c.wrong += !row_ok(range, 0);
					n++;
				}
				c.wrong += n != (id + 19 <= rows ? 20 : rows - id + 1);
				sqlite3_reset(range);
			} else {
				exec(db, "BEGIN IMMEDIATE");
				for (int j = 0; j < 5; j++) {
					int64_t u = 1 + (int64_t)(prng_next(&rng) % (uint64_t)rows);
					sqlite3_bind_int64(ver, 1, u);
					if (sqlite3_step(ver) != SQLITE_ROW)
						die(db, "ver");
					int64_t v = sqlite3_column_int64(ver, 0) + 1;
					sqlite3_reset(ver);
					size_t len = text_of(text, u, v);
					sqlite3_bind_int64(set, 1, v);
					sqlite3_bind_text(set, 2, text, (int)len, SQLITE_STATIC);
					sqlite3_bind_int64(set, 3, u);
					if (sqlite3_step(set) != SQLITE_DONE)
						die(db, "update");
					sqlite3_reset(set);
				}
				exec(db, "COMMIT");
			}
			c.ops++;
		}
		t = now_ns();
		uint64_t n = (t - epoch) / 1000000000ULL;
		if (n != sec || t >= end) {
			uint64_t syscr, disk;
			io_counts(&syscr, &disk);
			printf("sec n=%llu ops=%llu reads=%llu disk_kib=%llu wrong=%llu rss_kib=%llu\n",
			       (unsigned long long)sec, (unsigned long long)c.ops,
			       (unsigned long long)(syscr - syscr0),
			       (unsigned long long)((disk - disk0) / 1024),
			       (unsigned long long)c.wrong, (unsigned long long)rss_kib());
			fflush(stdout);
			syscr0 = syscr;
			disk0 = disk;
			sec = n;
			c.ops = c.wrong = 0;
		}
		if (t >= end)
			break;
	}
	sqlite3_finalize(lookup);
	sqlite3_finalize(range);
	sqlite3_finalize(ver);
	sqlite3_finalize(set);
	sqlite3_close(db);
	puts("done");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "create") == 0 && atoll(argv[3]) > 0)
		return create(argv[2], atoll(argv[3]));
	if ((argc == 6 || argc == 7) && strcmp(argv[1], "serve") == 0)
		return serve(argv[2], argv[3], strtoull(argv[4], NULL, 10),
			     strtoull(argv[5], NULL, 10), argc == 7 ? argv[6] : NULL);
	fprintf(stderr, "usage: sqlite_service create DB ROWS\n"
			"       sqlite_service serve DB CACHE EPOCH_NS END_NS [LIBVRANGE]\n");
	return 2;
}

#endif
