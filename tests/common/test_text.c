/*
 * tests/common/test_text.c: the text helpers of common/ on fresh random
 * inputs: strbuf_json_string (a JSON parser reads back exactly the bytes
 * that went in, and no control byte is left raw), strbuf_json_escape
 * (byte by byte, the same text), strbuf_puts / strbuf_putc, and
 * file_read_all (contents, the size limit, a missing file, a directory).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/strbuf.h"
#include "tests/test.h"

static uint64_t rng;

static uint32_t rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

/* Random valid UTF-8 with every ASCII byte likely (controls, quotes, backslashes). */
static size_t random_text(char *s, size_t cap)
{
	size_t n = 0, want = rnd((uint32_t)cap - 4);
	while (n < want) {
		uint32_t k = rnd(10);
		if (k < 7) {
			s[n++] = (char)rnd(128);
		} else if (k < 9) {
			uint32_t cp = 0x80 + rnd(0x800 - 0x80);
			s[n++] = (char)(0xC0 | (cp >> 6));
			s[n++] = (char)(0x80 | (cp & 0x3F));
		} else {
			uint32_t cp = 0x800 + rnd(0xD000 - 0x800);
			s[n++] = (char)(0xE0 | (cp >> 12));
			s[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			s[n++] = (char)(0x80 | (cp & 0x3F));
		}
	}
	return n;
}

static void check_json_string(void)
{
	char s[512];
	for (int it = 0; it < 2000; it++) {
		size_t n = random_text(s, sizeof s);
		struct strbuf b;
		strbuf_init(&b);
		strbuf_json_string(&b, s, n);
		T_CHECK(!strbuf_failed(&b) && b.len >= n + 2 && b.data[0] == '"' && b.data[b.len - 1] == '"');
		size_t raw_ctl = 0;
		for (size_t i = 0; i < b.len; i++)
			raw_ctl += (unsigned char)b.data[i] < 0x20;
		T_CHECKF(raw_ctl == 0, "%zu control bytes left raw", raw_ctl);
		json_error_t je;
		json_t *v = json_loadb(b.data, b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
		T_CHECKF(v && json_is_string(v), "not a JSON string: %s", je.text);
		if (v && json_is_string(v))
			T_CHECK(json_string_length(v) == n && !memcmp(json_string_value(v), s, n));
		json_decref(v);
		/* byte by byte through strbuf_json_escape: the same text */
		struct strbuf c;
		strbuf_init(&c);
		strbuf_putc(&c, '"');
		for (size_t i = 0; i < n; i++) {
			char tmp[7];
			const char *esc = strbuf_json_escape((unsigned char)s[i], tmp);
			if (esc)
				strbuf_puts(&c, esc);
			else
				strbuf_putc(&c, s[i]);
		}
		strbuf_putc(&c, '"');
		T_CHECK(c.len == b.len && !memcmp(c.data, b.data, b.len));
		strbuf_free(&c);
		strbuf_free(&b);
	}
	struct strbuf b;
	strbuf_init(&b);
	strbuf_puts(&b, NULL); /* nothing */
	strbuf_puts(&b, "ab");
	strbuf_putc(&b, 'c');
	T_CHECK(b.len == 3 && !strcmp(strbuf_cstr(&b), "abc"));
	strbuf_free(&b);
}

static void check_file_read_all(void)
{
	char path[] = "/tmp/dsv4_test_text_XXXXXX";
	int fd = mkstemp(path);
	T_CHECK(fd >= 0);
	if (fd < 0)
		return;
	size_t n = 1 + rnd(300000);
	char *data = malloc(n);
	for (size_t i = 0; i < n; i++)
		data[i] = (char)rnd(256);
	T_CHECK(write(fd, data, n) == (ssize_t)n);
	close(fd);
	char *buf = NULL;
	size_t got = 0;
	struct err e = {0};
	T_CHECKF(file_read_all(path, n, &buf, &got, &e) == ST_OK, "%s", e.msg);
	T_CHECK(buf && got == n && !memcmp(buf, data, n) && buf[n] == '\0');
	free(buf);
	T_CHECK(file_read_all(path, n - 1, &buf, &got, &e) == ST_INVALID && buf == NULL);
	T_STR_CONTAINS(e.msg, "more than the");
	unlink(path);
	T_CHECK(file_read_all(path, n, &buf, &got, &e) == ST_NOTFOUND && buf == NULL);
	T_STR_CONTAINS(e.msg, path);
	T_CHECK(file_read_all("/tmp", n, &buf, &got, &e) == ST_IO);
	T_STR_CONTAINS(e.msg, "not a regular file");
	free(data);
}

int main(void)
{
	rng = test_seed() * 0x9E3779B97F4A7C15ull | 1;
	check_json_string();
	check_file_read_all();
	return test_exit();
}
