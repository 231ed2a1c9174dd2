/*
 * tests/fuzz/fuzz_safetensors.c: libFuzzer target for the safetensors header
 * parser (model_st_header_parse) on arbitrary file bytes: it must never read
 * past the file, and every accepted tensor must lie inside the data area.
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* An exact-size copy, so that ASan catches any read past the file. */
	uint8_t *file = malloc(size ? size : 1);
	if (!file)
		return 0;
	for (size_t i = 0; i < size; i++)
		file[i] = data[i];
	struct model_st_header h;
	struct err e = {0};
	if (model_st_header_parse(file, size, "fuzz.safetensors", &h, &e) == ST_OK)
		model_st_header_free(&h);
	free(file);
	return 0;
}
