/*
 * tests/model/test_graphs.c: decode steps replayed as CUDA graphs
 * (kernels/device/graph.h) give bit for bit the logits of the same steps run
 * eagerly, on every tiny checkpoint at both precisions. Two GPU executors
 * walk the same random schedule: five sequences with random prompts,
 * prefilled in mixed chunks (eager in both), then decode steps over random
 * subsets of the sequences (batch sizes 1..5, so graphs are cached under
 * several keys, updated in place and re-instantiated), crossing block
 * boundaries and the sliding window, with a mixed prefill+decode step now
 * and then. The graph executor must have captured every decode-only step.
 * GPU only (the gpu suite); exit 77 elsewhere.
 */
#include <time.h>

#include "kernels/device/graph.h"
#include "tests/model/fwd_harness.h"
#include "tests/test.h"

#define N_SEQ 5
#define N_DECODE 90
#define MAX_IDS 400

static struct model_exec_cpu *make(struct model_checkpoint *ck, enum model_precision prec, bool eager)
{
	struct model_exec_cpu_options o = {.ck = ck, .block_tokens = 64, .n_blocks = 64, .max_step_tokens = 256,
					   .max_step_seqs = 8, .precision = prec, .dev = fh_device(),
					   .enforce_eager = eager};
	struct model_exec_cpu *x = NULL;
	struct err e = {0};
	T_CHECKF(model_exec_cpu_create(&x, &o, &e) == ST_OK, "create: %s", e.msg);
	return x;
}

