/*
 * Version test of libvrange: the header's VRANGE_VERSION_* macros must name the version of
 * the crate that builds the library (VRANGE_EXPECTED_VERSION, "MAJOR.MINOR.PATCH", passed by
 * crates/vrange-ffi/tests/c_abi.rs from CARGO_PKG_VERSION), and vrange_version() must return
 * the header's VRANGE_VERSION. A release that bumps the crate version without the header
 * fails here.
 *
 *     cc -std=c11 -Wall -Wextra -Werror -DVRANGE_EXPECTED_VERSION='"0.1.0"' \
 *        tests/c/test_version.c \
 *        $(PKG_CONFIG_PATH=target/debug pkg-config --cflags --libs vrange) -o test_version
 */

#include <vrange.h>

#include <stdio.h>
#include <string.h>

/* tap.h's helpers are for memory tests; four checks need only this. */
static int checks, failures;
#define CHECK(ok, ...)                                  \
	do {                                            \
		int ok_ = (ok);                         \
		checks++;                               \
		failures += !ok_;                       \
		printf("%s - ", ok_ ? "ok" : "not ok"); \
		printf(__VA_ARGS__);                    \
		putchar('\n');                          \
	} while (0)

#ifndef VRANGE_EXPECTED_VERSION
#error "compile with -DVRANGE_EXPECTED_VERSION='\"MAJOR.MINOR.PATCH\"' (the crate's version)"
#endif

#if VRANGE_VERSION != \
	VRANGE_VERSION_MAJOR * 10000 + VRANGE_VERSION_MINOR * 100 + VRANGE_VERSION_PATCH
#error "VRANGE_VERSION does not match its parts"
#endif

int main(void)
{
	char parts[64];

	snprintf(parts, sizeof parts, "%d.%d.%d", VRANGE_VERSION_MAJOR, VRANGE_VERSION_MINOR,
		 VRANGE_VERSION_PATCH);
	CHECK(strcmp(parts, VRANGE_EXPECTED_VERSION) == 0,
	      "VRANGE_VERSION_MAJOR.MINOR.PATCH %s is the crate's version %s", parts,
	      VRANGE_EXPECTED_VERSION);
	CHECK(strcmp(VRANGE_VERSION_STRING, VRANGE_EXPECTED_VERSION) == 0,
	      "VRANGE_VERSION_STRING \"%s\" is the crate's version", VRANGE_VERSION_STRING);
	CHECK(VRANGE_VERSION_MINOR < 100 && VRANGE_VERSION_PATCH < 100,
	      "minor and patch fit VRANGE_VERSION's two digits");
	CHECK(vrange_version() == VRANGE_VERSION, "vrange_version() %u is the header's %d",
	      vrange_version(), VRANGE_VERSION);
	printf("1..%d\n", checks);
	return failures != 0;
}
