/*
 * model/gram.c: the vocabulary byte trie and the grammar automaton (states,
 * token masks, advancing by tokens). The compiler that builds grammars from
 * JSON Schema and tool lists is gram_compile.c; the design is in gram.h.
 *
 * A state is a set of stacks. Frames live in an arena and are immutable;
 * a stack is its top frame's index and the chain of parents below it, so
 * alternatives share their common part. Every top is a terminal frame (or
 * GRAM__ACCEPT: the empty stack, the sentence is complete). The mask walk
 * allocates above an arena mark and truncates on the way back; accepting a
 * token compacts the arena to what the new tops reach.
 */
#include "model/gram_internal.h"

#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"

#define ACCEPT (UINT32_MAX - 1)
#define NONE UINT32_MAX
#define MAX_ARENA_FRAMES (1u << 21)
#define CLOSURE_BUDGET 20000
#define N_CACHE 16

/* ---------------- vocabulary ---------------- */

struct trie {
	uint32_t *first, *next, *tok_head; /* per node */
	uint8_t *byte;
	uint32_t n, cap;
};

/* Byte classes of the fast path: a token made only of its class's bytes
 * (and valid UTF-8, for strings) leaves a looping terminal where it was.
 * STR_X / RAW_EF: strings and raw text that must not contain "｜DSML｜"
 * (bytes EF BD 9C ...) inside a DSML block. */
enum { CLASS_STR = 0, CLASS_STR_X, CLASS_RAW, CLASS_RAW_EF, N_CLASSES };

struct gram_vocab {
	uint32_t n_tokens, mask_words;
	int32_t eos;
	uint32_t max_len;
	uint32_t *tok_next; /* tokens with the same bytes: [full | except STR | except RAW] */
	char *tok_bytes;    /* every allowed token's bytes, token i at tok_off[i] .. tok_off[i + 1] */
	uint32_t *tok_off;
	struct trie full, except[N_CLASSES];
	uint32_t *class_mask[N_CLASSES];
	uint8_t in_class[N_CLASSES][256];
};

static bool trie_grow(struct trie *t)
{
	uint32_t cap = t->cap ? t->cap * 2 : 4096;
	uint32_t *f = realloc(t->first, cap * sizeof *f);
	if (f)
		t->first = f;
	uint32_t *nx = realloc(t->next, cap * sizeof *nx);
	if (nx)
		t->next = nx;
	uint32_t *h = realloc(t->tok_head, cap * sizeof *h);
	if (h)
		t->tok_head = h;
	uint8_t *b = realloc(t->byte, cap);
	if (b)
		t->byte = b;
	if (!f || !nx || !h || !b)
		return false;
	t->cap = cap;
	return true;
}

static uint32_t trie_node(struct trie *t, uint8_t byte)
{
	if (t->n == t->cap && !trie_grow(t))
		return NONE;
	uint32_t i = t->n++;
	t->first[i] = t->next[i] = t->tok_head[i] = NONE;
	t->byte[i] = byte;
	return i;
}

static bool trie_insert(struct trie *t, const uint8_t *s, size_t len, uint32_t id, uint32_t *tok_next)
{
	if (t->n == 0 && trie_node(t, 0) == NONE)
		return false;
	uint32_t cur = 0;
	for (size_t i = 0; i < len; i++) {
		uint32_t c = t->first[cur], prev = NONE;
		while (c != NONE && t->byte[c] < s[i]) {
			prev = c;
			c = t->next[c];
		}
		if (c == NONE || t->byte[c] != s[i]) {
			uint32_t nn = trie_node(t, s[i]);
			if (nn == NONE)
				return false;
			t->next[nn] = c;
			if (prev == NONE)
				t->first[cur] = nn;
			else
				t->next[prev] = nn;
			c = nn;
		}
		cur = c;
	}
	tok_next[id] = t->tok_head[cur];
	t->tok_head[cur] = id;
	return true;
}

static void trie_free(struct trie *t)
{
	free(t->first);
	free(t->next);
	free(t->tok_head);
	free(t->byte);
}

