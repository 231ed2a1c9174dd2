/*
 * model/forward_internal.h: what the files of the forward pass share; not an
 * interface (model/forward.h is). forward.c owns the object and drives a
 * step (embedding, blocks, head, MTP); forward_ops.c wraps the plan's ops
 * and the step metadata arena; forward_batch.c cuts a step into segments
 * and waves; forward_attn.c runs attention, the compressors and the rings;
 * forward_moe.c the routed and shared experts; forward_dspark.c and
 * forward_spec.c the speculative-decoding entry points.
 *
 * Block rule 2 inside a step: a sequence's chunk is cut into segments at
 * block boundaries. Wave j holds the j-th segment of every sequence. Before
 * wave j is compressed, each of its segments that starts a block copies the
 * previous block's compressor state into its own (or initialises it at
 * position 0), so a completed block ends holding its boundary snapshot; the
 * ring is written wave by wave after attention the same way. When every
 * sequence has a single segment (decodes, chunks inside one block) the one
 * wave is the flat batch itself and nothing is gathered.
 */
#ifndef DSV4_MODEL_FORWARD_INTERNAL_H
#define DSV4_MODEL_FORWARD_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/forward.h"

/* One segment: the tokens of one sequence inside one block. */
struct seg {
	int s;            /* sequence */
	uint32_t i0, i1;  /* flat tokens */
	int32_t pos0;     /* position of i0 */
	int32_t blk;      /* block id */
	int32_t prev_blk; /* block id of the previous table entry when pos0 % B == 0 and pos0 > 0, else -1 */
};

/* Wave j of the step: host counts and metadata-arena arrays (see DEV). */
struct wave {
	int ns;             /* segments */
	uint32_t nt;        /* tokens */
	int32_t *q_off;     /* [ns + 1] offsets into the wave's gathered tokens */
	int32_t *start;     /* [ns] position of each segment's first token */
	int32_t *slot;      /* [ns] block of each segment (compressor state slot) */
	int32_t *bt;        /* [ns, bt_stride] block table of each segment's sequence */
	int64_t *ring_row0; /* [ns] ring pool row of slot 0 of each segment's block */
	int32_t *gather;    /* [nt] flat token of each wave token; NULL: the flat batch itself */
	int32_t *init_ids;  /* [n_init] blocks whose compressor state starts at position 0 */
	int n_init;
	int32_t *cp_dst, *cp_src; /* [n_cp] block-state copies of rule 2 */
	int n_cp;
};

#define MAX_KINDS 4 /* distinct compressed-row pool sizes (SWA 0, CSA, HCA, spare) */

struct model_fwd {
	const struct model_weights *w;
	struct model_state *st;
	struct model_fwd_options opt;
	const struct model_config *cfg;
	struct kern_mem mem;
	const struct model_global_ops *g;
	int64_t D, n, H, d, r, G, R, QL, I, E, K, NHI, ID, V;
	int64_t EL, EB, VL, VB; /* local experts / vocabulary rows (tensor parallel) */
	int rank, ws;
	bool comm_staged;          /* the communicator takes host buffers only: stage device buffers */
	float *comm_host;          /* [T * n * D] host staging for comm_staged */
	float *lg_local, *lg_all;  /* TP head: this rank's vocabulary shard, the gathered shards */
	int idx_stride;
	void *lt_ws;               /* linear workspace (cuBLASLt), lt_ws_bytes */
	size_t lt_ws_bytes;

	/* the metadata arena: host staging and its device mirror (the same
	 * buffer on the host backend); reset every step */
	char *meta_h, *meta_d;
	size_t meta_cap, meta_used, meta_flushed;
	int perturb; /* DSV4_FWD_PERTURB at create: the 1-ulp input perturbation (host only) */
	int trace_steps, step_no; /* DSV4_FWD_TRACE=N: checksums of every op's output in the first N steps */

	/* the current batch (host values) */
	uint32_t T;
	int S;
	struct seg *segs;
	int n_segs, max_wave;
	int *seg_first;             /* [S + 1] first segment of each sequence */
	int32_t *bt_h;              /* [S, bt_stride] host block tables */
	int32_t *entry_blk;         /* [S] */
	int32_t bt_stride;
	struct wave *waves;         /* [max waves] */
	/* the current batch (arena arrays) */
	int32_t *ids, *pos, *q_off, *start_pos, *bt;
	int n_kinds;
	int kind_rows[MAX_KINDS];   /* compressed-row pool size of each kind */
	int64_t *ring_row0[MAX_KINDS]; /* [S] per kind: index-space row of ring slot 0 of each sequence */

	/* activations (mem) */
	float *x, *x2, *u, *xn, *fo, *mix, *sqr, *pre, *post, *comb;
	float *qr, *q, *kv, *o, *z, *kvp, *gp, *ikvp, *igp, *wa, *wb, *qi, *hw, *topk_work;
	int32_t *topk, *idx, *idx_len;
	float *glog, *ew, *rw, *h1, *h3, *y2, *sh1, *sh3, *shy, *hh, *m1, *m2;
	int32_t *eids, *offsets, *row_src, *row_slot, *slot_row;
	int64_t *n_rows;
	float *pooled;        /* FP32 mode: the compressors' pre-norm entries (largest row pool) */
	float *x_final;
	struct fwd_spec *spec; /* speculative decoding: verify rollback (forward_spec.c), or NULL */
	int32_t *mtp_bidx;     /* MTP: [max_tokens * hc_mult] row t of each stream row (t * n + j), in mem */
	float *dsp_cap;        /* DSpark: [max_tokens, n_targets * D] target-layer captures (host), or NULL */
};

