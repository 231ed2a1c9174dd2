/*
 * model/exec_cpu.c: the CPU executor (model/exec_cpu.h): load-time set-up
 * (weights and plan, block pool, forward buffers), the exec vtable's step
 * (forward, logits of each sampling sequence's last token, kern_sample_ref),
 * and the test / speculative-decoding entry points.
 */
#include "model/exec_cpu.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/device/ctx.h"
#endif
#include "kernels/device/graph.h"
#include "model/forward.h"
#include "model/state.h"
#include "model/weights.h"

struct model_exec_cpu {
	struct exec ex;
	struct kern_mem mem;    /* host, or the device of opt->dev */
	void *kctx;             /* struct kern_ctx * of a GPU executor: its stream and kernel scratch */
	struct kern_graph *graph; /* CUDA graphs of decode steps, or NULL (eager) */
	struct model_weights w;
	struct model_state st;
	struct model_fwd *fwd;
	float *logits;          /* [max_step_seqs, vocab] in mem */
	float *logits_host;     /* device executor: the sampled rows on the host (fallback path) */
	uint32_t *rows;         /* [max_step_seqs] */
	void *sample_work;      /* host scratch of kern_sample_ref */
	void *sample_dev;       /* the sample op's scratch in mem */
	size_t sample_dev_bytes, sample_aux_cap;
	struct kern_sampling_params *sp; /* [max_step_seqs] this step's rows for the sample op */
	struct kern_sample_history *sh;
	uint64_t *sc;
	struct kern_sample_out *so;
	int32_t *lp_target;     /* [max_step_seqs] prompt logprobs: the scored token of each row */
	void *lp_dev;           /* the token_logprobs op's scratch in mem (device executor) */
	size_t lp_dev_bytes;
	uint32_t vocab, max_seqs;
	int rank;
	bool weights_loaded;
};

/* Prompt log-probabilities (model/exec.h): the head over the scored rows of
 * each asking sequence, max_seqs rows at a time through the logits buffer,
 * then op token_logprobs on them; entries are contiguous (positions are).
 * A failing op (rank 0 only) is reported through op_e after the step's
 * remaining heads have run: under tensor parallelism every rank must make
 * the same head calls (their collectives), so rank 0 never stops early. */
static enum status prompt_logprobs(struct model_exec_cpu *x, const struct exec_step *step, struct err *op_e,
				   struct err *e)
{
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		struct exec_prompt_lp *lp = sq->prompt_lp;
		if (!lp)
			continue;
		if (!sq->prompt_ids)
			return err_set(e, ST_INVALID, "sequence %u: prompt logprobs without the prompt", s);
		uint32_t q0 = step->query_start[s], q1 = step->query_start[s + 1];
		while (q0 < q1 && (uint32_t)step->positions[q0] + 1 >= sq->n_prompt)
			q0++; /* never true for a prefill chunk; keeps the rule general */
		uint32_t end = q0;
		while (end < q1 && (uint32_t)step->positions[end] + 1 < sq->n_prompt)
			end++;
		for (uint32_t i = q0; i < end; i += x->max_seqs) {
			uint32_t k = end - i < x->max_seqs ? end - i : x->max_seqs;
			uint32_t p0 = (uint32_t)step->positions[i] + 1; /* first entry of the chunk */
			for (uint32_t j = 0; j < k; j++) {
				x->rows[j] = i + j;
				x->lp_target[j] = sq->prompt_ids[p0 + j];
			}
			enum status st = model_fwd_logits(x->fwd, model_fwd_streams(x->fwd), x->rows, k, x->logits, e);
			if (st)
				return st;
			if (x->rank || !lp->logprob || op_e->st)
				continue; /* a worker rank: the head's collectives only */
			struct kern_token_logprobs_args a = {
				.logits = x->logits, .ld = x->vocab, .vocab = x->vocab, .n_rows = k,
				.target = x->lp_target, .n_top = lp->n_top, .logprob = lp->logprob + p0,
				.rank = lp->rank + p0,
				.top_ids = lp->n_top ? lp->top_ids + (size_t)p0 * lp->n_top : NULL,
				.top_logprobs = lp->n_top ? lp->top_logprobs + (size_t)p0 * lp->n_top : NULL,
				.work = x->lp_dev, .work_bytes = x->lp_dev_bytes, .stream = x->mem.stream};
			if ((st = x->w.gops.token_logprobs(&a)))
				err_set(op_e, st, "prompt logprobs of sequence %u, positions %u..%u", s, p0, p0 + k - 1);
		}
	}
	return ST_OK;
}

