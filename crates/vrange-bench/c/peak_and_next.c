/* The two processes of `vrange-bench pressure`, run in one memory cgroup under each allocator;
 * vrange-malloc's tests/pressure.rs runs this file too (glibc against the shim).
 *
 *   peak_and_next peak MIB BLOCK_KIB
 *     Allocates MIB MiB in blocks of BLOCK_KIB KiB, each followed by a small allocation that
 *     stays live (so glibc can never trim the top of its heap), writes every page, frees every
 *     large block and prints "DONE blocks=N ms=T". Then idles until its stdin reaches end of
 *     file, and reuses the memory: callocs the same blocks again, checks that every byte reads
 *     zero, writes every page, frees them and prints "REUSED blocks=N nonzero=Z"; exits 1 if
 *     Z > 0 or an allocation failed.
 *
 *   peak_and_next next MIB BLOCK_KIB PAUSE_US
 *     Makes itself the OOM killer's first choice, allocates MIB MiB in blocks of BLOCK_KIB KiB,
 *     writes every page, pausing PAUSE_US microseconds after each block, and prints
 *     "NEXT ok ms=T". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double ms_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

static void touch(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i += 4096)
        p[i] = (unsigned char)(seed + i / 4096) | 1;
}

static int peak(size_t total, size_t block) {
    size_t n = total / block;
    unsigned char **big = calloc(n, sizeof *big);
    unsigned char **small = calloc(n, sizeof *small);
    if (!big || !small) return 1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < n; i++) {
        big[i] = malloc(block);
        small[i] = malloc(64);
        if (!big[i] || !small[i]) {
            printf("FAIL malloc block %zu\n", i);
            return 1;
        }
        touch(big[i], block, (unsigned)i);
        memset(small[i], 0x5A, 64);
    }
    for (size_t i = 0; i < n; i++) free(big[i]);
    printf("DONE blocks=%zu ms=%.0f\n", n, ms_since(&t0));
    fflush(stdout);

    char c;
    while (read(0, &c, 1) > 0) {}

    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        big[i] = calloc(1, block);
        if (!big[i]) {
            printf("FAIL calloc block %zu\n", i);
            return 1;
        }
        const uint64_t *w = (const uint64_t *)big[i];
        for (size_t j = 0; j < block / 8; j++) nonzero += w[j] != 0;
        touch(big[i], block, (unsigned)i);
    }
    for (size_t i = 0; i < n; i++) free(big[i]);
    for (size_t i = 0; i < n; i++)
        if (small[i][0] != 0x5A || small[i][63] != 0x5A) return 1;
    printf("REUSED blocks=%zu nonzero=%zu\n", n, nonzero);
    return nonzero != 0;
}

static int next(size_t total, size_t block, unsigned pause_us) {
    FILE *f = fopen("/proc/self/oom_score_adj", "w");
    if (f) {
        fputs("1000", f);
        fclose(f);
    }
    size_t n = total / block;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < n; i++) {
        unsigned char *p = malloc(block);
        if (!p) {
            printf("FAIL malloc block %zu\n", i);
            return 1;
        }
        touch(p, block, (unsigned)i);
        if (pause_us) usleep(pause_us);
    }
    printf("NEXT ok ms=%.0f\n", ms_since(&t0));
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "peak"))
        return peak(strtoull(argv[2], 0, 10) << 20, strtoull(argv[3], 0, 10) << 10);
    if (argc >= 5 && !strcmp(argv[1], "next"))
        return next(strtoull(argv[2], 0, 10) << 20, strtoull(argv[3], 0, 10) << 10,
                    (unsigned)strtoul(argv[4], 0, 10));
    fprintf(stderr, "usage: %s peak MIB BLOCK_KIB | next MIB BLOCK_KIB PAUSE_US\n", argv[0]);
    return 64;
}
