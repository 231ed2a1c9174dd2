/*
 * model/exec_cpu.h: the model executor (model/exec.h) for DeepSeek-V4, on
 * the CPU or on one CUDA GPU: the same forward pass (model/forward.h) with
 * the plan's variants for the device. On the CPU the weights are views into
 * the mapped checkpoint and every variant is the reference; on a GPU the
 * weights are uploaded once in the layouts their variants consume
 * (model_weights_upload), the paged fp32 block pool (model/state.h) and
 * every activation live on the device, and the pool is sized from
 * --gpu-memory-utilization. Sampling is the plan's sample op on the rows of
 * the sampled sequences, where the logits are: on a GPU only the ids and the
 * requested logprobs come back (a step whose logit biases and penalty
 * histories overflow the op's scratch samples those rows on the host).
 * The name is historical: "the CPU executor" is this executor on the CPU.
 *
 * Besides the vtable it exposes what tests and speculative decoding need:
 * the logits of any rows of a step, the pre-head streams, and the MTP
 * layer's forward.
 */
#ifndef DSV4_MODEL_EXEC_CPU_H
#define DSV4_MODEL_EXEC_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/exec.h"

struct comm;
struct model_exec_cpu;

/* Numerics (docs/forward.md "Precision"). */
enum model_precision {
	MODEL_PREC_REFERENCE = 0, /* DeepSeek's reference: FP8/FP4 simulations on, bf16 storage rounding (default) */
	MODEL_PREC_FP32 = 1,      /* no simulations, fp32 between ops: what transformers computes in float32 */
};

struct model_exec_cpu_options {
	const struct model_checkpoint *ck; /* borrowed; must outlive the executor */
	uint32_t block_tokens;    /* B; 0 = 256 (rounded up to a multiple of every ratio and >= the window) */
	uint32_t n_blocks;        /* pool size; 0 = 64 */
	uint32_t max_step_tokens; /* 0 = 512 */
	uint32_t max_step_seqs;   /* 0 = 64 */
	uint32_t max_model_len;   /* 0 = min(max_position_embeddings, n_blocks * B) */
	enum model_precision precision;
	bool load_mtp;            /* load mtp.0.* (model_exec_cpu_mtp) */
	const struct kern_device *dev;        /* NULL or the CPU: the host; a detected GPU (kern_device_detect,
					       * the current device): run there; a simulated one is refused */
	double gpu_memory_utilization;        /* GPU with n_blocks 0: fraction of the device's memory this
					       * process may use (vLLM's meaning); 0 = 0.9 */
	int device_share;                     /* executors of this process on the same GPU (TP ranks as
					       * threads sharing one device); they split the budget; 0 = 1 */
	const struct kern_disabled *disabled; /* NULL: none */
	bool kernel_selfcheck;                /* --kernel-selfcheck (model_plan_options.selfcheck) */
	/* Tensor parallelism (design.md; docs/forward.md): rank, world size (0
	 * means 1) and the group's communicator (borrowed; required when the
	 * world size is > 1). Every rank creates its executor and runs every step
	 * with the same plan; each holds only its weight shards and a replica of
	 * the state; logits are gathered on every rank and rank 0 samples (the
	 * others' step leaves out untouched). */
	int rank, world_size;
	struct comm *comm;
	/* A single-GPU executor runs decode-only steps as CUDA graphs
	 * (kernels/device/graph.h) unless enforce_eager (vLLM's --enforce-eager)
	 * or DSV4_CUDA_GRAPHS=0; tensor-parallel ranks always run eagerly. */
	bool enforce_eager;
};

/* --device: "auto" (the first GPU when one is present and usable, else the
 * CPU; the log says which and why), "cuda" (the first GPU; an error naming
 * the reason without one) or "cpu". dev is the CPU (kern_device_cpu) or the
 * detected GPU, which becomes the calling thread's current device.
 * ST_INVALID for another word. */
enum status model_exec_device(const char *want, struct kern_device *dev, struct err *e) DSV4_WUR;

enum status model_exec_cpu_create(struct model_exec_cpu **out, const struct model_exec_cpu_options *opt,
				  struct err *e) DSV4_WUR;
void model_exec_cpu_destroy(struct model_exec_cpu *x);

/* The executor handle for the scheduler (borrowed; lives as long as x). */
struct exec *model_exec_cpu_exec(struct model_exec_cpu *x);

/* Run the forward pass of step (no sampling) and write the logits of flat
 * tokens rows[0..n_rows) into logits [n_rows, vocab]. Updates the blocks as
 * a step does. */
enum status model_exec_cpu_forward(struct model_exec_cpu *x, const struct exec_step *step, const uint32_t *rows,
				   uint32_t n_rows, float *logits, struct err *e) DSV4_WUR;

/* Counters of the executor's CUDA graphs (kernels/device/graph.h); false
 * (and zeros) when it runs every step eagerly. */
struct kern_graph_stats;
bool model_exec_cpu_graph_stats(const struct model_exec_cpu *x, struct kern_graph_stats *out);

/* Pre-head hyper-connection streams [n_tokens, hc_mult, hidden] of the last
 * forward (step or model_exec_cpu_forward), in the executor's memory (device
 * memory on a GPU); valid until the next call. NULL before the first. */
const float *model_exec_cpu_streams(const struct model_exec_cpu *x);

/* Copy the first n_tokens rows of those streams to dst (host). */
enum status model_exec_cpu_read_streams(const struct model_exec_cpu *x, float *dst, uint32_t n_tokens,
					struct err *e) DSV4_WUR;

/* MTP logits [n_tokens, vocab] from pre-head streams [n_tokens, hc_mult,
 * hidden] and the next token ids: mtp_step has the same sequences, positions
 * and block tables as the main step that produced the streams, with
 * token_ids[i] = the token after flat token i. */
enum status model_exec_cpu_mtp(struct model_exec_cpu *x, const struct exec_step *mtp_step, const float *streams,
			       float *logits, struct err *e) DSV4_WUR;

/* The forward pass and the weights (speculative decoding, model/spec.h: the
 * verify rollback and the drafter run on them). Borrowed. */
struct model_fwd *model_exec_cpu_fwd(struct model_exec_cpu *x);
const struct model_weights *model_exec_cpu_weights(const struct model_exec_cpu *x);
const struct model_state *model_exec_cpu_state(const struct model_exec_cpu *x);

/* The per-layer kernel plan ("layer 2 (CSA): linear=linear_cpu_ref ..."),
 * one line per layer, into buf; returns the length needed. */
size_t model_exec_cpu_plan_str(const struct model_exec_cpu *x, char *buf, size_t n);
/* The plan for /metrics and logs (borrowed). */
const struct kern_plan *model_exec_cpu_plan(const struct model_exec_cpu *x);

#endif
