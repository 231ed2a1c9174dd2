/*
 * tests/model/fwd_harness.h: shared helpers of the forward-pass tests: the
 * tiny checkpoints (generated once into a cache directory with
 * scripts/make_tiny_model --variant all), a toy block allocator, and a
 * step builder that runs chunks of several sequences as one flat batch and
 * returns the logits of every token.
 */
#ifndef DSV4_TESTS_MODEL_FWD_HARNESS_H
#define DSV4_TESTS_MODEL_FWD_HARNESS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include "model/checkpoint.h"
#include "model/exec_cpu.h"
#include "tests/test.h"
#include "tests/tiny_dir.h"

/* The checkpoint in directory path; NULL (with a line on stderr) when it does not open. */
static inline struct model_checkpoint *fh_open_dir(const char *path)
{
	struct model_checkpoint_options o = {.dir = path};
	struct model_checkpoint *ck = NULL;
	struct err e = {0};
	if (model_checkpoint_create(&ck, &o, &e)) {
		fprintf(stderr, "open %s: %s\n", path, e.msg);
		return NULL;
	}
	return ck;
}

static inline struct model_checkpoint *fh_open(const char *variant)
{
	const char *d = fh_tiny_dir();
	if (!d)
		return NULL;
	char path[1200];
	snprintf(path, sizeof path, "%s/tiny-%s", d, variant);
	return fh_open_dir(path);
}

/* tiny-<variant> for a test's main: 0 with *ck set, or the code the test
 * exits with: 77 (skipped) without the tiny checkpoints (they need the venv),
 * 1 when the checkpoint does not open. */
static inline int fh_open_for_main(const char *variant, struct model_checkpoint **ck)
{
	if (!fh_tiny_dir())
		return test_skip("no tiny checkpoints (scripts/make_tiny_model needs the venv)");
	*ck = fh_open(variant);
	T_CHECK(*ck != NULL);
	return *ck ? 0 : test_exit();
}

/* <build>/tiny-models-0731/tiny-0731-<variant>, generated under the lock that
 * tests/model/test_dspark_ref.py takes too (tests run in parallel). */
static inline struct model_checkpoint *fh_open_0731(const char *variant)
{
	const char *src = getenv("DSV4_SOURCE_ROOT"), *bld = getenv("DSV4_BUILD_ROOT");
	if (!src || !bld)
		return NULL;
	char dir[1200], lock[1300], cmd[4096], path[1400];
	snprintf(dir, sizeof dir, "%s/tiny-models-0731", bld);
	snprintf(lock, sizeof lock, "%s.lock", dir);
	snprintf(path, sizeof path, "%s/tiny-0731-%s", dir, variant);
	int fd = open(lock, O_CREAT | O_RDWR, 0644);
	if (fd < 0 || flock(fd, LOCK_EX) != 0) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	snprintf(cmd, sizeof cmd,
		 "'%s/.venv/bin/python3' '%s/scripts/make_tiny_model' --release 0731 --variant %s --out '%s' >/dev/null",
		 src, src, variant, path);
	int rc = system(cmd);
	flock(fd, LOCK_UN);
	close(fd);
	return rc ? NULL : fh_open_dir(path);
}

/* The device the forward tests run on: the CPU, or with DSV4_TEST_DEVICE=cuda
 * (the gpu suite's copies of these tests) the first GPU; without one the
 * test exits 77 (skipped), as every gpu test does on a machine without. */
static inline const struct kern_device *fh_device(void)
{
	static struct kern_device dev;
	static int state; /* 0 unset, 1 cpu, 2 gpu */
	if (!state) {
		const char *want = getenv("DSV4_TEST_DEVICE");
		state = 1;
		if (want && !strcmp(want, "cuda")) {
			struct err e = {0};
			if (model_exec_device("cuda", &dev, &e)) {
				fprintf(stderr, "skip: %s\n", e.msg);
				exit(77);
			}
			state = 2;
		}
	}
	return state == 2 ? &dev : NULL;
}

static inline bool fh_on_gpu(void)
{
	return fh_device() != NULL;
}

#define FH_MAX_SEQ_BLOCKS 64


/* One sequence: its whole token list, how many are done, its blocks. */
struct fh_seq {
	uint64_t id;
	const int32_t *ids;
	uint32_t n_ids;
	uint32_t n_done;
	uint32_t blocks[FH_MAX_SEQ_BLOCKS];
	uint32_t n_blocks;
};

struct fh_pool {
	uint32_t next, n;
};

