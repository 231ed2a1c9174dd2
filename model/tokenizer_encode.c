/*
 * model/tokenizer_encode.c: text -> ids, the hot path.
 *
 * The pipeline mirrors HF tokenizers' encode() step by step so that ids agree:
 *   sanitize      invalid UTF-8 -> U+FFFD (maximal subparts), see tokenizer.h;
 *   added tokens  leftmost-longest over the normalized=false tokens, then over
 *                 the normalized=true ones in the gaps (HF's two passes; with
 *                 MODEL_TOK_ADDED_NON_SPECIAL a special match is kept as text
 *                 and the scan resumes after it, as HF's `continue` does);
 *   pre-tokenize  each Split step runs its regex on each piece of the previous
 *                 step separately (lookahead never sees past a piece), then
 *                 applies its behaviour; empty pieces vanish;
 *   BPE           on the piece's raw bytes: a binary heap of candidate merges
 *                 ordered by (rank, position), stale entries skipped, exactly
 *                 HF's Word::merge_all; results of short pieces are cached.
 * All scratch lives in a per-call struct enc, so concurrent calls share only
 * read-only tables and the mutex-guarded cache.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "tokenizer_internal.h"

/* Largest JIT stack one encode may grow to: an 8 MB request body of one
 * repeated letter needs a few hundred MB of it in the DeepSeek pre-tokenizer;
 * the next step up is refused as an error instead. */
#define TOK_JIT_STACK_MAX_BYTES ((size_t)1 << 30)

struct span {
	size_t start, end; /* byte offsets into enc.text */
	bool match;
};

struct spans {
	struct span *v;
	size_t n, cap;
};

struct sym {
	int32_t id;
	int32_t prev, next; /* indices, -1 at the ends */
	bool alive;
};

struct heap_ent {
	uint32_t rank;
	uint32_t pos;
	int32_t new_id;
};

struct enc {
	const struct model_tokenizer *tok;
	const char *text;
	enum model_tok_added added;
	/* output */
	int32_t *ids;
	size_t cap, n;
	bool growable;
	/* regex */
	pcre2_match_data *md;
	pcre2_match_context *mctx;
	pcre2_jit_stack *jit_stack;
	size_t jit_stack_bytes; /* its maximum; 0 = none yet */
	bool limits_lifted;     /* match / depth / heap limits set to the maximum */
	/* scratch: starts in the inline arrays below (no malloc for short text) */
	struct spans spans[TOK_MAX_STEPS];
	struct sym *syms;
	size_t syms_cap;
	struct heap_ent *heap;
	size_t heap_cap;
	enum status st;
	struct err *e;
	/* Last, and left uninitialised by enc_init (8 kB of memset per call saved). */
	struct span span_inline[TOK_MAX_STEPS][32];
	struct sym sym_inline[64];
	struct heap_ent heap_inline[128];
};

static void enc_init(struct enc *x, int32_t *ids, size_t cap, bool growable)
{
	memset(x, 0, offsetof(struct enc, span_inline));
	x->ids = ids;
	x->cap = ids ? cap : 0;
	x->growable = growable;
}

static void out_push(struct enc *x, int32_t id)
{
	if (x->n >= x->cap && x->growable && x->st == ST_OK) {
		size_t cap = x->cap ? 2 * x->cap : 64;
		int32_t *p = realloc(x->ids, cap * sizeof *p);
		if (!p) {
			x->st = err_set(x->e, ST_NOMEM, "encode: out of memory (%zu ids)", cap);
			return;
		}
		x->ids = p;
		x->cap = cap;
	}
	if (x->n < x->cap)
		x->ids[x->n] = id;
	x->n++;
}

/* Grow *p (which may still be the inline array `inl`) to hold need elements. */
static bool grow(void **p, size_t *cap, size_t need, size_t elem, void *inl)
{
	if (need <= *cap)
		return true;
	size_t c = *cap ? *cap : 64;
	while (c < need)
		c *= 2;
	void *q = *p == inl ? malloc(c * elem) : realloc(*p, c * elem);
	if (!q)
		return false;
	if (*p == inl)
		memcpy(q, inl, *cap * elem);
	*p = q;
	*cap = c;
	return true;
}

/* ---- the word cache ---- */

static uint32_t cache_hash(const char *s, size_t n)
{
	uint32_t h = (uint32_t)(tok__hash_bytes(s, n) >> 32);
	return h ? h : 1;
}

