/*
 * server/cmd_tokenize.c: `dsv4 tokenize`, the tokenizer from the command line.
 *
 *   dsv4 tokenize --tokenizer PATH [--ids] [--added all|non-special|none] TEXT|-
 *   dsv4 tokenize --tokenizer PATH --decode [--skip-special] [--raw] ID...
 *   dsv4 tokenize --tokenizer PATH --batch FILE [--added ...]
 *   dsv4 tokenize --tokenizer PATH --batch-decode FILE [--skip-special]
 *   dsv4 tokenize --tokenizer PATH --bench FILE [--repeat N] [--whole]
 *
 * PATH is a tokenizer.json or a model directory. Without --ids each token is a
 * line "id<TAB>piece" (piece C-escaped); with --ids one line of ids.
 * --batch reads one hex-encoded byte string per line and writes one line of
 * space-separated ids each (what tests/model/test_tokenizer_hf.py diffs
 * against HF); --batch-decode reads lines of ids and writes the hex of the
 * decoded bytes, checking on the way that the streaming detokenizer's deltas
 * add up to the same bytes. --bench prints single-thread encode MB/s
 * (best of N passes; one encode per line, or of the whole file).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common/timeutil.h"
#include "model/detok.h"
#include "model/tokenizer.h"

static void usage(void)
{
	fprintf(stderr,
		"usage: dsv4 tokenize --tokenizer PATH [--ids] [--added all|non-special|none] TEXT|-\n"
		"       dsv4 tokenize --tokenizer PATH --decode [--skip-special] [--raw] ID...\n"
		"       dsv4 tokenize --tokenizer PATH --batch FILE | --batch-decode FILE\n"
		"       dsv4 tokenize --tokenizer PATH --bench FILE [--repeat N] [--whole]\n");
}

static char *read_all(FILE *f, size_t *len)
{
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		if (n == cap) {
			char *p = realloc(buf, cap * 2);
			if (!p) {
				free(buf);
				return NULL;
			}
			buf = p;
			cap *= 2;
		}
		size_t r = fread(buf + n, 1, cap - n, f);
		n += r;
		if (r == 0)
			break;
	}
	*len = n;
	return buf;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static void print_escaped(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '\\')
			fputs("\\\\", stdout);
		else if (c == '\n')
			fputs("\\n", stdout);
		else if (c == '\t')
			fputs("\\t", stdout);
		else if (c == '\r')
			fputs("\\r", stdout);
		else if (c < 0x20 || c == 0x7F)
			printf("\\x%02x", c);
		else
			putchar(c);
	}
}

static int batch_encode(struct model_tokenizer *tok, FILE *in, enum model_tok_added added)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t r;
	char *bytes = NULL;
	size_t bytes_cap = 0;
	int rc = CLI_EXIT_OK;
	while ((r = getline(&line, &cap, in)) >= 0) {
		while (r > 0 && (line[r - 1] == '\n' || line[r - 1] == '\r'))
			line[--r] = 0;
		size_t n = (size_t)r / 2;
		if (n + 1 > bytes_cap) {
			bytes_cap = 2 * (n + 1);
			char *p = realloc(bytes, bytes_cap);
			if (!p) {
				rc = CLI_EXIT_FAIL;
				break;
			}
			bytes = p;
		}
		for (size_t i = 0; i < n; i++)
			bytes[i] = (char)(hexval(line[2 * i]) << 4 | hexval(line[2 * i + 1]));
		int32_t *ids;
		size_t n_ids;
		struct err e = {0};
		if (model_tokenizer_encode_alloc(tok, bytes, n, added, &ids, &n_ids, &e) != ST_OK) {
			fprintf(stderr, "dsv4 tokenize: %s\n", e.msg);
			rc = CLI_EXIT_FAIL;
			break;
		}
		for (size_t i = 0; i < n_ids; i++)
			printf(i ? " %d" : "%d", ids[i]);
		putchar('\n');
		free(ids);
	}
	free(line);
	free(bytes);
	return rc;
}

static int batch_decode(struct model_tokenizer *tok, FILE *in, unsigned flags)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t r;
	int32_t *ids = NULL;
	size_t ids_cap = 0;
	int rc = CLI_EXIT_OK;
	struct model_detok *d = NULL;
	struct err e = {0};
	struct model_detok_options o = {.tok = tok, .flags = flags};
	if (model_detok_create(&d, &o, &e) != ST_OK) {
		fprintf(stderr, "dsv4 tokenize: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	while (rc == CLI_EXIT_OK && (r = getline(&line, &cap, in)) >= 0) {
		size_t n = 0;
		for (char *p = line, *end; *p && *p != '\n'; p = end) {
			long v = strtol(p, &end, 10);
			if (end == p)
				break;
			if (n == ids_cap) {
				ids_cap = ids_cap ? 2 * ids_cap : 256;
				ids = realloc(ids, ids_cap * sizeof *ids);
				if (!ids)
					return CLI_EXIT_FAIL;
			}
			ids[n++] = (int32_t)v;
		}
		char *text;
		size_t len;
		if (model_tokenizer_decode(tok, ids, n, flags, &text, &len, &e) != ST_OK) {
			fprintf(stderr, "dsv4 tokenize: %s\n", e.msg);
			rc = CLI_EXIT_FAIL;
			break;
		}
		/* The same ids through the detokenizer, one at a time. */
		model_detok_reset(d);
		size_t off = 0;
		bool same = true;
		for (size_t i = 0; i <= n && same; i++) {
			const char *delta;
			size_t dl;
			enum status st = i < n ? model_detok_feed(d, ids + i, 1, &delta, &dl, &e)
					       : model_detok_flush(d, &delta, &dl, &e);
			if (st != ST_OK || off + dl > len || memcmp(text + off, delta, dl) != 0)
				same = false;
			off += dl;
		}
		if (!same || off != len) {
			fprintf(stderr, "dsv4 tokenize: detokenizer deltas differ from decode\n");
			rc = CLI_EXIT_FAIL;
		}
		for (size_t i = 0; i < len; i++)
			printf("%02x", (unsigned char)text[i]);
		putchar('\n');
		free(text);
	}
	model_detok_destroy(d);
	free(ids);
	free(line);
	return rc;
}

