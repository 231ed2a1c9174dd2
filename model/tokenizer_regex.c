/*
 * model/tokenizer_regex.c: HF tokenizers compiles Split patterns with
 * Oniguruma (the `onig` crate, Unicode mode); we compile them with PCRE2 in
 * UTF + UCP mode, JIT included. The two agree on \p{..} categories and on the
 * backtracking semantics, but not on every shorthand class, so this file
 * rewrites the shorthands into explicit property classes that mean what
 * Oniguruma means:
 *   \s  U+0009..U+000D, U+0085 and General_Category Z (Zs, Zl, Zp);
 *       PCRE2's UCP \s leaves out U+0085.
 *   \w  Alphabetic, M, Nd, Pc (Oniguruma's Word; PCRE2 10.42's UCP
 *       \w is L, N and '_'), plus U+00B2 U+00B3 U+00B9 U+00BC..U+00BE, which
 *       Oniguruma's ISO-8859-1 ctype table (used below U+0100) calls word
 *   \d  Nd             \h  hex digit (PCRE2's \h is horizontal space)
 *   \b \B by that \w (PCRE2's follow its own \w)
 *   \uHHHH -> \x{HHHH}; ^ and $ are line anchors in Oniguruma (PCRE2_MULTILINE).
 * Constructs whose meaning differs and that we do not translate (nested or
 * intersected classes, POSIX brackets, negated shorthands inside a class) are
 * refused with ST_UNSUPPORTED rather than approximated. Script and other
 * non-category properties (\p{Han}) pass through with a warning: their Unicode
 * version skew (below) is not corrected.
 *
 * Unicode versions: PCRE2 10.42 knows Unicode 14.0, HF's Oniguruma 16.0. Every
 * \p{X} (written, or from a shorthand above) gets the code points that joined
 * or left category X between the two, from model/tokenizer_unicode.h (which
 * scripts/gen_tokenizer_unicode.py generates from both versions' UCD), so the
 * categories are those of Unicode 16.0 exactly. The table is applied only when
 * the PCRE2 at run time reports Unicode 14.0.0. Since every code point added
 * after 14 is Cn to PCRE2, a corrected class is guarded by \p{Cn} (struct cls)
 * so that assigned characters never scan the added ranges (3x faster).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "tokenizer_internal.h"
#include "tokenizer_unicode.h"

#define ONIG_SPACE_CTRL "\\t-\\r\\x{85}"
#define ONIG_HEX "0-9A-Fa-f"
#define ONIG_WORD_LATIN1 "\\x{b2}\\x{b3}\\x{b9}\\x{bc}-\\x{be}"

struct sbuf {
	char *p;
	size_t n, cap;
	bool overflow;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		b->overflow = true;
		return;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

static void puts_(struct sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* 1: apply the Unicode 14 -> 16 table; 0: PCRE2 already is what HF is (or
 * some other version, which tok__regex_compile warns about). Asked each time
 * (cheap, load-time only) rather than cached, so concurrent loads share no
 * state. */
static int unicode_delta_on(void)
{
	char v[32] = "";
	pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, v);
	return strcmp(v, TOK_UNICODE_BASE) == 0;
}

/* A character class being translated, in two versions: `plain` with PCRE2's
 * Unicode 14 categories, `full` with the Unicode 16 additions. Every code point
 * added since 14 is unassigned (Cn) for PCRE2, so the two differ only on Cn
 * characters, and the class is emitted as (?:PLAIN|(?=\p{Cn})FULL), or for a
 * negated class (?:(?!\p{Cn})PLAIN|(?=\p{Cn})FULL), which costs assigned
 * characters (all real text) at most one property test instead of a scan of
 * hundreds of ranges. */
struct cls {
	struct sbuf plain, full;
};

static void cput(struct cls *c, const char *s)
{
	puts_(&c->plain, s);
	puts_(&c->full, s);
}

