/*
 * SQLite on vrange_sqlite_pcache() under real memory pressure (run by
 * crates/vrange-ffi/tests/c_abi.rs in a memory cgroup smaller than the database):
 *
 *   sqlite_stress create DB ROWS      makes the database (outside the cgroup)
 *   sqlite_stress stress DB SECONDS   THREADS connections, each with cache_size sized for
 *                 THREADS             all memory, each reading the whole database once and
 *                                     then mixing checked reads, transactions that commit or
 *                                     roll back, and range scans
 *   sqlite_stress stress-plain ...    the same on SQLite's own page cache
 *
 * Each thread owns the rows whose id is its number modulo THREADS and remembers their
 * versions (read at its start): every read of an owned row must show the version last
 * committed. Prints one line,
 * "DONE wrong=... reads=... commits=... rollbacks=... scans=... busy=... integrity=...
 * purged_bytes=...", and exits 0 unless something went wrong.
 */

#define _GNU_SOURCE

#include <vrange.h>

#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *db_path;
static int threads;
static double seconds;
static int64_t rows;

struct worker {
	int n;
	int64_t *ver; /* by id / threads */
	uint64_t rng;
	long wrong, reads, commits, rollbacks, scans, busy;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* The text of row id at version v. */
static void text(char *out, size_t len, int64_t id, int64_t v)
{
	snprintf(out, len, "row %lld version %lld", (long long)id, (long long)v);
}

static int exec(sqlite3 *db, const char *sql)
{
	return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

static int64_t own_id(struct worker *w)
{
	int64_t k = (int64_t)(next(&w->rng) % (uint64_t)(rows / threads));
	return k * threads + w->n + 1; /* ids start at 1; id - 1 = k * threads + n */
}

static void *work(void *arg)
{
	struct worker *w = arg;
	sqlite3 *db;
	sqlite3_stmt *get, *set;
	char want[64];

	if (sqlite3_open(db_path, &db) != SQLITE_OK) {
		w->wrong++;
		return NULL;
	}
	sqlite3_busy_timeout(db, 20000);
	exec(db, "PRAGMA cache_size = -1000000"); /* 1 GB: sized for all memory */
	/* A whole scan first: every connection's cache would hold the whole database. */
	sqlite3_stmt *all;
	sqlite3_prepare_v2(db, "SELECT count(*), sum(length(pad)) FROM t", -1, &all, NULL);
	if (sqlite3_step(all) != SQLITE_ROW || sqlite3_column_int64(all, 0) != rows) {
		fprintf(stderr, "# the whole scan did not see %lld rows\n", (long long)rows);
		w->wrong++;
	}
	sqlite3_finalize(all);
	/* The versions its rows hold now (an earlier run may have changed them). */
	sqlite3_prepare_v2(db, "SELECT id, ver FROM t WHERE (id - 1) % ? = ?", -1, &all, NULL);
	sqlite3_bind_int(all, 1, threads);
	sqlite3_bind_int(all, 2, w->n);
	while (sqlite3_step(all) == SQLITE_ROW)
		w->ver[(sqlite3_column_int64(all, 0) - 1) / threads] = sqlite3_column_int64(all, 1);
	sqlite3_finalize(all);
	sqlite3_prepare_v2(db, "SELECT ver, s FROM t WHERE id = ?", -1, &get, NULL);
	sqlite3_prepare_v2(db, "UPDATE t SET ver = ?, s = ? WHERE id = ?", -1, &set, NULL);
	double end = now() + seconds;
	while (now() < end) {
		unsigned dice = (unsigned)(next(&w->rng) % 10);
		if (dice < 5) {
			int64_t id = own_id(w);
			sqlite3_bind_int64(get, 1, id);
			int rc = sqlite3_step(get);
			if (rc == SQLITE_ROW) {
				int64_t v = sqlite3_column_int64(get, 0);
				text(want, sizeof want, id, w->ver[(id - 1) / threads]);
				const char *s = (const char *)sqlite3_column_text(get, 1);
				int bad = v != w->ver[(id - 1) / threads] || !s || strcmp(s, want) != 0;
				if (bad && w->wrong < 5)
					fprintf(stderr, "# read %lld: ver %lld (want %lld), s \"%s\"\n",
						(long long)id, (long long)v,
						(long long)w->ver[(id - 1) / threads], s ? s : "(null)");
				w->wrong += bad;
				w->reads++;
			} else if (rc == SQLITE_BUSY) {
				w->busy++;
			} else {
				fprintf(stderr, "# read %lld: %s\n", (long long)id, sqlite3_errstr(rc));
				w->wrong++;
			}
			sqlite3_reset(get);
		} else if (dice < 8) {
			if (exec(db, "BEGIN IMMEDIATE") != SQLITE_OK) {
				w->busy++;
				continue;
			}
			int64_t ids[5], newv[5];
			int ok = 1;
			for (int i = 0; i < 5; i++) {
				ids[i] = own_id(w);
				/* From the committed version: a row updated twice ends at the later. */
				newv[i] = w->ver[(ids[i] - 1) / threads] + 1 + i * 1000000;
				text(want, sizeof want, ids[i], newv[i]);
				sqlite3_bind_int64(set, 1, newv[i]);
				sqlite3_bind_text(set, 2, want, -1, SQLITE_TRANSIENT);
				sqlite3_bind_int64(set, 3, ids[i]);
				ok &= sqlite3_step(set) == SQLITE_DONE;
				sqlite3_reset(set);
			}
			if (!ok || next(&w->rng) % 5 == 0) {
				w->rollbacks += exec(db, "ROLLBACK") == SQLITE_OK;
				w->wrong += !ok;
			} else if (exec(db, "COMMIT") == SQLITE_OK) {
				for (int i = 0; i < 5; i++)
					w->ver[(ids[i] - 1) / threads] = newv[i];
				w->commits++;
			} else {
				exec(db, "ROLLBACK");
				w->busy++;
			}
		} else {
			sqlite3_stmt *scan;
			int64_t a = (int64_t)(next(&w->rng) % (uint64_t)(rows - 600)) + 1;
			sqlite3_prepare_v2(db, "SELECT count(*) FROM t WHERE id BETWEEN ? AND ? + 499",
					   -1, &scan, NULL);
			sqlite3_bind_int64(scan, 1, a);
			sqlite3_bind_int64(scan, 2, a);
			int rc = sqlite3_step(scan);
			if (rc == SQLITE_ROW && sqlite3_column_int64(scan, 0) != 500) {
				if (w->wrong < 5)
					fprintf(stderr, "# scan from %lld: %lld rows\n", (long long)a,
						(long long)sqlite3_column_int64(scan, 0));
				w->wrong++;
			} else if (rc != SQLITE_ROW && rc != SQLITE_BUSY) {
				fprintf(stderr, "# scan: %s\n", sqlite3_errstr(rc));
				w->wrong++;
			}
			w->busy += rc == SQLITE_BUSY;
			sqlite3_finalize(scan);
			w->scans++;
		}
	}
	sqlite3_finalize(get);
	sqlite3_finalize(set);
	sqlite3_close(db);
	return NULL;
}

static int create(int64_t n)
{
	sqlite3 *db;
	char sql[512];

	if (sqlite3_open(db_path, &db) != SQLITE_OK)
		return 1;
	snprintf(sql, sizeof sql,
		 "PRAGMA journal_mode = WAL;"
		 "CREATE TABLE t(id INTEGER PRIMARY KEY, ver INTEGER, s TEXT, pad BLOB);"
		 "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < %lld) "
		 "INSERT INTO t SELECT x, 0, 'row ' || x || ' version 0', zeroblob(1000) FROM c;",
		 (long long)n);
	int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
	sqlite3_close(db);
	printf("CREATED rows=%lld rc=%d\n", (long long)n, rc);
	return rc != SQLITE_OK;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s create DB ROWS | stress DB SECONDS THREADS\n", argv[0]);
		return 2;
	}
	db_path = argv[2];
	/* "stress-plain": the same on SQLite's own page cache, for comparison. */
	int plain = strcmp(argv[1], "stress-plain") == 0;
	if ((!plain && sqlite3_config(SQLITE_CONFIG_PCACHE2, vrange_sqlite_pcache()) != SQLITE_OK) ||
	    sqlite3_initialize() != SQLITE_OK) {
		fprintf(stderr, "cannot install vrange_sqlite_pcache()\n");
		return 1;
	}
	if (strcmp(argv[1], "create") == 0)
		return create(atoll(argv[3]));
	if (argc < 5)
		return 2;
	seconds = atof(argv[3]);
	threads = atoi(argv[4]);
	sqlite3 *db;
	if (sqlite3_open(db_path, &db) != SQLITE_OK)
		return 1;
	sqlite3_stmt *st;
	sqlite3_prepare_v2(db, "SELECT max(id) FROM t", -1, &st, NULL);
	sqlite3_step(st);
	rows = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);

