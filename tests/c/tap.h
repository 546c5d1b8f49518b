/*
 * tap.h - what the C tests of libvrange share: TAP output (check, skip) and deterministic
 * page content (fill, intact_at, is_zero). Included by each test program, one translation
 * unit each, so everything is static.
 */
#ifndef VRANGE_TEST_TAP_H
#define VRANGE_TEST_TAP_H

/* Not every test uses every helper. */
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

static size_t page;
static int checks;
static int failures;
static int can_purge; /* MADV_FREE and MADV_PAGEOUT both work: purges can be forced */

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void check(int ok, const char *fmt, ...)
{
	va_list ap;

	checks++;
	if (!ok)
		failures++;
	printf("%s - ", ok ? "ok" : "not ok");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static void skip(const char *what, const char *why)
{
	checks++;
	printf("ok - %s # SKIP %s\n", what, why);
	fflush(stdout);
}

/* The word fill() writes at word index i: never zero, distinct per seed and position. */
static uint64_t pattern(uint64_t seed, size_t i)
{
	return ((seed * UINT64_C(0x9E3779B97F4A7C15)) ^ (uint64_t)i) * UINT64_C(0xBF58476D1CE4E5B9) |
	       1;
}

static void fill(void *p, size_t len, uint64_t seed)
{
	uint64_t *w = p;

	for (size_t i = 0; i < len / 8; i++)
		w[i] = pattern(seed, i);
}

/* Whether [base + off, base + off + len) holds what fill(base, _, seed) wrote. */
static int intact_at(const void *base, size_t off, size_t len, uint64_t seed)
{
	const volatile uint64_t *w = base;

	for (size_t i = off / 8; i < (off + len) / 8; i++)
		if (w[i] != pattern(seed, i))
			return 0;
	return 1;
}

static int is_zero(const void *p, size_t len)
{
	const volatile uint64_t *w = p;

	for (size_t i = 0; i < len / 8; i++)
		if (w[i] != 0)
			return 0;
	return 1;
}

static char *pg(void *base, size_t i)
{
	return (char *)base + i * page;
}

static unsigned long addr(const void *p)
{
	return (unsigned long)(uintptr_t)p;
}

#endif