void gram_vocab_destroy(struct gram_vocab *v)
{
	if (!v)
		return;
	trie_free(&v->full);
	for (int c = 0; c < N_CLASSES; c++) {
		trie_free(&v->except[c]);
		free(v->class_mask[c]);
	}
	free(v->tok_next);
	free(v->tok_bytes);
	free(v->tok_off);
	free(v);
}

enum status gram_vocab_create(struct gram_vocab **out, const struct gram_vocab_options *opt, struct err *e)
{
	*out = NULL;
	if (!opt->n_tokens || !opt->piece)
		return err_set(e, ST_INVALID, "gram vocab: no tokens");
	struct gram_vocab *v = calloc(1, sizeof *v);
	if (!v)
		return err_set(e, ST_NOMEM, "gram vocab");
	v->n_tokens = opt->n_tokens;
	v->mask_words = (opt->n_tokens + 31) / 32;
	v->eos = opt->eos_id;
	for (int b = 0; b < 256; b++) {
		v->in_class[CLASS_STR][b] = b >= 0x20 && b != '"' && b != '\\';
		v->in_class[CLASS_STR_X][b] = v->in_class[CLASS_STR][b] && b != 0xEF;
		v->in_class[CLASS_RAW][b] = b != '<';
		v->in_class[CLASS_RAW_EF][b] = b != 0xEF;
	}
	v->tok_next = malloc((size_t)v->n_tokens * sizeof(uint32_t));
	for (int c = 0; c < N_CLASSES; c++)
		v->class_mask[c] = calloc(v->mask_words, sizeof(uint32_t));
	v->tok_off = calloc((size_t)v->n_tokens + 1, sizeof(uint32_t));
	size_t cap_bytes = 1 << 20, n_bytes = 0;
	v->tok_bytes = malloc(cap_bytes);
	bool ok = v->tok_next && v->tok_off && v->tok_bytes;
	for (int c = 0; c < N_CLASSES; c++)
		ok = ok && v->class_mask[c];
	uint32_t *tok_next_x[N_CLASSES] = {0};
	for (int c = 0; ok && c < N_CLASSES; c++)
		ok = (tok_next_x[c] = malloc((size_t)v->n_tokens * sizeof(uint32_t))) != NULL;
	for (uint32_t id = 0; ok && id < v->n_tokens; id++) {
		size_t len = 0;
		const char *p = (int32_t)id == v->eos ? NULL : opt->piece(opt->ctx, (int32_t)id, &len);
		v->tok_off[id] = (uint32_t)n_bytes;
		v->tok_off[id + 1] = (uint32_t)n_bytes;
		if (!p || !len)
			continue;
		if (n_bytes + len > cap_bytes) {
			while (n_bytes + len > cap_bytes)
				cap_bytes *= 2;
			char *nb = cap_bytes > UINT32_MAX ? NULL : realloc(v->tok_bytes, cap_bytes);
			if (!nb) {
				ok = false;
				break;
			}
			v->tok_bytes = nb;
		}
		memcpy(v->tok_bytes + n_bytes, p, len);
		n_bytes += len;
		v->tok_off[id + 1] = (uint32_t)n_bytes;
		if (len > v->max_len)
			v->max_len = (uint32_t)len;
		ok = trie_insert(&v->full, (const uint8_t *)p, len, id, v->tok_next);
		for (int c = 0; ok && c < N_CLASSES; c++) {
			bool all = (c != CLASS_STR && c != CLASS_STR_X) ||
				   model_utf8_valid_prefix((const uint8_t *)p, len) == len;
			for (size_t i = 0; i < len && all; i++)
				all = v->in_class[c][(uint8_t)p[i]];
			if (all)
				v->class_mask[c][id >> 5] |= 1u << (id & 31);
			else
				ok = trie_insert(&v->except[c], (const uint8_t *)p, len, id, tok_next_x[c]);
		}
	}
	if (!ok) {
		for (int c = 0; c < N_CLASSES; c++)
			free(tok_next_x[c]);
		gram_vocab_destroy(v);
		return err_set(e, ST_NOMEM, "gram vocab: %u tokens", opt->n_tokens);
	}
	/* one array of chains: the full trie's, then each exception trie's */
	uint32_t *all = realloc(v->tok_next, (size_t)v->n_tokens * (1 + N_CLASSES) * sizeof(uint32_t));
	if (all) {
		v->tok_next = all;
		for (int c = 0; c < N_CLASSES; c++)
			memcpy(all + (size_t)(c + 1) * v->n_tokens, tok_next_x[c], (size_t)v->n_tokens * sizeof(uint32_t));
	}
	for (int c = 0; c < N_CLASSES; c++)
		free(tok_next_x[c]);
	if (!all) {
		gram_vocab_destroy(v);
		return err_set(e, ST_NOMEM, "gram vocab");
	}
	if (v->full.n == 0 && trie_node(&v->full, 0) == NONE) {
		gram_vocab_destroy(v);
		return err_set(e, ST_NOMEM, "gram vocab");
	}
	for (int c = 0; c < N_CLASSES; c++)
		if (v->except[c].n == 0 && trie_node(&v->except[c], 0) == NONE) {
			gram_vocab_destroy(v);
			return err_set(e, ST_NOMEM, "gram vocab");
		}
	*out = v;
	return ST_OK;
}

