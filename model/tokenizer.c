/*
 * model/tokenizer.c: loading tokenizer.json into flat tables, the id/string
 * lookups, and decode().
 *
 * Everything the encoder needs per call is read-only after load: the vocab
 * is turned into per-id token strings and decoded byte pieces, the merges
 * into an open-addressing map keyed by the (left, right) id pair, the added
 * tokens into two byte tries, the pre-tokenizer regexes into JIT-compiled
 * PCRE2 programs. BPE itself then runs on raw bytes, because the ByteLevel
 * byte<->char map is a bijection: merging chars of the mapped string is the
 * same as merging the bytes they stand for.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "tokenizer_internal.h"

/* ---- the GPT-2 byte <-> char map of ByteLevel ---- */

/* byte -> code point, and code point (< 512) -> byte or -1. */
static void bytelevel_tables(uint32_t b2c[256], int16_t c2b[512])
{
	for (int i = 0; i < 512; i++)
		c2b[i] = -1;
	int n = 0;
	for (int b = 0; b < 256; b++) {
		bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
		b2c[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
		c2b[b2c[b]] = (int16_t)b;
	}
}

/* Decode one code point from valid UTF-8 (the JSON strings jansson gives). */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *i)
{
	size_t len;
	if (model_utf8_classify(s + *i, n - *i, &len) != 1) {
		*i += 1;
		return 0xFFFFFFFFu;
	}
	uint32_t cp;
	if (len == 1)
		cp = s[*i];
	else if (len == 2)
		cp = (uint32_t)(s[*i] & 0x1F) << 6 | (s[*i + 1] & 0x3F);
	else if (len == 3)
		cp = (uint32_t)(s[*i] & 0x0F) << 12 | (uint32_t)(s[*i + 1] & 0x3F) << 6 |
		     (s[*i + 2] & 0x3F);
	else
		cp = (uint32_t)(s[*i] & 0x07) << 18 | (uint32_t)(s[*i + 1] & 0x3F) << 12 |
		     (uint32_t)(s[*i + 2] & 0x3F) << 6 | (s[*i + 3] & 0x3F);
	*i += len;
	return cp;
}

/* What HF's ByteLevel decoder makes of one token string: the mapped bytes if
 * every char is in the map, else the string's own UTF-8 bytes. Writes at most
 * n bytes to out (a token never decodes longer than its string). */
static size_t bytelevel_decode(const int16_t c2b[512], const char *tokstr, size_t n, char *out)
{
	const unsigned char *s = (const unsigned char *)tokstr;
	size_t i = 0, o = 0;
	while (i < n) {
		uint32_t cp = utf8_next(s, n, &i);
		if (cp >= 512 || c2b[cp] < 0) {
			memcpy(out, tokstr, n);
			return n;
		}
		out[o++] = (char)c2b[cp];
	}
	return o;
}

/* ---- building the tables ---- */

static enum status strs_add(struct model_tokenizer *tok, const char *s, size_t n, uint32_t *off,
			    struct err *e)
{
	if (tok->strs_len + n + 1 > tok->strs_cap) {
		size_t cap = tok->strs_cap ? tok->strs_cap : 1u << 20;
		while (cap < tok->strs_len + n + 1)
			cap *= 2;
		char *p = realloc(tok->strs, cap);
		if (!p)
			return err_set(e, ST_NOMEM, "tokenizer: out of memory (strings)");
		tok->strs = p;
		tok->strs_cap = cap;
	}
	if (tok->strs_len + n + 1 > UINT32_MAX)
		return err_set(e, ST_INVALID, "tokenizer: strings exceed 4 GiB");
	*off = (uint32_t)tok->strs_len;
	memcpy(tok->strs + tok->strs_len, s, n);
	tok->strs[tok->strs_len + n] = 0;
	tok->strs_len += n + 1;
	return ST_OK;
}

