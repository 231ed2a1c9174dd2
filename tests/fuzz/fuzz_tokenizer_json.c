/*
 * tests/fuzz/fuzz_tokenizer_json.c: libFuzzer target for tokenizer.json
 * loading (model_tokenizer_load: the BPE model, vocab, merges, added tokens,
 * pre-tokenizer regexes compiled by PCRE2) on arbitrary bytes. The bytes are
 * a memfd named by its /proc path (the loader takes a file). A tokenizer
 * that loads then encodes and decodes a short mixed text (a sanitizer
 * report or crash anywhere is a finding).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = memfd_create("tokenizer.json", MFD_CLOEXEC);
	if (fd < 0)
		return 0;
	size_t off = 0;
	while (off < size) {
		ssize_t w = write(fd, data + off, size - off);
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	char path[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	struct model_tokenizer *tok = NULL;
	struct err e = {0};
	if (off == size && model_tokenizer_load(&tok, path, &e) == ST_OK) {
		static const char text[] = "Hello, wörld! 数据 123 <｜begin▁of▁sentence｜>  \n\tend";
		int32_t *ids = NULL;
		size_t n = 0;
		if (model_tokenizer_encode_alloc(tok, text, sizeof text - 1, MODEL_TOK_ADDED_ALL, &ids, &n, &e) ==
		    ST_OK) {
			char *out = NULL;
			size_t len = 0;
			if (model_tokenizer_decode(tok, ids, n, 0, &out, &len, &e) == ST_OK)
				free(out);
		}
		free(ids);
		model_tokenizer_destroy(tok);
	}
	close(fd);
	return 0;
}
