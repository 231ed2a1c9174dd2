/*
 * model/tokenizer_internal.h: the tokenizer's private layout, shared by
 * tokenizer.c (loading, lookups, decode), tokenizer_encode.c (added tokens,
 * pre-tokenizer, BPE, word cache) and tokenizer_regex.c (HF regex dialect ->
 * PCRE2). Nothing outside model/tokenizer*.c includes it.
 */
#ifndef DSV4_MODEL_TOKENIZER_INTERNAL_H
#define DSV4_MODEL_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

#include "tokenizer.h"

/* Limits of the loader (what a tokenizer.json may declare). */
#define TOK_MAX_STEPS 8          /* pre-tokenizer steps */
#define TOK_MAX_ID (1 << 24)     /* ids above are refused as malformed */
#define TOK_CACHE_MAX_WORD_BYTES 64 /* longer pieces are not cached */

/* ---- pre-tokenizer ---- */

enum tok__behavior {
	TOK_SPLIT_ISOLATED,
	TOK_SPLIT_REMOVED,
	TOK_SPLIT_MERGED_WITH_PREVIOUS,
	TOK_SPLIT_MERGED_WITH_NEXT,
	TOK_SPLIT_CONTIGUOUS,
};

struct tok__step {
	pcre2_code *re;            /* owned; JIT-compiled when the JIT is available */
	enum tok__behavior behavior;
	bool invert;
	bool jit;                  /* JIT-compiled: matched with pcre2_jit_match */
};

/* Translate a pattern in HF's regex dialect (Oniguruma, Unicode mode) into an
 * equivalent PCRE2 pattern (UTF + UCP) and compile it, JIT included.
 * literal: the pattern is a plain string (SplitPattern::String) to match as is. */
enum status tok__regex_compile(const char *pattern, bool literal, pcre2_code **out, bool *jit,
			       struct err *e) DSV4_WUR;

/* Translation only (exposed for tests): writes a NUL-terminated PCRE2 pattern
 * into out (cap bytes). */
enum status tok__regex_translate(const char *pattern, bool literal, char *out, size_t cap,
				 struct err *e) DSV4_WUR;

/* ---- added tokens: a byte trie for leftmost-longest matching ---- */

struct tok__trie_node {
	uint32_t first_child; /* 0: none (node 0 is the root, never a child) */
	uint32_t next_sibling;
	int32_t token;        /* index into tok->added, -1 when not a token end */
	uint8_t byte;
};

struct tok__trie {
	struct tok__trie_node *nodes;
	uint32_t n_nodes, cap_nodes;
	uint8_t first_byte[256]; /* 1 when some token starts with that byte */
};

struct tok__added {
	int32_t id;
	uint32_t content_off, content_len; /* into tok->strs */
	bool special;
	bool normalized;
};

/* ---- the BPE word cache: sharded, each shard under its own mutex ---- */

#define TOK_CACHE_SHARDS 32
#define TOK_CACHE_SLOTS 4096     /* per shard, power of two */
#define TOK_CACHE_ARENA_BYTES (256 * 1024) /* per shard: keys and ids */

struct tok__cache_slot {
	uint32_t hash;     /* 0: empty */
	uint32_t off;      /* into arena: key bytes, then ids (aligned to 4) */
	uint16_t key_len;
	uint16_t n_ids;
};

struct tok__cache_shard {
	pthread_mutex_t mu;
	uint32_t n_used;       /* slots in use */
	uint32_t arena_used;   /* bytes */
	struct tok__cache_slot slots[TOK_CACHE_SLOTS];
	uint8_t arena[TOK_CACHE_ARENA_BYTES];
};

/* ---- merges: open addressing on (left id, right id) ---- */

struct tok__merge {
	uint64_t key;   /* (left << 32) | right; UINT64_MAX: empty */
	uint32_t rank;
	int32_t new_id;
};

struct model_tokenizer {
	int32_t vocab_size;   /* 1 + largest id */
	int32_t bos_id, eos_id;

	/* Per id: the token string (NUL-terminated, in strs) and the decoded
	 * piece (raw bytes, in pieces). str_off[id] == UINT32_MAX: unassigned. */
	uint32_t *str_off;
	uint32_t *piece_off, *piece_len;
	uint8_t *id_flags;    /* TOK_ID_* */
	char *strs;
	size_t strs_len, strs_cap;
	char *pieces;
	size_t pieces_len;

	/* token string -> id (added tokens shadow the vocabulary) */
	int32_t *str_map;     /* slots hold ids, -1 empty */
	uint32_t *str_map_hash; /* high hash bits per slot, to skip most compares */
	size_t str_map_mask;

	/* BPE */
	int32_t byte_id[256]; /* id of the one-byte token of each byte */
	struct tok__merge *merges;
	size_t merges_mask;

	/* pre-tokenizer: Split steps in order (ByteLevel is the implicit last one) */
	struct tok__step steps[TOK_MAX_STEPS];
	int n_steps;

	/* added tokens; trie_raw holds normalized=false ones, trie_norm the others */
	struct tok__added *added;
	size_t n_added;
	struct tok__trie trie_raw, trie_norm;

	struct tok__cache_shard *cache; /* TOK_CACHE_SHARDS of them, NULL: no cache */
};

#define TOK_ID_ASSIGNED 1u
#define TOK_ID_ADDED 2u
#define TOK_ID_SPECIAL 4u

static inline uint64_t tok__hash_bytes(const void *p, size_t n)
{
	/* FNV-1a, 64-bit, finished with a multiply-xorshift to spread the bits. */
	const uint8_t *s = p;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ s[i]) * 1099511628211ull;
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return h;
}

static inline uint64_t tok__hash_u64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* Merge lookup: returns the entry or NULL. */
static inline const struct tok__merge *tok__merge_find(const struct model_tokenizer *tok,
						       int32_t left, int32_t right)
{
	uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
	size_t i = tok__hash_u64(key) & tok->merges_mask;
	for (;;) {
		const struct tok__merge *m = &tok->merges[i];
		if (m->key == key)
			return m;
		if (m->key == UINT64_MAX)
			return NULL;
		i = (i + 1) & tok->merges_mask;
	}
}

#endif
