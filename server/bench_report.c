/*
 * server/bench_report.c: what `dsv4 bench decode` prints and writes: the
 * markdown table of every configuration (measured, derived and projected
 * columns, labelled so) and the --json file with everything, the per-op
 * profile included.
 */
#include <jansson.h>
#include <stdio.h>

#include "server/bench_decode.h"

void bench__print_table(const struct bench_opts *o, const struct result *rs, int n, int L, int full_layers,
			double bw, bool gpu)
{
	printf("\nread bandwidth measured in this run: %.1f GB/s (%s)\n\n", bw,
	       gpu ? "read kernel of bench_kernels, 1 GiB" : "summing loop over host memory, one thread");
	printf("| context | batch | ms/step | tok/s | MB read/step (weights+experts+head+state) | GB/s | of read bw | "
	       "experts/layer | full %d-layer ms/step (derived) | full tok/s (derived) | full GB/step | 2xGB10 TP=2 "
	       "tok/s (projected; vLLM %.1f) |\n",
	       full_layers, VLLM_GB10_TOKS);
	printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < n; i++) {
		const struct result *r = &rs[i];
		if (r->skipped) {
			printf("| %u | %u | skipped: %s |||||||||||\n", r->ctx, r->batch, r->why);
			continue;
		}
		printf("| %u | %u | %.3f | %.1f | %.1f (%.1f+%.1f+%.1f+%.1f) | %.1f | %.1f %% | %.1f | %.2f | %.1f | %.2f | "
		       "%.1f |\n",
		       r->ctx, r->batch, r->ms_median, r->tok_s, r->b_total / 1e6, r->b_dense / 1e6, r->b_experts / 1e6,
		       r->b_global / 1e6, r->b_state / 1e6, r->gbps, 100 * r->frac, r->experts_per_layer, r->full_ms,
		       r->full_tok_s, r->full_bytes / 1e9, r->gb10_tok_s);
	}
	printf("\nmeasured: %d layer(s) + head; derived: the full model from the measured layers of each kind; "
	       "projected: 2 x GB10 at %.0f GB/s x the efficiency measured here + %d all-reduces of %.0f us + bytes / "
	       "%.0f GB/s\n",
	       L, o->gb10_gbps, 2 * full_layers + 2, o->ar_latency_us, o->ar_gbps);
}