struct tok_piece_ctx {
	const struct model_tokenizer *tok;
	int32_t dsml;
};

static const char *tok_piece(void *ctx, int32_t id, size_t *len)
{
	const struct tok_piece_ctx *c = ctx;
	if (model_tokenizer_is_special(c->tok, id) && id != c->dsml)
		return NULL;
	return model_tokenizer_piece(c->tok, id, len);
}

enum status gram_vocab_from_tokenizer(struct gram_vocab **out, const struct model_tokenizer *tok, struct err *e)
{
	struct tok_piece_ctx c = {.tok = tok, .dsml = model_tokenizer_token_to_id(tok, "｜DSML｜")};
	struct gram_vocab_options o = {.n_tokens = (uint32_t)model_tokenizer_vocab_size(tok), .piece = tok_piece,
				       .ctx = &c, .eos_id = model_tokenizer_eos_id(tok)};
	return gram_vocab_create(out, &o, e);
}

uint32_t gram_vocab_n_tokens(const struct gram_vocab *v) { return v->n_tokens; }
uint32_t gram_vocab_mask_words(const struct gram_vocab *v) { return v->mask_words; }

/* ---------------- grammar lifetime ---------------- */

struct gram *gram_retain(struct gram *g)
{
	if (g)
		atomic_fetch_add(&g->refs, 1);
	return g;
}

void gram_release(struct gram *g)
{
	if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
		return;
	free(g->nodes);
	free(g->kids);
	free(g->bytes);
	free(g);
}

uint32_t gram_n_nodes(const struct gram *g) { return g->n_nodes; }

/* ---------------- automaton ---------------- */

struct frame {
	uint32_t node, sub, parent, depth;
};

struct cache_entry {
	uint64_t hash, used;
	uint32_t *sig, sig_len, sig_cap;
	uint32_t *mask;
};

struct gram_state {
	struct gram *g;
	const struct gram_vocab *v;
	struct frame *ar;
	uint32_t n_ar, cap_ar;
	uint32_t tops[GRAM_MAX_STACKS], n_tops;
	bool finished;
	uint32_t *dfs; /* (max_len + 2) * GRAM_MAX_STACKS tops */
	uint32_t *remap;
	uint32_t remap_cap;
	struct cache_entry cache[N_CACHE];
	uint64_t clock;
	uint32_t *sig;
	uint32_t sig_cap;
	/* closure scratch */
	uint32_t *out, n_out;
	uint32_t popped[GRAM_MAX_STACKS * 4], n_popped;
	uint32_t budget;
};

static uint32_t new_frame(struct gram_state *st, uint32_t node, uint32_t sub, uint32_t parent, uint32_t depth)
{
	if (depth > GRAM_MAX_DEPTH)
		return NONE;
	if (st->n_ar == st->cap_ar) {
		if (st->cap_ar >= MAX_ARENA_FRAMES)
			return NONE;
		uint32_t cap = st->cap_ar * 2;
		struct frame *a = realloc(st->ar, (size_t)cap * sizeof *a);
		if (!a)
			return NONE;
		st->ar = a;
		st->cap_ar = cap;
	}
	st->ar[st->n_ar] = (struct frame){node, sub, parent, depth};
	return st->n_ar++;
}

