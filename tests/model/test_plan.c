/*
 * tests/model/test_plan.c (suite unit, no GPU): the kernel plan
 * (model_plan_build, model/weights.h) of the tiny fp8 and nvfp4 checkpoints
 * and of the real DeepSeek-V4-Flash and -NVFP4 configs
 * (tests/model/data/, config only) on the CPU and on simulated devices of
 * cc 8.0, 8.9, 9.0, 10.0, 10.3, 12.0 and 12.1.
 *
 *   - CPU: the plan is complete (every layer has exactly the ops and linear
 *     sites its kind needs) and every variant is a CPU one.
 *   - Simulated GPU, binary with CUDA images: the plan is complete and every
 *     variant is a CUDA one; the 12.1 plan holds no variant whose target is
 *     sm_90a or sm_100a; with every arch-specific CUDA variant disabled
 *     (backend cuda, target other than sm_80) the plan still completes, with
 *     sm_80 variants only (generic-cuda-ops gave every op the plan needs a
 *     generic variant, so a failure here is a failure).
 *   - Simulated GPU, CPU-only binary (no images): the plan fails with one
 *     line naming the layer, the op and every variant's reason.
 *   - Loading: model_weights_load on each device carries exactly the plan
 *     model_plan_build makes (same rows, same variants per site) and every
 *     prepared weight is in its variant's run format.
 *   - Formats: model_formats_from_config agrees with what the tiny fp8,
 *     nvfp4 and bf16 checkpoints hold, group by group.
 *   - Registry: on a 12.1 whose probe (wrongly) loaded every image, every
 *     sm_90a / sm_100a variant is still refused by its capability range.
 *   - FP8 E8M0 -> f32 scales: every FP8 linear of the tiny fp8 checkpoint
 *     prepared by the variant that takes f32 scales, and a fresh random
 *     matrix using every exponent 0..254, widen bit-exactly to
 *     ldexp(1, e - 127); in a CUDA build model_weights_load on a simulated
 *     8.0 does the same for every such linear it prepares.
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"
#include "tests/test.h"
#include "tests/tiny_dir.h"

/* T_STR_CONTAINS on a char array trips -Waddress; take a pointer. */
static void contains(const char *hay, const char *needle)
{
	T_STR_CONTAINS(hay, needle);
}


/* ---- what a complete plan is ---- */

static bool has_cuda_images(void)
{
	return DSV4_HAVE_CUDA && (kern_compiled_targets() & KERN_TARGET_SM80);
}

static bool op_has_compiled_cuda(const struct kern_op *op)
{
	for (int i = 0; i < op->n_variants; i++)
		if (op->variants[i].backend == KERN_BACKEND_CUDA && op->variants[i].run &&
		    op->variants[i].target == KERN_TARGET_SM80)
			return true;
	return false;
}

/* The first op the plan needs that has no compiled generic CUDA variant, or NULL. */
static const struct kern_op *op_without_cuda(void)
{
	for (int o = 0; o < MODEL_OP_COUNT; o++)
		if (!op_has_compiled_cuda(model_layer_op_kern((enum model_layer_op)o)))
			return model_layer_op_kern((enum model_layer_op)o);
	if (!op_has_compiled_cuda(&kern_op_linear))
		return &kern_op_linear;
	if (!op_has_compiled_cuda(&kern_op_moe_gemm))
		return &kern_op_moe_gemm;
	return NULL;
}

static bool site_expected(const struct model_config *cfg, int layer, enum model_lin_site s)
{
	int ratio = cfg->compress_ratios[layer];
	bool csa = model_config_attn_kind(cfg, layer) == MODEL_ATTN_CSA;
	switch (s) {
	case MODEL_LIN_CMP_WKV:
	case MODEL_LIN_CMP_WGATE: return ratio != 0;
	case MODEL_LIN_IDX_WQ_B:
	case MODEL_LIN_IDX_WPROJ:
	case MODEL_LIN_IDX_CMP_WKV:
	case MODEL_LIN_IDX_CMP_WGATE: return csa;
	case MODEL_LIN_E_PROJ:
	case MODEL_LIN_H_PROJ: return model_config_is_mtp_layer(cfg, layer) && !model_config_is_dspark_layer(cfg, layer);
	default: return true;
	}
}

static bool op_expected(const struct model_config *cfg, int layer, enum model_layer_op o)
{
	if (o == MODEL_OP_COMPRESSOR)
		return cfg->compress_ratios[layer] != 0;
	if (o == MODEL_OP_INDEXER_ROTATE || o == MODEL_OP_INDEXER_TOPK)
		return cfg->compress_ratios[layer] == 4;
	return true;
}