static enum status sample_step(struct model_exec_cpu *x, const struct exec_step *step, struct exec_sample *out,
			       struct err *e);
/* ---- hardening: a checkpoint shard truncated while serving ----
 * The weights are read through the file mapping; a shard truncated under it
 * raises SIGBUS on the next access, which killed the process. The step (and
 * a TP rank's forward) runs with a thread-local jump target: the handler
 * returns there and the step fails with ST_IO (the engine then answers 503
 * and exits non-zero, as for any executor failure). A SIGBUS anywhere else
 * goes to the previous handler. */
static _Thread_local sigjmp_buf *exec_cpu__bus_jmp;
static struct sigaction exec_cpu__old_bus;
static pthread_once_t exec_cpu__bus_once = PTHREAD_ONCE_INIT;

static void exec_cpu__on_sigbus(int sig, siginfo_t *si, void *uc)
{
	if (exec_cpu__bus_jmp)
		siglongjmp(*exec_cpu__bus_jmp, 1);
	/* not ours: the previous disposition, then the fault repeats under it */
	sigaction(SIGBUS, &exec_cpu__old_bus, NULL);
	if (exec_cpu__old_bus.sa_flags & SA_SIGINFO && exec_cpu__old_bus.sa_sigaction)
		exec_cpu__old_bus.sa_sigaction(sig, si, uc);
}

static void exec_cpu__install_bus(void)
{
	struct sigaction sa = {0};
	sa.sa_sigaction = exec_cpu__on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	(void)sigaction(SIGBUS, &sa, &exec_cpu__old_bus);
}

#define EXEC_CPU_BUS_MSG                                                                                   \
	"cpu executor: SIGBUS reading the weights: a checkpoint file was truncated or replaced while being "   \
	"served (never modify a served checkpoint); restart the server"

static enum status cpu_step_run(void *ctx, const struct exec_step *step, struct exec_sample *out, struct err *e);

static enum status cpu_step(void *ctx, const struct exec_step *step, struct exec_sample *out, struct err *e)
{
	sigjmp_buf jb;
	if (sigsetjmp(jb, 1)) {
		exec_cpu__bus_jmp = NULL;
		log_msg(LOG_ERROR, "exec", "%s", EXEC_CPU_BUS_MSG);
		return err_set(e, ST_IO, "%s", EXEC_CPU_BUS_MSG);
	}
	exec_cpu__bus_jmp = &jb;
	enum status st = cpu_step_run(ctx, step, out, e);
	exec_cpu__bus_jmp = NULL;
	return st;
}

static enum status cpu_step_run(void *ctx, const struct exec_step *step, struct exec_sample *out, struct err *e)
{
	struct model_exec_cpu *x = ctx;
	struct err lp_e = {0};
	enum status st = model_fwd_run(x->fwd, step, e);
	if (st || (st = prompt_logprobs(x, step, &lp_e, e)))
		return st;
	if ((st = sample_step(x, step, out, e)))
		return st;
	if (lp_e.st)
		return err_set(e, lp_e.st, "%s", lp_e.msg);
	return ST_OK;
}

/* The sampling half of a step: the head on each sampling sequence's last
 * row, then the sample op (or the host fallback). */
