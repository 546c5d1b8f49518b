/*
 * churn: the ebizzy 0.3 workload, for comparing allocators by LD_PRELOAD (`vrange-bench
 * ebizzy` runs it; build.rs compiles it).
 *
 * Allocates CHUNKS chunks of CHUNK_SIZE bytes, each filled with 8-byte records in increasing
 * order. THREADS threads then loop for SECONDS seconds: pick a random chunk, malloc a copy
 * buffer of CHUNK_SIZE, memcpy the chunk into it, binary-search a random key of that chunk in
 * the copy, free the buffer. Throughput is counted as ebizzy counts it: one record per search
 * (ebizzy's search_mem() returns its loop count), per second, summed over threads.
 *
 * The widely copied ebizzy 0.3's rand_num() multiplies a state that starts at zero, so it
 * never advances: every thread copies chunk 0 and searches its first key forever. The
 * published ebizzy numbers were measured that way; -c reproduces it. Without -c each thread
 * has its own xorshift64* generator, seeded per thread. Every key is taken from the chunk it
 * is searched in, so every search must hit: a miss means a broken copy and fails the run.
 *
 * Usage: churn [-t threads] [-n chunks] [-s chunk_size] [-S seconds] [-c]
 *        (defaults: one thread per online CPU, 10 chunks, 512 KiB, 10 s; sizes take K/M)
 * Prints one line: records_per_s=... iterations=... seconds=... cpu_seconds=... minflt=...
 * majflt=... maxrss_kb=... (seconds: the longest thread's loop; cpu_seconds: the loops' CPU
 * time summed over threads, kernel time for their page faults included, time other processes
 * took from them excluded; faults are counted over the timed loop only; maxrss is the process
 * peak).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "prng.h"

typedef uint64_t record;

static unsigned threads;
static size_t chunks = 10;
static size_t chunk_size = 512 << 10;
static double seconds = 10.0;
static int classic;

static record **mem;
static size_t records; /* per chunk */
static pthread_barrier_t start;
static atomic_int done;

struct worker {
	pthread_t tid;
	uint64_t rng;
	uint64_t iterations;
	uint64_t misses;
	double elapsed;
	double cpu;
};

static void die(const char *what)
{
	fprintf(stderr, "churn: %s: %s\n", what, strerror(errno));
	exit(2);
}

static double now(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int compare(const void *a, const void *b)
{
	record x = *(const record *)a, y = *(const record *)b;
	return (x > y) - (x < y);
}

static void *work(void *arg)
{
	struct worker *w = arg;
	pthread_barrier_wait(&start);
	double begun = now(CLOCK_MONOTONIC), cpu = now(CLOCK_THREAD_CPUTIME_ID);
	while (!atomic_load_explicit(&done, memory_order_relaxed)) {
		uint64_t r = classic ? 0 : prng_next(&w->rng);
		const record *src = mem[r % chunks];
		record key = src[(r >> 32) % records];
		record *copy = malloc(chunk_size);
		if (!copy)
			die("malloc (copy)");
		memcpy(copy, src, chunk_size);
		if (!bsearch(&key, copy, records, sizeof(record), compare))
			w->misses++;
		free(copy);
		w->iterations++;
	}
	w->elapsed = now(CLOCK_MONOTONIC) - begun;
	w->cpu = now(CLOCK_THREAD_CPUTIME_ID) - cpu;
	return NULL;
}

static size_t size_arg(const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (errno || *end || v == 0) {
		fprintf(stderr, "churn: bad number: %s\n", s);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	threads = cpus > 0 ? cpus : 1;
	int opt;
	while ((opt = getopt(argc, argv, "t:n:s:S:c")) != -1) {
		switch (opt) {
		case 't': threads = size_arg(optarg); break;
		case 'n': chunks = size_arg(optarg); break;
		case 's': chunk_size = size_arg(optarg); break;
		case 'S': seconds = strtod(optarg, NULL); break;
		case 'c': classic = 1; break;
		default:
			fprintf(stderr, "usage: %s [-t threads] [-n chunks] [-s chunk_size] [-S seconds] [-c]\n",
				argv[0]);
			return 2;
		}
	}
	if (chunk_size % sizeof(record) || seconds <= 0) {
		fprintf(stderr, "churn: chunk_size must be a multiple of 8, seconds positive\n");
		return 2;
	}
	records = chunk_size / sizeof(record);

	mem = malloc(chunks * sizeof(*mem));
	if (!mem)
		die("malloc (chunk table)");
	uint64_t fill = prng_seed(~0ULL), value = 0;
	for (size_t c = 0; c < chunks; c++) {
		mem[c] = malloc(chunk_size);
		if (!mem[c])
			die("malloc (chunk)");
		for (size_t i = 0; i < records; i++) {
			value += 1 + (prng_next(&fill) & 15);
			mem[c][i] = value;
		}
	}

	struct worker *w = calloc(threads, sizeof(*w));
	if (!w)
		die("calloc (workers)");
	errno = pthread_barrier_init(&start, NULL, threads + 1);
	if (errno)
		die("pthread_barrier_init");
	for (unsigned t = 0; t < threads; t++) {
		w[t].rng = prng_seed(t);
		errno = pthread_create(&w[t].tid, NULL, work, &w[t]);
		if (errno)
			die("pthread_create");
	}
	struct rusage before, after;
	getrusage(RUSAGE_SELF, &before);
	pthread_barrier_wait(&start);
	struct timespec nap = { (time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9) };
	while (nanosleep(&nap, &nap) && errno == EINTR)
		;
	atomic_store_explicit(&done, 1, memory_order_relaxed);

	double rate = 0, elapsed = 0, cpu = 0;
	uint64_t iterations = 0, misses = 0;
	for (unsigned t = 0; t < threads; t++) {
		errno = pthread_join(w[t].tid, NULL);
		if (errno)
			die("pthread_join");
		rate += w[t].iterations / w[t].elapsed;
		iterations += w[t].iterations;
		misses += w[t].misses;
		cpu += w[t].cpu;
		if (w[t].elapsed > elapsed)
			elapsed = w[t].elapsed;
	}
	getrusage(RUSAGE_SELF, &after);
	printf("records_per_s=%.0f iterations=%llu seconds=%.3f cpu_seconds=%.3f threads=%u chunks=%zu "
	       "chunk_size=%zu classic=%d minflt=%ld majflt=%ld maxrss_kb=%ld\n",
	       rate, (unsigned long long)iterations, elapsed, cpu, threads, chunks, chunk_size, classic,
	       after.ru_minflt - before.ru_minflt, after.ru_majflt - before.ru_majflt,
	       after.ru_maxrss);
	if (misses) {
		fprintf(stderr, "churn: %llu searches missed: a copy differs from its chunk\n",
			(unsigned long long)misses);
		return 1;
	}
	return 0;
}
