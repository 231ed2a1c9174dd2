/*
 * kernels/movement/movement_ref.c: CPU references of the movement ops
 * (contracts in movement.h). Plain loops over host memory; the CUDA variants
 * must match them bit for bit.
 */
#include "kernels/movement/movement.h"

#include <string.h>

#include "kernels/quant/quant.h"

enum status kern_copy_rows_check(const struct kern_copy_rows_args *a)
{
	if (!a || a->n_rows < 0 || a->dim <= 0 || a->dst_stride < 0 || a->src_stride < 0)
		return ST_INVALID;
	if ((a->dst_stride && a->dst_stride < a->dim) || (a->src_stride && a->src_stride < a->dim))
		return ST_INVALID;
	if (a->n_rows > 0 && (!a->dst || !a->src))
		return ST_INVALID;
	return ST_OK;
}

enum status kern_copy_rows_ref(const struct kern_copy_rows_args *a)
{
	enum status st = kern_copy_rows_check(a);
	if (st)
		return st;
	int64_t ds = a->dst_stride ? a->dst_stride : a->dim, ss = a->src_stride ? a->src_stride : a->dim;
	for (int64_t i = 0; i < a->n_rows; i++) {
		int64_t d = a->dst_idx ? a->dst_idx[i] : i, s = a->src_idx ? a->src_idx[i] : i;
		if (d < 0 || s < 0)
			continue;
		memcpy(a->dst + d * ds, a->src + s * ss, (size_t)a->dim * sizeof(float));
	}
	return ST_OK;
}

enum status kern_embed_check(const struct kern_embed_args *a)
{
	if (!a || a->n_tokens < 0 || a->dim <= 0 || a->n_copies < 1 || a->vocab_rows < 0 || a->vocab_begin < 0)
		return ST_INVALID;
	if (a->n_tokens > 0 && (!a->ids || !a->out || (a->vocab_rows > 0 && !a->table)))
		return ST_INVALID;
	return ST_OK;
}

enum status kern_embed_ref(const struct kern_embed_args *a)
{
	enum status st = kern_embed_check(a);
	if (st)
		return st;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		int64_t r = (int64_t)a->ids[t] - a->vocab_begin;
		float *o = a->out + t * a->n_copies * a->dim;
		if (r < 0 || r >= a->vocab_rows) {
			memset(o, 0, (size_t)(a->n_copies * a->dim) * sizeof(float));
			continue;
		}
		const uint16_t *row = a->table + r * a->dim;
		for (int64_t i = 0; i < a->dim; i++)
			o[i] = kern_bf16_to_f32(row[i]);
		for (int c = 1; c < a->n_copies; c++)
			memcpy(o + c * a->dim, o, (size_t)a->dim * sizeof(float));
	}
	return ST_OK;
}

static bool region_ok(int64_t stride, int64_t len, int64_t off)
{
	return stride > 0 && len >= 0 && off >= 0 && off <= stride && len <= stride - off;
}

enum status kern_block_copy_check(const struct kern_block_copy_args *a)
{
	if (!a || a->n < 0 || !region_ok(a->region_stride, a->region_len, a->region_offset))
		return ST_INVALID;
	if (a->n > 0 && a->region_len > 0 && (!a->pool || !a->dst_ids || !a->src_ids))
		return ST_INVALID;
	return ST_OK;
}

enum status kern_block_copy_ref(const struct kern_block_copy_args *a)
{
	enum status st = kern_block_copy_check(a);
	if (st || a->n == 0 || a->region_len == 0)
		return st;
	for (int64_t i = 0; i < a->n; i++)
		if (a->dst_ids[i] < 0 || a->src_ids[i] < 0)
			return ST_INVALID;
	for (int64_t i = 0; i < a->n; i++)
		memcpy(a->pool + a->dst_ids[i] * a->region_stride + a->region_offset,
		       a->pool + a->src_ids[i] * a->region_stride + a->region_offset,
		       (size_t)a->region_len * sizeof(float));
	return ST_OK;
}

enum status kern_block_fill_check(const struct kern_block_fill_args *a)
{
	if (!a || a->n < 0 || !region_ok(a->region_stride, a->region_len, a->region_offset))
		return ST_INVALID;
	if (a->n > 0 && a->region_len > 0 && (!a->pool || !a->ids))
		return ST_INVALID;
	return ST_OK;
}

enum status kern_block_fill_ref(const struct kern_block_fill_args *a)
{
	enum status st = kern_block_fill_check(a);
	if (st || a->n == 0 || a->region_len == 0)
		return st;
	for (int64_t i = 0; i < a->n; i++)
		if (a->ids[i] < 0)
			return ST_INVALID;
	for (int64_t i = 0; i < a->n; i++) {
		float *p = a->pool + a->ids[i] * a->region_stride + a->region_offset;
		for (int64_t k = 0; k < a->region_len; k++)
			p[k] = a->value;
	}
	return ST_OK;
}

enum status kern_round_bf16_check(const struct kern_round_bf16_args *a)
{
	return !a || a->n < 0 || (a->n > 0 && !a->x) ? ST_INVALID : ST_OK;
}

enum status kern_round_bf16_ref(const struct kern_round_bf16_args *a)
{
	enum status st = kern_round_bf16_check(a);
	if (st)
		return st;
	for (int64_t i = 0; i < a->n; i++)
		a->x[i] = kern_bf16_to_f32(kern_f32_to_bf16(a->x[i]));
	return ST_OK;
}

enum status kern_add_check(const struct kern_add_args *a)
{
	return !a || a->n < 0 || (a->n > 0 && (!a->x || !a->y)) ? ST_INVALID : ST_OK;
}

enum status kern_add_ref(const struct kern_add_args *a)
{
	enum status st = kern_add_check(a);
	if (st)
		return st;
	for (int64_t i = 0; i < a->n; i++)
		a->y[i] += a->x[i];
	return ST_OK;
}

enum status kern_act_quant_sim_check(const struct kern_act_quant_sim_args *a)
{
	if (!a || a->n_rows < 0 || a->n_cols < 0 || a->ld < a->n_cols || a->block < 1 || (a->fp4 != 0 && a->fp4 != 1))
		return ST_INVALID;
	return a->n_rows > 0 && a->n_cols > 0 && !a->x ? ST_INVALID : ST_OK;
}

enum status kern_act_quant_sim_ref(const struct kern_act_quant_sim_args *a)
{
	enum status st = kern_act_quant_sim_check(a);
	if (st || a->n_rows == 0 || a->n_cols == 0)
		return st;
	if (a->fp4)
		kern_act_quant_fp4_sim(a->x, a->n_rows, a->n_cols, a->ld, a->block);
	else
		kern_act_quant_fp8_sim(a->x, a->n_rows, a->n_cols, a->ld, a->block);
	return ST_OK;
}

enum status kern_moe_row_weight_check(const struct kern_moe_row_weight_args *a)
{
	if (!a || a->max_rows < 0 || !a->n_rows)
		return ST_INVALID;
	if (a->max_rows > 0 && (!a->slot_weight || !a->row_slot || !a->row_weight))
		return ST_INVALID;
	return ST_OK;
}

enum status kern_moe_row_weight_ref(const struct kern_moe_row_weight_args *a)
{
	enum status st = kern_moe_row_weight_check(a);
	if (st)
		return st;
	int64_t n = *a->n_rows;
	if (n < 0 || n > a->max_rows)
		return ST_INVALID;
	for (int64_t r = 0; r < n; r++)
		a->row_weight[r] = a->slot_weight[a->row_slot[r]];
	return ST_OK;
}
