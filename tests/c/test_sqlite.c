/*
 * C test of vrange_sqlite_pcache() with SQLite itself (Debian's libsqlite3): a database on
 * file, an in-memory one and several connections in threads, with every volatile page purged
 * (vrange_purge) between and inside their work: every query answers the same before and after,
 * a rollback restores what it must, PRAGMA integrity_check says ok, an in-memory database
 * (whose pages are the only copy) loses nothing. Linked with -lsqlite3 and libvrange.so (see
 * crates/vrange-ffi/tests/c_abi.rs).
 *
 * Deterministic: the pressure sources are turned off first, so only this test's vrange_purge()
 * calls purge anything.
 */

#define _GNU_SOURCE

#include <vrange.h>

#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"

#define ROWS 20000

static char dir[] = "/tmp/vrange-sqlite-XXXXXX";
static char path[256];

static void quiet(void)
{
	static const char *settings[][2] = {
		{"VRANGE_PSI", "off"},    {"VRANGE_VMPRESSURE", "0"},
		{"VRANGE_HEADROOM", "0"}, {"VRANGE_BUDGET", "0"},
	};
	int ok = 1;

	for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
		ok &= vrange_set_option(settings[i][0], settings[i][1]) == 0;
	check(ok, "pressure sources off");
}

static int exec(sqlite3 *db, const char *sql)
{
	char *err = NULL;
	int rc = sqlite3_exec(db, sql, NULL, NULL, &err);

	if (rc != SQLITE_OK)
		printf("# %s: %s\n", sql, err ? err : sqlite3_errstr(rc));
	sqlite3_free(err);
	return rc == SQLITE_OK;
}

/* The first column of the first row of sql, as a 64-bit integer (-1 on error). */
static int64_t scalar(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *st;
	int64_t v = -1;

	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		printf("# %s: %s\n", sql, sqlite3_errmsg(db));
		return -1;
	}
	if (sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return v;
}

static int integrity_ok(sqlite3 *db)
{
	sqlite3_stmt *st;
	int ok = 0;

	if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) != SQLITE_OK)
		return 0;
	if (sqlite3_step(st) == SQLITE_ROW)
		ok = strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
	sqlite3_finalize(st);
	return ok;
}

/* A checksum over every row, read through the table and through the index. */
static const char *SUM_TABLE = "SELECT sum(id * length(s) + unicode(substr(s, 10, 1))) FROM t";
static const char *SUM_INDEX =
	"SELECT sum(id) FROM t WHERE s >= '' AND s < 'zzzz' AND id % 7 = 3";

static int make_table(sqlite3 *db, int rows)
{
	char sql[512];

	snprintf(sql, sizeof sql,
		 "CREATE TABLE t(id INTEGER PRIMARY KEY, s TEXT, v BLOB);"
		 "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < %d) "
		 "INSERT INTO t SELECT x, printf('%%08d-%%s', x, hex(x * 2654435761)), "
		 "zeroblob(200 + x %% 700) FROM c;"
		 "CREATE INDEX t_s ON t(s);",
		 rows);
	return exec(db, sql);
}

