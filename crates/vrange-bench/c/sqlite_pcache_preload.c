/* Installs vrange's SQLite page cache (vrange_sqlite_pcache()) before the program's SQLite
 * initializes: preloaded into a program that uses the system's SQLite (speedtest1.sh), it
 * replaces SQLite's default page cache without a change to the program. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <vrange.h>

__attribute__((constructor)) static void install(void)
{
	int rc = sqlite3_config(SQLITE_CONFIG_PCACHE2, vrange_sqlite_pcache());
	if (rc != SQLITE_OK) {
		fprintf(stderr, "vrange pcache: sqlite3_config failed: %d\n", rc);
		abort();
	}
}