struct check {
	const char *what; /* "tiny-fp8 cc 12.1" */
	enum kern_backend backend;
	uint32_t forbidden_targets; /* no chosen variant may have one of these bits */
	bool generic_only;          /* every CUDA pick must be the sm_80 image */
	int n_bad;
};

static void check_variant(struct check *c, const struct kern_variant *v, int layer, const char *where)
{
	bool bad = !v || v->backend != c->backend || (v->target & c->forbidden_targets) ||
		   (c->generic_only && c->backend == KERN_BACKEND_CUDA && v->target != KERN_TARGET_SM80);
	if (bad && c->n_bad++ < 3)
		T_CHECKF(false, "%s: layer %d %s: variant %s (backend %d, target 0x%x)", c->what, layer, where,
			 v ? v->name : "none", v ? (int)v->backend : -1, v ? v->target : 0);
}

/* Every layer holds exactly the sites and ops its kind needs, each chosen
 * within the check's limits, and the rows list every (layer, op) once. */
static void check_complete(const struct model_config *cfg, const struct model_plan *p, struct check *c)
{
	T_CHECKF(p->n_layers == cfg->num_hidden_layers && p->n_mtp == (cfg->draft_kind == MODEL_DRAFT_MTP) &&
			 p->n_dspark == (cfg->draft_kind == MODEL_DRAFT_DSPARK ? cfg->n_draft_layers : 0),
		 "%s: %d + %d + %d layers planned", c->what, p->n_layers, p->n_mtp, p->n_dspark);
	for (int l = 0; l < p->n_layers + p->n_mtp + p->n_dspark; l++) {
		const struct model_layer_plan *ly = &p->layers[l];
		T_CHECKF(ly->layer == l, "%s: layer %d records %d", c->what, l, ly->layer);
		for (int s = 0; s < MODEL_LIN_COUNT; s++) {
			bool want = site_expected(cfg, l, (enum model_lin_site)s);
			const struct kern_variant *v = ly->lin[s].v;
			if (want)
				check_variant(c, v, l, model_lin_site_name((enum model_lin_site)s));
			else
				T_CHECKF(!v, "%s: layer %d has %s", c->what, l, model_lin_site_name((enum model_lin_site)s));
		}
		for (int o = 0; o < MODEL_OP_COUNT; o++) {
			bool want = op_expected(cfg, l, (enum model_layer_op)o);
			const struct kern_op *op = model_layer_op_kern((enum model_layer_op)o);
			if (want) {
				check_variant(c, ly->op[o], l, op->name);
				/* the chosen variant is one of the op's own rows */
				T_CHECK(!ly->op[o] ||
					(ly->op[o] >= op->variants && ly->op[o] < op->variants + op->n_variants));
			} else {
				T_CHECKF(!ly->op[o], "%s: layer %d runs %s", c->what, l, op->name);
			}
		}
	}
	/* rows: one layer's rows are contiguous, none repeats, and every chosen
	 * (op, variant) of the layer is among them */
	for (int l = -1; l < p->n_layers + p->n_mtp + p->n_dspark; l++) {
		int start = -1, end = -1;
		for (int i = 0; i < p->rows.n; i++) {
			if (p->rows.entries[i].layer != l)
				continue;
			if (start < 0)
				start = i;
			else
				T_CHECKF(i == end, "%s: rows of layer %d not contiguous", c->what, l);
			end = i + 1;
		}
		T_CHECKF(start >= 0, "%s: no rows for layer %d", c->what, l);
		if (start < 0)
			continue;
		for (int i = start; i < end; i++)
			for (int j = i + 1; j < end; j++)
				T_CHECKF(strcmp(p->rows.entries[i].op, p->rows.entries[j].op) ||
						 strcmp(p->rows.entries[i].variant, p->rows.entries[j].variant),
					 "%s: row (%d, %s, %s) twice", c->what, l, p->rows.entries[i].op,
					 p->rows.entries[i].variant);
		const struct model_layer_plan *ly = l >= 0 ? &p->layers[l] : NULL;
		for (int k = 0; k < (ly ? MODEL_LIN_COUNT + MODEL_OP_COUNT : 1); k++) {
			const struct kern_variant *v = !ly		    ? p->head.v
						       : k < MODEL_LIN_COUNT ? ly->lin[k].v
									     : ly->op[k - MODEL_LIN_COUNT];
			const char *opn = !ly		      ? "linear"
					  : k < MODEL_LIN_COUNT ? (ly->lin[k].op ? ly->lin[k].op->name : "?")
								: model_layer_op_kern((enum model_layer_op)(k - MODEL_LIN_COUNT))->name;
			if (!v)
				continue;
			bool seen = false;
			for (int i = start; i < end && !seen; i++)
				seen = !strcmp(p->rows.entries[i].op, opn) && !strcmp(p->rows.entries[i].variant, v->name);
			T_CHECKF(seen, "%s: layer %d: (%s, %s) not in the rows", c->what, l, opn, v->name);
		}
	}
	check_variant(c, p->head.v, -1, "head");
	T_CHECKF(p->head.out == cfg->vocab_size && p->head.in == cfg->hidden_size, "%s: head shape", c->what);
}

