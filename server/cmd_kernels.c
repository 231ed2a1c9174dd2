/*
 * server/cmd_kernels.c: `dsv4 kernels MODEL_DIR [--simulate-cc X.Y]
 * [--disable-kernel a,b] [--verbose]`.
 *
 * Runs the load-time selection of every layer's kernels (design.md steps
 * 1-4: validate the checkpoint, detect or simulate the device, select and
 * prepare each weight) without serving, and prints the plan on one screen:
 * one line per distinct layer plan with the layers it covers
 * ("layers 2,4,…,42 (CSA): ..."); --verbose prints every layer's line,
 * every (layer, op, kernel) row and every variant's verdict. With
 * --simulate-cc the device is a pretend GPU of that capability whose
 * loadable images are the compiled ones a real device of that family could
 * load, so CI proves the plan for every GPU family without one. A
 * selection that fails exits 1 with the layer, the op and every variant's
 * reason, exactly as `serve` would at start-up, followed by what the
 * refusals mean here: "not implemented" for an op with no kernel for the
 * device, "not compiled" only when this binary lacks the variant's image.
 * --verbose adds, for each op, every variant's verdict on a representative
 * problem, in the same words. MODEL_DIR 'tiny' is serve's tiny checkpoint.
 * --max-num-batched-tokens N plans for steps of at most N tokens (default
 * 512, a prefill-sized plan; N < 64 is a decode plan, where the FP8 linears
 * get the decode GEMV).
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

/* "2,4,…,42", "0-1", "3,7,9": ascending layer numbers, compact. */
static void layers_str(const int *l, int n, char *out, size_t cap)
{
	size_t off = 0;
	out[0] = '\0';
#define LS_PUT(...)                                                                                 \
	do {                                                                                        \
		int k_ = snprintf(out + off, off < cap ? cap - off : 0, __VA_ARGS__);               \
		off += k_ > 0 ? (size_t)k_ : 0;                                                     \
		if (off >= cap)                                                                     \
			off = cap - 1;                                                              \
	} while (0)
	bool ap = n >= 3;
	for (int i = 2; ap && i < n; i++)
		ap = l[i] - l[i - 1] == l[1] - l[0];
	if (ap && l[1] - l[0] == 1) {
		LS_PUT("%d-%d", l[0], l[n - 1]);
		return;
	}
	if (ap) {
		LS_PUT("%d,%d,\u2026,%d", l[0], l[1], l[n - 1]);
		return;
	}
	for (int i = 0; i < n;) {
		int j = i;
		while (j + 1 < n && l[j + 1] == l[j] + 1)
			j++;
		if (j - i >= 2)
			LS_PUT("%s%d-%d", i ? "," : "", l[i], l[j]);
		else
			for (int k = i; k <= j; k++)
				LS_PUT("%s%d", k ? "," : "", l[k]);
		i = j + 1;
	}
#undef LS_PUT
}

/* One line per distinct layer plan: the per-layer lines "layer N (what):
 * kernels" of text grouped by "(what): kernels", each group printed where
 * its first layer was; other lines as they are. */
static void print_grouped(char *text)
{
	int n_lines = 0;
	for (char *c = text; *c; c++)
		n_lines += *c == '\n';
	char **line = calloc((size_t)n_lines + 1, sizeof *line);
	int *num = calloc((size_t)n_lines + 1, sizeof *num), *group = calloc((size_t)n_lines + 1, sizeof *group);
	int *members = calloc((size_t)n_lines + 1, sizeof *members);
	if (!line || !num || !group || !members) {
		fputs(text, stdout);
		goto out;
	}
	int n = 0;
	for (char *c = text, *nl; *c; c = nl + 1) {
		nl = strchr(c, '\n');
		if (!nl)
			nl = c + strlen(c) - 1;
		nl[0] = '\0';
		line[n] = c;
		num[n] = -1;
		char *rest = NULL;
		long v = strncmp(c, "layer ", 6) ? -1 : strtol(c + 6, &rest, 10);
		if (v >= 0 && rest && rest[0] == ' ' && rest[1] == '(') {
			num[n] = (int)v;
			line[n] = rest + 1; /* "(what): kernels", the group key */
		}
		group[n] = n;
		for (int k = 0; num[n] >= 0 && k < n; k++)
			if (num[k] >= 0 && group[k] == k && !strcmp(line[k], line[n])) {
				group[n] = k;
				break;
			}
		n++;
	}
	for (int i = 0; i < n; i++) {
		if (num[i] < 0) {
			printf("%s\n", line[i]);
			continue;
		}
		if (group[i] != i)
			continue;
		int m = 0;
		for (int k = i; k < n; k++)
			if (num[k] >= 0 && group[k] == i)
				members[m++] = num[k];
		char ls[512];
		layers_str(members, m, ls, sizeof ls);
		printf("%s %s %s\n", m > 1 ? "layers" : "layer", ls, line[i]);
	}
out:
	free(line);
	free(num);
	free(group);
	free(members);
}

