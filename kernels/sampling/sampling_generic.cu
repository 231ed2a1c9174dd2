/*
 * kernels/sampling/sampling_generic.cu: the portable CUDA variant of op
 * "sample" (sample_cuda_generic, cc >= 8.0): the semantics of sampling.h on
 * device logits, with the rounding differences listed there.
 *
 *   1. The host checks the parameters as kern_sample_ref does, draws each
 *      row's uniform kern_sample_uniform(seed, counter) (so the RNG has one
 *      implementation), and uploads the rows' parameters, logit biases and
 *      the history ids the penalties need in one copy.
 *   2. prep kernel, one CTA per row: raw log-sum-exp and the top_logprobs
 *      (repeated block argmax in (logit desc, id asc) order: exact), the
 *      biases in list order (one thread: repeated ids add in the reference's
 *      order), the penalty counts (atomics into a per-row count array) and
 *      the penalties with the reference's fp32 operations (_rn: nothing
 *      contracted into an FMA); greedy rows finish here with a block argmax
 *      (lowest id on ties). Sampled rows compute temperature, softmax and
 *      min_p, and write one 64-bit sort key per token: (sampled-row index
 *      << 30) | (0x3F800000 - bits(p)), p = 0 for tokens min_p drops; p is
 *      in [0, 1], so the low 30 bits order probabilities descending.
 *   3. One CUB device-wide radix sort over all sampled rows (stable, and ids
 *      start ascending, so ties keep the lower id first: the reference's
 *      candidate order).
 *   4. draw kernel, one CTA per sampled row: top_k cut, then a block scan of
 *      the probabilities (read back from the keys, exact) in double over
 *      contiguous chunks, the top_p cut and the inverse-CDF draw.
 *   5. The kern_sample_out rows come back; the call waits for the stream.
 */
#include <cub/cub.cuh>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/sampling/sampling_generic.h"
#include "kernels/sampling/sampling_layout.h"
}

#define SNT 512
#define SEEN_IN_PROMPT 0x80000000u
#define P_ONE_BITS 0x3F800000u
#include "kernels/device/host_bufs.cuh"
#include "kernels/sampling/sampling_cuda.cuh"

#define P_KEY_MASK 0x3FFFFFFFull

struct USumOp {
	__device__ __forceinline__ unsigned operator()(unsigned a, unsigned b) const { return a + b; }
};
struct UMinOp {
	__device__ __forceinline__ unsigned operator()(unsigned a, unsigned b) const { return a < b ? a : b; }
};

typedef cub::BlockReduce<float, SNT> BRf;
typedef cub::BlockReduce<double, SNT> BRd;
typedef cub::BlockReduce<Best, SNT> BRb;
typedef cub::BlockReduce<unsigned, SNT> BRu;
typedef cub::BlockScan<double, SNT> BSd;

union Smem {
	BRf::TempStorage f;
	BRd::TempStorage d;
	BRb::TempStorage b;
	BRu::TempStorage u;
	BSd::TempStorage s;
};


static __device__ __forceinline__ float key_prob(uint64_t k)
{
	return __uint_as_float(P_ONE_BITS - (uint32_t)(k & P_KEY_MASK));
}

