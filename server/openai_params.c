/*
 * server/openai_params.c: parses and validates /v1/chat/completions,
 * /v1/completions, /tokenize and /detokenize bodies (jansson) into the
 * plain structs of openai_params.h.
 *
 * Every top-level key is looked up in one table (param_defs): one row per
 * parameter with its type, range, the endpoints it applies to and where its
 * value goes; one path checks them all (parse_param). A key in the
 * "ignored" rows (client bookkeeping with no effect here) is skipped;
 * anything else is a 400 naming it, so a client never gets behaviour it did
 * not ask for (style.md rule 5). Errors carry the parameter and OpenAI's
 * code as data (struct oai_error). The json_t tree is freed before
 * returning; strings are copied into the request's arena. Chat messages,
 * tools and response formats: openai_params_chat.c.
 */
#include "openai_params_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/limits.h"

/* ---- arena: a list of individually malloc'd blocks, freed together ---- */

void *oai__ar_alloc(struct oai_arena *a, size_t n)
{
	struct arena_blk *b = malloc(sizeof *b + (n ? n : 1));
	if (!b)
		return NULL;
	b->next = a->head;
	a->head = b;
	return b->align;
}

char *oai__ar_strndup(struct oai_arena *a, const char *s, size_t n)
{
	char *p = oai__ar_alloc(a, n + 1);
	if (p) {
		memcpy(p, s, n);
		p[n] = '\0';
	}
	return p;
}

static void ar_free(struct oai_arena *a)
{
	if (!a)
		return;
	while (a->head) {
		struct arena_blk *b = a->head;
		a->head = b->next;
		free(b);
	}
	free(a);
}

/* ---- errors ---- */

enum status oai_error_vset(struct oai_error *why, int status, enum status st, const char *param, const char *fmt,
			   va_list ap)
{
	why->status = st == ST_NOMEM ? 500 : status;
	snprintf(why->param, sizeof why->param, "%s", param ? param : "");
	vsnprintf(why->message, sizeof why->message, fmt, ap);
	return st;
}

enum status oai__fail(struct oai_error *why, enum status st, const char *param, const char *fmt, ...)
{
	why->code = st == ST_NOMEM ? NULL : st == ST_UNSUPPORTED ? "unsupported_value" : "invalid_value";
	va_list ap;
	va_start(ap, fmt);
	oai_error_vset(why, 400, st, param, fmt, ap);
	va_end(ap);
	return st;
}


/* ---- the parameter table: one row per parameter, one validation path ----
 *
 * Every top-level key goes through parse_param(): null is absent; a key
 * without a row for this endpoint is unknown_parameter; the row's type
 * (and range, for numbers) is checked by check_value() with the same
 * messages for every parameter; then the value is stored at the row's
 * offset (plain fields) or handed to the row's setter (structured ones,
 * which validate their insides with the same oai__fail()). Rules between
 * parameters come after all keys are read (check_combination). */

#define F_CHAT 1
#define F_COMPL 2
#define F_TOKENIZE 4
#define F_DETOKENIZE 8
#define F_GEN (F_CHAT | F_COMPL)

enum ptype {
	P_IGNORED = 0, /* accepted and ignored: client bookkeeping (docs/api.md) */
	P_BOOL, P_INT, P_NUM, P_STR, P_OBJECT, P_ARRAY,
	P_ANY,         /* the setter checks the shape (several JSON types allowed) */
};

/* Where a plain value goes: a field of struct oai_request at off. */
enum pstore { S_NONE = 0, S_BOOL, S_U32, S_I32, S_FLOAT, S_STR };

/* What a parse has seen so far (setters and the final checks). */
struct pctx {
	unsigned where;
	struct oai_request *r;
	struct oai_tokenize_request *tok;     /* F_TOKENIZE */
	struct oai_detokenize_request *detok; /* F_DETOKENIZE */
	struct oai_arena *arena;
	int32_t vocab;
	json_t *root;
	/* kept for the rules between parameters, read after all keys */
	json_t *max_completion, *reasoning, *messages, *top_lp, *thinking_obj, *stream_opts, *tokens;
	bool thinking_set, add_gen;
};

/* A value that passed its row's type and range check. */
struct pval {
	json_t *j;
	bool b;
	long long i;
	double d;
};

struct param_def;
typedef enum status (*param_set_fn)(struct pctx *c, const struct param_def *d, const struct pval *v,
				    struct oai_error *why);

struct param_def {
	const char *name;
	unsigned where;       /* F_* where the parameter exists */
	enum ptype type;
	double lo, hi;        /* P_INT / P_NUM: the range */
	bool lo_open;         /* (lo, hi] */
	enum pstore store;    /* plain: where the value goes ... */
	size_t off;           /* ... offsetof(struct oai_request, field) */
	param_set_fn set;     /* structured: the setter (store S_NONE) */
};