/* Insert or replace id under its current token string. */
static void str_map_put(struct model_tokenizer *tok, int32_t id)
{
	const char *s = tok->strs + tok->str_off[id];
	uint64_t h = tok__hash_bytes(s, strlen(s));
	size_t i = h & tok->str_map_mask;
	for (;;) {
		int32_t cur = tok->str_map[i];
		if (cur < 0 || (tok->str_map_hash[i] == (uint32_t)(h >> 32) &&
				strcmp(tok->strs + tok->str_off[cur], s) == 0)) {
			tok->str_map[i] = id;
			tok->str_map_hash[i] = (uint32_t)(h >> 32);
			return;
		}
		i = (i + 1) & tok->str_map_mask;
	}
}

static int32_t str_map_get(const struct model_tokenizer *tok, const char *s, size_t n)
{
	uint64_t h = tok__hash_bytes(s, n);
	size_t i = h & tok->str_map_mask;
	for (;;) {
		int32_t cur = tok->str_map[i];
		if (cur < 0)
			return -1;
		const char *t = tok->strs + tok->str_off[cur];
		if (tok->str_map_hash[i] == (uint32_t)(h >> 32) && memcmp(t, s, n) == 0 && t[n] == 0)
			return cur;
		i = (i + 1) & tok->str_map_mask;
	}
}

static enum status trie_add(struct tok__trie *t, const uint8_t *s, size_t n, int32_t token,
			    struct err *e)
{
	if (t->n_nodes == 0) {
		t->cap_nodes = 1024;
		t->nodes = calloc(t->cap_nodes, sizeof *t->nodes);
		if (!t->nodes)
			return err_set(e, ST_NOMEM, "tokenizer: out of memory (trie)");
		t->nodes[0].token = -1;
		t->n_nodes = 1;
	}
	if (n == 0)
		return err_set(e, ST_INVALID, "tokenizer: empty added token");
	t->first_byte[s[0]] = 1;
	uint32_t node = 0;
	for (size_t k = 0; k < n; k++) {
		uint32_t c = t->nodes[node].first_child;
		while (c && t->nodes[c].byte != s[k])
			c = t->nodes[c].next_sibling;
		if (!c) {
			if (t->n_nodes == t->cap_nodes) {
				struct tok__trie_node *p =
					realloc(t->nodes, 2 * t->cap_nodes * sizeof *p);
				if (!p)
					return err_set(e, ST_NOMEM, "tokenizer: out of memory (trie)");
				t->nodes = p;
				t->cap_nodes *= 2;
			}
			c = t->n_nodes++;
			t->nodes[c] = (struct tok__trie_node){
				.first_child = 0,
				.next_sibling = t->nodes[node].first_child,
				.token = -1,
				.byte = s[k],
			};
			t->nodes[node].first_child = c;
		}
		node = c;
	}
	/* A later duplicate replaces the earlier one, as in HF's maps. */
	t->nodes[node].token = token;
	return ST_OK;
}

/* ---- reading tokenizer.json ---- */