__global__ void __launch_bounds__(SNT)
	sample_prep_kernel(const float *logits, int64_t ld, uint32_t V, const struct kern__sample_row *rows,
			   const struct kern_logit_bias *bias, const int32_t *ids, float *L, uint32_t *cnt_all,
			   uint64_t *keys, uint32_t *vals, struct kern__sample_res *res, struct kern_sample_out *out)
{
	__shared__ Smem sm;
	const uint32_t r = blockIdx.x, tid = threadIdx.x;
	const struct kern__sample_row P = rows[r];
	const float *x = logits + (size_t)r * ld;
	float *l = L + (size_t)r * V;
	struct kern_sample_out *o = out + r;

	if (tid == 0) {
		o->token_id = 0;
		o->logprob = 0.0f;
		o->n_top = 0;
	}
	for (uint32_t i = tid; i < KERN_SAMPLE_MAX_TOP_LOGPROBS; i += SNT) {
		o->top_ids[i] = 0;
		o->top_logprobs[i] = 0.0f;
	}

	/* 0. raw logprobs */
	double lse = 0.0;
	if (P.want_lp) {
		float m = -INFINITY;
		for (uint32_t v = tid; v < V; v += SNT)
			m = fmaxf(m, x[v]);
		m = blk_reduce<float, BRf>(sm.f, m, FMaxOp());
		double s = 0.0;
		for (uint32_t v = tid; v < V; v += SNT)
			s += exp((double)x[v] - (double)m);
		s = blk_reduce<double, BRd>(sm.d, s, DSumOp());
		lse = (double)m + log(s);
		float pv = 0.0f;
		int32_t pi = -1;
		for (uint32_t k = 0; k < P.top_logprobs; k++) {
			Best b = {0.0f, -1};
			for (uint32_t v = tid; v < V; v += SNT) {
				float xv = x[v];
				if (pi < 0 || xv < pv || (xv == pv && (int32_t)v > pi))
					b = BestOp()(b, Best{xv, (int32_t)v});
			}
			b = blk_reduce<Best, BRb>(sm.b, b, BestOp());
			if (b.id < 0)
				break;
			if (tid == 0) {
				o->top_ids[k] = b.id;
				o->top_logprobs[k] = (float)((double)b.v - lse);
				o->n_top = k + 1;
			}
			pv = b.v;
			pi = b.id;
		}
	}

	/* 1. logit bias, in list order */
	for (uint32_t v = tid; v < V; v += SNT)
		l[v] = x[v];
	__syncthreads();
	if (tid == 0)
		for (uint64_t i = 0; i < P.n_bias; i++)
			l[bias[P.bias_off + i].token_id] = __fadd_rn(l[bias[P.bias_off + i].token_id], bias[P.bias_off + i].bias);
	__syncthreads();

	/* 2-3. penalties */
	if (P.rep_on || P.freq_on) {
		uint32_t *cnt = cnt_all + (size_t)r * V;
		for (uint32_t v = tid; v < V; v += SNT)
			cnt[v] = 0;
		__syncthreads();
		for (uint64_t i = tid; i < P.n_prompt; i += SNT)
			atomicOr(&cnt[ids[P.prompt_off + i]], SEEN_IN_PROMPT);
		for (uint64_t i = tid; i < P.n_output; i += SNT)
			atomicAdd(&cnt[ids[P.output_off + i]], 1u);
		__syncthreads();
		for (uint32_t v = tid; v < V; v += SNT) {
			uint32_t c = cnt[v];
			if (!c)
				continue;
			uint32_t cc = c & ~SEEN_IN_PROMPT;
			float lv = l[v];
			if (P.rep_on)
				lv = lv > 0.0f ? __fdiv_rn(lv, P.repetition) : __fmul_rn(lv, P.repetition);
			if (cc)
				lv = __fsub_rn(lv, __fadd_rn(__fmul_rn(P.frequency, (float)cc), P.presence));
			l[v] = lv;
		}
		__syncthreads();
	}

	/* 4. greedy */
	if (P.samp < 0) {
		Best b = {0.0f, -1};
		for (uint32_t v = tid; v < V; v += SNT)
			b = BestOp()(b, Best{l[v], (int32_t)v});
		b = blk_reduce<Best, BRb>(sm.b, b, BestOp());
		if (tid == 0) {
			o->token_id = b.id;
			if (P.want_lp)
				o->logprob = (float)((double)x[b.id] - lse);
		}
		return;
	}

	/* 5. temperature + softmax; each thread revisits only its own elements */
	float m = -INFINITY;
	for (uint32_t v = tid; v < V; v += SNT) {
		float t = __fdiv_rn(l[v], P.temperature);
		l[v] = t;
		m = fmaxf(m, t);
	}
	m = blk_reduce<float, BRf>(sm.f, m, FMaxOp());
	double s = 0.0;
	for (uint32_t v = tid; v < V; v += SNT) {
		float e = (float)exp((double)__fsub_rn(l[v], m));
		l[v] = e;
		s += (double)e;
	}
	s = blk_reduce<double, BRd>(sm.d, s, DSumOp());
	float pmax = 0.0f;
	for (uint32_t v = tid; v < V; v += SNT) {
		float p = __double2float_rn((double)l[v] / s);
		l[v] = p;
		pmax = fmaxf(pmax, p);
	}
	pmax = blk_reduce<float, BRf>(sm.f, pmax, FMaxOp());

	/* 6. min_p: the survivors keep their probability in the key, the rest 0 */
	const float thr = __fmul_rn(P.min_p, pmax);
	const uint64_t hi = (uint64_t)P.samp << 30;
	const size_t off = (size_t)P.samp * V;
	unsigned nc = 0;
	for (uint32_t v = tid; v < V; v += SNT) {
		float p = l[v];
		bool c = p > 0.0f && p >= thr;
		nc += c;
		keys[off + v] = hi | (uint64_t)(P_ONE_BITS - (c ? __float_as_uint(p) : 0u));
		vals[off + v] = v;
	}
	nc = blk_reduce<unsigned, BRu>(sm.u, nc, USumOp());
	if (tid == 0) {
		res[r].lse = lse;
		res[r].n_cand = nc;
	}
}

