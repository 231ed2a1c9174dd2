/*
 * model/gram_compile.c: builds grammars (model/gram_internal.h) from a JSON
 * Schema, from "any JSON object", from a list of choices and from an OpenAI
 * tool list (the DSML tool-call block of model/output_parser.h).
 *
 * Compile is bounded: GRAM_MAX_NODES nodes, GRAM_MAX_LIT_BYTES literal bytes
 * and GRAM_MAX_SCHEMA_DEPTH nested subschemas; $ref targets are compiled
 * once (a REF node), so recursive schemas compile to cyclic grammars. Enum
 * values are merged into a prefix tree so that the automaton stays
 * deterministic over them.
 */
#include "model/gram_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define DSML "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"

struct ref_memo {
	char *ptr;
	uint32_t node;
};

struct gb {
	struct gram *g;
	struct err *e;
	enum status st;
	json_t *root;
	struct ref_memo *refs;
	uint32_t n_refs, cap_refs;
	uint32_t any, ws, str_q;
	bool dsml; /* inside a DSML block: strings and raw values must not contain "｜DSML｜" */
};

static uint32_t fail(struct gb *b, enum status st, const char *msg, const char *arg)
{
	if (!b->st) {
		b->st = st;
		err_set(b->e, st, msg, arg ? arg : "");
	}
	return GRAM__NONE;
}

static uint32_t node_new(struct gb *b, enum gram__kind k, uint32_t a, uint32_t n, uint32_t lo, uint32_t hi)
{
	if (b->st)
		return GRAM__NONE;
	struct gram *g = b->g;
	if (g->n_nodes >= GRAM_MAX_NODES)
		return fail(b, ST_INVALID, "schema too large: more than 200000 grammar nodes%s", NULL);
	if (g->n_nodes == g->cap_nodes) {
		uint32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 256;
		struct gram__node *p = realloc(g->nodes, cap * sizeof *p);
		if (!p)
			return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
		g->nodes = p;
		g->cap_nodes = cap;
	}
	g->nodes[g->n_nodes] = (struct gram__node){.kind = (uint8_t)k, .a = a, .b = n, .lo = lo, .hi = hi};
	return g->n_nodes++;
}

static uint32_t lit(struct gb *b, const char *s, size_t n)
{
	struct gram *g = b->g;
	if (b->st)
		return GRAM__NONE;
	if (n == 0)
		return node_new(b, GRAM__EMPTY, 0, 0, 0, 0);
	if (g->n_bytes + n > GRAM_MAX_LIT_BYTES)
		return fail(b, ST_INVALID, "schema too large: more than 4 MiB of literal text%s", NULL);
	if (g->n_bytes + n > g->cap_bytes) {
		uint32_t cap = g->cap_bytes ? g->cap_bytes : 1024;
		while (cap < g->n_bytes + n)
			cap *= 2;
		uint8_t *p = realloc(g->bytes, cap);
		if (!p)
			return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
		g->bytes = p;
		g->cap_bytes = cap;
	}
	memcpy(g->bytes + g->n_bytes, s, n);
	uint32_t r = node_new(b, GRAM__LIT, g->n_bytes, (uint32_t)n, 0, 0);
	g->n_bytes += (uint32_t)n;
	return r;
}

static uint32_t lits(struct gb *b, const char *s) { return lit(b, s, strlen(s)); }

static uint32_t list(struct gb *b, enum gram__kind k, const uint32_t *kids, uint32_t n)
{
	struct gram *g = b->g;
	if (b->st)
		return GRAM__NONE;
	for (uint32_t i = 0; i < n; i++)
		if (kids[i] == GRAM__NONE)
			return fail(b, ST_INVALID, "grammar: bad node%s", NULL);
	if (n == 1)
		return kids[0];
	if (g->n_kids + n > g->cap_kids) {
		uint32_t cap = g->cap_kids ? g->cap_kids : 256;
		while (cap < g->n_kids + n)
			cap *= 2;
		uint32_t *p = realloc(g->kids, cap * sizeof *p);
		if (!p)
			return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
		g->kids = p;
		g->cap_kids = cap;
	}
	memcpy(g->kids + g->n_kids, kids, n * sizeof *kids);
	uint32_t r = node_new(b, k, g->n_kids, n, 0, 0);
	g->n_kids += n;
	return r;
}