static enum status sample_step(struct model_exec_cpu *x, const struct exec_step *step, struct exec_sample *out,
			       struct err *e)
{
	enum status st;
	uint32_t n = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++)
		if (step->seqs[s].sample) {
			if (step->query_start[s + 1] == step->query_start[s])
				return err_set(e, ST_INVALID, "sequence %u samples with no token in the step", s);
			x->rows[n++] = step->query_start[s + 1] - 1;
		}
	if (n != step->n_sample)
		return err_set(e, ST_INVALID, "step says %u samples, %u sequences sample", step->n_sample, n);
	if (!n)
		return kern_mem_sync(&x->mem, e);
	if ((st = model_fwd_logits(x->fwd, model_fwd_streams(x->fwd), x->rows, n, x->logits, e)))
		return st;
	if (x->rank)
		return kern_mem_sync(&x->mem, e); /* rank 0 samples (design.md "Tensor parallelism") */
	/* the plan's sample op over the rows, where the logits are; the token
	 * histories go along only for rows with a penalty (nothing else reads them) */
	uint32_t k = 0;
	bool masked = false; /* structured outputs: only the reference applies allow_mask, so a device
				step with a masked row samples on the host (below) */
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		if (!sq->sample)
			continue;
		const struct kern_sampling_params *p = sq->sampling;
		masked |= p->allow_mask != NULL;
		bool pen = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
		x->sp[k] = *p;
		x->sh[k] = pen ? (struct kern_sample_history){.prompt_ids = sq->prompt_ids, .n_prompt = sq->n_prompt,
							      .output_ids = sq->output_ids, .n_output = sq->n_output}
			       : (struct kern_sample_history){0};
		x->sc[k] = sq->n_output;
		out[k].seq_index = s;
		k++;
	}
	struct kern_sample_batch_args sa = {.logits = x->logits, .ld = x->vocab, .vocab = x->vocab, .n_rows = n,
					    .params = x->sp, .hist = x->sh, .counter = x->sc, .out = x->so,
					    .work = x->mem.device ? x->sample_dev : x->sample_work,
					    .work_bytes = x->mem.device ? x->sample_dev_bytes
									: kern_sample_workspace_bytes(x->vocab),
					    .stream = x->mem.stream};
	if (!x->mem.device || (!masked && kern_sample_batch_aux_count(x->sp, x->sh, n) <= x->sample_aux_cap)) {
		if ((st = x->w.gops.sample(&sa)))
			return err_set(e, st, "sampling %u sequences", n);
		for (uint32_t i = 0; i < n; i++)
			out[i].out = x->so[i];
		return ST_OK;
	}
	/* a device step whose biases and penalty histories exceed the sample
	 * op's scratch, or with a masked row: the rows to the host and the reference */
	const float *lg = x->logits;
	if (x->mem.device) {
		/* the sampled rows only; download synchronises the step */
		if ((st = kern_mem_download(&x->mem, x->logits_host, x->logits, (size_t)n * x->vocab * sizeof(float), e)))
			return st;
		lg = x->logits_host;
	}
	k = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		if (!sq->sample)
			continue;
		struct kern_sample_history h = {.prompt_ids = sq->prompt_ids, .n_prompt = sq->n_prompt,
						.output_ids = sq->output_ids, .n_output = sq->n_output};
		out[k].seq_index = s;
		st = kern_sample_ref(lg + (size_t)k * x->vocab, x->vocab, sq->sampling, &h, sq->n_output,
				     x->sample_work, &out[k].out);
		if (st)
			return err_set(e, st, "sampling sequence %u", s);
		k++;
	}
	return ST_OK;
}

static const struct exec_ops cpu_ops = {.step = cpu_step, .seq_release = NULL};

static uint32_t default_block_tokens(const struct model_config *cfg, uint32_t want)
{
	uint32_t B = want ? want : 256;
	if (!want) {
		if (B < (uint32_t)cfg->sliding_window)
			B = (uint32_t)cfg->sliding_window;
		for (int iter = 0; iter < 64; iter++) {
			bool ok = true;
			for (int l = 0; l < cfg->n_layers_total; l++) {
				uint32_t m = (uint32_t)cfg->compress_ratios[l];
				if (m && B % m) {
					B = (B / m + 1) * m;
					ok = false;
				}
			}
			if (ok)
				break;
		}
	}
	return B;
}