static enum status check_value(const struct param_def *d, json_t *v, struct pval *out, struct oai_error *why)
{
	const char *n = d->name;
	out->j = v;
	switch (d->type) {
	case P_BOOL:
		if (!json_is_boolean(v))
			return FAILC(why, "invalid_type", ST_INVALID, n, "'%s' must be a boolean", n);
		out->b = json_is_true(v);
		return ST_OK;
	case P_INT:
		if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
		    fabs(json_real_value(v)) < 9e15)
			out->i = (long long)json_real_value(v); /* 1.0 from clients that only have doubles */
		else if (json_is_integer(v))
			out->i = json_integer_value(v);
		else
			return FAILC(why, "invalid_type", ST_INVALID, n, "'%s' must be an integer", n);
		/* lo / hi as doubles hold every bound in use exactly (INT64 ones saturate) */
		if ((double)out->i < d->lo || (double)out->i > d->hi)
			return oai__fail(why, ST_INVALID, n, "'%s' must be in [%.0f, %.0f], got %lld", n, d->lo, d->hi, out->i);
		return ST_OK;
	case P_NUM:
		if (!json_is_number(v))
			return FAILC(why, "invalid_type", ST_INVALID, n, "'%s' must be a number", n);
		out->d = json_number_value(v);
		if (!isfinite(out->d) || out->d < d->lo || (d->lo_open && out->d <= d->lo) || out->d > d->hi)
			return oai__fail(why, ST_INVALID, n, "'%s' must be in %c%g, %g], got %g", n, d->lo_open ? '(' : '[', d->lo,
				    d->hi, out->d);
		return ST_OK;
	case P_STR:
		if (!json_is_string(v))
			return FAILC(why, "invalid_type", ST_INVALID, n, "'%s' must be a string", n);
		return ST_OK;
	case P_OBJECT:
		if (!json_is_object(v))
			return FAILC(why, "invalid_type", ST_INVALID, n, "'%s' must be an object", n);
		return ST_OK;
	case P_ARRAY:
		if (!json_is_array(v))
			return FAILC(why, "invalid_type", ST_INVALID, n, "'%s' must be an array", n);
		return ST_OK;
	case P_ANY:
	case P_IGNORED:
		return ST_OK;
	}
	return ST_OK;
}


/* ---- typed getters for nested values: the same check_value() as the table ---- */

enum status oai__get_bool(json_t *v, const char *name, bool *out, struct oai_error *why)
{
	const struct param_def d = {.name = name, .type = P_BOOL};
	struct pval x;
	if (check_value(&d, v, &x, why))
		return ST_INVALID;
	*out = x.b;
	return ST_OK;
}

enum status oai__get_num(json_t *v, const char *name, double lo, double hi, double *out, struct oai_error *why)
{
	const struct param_def d = {.name = name, .type = P_NUM, .lo = lo, .hi = hi};
	struct pval x;
	if (check_value(&d, v, &x, why))
		return ST_INVALID;
	*out = x.d;
	return ST_OK;
}

enum status oai__get_int(json_t *v, const char *name, long long lo, long long hi, long long *out,
			   struct oai_error *why)
{
	const struct param_def d = {.name = name, .type = P_INT, .lo = (double)lo, .hi = (double)hi};
	struct pval x;
	if (check_value(&d, v, &x, why))
		return ST_INVALID;
	*out = x.i;
	return ST_OK;
}

enum status oai__get_str(struct oai_arena *a, json_t *v, const char *name, const char **out, size_t *len,
			   bool allow_nul, struct oai_error *why)
{
	if (!json_is_string(v))
		return FAILC(why, "invalid_type", ST_INVALID, name, "'%s' must be a string", name);
	size_t n = json_string_length(v);
	const char *s = json_string_value(v);
	if (!allow_nul && strlen(s) != n)
		return oai__fail(why, ST_INVALID, name, "'%s' must not contain NUL characters", name);
	char *c = oai__ar_strndup(a, s, n);
	if (!c)
		return NOMEM(why);
	*out = c;
	if (len)
		*len = n;
	return ST_OK;
}

static uint64_t fnv1a(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
	return h ? h : 1;
}

/* ---- shared fields ---- */

static enum status parse_stop(struct oai_request *r, json_t *v, struct oai_error *why)
{
	json_t *one = NULL;
	size_t n = 1;
	if (json_is_string(v)) {
		one = v;
	} else if (json_is_array(v)) {
		n = json_array_size(v);
	} else {
		return oai__fail(why, ST_INVALID, "stop", "'stop' must be a string or an array of strings");
	}
	if (n > SCHED_MAX_STOP_STRINGS)
		return oai__fail(why, ST_INVALID, "stop", "at most %d stop strings, got %zu", SCHED_MAX_STOP_STRINGS, n);
	const char **s = oai__ar_alloc(r->arena, (n ? n : 1) * sizeof *s);
	if (!s)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *e = one ? one : json_array_get(v, i);
		size_t len;
		if (oai__get_str(r->arena, e, "stop", &s[i], &len, false, why))
			return ST_INVALID;
		if (len == 0 || len > SCHED_MAX_STOP_STRING_BYTES)
			return oai__fail(why, ST_INVALID, "stop", "each stop string must have 1..%d bytes",
				    SCHED_MAX_STOP_STRING_BYTES);
	}
	r->stop = s;
	r->n_stop = (uint32_t)n;
	return ST_OK;
}