#define SEQ(b, ...) list(b, GRAM__SEQ, (uint32_t[]){__VA_ARGS__}, sizeof((uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))
#define ALT(b, ...) list(b, GRAM__ALT, (uint32_t[]){__VA_ARGS__}, sizeof((uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))

static uint32_t star(struct gb *b, uint32_t kid, uint32_t lo, uint32_t hi)
{
	if (kid == GRAM__NONE)
		return fail(b, ST_INVALID, "grammar: bad node%s", NULL);
	return node_new(b, GRAM__STAR, kid, 0, lo, hi);
}

static uint32_t ws(struct gb *b)
{
	if (b->ws == GRAM__NONE)
		b->ws = node_new(b, GRAM__WS, 0, 0, 0, 0);
	return b->ws;
}

static uint32_t str_q(struct gb *b)
{
	if (b->str_q == GRAM__NONE) {
		uint32_t body = node_new(b, GRAM__STR, 0, 0, 0, 0);
		if (b->dsml && body != GRAM__NONE) { /* the output parser would take it for markup */
			uint32_t x = lits(b, DSML);
			if (x != GRAM__NONE)
				b->g->nodes[body].a = b->g->nodes[x].a, b->g->nodes[body].b = b->g->nodes[x].b;
		}
		b->str_q = SEQ(b, lits(b, "\""), body, lits(b, "\""));
	}
	return b->str_q;
}

/* '[' items ']' with lo..hi items (hi UINT32_MAX: unbounded). */
static uint32_t array_of(struct gb *b, uint32_t item, uint32_t lo, uint32_t hi)
{
	uint32_t open = SEQ(b, lits(b, "["), ws(b)), close = SEQ(b, ws(b), lits(b, "]"));
	if (hi == 0)
		return SEQ(b, open, close);
	uint32_t more = star(b, SEQ(b, ws(b), lits(b, ","), ws(b), item), lo ? lo - 1 : 0,
			     hi == UINT32_MAX ? UINT32_MAX : hi - 1);
	uint32_t body = SEQ(b, item, more, close);
	return lo ? SEQ(b, open, body) : SEQ(b, open, ALT(b, lits(b, "]"), body));
}

/* '{' "key": value, ... '}' with free keys */
static uint32_t object_of(struct gb *b, uint32_t value)
{
	uint32_t member = SEQ(b, str_q(b), ws(b), lits(b, ":"), ws(b), value);
	uint32_t more = star(b, SEQ(b, ws(b), lits(b, ","), ws(b), member), 0, UINT32_MAX);
	return SEQ(b, lits(b, "{"), ws(b), ALT(b, lits(b, "}"), SEQ(b, member, more, ws(b), lits(b, "}"))));
}

/* Any JSON value (a cycle through a REF node). */
static uint32_t any_value(struct gb *b)
{
	if (b->any != GRAM__NONE)
		return b->any;
	uint32_t ref = node_new(b, GRAM__REF, GRAM__NONE, 0, 0, 0);
	b->any = ref;
	uint32_t v = ALT(b, object_of(b, ref), array_of(b, ref, 0, UINT32_MAX), str_q(b),
			 node_new(b, GRAM__NUM, 0, 0, 0, 0), lits(b, "true"), lits(b, "false"), lits(b, "null"));
	if (ref != GRAM__NONE)
		b->g->nodes[ref].a = v;
	return ref;
}

/* ---- enum values: a prefix tree of literals ---- */

struct sv {
	char *s;
	size_t n;
};

static int sv_cmp(const void *x, const void *y)
{
	const struct sv *a = x, *c = y;
	size_t n = a->n < c->n ? a->n : c->n;
	int r = memcmp(a->s, c->s, n);
	return r ? r : (a->n > c->n) - (a->n < c->n);
}