static void one(const char *variant, enum model_precision prec)
{
	struct model_checkpoint *ck = fh_open(variant);
	T_CHECKF(ck != NULL, "%s: open", variant);
	if (!ck)
		return;
	struct model_exec_cpu *xe = make(ck, prec, true), *xg = make(ck, prec, false);
	if (!xe || !xg)
		goto out;
	struct kern_graph_stats gs0;
	T_CHECKF(!model_exec_cpu_graph_stats(xe, &gs0), "%s: the eager executor has graphs", variant);
	T_CHECKF(model_exec_cpu_graph_stats(xg, &gs0), "%s: the graph executor has none", variant);
	uint32_t V = model_exec_cpu_exec(xe)->info.vocab_size;
	static int32_t ids[N_SEQ][MAX_IDS];
	struct fh_seq se[N_SEQ], sg[N_SEQ];
	uint32_t plen[N_SEQ];
	for (int i = 0; i < N_SEQ; i++) {
		for (int k = 0; k < MAX_IDS; k++)
			ids[i][k] = (int32_t)fh_rand(V);
		plen[i] = 3 + fh_rand(120);
		se[i] = sg[i] = (struct fh_seq){.id = (uint64_t)i + 1, .ids = ids[i], .n_ids = MAX_IDS};
	}
	struct fh_pool pe = {.n = 64}, pg = {.n = 64};
	float *le = malloc((size_t)256 * V * sizeof(float)), *lg = malloc((size_t)256 * V * sizeof(float));
	T_CHECK(le && lg);
	struct err e = {0};
	int decode_steps = 0, compared = 0;
	bool same = true;
	/* prefill: two mixed steps of chunks */
	for (int half = 0; half < 2 && same; half++) {
		struct fh_seq *a[N_SEQ], *b[N_SEQ];
		uint32_t ch[N_SEQ];
		int n = 0;
		for (int i = 0; i < N_SEQ; i++) {
			uint32_t c = half ? plen[i] - plen[i] / 2 : plen[i] / 2;
			if (!c)
				continue;
			a[n] = &se[i], b[n] = &sg[i], ch[n] = c, n++;
		}
		T_CHECKF(fh_step(xe, &pe, a, ch, n, le, &e) == ST_OK, "%s: eager prefill: %s", variant, e.msg);
		T_CHECKF(fh_step(xg, &pg, b, ch, n, lg, &e) == ST_OK, "%s: graph prefill: %s", variant, e.msg);
		uint32_t T = 0;
		for (int i = 0; i < n; i++)
			T += ch[i];
		same = !memcmp(le, lg, (size_t)T * V * sizeof(float));
		T_CHECKF(same, "%s: prefill %d differs (max |d| %g)", variant, half,
			 fh_max_abs_diff(le, lg, (size_t)T * V));
	}
	for (int s = 0; s < N_DECODE && same; s++) {
		struct fh_seq *a[N_SEQ], *b[N_SEQ];
		uint32_t ch[N_SEQ];
		int n = 0;
		bool mixed = s % 23 == 11; /* now and then one sequence takes a chunk: an eager step */
		for (int i = 0; i < N_SEQ; i++) {
			if (fh_rand(3) == 0 && !(n == 0 && i == N_SEQ - 1))
				continue;
			uint32_t c = mixed && n == 0 ? 2 + fh_rand(9) : 1;
			if (se[i].n_done + c > MAX_IDS)
				continue;
			a[n] = &se[i], b[n] = &sg[i], ch[n] = c, n++;
		}
		if (!n)
			continue;
		uint32_t T = 0;
		for (int i = 0; i < n; i++)
			T += ch[i];
		decode_steps += T == (uint32_t)n;
		T_CHECKF(fh_step(xe, &pe, a, ch, n, le, &e) == ST_OK, "%s: eager step %d: %s", variant, s, e.msg);
		T_CHECKF(fh_step(xg, &pg, b, ch, n, lg, &e) == ST_OK, "%s: graph step %d: %s", variant, s, e.msg);
		same = !memcmp(le, lg, (size_t)T * V * sizeof(float));
		T_CHECKF(same, "%s: step %d (%d sequences, %u tokens, graph %s) differs: max |d| %g", variant, s, n, T,
			 T == (uint32_t)n ? "replayed" : "not used", fh_max_abs_diff(le, lg, (size_t)T * V));
		compared++;
	}
	struct kern_graph_stats gs;
	model_exec_cpu_graph_stats(xg, &gs);
	/* the first decode step of each batch size runs eagerly (kern_graph_warm) */
	T_CHECKF(gs.captures + gs.warmups == (uint64_t)decode_steps || !same,
		 "%s: %llu captures + %llu warm-ups for %d decode-only steps", variant, (unsigned long long)gs.captures,
		 (unsigned long long)gs.warmups, decode_steps);
	T_CHECKF(gs.warmups <= N_SEQ, "%s: %llu warm-ups for %d batch sizes", variant, (unsigned long long)gs.warmups,
		 N_SEQ);
	T_CHECKF(gs.updates > 0 || !same, "%s: no graph was ever updated in place", variant);
	T_CHECK(gs.captures == gs.updates + gs.instantiates);
	printf("%s %s: %d steps compared bit for bit (%d decode-only: %llu warm-ups, %llu captures, %llu updates, "
	       "%llu instantiations)\n", variant, prec == MODEL_PREC_FP32 ? "fp32" : "reference", compared, decode_steps,
	       (unsigned long long)gs.warmups, (unsigned long long)gs.captures, (unsigned long long)gs.updates,
	       (unsigned long long)gs.instantiates);
	free(le);
	free(lg);
out:
	model_exec_cpu_destroy(xe);
	model_exec_cpu_destroy(xg);
	model_checkpoint_destroy(ck);
}

int main(void)
{
	if (!fh_device())
		return test_skip("CUDA graphs need a GPU (DSV4_TEST_DEVICE=cuda)");
	fh_rng_state ^= test_seed() * 0x9E3779B97F4A7C15ull;
	const char *variants[] = {"bf16", "fp8", "nvfp4"};
	for (int v = 0; v < 3; v++)
		one(variants[v], MODEL_PREC_REFERENCE);
	one("nvfp4", MODEL_PREC_FP32);
	return test_exit();
}