enum status model_exec_device(const char *want, struct kern_device *dev, struct err *e)
{
	kern_device_cpu(dev);
	if (!want || !strcmp(want, "cpu"))
		return ST_OK;
	bool need = !strcmp(want, "cuda");
	if (!need && strcmp(want, "auto"))
		return err_set(e, ST_INVALID, "device '%s': expected auto, cuda or cpu", want);
	struct err de = {0};
	enum status st = ST_OK;
	if (kern_device_count() < 1)
		st = err_set(&de, ST_NOTFOUND, "no CUDA device is visible%s",
			     kern_compiled_targets() ? "" : " (this binary was built without CUDA)");
	else if (!(st = kern_device_detect(0, dev, &de)) && dev->cc_major < 8)
		st = err_set(&de, ST_UNSUPPORTED, "GPU 0 (%s) has compute capability %d.%d; dsv4 needs 8.0 or later",
			     dev->name, dev->cc_major, dev->cc_minor);
	if (st) {
		kern_device_cpu(dev);
		if (need)
			return err_set(e, st, "--device cuda: %s", de.msg);
		log_msg(LOG_INFO, "model", "device: the CPU (%s)", de.msg);
		return ST_OK;
	}
	log_msg(LOG_INFO, "model", "device: GPU 0, %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free)",
		dev->name, dev->cc_major, dev->cc_minor, dev->sm_count, (double)dev->mem_bytes / (1u << 30),
		(double)dev->free_bytes / (1u << 30));
	return ST_OK;
}

/* The KV pool of a GPU executor given no block count: vLLM's
 * --gpu-memory-utilization, a fraction of the device's total memory for
 * this process, after the weights and the activations of a full step.
 * Sets *nb and caps *max_len to what the pool holds. */
static enum status gpu_kv_blocks(struct model_exec_cpu *x, const struct model_exec_cpu_options *opt,
				 const struct model_config *cfg, uint32_t T, uint32_t S, uint32_t B, uint32_t *nb,
				 uint64_t *max_len, struct err *e)
{
	struct exec_layer_mix mix;
	model_state_mix(&x->w, &mix);
	uint64_t fr, tot;
	kern_mem_info(&x->mem, &fr, &tot);
	double util = opt->gpu_memory_utilization > 0 ? opt->gpu_memory_utilization : 0.9;
	uint64_t ctx_max = opt->max_model_len ? opt->max_model_len : (uint64_t)cfg->max_position_embeddings;
	uint64_t act = model_fwd_estimate_bytes(&x->w, T, S, (uint32_t)(ctx_max < UINT32_MAX ? ctx_max : UINT32_MAX));
	/* what the device held before this process loaded anything (other
	 * processes, the context) is not ours; ranks sharing the GPU split
	 * the rest, each paying its own weights and activations */
	uint64_t before = opt->dev->free_bytes ? tot - opt->dev->free_bytes : tot - fr;
	int share = opt->device_share > 1 ? opt->device_share : 1;
	double budget = (util * (double)tot - (double)before) / share - (double)x->w.device_bytes - (double)act;
	uint64_t per = exec_block_bytes(&mix, B, false);
	uint32_t fit = budget > 0 ? (uint32_t)(budget / (double)per) : 0;
	if (fit < 2)
		return err_set(e, ST_NOMEM, "executor: no room for the KV cache at --gpu-memory-utilization %.2f: "
					    "%.2f GiB of %.2f GiB were in use before loading, %.2f GiB of weights, "
					    "%.2f GiB of activations, %d rank(s) on this GPU (%.1f MiB per block of %u "
					    "tokens)", util, (double)before / (1u << 30), (double)tot / (1u << 30),
			       (double)x->w.device_bytes / (1u << 30), (double)act / (1u << 30), share,
			       (double)per / (1u << 20), B);
	*nb = fit;
	if (!opt->max_model_len || *max_len > (uint64_t)*nb * B)
		*max_len = (uint64_t)*nb * B < (uint64_t)cfg->max_position_embeddings ? (uint64_t)*nb * B
									: (uint64_t)cfg->max_position_embeddings;
	if (opt->max_model_len && opt->max_model_len < *max_len)
		*max_len = opt->max_model_len;
	log_msg(LOG_INFO, "model", "KV cache: %u blocks of %u tokens (%.2f GiB, %.1f MiB each): %llu tokens; "
				   "maximum concurrency %.2fx at %llu tokens per request",
		*nb, B, (double)per * *nb / (1u << 30), (double)per / (1u << 20), (unsigned long long)*nb * B,
		(double)*nb * B / (double)*max_len, (unsigned long long)*max_len);
	return ST_OK;
}

/* The step's buffers past the forward: logits of the sampling rows, the
 * sampling and prompt-logprob scratch (host, and the device ops' on a GPU). */