/* ---- one source of (config, formats) on every device ---- */

struct source {
	const char *name;
	struct model_config cfg;
	struct model_layer_formats *fmts;
};

static void sim(struct kern_device *d, int cc)
{
	if (cc == 0)
		kern_device_cpu(d);
	else
		kern_device_simulate(d, cc / 10, cc % 10);
}

/* A plan on a simulated GPU that failed: right only in a CPU-only build
 * (no images), where the message must name layer (or head), op and the
 * reasons. In a CUDA build every op the plan needs has a generic variant,
 * so any failure is a bug (the message says which op lacks one, if any). */
static void check_gpu_failure(const char *what, const char *msg)
{
	T_CHECKF(strstr(msg, "no variant fits") && strstr(msg, " op ") && (strstr(msg, "layer ") || strstr(msg, "head")),
		 "%s: the failure names layer, op and reasons: %s", what, msg);
	if (has_cuda_images()) {
		const struct kern_op *missing = op_without_cuda();
		T_CHECKF(false, "%s: the plan failed in a CUDA build (op without a compiled generic CUDA variant: %s): %s",
			 what, missing ? missing->name : "none", msg);
	}
}

static void plan_everywhere(const struct source *src)
{
	static const int ccs[] = {0, 80, 89, 90, 100, 103, 120, 121};
	for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
		struct kern_device dev;
		sim(&dev, ccs[i]);
		char what[128];
		snprintf(what, sizeof what, "%s cc %d.%d", src->name, ccs[i] / 10, ccs[i] % 10);
		for (int disable_arch = 0; disable_arch < (ccs[i] ? 2 : 1); disable_arch++) {
			struct kern_disabled dis;
			struct err e = {0};
			T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
			if (disable_arch) {
				/* every arch-specific CUDA variant off: the generic ones must carry the plan */
				int n_ops;
				const struct kern_op *const *ops = kern_registry_ops(&n_ops);
				for (int o = 0; o < n_ops; o++)
					for (int v = 0; v < ops[o]->n_variants; v++) {
						const struct kern_variant *kv = &ops[o]->variants[v];
						if (kv->backend == KERN_BACKEND_CUDA && kv->target != KERN_TARGET_SM80)
							T_CHECK(kern_disabled_add(&dis, kv->name, &e) == ST_OK);
					}
				snprintf(what + strlen(what), sizeof what - strlen(what), ", arch variants disabled");
			}
			struct model_plan_options po = {.dev = &dev, .disabled = &dis, .max_step_tokens = 512,
							.quant_sim = true, .load_mtp = true, .plan_dspark = true,
							.world_size = 1};
			struct model_plan p;
			enum status st = model_plan_build(&src->cfg, src->fmts, &po, &p, &e);
			if (ccs[i] == 0) {
				T_CHECKF(st == ST_OK, "%s: %s", what, e.msg);
			} else if (st != ST_OK) {
				T_CHECKF(p.layers == NULL && p.rows.n == 0, "%s: a failed plan is left empty", what);
				check_gpu_failure(what, e.msg);
				continue;
			} else {
				T_CHECKF(has_cuda_images(), "%s: a plan for a GPU without CUDA images", what);
			}
			if (st != ST_OK)
				continue;
			struct check c = {.what = what, .backend = ccs[i] ? KERN_BACKEND_CUDA : KERN_BACKEND_CPU,
					  .forbidden_targets = ccs[i] == 121 ? KERN_TARGET_SM90A | KERN_TARGET_SM100A : 0,
					  .generic_only = disable_arch != 0};
			check_complete(&src->cfg, &p, &c);
			/* the printed plan names every layer and the routed experts' format */
			size_t need = model_plan_str(&p, NULL, 0);
			char *buf = malloc(need + 1);
			T_CHECK(buf && model_plan_str(&p, buf, need + 1) == need);
			if (buf) {
				char lbl[32];
				snprintf(lbl, sizeof lbl, "layer %d (", p.n_layers + p.n_mtp + p.n_dspark - 1);
				contains(buf, lbl);
				contains(buf, "head: linear[bf16]=");
				contains(buf, src->fmts[0].group[MODEL_GROUP_ROUTED_EXPERTS] == MODEL_FMT_NVFP4 ? "moe_gemm[nvfp4]="
													: "moe_gemm[mxfp4]=");
				free(buf);
			}
			model_plan_free(&p);
			model_plan_free(&p); /* idempotent */
		}
	}
}