/* On a hit, pushes the cached ids and returns true. */
static bool cache_get(struct enc *x, const char *s, size_t n, uint32_t h)
{
	struct tok__cache_shard *sh = &x->tok->cache[h % TOK_CACHE_SHARDS];
	bool hit = false;
	pthread_mutex_lock(&sh->mu);
	for (size_t i = (h / TOK_CACHE_SHARDS) & (TOK_CACHE_SLOTS - 1);;
	     i = (i + 1) & (TOK_CACHE_SLOTS - 1)) {
		const struct tok__cache_slot *sl = &sh->slots[i];
		if (sl->hash == 0)
			break;
		if (sl->hash == h && sl->key_len == n && memcmp(sh->arena + sl->off, s, n) == 0) {
			const uint8_t *p = sh->arena + sl->off + ((n + 3) & ~(size_t)3);
			for (uint16_t k = 0; k < sl->n_ids; k++) {
				int32_t id;
				memcpy(&id, p + 4 * k, 4);
				out_push(x, id);
			}
			hit = true;
			break;
		}
	}
	pthread_mutex_unlock(&sh->mu);
	return hit;
}

static void cache_put(struct enc *x, const char *s, size_t n, uint32_t h, const int32_t *ids,
		      size_t n_ids)
{
	struct tok__cache_shard *sh = &x->tok->cache[h % TOK_CACHE_SHARDS];
	size_t need = ((n + 3) & ~(size_t)3) + 4 * n_ids;
	pthread_mutex_lock(&sh->mu);
	if (sh->n_used >= TOK_CACHE_SLOTS * 3 / 4 || sh->arena_used + need > TOK_CACHE_ARENA_BYTES) {
		/* Full: start this shard afresh (cheap, and keeps hot words coming back). */
		memset(sh->slots, 0, sizeof sh->slots);
		sh->n_used = 0;
		sh->arena_used = 0;
	}
	size_t i = (h / TOK_CACHE_SHARDS) & (TOK_CACHE_SLOTS - 1);
	while (sh->slots[i].hash != 0) {
		const struct tok__cache_slot *sl = &sh->slots[i];
		if (sl->hash == h && sl->key_len == n && memcmp(sh->arena + sl->off, s, n) == 0)
			goto out; /* another thread got here first */
		i = (i + 1) & (TOK_CACHE_SLOTS - 1);
	}
	sh->slots[i] = (struct tok__cache_slot){.hash = h, .off = sh->arena_used,
						.key_len = (uint16_t)n, .n_ids = (uint16_t)n_ids};
	memcpy(sh->arena + sh->arena_used, s, n);
	memcpy(sh->arena + sh->arena_used + ((n + 3) & ~(size_t)3), ids, 4 * n_ids);
	sh->arena_used += (uint32_t)need;
	sh->n_used++;
out:
	pthread_mutex_unlock(&sh->mu);
}

/* ---- BPE on one piece ---- */

