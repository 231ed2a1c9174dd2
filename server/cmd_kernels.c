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
 * every variant's verdict on a representative problem.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kernels/device/device.h"
#include "kernels/registry/registry.h"
#include "model/checkpoint.h"
#include "model/weights.h"

static int usage(FILE *f, int code)
{
	fprintf(f, "usage: dsv4 kernels MODEL_DIR [--simulate-cc X.Y] [--disable-kernel NAME[,NAME...]] [--verbose]\n"
		   "  Select and prepare every layer's kernels as serve would, and print the plan.\n"
		   "  --simulate-cc X.Y     plan for a GPU of compute capability X.Y (no GPU needed)\n"
		   "  --disable-kernel L    remove variants from selection (also $DSV4_DISABLED_KERNELS)\n"
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
	const char *dir = NULL, *sim = NULL, *disable = NULL;
	bool verbose = false;
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

	struct model_checkpoint *ck = NULL;
	struct model_checkpoint_options co = {.dir = dir};
	if (model_checkpoint_create(&ck, &co, &e)) {
		fprintf(stderr, "dsv4 kernels: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	struct model_weights w;
	memset(&w, 0, sizeof w);
	struct model_weights_options wo = {.ck = ck, .dev = &dev, .disabled = &dis, .max_step_tokens = 512,
					   .quant_sim = true, .load_mtp = true, .rank = 0, .world_size = 1};
	int rc = CLI_EXIT_OK;
	if (model_weights_load(&w, &wo, &e)) {
		fprintf(stderr, "dsv4 kernels: %s\n", e.msg);
		rc = CLI_EXIT_FAIL;
	} else {
		size_t need = model_weights_plan_str(&w, NULL, 0);
		char *buf = malloc(need + 1);
		if (buf) {
			model_weights_plan_str(&w, buf, need + 1);
			fputs(buf, stdout);
			free(buf);
		}
		printf("rows: %d (layer op kernel)\n", w.plan.n);
		for (int i = 0; i < w.plan.n; i++)
			printf("  %d %s %s\n", w.plan.entries[i].layer, w.plan.entries[i].op, w.plan.entries[i].variant);
		if (verbose)
			print_report(&dev, &dis);
		model_weights_free(&w);
	}
	model_checkpoint_destroy(ck);
	return rc;
}