/* model_weights_load on every device: the weights carry exactly the plan
 * model_plan_build makes from the checkpoint's formats (one selection path),
 * and every chosen variant's prepare() accepts the stored weights. */
static void load_everywhere(const struct model_checkpoint *ck, const char *name)
{
	static const int ccs[] = {0, 80, 89, 90, 100, 103, 120, 121};
	const struct model_config *cfg = model_checkpoint_config(ck);
	struct model_layer_formats *fmts = calloc((size_t)cfg->n_layers_total, sizeof *fmts);
	T_CHECK(fmts != NULL);
	if (!fmts)
		return;
	model_formats_from_checkpoint(ck, fmts);
	for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
		struct kern_device dev;
		sim(&dev, ccs[i]);
		char what[96];
		snprintf(what, sizeof what, "%s load cc %d.%d", name, ccs[i] / 10, ccs[i] % 10);
		struct model_weights w;
		struct model_weights_options wo = {.ck = ck, .dev = &dev, .max_step_tokens = 64, .quant_sim = true,
						   .load_mtp = true, .rank = 0, .world_size = 1};
		struct err e = {0};
		if (model_weights_load(&w, &wo, &e) != ST_OK) {
			T_CHECKF(ccs[i] != 0, "%s: %s", what, e.msg);
			check_gpu_failure(what, e.msg);
			continue;
		}
		T_CHECKF(ccs[i] == 0 || has_cuda_images(), "%s: loaded for a GPU without CUDA images", what);
		struct model_plan p;
		struct model_plan_options po = {.dev = &dev, .max_step_tokens = 64, .quant_sim = true, .load_mtp = true,
						.world_size = 1};
		T_CHECKF(model_plan_build(cfg, fmts, &po, &p, &e) == ST_OK, "%s: %s", what, e.msg);
		if (e.msg[0]) {
			model_weights_free(&w);
			continue;
		}
		T_CHECKF(w.plan.n == p.rows.n, "%s: %d rows loaded, %d planned", what, w.plan.n, p.rows.n);
		for (int r = 0; r < w.plan.n && r < p.rows.n; r++)
			T_CHECKF(w.plan.entries[r].layer == p.rows.entries[r].layer &&
					 !strcmp(w.plan.entries[r].op, p.rows.entries[r].op) &&
					 !strcmp(w.plan.entries[r].variant, p.rows.entries[r].variant),
				 "%s: row %d differs", what, r);
		for (int l = 0; l < w.n_layers + w.n_mtp; l++) {
			const struct model_layer *ly = &w.layers[l];
			const struct model_layer_plan *pl = &p.layers[l];
			T_CHECK(ly->wq_a.v == pl->lin[MODEL_LIN_WQ_A].v && ly->wo_a[0].v == pl->lin[MODEL_LIN_WO_A].v &&
				ly->sh_w2.v == pl->lin[MODEL_LIN_SH_W2].v && ly->gate.v == pl->lin[MODEL_LIN_GATE].v &&
				ly->experts.v13 == pl->lin[MODEL_LIN_EXP_W13].v && ly->experts.v2 == pl->lin[MODEL_LIN_EXP_W2].v);
			T_CHECK(ly->ops.rmsnorm == (kern_rmsnorm_fn)pl->op[MODEL_OP_RMSNORM]->run);
			/* every prepared weight is in the format its variant runs on */
			const struct kern_variant *v = ly->wq_a.v;
			T_CHECKF(v->wfmt_run == KERN_WFMT_NONE || ly->wq_a.w.fmt == v->wfmt_run, "%s: layer %d wq_a is %s for %s",
				 what, l, kern_wfmt_name(ly->wq_a.w.fmt), v->name);
			if (ly->experts.v13->wfmt_run != KERN_WFMT_NONE)
				T_CHECK(ly->experts.w1[0].fmt == ly->experts.v13->wfmt_run);
		}
		model_plan_free(&p);
		model_weights_free(&w);
	}
	free(fmts);
}

