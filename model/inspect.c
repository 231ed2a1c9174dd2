/*
 * model/inspect.c: formats the summary of a validated checkpoint.
 *
 * Reads only the public accessors of model/checkpoint.h, so what it prints
 * is what the loader will see: the config, which layer is sliding / CSA /
 * HCA / hash-routed / MTP, the storage format detected per (layer, group),
 * tensor count and bytes per dtype.
 */
#include "model/inspect.h"

#include <stdarg.h>
#include <string.h>

static const enum model_group shown_groups[] = {MODEL_GROUP_ATTN, MODEL_GROUP_SHARED_EXPERTS,
						MODEL_GROUP_ROUTED_EXPERTS, MODEL_GROUP_MTP_PROJ};

static void human_bytes(char *buf, size_t n, uint64_t b)
{
	if (b >= (1ull << 30))
		snprintf(buf, n, "%.2f GiB", (double)b / (double)(1ull << 30));
	else if (b >= (1ull << 20))
		snprintf(buf, n, "%.2f MiB", (double)b / (double)(1ull << 20));
	else if (b >= 1024)
		snprintf(buf, n, "%.2f KiB", (double)b / 1024.0);
	else
		snprintf(buf, n, "%llu B", (unsigned long long)b);
}

/* Append to buf (bounded), keeping it NUL-terminated. */
static void cat(char *buf, size_t n, size_t *o, const char *fmt, ...) DSV4_PRINTF(4, 5);
static void cat(char *buf, size_t n, size_t *o, const char *fmt, ...)
{
	if (*o >= n)
		return;
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(buf + *o, n - *o, fmt, ap);
	va_end(ap);
	if (k > 0)
		*o += (size_t)k < n - *o ? (size_t)k : n - *o - 1;
}

/* Formats used by group g in main layers (main=true) or MTP layers, as a bit mask. */
static unsigned group_formats(const struct model_checkpoint *ck, enum model_group g, bool main)
{
	const struct model_config *c = model_checkpoint_config(ck);
	unsigned mask = 0;
	for (int L = 0; L < c->n_layers_total; L++) {
		if (model_config_is_mtp_layer(c, L) == main)
			continue;
		enum model_weight_format f = model_checkpoint_group_format(ck, L, g);
		if (f != MODEL_FMT_NONE)
			mask |= 1u << f;
	}
	return mask;
}

static void formats_str(char *buf, size_t n, size_t *o, unsigned mask)
{
	bool first = true;
	for (int f = 1; f < MODEL_FMT_COUNT; f++)
		if (mask & (1u << f)) {
			cat(buf, n, o, "%s%s", first ? "" : "+", model_weight_format_str((enum model_weight_format)f));
			first = false;
		}
}

void model_inspect_quant_summary(const struct model_checkpoint *ck, char *buf, size_t n)
{
	const struct model_config *c = model_checkpoint_config(ck);
	size_t o = 0;
	buf[0] = '\0';
	unsigned all = 0;
	for (size_t i = 0; i < sizeof shown_groups / sizeof shown_groups[0]; i++)
		all |= group_formats(ck, shown_groups[i], true) | group_formats(ck, shown_groups[i], false);
	bool quantized = all & ((1u << MODEL_FMT_FP8_BLOCK) | (1u << MODEL_FMT_MXFP4) | (1u << MODEL_FMT_NVFP4));
	if (!quantized)
		cat(buf, n, &o, "none (%s linears); ", all == (1u << MODEL_FMT_BF16) ? "BF16" : "dequantized");
	else
		cat(buf, n, &o, "%s %s, %s scales per %lldx%lld block%s%s; ", c->quant.quant_method, c->quant.fmt,
		    c->quant.scale_fmt[0] ? c->quant.scale_fmt : "e8m0", (long long)c->quant.weight_block_size[0],
		    (long long)c->quant.weight_block_size[1], c->quant.moe_nvfp4 ? ", moe NVFP4" : "",
		    c->expert_dtype != MODEL_EXPERT_DTYPE_ABSENT ? (c->expert_dtype == MODEL_EXPERT_DTYPE_FP4
									    ? ", expert_dtype fp4"
									    : c->expert_dtype == MODEL_EXPERT_DTYPE_FP8
										      ? ", expert_dtype fp8"
										      : ", expert_dtype bf16")
								 : "");
	bool first = true;
	for (size_t i = 0; i < sizeof shown_groups / sizeof shown_groups[0]; i++) {
		enum model_group g = shown_groups[i];
		unsigned mm = group_formats(ck, g, true), mt = group_formats(ck, g, false);
		if (!mm && !mt)
			continue;
		cat(buf, n, &o, "%s%s ", first ? "" : ", ", model_group_str(g));
		first = false;
		if (mm)
			formats_str(buf, n, &o, mm);
		if (!mm) {
			formats_str(buf, n, &o, mt);
		} else if (mt && mt != mm) {
			cat(buf, n, &o, " (MTP ");
			formats_str(buf, n, &o, mt);
			cat(buf, n, &o, ")");
		}
	}
}

