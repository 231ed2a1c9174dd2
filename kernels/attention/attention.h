/*
 * kernels/attention/attention.h: sparse MQA attention of DeepSeek-V4 over
 * gathered key indices, and the builders of those index sets for a flat
 * varlen batch (dsv4.md §3.3 "Core attention", "Attention sink", "Output
 * path" step 1; §3.5 SWA, §3.7 CSA, §3.8 HCA; §8 items 1, 8, 10, 16).
 *
 * Attention, per token t and head h, with K = V = the entry e_i (one KV head):
 *   s_i = softmax_scale·(q_{t,h}·e_i)   for every valid index i in idx[t]
 *   o   = Σ_i e^{s_i} e_i / (Σ_i e^{s_i} + e^{sink_h})
 * then the last rope_dim dims of o are rotated by -pos[t] (the value carries
 * each key's rotation). Index -1 is skipped; a row with no valid index gives
 * o = 0 (with a sink: 0/(e^sink); without one: defined as 0).
 *
 * Index space. The keys may live in up to KERN_ATTN_MAX_SRC row sources (for
 * example this step's fresh raw KV, the per-sequence rings, the compressed
 * pool); an index addresses their concatenation: index i < kv_rows[0] is row i
 * of kv[0], the next kv_rows[1] indices are kv[1], and so on. This is the
 * reference's "[window | compressed]" buffer generalised to many sequences.
 * A GPU variant reads the same flat lists (FlashMLA-style indices + topk
 * length); nothing is per sequence.
 *
 * One attention layer over a step's flat batch, with these ops (T tokens):
 *   q:  linear wq_a -> rmsnorm(q_norm) -> linear wq_b -> rmsnorm unweighted per
 *       head (rows T·H, bf16_stats) -> rope(pos)
 *   kv: linear wkv -> rmsnorm(kv_norm) -> rope(pos) -> FP8 qdq of the nope dims
 *       (kern_act_quant_fp8_sim, block 64, n_cols d-r, ld d): this step's
 *       "fresh" raw KV rows
 *   CSA/HCA: kern_compressor_ref (main) into the compressed pool; CSA also the
 *       indexer: linear indexer.wq_b -> rope -> kern_indexer_rotate_quant_ref,
 *       weights_proj, kern_compressor_ref (HADAMARD_FP4, d 128) into the key
 *       pool, kern_indexer_topk_ref
 *   kern_attn_index_ref (fresh | ring | compressed) -> kern_sparse_attn_ref
 *   (sink, inverse rope) -> kern_ring_write_ref -> wo_a / wo_b.
 */
#ifndef DSV4_KERNELS_ATTENTION_ATTENTION_H
#define DSV4_KERNELS_ATTENTION_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/attention/rowmap.h"
#include "kernels/registry/registry.h"

#define KERN_ATTN_MAX_SRC 3

struct kern_sparse_attn_args {
	const float *q;                       /* [n_tokens, n_heads, head_dim] (rope already applied) */
	float *out;                           /* out [n_tokens, n_heads, head_dim]; must not overlap q or kv */
	const float *kv[KERN_ATTN_MAX_SRC];   /* source s: [kv_rows[s], kv_stride]; unused sources NULL */
	int64_t kv_rows[KERN_ATTN_MAX_SRC];   /* rows of each source (0 for unused ones) */
	int64_t kv_stride;                    /* elements between entries; 0 means head_dim */
	const int32_t *idx;                   /* [n_tokens, idx_stride] indices into the concatenation; -1 = skip */
	const int32_t *idx_len;               /* [n_tokens] valid prefix of each row (<= idx_stride), or NULL
					       * (whole rows); entries past it are not read */
	int idx_stride;                       /* index slots per token (>= 0) */
	const float *sink;                    /* [n_heads] attn_sink logits, or NULL (no sink) */
	float softmax_scale;                  /* head_dim^-0.5 = 1/√512, no mscale */
	const int32_t *pos;                   /* [n_tokens] query positions for the inverse rope */
	const float *omega;                   /* [rope_dim/2] rope table of the layer, or NULL: no inverse rope */
	int rope_dim;                         /* 64; the last rope_dim dims of each head */
	int64_t n_tokens;                     /* 0 is valid */
	int n_heads;                          /* 64 (a TP rank's share) */
	int head_dim;                         /* 512 */
	bool bf16_out;                        /* round o to bf16 values */
	void *stream;                         /* cudaStream_t for CUDA variants; ignored by the CPU reference */
	void *ctx;                            /* struct kern_ctx * of the executor (its scratch), or NULL: the default */
};

/* CPU reference. ST_INVALID for NULL pointers, bad dims, or an index outside
 * [-1, Σ kv_rows) (checked before anything is written). */