/* ---- sources ---- */

static bool source_from_config(struct source *s, const char *name, const char *path)
{
	struct err e = {0};
	s->name = name;
	T_CHECKF(model_config_load(path, &s->cfg, &e) == ST_OK, "%s: %s", path, e.msg);
	if (e.msg[0])
		return false;
	s->fmts = calloc((size_t)s->cfg.n_layers_total, sizeof *s->fmts);
	T_CHECK(s->fmts != NULL);
	T_CHECKF(model_formats_from_config(&s->cfg, s->fmts, &e) == ST_OK, "%s: %s", path, e.msg);
	return s->fmts && !e.msg[0];
}

/* The formats config.json implies are the ones the checkpoint holds. */
static void formats_agree(const struct model_checkpoint *ck, const char *name)
{
	const struct model_config *cfg = model_checkpoint_config(ck);
	struct model_layer_formats *a = calloc((size_t)cfg->n_layers_total, sizeof *a);
	struct model_layer_formats *b = calloc((size_t)cfg->n_layers_total, sizeof *b);
	struct err e = {0};
	T_CHECK(a && b);
	if (a && b) {
		model_formats_from_checkpoint(ck, a);
		T_CHECKF(model_formats_from_config(cfg, b, &e) == ST_OK, "%s: %s", name, e.msg);
		for (int l = 0; l < cfg->n_layers_total; l++)
			for (int g = 1; g < MODEL_GROUP_COUNT; g++)
				T_CHECKF(a[l].group[g] == b[l].group[g], "%s layer %d group %s: checkpoint %s, config %s", name,
					 l, model_group_str((enum model_group)g), model_weight_format_str(a[l].group[g]),
					 model_weight_format_str(b[l].group[g]));
	}
	free(a);
	free(b);
}

