/*
 * tests/scheduler/test_exec_mix.c: model/exec.c's block sizing and checks,
 * against the DeepSeek-V4-Flash numbers of dsv4.md section 4.2 computed by
 * hand there: 3514.25 bytes of growing rows per token (FP8 KV + FP4
 * indexer), 43 rings of 128 x 584 B, and ~11.6 MiB of fp32 compressor state.
 */
#include "model/exec.h"
#include "tests/test.h"

static struct exec_layer_mix flash_fp8(void)
{
	struct exec_layer_mix m = {
		.sliding_window = 128,
		.swa = {.n_layers = 2, .ring_entry_bytes = 584},
		/* kv + score fp32 rows of c*512 per open token (c = 2), plus the indexer's 2 * (2*128) */
		.csa = {.n_layers = 21, .compress_ratio = 4, .overlap = true, .kv_entry_bytes = 584,
			.indexer_entry_bytes = 68, .ring_entry_bytes = 584, .compressor_token_bytes = 2 * 1024 * 4 + 2 * 256 * 4},
		.hca = {.n_layers = 20, .compress_ratio = 128, .kv_entry_bytes = 584, .ring_entry_bytes = 584,
			.compressor_token_bytes = 2 * 512 * 4},
	};
	return m;
}

int main(void)
{
	struct exec_layer_mix m = flash_fp8();
	struct err e = {0};
	T_CHECK(exec_layer_mix_check(&m, 256, &e) == ST_OK);
	T_CHECK(exec_layer_mix_check(&m, 320, &e) == ST_INVALID); /* not a multiple of 128 */
	T_STR_CONTAINS(e.msg, "hca");
	e = (struct err){0};
	T_CHECK(exec_layer_mix_check(&m, 0, &e) == ST_INVALID);
	struct exec_layer_mix small = m;
	small.hca.compress_ratio = 64;
	e = (struct err){0};
	T_CHECK(exec_layer_mix_check(&small, 64, &e) == ST_INVALID); /* below the 128-token window */
	T_STR_CONTAINS(e.msg, "sliding window");

	uint64_t rows = exec_block_bytes(&m, 256, true) - exec_block_snapshot_bytes(&m);
	T_CHECK(rows * 4 == 351425ull * 256 * 4 / 100); /* 3514.25 B/token x 256 */
	uint64_t rings = 43ull * 128 * 584;
	uint64_t csa_carry = 21ull * 4 * (2 * 1024 * 4 + 2 * 256 * 4);
	T_CHECK(exec_block_snapshot_bytes(&m) == rings + csa_carry);
	/* a slot: rings + CSA 2 windows + HCA one window; dsv4.md: 3.14 MiB + ~11.6 MiB */
	uint64_t slot = exec_slot_bytes(&m);
	T_CHECK(slot == rings + 21ull * 8 * (2 * 1024 * 4 + 2 * 256 * 4) + 20ull * 128 * 2 * 512 * 4);
	T_CLOSE((double)(slot - rings) / (1024.0 * 1024.0), 11.6, 0.05, 0);
	/* block mode pays a slot per block */
	T_CHECK(exec_block_bytes(&m, 256, false) == rows + slot);
	fprintf(stderr, "DSv4-Flash FP8, B=256: block %.2f MiB (slot mode), %.2f MiB (block mode), slot %.2f MiB\n",
		exec_block_bytes(&m, 256, true) / 1048576.0, exec_block_bytes(&m, 256, false) / 1048576.0,
		slot / 1048576.0);
	/* sizing from a byte budget */
	uint64_t budget = 100ull << 30;
	uint32_t nb = exec_blocks_for_bytes(&m, 256, budget, 16);
	T_CHECK(nb == (budget - 16 * slot) / exec_block_bytes(&m, 256, true));
	T_CHECK(exec_blocks_for_bytes(&m, 256, 16 * slot, 16) == 0);
	T_CHECK(exec_blocks_for_bytes(&m, 256, budget, 0) == budget / exec_block_bytes(&m, 256, false));
	return test_exit();
}