static enum status alloc_step_buffers(struct model_exec_cpu *x, uint32_t S, bool gpu, struct err *e)
{
	enum status st;
	if ((st = kern_mem_alloc(&x->mem, (size_t)S * x->vocab * sizeof(float), (void **)&x->logits, e)))
		return st;
	x->rows = malloc((size_t)S * sizeof(uint32_t));
	x->sample_work = malloc(kern_sample_workspace_bytes(x->vocab));
	x->sp = calloc(S, sizeof *x->sp);
	x->sh = calloc(S, sizeof *x->sh);
	x->sc = calloc(S, sizeof *x->sc);
	x->so = calloc(S, sizeof *x->so);
	x->lp_target = calloc(S, sizeof *x->lp_target);
	if (gpu) {
		x->lp_dev_bytes = kern_token_logprobs_workspace_bytes(S, KERN_SAMPLE_MAX_TOP_LOGPROBS);
		if ((st = kern_mem_alloc(&x->mem, x->lp_dev_bytes, &x->lp_dev, e)))
			return st;
	}
	if (gpu) {
		/* room for every row's logit biases and, per step, a million
		 * penalty-history ids; a step that needs more samples on the host */
		x->sample_aux_cap = (size_t)S * 300 + ((size_t)1 << 20);
		x->sample_dev_bytes = kern_sample_batch_workspace_bytes(x->vocab, S, x->sample_aux_cap);
		if ((st = kern_mem_alloc(&x->mem, x->sample_dev_bytes, &x->sample_dev, e)))
			return st;
		x->logits_host = malloc((size_t)S * x->vocab * sizeof(float));
	}
	if (!x->rows || !x->sample_work || !x->sp || !x->sh || !x->sc || !x->so || !x->lp_target ||
	    (gpu && !x->logits_host))
		return err_set(e, ST_NOMEM, "executor: logits for %u sequences", S);
	return ST_OK;
}

/* What the executor tells the scheduler (struct exec_info), and one log line. */
static void info_fill_and_log(struct model_exec_cpu *x, const struct model_exec_cpu_options *opt,
			      const struct model_config *cfg, uint32_t nb, uint32_t B, uint32_t T, uint32_t S,
			      uint64_t max_len, bool ref, bool gpu)
{
	x->ex.ops = &cpu_ops;
	x->ex.ctx = x;
	model_state_mix(&x->w, &x->ex.info.mix);
	x->ex.info.block_tokens = B;
	x->ex.info.n_blocks = nb;
	x->ex.info.vocab_size = x->vocab;
	x->ex.info.eos_token_id = (int32_t)cfg->eos_token_id;
	x->ex.info.max_step_tokens = T;
	x->ex.info.max_step_seqs = S;
	x->ex.info.max_model_len = (uint32_t)max_len;
	if (gpu)
		log_msg(LOG_INFO, "model", "executor on GPU %d (%s, cc %d.%d): %u blocks of %u tokens, %u tokens x %u "
					   "sequences per step, %s, %s", opt->dev->index, opt->dev->name, opt->dev->cc_major,
			opt->dev->cc_minor, nb, B, T, S, ref ? "reference precision" : "fp32 precision",
			x->graph ? "CUDA graphs for decode steps" : "eager (no CUDA graphs)");
	else
		log_msg(LOG_INFO, "model", "executor on the CPU: %u blocks of %u tokens, %u tokens x %u sequences per "
					   "step, %s", nb, B, T, S, ref ? "reference precision" : "fp32 precision");
}

