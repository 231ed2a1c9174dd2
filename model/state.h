/*
 * model/state.h: the CPU executor's paged block pool (model/exec.h "Paged
 * state"). One block id indexes one slot in every layer's arrays, like the
 * per-layer KV tensors of a GPU engine: block b of layer l owns
 *   (a) growing rows: compressed KV rows [b*B/m, (b+1)*B/m) of l's row pool
 *       (CSA/HCA) and the same rows of its indexer key pool (CSA);
 *   (b) its state region: ring[b] (sliding_window raw KV rows, slot p mod W)
 *       and the open compressor windows cmp_kv[b] / cmp_score[b] (and the
 *       indexer compressor's for CSA), in the layout of
 *       kernels/compressor/compressor.h with state slot = block id.
 * Everything is fp32 (the reference's values, after the simulated FP8/FP4
 * quantization when that is on): the CPU executor is the reference, not a
 * memory-optimal cache (a CUDA executor stores the FP8 "MODEL1" layout).
 */
#ifndef DSV4_MODEL_STATE_H
#define DSV4_MODEL_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "model/exec.h"
#include "model/weights.h"

struct model_layer_state {
	int ratio;                  /* 0: sliding only */
	bool overlap;               /* CSA */
	bool indexer;               /* CSA */
	int per_block;              /* compressed rows per block = B / ratio */
	float *ring;                /* [n_blocks, W, d] */
	float *cmp;                 /* [n_blocks * per_block, d] */
	float *cmp_kv, *cmp_score;  /* [n_blocks, c*m, c*d] */
	float *ikeys;               /* [n_blocks * per_block, index_head_dim] */
	float *icmp_kv, *icmp_score; /* [n_blocks, 2*m, 2*index_head_dim] */
	int64_t cmp_state_floats, icmp_state_floats;
};

struct model_state {
	struct kern_mem mem;       /* where the arrays live (host or the executor's device) */
	uint32_t n_blocks, block_tokens, window;
	int n_layers;              /* main + MTP layers loaded */
	int head_dim, index_head_dim;
	struct model_layer_state *ls; /* [n_layers] */
};

/* The layer mix of w (MTP counted as SWA when loaded), with the byte
 * sizes of this fp32 layout. */
void model_state_mix(const struct model_weights *w, struct exec_layer_mix *mix);

/* Allocate n_blocks blocks of block_tokens (checked with exec_layer_mix_check)
 * in mem (NULL: host memory), zeroed. */
enum status model_state_create(struct model_state *s, const struct model_weights *w, uint32_t n_blocks,
			       uint32_t block_tokens, const struct kern_mem *mem, struct err *e) DSV4_WUR;
void model_state_free(struct model_state *s);

/* The initial state (position 0) into block b of layer l: compressor kv 0,
 * score -inf (the ring needs nothing: no position before 0 is read). */
void model_state_block_init(struct model_state *s, int l, uint32_t b);
/* Copy the compressor part of block src's state region into dst (rule 2). */
void model_state_copy_cmp(struct model_state *s, int l, uint32_t dst, uint32_t src);
/* Copy the ring part of block src's state region into dst (rule 2). */
void model_state_copy_ring(struct model_state *s, int l, uint32_t dst, uint32_t src);

#endif