static json_t *result_json(const struct result *r, int L)
{
	json_t *j = json_object();
	json_object_set_new(j, "context", json_integer(r->ctx));
	json_object_set_new(j, "batch", json_integer(r->batch));
	if (r->skipped) {
		json_object_set_new(j, "skipped", json_string(r->why));
		return j;
	}
	json_object_set_new(j, "ms_per_step_median", json_real(r->ms_median));
	json_object_set_new(j, "ms_per_step_mean", json_real(r->ms_mean));
	json_object_set_new(j, "ms_per_step_min", json_real(r->ms_min));
	json_object_set_new(j, "tokens_per_s", json_real(r->tok_s));
	json_object_set_new(j, "context_mean", json_real(r->ctx_mean));
	json_t *b = json_object();
	json_object_set_new(b, "layer_weights", json_integer((json_int_t)r->b_dense));
	json_object_set_new(b, "routed_experts", json_integer((json_int_t)r->b_experts));
	json_object_set_new(b, "head_embed", json_integer((json_int_t)r->b_global));
	json_object_set_new(b, "state", json_integer((json_int_t)r->b_state));
	json_object_set_new(b, "total", json_integer((json_int_t)r->b_total));
	json_object_set_new(j, "bytes_per_step", b);
	json_object_set_new(j, "distinct_experts_per_layer", json_real(r->experts_per_layer));
	json_object_set_new(j, "achieved_gbps", json_real(r->gbps));
	json_object_set_new(j, "fraction_of_read_bw", json_real(r->frac));
	json_t *d = json_object();
	json_object_set_new(d, "ms_per_step", json_real(r->full_ms));
	json_object_set_new(d, "tokens_per_s", json_real(r->full_tok_s));
	json_object_set_new(d, "bytes_per_step", json_integer((json_int_t)r->full_bytes));
	json_object_set_new(d, "state_bytes_per_step", json_integer((json_int_t)r->full_state));
	json_object_set_new(d, "fraction_of_read_bw", json_real(r->full_frac));
	json_object_set_new(j, "full_model_derived", d);
	json_t *g = json_object();
	json_object_set_new(g, "bytes_per_rank_per_step", json_real(r->gb10_rank_bytes));
	json_object_set_new(g, "ms_per_step", json_real(r->gb10_ms));
	json_object_set_new(g, "tokens_per_s", json_real(r->gb10_tok_s));
	json_object_set_new(g, "vllm_tokens_per_s", json_real(VLLM_GB10_TOKS));
	json_object_set_new(j, "gb10_tp2_projected", g);
	json_t *p = json_object();
	json_object_set_new(p, "total_us", json_real(r->prof_total_us));
	json_t *layers = json_array();
	for (int l = 0; l < L + 2; l++)
		json_array_append_new(layers, json_real(r->prof_layer_us[l]));
	json_object_set_new(p, "us_embed_layers_head", layers);
	json_t *ops = json_array();
	for (int i = 0; i < r->n_ops; i++) {
		const struct op_sum *s = &r->ops[i];
		json_t *oj = json_object();
		json_object_set_new(oj, "op", json_string(s->op));
		json_object_set_new(oj, "variant", json_string(s->variant));
		if (s->rows) {
			json_object_set_new(oj, "rows", json_integer(s->rows));
			json_object_set_new(oj, "cols", json_integer(s->cols));
		}
		json_object_set_new(oj, "calls", json_integer(s->calls));
		json_object_set_new(oj, "us", json_real(s->us));
		json_array_append_new(ops, oj);
	}
	json_object_set_new(p, "ops", ops);
	json_object_set_new(j, "profile", p);
	return j;
}

int bench__write_json(const struct bench_opts *o, const struct bench_run_info *info, const struct result *rs,
		      int n_rs)
{
	json_t *root = json_object();
	json_object_set_new(root, "benchmark", json_string("decode"));
	json_object_set_new(root, "model", json_string(o->model));
	json_object_set_new(root, "device", json_string(info->device));
	json_object_set_new(root, "dummy_weights", json_boolean(info->dummy_weights));
	json_object_set_new(root, "layers_measured", json_integer(info->layers_measured));
	json_object_set_new(root, "layers_full", json_integer(info->layers_full));
	json_object_set_new(root, "block_tokens", json_integer(info->block_tokens));
	json_object_set_new(root, "steps", json_integer(o->steps));
	json_object_set_new(root, "warmup", json_integer(o->warmup));
	json_object_set_new(root, "prefixes", json_integer(o->prefixes));
	json_object_set_new(root, "read_bw_gbps", json_real(info->read_bw_gbps));
	json_t *as = json_object();
	json_object_set_new(as, "gb10_gbps", json_real(o->gb10_gbps));
	json_object_set_new(as, "allreduce_latency_us", json_real(o->ar_latency_us));
	json_object_set_new(as, "allreduce_gbps", json_real(o->ar_gbps));
	json_object_set_new(as, "allreduces_per_step", json_integer(2 * info->layers_full + 2));
	json_object_set_new(root, "gb10_assumptions", as);
	json_t *arr = json_array();
	for (int i = 0; i < n_rs; i++)
		json_array_append_new(arr, result_json(&rs[i], info->layers_measured));
	json_object_set_new(root, "results", arr);
	int wr = json_dump_file(root, o->json, JSON_INDENT(1) | JSON_REAL_PRECISION(8));
	json_decref(root);
	if (wr) {
		fprintf(stderr, "dsv4 bench decode: cannot write %s\n", o->json);
		return -1;
	}
	return 0;
}
