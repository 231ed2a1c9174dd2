/*
 * scheduler/stop.c: the hold-back matcher for stop strings (see stop.h).
 * Work per token is O(pending * n_stops * max_len), with pending bounded by the
 * longest stop string plus one token.
 */
#include "stop.h"

#include <stdlib.h>
#include <string.h>

#include "model/detok.h"

static bool append(char **buf, uint32_t *n, uint32_t *cap, const char *src, uint32_t k)
{
	if (!k)
		return true;
	if (*n + k + 1 > *cap) {
		uint32_t c = *cap ? *cap : 64;
		while (c < *n + k + 1)
			c *= 2;
		char *p = realloc(*buf, c);
		if (!p)
			return false;
		*buf = p;
		*cap = c;
	}
	memcpy(*buf + *n, src, k);
	*n += k;
	(*buf)[*n] = 0;
	return true;
}

static void release(struct sched_stop *m, uint32_t k, char **out, uint32_t *out_n, bool *nomem)
{
	char *buf = *out;
	uint32_t n = *out_n;
	if (k) {
		char *p = realloc(buf, (size_t)n + k + 1);
		if (!p) {
			*nomem = true;
			return;
		}
		buf = p;
		memcpy(buf + n, m->pending, k);
		n += k;
		buf[n] = 0;
	}
	*out = buf;
	*out_n = n;
	if (m->n_pending > k)
		memmove(m->pending, m->pending + k, m->n_pending - k);
	m->n_pending -= k;
}

int32_t sched_stop_feed(struct sched_stop *m, const struct sched_stop_set *set, const char *bytes, uint32_t n,
			bool final, char **out, uint32_t *out_n, bool *nomem)
{
	struct err e = {0};
	const struct model_detok_options dopt = {.tok = NULL, .flags = MODEL_TOK_DECODE_RAW};
	if (!m->detok && model_detok_create(&m->detok, &dopt, &e)) {
		*nomem = true;
		return -1;
	}
	const char *text, *tail = "";
	size_t n_text, n_tail = 0;
	if (model_detok_feed_bytes(m->detok, bytes, n, &text, &n_text, &e) ||
	    !append(&m->pending, &m->n_pending, &m->cap, text, (uint32_t)n_text) ||
	    (final && model_detok_flush(m->detok, &tail, &n_tail, &e)) ||
	    !append(&m->pending, &m->n_pending, &m->cap, tail, (uint32_t)n_tail)) {
		*nomem = true;
		return -1;
	}
	/* Earliest match wins; on equal starts, the lower index. */
	int32_t hit = -1;
	uint32_t hit_pos = UINT32_MAX;
	for (uint32_t i = 0; set && i < set->n; i++) {
		uint32_t L = set->lens[i];
		if (L > m->n_pending)
			continue;
		const char *p = memmem(m->pending, m->n_pending, set->strs[i], L);
		if (p && (uint32_t)(p - m->pending) < hit_pos) {
			hit_pos = (uint32_t)(p - m->pending);
			hit = (int32_t)i;
		}
	}
	if (hit >= 0) {
		release(m, hit_pos, out, out_n, nomem);
		m->n_pending = 0;
		return hit;
	}
	uint32_t hold = 0;
	if (!final) {
		for (uint32_t i = 0; set && i < set->n; i++) {
			uint32_t L = set->lens[i];
			uint32_t kmax = L - 1 < m->n_pending ? L - 1 : m->n_pending;
			for (uint32_t k = kmax; k > hold; k--)
				if (!memcmp(m->pending + m->n_pending - k, set->strs[i], k)) {
					hold = k;
					break;
				}
		}
	}
	release(m, m->n_pending - hold, out, out_n, nomem);
	return -1;
}

void sched_stop_fini(struct sched_stop *m)
{
	model_detok_destroy(m->detok);
	free(m->pending);
	memset(m, 0, sizeof(*m));
}