static void real_configs(void)
{
	const char *root = getenv("DSV4_SOURCE_ROOT");
	T_CHECKF(root != NULL, "DSV4_SOURCE_ROOT unset");
	if (!root)
		return;
	const char *names[] = {"deepseek-v4-flash", "deepseek-v4-flash-nvfp4", "deepseek-v4-flash-0731",
			       "deepseek-v4-flash-0731-nvfp4"};
	for (int k0 = 0; k0 < 4; k0++) {
		int k = k0 % 2;        /* NVFP4 */
		bool r0731 = k0 >= 2; /* three DSpark stages in place of the NextN layer */
		char path[1200];
		snprintf(path, sizeof path, "%s/tests/model/data/%s/config.json", root, names[k0]);
		struct source s = {0};
		if (source_from_config(&s, names[k0], path)) {
			/* the real schedule (dsv4.md §1.2) and formats (§2.1, §5.4) */
			T_CHECK(s.cfg.n_layers_total == (r0731 ? 46 : 44) && s.cfg.num_hidden_layers == 43);
			T_CHECK(s.cfg.draft_kind == (r0731 ? MODEL_DRAFT_DSPARK : MODEL_DRAFT_MTP));
			T_CHECK(s.cfg.num_nextn_predict_layers == 1);
			if (r0731) {
				T_CHECK(s.cfg.dspark.n_target_layers == 3 && s.cfg.dspark.target_layer_ids[0] == 40);
				T_CHECK(s.cfg.compress_ratios[44] == 0 && s.cfg.compress_ratios[45] == 0);
				T_CHECK(s.fmts[44].group[MODEL_GROUP_MTP_PROJ] == MODEL_FMT_NONE);
				T_CHECK(s.fmts[45].group[MODEL_GROUP_ROUTED_EXPERTS] == MODEL_FMT_MXFP4);
				struct model_plan p;
				struct err e = {0};
				struct model_plan_options po = {.max_step_tokens = 64, .quant_sim = true, .load_mtp = true,
								.plan_dspark = true, .world_size = 1};
				T_CHECKF(model_plan_build(&s.cfg, s.fmts, &po, &p, &e) == ST_OK, "%s: %s", names[k0], e.msg);
				if (!e.msg[0]) {
					T_CHECK(p.n_mtp == 0 && p.n_dspark == 3 && p.layers[45].dspark && !p.layers[45].mtp);
					T_CHECK(p.dspark_main_proj.out == 4096 && p.dspark_main_proj.in == 3 * 4096);
					T_CHECK(p.dspark_main_proj.wfmt == KERN_WFMT_FP8_E8M0_B128);
					T_CHECK(p.layers[44].lin[MODEL_LIN_E_PROJ].v == NULL);
					T_CHECK(p.layers[43].lin[MODEL_LIN_EXP_W13].wfmt == KERN_WFMT_MXFP4);
					model_plan_free(&p);
				}
			}
			int n_csa = 0, n_hca = 0;
			for (int l = 0; l < 43; l++) {
				n_csa += model_config_attn_kind(&s.cfg, l) == MODEL_ATTN_CSA;
				n_hca += model_config_attn_kind(&s.cfg, l) == MODEL_ATTN_HCA;
			}
			T_CHECKF(n_csa == 21 && n_hca == 20 && s.cfg.compress_ratios[42] == 4 && s.cfg.compress_ratios[43] == 0,
				 "%s: %d CSA, %d HCA", names[k0], n_csa, n_hca);
			T_CHECK(s.fmts[5].group[MODEL_GROUP_ATTN] == MODEL_FMT_FP8_BLOCK);
			T_CHECK(s.fmts[5].group[MODEL_GROUP_SHARED_EXPERTS] == MODEL_FMT_FP8_BLOCK);
			T_CHECK(s.fmts[5].group[MODEL_GROUP_MTP_PROJ] == MODEL_FMT_NONE);
			T_CHECK(s.fmts[43].group[MODEL_GROUP_MTP_PROJ] == MODEL_FMT_FP8_BLOCK);
			T_CHECK(s.fmts[5].group[MODEL_GROUP_ROUTED_EXPERTS] == (k ? MODEL_FMT_NVFP4 : MODEL_FMT_MXFP4));
			T_CHECK(s.fmts[43].group[MODEL_GROUP_ROUTED_EXPERTS] == MODEL_FMT_MXFP4);
			plan_everywhere(&s);
			/* TP 2 and 4 plan the local shapes */
			struct model_plan p;
			struct err e = {0};
			struct model_plan_options po = {.max_step_tokens = 64, .quant_sim = true, .load_mtp = true,
							.world_size = 4};
			T_CHECKF(model_plan_build(&s.cfg, s.fmts, &po, &p, &e) == ST_OK, "%s TP 4: %s", names[k0], e.msg);
			if (!e.msg[0]) {
				T_CHECK(p.layers[3].lin[MODEL_LIN_WQ_B].out == 64 / 4 * 512);
				T_CHECK(p.layers[3].lin[MODEL_LIN_WO_B].in == 8 / 4 * 1024);
				T_CHECK(p.layers[3].lin[MODEL_LIN_SH_W2].in == 2048 / 4);
				T_CHECK(p.head.out == 129280 / 4);
				T_CHECK(p.layers[3].lin[MODEL_LIN_EXP_W13].wfmt == (k ? KERN_WFMT_NVFP4 : KERN_WFMT_MXFP4));
				model_plan_free(&p);
			}
			po.world_size = 3;
			T_CHECK(model_plan_build(&s.cfg, s.fmts, &po, &p, &e) == ST_UNSUPPORTED);
			contains(e.msg, "world size 3");
		}
		free(s.fmts);
	}
}

/* ---- 12.1 never runs sm_90a / sm_100a code, whatever the probe says ---- */

static void registry_12_1(void)
{
	struct kern_device d;
	kern_device_simulate(&d, 12, 1);
	d.loadable = KERN_TARGET_SM80 | KERN_TARGET_SM90A | KERN_TARGET_SM100A | KERN_TARGET_SM120A |
		     KERN_TARGET_SM121A; /* a probe gone wrong */
	int n_ops, n_checked = 0;
	const struct kern_op *const *ops = kern_registry_ops(&n_ops);
	for (int o = 0; o < n_ops; o++)
		for (int i = 0; i < ops[o]->n_variants; i++) {
			const struct kern_variant *v = &ops[o]->variants[i];
			if (!(v->target & (KERN_TARGET_SM90A | KERN_TARGET_SM100A)))
				continue;
			for (int f = 0; f < KERN_WFMT_COUNT; f++) {
				if (v->wfmt_accept ? !(v->wfmt_accept & KERN_WFMT_BIT(f)) : f != KERN_WFMT_NONE)
					continue;
				struct kern_problem p = {.wfmt = (enum kern_wfmt)f, .tp_size = 1, .shape = NULL};
				char why[KERN_REASON_BYTES] = "";
				bool ok = kern_variant_accepts(v, &p, &d, NULL, why, sizeof why);
				T_CHECKF(!ok && strstr(why, "cc 12.1"), "%s on cc 12.1: %s", v->name, ok ? "accepted" : why);
				n_checked++;
			}
		}
	fprintf(stderr, "12.1: %d (sm_90a/sm_100a variant, format) pairs refused by capability\n", n_checked);
}

