/*
 * model/tokenizer.h: the byte-level BPE tokenizer of DeepSeek-V4, loaded from
 * a Hugging Face tokenizer.json, and its inverse.
 *
 * What it reproduces (HF `tokenizers` 0.23, the reference; tests compare ids):
 *   1. added tokens (special and not) are cut out of the text first, by
 *      leftmost-longest match, in HF's two passes (tokens with normalized=false
 *      first, then normalized=true ones in what is left);
 *   2. the text between them goes through the normalizer (only the empty
 *      Sequence is accepted) and the pre-tokenizer Sequence read from the file:
 *      Split steps whose regexes are compiled with PCRE2 (UTF + UCP + JIT) after
 *      translating the Oniguruma dialect HF uses (\s, \S, \w, \d, \h ...), then
 *      ByteLevel. Categories are Unicode 16.0's, as in HF's Oniguruma: PCRE2
 *      10.42 knows Unicode 14.0, and a generated table (tokenizer_unicode.h)
 *      adds what changed since (see tokenizer_regex.c);
 *   3. each piece is BPE-merged by merge rank, on raw bytes.
 *
 * Invalid UTF-8 input: HF takes a Rust String, so it never sees invalid bytes.
 * encode() replaces every maximal invalid subsequence by U+FFFD first (the
 * Unicode "maximal subpart" rule, the same as Rust's String::from_utf8_lossy
 * and Python's bytes.decode("utf-8", "replace")), so the ids equal HF's ids of
 * the lossily decoded string. decode(encode(s)) == s holds for valid UTF-8.
 *
 * Threads: after model_tokenizer_load() returns, every function here may be
 * called from any number of threads at once on the same tokenizer (the word
 * cache is internally locked). Loading and destroying are not concurrent with
 * anything.
 */
#ifndef DSV4_MODEL_TOKENIZER_H
#define DSV4_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct model_tokenizer;

/* Which added tokens encode() recognises in the text. */
enum model_tok_added {
	/* All added tokens, special or not: HF `encode(text)` (the default). */
	MODEL_TOK_ADDED_ALL = 0,
	/* Only added tokens with special=false (for DeepSeek-V4 these include
	 * <｜User｜>, <｜Assistant｜>, <think>); special ones such as
	 * <｜begin▁of▁sentence｜> are plain text. HF with encode_special_tokens=True. */
	MODEL_TOK_ADDED_NON_SPECIAL = 1,
	/* None: the whole text goes through the pre-tokenizer and BPE (for
	 * untrusted user content that must not inject control tokens). */
	MODEL_TOK_ADDED_NONE = 2,
};

/* Flags of decode() and of the streaming detokenizer (model/detok.h). */
enum model_tok_decode_flags {
	/* Leave out tokens marked special (HF skip_special_tokens=True). */
	MODEL_TOK_DECODE_SKIP_SPECIAL = 1u << 0,
	/* Return the raw bytes; without this flag invalid UTF-8 is replaced by
	 * U+FFFD per maximal subpart, exactly as HF decode() does. */
	MODEL_TOK_DECODE_RAW = 1u << 1,
};

/* Load path, which is either a tokenizer.json or a directory holding one
 * (a model directory). bos/eos come from tokenizer_config.json beside it when
 * present, else from the DeepSeek token names. Takes well under a second.
 * Fails with ST_IO (unreadable), ST_INVALID (malformed), ST_UNSUPPORTED (a
 * model type, normalizer, pre-tokenizer or regex construct not implemented). */
enum status model_tokenizer_load(struct model_tokenizer **out, const char *path,
				 struct err *e) DSV4_WUR;

/* NULL is a no-op. */
void model_tokenizer_destroy(struct model_tokenizer *tok);

/* Encode len bytes of text (need not be NUL-terminated, may hold NULs and
 * invalid UTF-8, see above). Writes at most cap ids to ids (which may be NULL
 * when cap is 0) and sets *n_ids to the number of ids of the whole encoding,
 * whether or not they fit. Returns ST_OK when all fit, ST_NOMEM if not (then
 * call again with cap >= *n_ids) or if memory ran out. */
enum status model_tokenizer_encode(const struct model_tokenizer *tok, const char *text,
				   size_t len, enum model_tok_added added, int32_t *ids,
				   size_t cap, size_t *n_ids, struct err *e) DSV4_WUR;

/* As encode(), into a malloc'd array the caller frees (*ids is NULL when
 * *n_ids is 0). */
enum status model_tokenizer_encode_alloc(const struct model_tokenizer *tok, const char *text,
					 size_t len, enum model_tok_added added, int32_t **ids,
					 size_t *n_ids, struct err *e) DSV4_WUR;

/* Decode n ids (flags: enum model_tok_decode_flags) into a malloc'd,
 * NUL-terminated buffer the caller frees; *len excludes the NUL. An id
 * outside [0, vocab_size) or unassigned is ST_INVALID. */
enum status model_tokenizer_decode(const struct model_tokenizer *tok, const int32_t *ids,
				   size_t n, unsigned flags, char **text, size_t *len,
				   struct err *e) DSV4_WUR;

/* The bytes this id decodes to on its own (raw, maybe not valid UTF-8:
 * one token can hold part of a character), borrowed from the tokenizer and
 * valid until it is destroyed; NULL for an unassigned or out-of-range id. */
const char *model_tokenizer_piece(const struct model_tokenizer *tok, int32_t id,
				  size_t *len);

/* The token's string as tokenizer.json spells it ("Ġthe", "<｜User｜>"),
 * borrowed, NUL-terminated; NULL for an unassigned id. */
const char *model_tokenizer_token_str(const struct model_tokenizer *tok, int32_t id);

/* Id of a token given as tokenizer.json spells it (added tokens first, then
 * the BPE vocabulary, as HF token_to_id): "<｜User｜>" -> 128803.
 * Returns -1 when there is no such token. */
int32_t model_tokenizer_token_to_id(const struct model_tokenizer *tok, const char *token);

/* 1 + the largest id (129280 for DeepSeek-V4). */
int32_t model_tokenizer_vocab_size(const struct model_tokenizer *tok);

/* BOS / EOS ids, -1 when unknown. */
int32_t model_tokenizer_bos_id(const struct model_tokenizer *tok);
int32_t model_tokenizer_eos_id(const struct model_tokenizer *tok);

/* True for added tokens marked special (what SKIP_SPECIAL leaves out). */
bool model_tokenizer_is_special(const struct model_tokenizer *tok, int32_t id);

/* ---- UTF-8 helpers (model/tokenizer_utf8.c), shared with detok.c ---- */

/* Classify the sequence at s[0..n): returns 1 and *seq_len for a complete
 * well-formed character; 0 and *seq_len = the maximal invalid subpart (>= 1
 * byte, becomes one U+FFFD); -1 when s is a proper prefix of a well-formed
 * character cut by the end (*seq_len = n). n must be >= 1. */
int model_utf8_classify(const uint8_t *s, size_t n, size_t *seq_len);

/* Length of the longest well-formed prefix of s. */
size_t model_utf8_valid_prefix(const uint8_t *s, size_t n);

#endif
