/*
 * scheduler/stop.c: the hold-back matcher for stop strings (see stop.h).
 * Work per token is O(pending * n_stops * max_len), with pending bounded by the
 * longest stop string plus one token.
 */
#include "stop.h"

#include <stdlib.h>
#include <string.h>

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

/* Bytes at the end of s[0:n] that start a UTF-8 character not yet complete. */
static uint32_t utf8_incomplete_tail(const char *s, uint32_t n)
{
	for (uint32_t back = 1; back <= 3 && back <= n; back++) {
		unsigned char c = (unsigned char)s[n - back];
		if ((c & 0xC0) == 0x80)
			continue; /* continuation byte: keep looking for the lead */
		uint32_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
		return need > back ? back : 0;
	}
	return 0;
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
	if (!append(&m->pending, &m->n_pending, &m->cap, bytes, n)) {
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
		/* Never release half a character, whatever the stop strings look like. */
		hold += utf8_incomplete_tail(m->pending, m->n_pending - hold);
	}
	release(m, m->n_pending - hold, out, out_n, nomem);
	return -1;
}

void sched_stop_fini(struct sched_stop *m)
{
	free(m->pending);
	memset(m, 0, sizeof(*m));
}