static inline int fh_ensure_blocks(struct fh_pool *pool, struct fh_seq *s, uint32_t n_ctx, uint32_t B)
{
	while (s->n_blocks * B < n_ctx) {
		if (pool->next >= pool->n || s->n_blocks >= FH_MAX_SEQ_BLOCKS)
			return -1;
		s->blocks[s->n_blocks++] = pool->next++;
	}
	return 0;
}

/* One step: seqs[i] advances by chunk[i] tokens (all in one flat batch).
 * logits [Σ chunk, vocab] of every token, in batch order; NULL: none.
 * streams (may be NULL): the pre-head streams [Σ chunk, hc_mult, hidden]. */
static inline enum status fh_step2(struct model_exec_cpu *x, struct fh_pool *pool, struct fh_seq **seqs,
			    const uint32_t *chunk, int n_seqs, float *logits, float *streams, struct err *e)
{
	const struct exec_info *info = &model_exec_cpu_exec(x)->info;
	uint32_t B = info->block_tokens, T = 0, nb = 0;
	for (int i = 0; i < n_seqs; i++)
		T += chunk[i];
	int32_t *ids = calloc(T + 1, sizeof *ids), *pos = calloc(T + 1, sizeof *pos);
	uint32_t *qs = calloc((size_t)n_seqs + 1, sizeof *qs), *bids = calloc((size_t)n_seqs * FH_MAX_SEQ_BLOCKS + 1, 4);
	uint32_t *rows = calloc(T + 1, sizeof *rows);
	struct exec_seq *es = calloc((size_t)n_seqs, sizeof *es);
	enum status st = ST_NOMEM;
	if (!ids || !pos || !qs || !bids || !rows || !es)
		goto out;
	uint32_t t = 0;
	for (int i = 0; i < n_seqs; i++) {
		struct fh_seq *s = seqs[i];
		qs[i] = t;
		if (s->n_done + chunk[i] > s->n_ids || fh_ensure_blocks(pool, s, s->n_done + chunk[i], B)) {
			st = err_set(e, ST_INVALID, "harness: sequence %d out of tokens or blocks", i);
			goto out;
		}
		for (uint32_t k = 0; k < chunk[i]; k++, t++) {
			ids[t] = s->ids[s->n_done + k];
			pos[t] = (int32_t)(s->n_done + k);
		}
		uint32_t need = (s->n_done + chunk[i] + B - 1) / B;
		es[i] = (struct exec_seq){.seq_id = s->id, .n_cached_tokens = s->n_done,
					  .n_context_tokens = s->n_done + chunk[i], .n_blocks = need,
					  .block_table_start = nb};
		memcpy(bids + nb, s->blocks, need * sizeof(uint32_t));
		nb += need;
	}
	qs[n_seqs] = t;
	for (uint32_t k = 0; k < T; k++)
		rows[k] = k;
	struct exec_step step = {.n_tokens = T, .token_ids = ids, .positions = pos, .n_seqs = (uint32_t)n_seqs,
				 .seqs = es, .query_start = qs, .block_ids = bids, .n_block_ids = nb};
	st = model_exec_cpu_forward(x, &step, rows, logits ? T : 0, logits, e);
	if (st == ST_OK && streams)
		st = model_exec_cpu_read_streams(x, streams, T, e);
	if (st == ST_OK)
		for (int i = 0; i < n_seqs; i++)
			seqs[i]->n_done += chunk[i];
out:
	free(ids);
	free(pos);
	free(qs);
	free(bids);
	free(rows);
	free(es);
	return st;
}

static inline enum status fh_step(struct model_exec_cpu *x, struct fh_pool *pool, struct fh_seq **seqs, const uint32_t *chunk,
			   int n_seqs, float *logits, struct err *e)
{
	return fh_step2(x, pool, seqs, chunk, n_seqs, logits, NULL, e);
}

static inline double fh_max_abs_diff(const float *a, const float *b, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - (double)b[i]);
		if (!(d <= m))
			m = isnan(d) ? INFINITY : d;
	}
	return m;
}

static inline double fh_lse(const float *l, size_t n)
{
	double mx = -INFINITY, s = 0;
	for (size_t i = 0; i < n; i++)
		if (l[i] > mx)
			mx = l[i];
	for (size_t i = 0; i < n; i++)
		s += exp((double)l[i] - mx);
	return mx + log(s);
}

static uint64_t fh_rng_state = 0x243f6a8885a308d3ull;
static inline uint32_t fh_rand(uint32_t n)
{
	uint64_t z = (fh_rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	z ^= z >> 31;
	return n ? (uint32_t)(z % n) : 0;
}

#endif
