/*
 * server/cmd_kernels.c: `dsv4 kernels MODEL_DIR [--simulate-cc X.Y]
 * [--disable-kernel a,b] [--verbose]`.
 *
 * Runs the load-time selection of every layer's kernels (design.md steps
 * 1-4: validate the checkpoint, detect or simulate the device, select and
 * prepare each weight) without serving, and prints the plan: one line per
 * distinct layer plan, then every (layer, op, kernel) row. With
 * --simulate-cc the device is a pretend GPU of that capability whose
 * loadable images are the compiled ones a real device of that family could
 * load, so CI proves the plan for every GPU family without one. A
 * selection that fails exits 1 with the layer, the op and every variant's
 * reason, exactly as `serve` would at start-up. --verbose adds, for each op,
 * every variant's verdict on a representative problem. --max-num-batched-tokens
 * N plans for steps of at most N tokens (default 512, a prefill-sized plan;
 * N < 64 is a decode plan, where the FP8 linears get the decode GEMV).
 *
 * A MODEL_DIR that holds only config.json (tests/model/data/deepseek-v4-flash)
 * is planned from the config alone: the weight formats come from its
 * quantization_config (model_formats_from_config) and the same
 * model_plan_build that model_weights_load runs picks every kernel; nothing
 * is prepared. So the real model's plan can be checked without its 150 GiB.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kernels/device/device.h"
#include "kernels/registry/registry.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "server/load_args.h"

/* The plan's per-layer lines, its rows and the closing summary line. */
static void print_plan(const struct model_plan *p, const struct kern_plan *rows)
{
	size_t need = model_plan_str(p, NULL, 0);
	char *buf = malloc(need + 1);
	if (buf) {
		model_plan_str(p, buf, need + 1);
		fputs(buf, stdout);
		free(buf);
	}
	printf("rows: %d (layer op kernel)\n", rows->n);
	for (int i = 0; i < rows->n; i++)
		printf("  %d %s %s\n", rows->entries[i].layer, rows->entries[i].op, rows->entries[i].variant);
	if (p->n_dspark)
		printf("plan complete: %d layers + %d DSpark stages and the head\n", p->n_layers, p->n_dspark);
	else
		printf("plan complete: %d layers%s and the head\n", p->n_layers, p->n_mtp ? " + MTP" : "");
}

static bool dir_has(const char *dir, const char *name)
{
	char path[4096];
	struct stat sb;
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return stat(path, &sb) == 0;
}

