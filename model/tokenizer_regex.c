/*
 * model/tokenizer_regex.c: HF tokenizers compiles Split patterns with
 * Oniguruma (the `onig` crate, Unicode mode); we compile them with PCRE2 in
 * UTF + UCP mode, JIT included. The two agree on \p{..} categories and on the
 * backtracking semantics, but not on every shorthand class, so this file
 * rewrites the shorthands into explicit property classes that mean what
 * Oniguruma means:
 *   \s  U+0009..U+000D, U+0085 and General_Category Z (Zs, Zl, Zp);
 *       PCRE2's UCP \s leaves out U+0085.
 *   \w  L, M, Nd, Pc   (PCRE2 10.42's UCP \w is L, N and '_')
 *   \d  Nd             \h  hex digit (PCRE2's \h is horizontal space)
 *   \uHHHH -> \x{HHHH}; ^ and $ are line anchors in Oniguruma (PCRE2_MULTILINE).
 * Constructs whose meaning differs and that we do not translate (nested or
 * intersected classes, POSIX brackets, negated shorthands inside a class) are
 * refused with ST_UNSUPPORTED rather than approximated.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "tokenizer_internal.h"

#define ONIG_SPACE "\\t-\\r\\x{85}\\p{Z}"
#define ONIG_WORD "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
#define ONIG_DIGIT "\\p{Nd}"
#define ONIG_HEX "0-9A-Fa-f"

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
			const char *rep = NULL;
			switch (x) {
			case 's': rep = in_class ? ONIG_SPACE : "[" ONIG_SPACE "]"; break;
			case 'S': rep = in_class ? NULL : "[^" ONIG_SPACE "]"; break;
			case 'w': rep = in_class ? ONIG_WORD : "[" ONIG_WORD "]"; break;
			case 'W': rep = in_class ? NULL : "[^" ONIG_WORD "]"; break;
			case 'd': rep = ONIG_DIGIT; break;
			case 'D': rep = "\\P{Nd}"; break;
			case 'h': rep = in_class ? ONIG_HEX : "[" ONIG_HEX "]"; break;
			case 'H': rep = in_class ? NULL : "[^" ONIG_HEX "]"; break;
			default: break;
			}
			if (strchr("SWH", x) && in_class)
				return err_set(e, ST_UNSUPPORTED,
					       "regex /%s/: \\%c inside a character class", pat, x);
			if (rep) {
				puts_(&b, rep);
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
				put(&b, pat + i, (size_t)(end - (pat + i)) + 1);
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

enum status tok__regex_compile(const char *pattern, bool literal, pcre2_code **out,
			       struct err *e)
{
	*out = NULL;
	size_t cap = strlen(pattern) * 24 + 64;
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
	if (jrc != 0)
		log_msg(LOG_WARN, "model", "tokenizer: regex /%s/: no JIT (%d), interpreting", buf,
			jrc);
	free(buf);
	*out = re;
	return ST_OK;
}