static uint32_t prefix_tree(struct gb *b, const struct sv *v, uint32_t i0, uint32_t i1, size_t off, int depth)
{
	if (depth > 4096)
		return fail(b, ST_INVALID, "enum too deep%s", NULL);
	uint32_t kids_local[16], *kids = kids_local, n = 0, cap = 16;
	uint32_t i = i0;
	bool empty = false;
	while (i < i1 && v[i].n == off) { /* ends here (sorted: shortest first; duplicates merge) */
		empty = true;
		i++;
	}
	if (empty)
		kids[n++] = node_new(b, GRAM__EMPTY, 0, 0, 0, 0);
	while (i < i1 && !b->st) {
		uint32_t j = i + 1;
		while (j < i1 && v[j].s[off] == v[i].s[off])
			j++;
		size_t L = off + 1; /* common prefix of v[i..j) */
		for (;; L++) {
			bool same = L < v[i].n;
			for (uint32_t k = i + 1; same && k < j; k++)
				same = L < v[k].n && v[k].s[L] == v[i].s[L];
			if (!same)
				break;
		}
		uint32_t head = lit(b, v[i].s + off, L - off);
		uint32_t kid = (j == i + 1 && v[i].n == L) ? head : SEQ(b, head, prefix_tree(b, v, i, j, L, depth + 1));
		if (n == cap) {
			uint32_t *p = malloc(2 * cap * sizeof *p);
			if (!p) {
				if (kids != kids_local)
					free(kids);
				return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
			}
			memcpy(p, kids, n * sizeof *p);
			if (kids != kids_local)
				free(kids);
			kids = p;
			cap *= 2;
		}
		kids[n++] = kid;
		i = j;
	}
	uint32_t r = n ? list(b, GRAM__ALT, kids, n) : fail(b, ST_INVALID, "empty enum%s", NULL);
	if (kids != kids_local)
		free(kids);
	return r;
}

/* choices as literals; raw: the strings themselves, else JSON texts */
static uint32_t choices_of(struct gb *b, struct sv *v, uint32_t n)
{
	if (n == 0)
		return fail(b, ST_INVALID, "enum/choice list is empty%s", NULL);
	qsort(v, n, sizeof *v, sv_cmp);
	return prefix_tree(b, v, 0, n, 0, 0);
}

static uint32_t enum_of(struct gb *b, json_t *arr, bool raw_strings)
{
	size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
	if (!json_is_array(arr))
		return fail(b, ST_INVALID, "'enum' must be an array%s", NULL);
	if (n > 65536)
		return fail(b, ST_INVALID, "enum too large (over 65536 values)%s", NULL);
	struct sv *v = calloc(n ? n : 1, sizeof *v);
	if (!v)
		return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
	uint32_t r = GRAM__NONE;
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *x = json_array_get(arr, i);
		if (raw_strings) {
			v[i].n = json_string_length(x);
			v[i].s = malloc(v[i].n + 1);
			if (v[i].s)
				memcpy(v[i].s, json_string_value(x), v[i].n);
		} else {
			v[i].s = json_dumps(x, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
			v[i].n = v[i].s ? strlen(v[i].s) : 0;
		}
		total += v[i].n;
		if (!v[i].s || total > GRAM_MAX_LIT_BYTES) {
			fail(b, v[i].s ? ST_INVALID : ST_NOMEM, "enum too large%s", NULL);
			n = i + 1;
			goto out;
		}
	}
	r = choices_of(b, v, (uint32_t)n);
out:
	for (size_t i = 0; i < n; i++)
		free(v[i].s);
	free(v);
	return r;
}

/* ---- JSON Schema ---- */

static const char *const known_keywords[] = {
	"type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "oneOf",
	"allOf", "$ref", "$defs", "definitions", "title", "description", "default", "examples", "format",
	"$schema", "$id", "$comment", "minItems", "maxItems", "nullable", "deprecated", "readOnly", "writeOnly",
	"strict", NULL};

static uint32_t compile(struct gb *b, json_t *s, int depth);

static json_t *resolve_pointer(json_t *root, const char *ptr)
{
	if (ptr[0] != '#')
		return NULL;
	json_t *cur = root;
	const char *p = ptr + 1;
	char seg[256];
	while (*p == '/' && cur) {
		p++;
		size_t n = 0;
		while (*p && *p != '/' && n + 1 < sizeof seg) {
			if (p[0] == '~' && p[1] == '0') {
				seg[n++] = '~';
				p += 2;
			} else if (p[0] == '~' && p[1] == '1') {
				seg[n++] = '/';
				p += 2;
			} else {
				seg[n++] = *p++;
			}
		}
		seg[n] = 0;
		if (json_is_object(cur))
			cur = json_object_get(cur, seg);
		else if (json_is_array(cur)) {
			char *end;
			unsigned long i = strtoul(seg, &end, 10);
			cur = *end ? NULL : json_array_get(cur, i);
		} else
			cur = NULL;
	}
	return *p ? NULL : cur;
}