static void test_file_database(void)
{
	sqlite3 *db;

	check(sqlite3_open(path, &db) == SQLITE_OK, "open %s", path);
	check(exec(db, "PRAGMA cache_size = -400000"), "cache_size 400 MB: every page stays");
	check(make_table(db, ROWS), "%d rows and an index", ROWS);
	int64_t table = scalar(db, SUM_TABLE), index = scalar(db, SUM_INDEX);
	check(table > 0 && index > 0, "checksums %lld %lld", (long long)table, (long long)index);

	ssize_t purged = vrange_purge((size_t)-1);
	check(purged > 1 << 20, "its unpinned pages were volatile: %zd bytes purged", purged);
	check(scalar(db, SUM_TABLE) == table && scalar(db, SUM_INDEX) == index,
	      "after the purge every row reads the same (pages read from the file again)");
	check(integrity_ok(db), "integrity_check ok after a purge");

	/* A transaction whose pages are purged before it rolls back. */
	check(exec(db, "BEGIN; UPDATE t SET s = 'changed' WHERE id % 3 = 0;"), "update in a transaction");
	check(scalar(db, "SELECT count(*) FROM t WHERE s = 'changed'") == ROWS / 3, "it is seen");
	vrange_purge((size_t)-1);
	check(scalar(db, "SELECT count(*) FROM t WHERE s = 'changed'") == ROWS / 3,
	      "dirty pages are pinned: the transaction survives a purge");
	check(exec(db, "ROLLBACK"), "rollback");
	vrange_purge((size_t)-1);
	check(scalar(db, SUM_TABLE) == table && scalar(db, SUM_INDEX) == index,
	      "after the rollback and a purge the rows are as before");

	/* A committed change, then a purge, then a fresh connection. */
	check(exec(db, "UPDATE t SET s = 'kept' WHERE id = 77; DELETE FROM t WHERE id > 19000;"),
	      "update and delete committed");
	vrange_purge((size_t)-1);
	check(scalar(db, "SELECT count(*) FROM t") == 19000 &&
		      scalar(db, "SELECT count(*) FROM t WHERE s = 'kept'") == 1,
	      "the committed change reads back after a purge");
	check(exec(db, "VACUUM"), "vacuum (pages rekeyed and truncated)");
	vrange_purge((size_t)-1);
	check(integrity_ok(db), "integrity_check ok after vacuum and a purge");
	check(sqlite3_db_release_memory(db) == SQLITE_OK, "sqlite3_db_release_memory");
	check(scalar(db, "SELECT count(*) FROM t") == 19000, "rows read after releasing memory");
	sqlite3_close(db);
}

static void test_memory_database(void)
{
	sqlite3 *db;

	check(sqlite3_open(":memory:", &db) == SQLITE_OK, "open :memory:");
	check(exec(db, "PRAGMA cache_size = 10"), "cache_size 10 pages, far under the database");
	check(make_table(db, 5000), "5000 rows in memory");
	int64_t table = scalar(db, SUM_TABLE);
	vrange_purge((size_t)-1);
	check(scalar(db, SUM_TABLE) == table && integrity_ok(db),
	      "an in-memory database loses nothing to a purge or to cache_size (its pages are "
	      "never volatile, never discarded)");
	check(sqlite3_db_release_memory(db) == SQLITE_OK && scalar(db, SUM_TABLE) == table,
	      "nor to sqlite3_db_release_memory");
	sqlite3_close(db);
}

struct reader {
	int64_t expected;
	int rounds_ok;
};

static void *read_rounds(void *arg)
{
	struct reader *r = arg;
	sqlite3 *db;

	if (sqlite3_open(path, &db) != SQLITE_OK)
		return NULL;
	exec(db, "PRAGMA cache_size = -100000");
	for (int i = 0; i < 20; i++)
		r->rounds_ok += scalar(db, SUM_TABLE) == r->expected;
	sqlite3_close(db);
	return NULL;
}

static void test_threads(void)
{
	sqlite3 *db;
	pthread_t t[4];
	struct reader r[4];

	sqlite3_open(path, &db);
	int64_t expected = scalar(db, SUM_TABLE);
	sqlite3_close(db);
	for (int i = 0; i < 4; i++) {
		r[i] = (struct reader){expected, 0};
		pthread_create(&t[i], NULL, read_rounds, &r[i]);
	}
	for (int i = 0; i < 50; i++) {
		vrange_purge((size_t)-1);
		usleep(2000);
	}
	int ok = 1;
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		ok &= r[i].rounds_ok == 20;
	}
	check(ok, "4 connections in threads read the same checksum 20 times each under purges");
}

int main(void)
{
	page = (size_t)sysconf(_SC_PAGESIZE);
	quiet();
	check(sqlite3_config(SQLITE_CONFIG_PCACHE2, vrange_sqlite_pcache()) == SQLITE_OK,
	      "sqlite3_config(SQLITE_CONFIG_PCACHE2, vrange_sqlite_pcache())");
	check(sqlite3_initialize() == SQLITE_OK, "sqlite3_initialize");
	if (!mkdtemp(dir)) {
		check(0, "mkdtemp");
		return 1;
	}
	snprintf(path, sizeof path, "%s/test.db", dir);
	test_file_database();
	test_memory_database();
	test_threads();
	unlink(path);
	rmdir(dir);
	printf("1..%d\n", checks);
	return failures ? 1 : 0;
}
