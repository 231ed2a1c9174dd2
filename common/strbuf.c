/*
 * common/strbuf.c: growable buffer; doubling growth, sticky failure.
 */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void strbuf_init(struct strbuf *b) { memset(b, 0, sizeof *b); }

void strbuf_free(struct strbuf *b)
{
	free(b->data);
	memset(b, 0, sizeof *b);
}

void strbuf_reset(struct strbuf *b)
{
	b->len = 0;
	if (b->data)
		b->data[0] = '\0';
}

static bool grow(struct strbuf *b, size_t extra)
{
	if (b->failed)
		return false;
	if (b->len + extra + 1 <= b->cap)
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->len + extra + 1) {
		if (cap > ((size_t)-1) / 2) {
			b->failed = true;
			return false;
		}
		cap *= 2;
	}
	char *d = realloc(b->data, cap);
	if (!d) {
		b->failed = true;
		return false;
	}
	b->data = d;
	b->cap = cap;
	return true;
}

void strbuf_append(struct strbuf *b, const char *s, size_t n)
{
	if (!grow(b, n))
		return;
	memcpy(b->data + b->len, s, n);
	b->len += n;
	b->data[b->len] = '\0';
}

void strbuf_puts(struct strbuf *b, const char *s)
{
	if (s)
		strbuf_append(b, s, strlen(s));
}

void strbuf_putc(struct strbuf *b, char c) { strbuf_append(b, &c, 1); }

void strbuf_printf(struct strbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	va_list ap2;
	va_copy(ap2, ap);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !grow(b, (size_t)n)) {
		if (n < 0)
			b->failed = true;
		va_end(ap2);
		return;
	}
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
	va_end(ap2);
	b->len += (size_t)n;
}

const char *strbuf_json_escape(unsigned char c, char tmp[7])
{
	static const char hex[] = "0123456789abcdef";
	switch (c) {
	case '"': return "\\\"";
	case '\\': return "\\\\";
	case '\n': return "\\n";
	case '\r': return "\\r";
	case '\t': return "\\t";
	case '\b': return "\\b";
	case '\f': return "\\f";
	default:
		if (c >= 0x20)
			return NULL;
		tmp[0] = '\\';
		tmp[1] = 'u';
		tmp[2] = '0';
		tmp[3] = '0';
		tmp[4] = hex[c >> 4];
		tmp[5] = hex[c & 15];
		tmp[6] = '\0';
		return tmp;
	}
}

void strbuf_json_string(struct strbuf *b, const char *s, size_t n)
{
	strbuf_append(b, "\"", 1);
	size_t run = 0; /* bytes copied verbatim in one go */
	for (size_t i = 0; i < n; i++) {
		char u[7];
		const char *esc = strbuf_json_escape((unsigned char)s[i], u);
		if (esc) {
			strbuf_append(b, s + i - run, run);
			run = 0;
			strbuf_puts(b, esc);
		} else {
			run++;
		}
	}
	strbuf_append(b, s + n - run, run);
	strbuf_append(b, "\"", 1);
}

bool strbuf_failed(const struct strbuf *b) { return b->failed; }

char *strbuf_take(struct strbuf *b, size_t *len)
{
	if (b->failed) {
		strbuf_free(b);
		if (len)
			*len = 0;
		return NULL;
	}
	if (!b->data && !grow(b, 0))
		return NULL;
	b->data[b->len] = '\0';
	char *d = b->data;
	if (len)
		*len = b->len;
	memset(b, 0, sizeof *b);
	return d;
}

const char *strbuf_cstr(struct strbuf *b)
{
	if (!b->data && !grow(b, 0))
		return "";
	return b->data;
}