static uint32_t compile_ref(struct gb *b, const char *ptr, int depth)
{
	for (uint32_t i = 0; i < b->n_refs; i++)
		if (!strcmp(b->refs[i].ptr, ptr))
			return b->refs[i].node;
	json_t *target = resolve_pointer(b->root, ptr);
	if (!target)
		return fail(b, ST_INVALID, "$ref '%.200s' does not resolve (only local '#/...' references)", ptr);
	if (b->n_refs == b->cap_refs) {
		uint32_t cap = b->cap_refs ? b->cap_refs * 2 : 16;
		struct ref_memo *p = realloc(b->refs, cap * sizeof *p);
		if (!p)
			return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
		b->refs = p;
		b->cap_refs = cap;
	}
	uint32_t ref = node_new(b, GRAM__REF, GRAM__NONE, 0, 0, 0);
	char *dup = strdup(ptr);
	if (!dup || ref == GRAM__NONE) {
		free(dup);
		return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
	}
	b->refs[b->n_refs++] = (struct ref_memo){dup, ref};
	uint32_t t = compile(b, target, depth + 1);
	if (t != GRAM__NONE && ref != GRAM__NONE)
		b->g->nodes[ref].a = t;
	return ref;
}

static bool plain_string_schema(json_t *s)
{
	json_t *t = json_object_get(s, "type");
	return json_is_object(s) && json_is_string(t) && !strcmp(json_string_value(t), "string") &&
	       !json_object_get(s, "enum") && !json_object_get(s, "const") && !json_object_get(s, "anyOf") &&
	       !json_object_get(s, "oneOf") && !json_object_get(s, "allOf") && !json_object_get(s, "$ref");
}

/* The ordered subset of properties that holds every required one: S(i) =
 * [sep] kv_i S(i+1) | S(i+1) (when i is optional). kv(i) builds member i;
 * first: no separator before the first member. */
typedef uint32_t (*member_fn)(struct gb *b, void *ctx, size_t i);
static uint32_t members(struct gb *b, size_t n, const bool *req, member_fn kv, void *ctx, uint32_t sep)
{
	uint32_t next_first = node_new(b, GRAM__EMPTY, 0, 0, 0, 0), next_rest = next_first;
	for (size_t k = n; k-- > 0 && !b->st;) {
		uint32_t m = kv(b, ctx, k);
		uint32_t take_first = SEQ(b, m, next_rest);
		uint32_t take_rest = SEQ(b, sep, m, next_rest);
		uint32_t f = req[k] ? take_first : ALT(b, take_first, next_first);
		uint32_t r = req[k] ? take_rest : ALT(b, take_rest, next_rest);
		next_first = f;
		next_rest = r;
	}
	return next_first;
}

struct props_ctx {
	json_t **schemas;
	const char **names;
	int depth;
};

static uint32_t json_member(struct gb *b, void *ctx, size_t i)
{
	struct props_ctx *c = ctx;
	json_t *key = json_string(c->names[i]);
	char *k = key ? json_dumps(key, JSON_ENCODE_ANY) : NULL;
	json_decref(key);
	if (!k)
		return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
	uint32_t r = SEQ(b, lits(b, k), ws(b), lits(b, ":"), ws(b), compile(b, c->schemas[i], c->depth + 1));
	free(k);
	return r;
}

