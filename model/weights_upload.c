/*
 * model/weights_upload.c: model_weights_upload (model/weights.h), the last
 * step of loading for a GPU executor. After model_weights_load every tensor
 * is a host view (into the mapped checkpoint, or a buffer that prepare()
 * produced); here each one is copied to the device once, in the layout its
 * variant consumes, and the pointer in the weights is switched to the copy.
 * What the weights owned on the host is freed as soon as it is on the
 * device, so a loaded model holds one copy of each tensor.
 *
 * Why it streams: a view into the mapping is read from disk only when it is
 * touched, and the runtime copies pageable memory in small synchronous
 * pieces. So the walk runs twice: a dry pass sums the sizes and one device
 * arena is allocated (one cudaMalloc, not one per tensor: the real model has
 * 69,187), then every tensor goes through two page-locked staging buffers of
 * UP_CHUNK bytes: UP_THREADS threads copy the next chunk out of the mapping
 * (their page faults are parallel disk reads, helped by MADV_WILLNEED on the
 * tensors ahead) while the DMA of the previous chunk runs. A progress line
 * (GiB done, GB/s, ETA) every few seconds; the last line gives time and rate.
 */
#include "model/weights.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"

#define UP_ALIGN 256
#define UP_CHUNK ((size_t)64 << 20)
#define UP_THREADS 8
#define UP_AHEAD ((size_t)256 << 20) /* bytes of the mapping read ahead of the copy */
#define UP_LOG_S 3.0

struct up {
	struct model_weights *w;
	bool dry;            /* pass 1: sizes only */
	uint64_t bytes;      /* pass 1: arena bytes; pass 2: bytes placed */
	uint64_t total;      /* pass 2: the arena's size */
	char *arena;
	uint8_t *stage[2];   /* page-locked */
	int cur;             /* the staging buffer filled next */
	double t0, t_log;
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

/* One thread's part of a chunk copy. */
struct slice {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
};

static void *copy_slice(void *p)
{
	struct slice *s = p;
	memcpy(s->dst, s->src, s->n);
	return NULL;
}

/* dst <- src (n bytes) by up to UP_THREADS threads: each faults in its own
 * part of the mapping, so the disk sees parallel reads. */
static void par_copy(uint8_t *dst, const uint8_t *src, size_t n)
{
	pthread_t th[UP_THREADS];
	struct slice sl[UP_THREADS];
	int nt = n < ((size_t)4 << 20) ? 1 : UP_THREADS, started = 0;
	size_t per = (n / (size_t)nt + 4095) & ~(size_t)4095;
	for (int i = 0; i < nt; i++) {
		size_t a = (size_t)i * per, b = a + per < n ? a + per : n;
		sl[i] = (struct slice){.dst = dst + a, .src = src + a, .n = a < b ? b - a : 0};
	}
	for (int i = 1; i < nt; i++)
		if (sl[i].n && pthread_create(&th[i], NULL, copy_slice, &sl[i]) == 0)
			started |= 1 << i;
		else
			copy_slice(&sl[i]); /* no thread: this one copies it */
	copy_slice(&sl[0]);
	for (int i = 1; i < nt; i++)
		if (started & (1 << i))
			pthread_join(th[i], NULL);
}

/* Ask the kernel to start reading [p, p + n) (a view into the mapping;
 * harmless on other memory). */
static void read_ahead(const void *p, size_t n)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1), b = (uintptr_t)p + n;
	if (n)
		(void)madvise((void *)a, b - a, MADV_WILLNEED);
}

static void progress(struct up *u)
{
	double now = time_mono_s();
	if (now - u->t_log < UP_LOG_S)
		return;
	u->t_log = now;
	double dt = now - u->t0, rate = dt > 0 ? (double)u->bytes / dt : 0;
	log_msg(LOG_INFO, "model", "weights to the device: %.2f / %.2f GiB, %.2f GB/s, ETA %.0f s",
		(double)u->bytes / (1u << 30), (double)u->total / (1u << 30), rate / 1e9,
		rate > 0 ? (double)(u->total - u->bytes) / rate : 0.0);
}

/* host src -> device dst through the staging buffers. */
static enum status stream_copy(struct up *u, void *dst, const void *src, size_t bytes, struct err *e)
{
	const uint8_t *s = src;
	read_ahead(s, bytes < UP_AHEAD ? bytes : UP_AHEAD);
	for (size_t off = 0; off < bytes; off += UP_CHUNK) {
		size_t n = bytes - off < UP_CHUNK ? bytes - off : UP_CHUNK;
		if (off + UP_AHEAD < bytes)
			read_ahead(s + off + UP_AHEAD, UP_CHUNK);
		uint8_t *st = u->stage[u->cur];
		par_copy(st, s + off, n);
		/* the previous chunk's DMA (from the other buffer) is done: this
		 * buffer was handed to the DMA two chunks ago and is free again
		 * after the one below completes */
		enum status r = kern_mem_sync(&u->w->mem, e);
		if (!r)
			r = kern_mem_upload(&u->w->mem, (char *)dst + off, st, n, e);
		if (r)
			return r;
		u->cur ^= 1;
	}
	return ST_OK;
}

