/*
 * tests/model/test_exec_gpu.c: the GPU executor against the CPU executor at
 * the serving default, reference precision (FP8/FP4 simulations and bf16
 * storage rounding on), on the tiny bf16, fp8 and nvfp4 checkpoints and the
 * six golden prompts (tests/model/data/golden/golden_bf16.json gives the
 * ids). Suite gpu; exits 77 without a GPU.
 *
 * Per prompt, both executors prefill in the same chunks and every
 * position's logits are compared: the largest |difference| relative to the
 * row's largest |logit| is reported and bounded by TOL_REL. Both sides
 * round to bf16 and quantize activations to FP8 after sums whose order
 * differs (tensor cores, tiled f32 FMA, split reductions), so a value on a
 * rounding boundary can land one bf16 / e4m3 step apart and carry that
 * through the layers; TOL_REL bounds that, far below what a wrong formula
 * moves (tens of percent).
 * Then 32 greedy tokens, each executor decoding its own continuation token
 * by token through its step (sampling at temperature 0): they must be
 * equal, except that a divergence is accepted at a step whose CPU top-2 gap
 * is within the logit tolerance there (a near tie, shown in the log); the
 * comparison stops at the first divergence.
 */
#include "tests/model/fwd_harness.h"
#include "tests/model/golden_reader.h"
#include "tests/test.h"

#define TOL_REL 0.05   /* |gpu - cpu| / max|cpu| at any position */
#define N_GREEDY 32

static struct model_exec_cpu *make(struct model_checkpoint *ck, const struct kern_device *dev)
{
	struct model_exec_cpu_options o = {.ck = ck, .block_tokens = 64, .n_blocks = 16, .max_step_tokens = 256,
					   .max_step_seqs = 4, .precision = MODEL_PREC_REFERENCE, .dev = dev};
	struct model_exec_cpu *x = NULL;
	struct err e = {0};
	T_CHECKF(model_exec_cpu_create(&x, &o, &e) == ST_OK, "create (%s): %s", dev ? "gpu" : "cpu", e.msg);
	return x;
}

/* Top-2 of a row: best id and the gap to the second. */
static int32_t top2(const float *row, uint32_t V, double *gap)
{
	int32_t b = 0;
	float v1 = -INFINITY, v2 = -INFINITY;
	for (uint32_t v = 0; v < V; v++) {
		if (row[v] > v1) {
			v2 = v1;
			v1 = row[v];
			b = (int32_t)v;
		} else if (row[v] > v2) {
			v2 = row[v];
		}
	}
	*gap = (double)v1 - (double)v2;
	return b;
}

static double g_worst;

/* Prefill p on both in the same chunks, compare every position, then the
 * greedy continuations. */