static uint32_t compile_object(struct gb *b, json_t *s, int depth)
{
	json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
	json_t *addl = json_object_get(s, "additionalProperties");
	if (props && !json_is_object(props))
		return fail(b, ST_INVALID, "'properties' must be an object%s", NULL);
	if (req && !json_is_array(req))
		return fail(b, ST_INVALID, "'required' must be an array%s", NULL);
	size_t n = props ? json_object_size(props) : 0;
	if (n == 0) {
		if (json_is_false(addl))
			return SEQ(b, lits(b, "{"), ws(b), lits(b, "}"));
		if (json_is_object(addl))
			return object_of(b, compile(b, addl, depth + 1));
		return object_of(b, any_value(b));
	}
	struct props_ctx c = {.schemas = calloc(n, sizeof(json_t *)), .names = calloc(n, sizeof(char *)), .depth = depth};
	bool *rq = calloc(n, sizeof(bool));
	uint32_t r = GRAM__NONE;
	if (!c.schemas || !c.names || !rq) {
		fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
		goto out;
	}
	size_t i = 0;
	const char *key;
	json_t *val;
	json_object_foreach(props, key, val) {
		c.names[i] = key;
		c.schemas[i] = val;
		for (size_t k = 0; req && k < json_array_size(req); k++)
			if (json_is_string(json_array_get(req, k)) && !strcmp(json_string_value(json_array_get(req, k)), key))
				rq[i] = true;
		i++;
	}
	for (size_t k = 0; req && k < json_array_size(req); k++) {
		const char *name = json_string_value(json_array_get(req, k));
		if (!name) {
			fail(b, ST_INVALID, "'required' entries must be strings%s", NULL);
			goto out;
		}
		if (!json_object_get(props, name)) {
			fail(b, ST_UNSUPPORTED, "required property '%.100s' is not in 'properties'", name);
			goto out;
		}
	}
	uint32_t sep = SEQ(b, ws(b), lits(b, ","), ws(b));
	r = SEQ(b, lits(b, "{"), ws(b), members(b, n, rq, json_member, &c, sep), ws(b), lits(b, "}"));
out:
	free(c.schemas);
	free(c.names);
	free(rq);
	return r;
}

static uint32_t compile_type(struct gb *b, json_t *s, const char *t, int depth)
{
	if (!strcmp(t, "object"))
		return compile_object(b, s, depth);
	if (!strcmp(t, "array")) {
		json_t *items = json_object_get(s, "items"), *mn = json_object_get(s, "minItems"),
		       *mx = json_object_get(s, "maxItems");
		json_int_t lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
		if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)) || lo < 0 || lo > 4096 ||
		    (mx && (hi < lo || hi < 0)))
			return fail(b, ST_INVALID, "minItems/maxItems must be integers with 0 <= minItems <= maxItems, minItems <= 4096%s", NULL);
		uint32_t item = items ? compile(b, items, depth + 1) : any_value(b);
		return array_of(b, item, (uint32_t)lo, hi < 0 || hi > 1000000 ? UINT32_MAX : (uint32_t)hi);
	}
	if (!strcmp(t, "string"))
		return str_q(b);
	if (!strcmp(t, "integer"))
		return node_new(b, GRAM__NUM, 0, 0, 1, 0);
	if (!strcmp(t, "number"))
		return node_new(b, GRAM__NUM, 0, 0, 0, 0);
	if (!strcmp(t, "boolean"))
		return ALT(b, lits(b, "true"), lits(b, "false"));
	if (!strcmp(t, "null"))
		return lits(b, "null");
	return fail(b, ST_INVALID, "unknown type '%.40s'", t);
}