static void cls_flush(struct sbuf *b, struct cls *c)
{
	if (c->plain.n == c->full.n && memcmp(c->plain.p, c->full.p, c->plain.n) == 0) {
		put(b, c->plain.p, c->plain.n);
	} else {
		/* A positive class only gains (Cn) members: PLAIN|(?=\p{Cn})FULL lets
		 * PCRE2 try the plain class first, unguarded. A negated one loses them,
		 * so both branches are guarded. */
		bool negated = c->plain.n >= 2 && c->plain.p[1] == '^';
		puts_(b, negated ? "(?:(?!\\p{Cn})" : "(?:");
		put(b, c->plain.p, c->plain.n);
		puts_(b, "|(?=\\p{Cn})");
		put(b, c->full.p, c->full.n);
		puts_(b, ")");
	}
	if (c->plain.overflow || c->full.overflow)
		b->overflow = true;
	c->plain.n = c->full.n = 0;
	c->plain.overflow = c->full.overflow = false;
}

static void find_delta(const char *name, size_t name_len, const char **added, const char **removed)
{
	*added = *removed = "";
	if (!unicode_delta_on())
		return;
	for (size_t i = 0; i < sizeof tok__ucat_deltas / sizeof tok__ucat_deltas[0]; i++)
		if (strlen(tok__ucat_deltas[i].cat) == name_len &&
		    memcmp(tok__ucat_deltas[i].cat, name, name_len) == 0) {
			*added = tok__ucat_deltas[i].added;
			*removed = tok__ucat_deltas[i].removed;
		}
}

/* General_Category names: the properties the Unicode table corrects. */
static bool is_gc_name(const char *name, size_t n)
{
	static const char *const gc[] = {
		"L",  "Lu", "Ll", "Lt", "Lm", "Lo", "L&", "LC", "M",  "Mn", "Mc", "Me", "N",
		"Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm",
		"Sc", "Sk", "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn",
		"Alphabetic",
	};
	for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++)
		if (strlen(gc[i]) == n && memcmp(gc[i], name, n) == 0)
			return true;
	return false;
}

/* Add \p{name} (or \P{name}) to class c with its Unicode 16 members. removed:
 * NULL inside a written class (then a category that lost members is refused),
 * else receives those members for the caller to handle around the class. */
static enum status cls_prop(struct cls *c, const char *name, size_t name_len, bool negated,
			    const char **removed, const char *pat, struct err *e)
{
	const char *add, *rm;
	find_delta(name, name_len, &add, &rm);
	if (unicode_delta_on() && !is_gc_name(name, name_len))
		log_msg(LOG_WARN, "model",
			"tokenizer: regex /%s/: \\p{%.*s} is not a General_Category; its Unicode %s "
			"additions are not applied (PCRE2 has %s)",
			pat, (int)name_len, name, TOK_UNICODE_TARGET, TOK_UNICODE_BASE);
	if (name_len > 40)
		return err_set(e, ST_UNSUPPORTED, "regex /%s/: property name too long", pat);
	char prop[64];
	snprintf(prop, sizeof prop, "\\%c{%.*s}", negated ? 'P' : 'p', (int)name_len, name);
	if ((!negated && *rm && !removed) || (negated && *add))
		return err_set(e, ST_UNSUPPORTED,
			       "regex /%s/: %s inside a class needs a Unicode %s correction that a "
			       "class cannot hold",
			       pat, prop, TOK_UNICODE_TARGET);
	cput(c, prop);
	if (!negated) {
		/* X16 = X14 + added - removed; added are Cn in 14: the full side only. */
		puts_(&c->full, add);
		if (removed)
			*removed = rm;
	} else {
		/* not X16 = not X14 + removed (no additions, checked above); the removed
		 * are assigned in 14, so both sides. */
		cput(c, rm);
	}
	return ST_OK;
}

static const char *const space_props[] = {"Z", NULL};

