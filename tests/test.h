/*
 * tests/test.h: the tiny harness every C test uses.
 *
 * A test binary runs its checks, prints one line per failure with file:line,
 * and returns test_exit(): 0 when all passed, 1 otherwise, 77 (meson: SKIP)
 * when it called test_skip() because what it needs is absent (no GPU).
 */
#ifndef DSV4_TESTS_TEST_H
#define DSV4_TESTS_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int test_n_checks;
static int test_n_failed;

#define T_CHECK(cond)                                                                  \
	do {                                                                           \
		test_n_checks++;                                                       \
		if (!(cond)) {                                                         \
			test_n_failed++;                                               \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                      \
	} while (0)

#define T_CHECKF(cond, ...)                                                            \
	do {                                                                           \
		test_n_checks++;                                                       \
		if (!(cond)) {                                                         \
			test_n_failed++;                                               \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                  \
			fputc('\n', stderr);                                           \
		}                                                                      \
	} while (0)

/* a and b (doubles) agree within atol + rtol*|b|. */
#define T_CLOSE(a, b, atol, rtol)                                                      \
	T_CHECKF(fabs((double)(a) - (double)(b)) <= (atol) + (rtol)*fabs((double)(b)),   \
		 "%.9g vs %.9g", (double)(a), (double)(b))

#define T_STR_CONTAINS(hay, needle)                                                    \
	T_CHECKF((hay) && strstr((hay), (needle)), "'%s' does not contain '%s'",         \
		 (hay) ? (hay) : "(null)", (needle))

static inline int test_exit(void)
{
	fprintf(stderr, "%d checks, %d failed\n", test_n_checks, test_n_failed);
	return test_n_failed ? 1 : (test_n_checks ? 0 : 1);
}

/* The seed of a randomised test: $DSV4_TEST_SEED (read by strtoull, any
 * base) or the clock, printed so that a failing run can be repeated. */
static inline uint64_t test_seed(void)
{
	const char *env = getenv("DSV4_TEST_SEED");
	uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
	fprintf(stderr, "seed %llu (DSV4_TEST_SEED to repeat)\n", (unsigned long long)seed);
	return seed;
}

/* The largest k with P(X < k) <= alpha for X ~ Binomial(n, p), 0 < p < 1:
 * a count of n independent successes of probability p is below it only
 * with probability alpha (a statistical check's threshold at, say, 1e-7). */
static inline uint32_t test_binom_lower(uint32_t n, double p, double alpha)
{
	double below = 0; /* P(X < k) */
	for (uint32_t k = 0; k < n; k++) {
		double pk = exp(lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma((double)(n - k) + 1.0) + k * log(p) +
				(double)(n - k) * log1p(-p));
		if (below + pk > alpha)
			return k;
		below += pk;
	}
	return n;
}

static inline int test_skip(const char *why)
{
	fprintf(stderr, "SKIP: %s\n", why);
	return 77;
}

#endif