static uint32_t compile(struct gb *b, json_t *s, int depth)
{
	if (b->st)
		return GRAM__NONE;
	if (depth > GRAM_MAX_SCHEMA_DEPTH)
		return fail(b, ST_INVALID, "schema nested deeper than 64 levels%s", NULL);
	if (json_is_true(s))
		return any_value(b);
	if (json_is_false(s))
		return fail(b, ST_UNSUPPORTED, "unsupported JSON Schema: 'false' (matches nothing)%s", NULL);
	if (!json_is_object(s))
		return fail(b, ST_INVALID, "a schema must be an object or a boolean%s", NULL);
	const char *key;
	json_t *val;
	json_object_foreach(s, key, val) {
		bool known = false;
		for (int i = 0; known_keywords[i] && !known; i++)
			known = !strcmp(known_keywords[i], key);
		if (!known)
			return fail(b, ST_UNSUPPORTED, "unsupported JSON Schema keyword '%.100s'", key);
	}
	uint32_t r;
	json_t *x;
	if ((x = json_object_get(s, "$ref"))) {
		if (!json_is_string(x))
			return fail(b, ST_INVALID, "'$ref' must be a string%s", NULL);
		r = compile_ref(b, json_string_value(x), depth);
	} else if ((x = json_object_get(s, "enum"))) {
		r = enum_of(b, x, false);
	} else if ((x = json_object_get(s, "const"))) {
		json_t *one = json_pack("[O]", x);
		r = one ? enum_of(b, one, false) : fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
		json_decref(one);
	} else if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf")) ||
		   (x = json_object_get(s, "allOf"))) {
		bool all = x == json_object_get(s, "allOf");
		size_t n = json_is_array(x) ? json_array_size(x) : 0;
		if (!n)
			return fail(b, ST_INVALID, "anyOf/oneOf/allOf must be a non-empty array%s", NULL);
		if (all && n > 1)
			return fail(b, ST_UNSUPPORTED, "unsupported JSON Schema: 'allOf' with more than one schema%s", NULL);
		if (n > 1024)
			return fail(b, ST_INVALID, "anyOf/oneOf with more than 1024 schemas%s", NULL);
		uint32_t *k = malloc(n * sizeof *k);
		if (!k)
			return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
		for (size_t i = 0; i < n; i++)
			k[i] = compile(b, json_array_get(x, i), depth + 1);
		r = list(b, GRAM__ALT, k, (uint32_t)n);
		free(k);
	} else if ((x = json_object_get(s, "type"))) {
		if (json_is_string(x)) {
			r = compile_type(b, s, json_string_value(x), depth);
		} else if (json_is_array(x) && json_array_size(x) > 0 && json_array_size(x) <= 7) {
			uint32_t k[7];
			size_t n = json_array_size(x);
			for (size_t i = 0; i < n; i++) {
				const char *t = json_string_value(json_array_get(x, i));
				k[i] = t ? compile_type(b, s, t, depth) : fail(b, ST_INVALID, "'type' entries must be strings%s", NULL);
			}
			r = list(b, GRAM__ALT, k, (uint32_t)n);
		} else {
			return fail(b, ST_INVALID, "'type' must be a string or an array of strings%s", NULL);
		}
	} else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties")) {
		r = compile_object(b, s, depth);
	} else if (json_object_get(s, "items")) {
		r = compile_type(b, s, "array", depth);
	} else {
		r = any_value(b);
	}
	if (json_is_true(json_object_get(s, "nullable")))
		r = ALT(b, r, lits(b, "null"));
	return r;
}

/* ---- entry points ---- */

static enum status gb_begin(struct gb *b, struct err *e)
{
	*b = (struct gb){.e = e, .any = GRAM__NONE, .ws = GRAM__NONE, .str_q = GRAM__NONE};
	b->g = calloc(1, sizeof *b->g);
	if (!b->g)
		return err_set(e, ST_NOMEM, "grammar: out of memory");
	atomic_init(&b->g->refs, 1);
	return ST_OK;
}

static enum status gb_end(struct gb *b, uint32_t root, struct gram **out)
{
	for (uint32_t i = 0; i < b->n_refs; i++)
		free(b->refs[i].ptr);
	free(b->refs);
	if (!b->st && root == GRAM__NONE)
		fail(b, ST_INVALID, "grammar: empty%s", NULL);
	/* a REF that reaches itself through REFs only (a $ref to itself) has no content */
	for (uint32_t i = 0; !b->st && i < b->g->n_nodes; i++) {
		uint32_t k = i, steps = 0;
		while (!b->st && b->g->nodes[k].kind == GRAM__REF) {
			k = b->g->nodes[k].a;
			if (k == GRAM__NONE || k == i || ++steps > b->g->n_nodes)
				fail(b, ST_INVALID, "$ref cycle with no content%s", NULL);
		}
	}
	if (!b->st) {
		b->g->root = root;
		if (!gram__can_start(b->g))
			fail(b, ST_INVALID, "schema matches nothing or recurses without content (a $ref cycle through "
					    "anyOf / allOf)%s", NULL);
	}
	if (b->st) {
		gram_release(b->g);
		return b->st;
	}
	*out = b->g;
	return ST_OK;
}

enum status gram_compile_json_schema(struct gram **out, const char *schema_json, size_t len, struct err *e)
{
	*out = NULL;
	json_error_t je;
	json_t *s = json_loadb(schema_json, len, JSON_DECODE_ANY, &je);
	if (!s)
		return err_set(e, ST_INVALID, "schema is not JSON: %s", je.text);
	struct gb b;
	enum status st = gb_begin(&b, e);
	if (st) {
		json_decref(s);
		return st;
	}
	b.root = s;
	uint32_t root = compile(&b, s, 0);
	st = gb_end(&b, root, out);
	json_decref(s);
	return st;
}

