/*
 * server/bench_profile.c: the user side of the registry's profiling hook for
 * `dsv4 bench decode` (kern_profile_install): on the profiled step every op
 * is timed with a device synchronisation around it and the routing op's
 * expert ids are copied out (the roofline counts the experts the step
 * really chose); then the records are summed per op, variant and shape and
 * per layer, and printed as the per-op table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"
#include "kernels/linear/linear.h"
#include "kernels/routing/routing.h"
#include "server/bench_decode.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static void prof_sync(const struct prof *p)
{
#if DSV4_HAVE_CUDA
	if (p->gpu)
		cudaDeviceSynchronize();
#else
	(void)p;
#endif
}

void bench__prof_before(void *u, const struct kern_op *op, const struct kern_variant *base, const void *args)
{
	struct prof *p = u;
	(void)op;
	(void)base;
	(void)args;
	if (!p->timing)
		return;
	prof_sync(p);
	p->t0 = bench__now_s();
}

void bench__prof_after(void *u, const struct kern_op *op, const struct kern_variant *base, const void *args,
		       enum status st)
{
	struct prof *p = u;
	int layer = p->n_post / 2 < p->n_layers ? p->n_post / 2 : p->n_layers;
	if (!strcmp(op->name, "embed"))
		layer = -1;
	if (p->timing) {
		prof_sync(p);
		double us = (bench__now_s() - p->t0) * 1e6;
		if (p->n_recs == p->cap_recs) {
			int cap = p->cap_recs ? 2 * p->cap_recs : 256;
			struct prof_rec *r = realloc(p->recs, (size_t)cap * sizeof *r);
			if (!r) {
				p->failed = true;
				return;
			}
			p->recs = r;
			p->cap_recs = cap;
		}
		struct prof_rec *r = &p->recs[p->n_recs++];
		*r = (struct prof_rec){.op = op->name, .variant = base->name, .layer = layer, .us = us};
		if (!strcmp(op->name, "linear")) {
			const struct kern_linear_args *a = args;
			r->rows = a->w ? a->w->rows : 0;
			r->cols = a->w ? a->w->cols : 0;
		}
	}
	if (!strcmp(op->name, "hc_post"))
		p->n_post++;
	if (!strcmp(op->name, "route") && st == ST_OK && layer >= 0 && layer < p->n_layers) {
		const struct kern_route_args *a = args;
		int64_t n = a->n_tokens * a->top_k;
		if (n > p->ids_cap || a->top_k != p->top_k) {
			p->failed = true;
			return;
		}
		int32_t *dst = p->ids + (size_t)layer * (size_t)p->ids_cap;
#if DSV4_HAVE_CUDA
		if (p->gpu) {
			cudaDeviceSynchronize();
			if (cudaMemcpy(dst, a->expert_ids, (size_t)n * sizeof *dst, cudaMemcpyDeviceToHost) != cudaSuccess)
				p->failed = true;
		} else
#endif
			memcpy(dst, a->expert_ids, (size_t)n * sizeof *dst);
		p->ids_n[layer] = n;
		p->n_route++;
	}
}

static int op_sum_cmp(const void *a, const void *b)
{
	double x = ((const struct op_sum *)a)->us, y = ((const struct op_sum *)b)->us;
	return x < y ? 1 : x > y ? -1 : 0;
}

enum status bench__summarise_profile(const struct prof *p, struct result *r, struct err *e)
{
	int L = p->n_layers;
	r->ops = calloc((size_t)p->n_recs + 1, sizeof *r->ops);
	if (!r->ops)
		return err_set(e, ST_NOMEM, "profile summary");
	for (int i = 0; i < p->n_recs; i++) {
		const struct prof_rec *q = &p->recs[i];
		r->prof_total_us += q->us;
		int slot = q->layer < 0 ? 0 : q->layer >= L ? L + 1 : q->layer + 1;
		r->prof_layer_us[slot] += q->us;
		int k = 0;
		while (k < r->n_ops && !(r->ops[k].op == q->op && r->ops[k].variant == q->variant &&
					 r->ops[k].rows == q->rows && r->ops[k].cols == q->cols))
			k++;
		if (k == r->n_ops)
			r->ops[r->n_ops++] = (struct op_sum){.op = q->op, .variant = q->variant, .rows = q->rows,
							     .cols = q->cols};
		r->ops[k].calls++;
		r->ops[k].us += q->us;
	}
	qsort(r->ops, (size_t)r->n_ops, sizeof *r->ops, op_sum_cmp);
	return ST_OK;
}

void bench__print_profile(const struct result *r, int L)
{
	printf("\n#### per-op profile: context %u, batch %u (one step, device synchronised around every op: "
	       "%.3f ms against %.3f ms unprofiled)\n\n",
	       r->ctx, r->batch, r->prof_total_us / 1e3, r->ms_median);
	printf("| op | variant | shape | calls | us | share |\n|---|---|---|---|---|---|\n");
	for (int i = 0; i < r->n_ops; i++) {
		const struct op_sum *s = &r->ops[i];
		char shape[48] = "";
		if (s->rows)
			snprintf(shape, sizeof shape, "%lld x %lld", (long long)s->rows, (long long)s->cols);
		printf("| %s | %s | %s | %d | %.1f | %.1f %% |\n", s->op, s->variant, shape, s->calls, s->us,
		       r->prof_total_us > 0 ? 100 * s->us / r->prof_total_us : 0.0);
	}
	printf("\nper layer (us): embed %.1f", r->prof_layer_us[0]);
	for (int l = 0; l < L; l++)
		printf(", L%d %.1f", l, r->prof_layer_us[l + 1]);
	printf(", head+sample %.1f\n", r->prof_layer_us[L + 1]);
}