static int bench(struct model_tokenizer *tok, const char *path, int repeat, bool whole)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "dsv4 tokenize: %s: %s\n", path, strerror(errno));
		return CLI_EXIT_FAIL;
	}
	size_t len;
	char *text = read_all(f, &len);
	fclose(f);
	if (!text)
		return CLI_EXIT_FAIL;
	/* One encode call per line (a server encodes one message at a time), or
	 * one for the whole file with --whole. */
	double best = 1e30;
	size_t n_tok = 0;
	for (int it = 0; it < repeat; it++) {
		double t0 = time_mono_s();
		n_tok = 0;
		for (size_t s = 0; s < len;) {
			char *nl = whole ? NULL : memchr(text + s, '\n', len - s);
			size_t e_ = nl ? (size_t)(nl - text) + 1 : len;
			int32_t *ids;
			size_t n;
			struct err e = {0};
			if (model_tokenizer_encode_alloc(tok, text + s, e_ - s, MODEL_TOK_ADDED_ALL, &ids,
							 &n, &e) != ST_OK) {
				fprintf(stderr, "dsv4 tokenize: %s\n", e.msg);
				free(text);
				return CLI_EXIT_FAIL;
			}
			free(ids);
			n_tok += n;
			s = e_;
		}
		double dt = time_mono_s() - t0;
		if (dt < best)
			best = dt;
	}
	printf("bytes %zu tokens %zu best_s %.6f MB/s %.2f\n", len, n_tok, best, len / best / 1e6);
	free(text);
	return CLI_EXIT_OK;
}