enum status gram_compile_json_object(struct gram **out, struct err *e)
{
	*out = NULL;
	struct gb b;
	enum status st = gb_begin(&b, e);
	if (st)
		return st;
	return gb_end(&b, object_of(&b, any_value(&b)), out);
}

enum status gram_compile_choice(struct gram **out, const char *const *choices, uint32_t n, struct err *e)
{
	*out = NULL;
	struct gb b;
	enum status st = gb_begin(&b, e);
	if (st)
		return st;
	struct sv *v = calloc(n ? n : 1, sizeof *v);
	uint32_t root = GRAM__NONE;
	if (!v) {
		fail(&b, ST_NOMEM, "grammar: out of memory%s", NULL);
	} else {
		for (uint32_t i = 0; i < n; i++)
			v[i] = (struct sv){(char *)choices[i], strlen(choices[i])};
		root = choices_of(&b, v, n);
	}
	free(v);
	return gb_end(&b, root, out);
}

/* ---- DSML tool calls ---- */

struct tool_params {
	json_t *root;
	const char **names;
	json_t **schemas;
	int depth;
};

static uint32_t dsml_param(struct gb *b, void *ctx, size_t i)
{
	struct tool_params *c = ctx;
	json_t *s = c->schemas[i];
	size_t nl = strlen(c->names[i]);
	char *head = malloc(nl + 64);
	if (!head)
		return fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
	json_t *en = json_is_object(s) ? json_object_get(s, "enum") : NULL;
	bool raw = plain_string_schema(s);
	bool raw_enum = false;
	if (en && json_is_array(en) && json_array_size(en)) {
		raw_enum = true;
		for (size_t k = 0; k < json_array_size(en); k++)
			raw_enum = raw_enum && json_is_string(json_array_get(en, k));
	}
	snprintf(head, nl + 64, "<" DSML "parameter name=\"%s\" string=\"%s\">", c->names[i],
		 raw || raw_enum ? "true" : "false");
	uint32_t value;
	if (raw)
		value = lits(b, DSML),
		value = value == GRAM__NONE ? GRAM__NONE
					    : node_new(b, GRAM__RAW, b->g->nodes[value].a, b->g->nodes[value].b, 0, 0);
	else if (raw_enum)
		value = enum_of(b, en, true);
	else
		value = compile(b, s, c->depth + 1);
	uint32_t r = SEQ(b, lits(b, head), value, lits(b, "</" DSML "parameter>"));
	free(head);
	return r;
}

static uint32_t dsml_invoke(struct gb *b, json_t *fn)
{
	const char *name = json_string_value(json_object_get(fn, "name"));
	json_t *params = json_object_get(fn, "parameters");
	if (!name || strchr(name, '"') || strlen(name) > 1000)
		return fail(b, ST_INVALID, "tools: a function needs a name without '\"'%s", NULL);
	json_t *props = json_is_object(params) ? json_object_get(params, "properties") : NULL;
	json_t *req = json_is_object(params) ? json_object_get(params, "required") : NULL;
	size_t n = json_is_object(props) ? json_object_size(props) : 0;
	if (params && json_is_object(params)) {
		const char *key;
		json_t *val;
		json_object_foreach(params, key, val) {
			bool ok = false;
			for (int i = 0; known_keywords[i] && !ok; i++)
				ok = !strcmp(known_keywords[i], key);
			if (!ok)
				return fail(b, ST_UNSUPPORTED, "unsupported JSON Schema keyword '%.100s'", key);
		}
	}
	struct tool_params c = {.names = calloc(n ? n : 1, sizeof(char *)), .schemas = calloc(n ? n : 1, sizeof(json_t *))};
	bool *rq = calloc(n ? n : 1, sizeof(bool));
	uint32_t r = GRAM__NONE;
	char *head = malloc(strlen(name) + 64);
	if (!c.names || !c.schemas || !rq || !head) {
		fail(b, ST_NOMEM, "grammar: out of memory%s", NULL);
		goto out;
	}
	size_t i = 0;
	const char *key;
	json_t *val;
	if (n)
		json_object_foreach(props, key, val) {
			if (strchr(key, '"')) {
				fail(b, ST_INVALID, "tools: parameter name with '\"'%s", NULL);
				goto out;
			}
			c.names[i] = key;
			c.schemas[i] = val;
			for (size_t k = 0; json_is_array(req) && k < json_array_size(req); k++)
				if (json_is_string(json_array_get(req, k)) &&
				    !strcmp(json_string_value(json_array_get(req, k)), key))
					rq[i] = true;
			i++;
		}
	snprintf(head, strlen(name) + 64, "<" DSML "invoke name=\"%s\">\n", name);
	r = SEQ(b, lits(b, head), members(b, n, rq, dsml_param, &c, lits(b, "\n")), lits(b, "\n</" DSML "invoke>"));
out:
	free(head);
	free(c.names);
	free(c.schemas);
	free(rq);
	return r;
}