/* ---- E8M0 -> f32 scales, bit for bit ---- */

static bool widened_exact(const uint8_t *e8, const float *f32, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		float want = (float)ldexp(1.0, (int)e8[i] - 127);
		if (memcmp(&want, &f32[i], sizeof want)) {
			T_CHECKF(false, "%s: scale %zu: e8m0 %u widened to %a, want %a", what, i, e8[i], (double)f32[i],
				 (double)want);
			return false;
		}
	}
	return true;
}

/* The linear variant that takes FP8 with f32 block scales from an E8M0 checkpoint. */
static const struct kern_variant *f32_scale_variant(void)
{
	for (int i = 0; i < kern_op_linear.n_variants; i++) {
		const struct kern_variant *v = &kern_op_linear.variants[i];
		if ((v->wfmt_accept & KERN_WFMT_BIT(KERN_WFMT_FP8_E8M0_B128)) && v->wfmt_run == KERN_WFMT_FP8_F32_B128)
			return v;
	}
	return NULL;
}

static void widen_random(const struct kern_variant *v)
{
	/* 1200 x 520 (9·128 + 48 rows, 4·128 + 8 columns: partial blocks both ways), 10 x 5 scales */
	enum { R = 300 * 4, C = 520 };
	uint8_t *w = calloc((size_t)R * C, 1), sc[10 * 5];
	T_CHECK(w != NULL);
	if (!w)
		return;
	/* every exponent 0..254 once over the rounds, in a fresh order */
	uint8_t exps[255];
	for (int i = 0; i < 255; i++)
		exps[i] = (uint8_t)i;
	for (int i = 254; i > 0; i--) {
		int j = rand() % (i + 1);
		uint8_t t = exps[i];
		exps[i] = exps[j];
		exps[j] = t;
	}
	for (int round = 0; round * 50 < 255; round++) {
		for (int i = 0; i < 50; i++)
			sc[i] = exps[(round * 50 + i) % 255];
		struct kern_wmat m = {.fmt = KERN_WFMT_FP8_E8M0_B128, .rows = R, .cols = C, .data = w, .scale = sc,
				      .global_scale = 1.0f};
		struct kern_wmat out;
		struct err e = {0};
		T_CHECKF(kern_prepare_weight(v, &m, &out, &e) == ST_OK, "%s", e.msg);
		if (e.msg[0])
			break;
		T_CHECK(out.fmt == KERN_WFMT_FP8_F32_B128 && out.rows == R && out.cols == C && out.data == w);
		widened_exact(sc, out.scale, 50, "random e8m0 matrix");
		kern_wmat_release(&out);
	}
	free(w);
}

static void widen_checkpoint(const struct model_checkpoint *ck, const struct kern_variant *v)
{
	int n = 0;
	for (size_t i = 0; i < model_checkpoint_n_tensors(ck); i++) {
		const struct model_tensor *t = model_checkpoint_tensor_at(ck, i);
		if (t->role != MODEL_ROLE_WEIGHT || t->format != MODEL_FMT_FP8_BLOCK)
			continue;
		char prefix[160];
		snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
		struct model_linear l;
		struct err e = {0};
		T_CHECKF(model_checkpoint_linear(ck, prefix, &l, &e) == ST_OK, "%s: %s", prefix, e.msg);
		if (e.msg[0])
			continue;
		struct kern_wmat m = {.fmt = KERN_WFMT_FP8_E8M0_B128, .rows = l.out, .cols = l.in, .data = l.weight->data,
				      .scale = l.scale->data, .global_scale = 1.0f};
		struct kern_wmat out;
		T_CHECKF(kern_prepare_weight(v, &m, &out, &e) == ST_OK, "%s: %s", prefix, e.msg);
		if (e.msg[0])
			continue;
		T_CHECK(out.fmt == KERN_WFMT_FP8_F32_B128 && out.data == m.data);
		widened_exact(l.scale->data, out.scale, (size_t)l.scale->n_elements, prefix);
		kern_wmat_release(&out);
		n++;
	}
	T_CHECKF(n > 20, "%d FP8 linears widened", n);
}