static bool heap_less(const struct heap_ent *a, const struct heap_ent *b)
{
	return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent v)
{
	size_t i = (*n)++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!heap_less(&v, &h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = v;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
	struct heap_ent top = h[0], last = h[--(*n)];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && heap_less(&h[c + 1], &h[c]))
			c++;
		if (!heap_less(&h[c], &last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = last;
	return top;
}

static void bpe(struct enc *x, size_t start, size_t end)
{
	const struct model_tokenizer *tok = x->tok;
	const char *s = x->text + start;
	size_t n = end - start;
	if (n == 1) {
		out_push(x, tok->byte_id[(uint8_t)s[0]]);
		return;
	}
	uint32_t h = 0;
	bool cacheable = tok->cache && n <= TOK_CACHE_MAX_WORD_BYTES;
	if (cacheable) {
		h = cache_hash(s, n);
		if (cache_get(x, s, n, h))
			return;
	}
	if (!grow((void **)&x->syms, &x->syms_cap, n, sizeof *x->syms, x->sym_inline) ||
	    !grow((void **)&x->heap, &x->heap_cap, 2 * n, sizeof *x->heap, x->heap_inline)) {
		x->st = err_set(x->e, ST_NOMEM, "encode: out of memory (piece of %zu bytes)", n);
		return;
	}
	struct sym *sy = x->syms;
	struct heap_ent *hp = x->heap;
	size_t nh = 0;
	for (size_t i = 0; i < n; i++) {
		sy[i] = (struct sym){.id = tok->byte_id[(uint8_t)s[i]], .prev = (int32_t)i - 1,
				     .next = i + 1 < n ? (int32_t)i + 1 : -1, .alive = true};
		if (i > 0) {
			const struct tok__merge *m = tok__merge_find(tok, sy[i - 1].id, sy[i].id);
			if (m)
				heap_push(hp, &nh, (struct heap_ent){m->rank, (uint32_t)i - 1, m->new_id});
		}
	}
	/* The heap starts with at most n - 1 entries, and each merge pops one and
	 * pushes at most two, over at most n - 1 merges: it never exceeds 2n - 2. */
	while (nh > 0) {
		struct heap_ent top = heap_pop(hp, &nh);
		struct sym *a = &sy[top.pos];
		if (!a->alive || a->next < 0)
			continue;
		struct sym *b = &sy[a->next];
		const struct tok__merge *m = tok__merge_find(tok, a->id, b->id);
		if (!m || m->new_id != top.new_id)
			continue; /* stale: one side has changed since */
		a->id = top.new_id;
		b->alive = false;
		a->next = b->next;
		if (b->next >= 0)
			sy[b->next].prev = (int32_t)top.pos;
		if (a->prev >= 0) {
			const struct tok__merge *pm = tok__merge_find(tok, sy[a->prev].id, a->id);
			if (pm)
				heap_push(hp, &nh, (struct heap_ent){pm->rank, (uint32_t)a->prev, pm->new_id});
		}
		if (a->next >= 0) {
			const struct tok__merge *nm = tok__merge_find(tok, a->id, sy[a->next].id);
			if (nm)
				heap_push(hp, &nh, (struct heap_ent){nm->rank, top.pos, nm->new_id});
		}
	}
	int32_t tmp[TOK_CACHE_MAX_WORD_BYTES];
	size_t nt = 0;
	for (int32_t i = 0; i >= 0; i = sy[i].next) {
		out_push(x, sy[i].id);
		if (cacheable)
			tmp[nt++] = sy[i].id;
	}
	if (cacheable)
		cache_put(x, s, n, h, tmp, nt);
}

/* ---- pre-tokenizer ---- */

static void pretok(struct enc *x, int depth, size_t start, size_t end);

static bool spans_add(struct enc *x, struct spans *sp, size_t s, size_t e, bool match)
{
	if (!grow((void **)&sp->v, &sp->cap, sp->n + 1, sizeof *sp->v,
		  x->span_inline[sp - x->spans])) {
		x->st = err_set(x->e, ST_NOMEM, "encode: out of memory (pieces)");
		return false;
	}
	sp->v[sp->n++] = (struct span){s, e, match};
	return true;
}

/* The regex's matches over [start, end) as HF's find_matches gives them:
 * matches and the gaps between them, covering the piece. */
static bool find_matches(struct enc *x, const struct tok__step *st, size_t start, size_t end,
			 struct spans *sp)
{
	sp->n = 0;
	PCRE2_SPTR subj = (PCRE2_SPTR)(x->text + start);
	size_t len = end - start, prev = 0, from = 0;
	while (from <= len) {
		/* The text is valid UTF-8 (sanitized), so the JIT entry needs no checks. */
		int rc = st->jit ? pcre2_jit_match(st->re, subj, len, from, 0, x->md, x->mctx)
				 : pcre2_match(st->re, subj, len, from, PCRE2_NO_UTF_CHECK, x->md, x->mctx);
		/* A long run (700,000 letters, a million CJK characters, 20 MB of
		 * spaces) is one pre-token whose match needs a deep JIT stack and
		 * many match steps: grow the stack (x4 up to TOK_JIT_STACK_MAX_BYTES,
		 * memory is touched only as used) and lift the match limits, so that
		 * any input the server accepts encodes, with the same ids. */
		if ((rc == PCRE2_ERROR_JIT_STACKLIMIT && x->jit_stack_bytes < TOK_JIT_STACK_MAX_BYTES) ||
		    ((rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT) &&
		     !x->limits_lifted)) {
			if (!x->mctx && !(x->mctx = pcre2_match_context_create(NULL))) {
				x->st = err_set(x->e, ST_NOMEM, "encode: out of memory (match context)");
				return false;
			}
			if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
				x->jit_stack_bytes = x->jit_stack_bytes ? x->jit_stack_bytes * 4 : 16u << 20;
				if (x->jit_stack)
					pcre2_jit_stack_free(x->jit_stack);
				x->jit_stack = pcre2_jit_stack_create(64 * 1024, x->jit_stack_bytes, NULL);
				if (!x->jit_stack) {
					x->st = err_set(x->e, ST_NOMEM, "encode: out of memory (jit stack of %zu MB)",
							x->jit_stack_bytes >> 20);
					return false;
				}
				pcre2_jit_stack_assign(x->mctx, NULL, x->jit_stack);
			} else {
				pcre2_set_match_limit(x->mctx, UINT32_MAX);
				pcre2_set_depth_limit(x->mctx, UINT32_MAX);
				pcre2_set_heap_limit(x->mctx, UINT32_MAX);
				x->limits_lifted = true;
			}
			continue;
		}
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0) {
			PCRE2_UCHAR msg[120];
			pcre2_get_error_message(rc, msg, sizeof msg);
			x->st = err_set(x->e, ST_INVALID, "encode: regex match failed: %s",
					(const char *)msg);
			return false;
		}
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(x->md);
		size_t ms = ov[0], me = ov[1];
		if (prev != ms && !spans_add(x, sp, start + prev, start + ms, false))
			return false;
		if (!spans_add(x, sp, start + ms, start + me, true))
			return false;
		prev = me;
		if (me > ms) {
			from = me;
		} else {
			/* Empty match: step over one character. */
			from = me + 1;
			while (from < len && (subj[from] & 0xC0) == 0x80)
				from++;
		}
	}
	if (prev != len && !spans_add(x, sp, start + prev, end, false))
		return false;
	return true;
}

