/*
 * tests/fuzz/fuzz_config.c: libFuzzer target for config.json parsing and
 * validation (model_config_parse) on arbitrary bytes.
 */
#include <stdint.h>
#include <stdlib.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct model_config *cfg = malloc(sizeof *cfg);
	if (!cfg)
		return 0;
	struct err e = {0};
	(void)model_config_parse((const char *)data, size, "fuzz/config.json", cfg, &e);
	free(cfg);
	return 0;
}
