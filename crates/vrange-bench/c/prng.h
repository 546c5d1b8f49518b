/*
 * The generator of the benchmarks' C workloads (churn.c, tradeoff.c), and of vrange-bench's
 * services in Rust (`service::Rng`, the same generator): xorshift64* (Vigna), seeded through
 * splitmix64 so that any number, a thread's say, gives a well-mixed state.
 */
#ifndef VRANGE_BENCH_PRNG_H
#define VRANGE_BENCH_PRNG_H

#include <stdint.h>

/* xorshift64* (Vigna): the state must never be zero. */
static inline uint64_t prng_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/* splitmix64, to turn a number into a well-mixed non-zero state for prng_next. */
static inline uint64_t prng_seed(uint64_t n)
{
	uint64_t z = n + 0x9E3779B97F4A7C15ULL;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	z ^= z >> 31;
	return z ? z : 1;
}

#endif