int cmd_tokenize(int argc, char **argv)
{
	const char *path = NULL, *batch = NULL, *batch_dec = NULL, *bench_file = NULL;
	bool ids_only = false, decode = false, whole = false;
	unsigned flags = 0;
	int repeat = 3;
	enum model_tok_added added = MODEL_TOK_ADDED_ALL;
	int i = 1;
	for (; i < argc; i++) {
		const char *a = argv[i];
		bool has_val = i + 1 < argc;
		if (!strcmp(a, "--tokenizer") && has_val)
			path = argv[++i];
		else if (!strcmp(a, "--ids"))
			ids_only = true;
		else if (!strcmp(a, "--decode"))
			decode = true;
		else if (!strcmp(a, "--skip-special"))
			flags |= MODEL_TOK_DECODE_SKIP_SPECIAL;
		else if (!strcmp(a, "--raw"))
			flags |= MODEL_TOK_DECODE_RAW;
		else if (!strcmp(a, "--batch") && has_val)
			batch = argv[++i];
		else if (!strcmp(a, "--batch-decode") && has_val)
			batch_dec = argv[++i];
		else if (!strcmp(a, "--bench") && has_val)
			bench_file = argv[++i];
		else if (!strcmp(a, "--whole"))
			whole = true;
		else if (!strcmp(a, "--repeat") && has_val)
			repeat = atoi(argv[++i]);
		else if (!strcmp(a, "--added") && has_val) {
			const char *v = argv[++i];
			if (!strcmp(v, "all"))
				added = MODEL_TOK_ADDED_ALL;
			else if (!strcmp(v, "non-special"))
				added = MODEL_TOK_ADDED_NON_SPECIAL;
			else if (!strcmp(v, "none"))
				added = MODEL_TOK_ADDED_NONE;
			else {
				usage();
				return CLI_EXIT_USAGE;
			}
		} else if (!strcmp(a, "--")) {
			i++;
			break;
		} else if (a[0] == '-' && a[1] == '-') {
			usage();
			return CLI_EXIT_USAGE;
		} else
			break;
	}
	if (!path || repeat < 1) {
		usage();
		return CLI_EXIT_USAGE;
	}
	struct model_tokenizer *tok;
	struct err e = {0};
	double t0 = time_mono_s();
	if (model_tokenizer_load(&tok, path, &e) != ST_OK) {
		fprintf(stderr, "dsv4 tokenize: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	double load_s = time_mono_s() - t0;
	int rc = CLI_EXIT_OK;
	if (batch || batch_dec) {
		const char *p = batch ? batch : batch_dec;
		FILE *f = strcmp(p, "-") ? fopen(p, "rb") : stdin;
		if (!f) {
			fprintf(stderr, "dsv4 tokenize: %s: %s\n", p, strerror(errno));
			rc = CLI_EXIT_FAIL;
		} else {
			rc = batch ? batch_encode(tok, f, added) : batch_decode(tok, f, flags);
			if (f != stdin)
				fclose(f);
		}
	} else if (bench_file) {
		printf("load_s %.3f\n", load_s);
		rc = bench(tok, bench_file, repeat, whole);
	} else if (decode) {
		int n = argc - i;
		int32_t *ids = calloc(n > 0 ? (size_t)n : 1, sizeof *ids);
		for (int k = 0; ids && k < n; k++)
			ids[k] = (int32_t)strtol(argv[i + k], NULL, 10);
		char *text;
		size_t len;
		if (!ids || model_tokenizer_decode(tok, ids, (size_t)n, flags, &text, &len, &e) != ST_OK) {
			fprintf(stderr, "dsv4 tokenize: %s\n", ids ? e.msg : "out of memory");
			rc = CLI_EXIT_FAIL;
		} else {
			fwrite(text, 1, len, stdout);
			putchar('\n');
			free(text);
		}
		free(ids);
	} else {
		char *text = NULL;
		size_t len = 0;
		if (i < argc && !strcmp(argv[i], "-")) {
			text = read_all(stdin, &len);
		} else {
			for (int k = i; k < argc; k++)
				len += strlen(argv[k]) + 1;
			text = calloc(len + 1, 1);
			len = 0;
			for (int k = i; text && k < argc; k++)
				len += (size_t)sprintf(text + len, k > i ? " %s" : "%s", argv[k]);
		}
		int32_t *ids = NULL;
		size_t n = 0;
		if (!text || model_tokenizer_encode_alloc(tok, text, len, added, &ids, &n, &e) != ST_OK) {
			fprintf(stderr, "dsv4 tokenize: %s\n", text ? e.msg : "out of memory");
			rc = CLI_EXIT_FAIL;
		} else if (ids_only) {
			for (size_t k = 0; k < n; k++)
				printf(k ? " %d" : "%d", ids[k]);
			putchar('\n');
		} else {
			for (size_t k = 0; k < n; k++) {
				size_t pl;
				const char *p = model_tokenizer_piece(tok, ids[k], &pl);
				printf("%d\t", ids[k]);
				print_escaped(p, pl);
				putchar('\n');
			}
		}
		free(ids);
		free(text);
	}
	model_tokenizer_destroy(tok);
	return rc;
}