/* HF's SplitDelimiterBehavior folds, in place; marks removed spans by
 * start > end. */
static void apply_behavior(struct spans *sp, enum tok__behavior b)
{
	size_t n = 0;
	bool prev_match = false;
	switch (b) {
	case TOK_SPLIT_ISOLATED:
		return;
	case TOK_SPLIT_REMOVED:
		for (size_t i = 0; i < sp->n; i++)
			if (!sp->v[i].match)
				sp->v[n++] = sp->v[i];
		sp->n = n;
		return;
	case TOK_SPLIT_CONTIGUOUS:
	case TOK_SPLIT_MERGED_WITH_PREVIOUS:
		for (size_t i = 0; i < sp->n; i++) {
			struct span s = sp->v[i];
			bool join = b == TOK_SPLIT_CONTIGUOUS ? s.match == prev_match
							      : (s.match && !prev_match);
			if (join && n > 0)
				sp->v[n - 1].end = s.end;
			else
				sp->v[n++] = s;
			prev_match = s.match;
		}
		sp->n = n;
		return;
	case TOK_SPLIT_MERGED_WITH_NEXT: {
		/* Right to left, then the kept spans are in reverse at the end. */
		size_t w = sp->n;
		for (size_t i = sp->n; i-- > 0;) {
			struct span s = sp->v[i];
			if (s.match && !prev_match && w < sp->n)
				sp->v[w].start = s.start;
			else
				sp->v[--w] = s;
			prev_match = s.match;
		}
		memmove(sp->v, sp->v + w, (sp->n - w) * sizeof *sp->v);
		sp->n -= w;
		return;
	}
	}
}

static void pretok(struct enc *x, int depth, size_t start, size_t end)
{
	if (start >= end || x->st != ST_OK)
		return;
	const struct model_tokenizer *tok = x->tok;
	if (depth == tok->n_steps) {
		bpe(x, start, end);
		return;
	}
	const struct tok__step *st = &tok->steps[depth];
	struct spans *sp = &x->spans[depth];
	if (!find_matches(x, st, start, end, sp))
		return;
	if (st->invert)
		for (size_t i = 0; i < sp->n; i++)
			sp->v[i].match = !sp->v[i].match;
	apply_behavior(sp, st->behavior);
	/* sp may be reallocated by nothing below (deeper levels use their own). */
	for (size_t i = 0; i < sp->n && x->st == ST_OK; i++)
		pretok(x, depth + 1, sp->v[i].start, sp->v[i].end);
}

/* ---- added tokens ---- */

/* Longest added token of t starting at text[p..end): its index or -1. */
static int32_t trie_longest(const struct tok__trie *t, const char *text, size_t p, size_t end,
			    size_t *len)
{
	int32_t best = -1;
	uint32_t node = 0;
	for (size_t k = p; k < end; k++) {
		uint32_t c = t->nodes[node].first_child;
		while (c && t->nodes[c].byte != (uint8_t)text[k])
			c = t->nodes[c].next_sibling;
		if (!c)
			break;
		node = c;
		if (t->nodes[c].token >= 0) {
			best = t->nodes[c].token;
			*len = k + 1 - p;
		}
	}
	return best;
}

/* pass 0 splits on trie_raw and hands gaps to pass 1 (trie_norm), whose gaps
 * go to the pre-tokenizer. */
