/*
 * tradeoff: the two processes of `vrange-bench tradeoff`, which runs them (build.rs compiles
 * this file) under each allocator (the churner) in a memory cgroup of its own.
 *
 *   tradeoff churn -t THREADS -S SECONDS -w STEADY_MIB -p PEAK_MIB
 *     THREADS threads churn a working set of STEADY_MIB MiB (shared out between them): each
 *     iteration frees a random slot and mallocs a block of a random size, log-uniform in
 *     [64 KiB, 2 MiB), writing one byte per 4 KiB page of it so that the memory is really
 *     used. After a warm-up (a quarter of SECONDS, at most 0.5 s, so that the allocator
 *     holds the memory it keeps for this working set) the iterations of SECONDS seconds are
 *     counted, each thread over its own window of at least 16 iterations. Then every thread
 *     grows its share of the working set to PEAK_MIB MiB in all, each block followed by a
 *     64-byte block that stays live (so no allocator can give the peak back by trimming the
 *     top of a heap), and the process prints
 *     "PEAK ops_per_s=R ops=N seconds=T threads=THREADS" and waits for a line on stdin (the
 *     parent reads its RSS meanwhile). Then the threads free every block of the peak, back to
 *     the steady working set, the process prints "FREED ms=T" and the threads go on churning
 *     until stdin reaches end of file; the process prints "END ops=N seconds=T" (the
 *     iterations since the frees) and exits.
 *
 *   tradeoff neighbour MIB
 *     Makes itself the OOM killer's first choice, maps and writes MIB MiB (1 MiB mappings,
 *     every page, as fast as it can; no allocator involved, so every configuration has the
 *     same neighbour), prints "GOT ms=T" and holds the memory until stdin reaches end of file.
 *
 * Exit status 1 when an allocation fails, 2 for bad arguments or a failed system call.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "prng.h"

#define MIN_BLOCK (64u << 10)
#define MAX_LOG2 5 /* blocks up to MIN_BLOCK << 5 = 2 MiB */

/* What the threads do: the main thread moves them on. */
enum phase { WARM, MEASURE, PEAK, STOP };
/* The fewest iterations a thread's measured window counts. */
#define MIN_MEASURED 16

static unsigned threads = 1;
static double seconds = 2.0;
static size_t steady = 64u << 20, peak = 512u << 20;
static atomic_int phase = WARM;
static pthread_barrier_t barrier;

struct worker {
	pthread_t tid;
	uint64_t rng;
	void **slot;
	size_t slots;
	/* The blocks of the peak and their small live neighbours. */
	void **big, **small;
	size_t nbig, capbig;
	uint64_t ops;
	/* Iterations and time of the measured window, and since the frees. */
	uint64_t measured_ops, after_ops;
	double measured_s, after_s;
};

