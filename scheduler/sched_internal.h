/*
 * scheduler/sched_internal.h: the core's data structures, shared by sched.c
 * (requests, admission, events, stats) and plan.c (step planning and
 * result processing). Not for use outside scheduler/.
 *
 * Unit of scheduling is the sequence. A request with n choices has n child
 * sequences; when n > 1 and its prompt covers at least one full block before
 * the last token, a PARENT sequence first computes those full blocks once
 * (no sampling), then forks: every child takes a reference on the parent's
 * blocks and continues from the boundary with blocks of its own.
 *
 * Invariants:
 *   a waiting sequence holds no blocks;
 *   a running sequence holds ceil(n_target / B) blocks, where n_target is
 *   the number of tokens it will have computed when its pending work is done
 *   (prompt blocks are reserved at admission); a decode (one pending token)
 *   may hold one block less until the next plan allocates it;
 *   n_computed <= n_target <= n_tokens;
 *   in slot mode exactly the running sequences hold an executor state slot,
 *   each its own.
 */
#ifndef DSV4_SCHEDULER_SCHED_INTERNAL_H
#define DSV4_SCHEDULER_SCHED_INTERNAL_H

#include <pthread.h>

#include "scheduler/blocks.h"
#include "scheduler/scheduler.h"
#include "scheduler/stop.h"

enum sched__seq_state { SEQ_WAITING = 1, SEQ_RUNNING, SEQ_DONE };

#define SCHED__PARENT UINT32_MAX /* choice of a parent sequence */

struct sched__req;

struct sched__seq {
	uint64_t seq_id;
	struct sched__req *req;
	uint32_t choice;              /* 0..n-1, or SCHED__PARENT */
	enum sched__seq_state state;
	int32_t *tokens;              /* prompt followed by generated tokens */
	uint32_t n_tokens, cap_tokens;
	uint32_t n_target;            /* see the invariants above */
	uint32_t n_computed;          /* tokens whose state is in the blocks */
	uint32_t *blocks;
	uint32_t n_blocks, cap_blocks;
	struct sched_block_hash *hashes; /* chained hashes of its first n_hashes full blocks */
	uint32_t n_hashes, cap_hashes;
	struct kern_sampling_params sampling; /* the request's, with this choice's seed */
	struct kern_sampling_params sampling_min; /* the same with eos / stop ids masked (min_tokens) */
	struct gram_state *gs;        /* structured outputs: this choice's grammar state, or NULL */
	uint32_t *gmask;              /* its allowed-token mask (executor vocab bits) */
	struct kern_sampling_params sampling_g; /* sampling or sampling_min with allow_mask = gmask */
	struct sched_stop stop;
	uint32_t slot;                /* slot mode: executor state slot while running, else SCHED_BLOCK_NONE;
					 block mode: EXEC_NO_SLOT while running */
	bool slot_fresh;              /* the executor must restore the slot at its next step */
	uint32_t sched_tokens;        /* tokens scheduled in the step being planned */
	bool sched_sample;
	/* speculative decoding (docs/speculation.md): the executor's drafts for
	 * the tokens after the last one, and how many of them this step verifies
	 * (they are the last sched_draft of its sched_tokens) */
	int32_t drafts[EXEC_SPEC_MAX_DRAFT];
	uint32_t n_drafts;
	uint32_t sched_draft;
};

struct sched__req {
	uint64_t id;
	struct sched__req *prev, *next; /* list of live requests */
	int32_t *prompt;
	uint32_t n_prompt;
	struct kern_sampling_params sampling;
	struct kern_logit_bias *bias;
	uint32_t max_tokens;          /* resolved: never 0 */
	uint32_t min_tokens;
	struct kern_logit_bias *bias_min; /* bias + a -inf entry per masked id, while below min_tokens */
	bool ignore_eos;
	int32_t *stop_ids;
	uint32_t n_stop_ids;
	struct sched_stop_set stops;
	bool include_stop_str;
	bool keep_special;
	uint32_t n;
	struct sched__seq *parent;    /* NULL once forked or when not used */
	struct sched__seq **seqs;     /* [n]; NULL entries until created (fork) */
	uint32_t n_unfinished;        /* choices that have not had their FINISH event */
	bool *finished;               /* [n] */
	int32_t priority;
	uint64_t order;               /* arrival order */
	uint64_t salt;
	double deadline_s;
	struct sched_timing timing;
	struct gram *grammar;         /* retained; NULL = unconstrained */
	const struct gram_vocab *gvocab;
	uint32_t n_cached_tokens;
	bool looked_up;               /* first prefix lookup done (n_cached_tokens fixed) */
	struct exec_prompt_lp *plp;   /* prompt logprobs being computed (one allocation), NULL when not asked
					 or once handed to its event */
	uint32_t plp_rows;            /* rows 0..plp_rows-1 scored: prefix hits may cover no more */
	bool score_only;
	uint64_t stats_epoch;         /* counted as running by sched__publish_stats pass stats_epoch */
	sched_event_fn on_event;
	void *user;
};

struct sched {
	struct sched_options opt;     /* resolved: no zeros */
	struct exec *ex;
	uint32_t B;                   /* block tokens */
	struct sched_blocks bm;

	struct sched__req *reqs_head; /* every live request */
	uint32_t n_reqs;
	uint32_t n_unscheduled_reqs;  /* live requests never scheduled (first_scheduled_s == 0): the queue limit */
	double next_deadline_s;       /* no live deadline before this (0 = none): deadline scans skip until then */
	uint64_t stats_epoch;         /* per-step counters touch only running sequences, never the request list */
	uint64_t next_req_id, next_seq_id, next_order;
	uint64_t seed_state;          /* draws seeds for requests without one */

	struct sched__seq **running;  /* admission order: oldest first */
	uint32_t n_running, cap_running;
	struct sched__seq **waiting;  /* sorted by (priority, order, choice) */
	uint32_t n_waiting, cap_waiting;
	uint32_t *free_slots;         /* stack of unused executor state slots */
	uint32_t n_free_slots, n_slots;

	/* Step buffers, sized at create. */
	int32_t *step_tokens, *step_positions;
	struct exec_seq *step_seqs;
	struct sched__seq **step_seq_ptr;
	uint32_t *step_query_start;
	uint32_t *step_block_ids;
	uint32_t cap_block_ids;
	struct exec_sample *step_samples;

	struct sched_stats st;        /* owned by the step thread */
	pthread_mutex_t pub_mu;       /* guards pub */
	struct sched_stats pub;
};

/* sched.c */
void sched__emit(struct sched *s, struct sched__req *r, struct sched_event *ev);
struct sched__seq *sched__seq_new(struct sched *s, struct sched__req *r, uint32_t choice, uint32_t n_target);
void sched__seq_free(struct sched__seq *q);
bool sched__running_append(struct sched *s, struct sched__seq *q);
void sched__check_deadlines(struct sched *s, double now);
void sched__finish_seq(struct sched *s, struct sched__seq *q, enum sched_finish_reason r, int32_t stop_tok,
		       int32_t stop_str, double now);
void sched__release_blocks(struct sched *s, struct sched__seq *q);
bool sched__waiting_insert(struct sched *s, struct sched__seq *q);
void sched__running_remove(struct sched *s, struct sched__seq *q);
void sched__publish_stats(struct sched *s);
void sched__req_maybe_free(struct sched *s, struct sched__req *r);
bool sched__seq_reserve_hashes(struct sched__seq *q, uint32_t n);
bool sched__seq_push_token(struct sched__seq *q, int32_t tok);

/* plan.c */
void sched__preempt(struct sched *s, struct sched__seq *q);

#endif
