/*
 * tests/kernels/mma_ref.h: a multithreaded version of the CPU references'
 * math for the real-shape GPU tests of the tensor-core GEMMs (a [4096 tokens
 * x 1024] x [32768 x 1024] check is 275 GFLOP: the scalar reference would
 * take an hour). The math is the reference's, step for step: activations
 * through kern_act_quant_fp8_sim, weights through kern_wmat_decode_row, one
 * f32 dot product per output; only the summation order differs (8 partial
 * sums per dot product). test_*_mma_gpu.c check it against kern_linear_ref
 * and kern_moe_gemm_ref on small shapes before trusting it on large ones.
 */
#ifndef DSV4_TESTS_MMA_REF_H
#define DSV4_TESTS_MMA_REF_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/kernels.h"

/* y[r, o] = Σ_k xq[src(r), k] · w[o, k] for rows r of one expert's group:
 * xq f32 [*, in] (already act-quantized), wd f32 [out, in] (decoded), y f32
 * with row stride ldy. src = rows ? rows[r] : r. */
struct mref_job {
	const float *xq, *wd;
	const int32_t *rows;
	int64_t r0, r1, in, out, ldy, y_row0;
	float *y;
	int64_t o0, o1; /* this thread's outputs */
};

static void *mref_worker(void *p)
{
	const struct mref_job *j = p;
	for (int64_t r = j->r0; r < j->r1; r++) {
		const float *x = j->xq + (j->rows ? j->rows[r] : r) * j->in;
		for (int64_t o = j->o0; o < j->o1; o++) {
			const float *w = j->wd + o * j->in;
			float s[8] = {0};
			for (int64_t k = 0; k + 8 <= j->in; k += 8)
				for (int i = 0; i < 8; i++)
					s[i] += x[k + i] * w[k + i];
			float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
			for (int64_t k = j->in & ~(int64_t)7; k < j->in; k++)
				acc += x[k] * w[k];
			j->y[(j->y_row0 + r - j->r0) * j->ldy + o] = acc;
		}
	}
	return NULL;
}

static int mref_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

/* Rows [r0, r1) (through rows[] when given) x the decoded w, into y rows
 * y_row0.. (f32, stride ldy), outputs split over the machine's cores. */
static void mref_gemm(const float *xq, const int32_t *rows, int64_t r0, int64_t r1, const float *wd, int64_t in,
		      int64_t out, float *y, int64_t y_row0, int64_t ldy)
{
	if (r1 <= r0)
		return;
	int nt = mref_threads();
	pthread_t th[64];
	bool started[64];
	struct mref_job jobs[64];
	for (int t = 0; t < nt; t++) {
		jobs[t] = (struct mref_job){.xq = xq, .wd = wd, .rows = rows, .r0 = r0, .r1 = r1, .in = in, .out = out,
					    .ldy = ldy, .y_row0 = y_row0, .y = y, .o0 = out * t / nt,
					    .o1 = out * (t + 1) / nt};
		started[t] = pthread_create(&th[t], NULL, mref_worker, &jobs[t]) == 0;
		if (!started[t])
			mref_worker(&jobs[t]);
	}
	for (int t = 0; t < nt; t++)
		if (started[t])
			pthread_join(th[t], NULL);
}

/* The whole matrix decoded to f32 [rows, cols] (malloc; NULL on failure). */
static float *mref_decode(const struct kern_wmat *w)
{
	float *d = malloc((size_t)(w->rows * w->cols) * sizeof(float));
	for (int64_t r = 0; d && r < w->rows; r++)
		kern_wmat_decode_row(w, r, d + r * w->cols);
	return d;
}

/* x (dtype dt, stride ldx) -> f32 [rows, in] after the FP8 act_quant (block 128). */
static float *mref_act_quant(const void *x, enum kern_dtype dt, int64_t rows, int64_t in, int64_t ldx)
{
	float *q = malloc((size_t)(rows * in) * sizeof(float) + 4);
	for (int64_t r = 0; q && r < rows; r++)
		for (int64_t k = 0; k < in; k++)
			q[r * in + k] = kern_load_f32(x, dt, r * ldx + k);
	if (q)
		kern_act_quant_fp8_sim(q, rows, in, in, 128);
	return q;
}

#endif
