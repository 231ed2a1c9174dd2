/*
 * model/weights_upload.c: model_weights_upload (model/weights.h), the last
 * step of loading for a GPU executor. After model_weights_load every tensor
 * is a host view (into the mapped checkpoint, or a buffer that prepare()
 * produced); here each one is copied to the device once, in the layout its
 * variant consumes, and the pointer in the weights is switched to the copy.
 * What the weights owned on the host is freed as soon as it is on the
 * device, so a loaded model holds one copy of each tensor.
 */
#include "model/weights.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/timeutil.h"

struct up {
	struct model_weights *w;
	uint64_t bytes;
};

static enum status keep(struct model_weights *w, void *p, struct err *e)
{
	if (w->n_dev_owned == w->cap_dev_owned) {
		int cap = w->cap_dev_owned ? 2 * w->cap_dev_owned : 256;
		void **n = realloc(w->dev_owned, (size_t)cap * sizeof *n);
		if (!n)
			return err_set(e, ST_NOMEM, "weights: device list");
		w->dev_owned = n;
		w->cap_dev_owned = cap;
	}
	w->dev_owned[w->n_dev_owned++] = p;
	return ST_OK;
}

/* *pp (host, bytes long) -> a device copy; *pp then points to it. */
static enum status put(struct up *u, const void **pp, size_t bytes, struct err *e)
{
	if (!*pp || !bytes)
		return ST_OK;
	void *d;
	enum status st = kern_mem_alloc(&u->w->mem, bytes, &d, e);
	if (st)
		return st;
	if ((st = keep(u->w, d, e))) {
		kern_mem_free(&u->w->mem, d);
		return st;
	}
	if ((st = kern_mem_upload(&u->w->mem, d, *pp, bytes, e)))
		return st;
	*pp = d;
	u->bytes += bytes;
	return ST_OK;
}

#define PUT(u, ptr, bytes)                                                                         \
	do {                                                                                       \
		const void *p_ = (ptr);                                                            \
		enum status s_ = put((u), &p_, (bytes), e);                                        \
		if (s_)                                                                            \
			return s_;                                                                 \
		memcpy(&(ptr), &p_, sizeof p_);                                                    \
	} while (0)

/* One weight matrix: data and scales to the device; a buffer the view owned
 * on the host (prepare's output) is freed once copied. */
static enum status put_wmat(struct up *u, struct kern_wmat *m, struct err *e)
{
	if (!m->data)
		return ST_OK;
	size_t db = kern_wmat_data_bytes(m), sb = kern_wmat_scale_bytes(m);
	PUT(u, m->data, db);
	PUT(u, m->scale, sb);
	free(m->owned);
	m->owned = NULL;
	return ST_OK;
}

static enum status put_hc(struct up *u, struct model_hc *hc, int64_t n_out, int64_t k, int64_t n_scale,
			  struct err *e)
{
	PUT(u, hc->fn, (size_t)(n_out * k) * sizeof(float));
	PUT(u, hc->base, (size_t)n_out * sizeof(float));
	PUT(u, hc->scale, (size_t)n_scale * sizeof(float));
	return ST_OK;
}