	pthread_t t[64];
	struct worker w[64];
	if (threads < 1 || threads > 64 || rows < 1000)
		return 2;
	for (int i = 0; i < threads; i++) {
		w[i] = (struct worker){.n = i, .rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)};
		w[i].ver = calloc((size_t)(rows / threads + 1), sizeof(int64_t));
		pthread_create(&t[i], NULL, work, &w[i]);
	}
	long wrong = 0, reads = 0, commits = 0, rollbacks = 0, scans = 0, busy = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		wrong += w[i].wrong;
		reads += w[i].reads;
		commits += w[i].commits;
		rollbacks += w[i].rollbacks;
		scans += w[i].scans;
		busy += w[i].busy;
	}

	int integrity = 0;
	if (sqlite3_open(db_path, &db) == SQLITE_OK &&
	    sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK) {
		integrity = sqlite3_step(st) == SQLITE_ROW &&
			    strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
		sqlite3_finalize(st);
	}
	sqlite3_close(db);
	struct vrange_stats s;
	vrange_stats(&s, sizeof s);
	printf("DONE wrong=%ld reads=%ld commits=%ld rollbacks=%ld scans=%ld busy=%ld integrity=%s "
	       "purged_bytes=%llu\n",
	       wrong, reads, commits, rollbacks, scans, busy, integrity ? "ok" : "BAD",
	       (unsigned long long)s.purged_total_bytes);
	return wrong || !integrity;
}
