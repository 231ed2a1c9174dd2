/*
 * server/openai_job.h: the per-request job's state, shared by the two files
 * of the OpenAI job (inside server/, not a public header):
 *   openai_job.c         the job's life: submission to the scheduler, the
 *                        wake slot, the HTTP stream callbacks, freeing.
 *   openai_job_events.c  what the job says: scheduler events through the
 *                        output parser into OpenAI chunks, a whole JSON
 *                        body or another API's format, and the metrics of
 *                        each prompt.
 *
 * A job has one sub per prompt (its scheduler stream) and n choices per
 * prompt; choice i belongs to sub i / (n_choices / n_subs). Everything here
 * is touched under the job's mu, except slot / slot_index (the server's
 * wake_mu).
 */
#ifndef DSV4_SERVER_OPENAI_JOB_H
#define DSV4_SERVER_OPENAI_JOB_H

#include "server/openai_internal.h"
#include "server/openai_format.h"

struct model_oparse_event;

struct tool_acc {
	char id[40];
	char *name;
	struct strbuf args;
};

struct choice {
	struct oai_job *job;
	uint32_t index;
	struct model_oparse *parser;  /* chat only */
	struct strbuf content, reasoning; /* accumulated (non-stream) */
	struct tool_acc *tools;
	size_t n_tools, cap_tools;
	bool cut_tool_call; /* the output ended inside a tool-call block (max_tokens): "length", not "tool_calls" */
	struct strbuf lp;             /* chat: pending logprob entries, comma-joined */
	uint32_t n_lp;
	struct oai_compl_logprobs clp;
	size_t text_bytes;            /* completion text so far (text_offset) */
	uint32_t n_tokens;
	double last_token_s;
	bool finished;
	const char *finish_reason;
};

struct sub {
	struct sched_stream *ss;
	uint64_t rid;
	uint32_t first_choice, n_finished;
	uint32_t n_prompt, n_cached;
	bool counted;
	char *echo;                   /* prompt text to echo, or NULL */
	size_t echo_len;
	int32_t *prompt;              /* prompt logprobs asked: the prompt ids (n_prompt) */
	struct exec_prompt_lp *plp;   /* from the PROMPT_LOGPROBS event (owned) */
	size_t echo_lp_bytes;         /* echo + logprobs: text_offset after the prompt's tokens */
};

struct oai_job {
	struct oai_server *srv;
	pthread_mutex_t mu;
	struct wake_slot *slot;
	int32_t slot_index;
	enum oai_kind kind;
	bool stream, logprobs, include_reasoning;
	uint32_t top_logprobs;
	bool echo_lp;                 /* completions echo + logprobs: the prompt's tokens lead the logprobs */
	bool prompt_logprobs;         /* vLLM's prompt_logprobs in the answer */
	char id[48];
	struct oai_head head;
	struct sub *subs;
	uint32_t n_subs;
	struct choice *choices;
	uint32_t n_choices, n_finished;
	struct strbuf out;
	size_t out_off;
	bool finalized;
	bool error;
	char error_msg[256];
	double last_write_s, t_arrival;
	struct oai_usage usage;
	const struct oai_job_format *fmt; /* another API's shapes (openai_internal.h), or NULL */
	void *fmt_ctx;
	char request_id[128];         /* for the access log line (api_access_log) */
	const char *route;
	double t_first_token;         /* monotonic; 0 = none yet */
};

/* ---- openai_job_events.c ---- */

/* Output parser callback (model_oparse_options.emit; user is a struct
 * choice): one reasoning / content / tool event. */
void oai__job_on_parse(void *user, const struct model_oparse_event *ev);
/* Move every available event of the job's streams into j->out, and the
 * closing bytes once every choice has finished. Under j->mu. */
void oai__job_pump(struct oai_job *j);
/* Count sb's request in the metrics once (reason: the finish reason). */
void oai__job_record_metrics(struct oai_job *j, struct sub *sb, const struct sched_event *ev, const char *reason);

#endif