static void add_top(struct gram_state *st, uint32_t f)
{
	for (uint32_t i = 0; i < st->n_out; i++) {
		uint32_t o = st->out[i];
		if (o == f)
			return;
		if (o != ACCEPT && f != ACCEPT && st->ar[o].node == st->ar[f].node && st->ar[o].sub == st->ar[f].sub &&
		    st->ar[o].parent == st->ar[f].parent)
			return;
	}
	if (st->n_out < GRAM_MAX_STACKS)
		st->out[st->n_out++] = f;
}

static bool num_can_end(uint32_t s) { return s == 2 || s == 3 || s == 5 || s == 8; }

static void expand(struct gram_state *st, uint32_t f);

static void pop(struct gram_state *st, uint32_t f)
{
	uint32_t p = st->ar[f].parent;
	if (p == NONE) {
		add_top(st, ACCEPT);
		return;
	}
	for (uint32_t i = 0; i < st->n_popped; i++)
		if (st->popped[i] == p)
			return;
	if (st->n_popped < sizeof st->popped / sizeof st->popped[0])
		st->popped[st->n_popped++] = p;
	expand(st, p);
}

static void expand(struct gram_state *st, uint32_t f)
{
	if (f == NONE || st->budget == 0)
		return;
	st->budget--;
	const struct gram *g = st->g;
	struct frame fr = st->ar[f];
	const struct gram__node *nd = &g->nodes[fr.node];
	switch ((enum gram__kind)nd->kind) {
	case GRAM__EMPTY:
		pop(st, f);
		return;
	case GRAM__LIT:
		if (fr.sub < nd->b)
			add_top(st, f);
		else
			pop(st, f);
		return;
	case GRAM__SEQ:
		if (fr.sub >= nd->b) {
			pop(st, f);
		} else if (fr.sub + 1 == nd->b) { /* last kid: no continuation frame */
			expand(st, new_frame(st, g->kids[nd->a + fr.sub], 0, fr.parent, fr.depth));
		} else {
			uint32_t cont = new_frame(st, fr.node, fr.sub + 1, fr.parent, fr.depth);
			if (cont != NONE)
				expand(st, new_frame(st, g->kids[nd->a + fr.sub], 0, cont, fr.depth + 1));
		}
		return;
	case GRAM__ALT:
		for (uint32_t k = 0; k < nd->b; k++)
			expand(st, new_frame(st, g->kids[nd->a + k], 0, fr.parent, fr.depth));
		return;
	case GRAM__STAR:
		if (fr.sub < nd->hi) {
			uint32_t cont = new_frame(st, fr.node, fr.sub + 1, fr.parent, fr.depth);
			if (cont != NONE)
				expand(st, new_frame(st, nd->a, 0, cont, fr.depth + 1));
		}
		if (fr.sub >= nd->lo)
			pop(st, f);
		return;
	case GRAM__REF:
		if (nd->a != NONE)
			expand(st, new_frame(st, nd->a, 0, fr.parent, fr.depth));
		return;
	case GRAM__STR:
		add_top(st, f);
		if ((fr.sub & 255) == 0)
			pop(st, f);
		return;
	case GRAM__NUM:
		add_top(st, f);
		if (num_can_end(fr.sub & 15))
			pop(st, f);
		return;
	case GRAM__RAW:
		add_top(st, f);
		pop(st, f);
		return;
	case GRAM__WS:
		if (fr.sub < GRAM_MAX_WS)
			add_top(st, f);
		pop(st, f);
		return;
	}
}

static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* Matched bytes of the excluded string x[0..n) after byte c, given s
 * matched before (the longest suffix that is a prefix of x); n = found. */
static uint32_t excl_step(const uint8_t *x, uint32_t n, uint32_t s, uint8_t c)
{
	if (s < n && x[s] == c)
		return s + 1;
	for (uint32_t k = s; k > 0; k--)
		if (x[k - 1] == c && memcmp(x, x + s - k + 1, k - 1) == 0)
			return k;
	return 0;
}

