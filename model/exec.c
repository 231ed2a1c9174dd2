/*
 * model/exec.c: block sizing from the layer mix (model/exec.h). Executors use
 * it to size the KV cache; the scheduler uses it to check the block size.
 */
#include "exec.h"

static enum status kind_check(const char *name, const struct exec_layer_kind *k, uint32_t block_tokens,
			      struct err *e)
{
	if (!k->n_layers)
		return ST_OK;
	if (k->compress_ratio && block_tokens % k->compress_ratio)
		return err_set(e, ST_INVALID, "block size %u tokens is not a multiple of the %s compress ratio %u",
			       block_tokens, name, k->compress_ratio);
	if (!k->compress_ratio && (k->overlap || k->indexer_entry_bytes))
		return err_set(e, ST_INVALID, "%s layers: an overlap or indexer needs a compress ratio", name);
	return ST_OK;
}

enum status exec_layer_mix_check(const struct exec_layer_mix *mix, uint32_t block_tokens, struct err *e)
{
	if (!block_tokens)
		return err_set(e, ST_INVALID, "block size must be positive");
	if (block_tokens < mix->sliding_window)
		return err_set(e, ST_INVALID, "block size %u tokens is below the sliding window %u", block_tokens,
			       mix->sliding_window);
	enum status st;
	if ((st = kind_check("swa", &mix->swa, block_tokens, e)) || (st = kind_check("csa", &mix->csa, block_tokens, e)) ||
	    (st = kind_check("hca", &mix->hca, block_tokens, e)))
		return st;
	return ST_OK;
}

/* Boundary snapshot of one kind: the ring, plus one full previous window for
 * an overlapping compressor (a non-overlapping one is empty at a boundary). */
static uint64_t kind_snapshot_bytes(const struct exec_layer_kind *k, uint32_t window)
{
	uint64_t ring = (uint64_t)window * k->ring_entry_bytes;
	uint64_t carry_tokens = k->compress_ratio && k->overlap ? k->compress_ratio : 0;
	return (uint64_t)k->n_layers * (ring + carry_tokens * k->compressor_token_bytes);
}

/* Live state of one kind: the ring plus the full open-window capacity (the
 * current window, and for an overlapping compressor the previous one too). */
static uint64_t kind_slot_bytes(const struct exec_layer_kind *k, uint32_t window)
{
	uint64_t ring = (uint64_t)window * k->ring_entry_bytes;
	uint64_t open_tokens = k->compress_ratio ? (uint64_t)k->compress_ratio * (k->overlap ? 2 : 1) : 0;
	return (uint64_t)k->n_layers * (ring + open_tokens * k->compressor_token_bytes);
}

static uint64_t kind_rows_bytes(const struct exec_layer_kind *k, uint32_t block_tokens)
{
	if (!k->compress_ratio)
		return 0;
	uint64_t rows = block_tokens / k->compress_ratio;
	return (uint64_t)k->n_layers * rows * ((uint64_t)k->kv_entry_bytes + k->indexer_entry_bytes);
}

uint64_t exec_block_snapshot_bytes(const struct exec_layer_mix *mix)
{
	uint32_t w = mix->sliding_window;
	return kind_snapshot_bytes(&mix->swa, w) + kind_snapshot_bytes(&mix->csa, w) + kind_snapshot_bytes(&mix->hca, w);
}

uint64_t exec_slot_bytes(const struct exec_layer_mix *mix)
{
	uint32_t w = mix->sliding_window;
	return kind_slot_bytes(&mix->swa, w) + kind_slot_bytes(&mix->csa, w) + kind_slot_bytes(&mix->hca, w);
}

uint64_t exec_block_bytes(const struct exec_layer_mix *mix, uint32_t block_tokens, bool slot_mode)
{
	return kind_rows_bytes(&mix->swa, block_tokens) + kind_rows_bytes(&mix->csa, block_tokens) +
	       kind_rows_bytes(&mix->hca, block_tokens) +
	       (slot_mode ? exec_block_snapshot_bytes(mix) : exec_slot_bytes(mix));
}

uint32_t exec_blocks_for_bytes(const struct exec_layer_mix *mix, uint32_t block_tokens, uint64_t kv_bytes,
			       uint32_t n_slots)
{
	uint64_t slots = (uint64_t)n_slots * exec_slot_bytes(mix), per = exec_block_bytes(mix, block_tokens, n_slots > 0);
	if (kv_bytes <= slots || !per)
		return 0;
	uint64_t n = (kv_bytes - slots) / per;
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}
