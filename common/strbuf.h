/*
 * common/strbuf.h: a growable byte buffer for building responses (JSON, SSE,
 * Prometheus text, prompts); the one string builder of the tree. An
 * allocation failure is sticky: later appends do
 * nothing and strbuf_failed() tells, so callers check once at the end.
 */
#ifndef DSV4_COMMON_STRBUF_H
#define DSV4_COMMON_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

struct strbuf {
	char *data;   /* NUL-terminated when len > 0 or after strbuf_cstr */
	size_t len;
	size_t cap;
	bool failed;
};

void strbuf_init(struct strbuf *b);
void strbuf_free(struct strbuf *b);
void strbuf_reset(struct strbuf *b);          /* len = 0, keeps memory */
void strbuf_append(struct strbuf *b, const char *s, size_t n);
void strbuf_puts(struct strbuf *b, const char *s); /* s NULL: nothing */
void strbuf_putc(struct strbuf *b, char c);
void strbuf_printf(struct strbuf *b, const char *fmt, ...) DSV4_PRINTF(2, 3);
/* Append s as a JSON string literal, quotes included (valid UTF-8 assumed;
 * control characters escaped). */
void strbuf_json_string(struct strbuf *b, const char *s, size_t n);
/* The JSON escape of byte c inside a string (\", \\, \n, \r, \t, \b, \f, other
 * controls as \u00xx: what json.dumps writes), or NULL when c goes verbatim.
 * tmp holds a \u00xx escape. The one escaping table of the tree. */
const char *strbuf_json_escape(unsigned char c, char tmp[7]);
bool strbuf_failed(const struct strbuf *b);
/* Take the data (malloc'd, NUL-terminated, never NULL unless failed); b is reset. */
char *strbuf_take(struct strbuf *b, size_t *len);
const char *strbuf_cstr(struct strbuf *b);

#endif