static const char *const word_props[] = {"Alphabetic", "M", "Nd", "Pc", NULL};

/* Bytes of the UTF-8 character starting with byte c (1 for junk). */
static size_t char_len(unsigned char c)
{
	if (c >= 0xF0)
		return 4;
	if (c >= 0xE0)
		return 3;
	if (c >= 0xC0)
		return 2;
	return 1;
}

/* \b as (?:(?<=W)(?!W)|(?<!W)(?=W)), \B as (?:(?<=W)(?=W)|(?<!W)(?!W)), with
 * W the translation of \w (one character in every branch, as lookbehind needs). */
static enum status put_boundary(struct sbuf *b, bool not_boundary, struct err *e)
{
	size_t cap = 65536;
	char *w = malloc(cap);
	if (!w)
		return err_set(e, ST_NOMEM, "regex: out of memory");
	enum status st = tok__regex_translate("\\w", false, w, cap, e);
	if (st == ST_OK) {
		const char *parts[] = {"(?:(?<=", w, not_boundary ? ")(?=" : ")(?!", w, ")|(?<!",
				       w, not_boundary ? ")(?!" : ")(?=", w, "))"};
		for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
			puts_(b, parts[i]);
	}
	free(w);
	return st;
}

/* One property (\p, \P, \d, \D) outside a class: a one-item class. */
static enum status lone_prop(struct sbuf *b, struct cls *c, const char *name, size_t name_len,
			     bool negated, const char *pat, struct err *e)
{
	const char *rm = "";
	cput(c, negated ? "[^" : "[");
	enum status st = cls_prop(c, name, name_len, false, &rm, pat, e);
	if (st != ST_OK)
		return st;
	cput(c, "]");
	/* Members that left the category (assigned in 14): X16 = X14' - R, and
	 * not X16 = not X14' + R, with X14' = X14 + added. */
	if (*rm) {
		puts_(b, negated ? "(?:[" : "(?:(?![");
		puts_(b, rm);
		puts_(b, negated ? "]|" : "])");
	}
	cls_flush(b, c);
	if (*rm)
		puts_(b, ")");
	return ST_OK;
}

/* The translation in progress: the pattern, the output, and the class
 * being built (plain and Cn-guarded forms, struct cls). */
struct tr {
	const char *pat;
	size_t n;
	struct sbuf *b;
	struct cls c;
	bool in_class;
	size_t class_start; /* index just after '[' or '[^' */
};