enum status model_exec_cpu_create(struct model_exec_cpu **out, const struct model_exec_cpu_options *opt,
				  struct err *e)
{
	*out = NULL;
	if (!opt || !opt->ck)
		return err_set(e, ST_INVALID, "exec_cpu: no checkpoint");
	pthread_once(&exec_cpu__bus_once, exec_cpu__install_bus); /* hardening: SIGBUS -> a failed step */
	bool gpu = opt->dev && (opt->dev->cc_major || opt->dev->cc_minor);
	if (gpu && opt->dev->simulated)
		return err_set(e, ST_INVALID, "executor: device %s is simulated: it plans, but runs nothing",
			       opt->dev->name);
	const struct model_config *cfg = model_checkpoint_config(opt->ck);
	struct model_exec_cpu *x = calloc(1, sizeof *x);
	if (!x)
		return err_set(e, ST_NOMEM, "executor");
	x->mem.device = gpu;
	enum status st;
	if ((st = kern_mem_stream_create(&x->mem, e))) {
		free(x);
		return st;
	}
#if DSV4_HAVE_CUDA
	/* the kernels' state (scratch, library handles) belongs to this executor:
	 * two executors on one GPU (TP ranks as threads) never share it */
	if (gpu && (st = kern_ctx_create(opt->dev->index, x->mem.stream, (struct kern_ctx **)&x->kctx, e))) {
		kern_mem_stream_destroy(&x->mem);
		free(x);
		return st;
	}
#endif
	int world = opt->world_size ? opt->world_size : 1;
	uint32_t T = opt->max_step_tokens ? opt->max_step_tokens : 512;
	uint32_t S = opt->max_step_seqs ? opt->max_step_seqs : 64;
	uint32_t nb = opt->n_blocks ? opt->n_blocks : 64;
	uint32_t B = default_block_tokens(cfg, opt->block_tokens);
	uint64_t max_len = opt->max_model_len ? opt->max_model_len : (uint64_t)nb * B;
	if (max_len > (uint64_t)cfg->max_position_embeddings)
		max_len = (uint64_t)cfg->max_position_embeddings;
	if (max_len > (uint64_t)nb * B)
		max_len = (uint64_t)nb * B;
	bool ref = opt->precision == MODEL_PREC_REFERENCE;
	struct model_weights_options wo = {.ck = opt->ck, .dev = opt->dev, .disabled = opt->disabled,
					   .selfcheck = opt->kernel_selfcheck,
					   .max_step_tokens = T, .quant_sim = ref, .load_mtp = opt->load_mtp,
					   .rank = opt->rank, .world_size = world};
	if ((st = model_weights_load(&x->w, &wo, e))) {
#if DSV4_HAVE_CUDA
		kern_ctx_destroy(x->kctx);
#endif
		kern_mem_stream_destroy(&x->mem);
		free(x);
		return st;
	}
	x->weights_loaded = true;
	if ((st = model_weights_upload(&x->w, &x->mem, e)))
		goto fail;
	if (gpu && !opt->n_blocks && (st = gpu_kv_blocks(x, opt, cfg, T, S, B, &nb, &max_len, e)))
		goto fail;
	if ((st = model_state_create(&x->st, &x->w, nb, B, &x->mem, e)))
		goto fail;
	struct model_fwd_options fo = {.max_tokens = T, .max_seqs = S, .max_context = (uint32_t)max_len,
				       .quant_sim = ref, .bf16_round = ref, .comm = world > 1 ? opt->comm : NULL,
				       .kctx = x->kctx};
	const char *cg = getenv("DSV4_CUDA_GRAPHS");
	if (gpu && world == 1 && !opt->enforce_eager && !(cg && !strcmp(cg, "0"))) {
		if ((st = kern_graph_create(&x->graph, &x->mem, e)))
			goto fail;
		fo.graph = x->graph;
	}
	if ((st = model_fwd_create(&x->fwd, &x->w, &x->st, &fo, e)))
		goto fail;
	x->vocab = (uint32_t)cfg->vocab_size;
	x->rank = opt->rank;
	x->max_seqs = S;
	if ((st = alloc_step_buffers(x, S, gpu, e)))
		goto fail;
	info_fill_and_log(x, opt, cfg, nb, B, T, S, max_len, ref, gpu);
	*out = x;
	return ST_OK;
fail:
	model_exec_cpu_destroy(x);
	return st;
}

void model_exec_cpu_destroy(struct model_exec_cpu *x)
{
	if (!x)
		return;
	model_fwd_destroy(x->fwd);
	kern_graph_destroy(x->graph);
	model_state_free(&x->st);
	if (x->weights_loaded)
		model_weights_free(&x->w);
	kern_mem_free(&x->mem, x->logits);
	kern_mem_free(&x->mem, x->sample_dev);
	kern_mem_free(&x->mem, x->lp_dev);
	free(x->lp_target);
	free(x->sp);
	free(x->sh);
	free(x->sc);
	free(x->so);
#if DSV4_HAVE_CUDA
	kern_ctx_destroy(x->kctx); /* synchronises the device first */
#endif
	kern_mem_stream_destroy(&x->mem);
	free(x->logits_host);
	free(x->rows);
	free(x->sample_work);
	free(x);
}