/* The plan: grouped per-layer lines (verbose: every layer's line and every
 * row), then the closing summary line. */
static void print_plan(const struct model_plan *p, const struct kern_plan *rows, bool verbose)
{
	size_t need = model_plan_str(p, NULL, 0);
	char *buf = malloc(need + 1);
	if (buf) {
		model_plan_str(p, buf, need + 1);
		if (verbose)
			fputs(buf, stdout);
		else
			print_grouped(buf);
		free(buf);
	}
	if (verbose) {
		printf("rows: %d (layer op kernel)\n", rows->n);
		for (int i = 0; i < rows->n; i++)
			printf("  %d %s %s\n", rows->entries[i].layer, rows->entries[i].op, rows->entries[i].variant);
	} else {
		printf("rows: %d (layer op kernel; --verbose lists them and every variant's verdict)\n", rows->n);
	}
	if (p->n_dspark)
		printf("plan complete: %d layers + %d DSpark stages and the head\n", p->n_layers, p->n_dspark);
	else
		printf("plan complete: %d layers%s and the head\n", p->n_layers, p->n_mtp ? " + MTP" : "");
}

static bool gpu_device(const struct kern_device *dev) { return dev->cc_major > 0 || dev->cc_minor > 0; }

/* Why variant v cannot run on dev, in the words users need: "not compiled"
 * when this binary lacks its image, else the registry's reason. NULL: it
 * may run (its problem decides). */
static const char *why_not(const struct kern_variant *v, const struct kern_device *dev, const struct kern_disabled *dis,
			   char *buf, size_t n)
{
	if (kern_disabled_has(dis, v->name))
		return "disabled (--disable-kernel / DSV4_DISABLED_KERNELS)";
	if ((v->backend == KERN_BACKEND_CPU) == gpu_device(dev))
		return v->backend == KERN_BACKEND_CPU ? "a CPU variant (device: GPU)" : "a CUDA variant (device: CPU)";
	if (v->backend != KERN_BACKEND_CPU && (v->target & dev->compiled) != v->target) {
		char t[64];
		kern_targets_str(v->target, t, sizeof t);
		snprintf(buf, n, "not compiled: this binary has no %s image (build with -Dcuda=enabled "
				 "-Dgpu_targets=...)", t);
		return buf;
	}
	if (!v->run)
		return "not implemented: the variant has no kernel in this binary";
	return NULL;
}

/* After a failed selection: which ops have no kernel at all for this device
 * ("not implemented") and whether the binary simply lacks the GPU images
 * ("not compiled"). */