static void die(const char *what)
{
	fprintf(stderr, "tradeoff: %s: %s\n", what, strerror(errno));
	exit(2);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Log-uniform in [64 KiB, 2 MiB): 2^f for the fraction f by a quadratic that is within 0.3%
 * (no libm needed), so each of the five doublings is equally likely. */
static size_t block_size(uint64_t *rng)
{
	uint64_t r = prng_next(rng);
	unsigned whole = (unsigned)((r >> 40) % MAX_LOG2);
	double f = (double)(r & 0xFFFFFFFFu) / 4294967296.0;
	double scale = 1.0 + f * (0.6565 + 0.3435 * f);
	return (size_t)((double)(MIN_BLOCK << whole) * scale);
}

/* The expected block size, (max - min) / ln(max / min), for sizing the slot arrays. */
static size_t mean_block(void)
{
	return (size_t)((double)((MIN_BLOCK << MAX_LOG2) - MIN_BLOCK) / (MAX_LOG2 * 0.69314718));
}

static void *block(uint64_t *rng, size_t *size)
{
	size_t n = block_size(rng);
	unsigned char *p = malloc(n);
	if (!p) {
		fprintf(stderr, "tradeoff: malloc(%zu) failed\n", n);
		exit(1);
	}
	for (size_t i = 0; i < n; i += 4096)
		p[i] = (unsigned char)i | 1;
	p[n - 1] = 1;
	if (size)
		*size = n;
	return p;
}

static void churn_once(struct worker *w)
{
	size_t i = prng_next(&w->rng) % w->slots;
	free(w->slot[i]);
	w->slot[i] = block(&w->rng, NULL);
	w->ops++;
}

static void grow(struct worker *w, size_t bytes)
{
	size_t have = 0;
	while (have < bytes) {
		if (w->nbig == w->capbig) {
			w->capbig = w->capbig ? 2 * w->capbig : 256;
			w->big = realloc(w->big, w->capbig * sizeof *w->big);
			w->small = realloc(w->small, w->capbig * sizeof *w->small);
			if (!w->big || !w->small)
				die("realloc (peak table)");
		}
		size_t n;
		w->big[w->nbig] = block(&w->rng, &n);
		w->small[w->nbig] = malloc(64);
		if (!w->small[w->nbig]) {
			fprintf(stderr, "tradeoff: malloc(64) failed\n");
			exit(1);
		}
		memset(w->small[w->nbig], 0x5A, 64);
		w->nbig++;
		have += n;
	}
}

static void *work(void *arg)
{
	struct worker *w = arg;
	for (size_t i = 0; i < w->slots; i++)
		w->slot[i] = block(&w->rng, NULL);
	pthread_barrier_wait(&barrier);
	while (atomic_load_explicit(&phase, memory_order_relaxed) == WARM)
		churn_once(w);
	uint64_t ops0 = w->ops;
	double t0 = now();
	/* At least MIN_MEASURED iterations, each thread over its own window: on a loaded machine
	 * one iteration of the warm-up can outlast the whole measured window (the quick form's is
	 * 0.3 s), which counted 0 iterations. */
	while (atomic_load_explicit(&phase, memory_order_relaxed) == MEASURE ||
	       w->ops - ops0 < MIN_MEASURED)
		churn_once(w);
	w->measured_ops = w->ops - ops0;
	w->measured_s = now() - t0;

	grow(w, (peak - steady) / threads);
	pthread_barrier_wait(&barrier); /* the peak is complete */
	pthread_barrier_wait(&barrier); /* the parent has read it */
	for (size_t i = 0; i < w->nbig; i++)
		free(w->big[i]);
	pthread_barrier_wait(&barrier); /* every frees done */

	ops0 = w->ops;
	t0 = now();
	while (atomic_load_explicit(&phase, memory_order_relaxed) != STOP)
		churn_once(w);
	w->after_ops = w->ops - ops0;
	w->after_s = now() - t0;
	for (size_t i = 0; i < w->nbig; i++)
		if (((unsigned char *)w->small[i])[63] != 0x5A) {
			fprintf(stderr, "tradeoff: a live block was overwritten\n");
			exit(1);
		}
	return NULL;
}

static void nap(double s)
{
	struct timespec t = { (time_t)s, (long)((s - (time_t)s) * 1e9) };
	while (nanosleep(&t, &t) && errno == EINTR)
		;
}

/* Blocks until stdin has a line (1) or reaches end of file (0). */
static int wait_stdin(void)
{
	char c;
	for (;;) {
		ssize_t n = read(0, &c, 1);
		if (n == 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return 0;
		if (n == 1 && c == '\n')
			return 1;
	}
}

static int churn(int argc, char **argv)
{
	int opt;
	while ((opt = getopt(argc, argv, "t:S:w:p:")) != -1) {
		switch (opt) {
		case 't': threads = (unsigned)atoi(optarg); break;
		case 'S': seconds = atof(optarg); break;
		case 'w': steady = strtoull(optarg, NULL, 10) << 20; break;
		case 'p': peak = strtoull(optarg, NULL, 10) << 20; break;
		default:
			fprintf(stderr, "usage: tradeoff churn -t THREADS -S SECONDS -w STEADY_MIB -p PEAK_MIB\n");
			return 2;
		}
	}
	if (threads == 0 || seconds <= 0 || steady == 0 || peak <= steady) {
		fprintf(stderr, "tradeoff: bad arguments\n");
		return 2;
	}
	size_t slots = steady / threads / mean_block();
	if (slots == 0)
		slots = 1;
	struct worker *w = calloc(threads, sizeof *w);
	if (!w)
		die("calloc (workers)");
	errno = pthread_barrier_init(&barrier, NULL, threads + 1);
	if (errno)
		die("pthread_barrier_init");
	for (unsigned t = 0; t < threads; t++) {
		w[t].rng = prng_seed(t);
		w[t].slots = slots;
		w[t].slot = calloc(slots, sizeof *w[t].slot);
		if (!w[t].slot)
			die("calloc (slots)");
		errno = pthread_create(&w[t].tid, NULL, work, &w[t]);
		if (errno)
			die("pthread_create");
	}
	pthread_barrier_wait(&barrier); /* working sets filled */
	double warm = seconds / 4 < 0.5 ? seconds / 4 : 0.5;
	nap(warm);
	atomic_store(&phase, MEASURE);
	nap(seconds);
	atomic_store(&phase, PEAK);
	pthread_barrier_wait(&barrier);
	double rate = 0, longest = 0;
	uint64_t ops = 0;
	for (unsigned t = 0; t < threads; t++) {
		rate += w[t].measured_ops / w[t].measured_s;
		ops += w[t].measured_ops;
		if (w[t].measured_s > longest)
			longest = w[t].measured_s;
	}
	printf("PEAK ops_per_s=%.0f ops=%llu seconds=%.3f threads=%u\n", rate,
	       (unsigned long long)ops, longest, threads);
	fflush(stdout);
	if (!wait_stdin())
		return 0;
	double t0 = now();
	pthread_barrier_wait(&barrier);
	pthread_barrier_wait(&barrier);
	printf("FREED ms=%.1f\n", (now() - t0) * 1e3);
	fflush(stdout);
	while (wait_stdin())
		;
	atomic_store(&phase, STOP);
	double after = 0;
	ops = 0;
	for (unsigned t = 0; t < threads; t++) {
		errno = pthread_join(w[t].tid, NULL);
		if (errno)
			die("pthread_join");
		ops += w[t].after_ops;
		if (w[t].after_s > after)
			after = w[t].after_s;
	}
	printf("END ops=%llu seconds=%.3f\n", (unsigned long long)ops, after);
	return 0;
}

static int neighbour(size_t mib)
{
	FILE *f = fopen("/proc/self/oom_score_adj", "w");
	if (f) {
		fputs("1000", f);
		fclose(f);
	}
	double t0 = now();
	for (size_t i = 0; i < mib; i++) {
		unsigned char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			die("mmap");
		for (size_t j = 0; j < 1 << 20; j += 4096)
			p[j] = 1;
	}
	printf("GOT ms=%.1f\n", (now() - t0) * 1e3);
	fflush(stdout);
	while (wait_stdin())
		;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "churn"))
		return churn(argc - 1, argv + 1);
	if (argc == 3 && !strcmp(argv[1], "neighbour"))
		return neighbour(strtoull(argv[2], NULL, 10));
	fprintf(stderr, "usage: %s churn -t THREADS -S SECONDS -w STEADY_MIB -p PEAK_MIB | "
			"neighbour MIB\n",
		argv[0]);
	return 2;
}
