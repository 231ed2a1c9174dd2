/*
 * model/tokenizer_utf8.c: UTF-8 well-formedness by the Unicode "maximal
 * subpart" rule (Unicode 15, section 3.9, table 3-7), which is what Rust's
 * String::from_utf8_lossy and Python's decode("utf-8", "replace") use to place
 * U+FFFD. Encoding sanitizes its input with it, decoding and the streaming
 * detokenizer sanitize their output with it, so all three agree with HF.
 */
#include "tokenizer.h"

/* Bounds of the second byte for each lead byte; later bytes are 80..BF. */
static int utf8_lead(uint8_t b, uint8_t *lo, uint8_t *hi)
{
	*lo = 0x80;
	*hi = 0xBF;
	if (b < 0x80)
		return 1;
	if (b >= 0xC2 && b <= 0xDF)
		return 2;
	if (b >= 0xE0 && b <= 0xEF) {
		if (b == 0xE0)
			*lo = 0xA0;
		if (b == 0xED)
			*hi = 0x9F;
		return 3;
	}
	if (b >= 0xF0 && b <= 0xF4) {
		if (b == 0xF0)
			*lo = 0x90;
		if (b == 0xF4)
			*hi = 0x8F;
		return 4;
	}
	return 0; /* 80..C1, F5..FF never start a character */
}

int model_utf8_classify(const uint8_t *s, size_t n, size_t *seq_len)
{
	uint8_t lo, hi;
	int need = utf8_lead(s[0], &lo, &hi);
	if (need == 0) {
		*seq_len = 1;
		return 0;
	}
	for (int k = 1; k < need; k++) {
		if ((size_t)k >= n) {
			*seq_len = n;
			return -1;
		}
		uint8_t c = s[k];
		if (c < lo || c > hi) {
			*seq_len = (size_t)k;
			return 0;
		}
		lo = 0x80;
		hi = 0xBF;
	}
	*seq_len = (size_t)need;
	return 1;
}

size_t model_utf8_valid_prefix(const uint8_t *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		/* ASCII runs dominate; skip them eight bytes at a time. */
		while (i + 8 <= n) {
			uint64_t w;
			__builtin_memcpy(&w, s + i, 8);
			if (w & 0x8080808080808080ull)
				break;
			i += 8;
		}
		if (i >= n)
			break;
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		size_t len;
		if (model_utf8_classify(s + i, n - i, &len) != 1)
			return i;
		i += len;
	}
	return n;
}