enum status gram_compile_tool_calls(struct gram **out, const char *tools_json, size_t len, enum gram_tool_mode mode,
				    const char *only_name, uint32_t max_calls, bool thinking, struct err *e)
{
	*out = NULL;
	json_error_t je;
	json_t *tools = json_loadb(tools_json, len, 0, &je);
	if (!tools || !json_is_array(tools) || !json_array_size(tools)) {
		json_decref(tools);
		return err_set(e, ST_INVALID, "tools must be a non-empty JSON array");
	}
	struct gb b;
	enum status st = gb_begin(&b, e);
	if (st) {
		json_decref(tools);
		return st;
	}
	size_t n = json_array_size(tools);
	b.dsml = true;
	uint32_t *inv = calloc(n, sizeof *inv), n_inv = 0;
	uint32_t root = GRAM__NONE;
	if (!inv) {
		fail(&b, ST_NOMEM, "grammar: out of memory%s", NULL);
		goto out;
	}
	for (size_t i = 0; i < n && !b.st; i++) {
		json_t *fn = json_object_get(json_array_get(tools, i), "function");
		const char *name = json_string_value(json_object_get(fn, "name"));
		if (!fn || !name) {
			fail(&b, ST_INVALID, "tools[%s]: needs function.name", "");
			break;
		}
		if (only_name && strcmp(only_name, name))
			continue;
		/* $ref inside a tool's parameters resolve against the parameters */
		b.root = json_object_get(fn, "parameters");
		for (uint32_t k = 0; k < b.n_refs; k++) /* references resolve per tool */
			free(b.refs[k].ptr);
		b.n_refs = 0;
		inv[n_inv++] = dsml_invoke(&b, fn);
	}
	if (!b.st && !n_inv) {
		fail(&b, ST_INVALID, "tool_choice names function '%.100s', which is not in tools", only_name);
		goto out;
	}
	uint32_t one = list(&b, GRAM__ALT, inv, n_inv);
	uint32_t calls = max_calls <= 1 || only_name ? one
				: SEQ(&b, one, star(&b, SEQ(&b, lits(&b, "\n"), one), 0, max_calls - 1));
	uint32_t block = SEQ(&b, lits(&b, "<" DSML "tool_calls>\n"), calls, lits(&b, "\n</" DSML "tool_calls>"));
	if (b.st) /* a tool's schema was refused: the nodes below would index GRAM__NONE */
		goto out;
	if (mode == GRAM_TOOLS_AUTO) {
		uint32_t text = lits(&b, "<" DSML);
		text = node_new(&b, GRAM__RAW, b.g->nodes[text].a, b.g->nodes[text].b, 0, 0);
		root = SEQ(&b, text, ALT(&b, node_new(&b, GRAM__EMPTY, 0, 0, 0, 0), block));
	} else {
		root = SEQ(&b, lits(&b, "\n\n"), block);
	}
	if (thinking) {
		uint32_t think = lits(&b, "</think>");
		if (b.st)
			goto out;
		uint32_t reason = node_new(&b, GRAM__RAW, b.g->nodes[think].a, b.g->nodes[think].b, 0, 0);
		root = SEQ(&b, reason, think, root);
	}
out:
	free(inv);
	st = gb_end(&b, root, out);
	json_decref(tools);
	return st;
}
