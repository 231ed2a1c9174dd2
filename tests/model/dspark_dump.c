/*
 * tests/model/dspark_dump.c: a helper of tests/model/test_dspark_ref.py.
 * Runs a random prompt through the CPU executor (precision fp32) of a tiny
 * 0731 checkpoint, commits it to the DSpark drafter (model/dspark.h) and
 * proposes K drafts after a random anchor token; writes what the NumPy
 * transcription (tests/model/dspark_ref.py) needs and what it checks:
 *   int32 N, D, n_targets, vocab, K; int32 ids[N + 1] (ids[N] the anchor);
 *   f32 captures[N, n_targets * D]; int32 drafts[K]; f32 logits[K, vocab]
 * (the logits after the Markov head). dspark_dump CKPT_DIR OUT N SEED
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/checkpoint.h"
#include "model/dspark.h"
#include "model/exec_cpu.h"
#include "model/forward.h"

#define KD 5

static int fail(const char *what, const struct err *e)
{
	fprintf(stderr, "dspark_dump: %s: %s\n", what, e->msg);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: dspark_dump CKPT_DIR OUT N SEED\n");
		return 2;
	}
	uint32_t N = (uint32_t)atoi(argv[3]);
	srand((unsigned)strtoul(argv[4], NULL, 10));
	if (N < 1 || N > 200)
		return 2;
	struct err e = {0};
	struct model_checkpoint *ck = NULL;
	struct model_checkpoint_options co = {.dir = argv[1]};
	if (model_checkpoint_create(&ck, &co, &e))
		return fail("checkpoint", &e);
	const struct model_config *cfg = model_checkpoint_config(ck);
	struct model_exec_cpu_options o = {.ck = ck, .block_tokens = 64, .n_blocks = 8, .max_step_tokens = 256,
					   .max_step_seqs = 4, .precision = MODEL_PREC_FP32, .load_mtp = true};
	struct model_exec_cpu *x = NULL;
	if (model_exec_cpu_create(&x, &o, &e))
		return fail("executor", &e);
	struct spec_drafter dr;
	if (spec_dspark_drafter_create(&dr, x, KD, &e))
		return fail("drafter", &e);
	uint32_t V = (uint32_t)cfg->vocab_size, D = (uint32_t)cfg->hidden_size, nt = (uint32_t)cfg->dspark.n_target_layers;
	int32_t *ids = malloc((N + 1) * sizeof *ids), *pos = malloc(N * sizeof *pos);
	for (uint32_t i = 0; i <= N; i++)
		ids[i] = 3 + rand() % 100000;
	for (uint32_t i = 0; i < N; i++)
		pos[i] = (int32_t)i;
	uint32_t blocks[8] = {0, 1, 2, 3, 4, 5, 6, 7}, qs[2] = {0, N}, row = N - 1;
	struct exec_seq es = {.seq_id = 1, .n_cached_tokens = 0, .n_context_tokens = N, .n_blocks = (N + 63) / 64,
			      .state_slot = EXEC_NO_SLOT};
	struct exec_step st = {.n_tokens = N, .token_ids = ids, .positions = pos, .n_seqs = 1, .seqs = &es,
			       .query_start = qs, .block_ids = blocks, .n_block_ids = 8};
	float *lg = malloc((size_t)V * sizeof(float));
	if (model_exec_cpu_forward(x, &st, &row, 1, lg, &e))
		return fail("forward", &e);
	float *cap = malloc((size_t)N * nt * D * sizeof(float));
	memcpy(cap, model_fwd_dspark_captures(model_exec_cpu_fwd(x)), (size_t)N * nt * D * sizeof(float));
	int32_t drafts[KD] = {0};
	struct spec_draft_seq ds = {.seq_id = 1, .seq_index = 0, .pos0 = 0, .n_commit = N, .row0 = 0,
				    .next_ids = ids + 1, .n_propose = KD, .drafts = drafts};
	struct spec_draft_batch b = {.step = &st, .streams = model_exec_cpu_streams(x), .seqs = &ds, .n_seqs = 1};
	if (dr.ops->commit(dr.ctx, &b, &e) || dr.ops->propose(dr.ctx, &b, &e))
		return fail("drafter step", &e);
	const float *last = spec_dspark_last_logits(dr.ctx, 0);
	if (ds.n_drafts != KD || !last) {
		fprintf(stderr, "dspark_dump: %u drafts\n", ds.n_drafts);
		return 1;
	}
	FILE *fo = fopen(argv[2], "wb");
	int32_t hdr[5] = {(int32_t)N, (int32_t)D, (int32_t)nt, (int32_t)V, KD};
	int ok = fo && fwrite(hdr, sizeof hdr, 1, fo) == 1 && fwrite(ids, sizeof *ids, N + 1, fo) == N + 1 &&
		 fwrite(cap, sizeof(float), (size_t)N * nt * D, fo) == (size_t)N * nt * D &&
		 fwrite(drafts, sizeof drafts, 1, fo) == 1 &&
		 fwrite(last, sizeof(float), (size_t)KD * V, fo) == (size_t)KD * V;
	if (fo)
		ok = fclose(fo) == 0 && ok;
	dr.ops->destroy(dr.ctx);
	model_exec_cpu_destroy(x);
	model_checkpoint_destroy(ck);
	free(ids);
	free(pos);
	free(lg);
	free(cap);
	if (!ok) {
		fprintf(stderr, "dspark_dump: writing %s failed\n", argv[2]);
		return 1;
	}
	return 0;
}