static enum status parse_ids(struct oai_arena *a, json_t *v, const char *name, uint32_t max, int32_t vocab,
			     int32_t **out, uint32_t *n_out, struct oai_error *why)
{
	if (!json_is_array(v))
		return oai__fail(why, ST_INVALID, name, "'%s' must be an array of token ids", name);
	size_t n = json_array_size(v);
	if (n > max)
		return oai__fail(why, ST_INVALID, name, "'%s' has %zu entries, at most %u allowed", name, n, max);
	int32_t *ids = oai__ar_alloc(a, (n ? n : 1) * sizeof *ids);
	if (!ids)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		long long x = 0; /* -O3: gcc cannot see get_int set it on success */
		if (oai__get_int(json_array_get(v, i), name, 0, vocab - 1, &x, why))
			return ST_INVALID;
		ids[i] = (int32_t)x;
	}
	*out = ids;
	*n_out = (uint32_t)n;
	return ST_OK;
}

static enum status parse_logit_bias(struct oai_request *r, json_t *v, int32_t vocab, struct oai_error *why)
{
	if (!json_is_object(v))
		return oai__fail(why, ST_INVALID, "logit_bias", "'logit_bias' must be an object {\"token_id\": bias}");
	size_t n = json_object_size(v);
	if (n > SCHED_MAX_LOGIT_BIAS)
		return oai__fail(why, ST_INVALID, "logit_bias", "at most %d logit_bias entries, got %zu",
			    SCHED_MAX_LOGIT_BIAS, n);
	struct sched_logit_bias *b = oai__ar_alloc(r->arena, (n ? n : 1) * sizeof *b);
	if (!b)
		return NOMEM(why);
	const char *k;
	json_t *x;
	size_t i = 0;
	json_object_foreach(v, k, x) {
		char *end = NULL;
		long id = strtol(k, &end, 10);
		if (!k[0] || *end || id < 0 || id >= vocab)
			return oai__fail(why, ST_INVALID, "logit_bias", "logit_bias key '%.40s' is not a token id in [0, %d)",
				    k, vocab);
		double d = 0; /* -O3: see above */
		if (oai__get_num(x, "logit_bias", -100, 100, &d, why))
			return ST_INVALID;
		b[i].token_id = (int32_t)id;
		b[i].bias = (float)d;
		i++;
	}
	r->sampling.logit_bias = b;
	r->sampling.n_logit_bias = (uint32_t)n;
	return ST_OK;
}

static enum status parse_prompt(struct oai_request *r, json_t *v, int32_t vocab, struct oai_error *why)
{
	/* string | [int] | [string] | [[int]] */
	size_t n = 1;
	bool list = false;
	if (json_is_array(v) && json_array_size(v) && !json_is_integer(json_array_get(v, 0))) {
		list = true;
		n = json_array_size(v);
	} else if (!json_is_string(v) && !json_is_array(v)) {
		return oai__fail(why, ST_INVALID, "prompt", "'prompt' must be a string, an array of token ids, or an array of those");
	}
	if (n > OAI_MAX_PROMPTS)
		return oai__fail(why, ST_INVALID, "prompt", "at most %d prompts per request, got %zu", OAI_MAX_PROMPTS, n);
	struct oai_prompt *ps = oai__ar_alloc(r->arena, n * sizeof *ps);
	if (!ps)
		return NOMEM(why);
	for (size_t i = 0; i < n; i++) {
		json_t *p = list ? json_array_get(v, i) : v;
		memset(&ps[i], 0, sizeof ps[i]);
		if (json_is_string(p)) {
			if (oai__get_str(r->arena, p, "prompt", &ps[i].text, &ps[i].text_len, true, why))
				return ST_INVALID;
		} else if (json_is_array(p)) {
			int32_t *ids;
			if (parse_ids(r->arena, p, "prompt", OAI_MAX_PROMPT_IDS, vocab, &ids, &ps[i].n_ids, why))
				return why->status == 500 ? ST_NOMEM : ST_INVALID;
			if (!ps[i].n_ids)
				return oai__fail(why, ST_INVALID, "prompt", "a token-id prompt must not be empty");
			ps[i].ids = ids;
		} else {
			return oai__fail(why, ST_INVALID, "prompt", "each prompt must be a string or an array of token ids");
		}
	}
	r->prompts = ps;
	r->n_prompts = (uint32_t)n;
	return ST_OK;
}

/* ---- hardening: a bound on what parsing one body may allocate ---- */
/* True when body holds more than OAI_MAX_JSON_VALUES values (counted as
 * separators and openings outside strings; an upper bound, cheap). */
static bool too_many_values(const char *body, size_t len)
{
	size_t n = 1;
	bool in_str = false;
	for (size_t i = 0; i < len; i++) {
		char c = body[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = false;
		} else if (c == '"') {
			in_str = true;
		} else if (c == ',' || c == '[' || c == '{') {
			if (++n > OAI_MAX_JSON_VALUES)
				return true;
		}
	}
	return false;
}

static enum status store_value(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	char *f = (char *)c->r + d->off;
	switch (d->store) {
	case S_BOOL: *(bool *)f = v->b; break;
	case S_U32: *(uint32_t *)f = (uint32_t)v->i; break;
	case S_I32: *(int32_t *)f = (int32_t)v->i; break;
	case S_FLOAT: *(float *)f = (float)v->d; break;
	case S_STR: return oai__get_str(c->arena, v->j, d->name, (const char **)f, NULL, false, why);
	case S_NONE: break;
	}
	return ST_OK;
}

/* ---- setters of the structured parameters ---- */

