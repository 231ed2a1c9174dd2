/*
 * scheduler/stop.h: stop strings matched across token boundaries (internal).
 *
 * Generated text arrives one token's bytes at a time. The matcher releases
 * bytes only when they can no longer be part of a stop string: it holds back
 * the longest suffix that is a proper prefix of some stop string. The bytes
 * pass first through the sequence's streaming detokenizer (model/detok.h,
 * raw mode: the tree's one UTF-8 hold-back), so the matcher and the server
 * see whole characters only and never the start of a stop string they must
 * not emit.
 */
#ifndef DSV4_SCHEDULER_STOP_H
#define DSV4_SCHEDULER_STOP_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

struct sched_stop_set {
	char **strs;    /* n owned copies */
	uint32_t *lens; /* bytes of each */
	uint32_t n;
};

struct model_detok;
struct sched_stop {
	struct model_detok *detok; /* created at the first feed */
	char *pending; /* bytes not yet released */
	uint32_t n_pending, cap;
};

/* Feed n bytes. Released bytes are appended to *out (heap, grown; *out_n
 * updated). final: no more bytes will come (release everything left).
 * Returns the index of the stop string that matched, or -1. The first feed
 * that completes an occurrence of any stop string ends the text; among the
 * occurrences complete at that point the earliest start wins (lower index on
 * ties), and the text from that start on is dropped. ST_NOMEM is reported
 * via *nomem. */
int32_t sched_stop_feed(struct sched_stop *m, const struct sched_stop_set *set, const char *bytes, uint32_t n,
			bool final, char **out, uint32_t *out_n, bool *nomem);
void sched_stop_fini(struct sched_stop *m);

#endif