enum status kern_sparse_attn_ref(const struct kern_sparse_attn_args *a) DSV4_WUR;

/*
 * Index sets for one layer over a flat batch. Sequence s owns tokens
 * [q_off[s], q_off[s+1]) of the batch; token i of it has position
 * t = start_pos[s] + (i - q_off[s]). Rows of the index space (see above):
 *   - raw KV of a position p >= start_pos[s] (this step's tokens):
 *       cur_row0 + q_off[s] + (p - start_pos[s])       (fresh KV, not yet in the ring)
 *   - raw KV of a position p < start_pos[s]: ring_row0[s] + (p mod window)
 *       (the ring of the last `window` positions before this step)
 *   - compressed entry w: cmp_row0[s] + w, or through cmp_paged (rowmap.h)
 * Keeping this step's raw KV apart from the ring lets a chunk longer than the
 * window (or a chunk that wraps it) see every key of its window; the caller
 * writes the step's KV into the ring after attention.
 *
 * S(t):
 *   window: positions {t-window+1 .. t} ∩ [0, t], oldest first  (§3.5)
 *   ratio 0 (SWA):  window only
 *   HCA (topk NULL): window ∪ {w : w < floor((t+1)/ratio)}, w ascending (§3.8)
 *   CSA (topk set):  window ∪ {topk[t][j] != -1} in topk order; each must be
 *                    visible, w < floor((t+1)/ratio) (§3.7)
 * idx[t] gets the rows, idx_len[t] their count, the rest of the row -1.
 */
struct kern_attn_index_args {
	int64_t n_tokens;          /* = q_off[n_seqs] */
	int n_seqs;
	const int32_t *q_off;      /* [n_seqs + 1] */
	const int32_t *start_pos;  /* [n_seqs] */
	int window;                /* sliding_window = 128 */
	int64_t cur_row0;          /* index-space row of flat token 0's fresh raw KV */
	const int64_t *ring_row0;  /* [n_seqs] row of ring slot 0; may be NULL when every start_pos is 0 */
	int ratio;                 /* 0: sliding only; else the compress ratio m (4 CSA, 128 HCA) */
	const int64_t *cmp_row0;   /* [n_seqs] row of compressed entry 0; needed when ratio > 0 */
	struct kern_rowmap_paged cmp_paged; /* optional paged layout of the compressed rows (zero: row0) */
	const int32_t *topk;       /* CSA: [n_tokens, topk_stride] entry ids (-1 none); NULL for HCA */
	int topk_stride;
	int32_t *idx;              /* out [n_tokens, idx_stride] */
	int32_t *idx_len;          /* out [n_tokens] */
	int idx_stride;            /* capacity per token; ST_INVALID if a set does not fit
				    * or a row does not fit in int32 (indices are int32, as FlashMLA's) */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

enum status kern_attn_index_ref(const struct kern_attn_index_args *a) DSV4_WUR;

/*
 * After attention: store this step's raw KV rows into the per-sequence rings
 * (§3.5, slot p mod window), so that the next step finds positions
 * [end - window, end) there. Only a sequence's last `window` positions are
 * written, so every ring slot is written at most once per step (a GPU
 * variant has no write races, however long the chunk).
 */
struct kern_ring_write_args {
	const float *src;          /* [n_tokens, src_stride] this step's raw KV, flat batch order */
	int64_t src_stride;        /* 0 means dim */
	float *ring;               /* ring pool [.., ring_stride] */
	int64_t ring_stride;       /* 0 means dim */
	const int64_t *ring_row0;  /* [n_seqs] pool row of slot 0 of each sequence's ring */
	int64_t n_ring_rows;       /* pool rows (bounds check) */
	int64_t n_tokens;          /* = q_off[n_seqs] */
	int n_seqs;
	const int32_t *q_off;      /* [n_seqs + 1] */
	const int32_t *start_pos;  /* [n_seqs] */
	int window;                /* 128 */
	int dim;                   /* values per row (512) */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

enum status kern_ring_write_ref(const struct kern_ring_write_args *a) DSV4_WUR;

/* ---- registry ---- */

/* Signature of run / run_host of every sparse_attn variant. */
typedef enum status (*kern_sparse_attn_fn)(const struct kern_sparse_attn_args *a);
/* The registry table of op "sparse_attn" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_sparse_attn;

/* Signature of run / run_host of every attn_index variant. */
typedef enum status (*kern_attn_index_fn)(const struct kern_attn_index_args *a);
/* The registry table of op "attn_index" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_attn_index;

/* Signature of run / run_host of every ring_write variant. */
typedef enum status (*kern_ring_write_fn)(const struct kern_ring_write_args *a);
/* The registry table of op "ring_write" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_ring_write;

#endif
