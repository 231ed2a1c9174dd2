/*
 * model/detok.c: incremental detokenization with model_utf8_classify().
 *
 * The state is at most 3 held bytes: a proper prefix of a well-formed
 * character. Each feed classifies held||new bytes left to right, exactly as
 * the full decode's lossy pass does; since the maximal-subpart rule decides
 * each position from the bytes after it only up to the character's length,
 * holding a valid prefix and deciding once more bytes come gives the same
 * replacement as deciding on the whole string.
 *
 * This is the one UTF-8 hold-back of the tree: the scheduler feeds it the
 * bytes of each sampled token (model_detok_feed_bytes, pieces from
 * model_detok_piece) before matching stop strings, so every event's text,
 * and everything the server builds from it, is whole characters.
 */
#include <stdlib.h>
#include <string.h>

#include "detok.h"

struct model_detok {
	const struct model_tokenizer *tok;
	unsigned flags;
	uint8_t held[4];
	size_t n_held;
	char *out;
	size_t out_cap;
	uint8_t *work;
	size_t work_cap;
};

enum status model_detok_create(struct model_detok **out, const struct model_detok_options *opt,
			       struct err *e)
{
	*out = NULL;
	if (!opt)
		return err_set(e, ST_INVALID, "detok: no options");
	struct model_detok *d = calloc(1, sizeof *d);
	if (!d)
		return err_set(e, ST_NOMEM, "detok: out of memory");
	d->tok = opt->tok;
	d->flags = opt->flags;
	*out = d;
	return ST_OK;
}

void model_detok_destroy(struct model_detok *d)
{
	if (!d)
		return;
	free(d->out);
	free(d->work);
	free(d);
}

void model_detok_reset(struct model_detok *d) { d->n_held = 0; }

size_t model_detok_pending_bytes(const struct model_detok *d) { return d->n_held; }

static bool reserve(void **p, size_t *cap, size_t need)
{
	if (need <= *cap)
		return true;
	size_t c = *cap ? *cap : 256;
	while (c < need)
		c *= 2;
	void *q = realloc(*p, c);
	if (!q)
		return false;
	*p = q;
	*cap = c;
	return true;
}

static void emit_invalid(struct model_detok *d, const uint8_t *s, size_t l, size_t *w)
{
	if (d->flags & MODEL_TOK_DECODE_RAW) {
		memcpy(d->out + *w, s, l);
		*w += l;
	} else {
		memcpy(d->out + *w, "\xEF\xBF\xBD", 3);
		*w += 3;
	}
}

/* The hold-back over d->work[0:m] (held bytes first): complete characters
 * to *delta, a trailing proper prefix back into d->held. */
static void release(struct model_detok *d, size_t m, const char **delta, size_t *delta_len)
{
	size_t w = 0, i = 0;
	d->n_held = 0;
	while (i < m) {
		if (d->work[i] < 0x80) {
			d->out[w++] = (char)d->work[i++];
			continue;
		}
		size_t l;
		int c = model_utf8_classify(d->work + i, m - i, &l);
		if (c < 0) {
			memcpy(d->held, d->work + i, l); /* l <= 3: a proper prefix */
			d->n_held = l;
			break;
		}
		if (c == 1) {
			memcpy(d->out + w, d->work + i, l);
			w += l;
		} else {
			emit_invalid(d, d->work + i, l, &w);
		}
		i += l;
	}
	d->out[w] = 0;
	*delta = d->out;
	*delta_len = w;
}

static enum status reserve_for(struct model_detok *d, size_t total, struct err *e)
{
	if (!reserve((void **)&d->work, &d->work_cap, total + 1) ||
	    !reserve((void **)&d->out, &d->out_cap, 3 * total + 1))
		return err_set(e, ST_NOMEM, "detok: out of memory (%zu bytes)", total);
	return ST_OK;
}

enum status model_detok_feed(struct model_detok *d, const int32_t *ids, size_t n,
			     const char **delta, size_t *delta_len, struct err *e)
{
	*delta = "";
	*delta_len = 0;
	if (!d->tok)
		return err_set(e, ST_INVALID, "detok: feeding ids needs a tokenizer");
	size_t total = d->n_held;
	for (size_t i = 0; i < n; i++) {
		size_t l;
		if (!model_tokenizer_piece(d->tok, ids[i], &l))
			return err_set(e, ST_INVALID, "detok: id %d is not a token", ids[i]);
		if ((d->flags & MODEL_TOK_DECODE_SKIP_SPECIAL) && model_tokenizer_is_special(d->tok, ids[i]))
			continue;
		total += l;
	}
	if (reserve_for(d, total, e))
		return ST_NOMEM;
	memcpy(d->work, d->held, d->n_held);
	size_t m = d->n_held;
	for (size_t i = 0; i < n; i++) {
		if ((d->flags & MODEL_TOK_DECODE_SKIP_SPECIAL) && model_tokenizer_is_special(d->tok, ids[i]))
			continue;
		size_t l;
		const char *p = model_tokenizer_piece(d->tok, ids[i], &l);
		memcpy(d->work + m, p, l);
		m += l;
	}
	release(d, m, delta, delta_len);
	return ST_OK;
}

enum status model_detok_feed_bytes(struct model_detok *d, const char *bytes, size_t n, const char **delta,
				   size_t *delta_len, struct err *e)
{
	*delta = "";
	*delta_len = 0;
	if (reserve_for(d, d->n_held + n, e))
		return ST_NOMEM;
	memcpy(d->work, d->held, d->n_held);
	if (n)
		memcpy(d->work + d->n_held, bytes, n);
	release(d, d->n_held + n, delta, delta_len);
	return ST_OK;
}

uint32_t model_detok_piece(void *ctx, int32_t token_id, bool keep_special, char *buf, uint32_t cap)
{
	const struct model_tokenizer *tok = ctx;
	if (!keep_special && model_tokenizer_is_special(tok, token_id))
		return 0;
	size_t n = 0;
	const char *p = model_tokenizer_piece(tok, token_id, &n);
	if (!p)
		return 0;
	if (n > cap)
		n = cap;
	memcpy(buf, p, n);
	return (uint32_t)n;
}

enum status model_detok_flush(struct model_detok *d, const char **delta, size_t *delta_len,
			      struct err *e)
{
	*delta = "";
	*delta_len = 0;
	if (!reserve((void **)&d->out, &d->out_cap, 8))
		return err_set(e, ST_NOMEM, "detok: out of memory");
	size_t w = 0;
	if (d->n_held)
		emit_invalid(d, d->held, d->n_held, &w);
	d->n_held = 0;
	d->out[w] = 0;
	*delta = d->out;
	*delta_len = w;
	return ST_OK;
}
