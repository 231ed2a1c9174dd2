/*
 * model/config_overrides.c: --hf-overrides, applied to config.json's text
 * before it is parsed and validated (vLLM's flag of the same name).
 *
 * Owns one rule set: the overrides are a JSON object whose every key already
 * exists at the top level of config.json, with a value of the same JSON type
 * (an integer may stand for a real); unknown keys, null and type changes are
 * refused naming the key. Overriding num_hidden_layers alone also trims
 * compress_ratios / layer_types to the new main stack (keeping the entries of
 * the NextN layers), so '{"num_hidden_layers": 8}' is enough to shrink the
 * real config.
 */
#include "model/config_overrides.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *type_str(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	default: return "null";
	}
}

static bool same_type(const json_t *have, const json_t *want)
{
	if (json_is_boolean(have))
		return json_is_boolean(want);
	if (json_is_real(have))
		return json_is_number(want);
	return json_typeof(have) == json_typeof(want);
}

/* num_hidden_layers changed, the schedule not: keep the first n_main entries
 * and the NextN entries that followed the old main stack. */
static enum status trim_schedule(json_t *root, const char *key, int64_t old_main, int64_t new_main, struct err *e)
{
	json_t *a = json_object_get(root, key);
	if (!json_is_array(a))
		return ST_OK;
	int64_t n = (int64_t)json_array_size(a);
	json_t *b = json_array();
	if (!b)
		return err_set(e, ST_NOMEM, "--hf-overrides: out of memory");
	for (int64_t i = 0; i < n; i++)
		if (i < new_main || i >= old_main)
			json_array_append(b, json_array_get(a, (size_t)i));
	json_object_set_new(root, key, b);
	return ST_OK;
}

enum status model_config_apply_overrides(const char *json, size_t n_bytes, const char *file, const char *overrides,
					 char **out_json, size_t *out_bytes, struct err *e)
{
	*out_json = NULL;
	*out_bytes = 0;
	json_error_t je;
	json_t *ov = json_loads(overrides, JSON_REJECT_DUPLICATES, &je);
	if (!ov)
		return err_set(e, ST_INVALID, "--hf-overrides: not valid JSON: %s (column %d)", je.text, je.column);
	if (!json_is_object(ov)) {
		json_decref(ov);
		return err_set(e, ST_INVALID, "--hf-overrides: must be a JSON object such as '{\"num_hidden_layers\": 8}'");
	}
	json_t *root = json_loadb(json, n_bytes, JSON_REJECT_DUPLICATES, &je);
	if (!root || !json_is_object(root)) {
		json_decref(ov);
		json_decref(root);
		return err_set(e, ST_INVALID, "%s: not a JSON object (line %d: %s)", file, je.line, je.text);
	}
	enum status st = ST_OK;
	const char *key;
	json_t *v;
	json_object_foreach(ov, key, v) {
		json_t *have = json_object_get(root, key);
		if (!have) {
			st = err_set(e, ST_INVALID, "--hf-overrides: key %s: unknown (%s has no such field)", key, file);
			break;
		}
		if (json_is_null(v) || !same_type(have, v)) {
			st = err_set(e, ST_INVALID, "--hf-overrides: key %s: %s, but %s has %s", key, type_str(v), file,
				     type_str(have));
			break;
		}
	}
	if (st == ST_OK) {
		json_t *nl = json_object_get(ov, "num_hidden_layers");
		json_t *old = json_object_get(root, "num_hidden_layers");
		if (nl && json_is_integer(old) && json_integer_value(nl) < json_integer_value(old)) {
			int64_t o = json_integer_value(old), n = json_integer_value(nl);
			if (n < 0)
				st = err_set(e, ST_INVALID, "--hf-overrides: key num_hidden_layers: %lld is negative",
					     (long long)n);
			if (st == ST_OK && !json_object_get(ov, "compress_ratios"))
				st = trim_schedule(root, "compress_ratios", o, n, e);
			if (st == ST_OK && !json_object_get(ov, "layer_types"))
				st = trim_schedule(root, "layer_types", o, n, e);
		}
	}
	if (st == ST_OK) {
		json_object_foreach(ov, key, v) json_object_set(root, key, v);
		char *s = json_dumps(root, JSON_COMPACT);
		if (!s)
			st = err_set(e, ST_NOMEM, "--hf-overrides: out of memory");
		else {
			*out_json = s;
			*out_bytes = strlen(s);
		}
	}
	json_decref(ov);
	json_decref(root);
	return st;
}
