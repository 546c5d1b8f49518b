/*
 * pair: the cost of one malloc+free pair of a large block, for comparing allocators by
 * LD_PRELOAD (`vrange-bench pairs` runs it; build.rs compiles it).
 *
 * THREADS threads each loop for SECONDS seconds: p = malloc(SIZE); write one byte of it;
 * free(p). The byte written keeps the block from being optimised away and makes the
 * allocator's memory real (a fault on first touch). Prints one line:
 * ns_per_pair=... pairs=... seconds=... threads=... (ns per pair: the loops' wall time summed
 * over threads, divided by the pairs they made).
 *
 * Usage: pair [-t threads] [-s size] [-S seconds] (sizes take K/M)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static unsigned threads = 1;
static size_t size = 512 << 10;
static double seconds = 0.3;
static atomic_int go;

struct result {
    uint64_t pairs;
    double wall;
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t parse_size(const char *s)
{
    char *end;
    size_t v = strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        v <<= 10;
    else if (*end == 'M' || *end == 'm')
        v <<= 20;
    return v;
}

static void *loop(void *arg)
{
    struct result *r = arg;
    while (!atomic_load(&go))
        ;
    double start = now(), stop = start + seconds, t = start;
    uint64_t pairs = 0;
    while (t < stop) {
        /* Check the clock every 256 pairs: a clock read costs about what a pair should. */
        for (int i = 0; i < 256; i++) {
            volatile char *p = malloc(size);
            if (!p) {
                fprintf(stderr, "pair: malloc(%zu) failed\n", size);
                exit(1);
            }
            p[size / 2] = (char)i;
            free((void *)p);
        }
        pairs += 256;
        t = now();
    }
    r->pairs = pairs;
    r->wall = t - start;
    return NULL;
}

int main(int argc, char **argv)
{
    int c;
    while ((c = getopt(argc, argv, "t:s:S:")) != -1) {
        switch (c) {
        case 't': threads = (unsigned)atoi(optarg); break;
        case 's': size = parse_size(optarg); break;
        case 'S': seconds = atof(optarg); break;
        default:
            fprintf(stderr, "usage: pair [-t threads] [-s size] [-S seconds]\n");
            return 2;
        }
    }
    if (threads == 0 || size == 0 || seconds <= 0) {
        fprintf(stderr, "pair: bad arguments\n");
        return 2;
    }
    pthread_t *tid = calloc(threads, sizeof *tid);
    struct result *res = calloc(threads, sizeof *res);
    for (unsigned i = 0; i < threads; i++)
        if (pthread_create(&tid[i], NULL, loop, &res[i]) != 0) {
            fprintf(stderr, "pair: pthread_create failed\n");
            return 1;
        }
    atomic_store(&go, 1);
    uint64_t pairs = 0;
    double wall = 0, longest = 0;
    for (unsigned i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        pairs += res[i].pairs;
        wall += res[i].wall;
        if (res[i].wall > longest)
            longest = res[i].wall;
    }
    printf("ns_per_pair=%.2f pairs=%llu seconds=%.3f threads=%u\n", wall * 1e9 / (double)pairs,
           (unsigned long long)pairs, longest, threads);
    return 0;
}