/* "0 1 6(mtp.0)" for the layers where pred holds. */
static void layer_list(const struct model_checkpoint *ck, char *buf, size_t n, int kind)
{
	const struct model_config *c = model_checkpoint_config(ck);
	size_t o = 0;
	buf[0] = '\0';
	for (int L = 0; L < c->n_layers_total; L++) {
		bool in = kind < 3 ? (int)model_config_attn_kind(c, L) == kind
			: kind == 3 ? model_config_is_hash_layer(c, L)
				    : model_config_is_mtp_layer(c, L);
		if (!in)
			continue;
		if (model_config_is_mtp_layer(c, L))
			cat(buf, n, &o, "%s%d(mtp.%d)", o ? " " : "", L, L - (int)c->num_hidden_layers);
		else
			cat(buf, n, &o, "%s%d", o ? " " : "", L);
	}
	if (!o)
		cat(buf, n, &o, "-");
}

enum status model_inspect_write(const struct model_checkpoint *ck, const struct model_inspect_options *opt,
				FILE *out, struct err *e)
{
	const struct model_config *c = model_checkpoint_config(ck);
	fprintf(out, "checkpoint: %s\n", model_checkpoint_dir(ck));
	fprintf(out, "fingerprint: %016llx\n", (unsigned long long)model_checkpoint_fingerprint(ck));
	fprintf(out, "architecture: %s, model_type %s, torch_dtype %s\n", c->architecture,
		c->model_type[0] ? c->model_type : "-", c->torch_dtype[0] ? c->torch_dtype : "-");

	fprintf(out, "\nconfig:\n");
	fprintf(out, "  vocab %lld, hidden %lld, layers %lld + %d %s, max_position_embeddings %lld\n",
		(long long)c->vocab_size, (long long)c->hidden_size, (long long)c->num_hidden_layers, c->n_draft_layers,
		c->draft_kind == MODEL_DRAFT_DSPARK ? "DSpark" : "MTP", (long long)c->max_position_embeddings);
	if (c->draft_kind == MODEL_DRAFT_DSPARK) {
		fprintf(out, "  draft: dspark, %d stage%s (mtp.0-mtp.%d), block %lld, noise token %lld, markov rank %lld, "
			"target layers", c->n_draft_layers, c->n_draft_layers == 1 ? "" : "s", c->n_draft_layers - 1,
			(long long)c->dspark.block_size, (long long)c->dspark.noise_token_id,
			(long long)c->dspark.markov_rank);
		for (int i = 0; i < c->dspark.n_target_layers; i++)
			fprintf(out, " %lld", (long long)c->dspark.target_layer_ids[i]);
		fprintf(out, "\n");
	} else if (c->draft_kind == MODEL_DRAFT_MTP) {
		fprintf(out, "  draft: mtp (NextN), %d layer%s\n", c->n_draft_layers, c->n_draft_layers == 1 ? "" : "s");
	} else {
		fprintf(out, "  draft: none\n");
	}
	fprintf(out, "  attention: %lld heads, %lld kv head, head_dim %lld (rope %lld), q_lora %lld, "
		"o_groups %lld x o_lora %lld, sliding_window %lld\n",
		(long long)c->num_attention_heads, (long long)c->num_key_value_heads, (long long)c->head_dim,
		(long long)c->qk_rope_head_dim, (long long)c->q_lora_rank, (long long)c->o_groups,
		(long long)c->o_lora_rank, (long long)c->sliding_window);
	fprintf(out, "  rope: theta %g (sliding), %g (compressed)", c->rope_theta, c->compress_rope_theta);
	if (c->rope_scaling.type == MODEL_ROPE_SCALING_YARN)
		fprintf(out, ", yarn factor %g, original_max_position_embeddings %lld, beta_fast %g, beta_slow %g\n",
			c->rope_scaling.factor, (long long)c->rope_scaling.original_max_position_embeddings,
			c->rope_scaling.beta_fast, c->rope_scaling.beta_slow);
	else
		fprintf(out, ", no scaling\n");
	fprintf(out, "  indexer: %lld heads x %lld, topk %lld\n", (long long)c->index_n_heads,
		(long long)c->index_head_dim, (long long)c->index_topk);
	fprintf(out, "  moe: %lld routed + %lld shared experts, top-%lld, intermediate %lld, %s/%s, "
		"norm_topk_prob %s, routed_scaling_factor %g, swiglu_limit %g, %s, hash layers %lld\n",
		(long long)c->n_routed_experts, (long long)c->n_shared_experts, (long long)c->num_experts_per_tok,
		(long long)c->moe_intermediate_size, c->scoring_func, c->topk_method,
		c->norm_topk_prob ? "true" : "false", c->routed_scaling_factor, c->swiglu_limit, c->hidden_act,
		(long long)c->num_hash_layers);
	fprintf(out, "  hyper-connections: %lld streams, sinkhorn %lld iters, eps %g; rms_norm_eps %g\n",
		(long long)c->hc_mult, (long long)c->hc_sinkhorn_iters, c->hc_eps, c->rms_norm_eps);
	fprintf(out, "  tokens: bos %lld, eos %lld; tie_word_embeddings %s\n", (long long)c->bos_token_id,
		(long long)c->eos_token_id, c->tie_word_embeddings ? "true" : "false");

	char list[1024];
	fprintf(out, "\nlayer types:\n");
	/* the draft row says which draft model the mtp.* layers are */
	static const char *const kinds[] = {"sliding", "CSA", "HCA", "hash-routed", "MTP"};
	for (int k = 0; k < 5; k++) {
		layer_list(ck, list, sizeof list, k);
		fprintf(out, "  %-12s %s\n", k == 4 && c->draft_kind == MODEL_DRAFT_DSPARK ? "DSpark" : kinds[k], list);
	}
	fprintf(out, "\n  %-6s %-9s %-8s %-6s %-8s %-10s %-8s %-8s %s\n", "layer", "prefix", "attn", "ratio",
		"routing", "attention", "shared", "experts", "mtp-proj");
	for (int L = 0; L < c->n_layers_total; L++) {
		char prefix[32];
		model_schema_layer_prefix(c, L, prefix, sizeof prefix);
		fprintf(out, "  %-6d %-9s %-8s %-6d %-8s %-10s %-8s %-8s %s\n", L, prefix,
			model_attn_kind_str(model_config_attn_kind(c, L)), c->compress_ratios[L],
			model_config_is_hash_layer(c, L) ? "hash" : "topk",
			model_weight_format_str(model_checkpoint_group_format(ck, L, MODEL_GROUP_ATTN)),
			model_weight_format_str(model_checkpoint_group_format(ck, L, MODEL_GROUP_SHARED_EXPERTS)),
			model_weight_format_str(model_checkpoint_group_format(ck, L, MODEL_GROUP_ROUTED_EXPERTS)),
			model_weight_format_str(model_checkpoint_group_format(ck, L, MODEL_GROUP_MTP_PROJ)));
	}

	uint64_t bytes[MODEL_DTYPE_COUNT] = {0}, count[MODEL_DTYPE_COUNT] = {0}, total = 0;
	size_t n = model_checkpoint_n_tensors(ck);
	for (size_t i = 0; i < n; i++) {
		const struct model_tensor *t = model_checkpoint_tensor_at(ck, i);
		bytes[t->dtype] += t->n_bytes;
		count[t->dtype]++;
		total += t->n_bytes;
	}
	char hb[32];
	human_bytes(hb, sizeof hb, total);
	fprintf(out, "\ntensors: %zu in %d shard%s, %llu bytes (%s)\n", n, model_checkpoint_n_shards(ck),
		model_checkpoint_n_shards(ck) == 1 ? "" : "s", (unsigned long long)total, hb);
	fprintf(out, "bytes per dtype:\n");
	for (int d = 0; d < MODEL_DTYPE_COUNT; d++) {
		if (!count[d])
			continue;
		human_bytes(hb, sizeof hb, bytes[d]);
		fprintf(out, "  %-8s %8llu tensors %14llu bytes (%s)\n", model_dtype_str((enum model_dtype)d),
			(unsigned long long)count[d], (unsigned long long)bytes[d], hb);
	}
	char q[512];
	model_inspect_quant_summary(ck, q, sizeof q);
	fprintf(out, "quantization: %s\n", q);
	unsigned used = 0;
	for (size_t i = 0; i < n; i++)
		used |= 1u << model_checkpoint_tensor_at(ck, i)->format;
	if (used & (1u << MODEL_FMT_FP8_BLOCK))
		fprintf(out, "  FP8:   e4m3 weights, one E8M0 scale per %lldx%lld block (.scale)\n",
			(long long)c->quant.weight_block_size[0], (long long)c->quant.weight_block_size[1]);
	if (used & (1u << MODEL_FMT_MXFP4))
		fprintf(out, "  MXFP4: e2m1 pairs in I8, one E8M0 scale per 1x32 (.scale)\n");
	if (used & (1u << MODEL_FMT_NVFP4))
		fprintf(out, "  NVFP4: e2m1 pairs in U8, one e4m3 scale per 1x16 (.weight_scale), fp32 .weight_scale_2 "
			"and .input_scale\n");
	if (used & (1u << MODEL_FMT_F32))
		fprintf(out, "  F32:   dequantized linears\n");

	if (opt && opt->list_tensors) {
		fprintf(out, "\n");
		for (size_t i = 0; i < n; i++) {
			const struct model_tensor *t = model_checkpoint_tensor_at(ck, i);
			char shape[128];
			size_t o = 0;
			cat(shape, sizeof shape, &o, "[");
			for (int d = 0; d < t->n_dims; d++)
				cat(shape, sizeof shape, &o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
			cat(shape, sizeof shape, &o, "]");
			const char *path = model_checkpoint_shard_path(ck, t->shard);
			const char *base = strrchr(path, '/');
			fprintf(out, "%s %s %s %s %s\n", t->name, model_dtype_str(t->dtype), shape, base ? base + 1 : path,
				model_weight_format_str(t->format));
		}
	}
	if (fflush(out) || ferror(out))
		return err_set(e, ST_IO, "inspect: writing the summary failed");
	return ST_OK;
}