static enum status set_stream_options(struct pctx *c, const struct param_def *d, const struct pval *v,
				      struct oai_error *why)
{
	(void)d;
	c->stream_opts = v->j;
	const char *sk;
	json_t *sv;
	bool bv = false;
	json_object_foreach(v->j, sk, sv) {
		if (json_is_null(sv))
			continue;
		enum status st;
		if (!strcmp(sk, "include_usage")) {
			st = oai__get_bool(sv, "stream_options.include_usage", &c->r->include_usage, why);
		} else if (!strcmp(sk, "continuous_usage_stats") || !strcmp(sk, "include_obfuscation")) {
			st = oai__get_bool(sv, sk, &bv, why);
			if (!st && bv && sk[0] == 'c')
				st = oai__fail(why, ST_UNSUPPORTED, "stream_options.continuous_usage_stats",
					  "stream_options.continuous_usage_stats is not supported");
		} else {
			st = oai__fail(why, ST_UNSUPPORTED, "stream_options", "unsupported stream_options.%.40s", sk);
		}
		if (st)
			return st;
	}
	return ST_OK;
}

static enum status set_max_tokens(struct pctx *c, const struct param_def *d, const struct pval *v,
				  struct oai_error *why)
{
	(void)d;
	(void)why;
	if (!c->max_completion) { /* max_completion_tokens wins */
		c->r->max_tokens = (uint32_t)v->i;
		c->r->score_only = v->i == 0; /* 0: score the prompt only (vLLM; checked below) */
	}
	return ST_OK;
}

static enum status set_max_completion(struct pctx *c, const struct param_def *d, const struct pval *v,
				      struct oai_error *why)
{
	(void)d;
	(void)why;
	c->max_completion = v->j;
	c->r->max_tokens = (uint32_t)v->i;
	c->r->score_only = false;
	return ST_OK;
}

static enum status set_prompt_logprobs(struct pctx *c, const struct param_def *d, const struct pval *v,
				       struct oai_error *why)
{
	(void)d;
	(void)why;
	c->r->prompt_logprobs = true;
	c->r->prompt_top_logprobs = (uint32_t)v->i;
	return ST_OK;
}

static enum status set_top_k(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	(void)d;
	(void)why;
	c->r->sampling.top_k = v->i <= 0 ? 0 : (int32_t)v->i; /* -1 and 0: off */
	return ST_OK;
}

static enum status set_seed(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	(void)d;
	(void)why;
	c->r->sampling.seed = (uint64_t)v->i;
	c->r->has_seed = true;
	return ST_OK;
}

static enum status set_logit_bias(struct pctx *c, const struct param_def *d, const struct pval *v,
				  struct oai_error *why)
{
	(void)d;
	return parse_logit_bias(c->r, v->j, c->vocab, why);
}

static enum status set_stop(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	(void)d;
	return parse_stop(c->r, v->j, why);
}

static enum status set_stop_token_ids(struct pctx *c, const struct param_def *d, const struct pval *v,
				      struct oai_error *why)
{
	int32_t *ids = NULL;
	enum status st = parse_ids(c->arena, v->j, d->name, SCHED_MAX_STOP_TOKEN_IDS, c->vocab, &ids,
				   &c->r->n_stop_token_ids, why);
	c->r->stop_token_ids = ids;
	return st;
}

/* Chat: "logprobs": bool (+ top_logprobs); completions: "logprobs": k. */
static enum status set_logprobs(struct pctx *c, const struct param_def *d, const struct pval *v,
				struct oai_error *why)
{
	struct pval x;
	if (c->where == F_CHAT) {
		const struct param_def b = {.name = d->name, .type = P_BOOL};
		if (check_value(&b, v->j, &x, why))
			return ST_INVALID;
		c->r->logprobs = x.b;
		return ST_OK;
	}
	const struct param_def k = {.name = d->name, .type = P_INT, .lo = 0, .hi = SCHED_MAX_TOP_LOGPROBS};
	if (check_value(&k, v->j, &x, why))
		return ST_INVALID;
	c->r->logprobs = true;
	c->r->top_logprobs = (uint32_t)x.i;
	return ST_OK;
}

static enum status set_top_logprobs(struct pctx *c, const struct param_def *d, const struct pval *v,
				    struct oai_error *why)
{
	(void)d;
	(void)why;
	c->top_lp = v->j;
	c->r->top_logprobs = (uint32_t)v->i;
	return ST_OK;
}

static enum status set_cache_salt(struct pctx *c, const struct param_def *d, const struct pval *v,
				  struct oai_error *why)
{
	const char *s;
	size_t n;
	enum status st = oai__get_str(c->arena, v->j, d->name, &s, &n, true, why);
	if (!st)
		c->r->cache_salt = fnv1a(s, n);
	return st;
}

static enum status set_false_unsupported(struct pctx *c, const struct param_def *d, const struct pval *v,
					 struct oai_error *why)
{
	(void)c;
	if (v->b)
		return ST_OK;
	return oai__fail(why, ST_UNSUPPORTED, d->name, "%s=false is not supported (the model may emit several calls)",
		    d->name);
}

static enum status set_nothing(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	/* spaces_between_special_tokens: vLLM's fast-tokenizer detokenizer (this
	 * model's) joins special tokens' text without spaces whatever it says */
	(void)c;
	(void)d;
	(void)v;
	(void)why;
	return ST_OK;
}