__global__ void __launch_bounds__(SNT)
	sample_draw_kernel(const float *logits, int64_t ld, uint32_t V, const struct kern__sample_row *rows,
			   const uint64_t *keys, const uint32_t *vals, const struct kern__sample_res *res,
			   struct kern_sample_out *out)
{
	__shared__ Smem sm;
	__shared__ double sh_mass;
	const uint32_t r = blockIdx.x, tid = threadIdx.x;
	const struct kern__sample_row P = rows[r];
	if (P.samp < 0)
		return;
	const uint64_t *k = keys + (size_t)P.samp * V;
	const uint32_t *id = vals + (size_t)P.samp * V;
	uint32_t n = res[r].n_cand;
	if (n == 0) { /* only NaN logits get here: the reference refuses too */
		if (tid == 0)
			out[r].token_id = -1;
		return;
	}
	/* 7. top_k */
	if (P.top_k > 0 && (uint32_t)P.top_k < n)
		n = (uint32_t)P.top_k;

	/* inclusive prefix sums c_i = Σ_{j<=i} p_j over contiguous chunks */
	const uint32_t chunk = (n + SNT - 1) / SNT;
	const uint32_t b0 = min(tid * chunk, n), b1 = min(b0 + chunk, n);
	double part = 0.0, base, mass;
	for (uint32_t i = b0; i < b1; i++)
		part += (double)key_prob(k[i]);
	BSd(sm.s).ExclusiveSum(part, base, mass);
	__syncthreads();

	/* 8. top_p over the mass left after 6-7 */
	uint32_t keep = n;
	if (P.top_p < 1.0f) {
		const double target = (double)P.top_p * mass;
		unsigned first = UINT_MAX;
		double c = base;
		for (uint32_t i = b0; i < b1; i++) {
			c += (double)key_prob(k[i]);
			if (c >= target) {
				first = i;
				break;
			}
		}
		first = blk_reduce<unsigned, BRu>(sm.u, first, UMinOp());
		keep = first == UINT_MAX ? n : first + 1;
		c = base;
		for (uint32_t i = b0; i < b1 && i < keep; i++) {
			c += (double)key_prob(k[i]);
			if (i == keep - 1)
				sh_mass = c;
		}
		__syncthreads();
		mass = sh_mass;
	}

	/* 9. inverse CDF */
	const double u = P.u * mass;
	unsigned first = UINT_MAX;
	double c = base;
	for (uint32_t i = b0; i < b1 && i < keep; i++) {
		c += (double)key_prob(k[i]);
		if (c > u) {
			first = i;
			break;
		}
	}
	first = blk_reduce<unsigned, BRu>(sm.u, first, UMinOp());
	if (tid == 0) {
		int32_t t = (int32_t)id[first == UINT_MAX ? keep - 1 : first];
		out[r].token_id = t;
		if (P.want_lp)
			out[r].logprob = (float)((double)logits[(size_t)r * ld + t] - res[r].lse);
	}
}

/* ---- host side ---- */

static bool ids_ok(const int32_t *ids, size_t n, uint32_t V)
{
	if (n && !ids)
		return false;
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= V)
			return false;
	return true;
}