/* Plan from DIR/config.json alone, for steps of up to max_step_tokens tokens. */
static int plan_config_only(const char *dir, const struct kern_device *dev, const struct kern_disabled *dis,
			    int64_t max_step_tokens)
{
	struct err e = {0};
	char path[4096];
	snprintf(path, sizeof path, "%s/config.json", dir);
	printf("checkpoint: none, config.json only (weight formats from its quantization_config)\n");
	fflush(stdout);
	struct model_config cfg;
	if (model_config_load(path, &cfg, &e)) {
		fprintf(stderr, "dsv4 kernels: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	struct model_layer_formats *fmts = calloc((size_t)cfg.n_layers_total, sizeof *fmts);
	if (!fmts) {
		fprintf(stderr, "dsv4 kernels: out of memory\n");
		return CLI_EXIT_FAIL;
	}
	struct model_plan plan;
	struct model_plan_options po = {.dev = dev, .disabled = dis, .max_step_tokens = max_step_tokens,
					.quant_sim = true, .load_mtp = true, .plan_dspark = true, .world_size = 1};
	int rc = CLI_EXIT_OK;
	if (model_formats_from_config(&cfg, fmts, &e) || model_plan_build(&cfg, fmts, &po, &plan, &e)) {
		fprintf(stderr, "dsv4 kernels: %s: %s\n", path, e.msg);
		rc = CLI_EXIT_FAIL;
	} else {
		print_plan(&plan, &plan.rows);
		model_plan_free(&plan);
	}
	free(fmts);
	return rc;
}

static int usage(FILE *f, int code)
{
	fprintf(f, "usage: dsv4 kernels MODEL_DIR [--simulate-cc X.Y] [--disable-kernel NAME[,NAME...]]\n"
		   "                   [--max-num-batched-tokens N] [--verbose]\n"
		   "  Select and prepare every layer's kernels as serve would, and print the plan.\n"
		   "  A MODEL_DIR with only config.json is planned from the config (formats from quantization_config).\n"
		   "  --simulate-cc X.Y     plan for a GPU of compute capability X.Y (no GPU needed)\n"
		   "  --disable-kernel L    remove variants from selection (also $DSV4_DISABLED_KERNELS)\n"
		   "  --max-num-batched-tokens N  plan for steps of at most N tokens (default 512; < 64: decode)\n"
		   "  --verbose             every variant's verdict per op\n");
	return code;
}

static void print_report(const struct kern_device *dev, const struct kern_disabled *dis)
{
	int n_ops = 0;
	const struct kern_op *const *ops = kern_registry_ops(&n_ops);
	char *buf = malloc(1 << 16);
	if (!buf)
		return;
	for (int i = 0; i < n_ops; i++) {
		/* The first format each op's variants accept stands for its problem. */
		struct kern_problem p = {.wfmt = KERN_WFMT_NONE, .tp_size = 1, .shape = NULL};
		for (int v = 0; v < (int)ops[i]->n_variants; v++)
			if (ops[i]->variants[v].wfmt_accept) {
				uint32_t m = ops[i]->variants[v].wfmt_accept;
				for (int b = 0; b < 32; b++)
					if (m & (1u << b)) {
						p.wfmt = (enum kern_wfmt)b;
						break;
					}
				break;
			}
		kern_select_report(ops[i], &p, dev, dis, buf, 1 << 16);
		printf("op %s:\n%s", ops[i]->name, buf);
	}
	free(buf);
}

int cmd_kernels(int argc, char **argv)
{
	struct model_checkpoint_options load_opts = {0}; /* dummy-load: --load-format, --hf-overrides */
	if (load_args_extract(&argc, argv, "kernels", false, &load_opts))
		return CLI_EXIT_USAGE;
	const char *dir = NULL, *sim = NULL, *disable = NULL;
	bool verbose = false;
	int64_t max_step_tokens = 512;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			return usage(stdout, CLI_EXIT_OK);
		if (!strcmp(a, "--simulate-cc") || !strcmp(a, "--disable-kernel")) {
			if (i + 1 >= argc) {
				fprintf(stderr, "dsv4 kernels: %s needs a value\n", a);
				return CLI_EXIT_USAGE;
			}
			*(a[2] == 's' ? &sim : &disable) = argv[++i];
		} else if (!strcmp(a, "--verbose")) {
			verbose = true;
		} else if (!strcmp(a, "--max-num-batched-tokens")) {
			char *end = NULL;
			long long n = i + 1 < argc ? strtoll(argv[i + 1], &end, 10) : 0;
			if (i + 1 >= argc || !end || *end || n < 1 || n > (1 << 24)) {
				fprintf(stderr, "dsv4 kernels: --max-num-batched-tokens: expected 1 .. %d\n", 1 << 24);
				return CLI_EXIT_USAGE;
			}
			max_step_tokens = n;
			i++;
		} else if (a[0] == '-') {
			fprintf(stderr, "dsv4 kernels: unknown option '%s'\n", a);
			return usage(stderr, CLI_EXIT_USAGE);
		} else if (!dir) {
			dir = a;
		} else {
			fprintf(stderr, "dsv4 kernels: one MODEL_DIR only\n");
			return CLI_EXIT_USAGE;
		}
	}
	if (!dir)
		return usage(stderr, CLI_EXIT_USAGE);

	struct err e = {0};
	struct kern_device dev;
	if (sim) {
		int ma, mi;
		if (kern_cc_parse(sim, &ma, &mi, &e)) {
			fprintf(stderr, "dsv4 kernels: --simulate-cc: %s\n", e.msg);
			return CLI_EXIT_USAGE;
		}
		kern_device_simulate(&dev, ma, mi);
	} else if (kern_device_count() > 0) {
		if (kern_device_detect(0, &dev, &e)) {
			fprintf(stderr, "dsv4 kernels: %s\n", e.msg);
			return CLI_EXIT_FAIL;
		}
	} else {
		kern_device_cpu(&dev);
	}
	struct kern_disabled dis;
	if (kern_disabled_init(&dis, disable, true, &e)) {
		fprintf(stderr, "dsv4 kernels: --disable-kernel: %s\n", e.msg);
		return CLI_EXIT_USAGE;
	}
	int n_ops = 0;
	const struct kern_op *const *ops = kern_registry_ops(&n_ops);
	if (kern_disabled_check(&dis, ops, n_ops, &e)) {
		fprintf(stderr, "dsv4 kernels: %s\n", e.msg);
		return CLI_EXIT_USAGE;
	}

	char targets[128], loadable[128];
	kern_targets_str(dev.compiled, targets, sizeof targets);
	kern_targets_str(dev.loadable, loadable, sizeof loadable);
	printf("device: %s, cc %d.%d%s; images compiled: %s; loadable: %s\n", dev.name, dev.cc_major, dev.cc_minor,
	       dev.simulated ? " (simulated)" : "", targets, loadable);
	fflush(stdout); /* before any error on stderr */

	if (load_opts.load_format != MODEL_LOAD_DUMMY && !dir_has(dir, "model.safetensors.index.json") && !dir_has(dir, "model.safetensors") &&
	    dir_has(dir, "config.json")) {
		int rc = plan_config_only(dir, &dev, &dis, max_step_tokens);
		if (rc == CLI_EXIT_OK && verbose)
			print_report(&dev, &dis);
		return rc;
	}
	struct model_checkpoint *ck = NULL;
	struct model_checkpoint_options co = load_opts; /* dummy-load */
	co.dummy_no_fill = true;
	co.dir = dir;
	if (model_checkpoint_create(&ck, &co, &e)) {
		fprintf(stderr, "dsv4 kernels: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	struct model_weights w;
	memset(&w, 0, sizeof w);
	struct model_weights_options wo = {.ck = ck, .dev = &dev, .disabled = &dis, .max_step_tokens = max_step_tokens,
					   .quant_sim = true, .load_mtp = true, .rank = 0, .world_size = 1};
	int rc = CLI_EXIT_OK;
	if (model_weights_load(&w, &wo, &e)) {
		fprintf(stderr, "dsv4 kernels: %s\n", e.msg);
		rc = CLI_EXIT_FAIL;
	} else {
		print_plan(&w.kernels, &w.plan);
		if (verbose)
			print_report(&dev, &dis);
		model_weights_free(&w);
	}
	model_checkpoint_destroy(ck);
	return rc;
}