static enum status set_format(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	return oai__parse_format(c->r, d->name, v->j, why);
}

static enum status set_messages(struct pctx *c, const struct param_def *d, const struct pval *v,
				struct oai_error *why)
{
	(void)d;
	(void)why;
	c->messages = v->j; /* parsed once continue_final_message is known */
	return ST_OK;
}

static enum status set_tools(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	(void)d;
	return oai__parse_tools(c->r, v->j, why);
}

static enum status set_tool_choice(struct pctx *c, const struct param_def *d, const struct pval *v,
				   struct oai_error *why)
{
	(void)d;
	return oai__parse_tool_choice(c->r, v->j, why);
}

static enum status set_template_kwargs(struct pctx *c, const struct param_def *d, const struct pval *v,
				       struct oai_error *why)
{
	(void)d;
	return oai__parse_template_kwargs(c->r, v->j, &c->thinking_set, why);
}

static enum status set_reasoning_effort(struct pctx *c, const struct param_def *d, const struct pval *v,
					struct oai_error *why)
{
	(void)d;
	(void)why;
	c->reasoning = v->j;
	return ST_OK;
}

static enum status set_thinking(struct pctx *c, const struct param_def *d, const struct pval *v,
				struct oai_error *why)
{
	const char *t = json_string_value(json_object_get(v->j, "type"));
	if (!json_is_boolean(v->j) &&
	    (!json_is_object(v->j) || !t || (strcmp(t, "enabled") && strcmp(t, "disabled"))))
		return oai__fail(why, ST_INVALID, d->name, "'thinking' must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}");
	c->thinking_obj = v->j;
	return ST_OK;
}

static enum status set_add_generation_prompt(struct pctx *c, const struct param_def *d, const struct pval *v,
					     struct oai_error *why)
{
	(void)d;
	(void)why;
	c->add_gen = v->b;
	return ST_OK;
}

static enum status set_modalities(struct pctx *c, const struct param_def *d, const struct pval *v,
				  struct oai_error *why)
{
	(void)c;
	const char *m = json_string_value(json_array_get(v->j, 0));
	if (json_array_size(v->j) != 1 || !m || strcmp(m, "text"))
		return oai__fail(why, ST_UNSUPPORTED, d->name, "only modalities [\"text\"] is supported");
	return ST_OK;
}

static enum status set_prompt(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	if (c->where == F_TOKENIZE)
		return oai__get_str(c->arena, v->j, d->name, &c->tok->prompt, &c->tok->prompt_len, true, why);
	return parse_prompt(c->r, v->j, c->vocab, why);
}

static enum status set_suffix(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	(void)c;
	if (json_string_length(v->j))
		return oai__fail(why, ST_UNSUPPORTED, d->name, "'suffix' is not supported");
	return ST_OK;
}

static enum status set_best_of(struct pctx *c, const struct param_def *d, const struct pval *v, struct oai_error *why)
{
	json_t *nv = json_object_get(c->root, "n");
	long long n = json_is_integer(nv) ? json_integer_value(nv) : 1;
	if (v->i != 1 && v->i != n)
		return oai__fail(why, ST_UNSUPPORTED, d->name, "'best_of' other than n is not supported");
	return ST_OK;
}

static enum status set_tokenize_flag(struct pctx *c, const struct param_def *d, const struct pval *v,
				     struct oai_error *why)
{
	(void)why;
	if (c->tok && !strcmp(d->name, "add_special_tokens"))
		c->tok->add_special_tokens = v->b;
	else if (c->tok)
		c->tok->return_token_strs = v->b;
	return ST_OK;
}

static enum status set_detok_tokens(struct pctx *c, const struct param_def *d, const struct pval *v,
				    struct oai_error *why)
{
	(void)d;
	(void)why;
	c->tokens = v->j;
	return ST_OK;
}

#define OFF(field) offsetof(struct oai_request, field)
#define PLAIN(name, where, type, lo, hi, store, field) {name, where, type, lo, hi, false, store, OFF(field), NULL}
#define SETTER(name, where, type, lo, hi, fn) {name, where, type, lo, hi, false, S_NONE, 0, fn}
#define IGNORED(name, where) {name, where, P_IGNORED, 0, 0, false, S_NONE, 0, NULL}