static void split_added(struct enc *x, int pass, size_t start, size_t end)
{
	const struct model_tokenizer *tok = x->tok;
	if (pass == 2 || x->added == MODEL_TOK_ADDED_NONE) {
		pretok(x, 0, start, end);
		return;
	}
	const struct tok__trie *t = pass == 0 ? &tok->trie_raw : &tok->trie_norm;
	if (t->n_nodes == 0) {
		split_added(x, pass + 1, start, end);
		return;
	}
	size_t seg = start, p = start;
	while (p < end && x->st == ST_OK) {
		if (!t->first_byte[(uint8_t)x->text[p]]) {
			p++;
			continue;
		}
		size_t len = 0;
		int32_t a = trie_longest(t, x->text, p, end, &len);
		if (a < 0) {
			p++;
			continue;
		}
		if (x->added == MODEL_TOK_ADDED_NON_SPECIAL && tok->added[a].special) {
			p += len; /* stays text; HF resumes after the match */
			continue;
		}
		split_added(x, pass + 1, seg, p);
		out_push(x, tok->added[a].id);
		p += len;
		seg = p;
	}
	split_added(x, pass + 1, seg, end);
}

/* ---- entry points ---- */

static enum status encode(const struct model_tokenizer *tok, const char *text, size_t len,
			  enum model_tok_added added, struct enc *x, struct err *e)
{
	x->tok = tok;
	x->added = added;
	x->e = e;
	x->st = ST_OK;
	for (int i = 0; i < TOK_MAX_STEPS; i++) {
		x->spans[i].v = x->span_inline[i];
		x->spans[i].cap = ARRAY_LEN(x->span_inline[i]);
	}
	x->syms = x->sym_inline;
	x->syms_cap = ARRAY_LEN(x->sym_inline);
	x->heap = x->heap_inline;
	x->heap_cap = ARRAY_LEN(x->heap_inline);
	char *clean = NULL;
	size_t valid = model_utf8_valid_prefix((const uint8_t *)text, len);
	if (valid < len) {
		/* Lossy copy: every maximal invalid subpart becomes U+FFFD. */
		clean = malloc(3 * len + 1);
		if (!clean)
			return err_set(e, ST_NOMEM, "encode: out of memory (%zu bytes)", len);
		memcpy(clean, text, valid);
		size_t w = valid;
		for (size_t i = valid; i < len;) {
			size_t l;
			if (model_utf8_classify((const uint8_t *)text + i, len - i, &l) == 1) {
				memcpy(clean + w, text + i, l);
				w += l;
			} else {
				memcpy(clean + w, "\xEF\xBF\xBD", 3);
				w += 3;
			}
			i += l;
		}
		text = clean;
		len = w;
	}
	x->text = text;
	x->md = pcre2_match_data_create(1, NULL);
	if (!x->md)
		x->st = err_set(e, ST_NOMEM, "encode: out of memory (match data)");
	else
		split_added(x, 0, 0, len);
	pcre2_match_data_free(x->md);
	pcre2_match_context_free(x->mctx);
	if (x->jit_stack)
		pcre2_jit_stack_free(x->jit_stack);
	for (int i = 0; i < TOK_MAX_STEPS; i++)
		if (x->spans[i].v != x->span_inline[i])
			free(x->spans[i].v);
	if (x->syms != x->sym_inline)
		free(x->syms);
	if (x->heap != x->heap_inline)
		free(x->heap);
	free(clean);
	return x->st;
}

enum status model_tokenizer_encode(const struct model_tokenizer *tok, const char *text, size_t len,
				   enum model_tok_added added, int32_t *ids, size_t cap,
				   size_t *n_ids, struct err *e)
{
	struct enc x;
	enc_init(&x, ids, cap, false);
	enum status st = encode(tok, text, len, added, &x, e);
	*n_ids = x.n;
	if (st == ST_OK && x.n > x.cap)
		st = err_set(e, ST_NOMEM, "encode: %zu ids do not fit in %zu", x.n, x.cap);
	return st;
}

enum status model_tokenizer_encode_alloc(const struct model_tokenizer *tok, const char *text,
					 size_t len, enum model_tok_added added, int32_t **ids,
					 size_t *n_ids, struct err *e)
{
	struct enc x;
	enc_init(&x, NULL, 0, true);
	enum status st = encode(tok, text, len, added, &x, e);
	if (st != ST_OK || x.n == 0) {
		free(x.ids);
		x.ids = NULL;
		if (st != ST_OK)
			x.n = 0;
	}
	*ids = x.ids;
	*n_ids = x.n;
	return st;
}
