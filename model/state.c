/*
 * model/state.c: allocation and block-to-block copies of the CPU executor's
 * paged state (model/state.h). The forward pass (model/forward.c) decides
 * when to copy; this file only knows the layout.
 */
#include "model/state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void model_state_mix(const struct model_weights *w, struct exec_layer_mix *mix)
{
	const struct model_config *cfg = w->cfg;
	memset(mix, 0, sizeof *mix);
	mix->sliding_window = (uint32_t)cfg->sliding_window;
	uint32_t d = (uint32_t)cfg->head_dim, id = (uint32_t)cfg->index_head_dim;
	for (int l = 0; l < w->n_layers + w->n_mtp; l++) {
		const struct model_layer *ly = &w->layers[l];
		struct exec_layer_kind *k = ly->kind == MODEL_ATTN_CSA ? &mix->csa
					    : ly->kind == MODEL_ATTN_HCA ? &mix->hca
									 : &mix->swa;
		k->n_layers++;
		k->compress_ratio = (uint32_t)ly->ratio;
		k->overlap = ly->kind == MODEL_ATTN_CSA;
		k->ring_entry_bytes = d * 4;
		if (ly->ratio) {
			uint32_t c = k->overlap ? 2 : 1;
			k->kv_entry_bytes = d * 4;
			/* kv + score rows, fp32, per open token: c*d each; CSA adds the indexer's 2*id */
			k->compressor_token_bytes = c * d * 8 + (ly->kind == MODEL_ATTN_CSA ? 2 * id * 8 : 0);
		}
		if (ly->kind == MODEL_ATTN_CSA)
			k->indexer_entry_bytes = id * 4;
	}
}

static float *alloc_f(const struct model_state *s, size_t n)
{
	void *p = NULL;
	struct err e;
	if (n && kern_mem_alloc(&s->mem, n * sizeof(float), &p, &e))
		return NULL;
	/* DSV4_STATE_POISON=1: NaN instead of zeros, so that a read of a state
	 * row no step has written shows as NaN in the logits (a test aid) */
	const char *poison = getenv("DSV4_STATE_POISON");
	if (p && poison && *poison == '1' && kern_mem_set(&s->mem, p, 0xff, n * sizeof(float), &e))
		return NULL;
	return p;
}

enum status model_state_create(struct model_state *s, const struct model_weights *w, uint32_t n_blocks,
			       uint32_t block_tokens, const struct kern_mem *mem, struct err *e)
{
	memset(s, 0, sizeof *s);
	if (mem)
		s->mem = *mem;
	struct exec_layer_mix mix;
	model_state_mix(w, &mix);
	enum status st = exec_layer_mix_check(&mix, block_tokens, e);
	if (st)
		return st;
	if (!n_blocks)
		return err_set(e, ST_INVALID, "state: 0 blocks");
	const struct model_config *cfg = w->cfg;
	s->n_blocks = n_blocks;
	s->block_tokens = block_tokens;
	s->window = (uint32_t)cfg->sliding_window;
	s->n_layers = w->n_layers + w->n_mtp;
	s->head_dim = (int)cfg->head_dim;
	s->index_head_dim = (int)cfg->index_head_dim;
	s->ls = calloc((size_t)s->n_layers, sizeof *s->ls);
	if (!s->ls)
		return err_set(e, ST_NOMEM, "state layers");
	size_t d = (size_t)s->head_dim, id = (size_t)s->index_head_dim, nb = n_blocks;
	for (int l = 0; l < s->n_layers; l++) {
		const struct model_layer *ly = &w->layers[l];
		struct model_layer_state *q = &s->ls[l];
		q->ratio = ly->ratio;
		q->overlap = ly->kind == MODEL_ATTN_CSA;
		q->indexer = ly->kind == MODEL_ATTN_CSA;
		q->ring = alloc_f(s, nb * s->window * d);
		bool ok = q->ring != NULL;
		if (q->ratio) {
			size_t c = q->overlap ? 2 : 1, m = (size_t)q->ratio;
			q->per_block = (int)(block_tokens / q->ratio);
			q->cmp_state_floats = (int64_t)(c * m * c * d);
			q->cmp = alloc_f(s, nb * (size_t)q->per_block * d);
			q->cmp_kv = alloc_f(s, nb * (size_t)q->cmp_state_floats);
			q->cmp_score = alloc_f(s, nb * (size_t)q->cmp_state_floats);
			ok = ok && q->cmp && q->cmp_kv && q->cmp_score;
			if (q->indexer) {
				q->icmp_state_floats = (int64_t)(2 * m * 2 * id);
				q->ikeys = alloc_f(s, nb * (size_t)q->per_block * id);
				q->icmp_kv = alloc_f(s, nb * (size_t)q->icmp_state_floats);
				q->icmp_score = alloc_f(s, nb * (size_t)q->icmp_state_floats);
				ok = ok && q->ikeys && q->icmp_kv && q->icmp_score;
			}
		}
		if (!ok) {
			model_state_free(s);
			return err_set(e, ST_NOMEM, "state of layer %d (%u blocks)", l, n_blocks);
		}
	}
	return ST_OK;
}

void model_state_free(struct model_state *s)
{
	if (!s)
		return;
	for (int l = 0; s->ls && l < s->n_layers; l++) {
		struct model_layer_state *q = &s->ls[l];
		float *ps[] = {q->ring, q->cmp, q->cmp_kv, q->cmp_score, q->ikeys, q->icmp_kv, q->icmp_score};
		for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
			kern_mem_free(&s->mem, ps[i]);
	}
	free(s->ls);
	memset(s, 0, sizeof *s);
}

void model_state_block_init(struct model_state *s, int l, uint32_t b)
{
	struct model_layer_state *q = &s->ls[l];
	if (!q->ratio)
		return;
	for (int64_t i = 0; i < q->cmp_state_floats; i++) {
		q->cmp_kv[b * q->cmp_state_floats + i] = 0.0f;
		q->cmp_score[b * q->cmp_state_floats + i] = -INFINITY;
	}
	for (int64_t i = 0; i < q->icmp_state_floats; i++) {
		q->icmp_kv[b * q->icmp_state_floats + i] = 0.0f;
		q->icmp_score[b * q->icmp_state_floats + i] = -INFINITY;
	}
}

void model_state_copy_cmp(struct model_state *s, int l, uint32_t dst, uint32_t src)
{
	struct model_layer_state *q = &s->ls[l];
	if (!q->ratio || dst == src)
		return;
	size_t n = (size_t)q->cmp_state_floats * sizeof(float);
	memcpy(q->cmp_kv + dst * q->cmp_state_floats, q->cmp_kv + src * q->cmp_state_floats, n);
	memcpy(q->cmp_score + dst * q->cmp_state_floats, q->cmp_score + src * q->cmp_state_floats, n);
	if (q->indexer) {
		n = (size_t)q->icmp_state_floats * sizeof(float);
		memcpy(q->icmp_kv + dst * q->icmp_state_floats, q->icmp_kv + src * q->icmp_state_floats, n);
		memcpy(q->icmp_score + dst * q->icmp_state_floats, q->icmp_score + src * q->icmp_state_floats, n);
	}
}

void model_state_copy_ring(struct model_state *s, int l, uint32_t dst, uint32_t src)
{
	struct model_layer_state *q = &s->ls[l];
	if (dst == src)
		return;
	size_t n = (size_t)s->window * (size_t)s->head_dim;
	memcpy(q->ring + dst * n, q->ring + src * n, n * sizeof(float));
}