/* The device address of a host pointer into the metadata arena. */
#define DEV(f, hp) ((__typeof__(hp))(void *)((hp) ? (f)->meta_d + ((const char *)(hp) - (f)->meta_h) : NULL))

/* p = count elements of the arena, or the enclosing function returns its
 * error (in its `e`) when the arena is full (a sizing bug). */
#define TAKE(f, p, count)                                                                          \
	do {                                                                                       \
		(p) = fwd__meta_take((f), (size_t)(count) * sizeof *(p));                          \
		if (!(p))                                                                          \
			return err_set(e, ST_INVALID, "forward: step metadata over %zu bytes", (f)->meta_cap); \
	} while (0)

/* A kernel call of layer `layer_` (-1: not one layer's op); a failure
 * becomes the enclosing function's error, in its `e`, naming the call. */
#define OK(layer_, call)                                                                           \
	do {                                                                                       \
		enum status st_ = (call);                                                          \
		if (st_)                                                                           \
			return err_set(e, st_, "layer %d: %s failed", (layer_), #call);            \
	} while (0)

/* Wave j's segment of sequence s (its j-th), or NULL when s has fewer. */
static inline const struct seg *fwd__wave_seg(const struct model_fwd *f, int s, int j)
{
	int gi = f->seg_first[s] + j;
	return gi < f->seg_first[s + 1] ? &f->segs[gi] : NULL;
}

/* ---- forward_ops.c: memory, the metadata arena, the op wrappers ---- */
enum status fwd__mem_alloc(struct model_fwd *f, void *pp, size_t bytes, struct err *e) DSV4_WUR;
void *fwd__meta_take(struct model_fwd *f, size_t n);
enum status fwd__meta_reset(struct model_fwd *f, struct err *e) DSV4_WUR;
enum status fwd__meta_flush(struct model_fwd *f, struct err *e) DSV4_WUR;
void fwd__trace(const struct model_fwd *f, const char *what, int layer, const float *x, int64_t n);
enum status fwd__round_bf16(const struct model_fwd *f, float *x, int64_t n, struct err *e) DSV4_WUR;
enum status fwd__collective(struct model_fwd *f, float *x, float *out, int64_t n, bool gather,
			    struct err *e) DSV4_WUR;
enum status fwd__all_reduce(struct model_fwd *f, float *x, int64_t n, struct err *e) DSV4_WUR;
enum status fwd__lin(const struct model_fwd *f, const struct model_lin *l, const float *x, int64_t ldx, int64_t T,
		     float *y, int64_t ldy, bool round, int layer, struct err *e) DSV4_WUR;
enum status fwd__norm(const struct model_fwd *f, const struct model_layer *ly, float *x, float *y, int64_t rows,
		      int dim, const uint16_t *w, bool round, int layer, struct err *e) DSV4_WUR;
enum status fwd__copy_rows(const struct model_fwd *f, float *dst, int64_t dst_stride, const int32_t *dst_idx,
			   const float *src, int64_t src_stride, const int32_t *src_idx, int64_t n_rows, int64_t dim,
			   struct err *e) DSV4_WUR;
enum status fwd__hc_pre(struct model_fwd *f, const struct model_layer *ly, const struct model_hc *hc,
			const float *x, float *u, int layer, struct err *e) DSV4_WUR;
enum status fwd__hc_post(struct model_fwd *f, const struct model_layer *ly, const float *fo, const float *x,
			 float *x_out, int layer, struct err *e) DSV4_WUR;

/* ---- forward_batch.c ---- */
enum status fwd__batch_prepare(struct model_fwd *f, const struct exec_step *step, struct err *e) DSV4_WUR;

/* ---- forward_attn.c ---- */
enum status fwd__compress_waves(struct model_fwd *f, const struct model_layer *ly, int l, struct err *e) DSV4_WUR;
enum status fwd__ring_waves(struct model_fwd *f, int l, struct err *e) DSV4_WUR;
enum status fwd__attn_q(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn,
			const int32_t *pos, struct err *e) DSV4_WUR;
enum status fwd__attn_kv(struct model_fwd *f, const struct model_layer *ly, int l, const float *x,
			 const int32_t *pos, int64_t T, float *kv, struct err *e) DSV4_WUR;
enum status fwd__attn_out(struct model_fwd *f, const struct model_layer *ly, int l, float *out,
			  struct err *e) DSV4_WUR;
enum status fwd__attention(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn, float *out,
			   struct err *e) DSV4_WUR;

/* ---- forward_moe.c ---- */
enum status fwd__moe(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn, float *out,
		     struct err *e) DSV4_WUR;

/* ---- forward.c ---- */
enum status fwd__embed(struct model_fwd *f, float *out, int64_t n_copies, struct err *e) DSV4_WUR;
enum status fwd__head(struct model_fwd *f, const struct model_layer *ly0, const struct model_hc *hc,
		      const uint16_t *norm_w, const float *streams, const uint32_t *rows, uint32_t n_rows,
		      float *logits, struct err *e) DSV4_WUR;

/* ---- forward_dspark.c ---- */
enum status fwd__dspark_capture(struct model_fwd *f, int l, struct err *e) DSV4_WUR;

/* ---- forward_spec.c ---- */
enum status fwd__spec_stash(struct model_fwd *f, const struct model_layer *ly, int l, struct err *e) DSV4_WUR;
void fwd__spec_free(struct model_fwd *f);

#endif