/* A literal pattern: every ASCII character that is not alphanumeric escaped. */
static void tr_literal(const char *pat, struct sbuf *b)
{
	for (size_t i = 0; pat[i]; i++) {
		unsigned char ch = (unsigned char)pat[i];
		if (ch < 0x80 && !((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
			put(b, "\\", 1);
		put(b, pat + i, 1);
	}
}

/* The shorthands Oniguruma means otherwise (\s \S \w \W \d \D \h \H \b \B)
 * at t->pat[*i] == '\\'. *done = false when x is none of them (or [\b]). */
static enum status tr_shorthand(struct tr *t, char x, bool *done, struct err *e)
{
	enum status st = ST_OK;
	*done = true;
	switch (x) {
	case 's':
	case 'S':
	case 'w':
	case 'W':
		if (!t->in_class)
			cput(&t->c, x == 's' || x == 'w' ? "[" : "[^");
		cput(&t->c, x == 's' || x == 'S' ? ONIG_SPACE_CTRL : ONIG_WORD_LATIN1);
		for (const char *const *p = x == 's' || x == 'S' ? space_props : word_props; *p && st == ST_OK; p++)
			st = cls_prop(&t->c, *p, strlen(*p), false, NULL, t->pat, e);
		if (!t->in_class) {
			cput(&t->c, "]");
			cls_flush(t->b, &t->c);
		}
		return st;
	case 'd':
	case 'D':
		return t->in_class ? cls_prop(&t->c, "Nd", 2, x == 'D', NULL, t->pat, e)
				   : lone_prop(t->b, &t->c, "Nd", 2, x == 'D', t->pat, e);
	case 'h':
		if (t->in_class)
			cput(&t->c, ONIG_HEX);
		else
			puts_(t->b, "[" ONIG_HEX "]");
		return ST_OK;
	case 'H': puts_(t->b, "[^" ONIG_HEX "]"); return ST_OK;
	case 'b':
	case 'B':
		/* Word boundaries, by Oniguruma's \w (PCRE2's use its own). */
		if (t->in_class) {
			*done = false; /* [\b] is a backspace in both */
			return ST_OK;
		}
		return put_boundary(t->b, x == 'B', e);
	default: *done = false; return ST_OK;
	}
}

/* One escape at t->pat[*i] == '\\'; advances *i past it. */
static enum status tr_escape(struct tr *t, size_t *i, struct err *e)
{
	const char *pat = t->pat;
	if (*i + 1 >= t->n)
		return err_set(e, ST_INVALID, "regex /%s/: trailing backslash", pat);
	char x = pat[*i + 1];
	if (strchr("SWH", x) && t->in_class)
		return err_set(e, ST_UNSUPPORTED, "regex /%s/: \\%c inside a character class", pat, x);
	bool done;
	enum status st = tr_shorthand(t, x, &done, e);
	if (st != ST_OK || done) {
		*i += 2;
		return st;
	}
	if (x == 'u') { /* \uHHHH */
		if (*i + 6 > t->n)
			return err_set(e, ST_INVALID, "regex /%s/: bad \\u", pat);
		char tmp[16];
		snprintf(tmp, sizeof tmp, "\\x{%.4s}", pat + *i + 2);
		if (t->in_class)
			cput(&t->c, tmp);
		else
			puts_(t->b, tmp);
		*i += 6;
		return ST_OK;
	}
	if (x == 'p' || x == 'P') { /* \p{Name} or \p{^Name}: same spelling in PCRE2 */
		const char *end = strchr(pat + *i, '}');
		if (pat[*i + 2] != '{' || !end)
			return err_set(e, ST_UNSUPPORTED, "regex /%s/: \\%c without {name}", pat, x);
		const char *name = pat + *i + 3;
		bool neg = x == 'P';
		if (*name == '^') {
			neg = !neg;
			name++;
		}
		size_t nl = (size_t)(end - name);
		*i = (size_t)(end - pat) + 1;
		return t->in_class ? cls_prop(&t->c, name, nl, neg, NULL, pat, e)
				   : lone_prop(t->b, &t->c, name, nl, neg, pat, e);
	}
	if (strchr("RXKgkNOyY", x))
		return err_set(e, ST_UNSUPPORTED, "regex /%s/: \\%c is not translated", pat, x);
	/* Any other escape (\\, \[, \-, \n, \x{..}, \b, \A ...) means the same in
	 * both dialects; copy it with its whole character. */
	size_t l = 1 + char_len((unsigned char)x);
	if (t->in_class) {
		put(&t->c.plain, pat + *i, l);
		put(&t->c.full, pat + *i, l);
	} else {
		put(t->b, pat + *i, l);
	}
	*i += l;
	return ST_OK;
}

/* One character (not an escape) at t->pat[*i]; advances *i past it. */
static enum status tr_char(struct tr *t, size_t *i, struct err *e)
{
	const char *pat = t->pat;
	char ch = pat[*i];
	size_t l = char_len((unsigned char)ch);
	if (!t->in_class) {
		if (ch != '[') {
			put(t->b, pat + *i, l);
			*i += l;
			return ST_OK;
		}
		t->in_class = true;
		cput(&t->c, "[");
		(*i)++;
		if (*i < t->n && pat[*i] == '^') {
			cput(&t->c, "^");
			(*i)++;
		}
		t->class_start = *i;
		return ST_OK;
	}
	if (ch == '[')
		return err_set(e, ST_UNSUPPORTED, "regex /%s/: nested class or POSIX bracket", pat);
	if (ch == '&' && *i + 1 < t->n && pat[*i + 1] == '&')
		return err_set(e, ST_UNSUPPORTED, "regex /%s/: class intersection", pat);
	if (ch == ']' && *i != t->class_start) {
		t->in_class = false;
		cput(&t->c, "]");
		cls_flush(t->b, &t->c);
		(*i)++;
		return ST_OK;
	}
	put(&t->c.plain, pat + *i, l);
	put(&t->c.full, pat + *i, l);
	*i += l;
	return ST_OK;
}

enum status tok__regex_translate(const char *pat, bool literal, char *out, size_t cap, struct err *e)
{
	struct sbuf b = {out, 0, cap, false};
	if (cap)
		out[0] = 0;
	enum status st = ST_OK;
	if (literal) {
		tr_literal(pat, &b);
	} else {
		struct tr t = {.pat = pat, .n = strlen(pat), .b = &b,
			       .c = {{malloc(cap), 0, cap, false}, {malloc(cap), 0, cap, false}}};
		if (!t.c.plain.p || !t.c.full.p)
			st = err_set(e, ST_NOMEM, "regex: out of memory");
		for (size_t i = 0; st == ST_OK && i < t.n;)
			st = pat[i] == '\\' ? tr_escape(&t, &i, e) : tr_char(&t, &i, e);
		if (st == ST_OK && t.in_class)
			st = err_set(e, ST_INVALID, "regex /%s/: unterminated class", pat);
		free(t.c.plain.p);
		free(t.c.full.p);
	}
	if (st == ST_OK && b.overflow)
		st = err_set(e, ST_UNSUPPORTED, "regex /%s/: translation longer than %zu bytes", pat, cap);
	return st;
}

enum status tok__regex_compile(const char *pattern, bool literal, pcre2_code **out, bool *jit,
			       struct err *e)
{
	*out = NULL;
	size_t cap = strlen(pattern) * 32 + 65536; /* room for the Unicode table */
	char *buf = malloc(cap);
	if (!buf)
		return err_set(e, ST_NOMEM, "regex: out of memory");
	enum status st = tok__regex_translate(pattern, literal, buf, cap, e);
	if (st != ST_OK) {
		free(buf);
		return st;
	}
	char v[32] = "";
	pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, v);
	if (strcmp(v, TOK_UNICODE_BASE) != 0 && strcmp(v, TOK_UNICODE_TARGET) != 0)
		log_msg(LOG_WARN, "model",
			"tokenizer: PCRE2 has Unicode %s, HF tokenizers %s: categories of code "
			"points assigned in between may differ",
			v, TOK_UNICODE_TARGET);
	int errcode = 0;
	PCRE2_SIZE erroff = 0;
	/* Newline is LF, as in Oniguruma (for '.', '^', '$'), whatever PCRE2's
	 * build default is. */
	pcre2_compile_context *cctx = pcre2_compile_context_create(NULL);
	if (!cctx) {
		free(buf);
		return err_set(e, ST_NOMEM, "regex: out of memory");
	}
	pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED,
				       PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &errcode, &erroff,
				       cctx);
	pcre2_compile_context_free(cctx);
	if (!re) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(errcode, msg, sizeof msg);
		st = err_set(e, ST_INVALID, "regex /%s/: %s at offset %zu of its PCRE2 form", pattern,
			     (const char *)msg, (size_t)erroff);
		free(buf);
		return st;
	}
	int jrc = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
	if (jit)
		*jit = jrc == 0;
	if (jrc != 0)
		log_msg(LOG_WARN, "model", "tokenizer: regex /%s/: no JIT (%d), interpreting",
			pattern, jrc);
	free(buf);
	*out = re;
	return ST_OK;
}
