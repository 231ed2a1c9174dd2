/*
 * model/gram_internal.h: the grammar representation shared by the compiler
 * (gram_compile.c) and the automaton (gram.c). Not a public interface.
 *
 * A grammar is an array of nodes referring to each other by index (cycles
 * allowed: recursion through $ref and free JSON). Terminals consume bytes
 * with a small per-node sub-state; nonterminals only arrange terminals.
 */
#ifndef DSV4_MODEL_GRAM_INTERNAL_H
#define DSV4_MODEL_GRAM_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "model/gram.h"

enum gram__kind {
	GRAM__EMPTY = 0, /* matches nothing (epsilon) */
	GRAM__LIT,       /* bytes[a .. a+b) exactly; sub = offset */
	GRAM__SEQ,       /* kids[a .. a+b) in order; sub = next kid */
	GRAM__ALT,       /* one of kids[a .. a+b) */
	GRAM__STAR,      /* kid a repeated lo..hi times (hi UINT32_MAX = unbounded); sub = count */
	GRAM__REF,       /* node a (set once the target is compiled) */
	GRAM__STR,       /* JSON string body (no quotes) not containing bytes[a .. a+b) (b = 0: any);
			    sub: string state (gram.c str_step) | excluded bytes matched << 8 */
	GRAM__NUM,       /* JSON number; lo = 1: integer only; sub = state | bytes << 4 */
	GRAM__RAW,       /* any bytes not containing bytes[a .. a+b) (b = 0: no restriction); sub = matched */
	GRAM__WS,        /* 0..GRAM_MAX_WS of space, \t, \n, \r; sub = count */
};

struct gram__node {
	uint8_t kind;
	uint32_t a, b;
	uint32_t lo, hi;
};

struct gram {
	atomic_int refs;
	struct gram__node *nodes;
	uint32_t n_nodes, cap_nodes;
	uint32_t *kids;
	uint32_t n_kids, cap_kids;
	uint8_t *bytes;
	uint32_t n_bytes, cap_bytes;
	uint32_t root;
};

/* builder (gram_compile.c); each returns the new node's index or UINT32_MAX
 * when a bound or memory ran out */
#define GRAM__NONE UINT32_MAX

#endif