static enum status put_layer(struct up *u, struct model_layer *ly, struct err *e)
{
	struct model_weights *w = u->w;
	const struct model_config *c = w->cfg;
	int64_t D = c->hidden_size, n = c->hc_mult, d = c->head_dim, id = c->index_head_dim;
	int64_t E = w->n_experts_local, K = c->num_experts_per_tok;
	enum status st;
	size_t bf = sizeof(uint16_t), f4 = sizeof(float);
	PUT(u, ly->attn_norm, (size_t)D * bf);
	PUT(u, ly->ffn_norm, (size_t)D * bf);
	if ((st = put_hc(u, &ly->hc_attn, (2 + n) * n, n * D, 3, e)) ||
	    (st = put_hc(u, &ly->hc_ffn, (2 + n) * n, n * D, 3, e)))
		return st;
	struct model_lin *ls[] = {&ly->wq_a, &ly->wq_b, &ly->wkv, &ly->wo_b, &ly->cmp_wkv, &ly->cmp_wgate,
				  &ly->idx_wq_b, &ly->idx_wproj, &ly->idx_cmp_wkv, &ly->idx_cmp_wgate,
				  &ly->gate, &ly->sh_w1, &ly->sh_w3, &ly->sh_w2, &ly->e_proj, &ly->h_proj};
	for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
		if ((st = put_wmat(u, &ls[i]->w, e)))
			return st;
	for (int64_t g = 0; g < w->n_groups_local; g++)
		if ((st = put_wmat(u, &ly->wo_a[g].w, e)))
			return st;
	PUT(u, ly->q_norm, (size_t)c->q_lora_rank * bf);
	PUT(u, ly->kv_norm, (size_t)d * bf);
	PUT(u, ly->attn_sink, (size_t)w->n_heads_local * f4);
	{
		float *host = ly->omega;
		PUT(u, ly->omega, (size_t)(c->qk_rope_head_dim / 2) * f4);
		free(host);
	}
	if (ly->ratio) {
		int64_t cm = ly->kind == MODEL_ATTN_CSA ? 2 : 1;
		PUT(u, ly->cmp_ape, (size_t)(ly->ratio * cm * d) * f4);
		PUT(u, ly->cmp_norm, (size_t)d * bf);
	}
	if (ly->kind == MODEL_ATTN_CSA) {
		PUT(u, ly->idx_cmp_ape, (size_t)(ly->ratio * 2 * id) * f4);
		PUT(u, ly->idx_cmp_norm, (size_t)id * bf);
	}
	PUT(u, ly->gate_bias, (size_t)c->n_routed_experts * f4);
	if (ly->tid2eid) {
		int32_t *host = ly->tid2eid;
		PUT(u, ly->tid2eid, (size_t)(c->vocab_size * K) * sizeof(int32_t));
		free(host);
	}
	struct model_experts *x = &ly->experts;
	for (int64_t k = 0; x->w1 && k < 3 * E; k++)
		if ((st = put_wmat(u, &x->w1[k], e)))
			return st;
	if (x->w1) {
		const void *arr = x->w1;
		if ((st = put(u, &arr, (size_t)(3 * E) * sizeof *x->w1, e)))
			return st;
		x->w1_dev = (struct kern_wmat *)arr;
		x->w3_dev = x->w1_dev + E;
		x->w2_dev = x->w3_dev + E;
	}
	if (ly->mtp) {
		PUT(u, ly->enorm, (size_t)D * bf);
		PUT(u, ly->hnorm, (size_t)D * bf);
		PUT(u, ly->mtp_norm, (size_t)D * bf);
		if ((st = put_hc(u, &ly->mtp_hc_head, n, n * D, 1, e)))
			return st;
	}
	return ST_OK;
}

enum status model_weights_upload(struct model_weights *w, const struct kern_mem *mem, struct err *e)
{
	if (!mem->device || w->on_device)
		return ST_OK;
	/* from here on the weights free through mem, and omega / tid2eid are
	 * treated as device pointers (put_layer frees their host copies) */
	w->mem = *mem;
	w->on_device = true;
	struct up u = {.w = w};
	const struct model_config *c = w->cfg;
	int64_t D = c->hidden_size, n = c->hc_mult;
	double t0 = time_mono_s();
	enum status st;
	PUT(&u, w->embed, (size_t)(w->vocab_local * D) * sizeof(uint16_t));
	PUT(&u, w->norm, (size_t)D * sizeof(uint16_t));
	if ((st = put_hc(&u, &w->hc_head, n, n * D, 1, e)) || (st = put_wmat(&u, &w->head.w, e)))
		return st;
	for (int l = 0; l < w->n_layers + w->n_mtp; l++)
		if ((st = put_layer(&u, &w->layers[l], e)))
			return err_prefix(e, "upload of layer %d", l);
	if ((st = kern_mem_sync(mem, e)))
		return st;
	/* host copies the loader made (misaligned tensors, column shards) are on the device now */
	for (int i = 0; i < w->n_owned; i++)
		free(w->owned[i]);
	w->n_owned = 0;
	w->device_bytes = u.bytes;
	double dt = time_mono_s() - t0;
	log_msg(LOG_INFO, "model", "weights on the device: %.2f GiB in %.1f s (%.2f GB/s)",
		(double)u.bytes / (1u << 30), dt, dt > 0 ? (double)u.bytes / dt / 1e9 : 0.0);
	return ST_OK;
}
