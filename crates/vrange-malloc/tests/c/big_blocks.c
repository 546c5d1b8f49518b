/* A C program that makes large allocations through every entry point the LD_PRELOAD shim
 * interposes, checks what each guarantees (content kept by realloc, zeroes from calloc,
 * alignment) and prints a checksum of what it wrote. Built and run by tests/programs.rs, with
 * and without the shim: the output must be the same. Exits 1 at the first broken guarantee. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t sum;

static int fail(const char *what, size_t size) {
    printf("FAIL %s (%zu bytes)\n", what, size);
    return 1;
}

/* Fills every page of p with a byte derived from its index and `seed`, and adds it to `sum`. */
static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 4096) {
        p[i] = (unsigned char)(seed + i / 4096);
        sum += p[i];
    }
    p[n - 1] = (unsigned char)seed;
}

/* Whether the first `n` bytes of a block that `fill` wrote over `len` bytes are intact. */
static int filled(const unsigned char *p, size_t n, size_t len, unsigned seed) {
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != (unsigned char)(seed + i / 4096)) return 0;
    return n < len || p[len - 1] == (unsigned char)seed;
}

static int zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

int main(void) {
    enum { LIVE = 16 };
    unsigned char *live[LIVE] = {0};
    for (unsigned round = 0; round < 64; round++) {
        /* 64 KiB .. 8 MiB, with odd sizes in between. */
        size_t n = ((size_t)64 << 10 << (round % 8)) + (round % 3) * 12345;
        unsigned char *p = malloc(n);
        if (!p) return fail("malloc", n);
        fill(p, n, round);
        if (malloc_usable_size(p) < n) return fail("malloc_usable_size", n);

        unsigned char *q = realloc(p, n * 2 + 1);
        if (!q || !filled(q, n, n, round)) return fail("realloc grow keeps content", n);
        memset(q + n, 0xAB, n + 1);
        p = realloc(q, n / 2);
        if (!p || !filled(p, n / 2, n, round)) return fail("realloc shrink keeps content", n);

        unsigned char *z = calloc(n / 16, 16);
        if (!z || !zero(z, n / 16 * 16)) return fail("calloc zeroes", n);
        fill(z, n / 16 * 16, round + 1);

        void *a = NULL;
        size_t align = (size_t)4096 << (round % 4);
        if (posix_memalign(&a, align, n) || (uintptr_t)a % align) return fail("posix_memalign", n);
        fill(a, n, round + 2);
        unsigned char *b = aligned_alloc(1 << 16, n);
        if (!b || (uintptr_t)b % (1 << 16)) return fail("aligned_alloc", n);
        fill(b, n, round + 3);

        /* Keep some blocks alive across rounds, so frees and reuse interleave. */
        free(live[round % LIVE]);
        live[round % LIVE] = z;
        if (!filled(b, n, n, round + 3) || !filled(a, n, n, round + 2))
            return fail("blocks disjoint", n);
        free(b);
        free(a);
        free(p);
    }
    for (unsigned i = 0; i < LIVE; i++) free(live[i]);
    printf("big_blocks ok sum=%llu\n", (unsigned long long)sum);
    return 0;
}
