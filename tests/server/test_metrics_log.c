/*
 * tests/server/test_metrics_log.c: vLLM's periodic stats line
 * (metrics_log_stats_start) and its formatting (metrics_stats_line): random
 * counter snapshots give the throughputs, gauges and hit rate they imply;
 * the thread, over a fake engine whose counters move, writes lines to the
 * log (stderr, captured in a file here) until stopped, and none after.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/metrics.h"
#include "tests/test.h"

static uint64_t g_rng;
static uint32_t rnd(uint32_t n)
{
	g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((g_rng >> 33) % n);
}

static void test_line(void)
{
	for (int it = 0; it < 200; it++) {
		struct metrics_engine_stats a = {0}, b = {0};
		a.prompt_tokens = rnd(100000);
		a.generation_tokens = rnd(100000);
		a.prefix_queries_tokens = rnd(100000);
		a.prefix_hits_tokens = rnd((uint32_t)a.prefix_queries_tokens + 1);
		uint32_t dp = rnd(5000), dg = rnd(5000), dq = rnd(1000), dh = dq ? rnd(dq + 1) : 0;
		b = a;
		b.prompt_tokens += dp;
		b.generation_tokens += dg;
		b.prefix_queries_tokens += dq;
		b.prefix_hits_tokens += dh;
		b.n_running = (int)rnd(64);
		b.n_waiting = (int)rnd(64);
		b.kv_usage = rnd(1001) / 1000.0;
		double dt = 0.5 + rnd(100) / 10.0;
		char line[320], want[320];
		bool busy = metrics_stats_line(line, sizeof line, &a, &b, dt);
		snprintf(want, sizeof want,
			 "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
			 "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
			 dp / dt, dg / dt, b.n_running, b.n_waiting, 100.0 * b.kv_usage, dq ? 100.0 * dh / dq : 0.0);
		T_CHECKF(!strcmp(line, want), "%s\nwant %s", line, want);
		T_CHECK(busy == (dp || dg || b.n_running || b.n_waiting));
	}
}

static atomic_uint g_calls;
static void fake_engine(void *ctx, struct metrics_engine_stats *out)
{
	(void)ctx;
	unsigned k = atomic_fetch_add(&g_calls, 1) + 1;
	out->prompt_tokens = 100u * k; /* always busy: every line is INFO */
	out->generation_tokens = 7u * k;
	out->n_running = 1;
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

/* The whole log file (pread: the writers' O_APPEND offset is not moved). */
static char *slurp(int fd)
{
	struct stat sb;
	if (fstat(fd, &sb))
		return calloc(1, 1);
	char *s = calloc(1, (size_t)sb.st_size + 1);
	if (s && sb.st_size > 0 && pread(fd, s, (size_t)sb.st_size, 0) != sb.st_size)
		s[0] = 0;
	return s;
}

static void test_thread(void)
{
	struct metrics *m;
	struct err e = {0};
	T_CHECK(metrics_create(&m, "m", &e) == ST_OK);
	T_CHECK(metrics_log_stats_start(m, 0, &e) == ST_INVALID);
	metrics_log_stats_stop(m); /* not started: a no-op */
	metrics_set_engine(m, fake_engine, NULL);
	char path[] = "/tmp/dsv4-metrics-log-XXXXXX";
	int fd = mkstemp(path);
	T_CHECK(fd >= 0);
	unlink(path);
	fcntl(fd, F_SETFL, O_APPEND);
	int saved = dup(2);
	dup2(fd, 2);
	T_CHECK(metrics_log_stats_start(m, 0.02, &e) == ST_OK);
	char *log = NULL;
	for (int i = 0; i < 1000; i++) { /* until three lines, at most ~10 s */
		free(log);
		log = slurp(fd);
		if (count(log, "Avg prompt throughput") >= 3)
			break;
		nanosleep(&(struct timespec){0, 10000000}, NULL);
	}
	metrics_log_stats_stop(m);
	free(log);
	log = slurp(fd);
	size_t n_at_stop = count(log, "Avg prompt throughput");
	unsigned calls_at_stop = atomic_load(&g_calls);
	nanosleep(&(struct timespec){0, 60000000}, NULL);
	free(log);
	log = slurp(fd);
	dup2(saved, 2);
	close(saved);
	T_CHECKF(n_at_stop >= 3, "%zu stats lines:\n%s", n_at_stop, log);
	T_CHECK(count(log, "Avg prompt throughput") == n_at_stop && atomic_load(&g_calls) == calls_at_stop);
	T_CHECK(strstr(log, "INFO") && strstr(log, "stats: ") && strstr(log, "Running: 1 reqs"));
	free(log);
	close(fd);
	metrics_destroy(m);
}

int main(void)
{
	const char *s = getenv("DSV4_TEST_SEED");
	g_rng = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
	fprintf(stderr, "seed %llu\n", (unsigned long long)g_rng);
	test_line();
	test_thread();
	return test_exit();
}