struct exec *model_exec_cpu_exec(struct model_exec_cpu *x)
{
	return &x->ex;
}

static enum status exec_cpu__forward(struct model_exec_cpu *x, const struct exec_step *step, const uint32_t *rows,
				     uint32_t n_rows, float *logits, struct err *e);

enum status model_exec_cpu_forward(struct model_exec_cpu *x, const struct exec_step *step, const uint32_t *rows,
				   uint32_t n_rows, float *logits, struct err *e)
{
	sigjmp_buf jb; /* see cpu_step */
	if (sigsetjmp(jb, 1)) {
		exec_cpu__bus_jmp = NULL;
		log_msg(LOG_ERROR, "exec", "%s", EXEC_CPU_BUS_MSG);
		return err_set(e, ST_IO, "%s", EXEC_CPU_BUS_MSG);
	}
	exec_cpu__bus_jmp = &jb;
	enum status st = exec_cpu__forward(x, step, rows, n_rows, logits, e);
	exec_cpu__bus_jmp = NULL;
	return st;
}

static enum status exec_cpu__forward(struct model_exec_cpu *x, const struct exec_step *step, const uint32_t *rows,
				     uint32_t n_rows, float *logits, struct err *e)
{
	enum status st = model_fwd_run(x->fwd, step, e);
	if (st || !n_rows)
		return st;
	for (uint32_t i = 0; i < n_rows; i++)
		if (rows[i] >= step->n_tokens)
			return err_set(e, ST_INVALID, "logit row %u of a %u-token step", rows[i], step->n_tokens);
	if (!x->mem.device)
		return model_fwd_logits(x->fwd, model_fwd_streams(x->fwd), rows, n_rows, logits, e);
	/* on a device: in chunks of the executor's logits buffer, then to the host */
	for (uint32_t i = 0; i < n_rows; i += x->max_seqs) {
		uint32_t k = n_rows - i < x->max_seqs ? n_rows - i : x->max_seqs;
		if ((st = model_fwd_logits(x->fwd, model_fwd_streams(x->fwd), rows + i, k, x->logits, e)) ||
		    (st = kern_mem_download(&x->mem, logits + (size_t)i * x->vocab, x->logits,
					    (size_t)k * x->vocab * sizeof(float), e)))
			return st;
	}
	return ST_OK;
}

bool model_exec_cpu_graph_stats(const struct model_exec_cpu *x, struct kern_graph_stats *out)
{
	*out = (struct kern_graph_stats){0};
	if (!x->graph)
		return false;
	kern_graph_get_stats(x->graph, out);
	return true;
}

const float *model_exec_cpu_streams(const struct model_exec_cpu *x)
{
	return model_fwd_streams(x->fwd);
}

enum status model_exec_cpu_read_streams(const struct model_exec_cpu *x, float *dst, uint32_t n_tokens,
					struct err *e)
{
	const float *src = model_fwd_streams(x->fwd);
	if (!src)
		return err_set(e, ST_INVALID, "no forward pass has run");
	const struct model_config *c = x->w.cfg;
	size_t n = (size_t)n_tokens * (size_t)(c->hc_mult * c->hidden_size) * sizeof(float);
	return kern_mem_download(&x->mem, dst, src, n, e);
}

enum status model_exec_cpu_mtp(struct model_exec_cpu *x, const struct exec_step *mtp_step, const float *streams,
			       float *logits, struct err *e)
{
	return model_fwd_mtp(x->fwd, mtp_step, streams, logits, e);
}

size_t model_exec_cpu_plan_str(const struct model_exec_cpu *x, char *buf, size_t n)
{
	return model_weights_plan_str(&x->w, buf, n);
}

const struct kern_plan *model_exec_cpu_plan(const struct model_exec_cpu *x)
{
	return &x->w.plan;
}

struct model_fwd *model_exec_cpu_fwd(struct model_exec_cpu *x)
{
	return x->fwd;
}

const struct model_weights *model_exec_cpu_weights(const struct model_exec_cpu *x)
{
	return &x->w;
}

const struct model_state *model_exec_cpu_state(const struct model_exec_cpu *x)
{
	return &x->st;
}