/* JSON string body: sub 0 plain, 1 after '\', 2..5 hex digits left - 1
 * (5: four left), 6: after "\uD" (the next digit must be 0-7: no
 * surrogates), 16 + remaining * 8 + kind: inside a UTF-8 character whose
 * next byte must be in range kind (0: 80-BF, 1: A0-BF, 2: 80-9F, 3: 90-BF,
 * 4: 80-8F). Strings are always valid UTF-8 and parse everywhere. */
static uint32_t str_step(uint32_t s, uint8_t c)
{
	static const uint8_t lo[5] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[5] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
	bool hex = is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
	if (s >= 16) {
		uint32_t rem = (s - 16) >> 3, kind = s & 7;
		if (c < lo[kind] || c > hi[kind])
			return NONE;
		return rem == 1 ? 0 : 16 + (rem - 1) * 8;
	}
	switch (s) {
	case 0:
		if (c == '"' || c < 0x20)
			return NONE;
		if (c == '\\')
			return 1;
		if (c < 0x80)
			return 0;
		if (c >= 0xC2 && c <= 0xDF)
			return 16 + 8;
		if (c == 0xE0)
			return 16 + 16 + 1;
		if (c == 0xED)
			return 16 + 16 + 2;
		if (c >= 0xE1 && c <= 0xEF)
			return 16 + 16;
		if (c == 0xF0)
			return 16 + 24 + 3;
		if (c >= 0xF1 && c <= 0xF3)
			return 16 + 24;
		if (c == 0xF4)
			return 16 + 24 + 4;
		return NONE;
	case 1:
		if (c == 'u')
			return 5;
		return c && strchr("\"\\/bfnrt", c) ? 0 : NONE;
	case 5:
		return !hex ? NONE : (c | 0x20) == 'd' ? 6 : 4;
	case 6:
		return c >= '0' && c <= '7' ? 3 : NONE;
	default: /* 2..4 */
		return !hex ? NONE : s == 2 ? 0 : s - 1;
	}
}

/* The next sub-state of terminal frame fr on byte c, or NONE. */
static uint32_t term_step(const struct gram *g, const struct frame *fr, uint8_t c)
{
	const struct gram__node *nd = &g->nodes[fr->node];
	uint32_t s = fr->sub;
	switch ((enum gram__kind)nd->kind) {
	case GRAM__LIT:
		return g->bytes[nd->a + s] == c ? s + 1 : NONE;
	case GRAM__STR: { /* sub = string state | excluded-string bytes matched << 8 */
		uint32_t b = str_step(s & 255, c);
		if (b == NONE || !nd->b)
			return b;
		uint32_t m = excl_step(g->bytes + nd->a, nd->b, s >> 8, c);
		return m == nd->b ? NONE : b | m << 8;
	}
	case GRAM__NUM: {
		/* sub = state | bytes << 4 | digits in the current run << 12 */
		uint32_t q = s & 15, n = ((s >> 4) & 255) + 1, run = s >> 12, r = NONE;
		bool integer = nd->lo == 1;
		if (n > GRAM_MAX_NUM_BYTES)
			return NONE;
		bool e = (c | 0x20) == 'e', d = is_digit(c);
		switch (q) {
		case 0:
			r = c == '-' ? 1 : c == '0' ? 2 : d ? 3 : NONE;
			break;
		case 1:
			r = c == '0' ? 2 : d ? 3 : NONE;
			break;
		case 2:
		case 3:
			r = (q == 3 && d) ? 3 : integer ? NONE : c == '.' ? 4 : e ? 6 : NONE;
			break;
		case 4:
		case 5:
			r = d ? 5 : (q == 5 && e) ? 6 : NONE;
			break;
		case 6:
			r = (c == '+' || c == '-') ? 7 : d ? 8 : NONE;
			break;
		case 7:
		case 8:
			r = d ? 8 : NONE;
			break;
		}
		if (r == NONE)
			return NONE;
		/* after '-', '.', 'e' or an exponent sign a digit must still fit */
		if ((r == 1 || r == 4 || r == 6 || r == 7) && n + 1 > GRAM_MAX_NUM_BYTES)
			return NONE;
		run = d && r == q ? run + 1 : d ? 1 : 0;
		if (run > (r == 8 ? GRAM_MAX_EXP_DIGITS : GRAM_MAX_RUN_DIGITS))
			return NONE;
		return r | n << 4 | run << 12;
	}
	case GRAM__RAW: {
		if (nd->b == 0)
			return 0;
		uint32_t m = excl_step(g->bytes + nd->a, nd->b, s, c);
		return m == nd->b ? NONE : m;
	}
	case GRAM__WS:
		return (c == ' ' || c == '\n' || c == '\t' || c == '\r') && s < GRAM_MAX_WS ? s + 1 : NONE;
	default:
		return NONE;
	}
}