static void explain_refusals(const struct kern_device *dev, const struct kern_disabled *dis)
{
	int n_ops = 0;
	const struct kern_op *const *ops = kern_registry_ops(&n_ops);
	bool gpu = gpu_device(dev);
	for (int i = 0; i < n_ops; i++) {
		int same = 0, usable = 0, no_kernel = 0, no_image = 0;
		for (int v = 0; v < (int)ops[i]->n_variants; v++) {
			const struct kern_variant *x = &ops[i]->variants[v];
			if ((x->backend != KERN_BACKEND_CPU) != gpu)
				continue;
			same++;
			char b[160];
			const char *w = why_not(x, dev, dis, b, sizeof b);
			usable += w == NULL;
			no_kernel += w && !strncmp(w, "not implemented", 15);
			no_image += w && !strncmp(w, "not compiled", 12);
		}
		if (!same || (no_kernel == same))
			fprintf(stderr, "  op %s: not implemented for %s (no %s kernel)\n", ops[i]->name,
				gpu ? "GPUs" : "the CPU", gpu ? "CUDA" : "CPU");
		else if (!usable && no_image && !(gpu && !dev->compiled))
			fprintf(stderr, "  op %s: not compiled: none of its %d %s variants is in this binary for this "
					"device\n", ops[i]->name, same, gpu ? "CUDA" : "CPU");
	}
	if (gpu && !dev->compiled)
		fprintf(stderr, "  not compiled: this binary was built without CUDA, so no CUDA variant can run "
				"(meson setup -Dcuda=enabled)\n");
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
			    bool verbose, int64_t max_step_tokens)
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
		explain_refusals(dev, dis);
		rc = CLI_EXIT_FAIL;
	} else {
		print_plan(&plan, &plan.rows, verbose);
		model_plan_free(&plan);
	}
	free(fmts);
	return rc;
}

static int usage(FILE *f, int code)
{
	fprintf(f, "usage: dsv4 kernels MODEL_DIR|tiny [--simulate-cc X.Y] [--disable-kernel NAME[,NAME...]]\n"
		   "                   [--max-num-batched-tokens N] [--verbose]\n"
		   "  Select and prepare every layer's kernels as serve would, and print the plan: one line per\n"
		   "  distinct layer plan with the layers it covers.\n"
		   "  A MODEL_DIR with only config.json is planned from the config (formats from quantization_config).\n"
		   "  --simulate-cc X.Y     plan for a GPU of compute capability X.Y (no GPU needed)\n"
		   "  --disable-kernel L    remove variants from selection (also $DSV4_DISABLED_KERNELS)\n"
		   "  --max-num-batched-tokens N  plan for steps of at most N tokens (default 512; < 64: decode)\n"
		   "  --verbose             every layer's line, every (layer, op, kernel) row and every variant's\n"
		   "                        verdict per op (\"not implemented\": no kernel for the device;\n"
		   "                        \"not compiled\": this binary lacks the image)\n");
	return code;
}

static void print_report(const struct kern_device *dev, const struct kern_disabled *dis)
{
	int n_ops = 0;
	const struct kern_op *const *ops = kern_registry_ops(&n_ops);
	char *buf = malloc(1 << 16);
	if (!buf)
		return;
	bool gpu = gpu_device(dev);
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
		printf("op %s:\n", ops[i]->name);
		int same = 0;
		/* the registry's lines, one per variant, with "not compiled" where the image is missing */
		char *ln = buf;
		for (int v = 0; v < (int)ops[i]->n_variants && *ln; v++) {
			const struct kern_variant *x = &ops[i]->variants[v];
			char *nl = strchr(ln, '\n');
			if (nl)
				*nl = '\0';
			same += (x->backend != KERN_BACKEND_CPU) == gpu;
			char why[200];
			const char *w = why_not(x, dev, dis, why, sizeof why);
			char *r = strstr(ln, "refused: ");
			if (r && w && (x->backend != KERN_BACKEND_CPU) == gpu)
				printf("%.*srefused: %s\n", (int)(r - ln), ln, w);
			else
				printf("%s\n", ln);
			if (!nl)
				break;
			ln = nl + 1;
		}
		if (!same)
			printf("  not implemented for %s: op %s has no %s variant\n", gpu ? "GPUs" : "the CPU",
			       ops[i]->name, gpu ? "CUDA" : "CPU");
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
	char tiny_dir[2048];
	if (!strcmp(dir, "tiny")) {
		if (load_args_model_dir(dir, tiny_dir, sizeof tiny_dir))
			return CLI_EXIT_FAIL;
		dir = tiny_dir;
	}

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
		int rc = plan_config_only(dir, &dev, &dis, verbose, max_step_tokens);
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
		if (strstr(e.msg, "no variant fits"))
			explain_refusals(&dev, &dis);
		rc = CLI_EXIT_FAIL;
	} else {
		print_plan(&w.kernels, &w.plan, verbose);
		if (verbose)
			print_report(&dev, &dis);
		model_weights_free(&w);
	}
	model_checkpoint_destroy(ck);
	return rc;
}