static const struct param_def param_defs[] = {
	PLAIN("model", F_GEN | F_TOKENIZE | F_DETOKENIZE, P_STR, 0, 0, S_STR, model),
	PLAIN("stream", F_GEN, P_BOOL, 0, 0, S_BOOL, stream),
	SETTER("stream_options", F_GEN, P_OBJECT, 0, 0, set_stream_options),
	PLAIN("n", F_GEN, P_INT, 1, SCHED_MAX_N, S_U32, n),
	SETTER("max_tokens", F_GEN, P_INT, 0, OAI_MAX_TOKENS_PARAM, set_max_tokens),
	SETTER("max_completion_tokens", F_CHAT, P_INT, 1, OAI_MAX_TOKENS_PARAM, set_max_completion),
	PLAIN("temperature", F_GEN, P_NUM, 0, 2, S_FLOAT, sampling.temperature),
	{"top_p", F_GEN, P_NUM, 0, 1, true, S_FLOAT, OFF(sampling.top_p), NULL},
	SETTER("top_k", F_GEN, P_INT, -1, 1 << 30, set_top_k),
	PLAIN("min_p", F_GEN, P_NUM, 0, 1, S_FLOAT, sampling.min_p),
	SETTER("seed", F_GEN, P_INT, (double)INT64_MIN, (double)INT64_MAX, set_seed),
	PLAIN("presence_penalty", F_GEN, P_NUM, -2, 2, S_FLOAT, sampling.presence_penalty),
	PLAIN("frequency_penalty", F_GEN, P_NUM, -2, 2, S_FLOAT, sampling.frequency_penalty),
	{"repetition_penalty", F_GEN, P_NUM, 0, 2, true, S_FLOAT, OFF(sampling.repetition_penalty), NULL},
	SETTER("logit_bias", F_GEN, P_OBJECT, 0, 0, set_logit_bias),
	SETTER("stop", F_GEN, P_ANY, 0, 0, set_stop),
	SETTER("stop_token_ids", F_GEN, P_ARRAY, 0, 0, set_stop_token_ids),
	PLAIN("ignore_eos", F_GEN, P_BOOL, 0, 0, S_BOOL, ignore_eos),
	SETTER("logprobs", F_GEN, P_ANY, 0, 0, set_logprobs),
	SETTER("prompt_logprobs", F_GEN, P_INT, 0, SCHED_MAX_TOP_LOGPROBS, set_prompt_logprobs),
	SETTER("top_logprobs", F_CHAT, P_INT, 0, SCHED_MAX_TOP_LOGPROBS, set_top_logprobs),
	PLAIN("priority", F_GEN, P_INT, INT32_MIN, INT32_MAX, S_I32, priority),
	SETTER("cache_salt", F_GEN, P_STR, 0, 0, set_cache_salt),
	PLAIN("min_tokens", F_GEN, P_INT, 0, OAI_MAX_TOKENS_PARAM, S_U32, min_tokens),
	PLAIN("include_stop_str_in_output", F_GEN, P_BOOL, 0, 0, S_BOOL, include_stop_str_in_output),
	PLAIN("skip_special_tokens", F_GEN, P_BOOL, 0, 0, S_BOOL, skip_special_tokens),
	SETTER("spaces_between_special_tokens", F_GEN, P_BOOL, 0, 0, set_nothing),
	SETTER("parallel_tool_calls", F_CHAT, P_BOOL, 0, 0, set_false_unsupported),
	SETTER("response_format", F_GEN, P_ANY, 0, 0, set_format),
	SETTER("guided_json", F_GEN, P_ANY, 0, 0, set_format),
	SETTER("guided_choice", F_GEN, P_ANY, 0, 0, set_format),
	SETTER("structured_outputs", F_GEN, P_ANY, 0, 0, set_format),
	/* chat */
	SETTER("messages", F_CHAT | F_TOKENIZE, P_ANY, 0, 0, set_messages),
	SETTER("tools", F_CHAT | F_TOKENIZE, P_ARRAY, 0, 0, set_tools),
	SETTER("tool_choice", F_CHAT | F_TOKENIZE, P_ANY, 0, 0, set_tool_choice),
	SETTER("chat_template_kwargs", F_CHAT | F_TOKENIZE, P_OBJECT, 0, 0, set_template_kwargs),
	SETTER("reasoning_effort", F_CHAT | F_TOKENIZE, P_STR, 0, 0, set_reasoning_effort),
	SETTER("thinking", F_CHAT | F_TOKENIZE, P_ANY, 0, 0, set_thinking),
	PLAIN("include_reasoning", F_CHAT, P_BOOL, 0, 0, S_BOOL, include_reasoning),
	SETTER("add_generation_prompt", F_CHAT | F_TOKENIZE, P_BOOL, 0, 0, set_add_generation_prompt),
	PLAIN("continue_final_message", F_CHAT | F_TOKENIZE, P_BOOL, 0, 0, S_BOOL, continue_final),
	SETTER("modalities", F_CHAT, P_ARRAY, 0, 0, set_modalities),
	/* completions */
	SETTER("prompt", F_COMPL | F_TOKENIZE, P_ANY, 0, 0, set_prompt),
	PLAIN("echo", F_COMPL, P_BOOL, 0, 0, S_BOOL, echo),
	SETTER("suffix", F_COMPL, P_STR, 0, 0, set_suffix),
	SETTER("best_of", F_COMPL, P_INT, 1, SCHED_MAX_N, set_best_of),
	/* tokenize, detokenize */
	SETTER("add_special_tokens", F_GEN | F_TOKENIZE, P_BOOL, 0, 0, set_tokenize_flag),
	SETTER("return_token_strs", F_TOKENIZE, P_BOOL, 0, 0, set_tokenize_flag),
	SETTER("tokens", F_DETOKENIZE, P_ANY, 0, 0, set_detok_tokens),
	/* Client bookkeeping that changes nothing for one local model (docs/api.md). */
	IGNORED("user", F_GEN | F_TOKENIZE),
	IGNORED("metadata", F_GEN),
	IGNORED("store", F_GEN),
	IGNORED("service_tier", F_GEN),
	IGNORED("request_id", F_GEN),
	IGNORED("safety_identifier", F_GEN),
	IGNORED("prompt_cache_key", F_GEN),
};

