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
 *   \uHHHH -> \x{HHHH}; ^ and $ are line anchors in Oniguruma (PCRE2_MULTILINE).
 * Constructs whose meaning differs and that we do not translate (nested or
 * intersected classes, POSIX brackets, negated shorthands inside a class) are
 * refused with ST_UNSUPPORTED rather than approximated.
 *
 * Unicode versions: PCRE2 10.42 knows Unicode 14.0, HF's Oniguruma 16.0. Every
 * \p{X} (written, or from a shorthand above) gets the code points that joined
 * or left category X between the two, from model/tokenizer_unicode.h (which
 * scripts/gen_tokenizer_unicode.py generates from both versions' UCD), so the
 * categories are those of Unicode 16.0 exactly. The table is applied only when
 * the PCRE2 at run time reports Unicode 14.0.0.
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
 * some other version, warned about once). */
static int unicode_delta_on(void)
{
	/* Asked each time (cheap, load-time only) rather than cached in a static,
	 * so that concurrent loads share no state. */
	char v[32] = "";
	pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, v);
	if (strcmp(v, TOK_UNICODE_BASE) == 0)
		return 1;
	if (strcmp(v, TOK_UNICODE_TARGET) != 0)
		log_msg(LOG_WARN, "model",
			"tokenizer: PCRE2 has Unicode %s, HF tokenizers %s: categories of code "
			"points assigned in between may differ",
			v, TOK_UNICODE_TARGET);
	return 0;
}

/* Emit \p{name} (or its negation) with the category's Unicode 16 members.
 * in_class: we are inside [...] (then only forms that fit in a class). */
static enum status put_prop(struct sbuf *b, const char *name, size_t name_len, bool negated,
			    bool in_class, const char *pat, struct err *e)
{
	const char *added = "", *removed = "";
	bool delta = unicode_delta_on();
	for (size_t i = 0; delta && i < sizeof tok__ucat_deltas / sizeof tok__ucat_deltas[0]; i++)
		if (strlen(tok__ucat_deltas[i].cat) == name_len &&
		    memcmp(tok__ucat_deltas[i].cat, name, name_len) == 0) {
			added = tok__ucat_deltas[i].added;
			removed = tok__ucat_deltas[i].removed;
		}
	char prop[64];
	if (name_len > 40)
		return err_set(e, ST_UNSUPPORTED, "regex /%s/: property name too long", pat);
	snprintf(prop, sizeof prop, "\\%c{%.*s}", negated ? 'P' : 'p', (int)name_len, name);
	bool has_add = *added, has_rm = *removed;
	if (!has_add && !has_rm) {
		puts_(b, prop);
		return ST_OK;
	}
	if (in_class) {
		/* Union inside the class: X16 = X14 + added; not-X16 = not-X14 + removed. */
		if ((!negated && has_rm) || (negated && has_add))
			return err_set(e, ST_UNSUPPORTED,
				       "regex /%s/: \\%c{%.*s} inside a class needs a Unicode %s "
				       "correction that a class cannot hold",
				       pat, negated ? 'P' : 'p', (int)name_len, name, TOK_UNICODE_TARGET);
		puts_(b, prop);
		puts_(b, negated ? removed : added);
		return ST_OK;
	}
	snprintf(prop, sizeof prop, "\\p{%.*s}", (int)name_len, name);
	if (!negated) {
		/* (X14 + added) - removed */
		if (has_rm) {
			puts_(b, "(?:(?![");
			puts_(b, removed);
			puts_(b, "])");
		}
		puts_(b, "[");
		puts_(b, prop);
		puts_(b, added);
		puts_(b, "]");
		if (has_rm)
			puts_(b, ")");
	} else {
		/* not (X14 + added) or removed */
		if (has_rm) {
			puts_(b, "(?:[");
			puts_(b, removed);
			puts_(b, "]|");
		}
		puts_(b, "[^");
		puts_(b, prop);
		puts_(b, added);
		puts_(b, "]");
		if (has_rm)
			puts_(b, ")");
	}
	return ST_OK;
}