/* tops_in -> out (GRAM_MAX_STACKS room) after byte c; returns the count. */
static uint32_t step_byte(struct gram_state *st, const uint32_t *in, uint32_t n_in, uint8_t c, uint32_t *out)
{
	st->out = out;
	st->n_out = 0;
	st->n_popped = 0;
	st->budget = CLOSURE_BUDGET;
	for (uint32_t i = 0; i < n_in; i++) {
		if (in[i] == ACCEPT)
			continue;
		struct frame fr = st->ar[in[i]];
		uint32_t s = term_step(st->g, &fr, c);
		if (s != NONE)
			expand(st, new_frame(st, fr.node, s, fr.parent, fr.depth));
	}
	return st->n_out;
}

void gram_state_destroy(struct gram_state *st)
{
	if (!st)
		return;
	for (int i = 0; i < N_CACHE; i++) {
		free(st->cache[i].sig);
		free(st->cache[i].mask);
	}
	free(st->ar);
	free(st->dfs);
	free(st->remap);
	free(st->sig);
	gram_release(st->g);
	free(st);
}

enum status gram_state_create(struct gram_state **out, struct gram *g, const struct gram_vocab *v, struct err *e)
{
	*out = NULL;
	struct gram_state *st = calloc(1, sizeof *st);
	if (!st)
		return err_set(e, ST_NOMEM, "gram state");
	st->g = gram_retain(g);
	st->v = v;
	st->cap_ar = 1024;
	st->ar = malloc(st->cap_ar * sizeof *st->ar);
	st->dfs = malloc(((size_t)v->max_len + 2) * GRAM_MAX_STACKS * sizeof(uint32_t));
	if (!st->ar || !st->dfs) {
		gram_state_destroy(st);
		return err_set(e, ST_NOMEM, "gram state");
	}
	uint32_t root = new_frame(st, g->root, 0, NONE, 0);
	st->out = st->tops;
	st->n_out = 0;
	st->n_popped = 0;
	st->budget = CLOSURE_BUDGET;
	expand(st, root);
	st->n_tops = st->n_out;
	if (!st->n_tops) {
		gram_state_destroy(st);
		return err_set(e, ST_INVALID, "grammar accepts nothing");
	}
	*out = st;
	return ST_OK;
}

static bool has_accept(const uint32_t *t, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (t[i] == ACCEPT)
			return true;
	return false;
}

bool gram_state_is_complete(const struct gram_state *st) { return has_accept(st->tops, st->n_tops); }
bool gram_state_is_final(const struct gram_state *st)
{
	return st->finished || (st->n_tops == 1 && st->tops[0] == ACCEPT);
}

/* Keep only the frames the tops reach (parents always precede children). */
static void compact(struct gram_state *st)
{
	if (st->n_ar > st->remap_cap) {
		uint32_t *r = realloc(st->remap, (size_t)st->n_ar * sizeof *r);
		if (!r)
			return; /* keep the arena as it is */
		st->remap = r;
		st->remap_cap = st->n_ar;
	}
	uint32_t *m = st->remap;
	for (uint32_t i = 0; i < st->n_ar; i++)
		m[i] = 0;
	for (uint32_t i = 0; i < st->n_tops; i++)
		for (uint32_t f = st->tops[i]; f != ACCEPT && f != NONE && !m[f]; f = st->ar[f].parent)
			m[f] = 1;
	uint32_t n = 0;
	for (uint32_t i = 0; i < st->n_ar; i++) {
		if (!m[i])
			continue;
		struct frame fr = st->ar[i];
		if (fr.parent != NONE)
			fr.parent = m[fr.parent];
		st->ar[n] = fr;
		m[i] = n++;
	}
	for (uint32_t i = 0; i < st->n_tops; i++)
		if (st->tops[i] != ACCEPT)
			st->tops[i] = m[st->tops[i]];
	st->n_ar = n;
}

