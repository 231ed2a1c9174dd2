/*
 * model/spec_config.c: --speculative-config, spelled as vLLM spells it
 * ('{"method": "mtp", "num_speculative_tokens": 2}'), parsed and checked
 * against the checkpoint's draft model (model/spec.h).
 */
#include "model/spec.h"

#include <jansson.h>
#include <string.h>

enum status spec_config_parse(const char *json, struct spec_config *out, struct err *e)
{
	memset(out, 0, sizeof *out);
	if (!json || !*json)
		return ST_OK;
	json_error_t je;
	json_t *root = json_loads(json, 0, &je);
	if (!root)
		return err_set(e, ST_INVALID, "--speculative-config: not JSON (%s at column %d)", je.text, je.column);
	enum status st = ST_OK;
	const char *key;
	json_t *v;
	bool have_method = false, have_k = false;
	if (!json_is_object(root)) {
		st = err_set(e, ST_INVALID, "--speculative-config: expected a JSON object");
		goto done;
	}
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "method")) {
			const char *m = json_string_value(v);
			if (!m) {
				st = err_set(e, ST_INVALID, "--speculative-config: \"method\" must be a string");
				goto done;
			}
			if (!strcmp(m, "mtp") || !strcmp(m, "deepseek_mtp"))
				out->method = MODEL_DRAFT_MTP;
			else if (!strcmp(m, "dspark"))
				out->method = MODEL_DRAFT_DSPARK;
			else {
				st = err_set(e, ST_INVALID, "--speculative-config: method '%s': dsv4 knows \"mtp\" and \"dspark\"",
					     m);
				goto done;
			}
			have_method = true;
		} else if (!strcmp(key, "num_speculative_tokens")) {
			if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > EXEC_SPEC_MAX_DRAFT) {
				st = err_set(e, ST_INVALID, "--speculative-config: \"num_speculative_tokens\" must be an integer "
							   "in 1..%d", EXEC_SPEC_MAX_DRAFT);
				goto done;
			}
			out->num_speculative_tokens = (uint32_t)json_integer_value(v);
			have_k = true;
		} else {
			st = err_set(e, ST_INVALID, "--speculative-config: unknown key \"%s\" (method, num_speculative_tokens)",
				     key);
			goto done;
		}
	}
	if (!have_method)
		st = err_set(e, ST_INVALID, "--speculative-config: \"method\" is required (\"mtp\" or \"dspark\")");
	else if (!have_k)
		out->num_speculative_tokens = out->method == MODEL_DRAFT_DSPARK ? SPEC_MAX_DSPARK_TOKENS : 1;
done:
	json_decref(root);
	if (st)
		memset(out, 0, sizeof *out);
	return st;
}

enum status spec_config_check(const struct spec_config *c, const struct model_config *cfg, struct err *e)
{
	if (c->method == MODEL_DRAFT_NONE)
		return ST_OK;
	enum model_draft_kind have = cfg->draft_kind;
	if (c->method == MODEL_DRAFT_MTP && have == MODEL_DRAFT_DSPARK)
		return err_set(e, ST_INVALID,
			       "--speculative-config: method \"mtp\" on a 0731 checkpoint: its mtp.* tensors are the %d DSpark "
			       "draft stages, not a NextN MTP layer; use {\"method\": \"dspark\"}",
			       cfg->n_draft_layers);
	if (c->method == MODEL_DRAFT_DSPARK && have == MODEL_DRAFT_MTP)
		return err_set(e, ST_INVALID,
			       "--speculative-config: method \"dspark\" needs the 0731 checkpoint's DSpark stages; this "
			       "checkpoint carries the June NextN MTP layer: use {\"method\": \"mtp\"}");
	if (have == MODEL_DRAFT_NONE || cfg->n_draft_layers < 1)
		return err_set(e, ST_INVALID, "--speculative-config: method \"%s\": the checkpoint has no draft model "
					     "(no mtp.* tensors)", model_draft_kind_str(c->method));
	uint32_t max = c->method == MODEL_DRAFT_MTP ? SPEC_MAX_MTP_TOKENS : SPEC_MAX_DSPARK_TOKENS;
	if (c->num_speculative_tokens < 1 || c->num_speculative_tokens > max)
		return err_set(e, ST_INVALID, "--speculative-config: num_speculative_tokens %u: method \"%s\" drafts 1..%u",
			       c->num_speculative_tokens, model_draft_kind_str(c->method), max);
	return ST_OK;
}
