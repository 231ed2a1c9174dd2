/*
 * model/config_overrides.h: --hf-overrides (a JSON object merged into
 * config.json's top level before validation).
 */
#ifndef DSV4_MODEL_CONFIG_OVERRIDES_H
#define DSV4_MODEL_CONFIG_OVERRIDES_H

#include <stddef.h>

#include "common/status.h"

/*
 * Merge overrides (a JSON object text) into json (config.json's text, file
 * names it in messages). Every key must exist in config.json with a value of
 * the same JSON type (integer for a real is fine); otherwise ST_INVALID naming
 * the key. Lowering num_hidden_layers also trims compress_ratios/layer_types
 * unless the overrides give them. *out_json (malloc'ed, free()) is the merged
 * text of *out_bytes bytes.
 */
enum status model_config_apply_overrides(const char *json, size_t n_bytes, const char *file, const char *overrides,
					 char **out_json, size_t *out_bytes, struct err *e) DSV4_WUR;

#endif