/* The reference's checks of one row, and what it uploads. */
static enum status check_row(const struct kern_sampling_params *p, const struct kern_sample_history *h, uint32_t V,
			     bool *rep_on, bool *freq_on)
{
	if (!(p->temperature >= 0.0f) || !(p->top_p > 0.0f && p->top_p <= 1.0f) || !(p->min_p >= 0.0f && p->min_p <= 1.0f) ||
	    !(p->repetition_penalty > 0.0f) || p->top_logprobs > KERN_SAMPLE_MAX_TOP_LOGPROBS)
		return ST_INVALID;
	if (p->n_logit_bias && !p->logit_bias)
		return ST_INVALID;
	if (p->allow_mask) /* structured outputs: only the reference applies it (the executor samples on the host) */
		return ST_UNSUPPORTED;
	for (uint32_t i = 0; i < p->n_logit_bias; i++)
		if (p->logit_bias[i].token_id < 0 || (uint32_t)p->logit_bias[i].token_id >= V)
			return ST_INVALID;
	bool rep = p->repetition_penalty != 1.0f, freq = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
	*rep_on = h && rep;
	*freq_on = h && freq;
	if (h && (rep || freq) && (!ids_ok(h->prompt_ids, h->n_prompt, V) || !ids_ok(h->output_ids, h->n_output, V)))
		return ST_INVALID;
	return ST_OK;
}

