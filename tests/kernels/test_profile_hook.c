/*
 * tests/kernels/test_profile_hook.c: the registry's profiling hook
 * (kern_profile_install, registry.h) on the CPU: without an install a
 * selection is the table entry; installed, a stable wrapped copy whose run()
 * gives the reference's result on fresh random rows and calls before/after
 * (with the caller's args) only while active; kern_variant_base maps back.
 */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/norm/norm.h"
#include "kernels/registry/registry.h"
#include "tests/test.h"

struct seen {
	int n_before, n_after;
	const void *args;
	const struct kern_variant *base;
	const char *op;
	enum status st;
};

static void before(void *u, const struct kern_op *op, const struct kern_variant *base, const void *args)
{
	struct seen *s = u;
	s->n_before++;
	s->args = args;
	s->base = base;
	s->op = op->name;
}

static void after(void *u, const struct kern_op *op, const struct kern_variant *base, const void *args,
		  enum status st)
{
	struct seen *s = u;
	(void)op;
	(void)base;
	T_CHECK(args == s->args);
	s->n_after++;
	s->st = st;
}

static enum status run_norm(const struct kern_variant *v, const float *x, float *y, int rows, int dim)
{
	struct kern_rmsnorm_args a = {.x = x, .y = y, .n_rows = rows, .dim = dim, .eps = 1e-6f};
	return ((kern_rmsnorm_fn)v->run)(&a);
}

int main(void)
{
	srand((unsigned)test_seed());
	struct kern_device dev;
	kern_device_cpu(&dev);
	struct kern_problem p = {.wfmt = KERN_WFMT_NONE, .tp_size = 1};
	struct err e = {0};
	const struct kern_variant *plain = NULL, *w1 = NULL, *w2 = NULL, *after_rm = NULL;
	T_CHECK(kern_select(&kern_op_rmsnorm, &p, &dev, NULL, -1, &plain, &e) == ST_OK);
	T_CHECK(plain == &kern_op_rmsnorm.variants[0]);
	T_CHECK(kern_variant_base(plain) == plain);

	struct seen s = {0};
	struct kern_profile_hooks h = {.user = &s, .before = before, .after = after};
	kern_profile_install(&h);
	T_CHECK(kern_select(&kern_op_rmsnorm, &p, &dev, NULL, 3, &w1, &e) == ST_OK);
	struct kern_disabled dis = {0};
	T_CHECK(kern_select_checked(&kern_op_rmsnorm, &p, &dev, &dis, 4, &w2, &e) == ST_OK);
	T_CHECK(w1 && w1 != plain && w1 == w2);
	T_CHECK(w1 && !strcmp(w1->name, plain->name) && w1->run_host == plain->run_host);
	T_CHECK(kern_variant_base(w1) == plain);

	int rows = 1 + rand() % 5, dim = 8 + rand() % 64;
	float *x = malloc(sizeof(float) * rows * dim), *y0 = calloc((size_t)rows * dim, sizeof(float)),
	      *y1 = calloc((size_t)rows * dim, sizeof(float));
	for (int i = 0; i < rows * dim; i++)
		x[i] = (float)rand() / RAND_MAX - 0.5f;
	T_CHECK(run_norm(plain, x, y0, rows, dim) == ST_OK);
	/* inactive: the wrapped run is the reference, no hooks */
	T_CHECK(run_norm(w1, x, y1, rows, dim) == ST_OK);
	T_CHECK(!memcmp(y0, y1, sizeof(float) * rows * dim));
	T_CHECK(s.n_before == 0 && s.n_after == 0);
	/* active: both hooks, once each, with the op, the base and the result */
	kern_profile_set_active(true);
	memset(y1, 0, sizeof(float) * rows * dim);
	T_CHECK(run_norm(w1, x, y1, rows, dim) == ST_OK);
	T_CHECK(!memcmp(y0, y1, sizeof(float) * rows * dim));
	T_CHECK(s.n_before == 1 && s.n_after == 1 && s.base == plain && s.st == ST_OK);
	T_CHECK(s.op && !strcmp(s.op, "rmsnorm"));
	/* a failing run's status reaches after() and the caller */
	T_CHECK(run_norm(w1, x, y1, rows, 0) == ST_INVALID);
	T_CHECK(s.n_after == 2 && s.st == ST_INVALID);
	kern_profile_set_active(false);
	T_CHECK(run_norm(w1, x, y1, rows, dim) == ST_OK && s.n_before == 2);

	/* removed: selections are table entries again */
	kern_profile_install(NULL);
	T_CHECK(kern_select(&kern_op_rmsnorm, &p, &dev, NULL, -1, &after_rm, &e) == ST_OK);
	T_CHECK(after_rm == plain);
	free(x);
	free(y0);
	free(y1);
	return test_exit();
}
