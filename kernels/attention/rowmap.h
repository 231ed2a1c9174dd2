/*
 * kernels/attention/rowmap.h: where entry w of sequence s lives in a pool of
 * rows (compressed KV entries, indexer keys), shared by the compressor, the
 * indexer and the attention index builder so they agree on one layout.
 *
 * Contiguous (block_table NULL): row = row0[s] + w.
 * Paged (the block manager's fixed token spans, design.md "state per
 * sequence"): a block of B tokens holds per_block = B / ratio entries of a
 * layer; row = block_table[s·bt_stride + w / per_block]·per_block + w % per_block.
 */
#ifndef DSV4_KERNELS_ATTENTION_ROWMAP_H
#define DSV4_KERNELS_ATTENTION_ROWMAP_H

#include <stdbool.h>
#include <stdint.h>

struct kern_rowmap_paged {
	const int32_t *block_table; /* [n_seqs, bt_stride] block ids, or NULL: contiguous rows (row0) */
	int bt_stride;              /* table entries per sequence */
	int per_block;              /* entries per block (> 0 when paged) */
};

/* Row of entry w of sequence s, or -1 when the paged table cannot hold it
 * (w beyond the table, a negative block id). */
static inline int64_t kern_rowmap_row(const int64_t *row0, const struct kern_rowmap_paged *pg, int s, int64_t w)
{
	if (!pg->block_table)
		return row0 && row0[s] >= 0 ? row0[s] + w : -1;
	if (pg->per_block <= 0 || w < 0 || w / pg->per_block >= pg->bt_stride)
		return -1;
	int32_t blk = pg->block_table[(int64_t)s * pg->bt_stride + w / pg->per_block];
	return blk < 0 ? -1 : (int64_t)blk * pg->per_block + w % pg->per_block;
}

#endif
