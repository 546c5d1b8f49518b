/* A C program that makes large allocations through every entry point the LD_PRELOAD shim
 * interposes, checks what each guarantees (content kept by realloc, zeroes from calloc,
 * alignment) and prints a checksum of what it wrote. It also allocates before main (a
 * constructor: before any Rust runtime or the program's own set-up), from threads it creates
 * with pthread_create, and in fork children while those threads churn. Built and run by
 * tests/programs.rs, with and without the shim: the output must be the same. Exits 1 at the
 * first broken guarantee. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

static int early_ok;

/* Runs before main. */
__attribute__((constructor)) static void early(void) {
    unsigned char *p = malloc(1 << 20);
    unsigned char *z = calloc(256, 1024);
    if (!p || !z || !zero(z, 256 * 1024)) return;
    memset(p, 0x5A, 1 << 20);
    early_ok = p[(1 << 20) - 1] == 0x5A;
    free(z);
    free(p);
}

/* A thread of the program's own: churns blocks of 64 KiB .. 1 MiB, checking each. */
static void *churn(void *arg) {
    uintptr_t seed = (uintptr_t)arg, ok = 1;
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (int i = 0; i < 400 && ok; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t n = (64 << 10) + x % (960 << 10);
        unsigned char *p = malloc(n);
        if (!p) return NULL;
        memset(p, (int)(x >> 40), n);
        ok = p[0] == (unsigned char)(x >> 40) && p[n - 1] == (unsigned char)(x >> 40);
        free(p);
    }
    return (void *)ok;
}

/* Forks while the threads churn; each child allocates, checks and frees. */
static int forks(void) {
    pthread_t t[3];
    for (uintptr_t i = 0; i < 3; i++)
        if (pthread_create(&t[i], NULL, churn, (void *)i)) return 0;
    int ok = 1;
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        if (pid < 0) { ok = 0; break; }
        if (pid == 0) {
            alarm(20);
            unsigned char *p = malloc(3 << 20);
            if (!p) _exit(2);
            memset(p, 7, 3 << 20);
            int good = p[(3 << 20) - 1] == 7;
            free(p);
            _exit(good ? 0 : 3);
        }
        int status = 0;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
            ok = 0;
    }
    for (int i = 0; i < 3; i++) {
        void *r = NULL;
        pthread_join(t[i], &r);
        ok &= r != NULL;
    }
    return ok;
}

int main(void) {
    if (!early_ok) return fail("allocation before main", 1 << 20);
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
    if (!forks()) return fail("threads and fork children", 0);
    printf("big_blocks ok sum=%llu\n", (unsigned long long)sum);
    return 0;
}