static const char *jstr(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jtrue(json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

static enum status parse_behavior(const char *s, enum tok__behavior *b, struct err *e)
{
	static const struct {
		const char *name;
		enum tok__behavior b;
	} names[] = {
		{"Isolated", TOK_SPLIT_ISOLATED},
		{"Removed", TOK_SPLIT_REMOVED},
		{"MergedWithPrevious", TOK_SPLIT_MERGED_WITH_PREVIOUS},
		{"MergedWithNext", TOK_SPLIT_MERGED_WITH_NEXT},
		{"Contiguous", TOK_SPLIT_CONTIGUOUS},
	};
	for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
		if (strcmp(s, names[i].name) == 0) {
			*b = names[i].b;
			return ST_OK;
		}
	return err_set(e, ST_UNSUPPORTED, "pre_tokenizer: Split behavior %s", s ? s : "(none)");
}

/* The GPT-2 regex HF's ByteLevel pre-tokenizer applies when use_regex is true. */
static const char bytelevel_regex[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static enum status add_step(struct model_tokenizer *tok, const char *pattern, bool literal,
			    enum tok__behavior b, bool invert, struct err *e)
{
	if (tok->n_steps == TOK_MAX_STEPS)
		return err_set(e, ST_UNSUPPORTED, "pre_tokenizer: more than %d steps", TOK_MAX_STEPS);
	struct tok__step *st = &tok->steps[tok->n_steps];
	enum status s = tok__regex_compile(pattern, literal, &st->re, &st->jit, e);
	if (s != ST_OK)
		return err_prefix(e, "pre_tokenizer");
	st->behavior = b;
	st->invert = invert;
	tok->n_steps++;
	return ST_OK;
}

static enum status parse_pretok_one(struct model_tokenizer *tok, json_t *p, bool *have_bytelevel,
				    struct err *e)
{
	const char *type = jstr(p, "type");
	if (!type)
		return err_set(e, ST_INVALID, "pre_tokenizer: step without a type");
	if (*have_bytelevel)
		return err_set(e, ST_UNSUPPORTED, "pre_tokenizer: %s after ByteLevel", type);
	if (strcmp(type, "Split") == 0) {
		json_t *pat = json_object_get(p, "pattern");
		const char *re = jstr(pat, "Regex"), *lit = jstr(pat, "String");
		if (!re && !lit)
			return err_set(e, ST_INVALID, "pre_tokenizer: Split without a pattern");
		enum tok__behavior b = TOK_SPLIT_ISOLATED;
		enum status s = parse_behavior(jstr(p, "behavior"), &b, e);
		if (s != ST_OK)
			return s;
		return add_step(tok, re ? re : lit, !re, b, jtrue(p, "invert"), e);
	}
	if (strcmp(type, "ByteLevel") == 0) {
		if (jtrue(p, "add_prefix_space"))
			return err_set(e, ST_UNSUPPORTED, "pre_tokenizer: ByteLevel add_prefix_space");
		*have_bytelevel = true;
		json_t *ur = json_object_get(p, "use_regex");
		if (!ur || json_is_true(ur))
			return add_step(tok, bytelevel_regex, false, TOK_SPLIT_ISOLATED, false, e);
		return ST_OK;
	}
	return err_set(e, ST_UNSUPPORTED, "pre_tokenizer: type %s", type);
}

static enum status parse_pretok(struct model_tokenizer *tok, json_t *root, struct err *e)
{
	json_t *p = json_object_get(root, "pre_tokenizer");
	bool have_bl = false;
	enum status s = ST_OK;
	if (p && strcmp(jstr(p, "type") ? jstr(p, "type") : "", "Sequence") == 0) {
		json_t *arr = json_object_get(p, "pretokenizers");
		size_t i;
		json_t *v;
		json_array_foreach(arr, i, v)
		{
			s = parse_pretok_one(tok, v, &have_bl, e);
			if (s != ST_OK)
				return s;
		}
	} else if (json_is_object(p)) {
		s = parse_pretok_one(tok, p, &have_bl, e);
		if (s != ST_OK)
			return s;
	}
	if (!have_bl)
		return err_set(e, ST_UNSUPPORTED, "pre_tokenizer: no ByteLevel step (not byte-level BPE)");
	json_t *n = json_object_get(root, "normalizer");
	if (n && !json_is_null(n)) {
		const char *t = jstr(n, "type");
		json_t *list = json_object_get(n, "normalizers");
		if (!t || strcmp(t, "Sequence") != 0 || json_array_size(list) != 0)
			return err_set(e, ST_UNSUPPORTED, "normalizer %s: only none or an empty Sequence",
				       t ? t : "?");
	}
	json_t *d = json_object_get(root, "decoder");
	if (!d || strcmp(jstr(d, "type") ? jstr(d, "type") : "", "ByteLevel") != 0)
		return err_set(e, ST_UNSUPPORTED, "decoder: only ByteLevel");
	json_t *pp = json_object_get(root, "post_processor");
	if (pp && !json_is_null(pp) && strcmp(jstr(pp, "type") ? jstr(pp, "type") : "", "ByteLevel"))
		return err_set(e, ST_UNSUPPORTED, "post_processor %s: only ByteLevel or none",
			       jstr(pp, "type") ? jstr(pp, "type") : "?");
	return ST_OK;
}

/* model: a plain BPE (no dropout, subword affixes or ignore_merges). */
static enum status model_check(json_t *model, struct err *e)
{
	const char *type = jstr(model, "type");
	if (!type || strcmp(type, "BPE") != 0)
		return err_set(e, ST_UNSUPPORTED, "model.type %s: only BPE", type ? type : "(none)");
	json_t *dropout = json_object_get(model, "dropout");
	if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
		return err_set(e, ST_UNSUPPORTED, "model: BPE dropout");
	const char *csp = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
	if ((csp && *csp) || (eow && *eow))
		return err_set(e, ST_UNSUPPORTED, "model: subword prefix/suffix");
	if (jtrue(model, "ignore_merges"))
		return err_set(e, ST_UNSUPPORTED, "model: ignore_merges");
	if (!json_is_object(json_object_get(model, "vocab")))
		return err_set(e, ST_INVALID, "model.vocab: not an object");
	return ST_OK;
}

/* The id space (1 + the largest id of the vocab and the added tokens) and
 * the per-id tables sized for it. */
static enum status ids_alloc(struct model_tokenizer *tok, json_t *vocab, json_t *added, struct err *e)
{
	json_int_t max_id = -1;
	const char *key;
	json_t *v;
	json_object_foreach(vocab, key, v)
	{
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID)
			return err_set(e, ST_INVALID, "model.vocab[%s]: bad id", key);
		if (json_integer_value(v) > max_id)
			max_id = json_integer_value(v);
	}
	size_t i;
	json_array_foreach(added, i, v)
	{
		json_t *id = json_object_get(v, "id");
		if (!json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) >= TOK_MAX_ID || !jstr(v, "content"))
			return err_set(e, ST_INVALID, "added_tokens[%zu]: bad id or content", i);
		if (json_integer_value(id) > max_id)
			max_id = json_integer_value(id);
	}
	if (max_id < 0)
		return err_set(e, ST_INVALID, "model.vocab: empty");
	tok->vocab_size = (int32_t)max_id + 1;
	size_t nv = (size_t)tok->vocab_size;
	tok->str_off = malloc(nv * sizeof *tok->str_off);
	tok->piece_off = calloc(nv, sizeof *tok->piece_off);
	tok->piece_len = calloc(nv, sizeof *tok->piece_len);
	tok->id_flags = calloc(nv, 1);
	size_t map_slots = 1;
	while (map_slots < 2 * nv)
		map_slots *= 2;
	tok->str_map = malloc(map_slots * sizeof *tok->str_map);
	tok->str_map_hash = calloc(map_slots, sizeof *tok->str_map_hash);
	tok->str_map_mask = map_slots - 1;
	if (!tok->str_off || !tok->piece_off || !tok->piece_len || !tok->id_flags || !tok->str_map ||
	    !tok->str_map_hash)
		return err_set(e, ST_NOMEM, "tokenizer: out of memory (%zu ids)", nv);
	memset(tok->str_off, 0xFF, nv * sizeof *tok->str_off);
	memset(tok->str_map, 0xFF, map_slots * sizeof *tok->str_map);
	return ST_OK;
}

/* The vocab's strings, and the one-byte tokens BPE starts from. */
static enum status vocab_load(struct model_tokenizer *tok, json_t *vocab, const uint32_t b2c[256], struct err *e)
{
	const char *key;
	json_t *v;
	json_object_foreach(vocab, key, v)
	{
		int32_t id = (int32_t)json_integer_value(v);
		if (tok->str_off[id] != UINT32_MAX)
			return err_set(e, ST_INVALID, "model.vocab: id %d given twice", id);
		enum status s = strs_add(tok, key, strlen(key), &tok->str_off[id], e);
		if (s != ST_OK)
			return s;
		tok->id_flags[id] |= TOK_ID_ASSIGNED;
		str_map_put(tok, id);
	}
	/* The one-byte tokens BPE starts from. */
	for (int b = 0; b < 256; b++) {
		char u[4];
		size_t n = 0;
		uint32_t cp = b2c[b];
		if (cp < 0x80) {
			u[n++] = (char)cp;
		} else {
			u[n++] = (char)(0xC0 | (cp >> 6));
			u[n++] = (char)(0x80 | (cp & 0x3F));
		}
		tok->byte_id[b] = str_map_get(tok, u, n);
		if (tok->byte_id[b] < 0)
			return err_set(e, ST_UNSUPPORTED, "model.vocab: no token for byte 0x%02x", b);
	}

	return ST_OK;
}

/* Merges, "left right" strings or [left, right] pairs; rank = position. */
static enum status merges_load(struct model_tokenizer *tok, json_t *merges, struct err *e)
{
	size_t i;
	json_t *v;
	size_t nm = json_array_size(merges), slots = 1;
	while (slots < 2 * nm + 2)
		slots *= 2;
	tok->merges = malloc(slots * sizeof *tok->merges);
	if (!tok->merges)
		return err_set(e, ST_NOMEM, "tokenizer: out of memory (merges)");
	memset(tok->merges, 0xFF, slots * sizeof *tok->merges);
	tok->merges_mask = slots - 1;
	char pair[1024];
	json_array_foreach(merges, i, v)
	{
		const char *l, *r;
		size_t ll, rl;
		if (json_is_string(v)) {
			const char *m = json_string_value(v), *sp = strchr(m, ' ');
			if (!sp || strchr(sp + 1, ' '))
				return err_set(e, ST_INVALID, "model.merges[%zu]: \"%s\" is not two tokens", i, m);
			l = m, ll = (size_t)(sp - m), r = sp + 1, rl = strlen(sp + 1);
		} else if (json_is_array(v) && json_array_size(v) == 2 &&
			   json_is_string(json_array_get(v, 0)) && json_is_string(json_array_get(v, 1))) {
			l = json_string_value(json_array_get(v, 0)), ll = strlen(l);
			r = json_string_value(json_array_get(v, 1)), rl = strlen(r);
		} else {
			return err_set(e, ST_INVALID, "model.merges[%zu]: not a pair", i);
		}
		if (ll + rl + 1 > sizeof pair)
			return err_set(e, ST_INVALID, "model.merges[%zu]: too long", i);
		int32_t a = str_map_get(tok, l, ll), b = str_map_get(tok, r, rl);
		memcpy(pair, l, ll);
		memcpy(pair + ll, r, rl);
		int32_t c = str_map_get(tok, pair, ll + rl);
		if (a < 0 || b < 0 || c < 0)
			return err_set(e, ST_INVALID, "model.merges[%zu]: %.*s %.*s: token not in vocab",
				       i, (int)ll, l, (int)rl, r);
		uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
		size_t slot = tok__hash_u64(k) & tok->merges_mask;
		while (tok->merges[slot].key != UINT64_MAX && tok->merges[slot].key != k)
			slot = (slot + 1) & tok->merges_mask;
		/* A repeated pair takes its later rank, as HF's map collect does. */
		tok->merges[slot] = (struct tok__merge){.key = k, .rank = (uint32_t)i, .new_id = c};
	}

	return ST_OK;
}

/* Added tokens: they shadow vocab strings, and go into the tries. Special
 * is a property of the string (HF's special_tokens_set). */
static enum status added_load(struct model_tokenizer *tok, json_t *added, struct err *e)
{
	size_t i;
	json_t *v;
	enum status s;
	tok->n_added = json_array_size(added);
	tok->added = calloc(tok->n_added ? tok->n_added : 1, sizeof *tok->added);
	if (!tok->added)
		return err_set(e, ST_NOMEM, "tokenizer: out of memory (added tokens)");
	json_array_foreach(added, i, v)
	{
		struct tok__added *a = &tok->added[i];
		const char *content = jstr(v, "content");
		size_t clen = json_string_length(json_object_get(v, "content"));
		a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
		a->special = jtrue(v, "special");
		json_t *norm = json_object_get(v, "normalized");
		/* HF's default: normalized unless special. */
		a->normalized = norm ? json_is_true(norm) : !a->special;
		if (jtrue(v, "single_word") || jtrue(v, "lstrip") || jtrue(v, "rstrip"))
			return err_set(e, ST_UNSUPPORTED, "added_tokens[%zu] %s: single_word/lstrip/rstrip",
				       i, content);
		s = strs_add(tok, content, clen, &a->content_off, e);
		if (s != ST_OK)
			return s;
		a->content_len = (uint32_t)clen;
		tok->str_off[a->id] = a->content_off;
		tok->id_flags[a->id] |= TOK_ID_ASSIGNED | TOK_ID_ADDED;
		str_map_put(tok, a->id);
		s = trie_add(a->normalized ? &tok->trie_norm : &tok->trie_raw,
			     (const uint8_t *)content, clen, (int32_t)i, e);
		if (s != ST_OK)
			return err_prefix(e, "added_tokens[%zu]", i);
	}
	for (i = 0; i < tok->n_added; i++) {
		if (!tok->added[i].special)
			continue;
		tok->id_flags[tok->added[i].id] |= TOK_ID_SPECIAL;
		int32_t vid = str_map_get(tok, tok->strs + tok->added[i].content_off,
					  tok->added[i].content_len);
		if (vid >= 0)
			tok->id_flags[vid] |= TOK_ID_SPECIAL;
	}
	return ST_OK;
}

/* Pieces: each token's bytes as the ByteLevel decoder gives them. */
static enum status pieces_build(struct model_tokenizer *tok, const int16_t c2b[512], struct err *e)
{
	size_t nv = (size_t)tok->vocab_size;
	tok->pieces = malloc(tok->strs_len + 1);
	if (!tok->pieces)
		return err_set(e, ST_NOMEM, "tokenizer: out of memory (pieces)");
	for (size_t id = 0; id < nv; id++) {
		if (tok->str_off[id] == UINT32_MAX)
			continue;
		const char *ts = tok->strs + tok->str_off[id];
		tok->piece_off[id] = (uint32_t)tok->pieces_len;
		tok->piece_len[id] =
			(uint32_t)bytelevel_decode(c2b, ts, strlen(ts), tok->pieces + tok->pieces_len);
		tok->pieces_len += tok->piece_len[id];
	}
	return ST_OK;
}

static enum status parse_model(struct model_tokenizer *tok, json_t *root, const int16_t c2b[512],
			       const uint32_t b2c[256], struct err *e)
{
	json_t *model = json_object_get(root, "model");
	json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
	enum status s;
	if ((s = model_check(model, e)) || (s = ids_alloc(tok, vocab, added, e)) || (s = vocab_load(tok, vocab, b2c, e)) ||
	    (s = merges_load(tok, json_object_get(model, "merges"), e)) || (s = added_load(tok, added, e)))
		return s;
	return pieces_build(tok, c2b, e);
}

#define TOK_MAX_FILE_BYTES ((size_t)1 << 30) /* tokenizer.json: DeepSeek-V4's is 8 MiB */

/* bos/eos from tokenizer_config.json in dir (string or {"content": ...}). */
static int32_t config_token(const struct model_tokenizer *tok, json_t *cfg, const char *key,
			    const char *fallback)
{
	json_t *v = json_object_get(cfg, key);
	const char *s = json_is_string(v) ? json_string_value(v) : jstr(v, "content");
	if (!s)
		s = fallback;
	return model_tokenizer_token_to_id(tok, s);
}

enum status model_tokenizer_load(struct model_tokenizer **out, const char *path, struct err *e)
{
	*out = NULL;
	double t0 = time_mono_s();
	char file[4096], dir[4096];
	struct stat sb;
	if (stat(path, &sb) != 0)
		return err_set(e, ST_IO, "tokenizer %s: %s", path, strerror(errno));
	if (S_ISDIR(sb.st_mode)) {
		snprintf(dir, sizeof dir, "%s", path);
		snprintf(file, sizeof file, "%s/tokenizer.json", path);
	} else {
		snprintf(file, sizeof file, "%s", path);
		snprintf(dir, sizeof dir, "%s", path);
		char *slash = strrchr(dir, '/');
		if (slash)
			*slash = 0;
		else
			snprintf(dir, sizeof dir, ".");
	}
	/* One read and json_loadb: json_load_file reads by getc, several times slower. */
	json_error_t jerr;
	size_t flen;
	char *fbuf;
	enum status rs = file_read_all(file, TOK_MAX_FILE_BYTES, &fbuf, &flen, e);
	if (rs != ST_OK)
		return e ? err_prefix(e, "tokenizer") : rs;
	json_t *root = json_loadb(fbuf, flen, 0, &jerr);
	free(fbuf);
	if (!root)
		return err_set(e, ST_INVALID, "tokenizer %s:%d: %s", file, jerr.line, jerr.text);
	struct model_tokenizer *tok = calloc(1, sizeof *tok);
	if (!tok) {
		json_decref(root);
		return err_set(e, ST_NOMEM, "tokenizer: out of memory");
	}
	uint32_t b2c[256];
	int16_t c2b[512];
	bytelevel_tables(b2c, c2b);
	enum status s = parse_model(tok, root, c2b, b2c, e);
	if (s == ST_OK)
		s = parse_pretok(tok, root, e);
	json_decref(root);
	if (s == ST_OK) {
		tok->cache = calloc(TOK_CACHE_SHARDS, sizeof *tok->cache);
		if (!tok->cache)
			s = err_set(e, ST_NOMEM, "tokenizer: out of memory (cache)");
		for (int k = 0; tok->cache && k < TOK_CACHE_SHARDS; k++)
			pthread_mutex_init(&tok->cache[k].mu, NULL);
	}
	if (s != ST_OK) {
		model_tokenizer_destroy(tok);
		return err_prefix(e, "tokenizer %s", file);
	}
	char cfgpath[4200];
	snprintf(cfgpath, sizeof cfgpath, "%s/tokenizer_config.json", dir);
	json_t *cfg = json_load_file(cfgpath, 0, &jerr); /* optional */
	tok->bos_id = config_token(tok, cfg, "bos_token", "<｜begin▁of▁sentence｜>");
	tok->eos_id = config_token(tok, cfg, "eos_token", "<｜end▁of▁sentence｜>");
	json_decref(cfg);
	log_msg(LOG_DEBUG, "model", "tokenizer %s: %d ids, %zu added, %d pre-tokenizer regexes, %.0f ms",
		file, tok->vocab_size, tok->n_added, tok->n_steps, (time_mono_s() - t0) * 1e3);
	*out = tok;
	return ST_OK;
}

void model_tokenizer_destroy(struct model_tokenizer *tok)
{
	if (!tok)
		return;
	for (int i = 0; i < tok->n_steps; i++)
		pcre2_code_free(tok->steps[i].re);
	if (tok->cache) {
		for (int k = 0; k < TOK_CACHE_SHARDS; k++)
			pthread_mutex_destroy(&tok->cache[k].mu);
		free(tok->cache);
	}
	free(tok->trie_raw.nodes);
	free(tok->trie_norm.nodes);
	free(tok->added);
	free(tok->merges);
	free(tok->str_map);
	free(tok->str_map_hash);
	free(tok->pieces);
	free(tok->strs);
	free(tok->id_flags);
	free(tok->piece_len);
	free(tok->piece_off);
	free(tok->str_off);
	free(tok);
}

/* ---- lookups ---- */

static bool id_ok(const struct model_tokenizer *tok, int32_t id)
{
	return id >= 0 && id < tok->vocab_size && (tok->id_flags[id] & TOK_ID_ASSIGNED);
}

const char *model_tokenizer_piece(const struct model_tokenizer *tok, int32_t id, size_t *len)
{
	if (!id_ok(tok, id)) {
		if (len)
			*len = 0;
		return NULL;
	}
	if (len)
		*len = tok->piece_len[id];
	return tok->pieces + tok->piece_off[id];
}

const char *model_tokenizer_token_str(const struct model_tokenizer *tok, int32_t id)
{
	return id_ok(tok, id) ? tok->strs + tok->str_off[id] : NULL;
}

int32_t model_tokenizer_token_to_id(const struct model_tokenizer *tok, const char *token)
{
	return token ? str_map_get(tok, token, strlen(token)) : -1;
}

int32_t model_tokenizer_vocab_size(const struct model_tokenizer *tok) { return tok->vocab_size; }
int32_t model_tokenizer_bos_id(const struct model_tokenizer *tok) { return tok->bos_id; }
int32_t model_tokenizer_eos_id(const struct model_tokenizer *tok) { return tok->eos_id; }

bool model_tokenizer_is_special(const struct model_tokenizer *tok, int32_t id)
{
	return id_ok(tok, id) && (tok->id_flags[id] & TOK_ID_SPECIAL);
}

/* ---- decode ---- */

enum status model_tokenizer_decode(const struct model_tokenizer *tok, const int32_t *ids, size_t n,
				   unsigned flags, char **text, size_t *len, struct err *e)
{
	*text = NULL;
	*len = 0;
	size_t raw_len = 0;
	for (size_t i = 0; i < n; i++) {
		if (!id_ok(tok, ids[i]))
			return err_set(e, ST_INVALID, "decode: id %d at %zu is not a token", ids[i], i);
		if ((flags & MODEL_TOK_DECODE_SKIP_SPECIAL) && (tok->id_flags[ids[i]] & TOK_ID_SPECIAL))
			continue;
		raw_len += tok->piece_len[ids[i]];
	}
	char *raw = malloc(raw_len + 1);
	if (!raw)
		return err_set(e, ST_NOMEM, "decode: out of memory (%zu bytes)", raw_len);
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		if ((flags & MODEL_TOK_DECODE_SKIP_SPECIAL) && (tok->id_flags[ids[i]] & TOK_ID_SPECIAL))
			continue;
		memcpy(raw + o, tok->pieces + tok->piece_off[ids[i]], tok->piece_len[ids[i]]);
		o += tok->piece_len[ids[i]];
	}
	raw[o] = 0;
	size_t valid = model_utf8_valid_prefix((const uint8_t *)raw, o);
	if ((flags & MODEL_TOK_DECODE_RAW) || valid == o) {
		*text = raw;
		*len = o;
		return ST_OK;
	}
	/* Replace each maximal invalid subpart by U+FFFD (at most 3x longer). */
	char *t = malloc(3 * o + 1);
	if (!t) {
		free(raw);
		return err_set(e, ST_NOMEM, "decode: out of memory (%zu bytes)", 3 * o);
	}
	memcpy(t, raw, valid);
	size_t w = valid;
	for (size_t i = valid; i < o;) {
		size_t l;
		if (model_utf8_classify((const uint8_t *)raw + i, o - i, &l) == 1) {
			memcpy(t + w, raw + i, l);
			w += l;
		} else {
			memcpy(t + w, "\xEF\xBF\xBD", 3);
			w += 3;
		}
		i += l;
	}
	t[w] = 0;
	free(raw);
	*text = t;
	*len = w;
	return ST_OK;
}
