/*
 * server/responses_store.c: the bounded store of Responses API answers
 * (responses_store.h): a hash table of entries by id, threaded on a list
 * in insertion order so that eviction takes the oldest first.
 */
#include "responses_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define RS_BUCKETS 4096

struct rs_entry {
	struct rs_entry *hnext;        /* bucket chain */
	struct rs_entry *older, *newer; /* insertion order */
	char *id, *resp, *hist;
	size_t resp_len, hist_len, bytes;
};

struct resp_store {
	pthread_mutex_t mu;
	size_t max_bytes, bytes;
	uint32_t count;
	struct rs_entry *oldest, *newest;
	struct rs_entry *buckets[RS_BUCKETS];
};

static size_t hash_id(const char *id)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *id; id++)
		h = (h ^ (unsigned char)*id) * 0x100000001b3ull;
	return (size_t)(h % RS_BUCKETS);
}

enum status resp_store_create(struct resp_store **out, size_t max_bytes, struct err *e)
{
	*out = calloc(1, sizeof **out);
	if (!*out)
		return err_set(e, ST_NOMEM, "responses store: out of memory");
	(*out)->max_bytes = max_bytes;
	pthread_mutex_init(&(*out)->mu, NULL);
	return ST_OK;
}

static void entry_free(struct rs_entry *x)
{
	free(x->id);
	free(x->resp);
	free(x->hist);
	free(x);
}

/* Under mu: unlink x from its bucket and the order list, and free it. */
static void remove_entry(struct resp_store *s, struct rs_entry *x)
{
	struct rs_entry **pp = &s->buckets[hash_id(x->id)];
	while (*pp != x)
		pp = &(*pp)->hnext;
	*pp = x->hnext;
	if (x->older)
		x->older->newer = x->newer;
	else
		s->oldest = x->newer;
	if (x->newer)
		x->newer->older = x->older;
	else
		s->newest = x->older;
	s->bytes -= x->bytes;
	s->count--;
	entry_free(x);
}

static struct rs_entry *find(struct resp_store *s, const char *id)
{
	for (struct rs_entry *x = s->buckets[hash_id(id)]; x; x = x->hnext)
		if (!strcmp(x->id, id))
			return x;
	return NULL;
}

void resp_store_destroy(struct resp_store *s)
{
	if (!s)
		return;
	while (s->oldest)
		remove_entry(s, s->oldest);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

static char *dup_n(const char *p, size_t n)
{
	char *d = malloc(n + 1);
	if (d) {
		memcpy(d, p, n);
		d[n] = '\0';
	}
	return d;
}

enum status resp_store_put(struct resp_store *s, const char *id, const char *response_json, size_t response_len,
			   const char *history_json, size_t history_len)
{
	size_t bytes = strlen(id) + response_len + history_len;
	if (bytes > s->max_bytes)
		return ST_INVALID;
	struct rs_entry *x = calloc(1, sizeof *x);
	if (!x)
		return ST_NOMEM;
	x->id = strdup(id);
	x->resp = dup_n(response_json, response_len);
	x->hist = dup_n(history_json, history_len);
	if (!x->id || !x->resp || !x->hist) {
		entry_free(x);
		return ST_NOMEM;
	}
	x->resp_len = response_len;
	x->hist_len = history_len;
	x->bytes = bytes;
	pthread_mutex_lock(&s->mu);
	struct rs_entry *old = find(s, id);
	if (old)
		remove_entry(s, old);
	while (s->oldest && s->bytes + bytes > s->max_bytes)
		remove_entry(s, s->oldest);
	size_t b = hash_id(id);
	x->hnext = s->buckets[b];
	s->buckets[b] = x;
	x->older = s->newest;
	if (s->newest)
		s->newest->newer = x;
	else
		s->oldest = x;
	s->newest = x;
	s->bytes += bytes;
	s->count++;
	pthread_mutex_unlock(&s->mu);
	return ST_OK;
}

enum status resp_store_get(struct resp_store *s, const char *id, char **response_json, size_t *response_len,
			   char **history_json, size_t *history_len)
{
	enum status st = ST_OK;
	if (response_json)
		*response_json = NULL;
	if (history_json)
		*history_json = NULL;
	pthread_mutex_lock(&s->mu);
	struct rs_entry *x = find(s, id);
	if (!x) {
		st = ST_NOTFOUND;
	} else {
		if (response_json && !(*response_json = dup_n(x->resp, x->resp_len)))
			st = ST_NOMEM;
		if (response_len)
			*response_len = x->resp_len;
		if (history_json && !(*history_json = dup_n(x->hist, x->hist_len)))
			st = ST_NOMEM;
		if (history_len)
			*history_len = x->hist_len;
	}
	pthread_mutex_unlock(&s->mu);
	if (st && response_json) {
		free(*response_json);
		*response_json = NULL;
	}
	if (st && history_json) {
		free(*history_json);
		*history_json = NULL;
	}
	return st;
}

bool resp_store_delete(struct resp_store *s, const char *id)
{
	pthread_mutex_lock(&s->mu);
	struct rs_entry *x = find(s, id);
	if (x)
		remove_entry(s, x);
	pthread_mutex_unlock(&s->mu);
	return x != NULL;
}

size_t resp_store_bytes(struct resp_store *s)
{
	pthread_mutex_lock(&s->mu);
	size_t n = s->bytes;
	pthread_mutex_unlock(&s->mu);
	return n;
}

uint32_t resp_store_count(struct resp_store *s)
{
	pthread_mutex_lock(&s->mu);
	uint32_t n = s->count;
	pthread_mutex_unlock(&s->mu);
	return n;
}