extern "C" enum status kern_sample_cuda_generic(const struct kern_sample_batch_args *a)
{
	if (!a || !a->vocab || a->ld < (int64_t)a->vocab || !a->params || !a->counter || !a->out)
		return ST_INVALID;
	if (!a->n_rows)
		return ST_OK;
	if (!a->logits || !a->work || ((uintptr_t)a->work & 255))
		return ST_INVALID;
	const uint32_t R = a->n_rows, V = a->vocab;
	if ((uint64_t)R * V > (uint64_t)INT_MAX)
		return ST_INVALID;

	struct kern__sample_row *rows = (struct kern__sample_row *)calloc(R, sizeof *rows);
	if (!rows)
		return ST_NOMEM;
	size_t n_bias = 0, n_ids = 0;
	uint32_t n_samp = 0;
	for (uint32_t r = 0; r < R; r++) {
		const struct kern_sampling_params *p = &a->params[r];
		const struct kern_sample_history *h = a->hist ? &a->hist[r] : NULL;
		bool rep_on, freq_on;
		enum status st = check_row(p, h, V, &rep_on, &freq_on);
		if (st) {
			free(rows);
			return st;
		}
		struct kern__sample_row *w = &rows[r];
		w->temperature = p->temperature;
		w->top_p = p->top_p;
		w->min_p = p->min_p;
		w->presence = p->presence_penalty;
		w->frequency = p->frequency_penalty;
		w->repetition = p->repetition_penalty;
		w->top_k = p->top_k;
		w->top_logprobs = p->top_logprobs;
		w->want_lp = p->logprobs || p->top_logprobs > 0;
		w->samp = p->temperature == 0.0f ? -1 : (int32_t)n_samp++;
		w->rep_on = rep_on;
		w->freq_on = freq_on;
		w->u = kern_sample_uniform(p->seed, a->counter[r]);
		w->bias_off = n_bias;
		w->n_bias = p->n_logit_bias;
		n_bias += p->n_logit_bias;
		w->prompt_off = n_ids;
		w->n_prompt = rep_on ? h->n_prompt : 0;
		n_ids += w->n_prompt;
		w->output_off = n_ids;
		w->n_output = rep_on || freq_on ? h->n_output : 0;
		n_ids += w->n_output;
	}
	struct kern__sample_layout L;
	kern__sample_layout(V, R, n_bias + n_ids, &L);
	if (a->work_bytes < L.total) {
		free(rows);
		return ST_NOMEM;
	}
	/* one upload: rows, then the aux region (biases, then ids) */
	const size_t up = L.aux + n_bias * sizeof(struct kern_logit_bias) + n_ids * sizeof(int32_t);
	uint8_t *stage = (uint8_t *)malloc(up);
	if (!stage) {
		free(rows);
		return ST_NOMEM;
	}
	memcpy(stage + L.rows, rows, R * sizeof *rows);
	struct kern_logit_bias *sb = (struct kern_logit_bias *)(stage + L.aux);
	int32_t *si = (int32_t *)(stage + L.aux + n_bias * sizeof(struct kern_logit_bias));
	for (uint32_t r = 0; r < R; r++) {
		const struct kern__sample_row *w = &rows[r];
		if (w->n_bias)
			memcpy(sb + w->bias_off, a->params[r].logit_bias, w->n_bias * sizeof *sb);
		if (w->n_prompt)
			memcpy(si + w->prompt_off, a->hist[r].prompt_ids, w->n_prompt * sizeof *si);
		if (w->n_output)
			memcpy(si + w->output_off, a->hist[r].output_ids, w->n_output * sizeof *si);
	}
	free(rows);
	uint8_t *wk = (uint8_t *)a->work;
	cudaStream_t s = (cudaStream_t)a->stream;
	/* pageable source: the call returns once the bytes are staged, so the
	 * buffer can go right away */
	cudaError_t ce = cudaMemcpyAsync(wk, stage, up, cudaMemcpyHostToDevice, s);
	free(stage);
	if (ce != cudaSuccess)
		return ST_CUDA;

	const struct kern__sample_row *d_rows = (const struct kern__sample_row *)(wk + L.rows);
	const struct kern_logit_bias *d_bias = (const struct kern_logit_bias *)(wk + L.aux);
	const int32_t *d_ids = (const int32_t *)(wk + L.aux + n_bias * sizeof(struct kern_logit_bias));
	uint64_t *keys_a = (uint64_t *)(wk + L.keys_a), *keys_b = (uint64_t *)(wk + L.keys_b);
	uint32_t *vals_a = (uint32_t *)(wk + L.vals_a), *vals_b = (uint32_t *)(wk + L.vals_b);
	struct kern__sample_res *d_res = (struct kern__sample_res *)(wk + L.res);
	struct kern_sample_out *d_out = (struct kern_sample_out *)(wk + L.out);
	sample_prep_kernel<<<R, SNT, 0, s>>>(a->logits, a->ld, V, d_rows, d_bias, d_ids, (float *)(wk + L.l),
					     (uint32_t *)keys_b, keys_a, vals_a, d_res, d_out);
	if (cudaGetLastError() != cudaSuccess)
		return ST_CUDA;
	if (n_samp) {
		int end_bit = 30;
		while ((1u << (end_bit - 30)) < n_samp)
			end_bit++;
		cub::DoubleBuffer<uint64_t> dk(keys_a, keys_b);
		cub::DoubleBuffer<uint32_t> dv(vals_a, vals_b);
		const int items = (int)((uint64_t)n_samp * V);
		size_t tb = 0;
		if (cub::DeviceRadixSort::SortPairs(nullptr, tb, dk, dv, items, 0, end_bit, s) != cudaSuccess)
			return ST_CUDA;
		if (tb > L.sort_bytes)
			return ST_NOMEM; /* the layout's bound is wrong for this CUB: a bug, not an input */
		if (cub::DeviceRadixSort::SortPairs(wk + L.sort, tb, dk, dv, items, 0, end_bit, s) != cudaSuccess)
			return ST_CUDA;
		sample_draw_kernel<<<R, SNT, 0, s>>>(a->logits, a->ld, V, d_rows, dk.Current(), dv.Current(), d_res,
						     d_out);
		if (cudaGetLastError() != cudaSuccess)
			return ST_CUDA;
	}
	if (cudaMemcpyAsync(a->out, d_out, R * sizeof *a->out, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
	    cudaStreamSynchronize(s) != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	for (uint32_t r = 0; r < R; r++)
		if (a->out[r].token_id < 0)
			return ST_INVALID;
	return ST_OK;
}

extern "C" enum status kern_sample_cuda_generic_host(const struct kern_sample_batch_args *a)
{
	if (!a || !a->vocab || a->ld < (int64_t)a->vocab || !a->params || !a->counter || !a->out)
		return ST_INVALID;
	if (!a->n_rows)
		return ST_OK;
	if (!a->logits)
		return ST_INVALID;
	const size_t nl = (size_t)(a->n_rows - 1) * (size_t)a->ld + a->vocab;
	const size_t ws = kern_sample_batch_workspace_bytes(a->vocab, a->n_rows,
							    kern_sample_batch_aux_count(a->params, a->hist, a->n_rows));
	struct kern_hbufs b = {};
	struct kern_sample_batch_args d = *a;
	d.logits = (const float *)kern_hb_up(&b, a->logits, nl * sizeof(float), false);
	d.work = kern_hb_alloc(&b, ws);
	d.work_bytes = ws;
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_sample_cuda_generic(&d) : ST_CUDA);
}