enum status gram_state_accept_bytes(struct gram_state *st, const char *s, size_t n)
{
	if (st->finished)
		return n ? ST_INVALID : ST_OK;
	uint32_t mark = st->n_ar;
	uint32_t a[GRAM_MAX_STACKS], b[GRAM_MAX_STACKS];
	memcpy(a, st->tops, st->n_tops * sizeof(uint32_t));
	uint32_t na = st->n_tops;
	for (size_t i = 0; i < n; i++) {
		na = step_byte(st, a, na, (uint8_t)s[i], b);
		if (!na) {
			st->n_ar = mark;
			return ST_INVALID;
		}
		memcpy(a, b, na * sizeof(uint32_t));
	}
	memcpy(st->tops, a, na * sizeof(uint32_t));
	st->n_tops = na;
	compact(st);
	return ST_OK;
}

enum status gram_state_accept_token(struct gram_state *st, int32_t id)
{
	const struct gram_vocab *v = st->v;
	if (id < 0 || (uint32_t)id >= v->n_tokens || st->finished)
		return ST_INVALID;
	if (id == v->eos) {
		if (!gram_state_is_complete(st))
			return ST_INVALID;
		st->finished = true;
		return ST_OK;
	}
	uint32_t o = v->tok_off[id], n = v->tok_off[id + 1] - o;
	if (!n)
		return ST_INVALID;
	return gram_state_accept_bytes(st, v->tok_bytes + o, n);
}

/* ---- masks ---- */

static void dfs(struct gram_state *st, const struct trie *t, const uint32_t *tok_next, uint32_t node, uint32_t depth,
		uint32_t n_in, uint32_t *mask)
{
	const uint32_t *in = st->dfs + (size_t)depth * GRAM_MAX_STACKS;
	uint32_t *out = st->dfs + (size_t)(depth + 1) * GRAM_MAX_STACKS;
	for (uint32_t c = t->first[node]; c != NONE; c = t->next[c]) {
		uint32_t mark = st->n_ar;
		uint32_t n2 = step_byte(st, in, n_in, t->byte[c], out);
		if (n2) {
			for (uint32_t k = t->tok_head[c]; k != NONE; k = tok_next[k])
				mask[k >> 5] |= 1u << (k & 31);
			if (t->first[c] != NONE && !(n2 == 1 && out[0] == ACCEPT))
				dfs(st, t, tok_next, c, depth + 1, n2, mask);
		}
		st->n_ar = mark;
	}
}

/* The state's content (node, sub of every frame of every stack). */
static uint32_t signature(struct gram_state *st, uint64_t *hash)
{
	uint32_t n = 0;
	uint64_t h = 1469598103934665603ull;
	for (uint32_t i = 0; i < st->n_tops; i++) {
		for (uint32_t f = st->tops[i];; f = st->ar[f].parent) {
			if (n + 3 > st->sig_cap) {
				uint32_t cap = st->sig_cap ? st->sig_cap * 2 : 256;
				uint32_t *s = realloc(st->sig, cap * sizeof *s);
				if (!s)
					return UINT32_MAX;
				st->sig = s;
				st->sig_cap = cap;
			}
			if (f == ACCEPT || f == NONE) {
				st->sig[n++] = f;
				break;
			}
			st->sig[n++] = st->ar[f].node;
			st->sig[n++] = st->ar[f].sub;
		}
	}
	for (uint32_t i = 0; i < n; i++)
		h = (h ^ st->sig[i]) * 1099511628211ull;
	*hash = h;
	return n;
}

