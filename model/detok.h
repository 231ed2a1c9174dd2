/*
 * model/detok.h: the streaming detokenizer, one per generated sequence.
 *
 * Feed token ids as they are sampled; each call returns the bytes that are
 * now complete UTF-8. A character split across tokens is held back until its
 * last byte arrives; bytes that can no longer form a character are released at
 * once, as U+FFFD per maximal invalid subpart (default) or as they are
 * (MODEL_TOK_DECODE_RAW). flush() releases what is held at the end. The
 * concatenation of all deltas, flush included, equals
 * model_tokenizer_decode() of all ids with the same flags, byte for byte.
 *
 * Threads: a detokenizer belongs to one sequence and is not shared; many may
 * run at once on one tokenizer (which they borrow, read-only).
 */
#ifndef DSV4_MODEL_DETOK_H
#define DSV4_MODEL_DETOK_H

#include "tokenizer.h"

struct model_detok;

struct model_detok_options {
	const struct model_tokenizer *tok; /* borrowed; must outlive the detokenizer; NULL: bytes only */
	unsigned flags;                    /* enum model_tok_decode_flags */
};

enum status model_detok_create(struct model_detok **out, const struct model_detok_options *opt,
			       struct err *e) DSV4_WUR;

/* NULL is a no-op. */
void model_detok_destroy(struct model_detok *d);

/* Forget held bytes, for reuse on a new sequence. */
void model_detok_reset(struct model_detok *d);

/* Feed n ids. *delta (borrowed, valid until the next call on d) gets the newly
 * complete bytes, *delta_len their count (often 0). An id that is not a token
 * is ST_INVALID and consumes nothing of this call. */
enum status model_detok_feed(struct model_detok *d, const int32_t *ids, size_t n,
			     const char **delta, size_t *delta_len, struct err *e) DSV4_WUR;

/* The same hold-back over raw bytes (the pieces of tokens looked up by the
 * caller, e.g. with model_detok_piece): the scheduler's path, which needs
 * no tokenizer of its own. */
enum status model_detok_feed_bytes(struct model_detok *d, const char *bytes, size_t n, const char **delta,
				   size_t *delta_len, struct err *e) DSV4_WUR;

/* The raw bytes of token_id into buf (at most cap; returns the count); a
 * special token (bos, eos, pad, placeholders) gives none unless
 * keep_special (vLLM's skip_special_tokens: false). ctx: const struct
 * model_tokenizer *. The scheduler's sched_detok_fn. */
uint32_t model_detok_piece(void *ctx, int32_t token_id, bool keep_special, char *buf, uint32_t cap);

/* End of sequence: the held incomplete bytes (one U+FFFD, or raw). */
enum status model_detok_flush(struct model_detok *d, const char **delta, size_t *delta_len,
			      struct err *e) DSV4_WUR;

/* Bytes held back now (0..3). */
size_t model_detok_pending_bytes(const struct model_detok *d);

#endif