static const struct param_def *find_param(const char *name, unsigned where)
{
	for (size_t i = 0; i < sizeof param_defs / sizeof param_defs[0]; i++)
		if (!strcmp(param_defs[i].name, name) && (param_defs[i].where & where))
			return &param_defs[i];
	return NULL;
}

/* One top-level key: the one validation path. */
static enum status parse_param(struct pctx *c, const char *k, json_t *v, struct oai_error *why)
{
	if (json_is_null(v)) /* null means absent, for every field (docs/api.md) */
		return ST_OK;
	const struct param_def *d = find_param(k, c->where);
	if (!d) {
		oai__fail(why, ST_UNSUPPORTED, k, "unsupported parameter '%.60s'%s", k,
		     find_param(k, F_GEN | F_TOKENIZE | F_DETOKENIZE) ? " for this endpoint" : "");
		why->code = "unknown_parameter";
		return ST_UNSUPPORTED;
	}
	struct pval pv = {0};
	enum status st = d->type == P_IGNORED ? ST_OK : check_value(d, v, &pv, why);
	if (!st && d->store)
		st = store_value(c, d, &pv, why);
	else if (!st && d->set)
		st = d->set(c, d, &pv, why);
	return st;
}

/* The rules between parameters, once every key is read. */
static enum status check_combination(struct pctx *c, struct oai_error *why)
{
	struct oai_request *r = c->r;
	enum status st;
	if (c->thinking_obj && !c->thinking_set) {
		if (json_is_boolean(c->thinking_obj))
			r->thinking = json_is_true(c->thinking_obj);
		else
			r->thinking = !strcmp(json_string_value(json_object_get(c->thinking_obj, "type")), "enabled");
		c->thinking_set = true;
	}
	if (c->reasoning) {
		bool explicit_thinking = r->thinking;
		if ((st = oai__reasoning_effort(r, json_string_value(c->reasoning), why)))
			return st;
		if (c->thinking_set) /* an explicit switch wins over the effort's implied one */
			r->thinking = explicit_thinking;
	}
	if (!r->thinking)
		r->effort = MODEL_CHAT_EFFORT_NONE;
	if (r->tool_choice == OAI_TOOL_NONE)
		r->tools_json = NULL;
	bool forced = r->tool_choice == OAI_TOOL_REQUIRED || r->tool_choice == OAI_TOOL_NAMED;
	if (forced && !r->tools_json)
		return oai__fail(why, ST_INVALID, "tool_choice", "tool_choice \"required\" or a named function needs 'tools'");
	if (forced && r->format)
		return oai__fail(why, ST_UNSUPPORTED, "tool_choice",
			    "tool_choice \"required\" or a named function cannot be combined with a response format");
	if (c->where & (F_CHAT | F_TOKENIZE)) {
		if (!c->messages && c->where == F_CHAT)
			return FAILC(why, "missing_required_parameter", ST_INVALID, "messages", "'messages' is required");
		if (!c->add_gen && !r->continue_final)
			return oai__fail(why, ST_UNSUPPORTED, "add_generation_prompt",
				    "add_generation_prompt=false is only supported with continue_final_message=true");
		if (c->messages && (st = oai__parse_messages(r, c->messages, why)))
			return st;
		if (r->continue_final && r->messages[r->n_messages - 1].role != MODEL_CHAT_ROLE_ASSISTANT)
			return oai__fail(why, ST_INVALID, "continue_final_message",
				    "continue_final_message needs an assistant message last");
	}
	if (c->stream_opts && !r->stream)
		return oai__fail(why, ST_INVALID, "stream_options", "'stream_options' is only allowed with \"stream\": true");
	if (r->max_tokens && r->min_tokens > r->max_tokens)
		return oai__fail(why, ST_INVALID, "min_tokens", "'min_tokens' (%u) must not exceed max_tokens (%u)",
			    r->min_tokens, r->max_tokens);
	if (c->where == F_CHAT && c->top_lp && r->top_logprobs && !r->logprobs)
		return oai__fail(why, ST_INVALID, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
	if (c->where == F_COMPL && !r->n_prompts)
		return FAILC(why, "missing_required_parameter", ST_INVALID, "prompt", "'prompt' is required");
	if (r->score_only && !r->prompt_logprobs && !r->echo)
		return oai__fail(why, ST_INVALID, "max_tokens",
			    "'max_tokens' 0 scores the prompt only: it needs 'echo' or 'prompt_logprobs'");
	if (r->prompt_logprobs && r->stream && c->where == F_CHAT)
		return oai__fail(why, ST_UNSUPPORTED, "prompt_logprobs",
			    "'prompt_logprobs' with \"stream\": true is supported on /v1/completions only");
	if (c->where == F_TOKENIZE && !c->tok->prompt && !c->messages)
		return FAILC(why, "missing_required_parameter", ST_INVALID, "prompt", "'prompt' or 'messages' is required");
	if (c->where == F_TOKENIZE && c->tok->prompt && c->messages)
		return oai__fail(why, ST_INVALID, "prompt", "give either 'prompt' or 'messages', not both");
	if (c->where == F_DETOKENIZE && !c->tokens)
		return FAILC(why, "missing_required_parameter", ST_INVALID, "tokens", "'tokens' is required");
	r->sampling.logprobs = r->logprobs;
	r->sampling.top_logprobs = r->logprobs ? r->top_logprobs : 0;
	return ST_OK;
}

/* The shared parser. c->where says the endpoint; c->r (and c->tok / c->detok) receive the values. */
static enum status parse_body(struct pctx *c, const char *body, size_t len, struct oai_error *why)
{
	memset(why, 0, sizeof *why);
	if (too_many_values(body, len))
		return FAILC(why, "invalid_json", ST_INVALID, "", "request body holds more than %u JSON values",
			     OAI_MAX_JSON_VALUES);
	json_error_t je;
	c->root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
	if (!c->root)
		return FAILC(why, "invalid_json", ST_INVALID, "", "request body is not valid JSON: %s (line %d, column %d)",
			     je.text, je.line, je.column);
	enum status st = ST_OK;
	if (!json_is_object(c->root)) {
		st = FAILC(why, "invalid_json", ST_INVALID, "", "request body must be a JSON object");
	} else {
		/* Defaults (OpenAI's). */
		struct oai_request *r = c->r;
		r->n = 1;
		r->sampling.temperature = 1.0f;
		r->sampling.top_p = 1.0f;
		r->sampling.repetition_penalty = 1.0f;
		r->skip_special_tokens = true;
		r->include_reasoning = true;
		c->add_gen = true;
		const char *k;
		json_t *v;
		json_object_foreach(c->root, k, v) {
			if ((st = parse_param(c, k, v, why)))
				break;
		}
		if (!st)
			st = check_combination(c, why);
		if (!st && c->where == F_DETOKENIZE) {
			int32_t *ids;
			st = parse_ids(c->arena, c->tokens, "tokens", OAI_MAX_PROMPT_IDS, c->vocab, &ids, &c->detok->n_tokens,
				       why);
			if (!st && !(c->detok->tokens = malloc((c->detok->n_tokens ? c->detok->n_tokens : 1) * sizeof *ids)))
				st = NOMEM(why);
			if (!st)
				memcpy(c->detok->tokens, ids, c->detok->n_tokens * sizeof *ids);
		}
	}
	json_decref(c->root);
	c->root = NULL;
	return st;
}

enum status oai_parse_request(enum oai_kind kind, const char *body, size_t len, int32_t vocab_size,
			      struct oai_request *out, struct oai_error *why)
{
	memset(out, 0, sizeof *out);
	out->kind = kind;
	out->arena = calloc(1, sizeof *out->arena);
	if (!out->arena)
		return oai__fail(why, ST_NOMEM, "", "out of memory");
	struct pctx c = {.where = kind == OAI_CHAT ? F_CHAT : F_COMPL, .r = out, .arena = out->arena,
			 .vocab = vocab_size};
	enum status st = parse_body(&c, body, len, why);
	if (st)
		oai_request_free(out);
	return st;
}

void oai_request_free(struct oai_request *r)
{
	if (!r)
		return;
	ar_free(r->arena);
	memset(r, 0, sizeof *r);
}

enum status oai_parse_tokenize(const char *body, size_t len, struct oai_tokenize_request *out,
			       struct oai_error *why)
{
	memset(out, 0, sizeof *out);
	out->add_special_tokens = true;
	out->arena = calloc(1, sizeof *out->arena);
	if (!out->arena)
		return oai__fail(why, ST_NOMEM, "", "out of memory");
	out->chat.kind = OAI_CHAT;
	out->chat.arena = out->arena;
	struct pctx c = {.where = F_TOKENIZE, .r = &out->chat, .tok = out, .arena = out->arena, .vocab = INT32_MAX};
	enum status st = parse_body(&c, body, len, why);
	if (st) {
		oai_tokenize_request_free(out);
		return st;
	}
	out->model = out->chat.model;
	out->is_chat = out->chat.n_messages > 0;
	return ST_OK;
}

void oai_tokenize_request_free(struct oai_tokenize_request *r)
{
	if (!r)
		return;
	ar_free(r->arena);
	memset(r, 0, sizeof *r);
}

enum status oai_parse_detokenize(const char *body, size_t len, int32_t vocab_size,
				 struct oai_detokenize_request *out, struct oai_error *why)
{
	memset(out, 0, sizeof *out);
	struct oai_request r = {0}; /* the table's target; only its model is kept */
	if (!(r.arena = calloc(1, sizeof *r.arena)))
		return oai__fail(why, ST_NOMEM, "", "out of memory");
	struct pctx c = {.where = F_DETOKENIZE, .r = &r, .detok = out, .arena = r.arena, .vocab = vocab_size};
	enum status st = parse_body(&c, body, len, why);
	if (!st && r.model && !(out->model = out->model_buf = strdup(r.model)))
		st = NOMEM(why);
	oai_request_free(&r);
	if (st)
		oai_detokenize_request_free(out);
	return st;
}

void oai_detokenize_request_free(struct oai_detokenize_request *r)
{
	if (!r)
		return;
	free(r->tokens);
	free(r->model_buf);
	memset(r, 0, sizeof *r);
}

void oai_chat_options(const struct oai_request *r, struct model_chat_options *opt)
{
	memset(opt, 0, sizeof *opt);
	opt->thinking = r->thinking;
	opt->effort = r->effort;
	opt->tools_json = r->tools_json;
	opt->response_format_json = r->response_format_json;
	opt->continue_final = r->continue_final;
}