/* model_weights_load on a simulated 8.0: every linear prepared into f32
 * scales holds exactly its stored E8M0 scales, widened. */
static void widen_loaded(const struct model_checkpoint *ck)
{
	struct kern_device dev;
	kern_device_simulate(&dev, 8, 0);
	struct model_weights w;
	struct model_weights_options wo = {.ck = ck, .dev = &dev, .max_step_tokens = 64, .quant_sim = true,
					   .load_mtp = true, .rank = 0, .world_size = 1};
	struct err e = {0};
	if (model_weights_load(&w, &wo, &e) != ST_OK) {
		check_gpu_failure("tiny-fp8 load cc 8.0", e.msg);
		return;
	}
	T_CHECKF(has_cuda_images(), "tiny-fp8 loaded for a GPU without CUDA images");
	int n = 0;
	for (int l = 0; l < w.n_layers + w.n_mtp; l++) {
		const struct model_layer *ly = &w.layers[l];
		char lp[32];
		snprintf(lp, sizeof lp, "%s.%d", ly->mtp ? "mtp" : "layers", ly->mtp ? l - w.n_layers : l);
		const struct model_lin *ls[] = {&ly->wq_a, &ly->wkv, &ly->wq_b, &ly->wo_b, &ly->sh_w1};
		const char *nm[] = {"attn.wq_a", "attn.wkv", "attn.wq_b", "attn.wo_b", "ffn.shared_experts.w1"};
		for (int k = 0; k < 5; k++) {
			if (ls[k]->w.fmt != KERN_WFMT_FP8_F32_B128)
				continue;
			char prefix[96];
			snprintf(prefix, sizeof prefix, "%s.%s", lp, nm[k]);
			struct model_linear sl;
			T_CHECKF(model_checkpoint_linear(ck, prefix, &sl, &e) == ST_OK, "%s: %s", prefix, e.msg);
			T_CHECK(ls[k]->w.data == sl.weight->data); /* the FP8 payload is still the mapping */
			widened_exact(sl.scale->data, ls[k]->w.scale, (size_t)sl.scale->n_elements, prefix);
			n++;
		}
	}
	T_CHECKF(n > 0, "no linear of the cc 8.0 plan takes f32 scales");
	fprintf(stderr, "cc 8.0 load: %d FP8 linears with widened scales checked\n", n);
	model_weights_free(&w);
}

int main(void)
{
	srand((unsigned)test_seed());
	registry_12_1();
	const struct kern_variant *fv = f32_scale_variant();
	T_CHECKF(fv != NULL, "no linear variant takes E8M0 checkpoints as f32 scales");
	if (fv)
		widen_random(fv);
	real_configs();

	const char *dir = fh_tiny_dir();
	if (!dir) {
		fprintf(stderr, "no tiny checkpoints (scripts/make_tiny_model needs the venv): tiny cases skipped\n");
		return test_exit();
	}
	const char *variants[] = {"fp8", "nvfp4", "bf16"};
	for (int k = 0; k < 3; k++) {
		char path[1200], name[32];
		snprintf(path, sizeof path, "%s/tiny-%s", dir, variants[k]);
		snprintf(name, sizeof name, "tiny-%s", variants[k]);
		struct model_checkpoint_options co = {.dir = path};
		struct model_checkpoint *ck = NULL;
		struct err e = {0};
		T_CHECKF(model_checkpoint_create(&ck, &co, &e) == ST_OK, "%s: %s", path, e.msg);
		if (!ck)
			continue;
		formats_agree(ck, name);
		if (k < 2) {
			struct source s = {.name = name, .cfg = *model_checkpoint_config(ck)};
			s.fmts = calloc((size_t)s.cfg.n_layers_total, sizeof *s.fmts);
			T_CHECK(s.fmts != NULL);
			if (s.fmts) {
				model_formats_from_checkpoint(ck, s.fmts);
				plan_everywhere(&s);
			}
			free(s.fmts);
			load_everywhere(ck, name);
		}
		if (k == 0 && fv) {
			widen_checkpoint(ck, fv);
			widen_loaded(ck);
		}
		model_checkpoint_destroy(ck);
	}
	return test_exit();
}
