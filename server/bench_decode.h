/*
 * server/bench_decode.h: what the modules of `dsv4 bench decode` share inside
 * server/. Not a public header. The command (cmd_bench.c) parses the options
 * and walks the configurations; bench_run.c drives the executor (prefill,
 * decode steps); bench_profile.c is the registry profiling hook's user side
 * and the per-op report; bench_roofline.c counts the bytes a step must read,
 * measures the read bandwidth and derives the full-model and 2 x GB10
 * figures; bench_report.c prints the table and writes the JSON.
 */
#ifndef DSV4_SERVER_BENCH_DECODE_H
#define DSV4_SERVER_BENCH_DECODE_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "common/status.h"
#include "kernels/registry/registry.h"
#include "model/checkpoint.h"
#include "model/exec_open.h"

#define BENCH_MAX_LIST 32
#define BENCH_MAX_LAYERS 128

/* 2 x GB10 reference points (docs/perf.md): vLLM stock, and its forks */
#define VLLM_GB10_TOKS 26.4

struct bench_opts {
	const char *model, *device, *json, *prec;
	uint32_t contexts[BENCH_MAX_LIST], batches[BENCH_MAX_LIST];
	int n_contexts, n_batches;
	uint32_t steps, warmup, prefixes, chunk, bw_mib;
	uint64_t seed;
	bool profile, enforce_eager;
	double gb10_gbps, ar_latency_us, ar_gbps, gpu_util;
};

static inline double bench__now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline uint64_t bench__rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* ---- the profiling hook's user side (bench_profile.c) ---- */

struct prof_rec {
	const char *op, *variant;
	int layer;        /* -1: embedding; 0..L-1; L: head and sampling */
	double us;
	int64_t rows, cols; /* linear: the weight's shape */
};

struct prof {
	bool gpu, timing;
	int n_layers, top_k, n_experts;
	int n_post, n_route;
	double t0;
	struct prof_rec *recs;
	int n_recs, cap_recs;
	int32_t *ids;       /* [n_layers][max_tokens * top_k] chosen experts */
	int64_t *ids_n;     /* [n_layers] entries captured */
	int64_t ids_cap;    /* entries per layer */
	bool failed;
};

/* ---- what a step must read (bench_roofline.c) ---- */

struct layer_bytes {
	int ratio;              /* 0 sliding, else the compress ratio */
	uint64_t dense;         /* every tensor of the layer but the routed experts and tid2eid */
	uint64_t tid2eid_row;   /* bytes of one tid2eid row, 0 = not a hash layer */
	uint64_t expert;        /* one routed expert (w1 + w2 + w3 with scales) */
};

struct model_bytes {
	int n_layers;
	struct layer_bytes layer[BENCH_MAX_LAYERS];
	uint64_t global;        /* head, final norm, head mHC */
	uint64_t embed_row;     /* one embedding row */
};

/* ---- one configuration ---- */

struct op_sum {
	const char *op, *variant;
	int64_t rows, cols;
	int calls;
	double us;
};

struct result {
	uint32_t ctx, batch;
	bool skipped;
	char why[160];
	double ms_median, ms_mean, ms_min, tok_s;
	double ctx_mean;
	uint64_t b_dense, b_experts, b_global, b_state, b_total;
	double experts_per_layer;
	double gbps, frac;
	/* profile */
	double prof_total_us, prof_layer_us[BENCH_MAX_LAYERS + 2]; /* [0] embed, [1+l] layer l, [1+L] head */
	struct op_sum *ops;
	int n_ops;
	/* derived */
	double full_ms, full_tok_s, full_frac;
	uint64_t full_bytes, full_state;
	double gb10_tok_s, gb10_ms, gb10_rank_bytes;
};

struct full_cfg {
	int n_layers;
	int32_t ratios[BENCH_MAX_LAYERS];
};

/* The executor the configurations run on and the prompts they continue from. */
struct bench {
	const struct bench_opts *o;
	struct model_exec_open *mx;
	struct exec *ex;
	const struct model_config *cfg;
	struct prof *prof;
	uint32_t B, S;
	int32_t *prompts;  /* [prefixes][ctx] */
	uint32_t *block_ids;
	uint64_t seq_id;
};

/* bench_profile.c: the registry hook's callbacks (kern_profile_hooks, user = struct prof) */
void bench__prof_before(void *u, const struct kern_op *op, const struct kern_variant *base, const void *args);
void bench__prof_after(void *u, const struct kern_op *op, const struct kern_variant *base, const void *args,
		       enum status st);
/* the profiled step's records summed per op, variant and shape, and per layer, into r */
enum status bench__summarise_profile(const struct prof *p, struct result *r, struct err *e) DSV4_WUR;
void bench__print_profile(const struct result *r, int L);

/* bench_roofline.c */
enum status bench__read_bw(bool gpu, uint32_t mib, double *gbps, struct err *e) DSV4_WUR;
void bench__model_bytes_of(const struct model_checkpoint *ck, struct model_bytes *mb);
void bench__count_bytes(const struct bench *b, const struct model_bytes *mb, int L, struct result *r);
void bench__full_model(const char *dir, const struct model_config *cfg, struct full_cfg *f);
void bench__derive(const struct bench_opts *o, const struct model_config *cfg, const struct exec_info *in,
		   const struct model_bytes *mb, const struct full_cfg *full, int L, struct result *r);

/* bench_run.c */
enum status bench__open(struct bench *b, const struct model_exec_open_options *xo, uint32_t B,
			struct err *e) DSV4_WUR;
enum status bench__prefill(struct bench *b, uint32_t C, uint32_t np, double *tok_s, struct err *e) DSV4_WUR;
enum status bench__decode_run(struct bench *b, uint32_t C, uint32_t np, uint32_t batch, bool profile,
			      struct result *r, struct err *e) DSV4_WUR;

/* bench_report.c */
void bench__print_table(const struct bench_opts *o, const struct result *rs, int n, int L, int full_layers,
			double bw, bool gpu);

/* What the JSON's head says about the run, besides the options. */
struct bench_run_info {
	const char *device;      /* the GPU's name, or "cpu" */
	bool dummy_weights;
	int layers_measured, layers_full;
	uint32_t block_tokens;
	double read_bw_gbps;
};

/* Writes o->json; 0, or -1 when the file cannot be written. */
int bench__write_json(const struct bench_opts *o, const struct bench_run_info *info, const struct result *rs,
		      int n_rs);

#endif