static void one_prompt(struct model_exec_cpu *xc, struct model_exec_cpu *xg, const struct gold_prompt *p,
		       const char *label, uint32_t V, uint64_t id)
{
	uint32_t n = p->n, total = n + N_GREEDY;
	int32_t *ids_c = calloc(total, sizeof *ids_c), *ids_g = calloc(total, sizeof *ids_g);
	float *lc = malloc((size_t)256 * V * sizeof(float)), *lg = malloc((size_t)256 * V * sizeof(float));
	T_CHECK(ids_c && ids_g && lc && lg);
	if (!ids_c || !ids_g || !lc || !lg)
		goto out;
	memcpy(ids_c, p->ids, n * sizeof *ids_c);
	memcpy(ids_g, p->ids, n * sizeof *ids_g);
	struct fh_pool pc = {.n = 16}, pg = {.n = 16};
	struct fh_seq sc = {.id = id, .ids = ids_c, .n_ids = total}, sg = {.id = id, .ids = ids_g, .n_ids = total};
	struct fh_seq *spc = &sc, *spg = &sg;
	double worst = 0;
	struct err e = {0};
	int32_t last_c = -1, last_g = -1;
	double gap_c = 0;
	for (uint32_t done = 0; done < n;) {
		uint32_t c = 1 + fh_rand(200);
		c = c > n - done ? n - done : c;
		enum status a = fh_step(xc, &pc, &spc, &c, 1, lc, &e);
		T_CHECKF(a == ST_OK, "%s cpu: %s", label, e.msg);
		enum status b = fh_step(xg, &pg, &spg, &c, 1, lg, &e);
		T_CHECKF(b == ST_OK, "%s gpu: %s", label, e.msg);
		if (a || b)
			goto out;
		for (uint32_t t = 0; t < c; t++) {
			const float *rc = lc + (size_t)t * V, *rg = lg + (size_t)t * V;
			double mx = 0, d = fh_max_abs_diff(rc, rg, V);
			for (uint32_t v = 0; v < V; v++)
				mx = fabs(rc[v]) > mx ? fabs(rc[v]) : mx;
			double rel = d / (mx > 0 ? mx : 1);
			worst = rel > worst ? rel : worst;
		}
		last_c = top2(lc + (size_t)(c - 1) * V, V, &gap_c);
		double gg;
		last_g = top2(lg + (size_t)(c - 1) * V, V, &gg);
		done += c;
	}
	fprintf(stderr, "%s %s (%u tokens): max |gpu - cpu| / max|cpu| over every position %.3g\n", label, p->name, n,
		worst);
	T_CHECKF(worst <= TOL_REL, "%s %s: logits differ by %.3g of the row's scale", label, p->name, worst);
	g_worst = worst > g_worst ? worst : g_worst;
	/* greedy, token by token, each on its own continuation */
	uint32_t same = 0;
	for (uint32_t k = 0; k < N_GREEDY; k++) {
		if (last_c != last_g) {
			bool tie = gap_c <= worst * 4 + 1e-3;
			fprintf(stderr, "%s %s greedy: first difference at token %u: cpu %d, gpu %d (cpu top-2 gap %.3g, %s)\n",
				label, p->name, k, last_c, last_g, gap_c, tie ? "a near tie: accepted" : "NOT a near tie");
			T_CHECKF(tie, "%s %s greedy diverges at token %u away from a tie", label, p->name, k);
			break;
		}
		same++;
		ids_c[n + k] = last_c;
		ids_g[n + k] = last_g;
		uint32_t one = 1;
		if (fh_step(xc, &pc, &spc, &one, 1, lc, &e) || fh_step(xg, &pg, &spg, &one, 1, lg, &e)) {
			T_CHECKF(false, "%s decode: %s", label, e.msg);
			break;
		}
		double gg;
		last_c = top2(lc, V, &gap_c);
		last_g = top2(lg, V, &gg);
	}
	fprintf(stderr, "%s %s greedy: %u of %d tokens equal\n", label, p->name, same, N_GREEDY);
out:
	free(ids_c);
	free(ids_g);
	free(lc);
	free(lg);
}

int main(void)
{
	const struct kern_device *gpu = fh_device();
	if (!gpu) {
		fprintf(stderr, "skip: set DSV4_TEST_DEVICE=cuda (the gpu suite does)\n");
		return 77;
	}
	const char *src = getenv("DSV4_SOURCE_ROOT");
	char dir[1100];
	snprintf(dir, sizeof dir, "%s/tests/model/data/golden", src ? src : ".");
	struct golden g;
	int rc = golden_load(&g, dir, "bf16");
	T_CHECKF(rc == 0, "%s: %s", g.path, g.msg);
	if (rc)
		return test_exit();
	const char *variants[] = {"bf16", "fp8", "nvfp4"};
	for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
		/* DSV4_EXEC_GPU_VARIANTS=fp8,nvfp4: only those (a device round that looks at one) */
		const char *only = getenv("DSV4_EXEC_GPU_VARIANTS");
		if (only && !strstr(only, variants[vi]))
			continue;
		struct model_checkpoint *ck = fh_open(variants[vi]);
		T_CHECK(ck != NULL);
		if (!ck)
			continue;
		struct model_exec_cpu *xc = make(ck, NULL), *xg = make(ck, gpu);
		if (xc && xg) {
			uint32_t V = model_exec_cpu_exec(xc)->info.vocab_size;
			char label[64];
			snprintf(label, sizeof label, "%s reference precision gpu vs cpu", variants[vi]);
			for (int i = 0; i < g.n_prompts; i++)
				one_prompt(xc, xg, &g.p[i], label, V, 100 + (uint64_t)i);
		}
		model_exec_cpu_destroy(xc);
		model_exec_cpu_destroy(xg);
		model_checkpoint_destroy(ck);
	}
	fprintf(stderr, "largest |gpu - cpu| / max|cpu| seen: %.3g\n", g_worst);
	golden_free(&g);
	return test_exit();
}