/* *pp (host, bytes long) -> its place in the device arena; *pp then points
 * there. Pass 1 only adds up the sizes. */
static enum status put(struct up *u, const void **pp, size_t bytes, struct err *e)
{
	if (!*pp || !bytes)
		return ST_OK;
	size_t need = (bytes + UP_ALIGN - 1) & ~(size_t)(UP_ALIGN - 1);
	if (u->dry) {
		u->bytes += need;
		return ST_OK;
	}
	if (u->bytes + need > u->total)
		return err_set(e, ST_INVALID, "weights: internal: the upload outgrew its arena (%llu bytes)",
			       (unsigned long long)u->total);
	void *d = u->arena + u->bytes;
	enum status st = stream_copy(u, d, *pp, bytes, e);
	if (st)
		return st;
	*pp = d;
	u->bytes += need;
	progress(u);
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
	if (!u->dry) {
		free(m->owned);
		m->owned = NULL;
	}
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
		if (!u->dry)
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
		if (!u->dry)
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
		if (!u->dry) {
			x->w1_dev = (struct kern_wmat *)arr;
			x->w3_dev = x->w1_dev + E;
			x->w2_dev = x->w3_dev + E;
		}
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

/* Every device tensor of w, in one order for both passes. */
static enum status walk(struct up *u, struct err *e)
{
	struct model_weights *w = u->w;
	const struct model_config *c = w->cfg;
	int64_t D = c->hidden_size, n = c->hc_mult;
	enum status st;
	PUT(u, w->embed, (size_t)(w->vocab_local * D) * sizeof(uint16_t));
	PUT(u, w->norm, (size_t)D * sizeof(uint16_t));
	if ((st = put_hc(u, &w->hc_head, n, n * D, 1, e)) || (st = put_wmat(u, &w->head.w, e)))
		return st;
	for (int l = 0; l < w->n_layers + w->n_mtp; l++)
		if ((st = put_layer(u, &w->layers[l], e)))
			return err_prefix(e, "upload of layer %d", l);
	return ST_OK;
}

enum status model_weights_upload(struct model_weights *w, const struct kern_mem *mem, struct err *e)
{
	if (!mem->device || w->on_device)
		return ST_OK;
	struct up u = {.w = w, .dry = true};
	enum status st = walk(&u, e); /* sizes only: nothing changes */
	if (st)
		return st;
	/* from here on the weights free through mem, and omega / tid2eid are
	 * treated as device pointers (put_layer frees their host copies) */
	w->mem = *mem;
	w->on_device = true;
	u.total = u.bytes;
	u.bytes = 0;
	u.dry = false;
	void *arena = NULL;
	if ((st = kern_mem_alloc(mem, u.total, &arena, e)))
		return err_prefix(e, "weights: %.2f GiB on the device", (double)u.total / (1u << 30));
	if ((st = keep(w, arena, e))) {
		kern_mem_free(mem, arena);
		return st;
	}
	u.arena = arena;
	for (int i = 0; i < 2; i++)
		if ((st = kern_mem_host_alloc(mem, UP_CHUNK, (void **)&u.stage[i], e)))
			goto out;
	u.t0 = u.t_log = time_mono_s();
	if ((st = walk(&u, e)) || (st = kern_mem_sync(mem, e)))
		goto out;
	/* host copies the loader made (misaligned tensors, column shards) are on the device now */
	for (int i = 0; i < w->n_owned; i++)
		free(w->owned[i]);
	w->n_owned = 0;
	w->device_bytes = u.bytes;
	double dt = time_mono_s() - u.t0;
	log_msg(LOG_INFO, "model", "weights on the device: %.2f GiB in %.1f s (%.2f GB/s)",
		(double)u.bytes / (1u << 30), dt, dt > 0 ? (double)u.bytes / dt / 1e9 : 0.0);
out:
	if (st) { /* a DMA may still read a staging buffer */
		struct err e2 = {0};
		if (kern_mem_sync(mem, &e2))
			log_msg(LOG_WARN, "model", "weights: after a failed upload: %s", e2.msg);
	}
	for (int i = 0; i < 2; i++)
		kern_mem_host_free(mem, u.stage[i]);
	return st;
}