/* The class whose fast path applies to this state, or -1: one top loops on
 * the class's bytes and no other top takes any of them. */
static int fast_class(const struct gram_state *st)
{
	const struct gram *g = st->g;
	int cls = -1;
	uint32_t loop = NONE;
	for (uint32_t i = 0; i < st->n_tops; i++) {
		uint32_t f = st->tops[i];
		if (f == ACCEPT)
			continue;
		const struct gram__node *nd = &g->nodes[st->ar[f].node];
		int c = -1;
		if (nd->kind == GRAM__STR && st->ar[f].sub == 0)
			c = nd->b ? (g->bytes[nd->a] == 0xEF ? CLASS_STR_X : -1) : CLASS_STR;
		else if (nd->kind == GRAM__RAW && st->ar[f].sub == 0)
			c = nd->b == 0 || g->bytes[nd->a] == '<' ? CLASS_RAW : g->bytes[nd->a] == 0xEF ? CLASS_RAW_EF : -1;
		if (c >= 0 && loop == NONE) {
			loop = f;
			cls = c;
		}
	}
	if (cls < 0)
		return -1;
	for (uint32_t i = 0; i < st->n_tops; i++) {
		uint32_t f = st->tops[i];
		if (f == ACCEPT || f == loop)
			continue;
		const struct gram__node *nd = &g->nodes[st->ar[f].node];
		if (nd->kind != GRAM__LIT)
			return -1;
		if (st->v->in_class[cls][g->bytes[nd->a + st->ar[f].sub]])
			return -1;
	}
	return cls;
}

void gram_state_fill_mask(struct gram_state *st, uint32_t *mask)
{
	const struct gram_vocab *v = st->v;
	memset(mask, 0, (size_t)v->mask_words * sizeof(uint32_t));
	if (st->finished) {
		if (v->eos >= 0)
			mask[v->eos >> 5] |= 1u << (v->eos & 31);
		return;
	}
	uint64_t h = 0;
	uint32_t n_sig = signature(st, &h);
	struct cache_entry *slot = NULL;
	if (n_sig != UINT32_MAX) {
		for (int i = 0; i < N_CACHE; i++) {
			struct cache_entry *c = &st->cache[i];
			if (c->mask && c->hash == h && c->sig_len == n_sig && !memcmp(c->sig, st->sig, n_sig * sizeof(uint32_t))) {
				memcpy(mask, c->mask, (size_t)v->mask_words * sizeof(uint32_t));
				c->used = ++st->clock;
				return;
			}
			if (!slot || c->used < slot->used)
				slot = c;
		}
	}
	uint32_t mark = st->n_ar;
	memcpy(st->dfs, st->tops, st->n_tops * sizeof(uint32_t));
	int cls = fast_class(st);
	if (cls >= 0) {
		memcpy(mask, v->class_mask[cls], (size_t)v->mask_words * sizeof(uint32_t));
		dfs(st, &v->except[cls], v->tok_next + (size_t)(cls + 1) * v->n_tokens, 0, 0, st->n_tops, mask);
	} else {
		dfs(st, &v->full, v->tok_next, 0, 0, st->n_tops, mask);
	}
	st->n_ar = mark;
	if (v->eos >= 0 && gram_state_is_complete(st))
		mask[v->eos >> 5] |= 1u << (v->eos & 31);
	if (slot) {
		if (!slot->mask)
			slot->mask = malloc((size_t)v->mask_words * sizeof(uint32_t));
		if (slot->sig_cap < n_sig) {
			uint32_t *s = realloc(slot->sig, n_sig * sizeof(uint32_t));
			if (s) {
				slot->sig = s;
				slot->sig_cap = n_sig;
			}
		}
		if (slot->mask && slot->sig_cap >= n_sig) {
			memcpy(slot->mask, mask, (size_t)v->mask_words * sizeof(uint32_t));
			memcpy(slot->sig, st->sig, n_sig * sizeof(uint32_t));
			slot->sig_len = n_sig;
			slot->hash = h;
			slot->used = ++st->clock;
		} else if (slot->mask) {
			free(slot->mask);
			slot->mask = NULL;
		}
	}
}