/* A list of positive properties inside a class. */
static enum status put_props(struct sbuf *b, const char *const *names, bool in_class_already,
			     const char *pat, struct err *e)
{
	(void)in_class_already;
	for (; *names; names++) {
		enum status st = put_prop(b, *names, strlen(*names), false, true, pat, e);
		if (st != ST_OK)
			return st;
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

enum status tok__regex_translate(const char *pat, bool literal, char *out, size_t cap,
				 struct err *e)
{
	struct sbuf b = {out, 0, cap, false};
	if (cap)
		out[0] = 0;
	size_t n = strlen(pat);
	if (literal) {
		for (size_t i = 0; i < n; i++) {
			unsigned char c = (unsigned char)pat[i];
			if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
					  (c >= 'A' && c <= 'Z')))
				put(&b, "\\", 1);
			put(&b, pat + i, 1);
		}
		goto done;
	}
	bool in_class = false;
	size_t class_start = 0; /* index just after '[' or '[^' */
	for (size_t i = 0; i < n;) {
		char c = pat[i];
		if (c == '\\') {
			if (i + 1 >= n)
				return err_set(e, ST_INVALID, "regex /%s/: trailing backslash", pat);
			char x = pat[i + 1];
			if (strchr("SWH", x) && in_class)
				return err_set(e, ST_UNSUPPORTED,
					       "regex /%s/: \\%c inside a character class", pat, x);
			enum status st = ST_OK;
			bool done = true;
			switch (x) {
			case 's':
			case 'S':
			case 'w':
			case 'W':
				if (!in_class)
					puts_(&b, x == 's' || x == 'w' ? "[" : "[^");
				if (x == 's' || x == 'S')
					puts_(&b, ONIG_SPACE_CTRL);
				else
					puts_(&b, ONIG_WORD_LATIN1);
				st = put_props(&b, x == 's' || x == 'S' ? space_props : word_props, in_class,
					       pat, e);
				if (!in_class)
					puts_(&b, "]");
				break;
			case 'd':
			case 'D': st = put_prop(&b, "Nd", 2, x == 'D', in_class, pat, e); break;
			case 'h': puts_(&b, in_class ? ONIG_HEX : "[" ONIG_HEX "]"); break;
			case 'H': puts_(&b, "[^" ONIG_HEX "]"); break;
			default: done = false; break;
			}
			if (st != ST_OK)
				return st;
			if (done) {
				i += 2;
				continue;
			}
			if (x == 'u') {
				/* \uHHHH */
				if (i + 6 > n)
					return err_set(e, ST_INVALID, "regex /%s/: bad \\u", pat);
				char tmp[16];
				snprintf(tmp, sizeof tmp, "\\x{%.4s}", pat + i + 2);
				puts_(&b, tmp);
				i += 6;
				continue;
			}
			if (x == 'p' || x == 'P') {
				/* \p{Name} or \p{^Name}: same spelling in PCRE2. */
				const char *end = strchr(pat + i, '}');
				if (pat[i + 2] != '{' || !end)
					return err_set(e, ST_UNSUPPORTED,
						       "regex /%s/: \\%c without {name}", pat, x);
				const char *name = pat + i + 3;
				bool neg = x == 'P';
				if (*name == '^') {
					neg = !neg;
					name++;
				}
				st = put_prop(&b, name, (size_t)(end - name), neg, in_class, pat, e);
				if (st != ST_OK)
					return st;
				i = (size_t)(end - pat) + 1;
				continue;
			}
			if (x == 'R' || x == 'X' || x == 'K' || x == 'g' || x == 'k' || x == 'N' ||
			    x == 'O' || x == 'y' || x == 'Y')
				return err_set(e, ST_UNSUPPORTED, "regex /%s/: \\%c is not translated",
					       pat, x);
			/* Any other escape (\\, \[, \-, \n, \x{..}, \b, \A ...) means the
			 * same in both dialects; copy it with its whole character. */
			size_t l = 1 + char_len((unsigned char)x);
			put(&b, pat + i, l);
			i += l;
			continue;
		}
		if (in_class) {
			if (c == '[')
				return err_set(e, ST_UNSUPPORTED,
					       "regex /%s/: nested class or POSIX bracket", pat);
			if (c == '&' && i + 1 < n && pat[i + 1] == '&')
				return err_set(e, ST_UNSUPPORTED, "regex /%s/: class intersection", pat);
			if (c == ']' && i != class_start) {
				in_class = false;
				put(&b, "]", 1);
				i++;
				continue;
			}
		} else if (c == '[') {
			in_class = true;
			put(&b, "[", 1);
			i++;
			if (i < n && pat[i] == '^') {
				put(&b, "^", 1);
				i++;
			}
			class_start = i;
			continue;
		}
		size_t l = char_len((unsigned char)c);
		put(&b, pat + i, l);
		i += l;
	}
	if (in_class)
		return err_set(e, ST_INVALID, "regex /%s/: unterminated class", pat);
done:
	if (b.overflow)
		return err_set(e, ST_UNSUPPORTED, "regex /%s/: translation longer than %zu bytes",
			       pat, cap);
	return ST_OK;
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
	int errcode = 0;
	PCRE2_SIZE erroff = 0;
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED,
				       PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &errcode, &erroff,
				       NULL);
	if (!re) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(errcode, msg, sizeof msg);
		st = err_set(e, ST_INVALID, "regex /%s/ (as /%s/): %s at offset %zu", pattern, buf,
			     (const char *)msg, (size_t)erroff);
		free(buf);
		return st;
	}
	int jrc = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
	if (jit)
		*jit = jrc == 0;
	if (jrc != 0)
		log_msg(LOG_WARN, "model", "tokenizer: regex /%s/: no JIT (%d), interpreting", buf,
			jrc);
	free(buf);
	*out = re;
	return ST_OK;
}
