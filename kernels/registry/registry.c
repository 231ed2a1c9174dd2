/*
 * kernels/registry/registry.c: variant guards, selection, disable lists,
 * weight preparation hand-off and plan records. Pure C; it never touches a
 * GPU itself (self-checks go through each variant's run_host). Also the
 * profiling hook (registry.h): wrapped copies of selected variants whose
 * run() is a trampoline into the installed hooks.
 */
#include "kernels/registry/registry.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* ---- disable lists ---- */

static enum status disabled_add_n(struct kern_disabled *d, const char *s, size_t len, struct err *e)
{
	while (len && isspace((unsigned char)*s))
		s++, len--;
	while (len && isspace((unsigned char)s[len - 1]))
		len--;
	if (!len)
		return ST_OK;
	if (len >= KERN_NAME_BYTES)
		return err_set(e, ST_INVALID, "disabled kernel '%.*s': name longer than %d bytes", (int)len, s,
			       KERN_NAME_BYTES - 1);
	for (int i = 0; i < d->n; i++)
		if (strlen(d->names[i]) == len && !memcmp(d->names[i], s, len))
			return ST_OK;
	if (d->n >= KERN_MAX_DISABLED)
		return err_set(e, ST_INVALID, "disabled kernels: more than %d names", KERN_MAX_DISABLED);
	memcpy(d->names[d->n], s, len);
	d->names[d->n][len] = '\0';
	d->n++;
	return ST_OK;
}

static enum status disabled_add_list(struct kern_disabled *d, const char *list, struct err *e)
{
	while (list && *list) {
		const char *comma = strchr(list, ',');
		size_t len = comma ? (size_t)(comma - list) : strlen(list);
		enum status st = disabled_add_n(d, list, len, e);
		if (st)
			return st;
		list = comma ? comma + 1 : NULL;
	}
	return ST_OK;
}

enum status kern_disabled_init(struct kern_disabled *d, const char *list, bool read_env, struct err *e)
{
	memset(d, 0, sizeof *d);
	enum status st = disabled_add_list(d, list, e);
	if (st)
		return st;
	if (read_env) {
		st = disabled_add_list(d, getenv("DSV4_DISABLED_KERNELS"), e);
		if (st)
			return err_prefix(e, "DSV4_DISABLED_KERNELS");
	}
	return ST_OK;
}

enum status kern_disabled_add(struct kern_disabled *d, const char *name, struct err *e)
{
	return disabled_add_n(d, name, strlen(name), e);
}

bool kern_disabled_has(const struct kern_disabled *d, const char *name)
{
	if (!d)
		return false;
	for (int i = 0; i < d->n; i++)
		if (!strcmp(d->names[i], name))
			return true;
	return false;
}

enum status kern_disabled_check(const struct kern_disabled *d, const struct kern_op *const *ops, int n_ops,
				struct err *e)
{
	for (int i = 0; i < d->n; i++) {
		bool found = false;
		for (int o = 0; o < n_ops && !found; o++)
			for (int v = 0; v < ops[o]->n_variants && !found; v++)
				found = !strcmp(ops[o]->variants[v].name, d->names[i]);
		if (!found)
			return err_set(e, ST_NOTFOUND, "disabled kernel '%s': no such kernel variant", d->names[i]);
	}
	return ST_OK;
}

/* ---- guards ---- */

static bool refuse(char *why, size_t n, const char *fmt, ...) DSV4_PRINTF(3, 4);
static bool refuse(char *why, size_t n, const char *fmt, ...)
{
	if (why && n) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(why, n, fmt, ap);
		va_end(ap);
	}
	return false;
}

static bool device_is_cpu(const struct kern_device *dev)
{
	return dev->index < 0 || (dev->cc_major == 0 && dev->cc_minor == 0);
}

bool kern_variant_accepts(const struct kern_variant *v, const struct kern_problem *p,
			  const struct kern_device *dev, const struct kern_disabled *disabled, char *why,
			  size_t why_bytes)
{
	int cc = dev->cc_major * 10 + dev->cc_minor;
	char buf[64], buf2[64];
	if (kern_disabled_has(disabled, v->name))
		return refuse(why, why_bytes, "disabled");
	if (device_is_cpu(dev) != (v->backend == KERN_BACKEND_CPU))
		return refuse(why, why_bytes, "%s variant, %s device", v->backend == KERN_BACKEND_CPU ? "cpu" : "cuda",
			      device_is_cpu(dev) ? "cpu" : "gpu");
	if (v->backend != KERN_BACKEND_CPU) {
		if (cc < v->cc_min || cc > v->cc_max) {
			if (v->cc_max >= KERN_CC_ANY)
				snprintf(buf2, sizeof buf2, "any");
			else
				snprintf(buf2, sizeof buf2, "%d.%d", v->cc_max / 10, v->cc_max % 10);
			return refuse(why, why_bytes, "cc %d.%d outside [%d.%d, %s]", dev->cc_major, dev->cc_minor,
				      v->cc_min / 10, v->cc_min % 10, buf2);
		}
		if (!v->target || (dev->loadable & v->target) != v->target) {
			kern_targets_str(v->target, buf, sizeof buf);
			kern_targets_str(dev->loadable, buf2, sizeof buf2);
			return refuse(why, why_bytes, "image %s not loadable (loadable: %s)", buf, buf2);
		}
		if (!v->run)
			return refuse(why, why_bytes, "not compiled into this binary");
		if ((dev->features & v->features) != v->features)
			return refuse(why, why_bytes, "device lacks features 0x%x",
				      (unsigned)(v->features & ~dev->features));
	} else if (!v->run) {
		return refuse(why, why_bytes, "no run function");
	}
	if (v->wfmt_accept && !(v->wfmt_accept & KERN_WFMT_BIT(p->wfmt)))
		return refuse(why, why_bytes, "weight format %s not accepted", kern_wfmt_name(p->wfmt));
	if (!v->wfmt_accept && p->wfmt != KERN_WFMT_NONE)
		return refuse(why, why_bytes, "takes no weights, got %s", kern_wfmt_name(p->wfmt));
	if (v->supports) {
		char r[KERN_REASON_BYTES] = "";
		if (!v->supports(p, dev, r, sizeof r))
			return refuse(why, why_bytes, "%s", r[0] ? r : "shape not supported");
	}
	if (why && why_bytes)
		why[0] = '\0';
	return true;
}

/* ---- profiling hook (registry.h) ---- */

struct prof_slot {
	struct kern_variant v;          /* the copy selections return; run = its trampoline */
	const struct kern_variant *base;
	const struct kern_op *op;
};

static struct prof_slot prof_slots[KERN_PROFILE_MAX_VARIANTS];
static int prof_n;
static _Atomic(const struct kern_profile_hooks *) prof_hooks;
static atomic_bool prof_active;
static pthread_mutex_t prof_lock = PTHREAD_MUTEX_INITIALIZER;

typedef enum status (*prof_any_fn)(const void *a);

static enum status prof_call(int i, const void *a)
{
	const struct prof_slot *s = &prof_slots[i];
	/* every op's run type is enum status (*)(const struct kern_<op>_args *): the base's run is
	 * called through the same shape the forward pass called the copy with */
	prof_any_fn run = (prof_any_fn)s->base->run;
	const struct kern_profile_hooks *h = atomic_load_explicit(&prof_hooks, memory_order_acquire);
	if (!h || !atomic_load_explicit(&prof_active, memory_order_relaxed))
		return run(a);
	if (h->before)
		h->before(h->user, s->op, s->base, a);
	enum status st = run(a);
	if (h->after)
		h->after(h->user, s->op, s->base, a, st);
	return st;
}

#define PROF_T(i)                                                                                  \
	static enum status prof_t##i(const void *a)                                                \
	{                                                                                          \
		return prof_call(0##i, a); /* the name's digits are the slot in octal */           \
	}
#define PROF_T8(i) PROF_T(i##0) PROF_T(i##1) PROF_T(i##2) PROF_T(i##3) PROF_T(i##4) PROF_T(i##5) PROF_T(i##6) PROF_T(i##7)
PROF_T8(0) PROF_T8(1) PROF_T8(2) PROF_T8(3) PROF_T8(4) PROF_T8(5) PROF_T8(6) PROF_T8(7)
PROF_T8(10) PROF_T8(11) PROF_T8(12) PROF_T8(13) PROF_T8(14) PROF_T8(15) PROF_T8(16) PROF_T8(17)
#define PROF_R8(i) prof_t##i##0, prof_t##i##1, prof_t##i##2, prof_t##i##3, prof_t##i##4, prof_t##i##5, prof_t##i##6, prof_t##i##7
static const prof_any_fn prof_tramps[] = {
	PROF_R8(0),  PROF_R8(1),  PROF_R8(2),  PROF_R8(3),  PROF_R8(4),  PROF_R8(5),  PROF_R8(6),  PROF_R8(7),
	PROF_R8(10), PROF_R8(11), PROF_R8(12), PROF_R8(13), PROF_R8(14), PROF_R8(15), PROF_R8(16), PROF_R8(17),
};
_Static_assert(sizeof prof_tramps / sizeof prof_tramps[0] == KERN_PROFILE_MAX_VARIANTS, "one trampoline a slot");

void kern_profile_install(const struct kern_profile_hooks *h)
{
	atomic_store_explicit(&prof_hooks, h, memory_order_release);
}

void kern_profile_set_active(bool on)
{
	atomic_store_explicit(&prof_active, on, memory_order_relaxed);
}

const struct kern_variant *kern_variant_base(const struct kern_variant *v)
{
	for (int i = 0; v && i < KERN_PROFILE_MAX_VARIANTS; i++)
		if (v == &prof_slots[i].v)
			return prof_slots[i].base;
	return v;
}

/* The wrapped copy of v (made once), or v when nothing is installed, v has
 * no run(), or the slots are used up. */
static const struct kern_variant *prof_wrap(const struct kern_op *op, const struct kern_variant *v)
{
	if (!atomic_load_explicit(&prof_hooks, memory_order_acquire) || !v->run)
		return v;
	const struct kern_variant *out = v;
	pthread_mutex_lock(&prof_lock);
	int i = 0;
	while (i < prof_n && prof_slots[i].base != v)
		i++;
	if (i == prof_n && prof_n < KERN_PROFILE_MAX_VARIANTS) {
		prof_slots[i].v = *v;
		prof_slots[i].v.run = KERN_FN(prof_tramps[i]);
		prof_slots[i].base = v;
		prof_slots[i].op = op;
		prof_n++;
	} else if (i == prof_n) {
		static bool warned;
		if (!warned)
			log_msg(LOG_WARN, "kernels", "profile hook: more than %d variants, %s runs unwrapped",
				KERN_PROFILE_MAX_VARIANTS, v->name);
		warned = true;
	}
	if (i < prof_n)
		out = &prof_slots[i].v;
	pthread_mutex_unlock(&prof_lock);
	return out;
}

static enum status select_base(const struct kern_op *op, const struct kern_problem *p, const struct kern_device *dev,
			       const struct kern_disabled *disabled, int layer, const struct kern_variant **out,
			       struct err *e)
{
	const struct kern_variant *best = NULL;
	char reasons[ERR_MSG_BYTES];
	size_t off = 0;
	reasons[0] = '\0';
	*out = NULL;
	for (int i = 0; i < op->n_variants; i++) {
		const struct kern_variant *v = &op->variants[i];
		char why[KERN_REASON_BYTES];
		if (kern_variant_accepts(v, p, dev, disabled, why, sizeof why)) {
			if (!best || v->priority > best->priority)
				best = v;
		} else if (off < sizeof reasons) {
			int k = snprintf(reasons + off, sizeof reasons - off, "%s%s: %s", off ? "; " : "", v->name, why);
			off += k > 0 ? (size_t)k : 0;
		}
	}
	if (!best) {
		char where[32] = "";
		if (layer >= 0)
			snprintf(where, sizeof where, "layer %d, ", layer);
		return err_set(e, ST_UNSUPPORTED, "%sop %s (weights %s) on %s: no variant fits: %s", where, op->name,
			       kern_wfmt_name(p->wfmt), dev->name, op->n_variants ? reasons : "no variants");
	}
	*out = best;
	return ST_OK;
}

enum status kern_select(const struct kern_op *op, const struct kern_problem *p, const struct kern_device *dev,
			const struct kern_disabled *disabled, int layer, const struct kern_variant **out,
			struct err *e)
{
	enum status st = select_base(op, p, dev, disabled, layer, out, e);
	if (st)
		return st;
	if ((*out)->selfcheck_at_load && op->selfcheck && !dev->simulated) {
		/* a variant no device has run yet proves itself here; a drop lasts for this call only
		 * (the caller's list is const), so each layer that would pick it checks it again */
		struct kern_disabled local = {0};
		if (disabled)
			local = *disabled;
		return kern_select_checked(op, p, dev, &local, layer, out, e);
	}
	*out = prof_wrap(op, *out);
	return ST_OK;
}

size_t kern_select_report(const struct kern_op *op, const struct kern_problem *p, const struct kern_device *dev,
			  const struct kern_disabled *disabled, char *buf, size_t n)
{
	const struct kern_variant *best = NULL;
	struct err e = {0};
	if (select_base(op, p, dev, disabled, -1, &best, &e) != ST_OK)
		best = NULL;
	size_t need = 0;
	if (n)
		buf[0] = '\0';
	for (int i = 0; i < op->n_variants; i++) {
		const struct kern_variant *v = &op->variants[i];
		char why[KERN_REASON_BYTES];
		bool ok = kern_variant_accepts(v, p, dev, disabled, why, sizeof why);
		int k = snprintf(need < n ? buf + need : NULL, need < n ? n - need : 0, "  %c %-28s prio %-3d %s%s\n",
				 v == best ? '*' : ' ', v->name, v->priority,
				 v == best ? "chosen" : ok ? "accepted" : "refused: ", ok ? "" : why);
		need += k > 0 ? (size_t)k : 0;
	}
	return need;
}

enum status kern_select_checked(const struct kern_op *op, const struct kern_problem *p,
				const struct kern_device *dev, struct kern_disabled *disabled, int layer,
				const struct kern_variant **out, struct err *e)
{
	for (;;) {
		enum status st = select_base(op, p, dev, disabled, layer, out, e);
		if (st)
			return st;
		if (!op->selfcheck || *out == &op->variants[0]) {
			*out = prof_wrap(op, *out);
			return ST_OK;
		}
		struct err ce = {0};
		if (op->selfcheck(op, *out, p, dev, &ce) == ST_OK) {
			*out = prof_wrap(op, *out);
			return ST_OK;
		}
		log_msg(LOG_WARN, "kernels", "self-check: layer %d op %s: dropping %s: %s", layer, op->name,
			(*out)->name, ce.msg);
		st = kern_disabled_add(disabled, (*out)->name, e);
		if (st)
			return st;
	}
}

enum status kern_prepare_weight(const struct kern_variant *v, const struct kern_wmat *in, struct kern_wmat *out,
				struct err *e)
{
	memset(out, 0, sizeof *out);
	if (v->prepare) {
		enum status st = v->prepare(v, in, out, e);
		if (st)
			return err_prefix(e, "prepare for %s", v->name);
	} else {
		*out = *in;
		out->owned = NULL;
	}
	if (v->wfmt_run != KERN_WFMT_NONE && out->fmt != v->wfmt_run) {
		enum kern_wfmt got = out->fmt;
		kern_wmat_release(out);
		return err_set(e, ST_INVALID, "prepare for %s: produced %s, but its run() takes %s", v->name,
			       kern_wfmt_name(got), kern_wfmt_name(v->wfmt_run));
	}
	return ST_OK;
}

/* ---- comparisons ---- */

bool kern_compare_f32(const float *ref, const float *got, size_t n, double atol, double rtol, char *why,
		      size_t why_bytes)
{
	double amax = 0.0;
	for (size_t i = 0; i < n; i++)
		if (isfinite(ref[i]) && fabs(ref[i]) > amax)
			amax = fabs(ref[i]);
	double tol = atol + rtol * amax;
	for (size_t i = 0; i < n; i++) {
		bool bad = isfinite(ref[i]) ? !isfinite(got[i]) || fabs((double)got[i] - ref[i]) > tol
					    : isfinite(got[i]);
		if (bad)
			return refuse(why, why_bytes, "element %zu: got %.9g, reference %.9g (tolerance %.3g)", i,
				      (double)got[i], (double)ref[i], tol);
	}
	if (why && why_bytes)
		why[0] = '\0';
	return true;
}

/* ---- plans ---- */

void kern_plan_init(struct kern_plan *plan)
{
	memset(plan, 0, sizeof *plan);
}

void kern_plan_free(struct kern_plan *plan)
{
	if (!plan)
		return;
	free(plan->entries);
	memset(plan, 0, sizeof *plan);
}

enum status kern_plan_add(struct kern_plan *plan, int layer, const struct kern_op *op,
			  const struct kern_variant *v, struct err *e)
{
	if (plan->n == plan->cap) {
		int cap = plan->cap ? plan->cap * 2 : 64;
		struct kern_plan_entry *n = realloc(plan->entries, (size_t)cap * sizeof *n);
		if (!n)
			return err_set(e, ST_NOMEM, "kernel plan: %d entries", cap);
		plan->entries = n;
		plan->cap = cap;
	}
	plan->entries[plan->n++] = (struct kern_plan_entry){.layer = layer, .op = op->name, .variant = v->name};
	return ST_OK;
}

size_t kern_plan_metrics(const struct kern_plan *plan, char *buf, size_t n)
{
	size_t need = 0;
	if (n)
		buf[0] = '\0';
	for (int i = 0; i < plan->n; i++) {
		const struct kern_plan_entry *pe = &plan->entries[i];
		char layer[16];
		snprintf(layer, sizeof layer, "%d", pe->layer);
		int k = snprintf(need < n ? buf + need : NULL, need < n ? n - need : 0,
				 "dsv4_kernel_info{layer=\"%s\",op=\"%s\",kernel=\"%s\"} 1\n",
				 pe->layer >= 0 ? layer : "none", pe->op, pe->variant);
		need += k > 0 ? (size_t)k : 0;
	}
	return need;
}

/* The "op=variant op=variant" signature of one layer, in plan order. */
static void layer_signature(const struct kern_plan *plan, int layer, char *buf, size_t n)
{
	size_t off = 0;
	buf[0] = '\0';
	for (int i = 0; i < plan->n && off < n; i++) {
		if (plan->entries[i].layer != layer)
			continue;
		int k = snprintf(buf + off, n - off, "%s%s=%s", off ? " " : "", plan->entries[i].op,
				 plan->entries[i].variant);
		off += k > 0 ? (size_t)k : 0;
	}
}

static void log_range(int first, int last, const char *sig)
{
	if (first < 0)
		log_msg(LOG_INFO, "kernels", "outside layers: %s", sig);
	else if (first == last)
		log_msg(LOG_INFO, "kernels", "layer %d: %s", first, sig);
	else
		log_msg(LOG_INFO, "kernels", "layers %d-%d: %s", first, last, sig);
}

void kern_plan_log(const struct kern_plan *plan)
{
	/* Consecutive layers with the same signature fold into one line. */
	int lo = 0, hi = -1;
	for (int i = 0; i < plan->n; i++) {
		int l = plan->entries[i].layer;
		lo = i == 0 || l < lo ? l : lo;
		hi = i == 0 || l > hi ? l : hi;
	}
	char prev[1024] = "", cur[1024];
	int first = 0, last = 0, have = 0;
	for (int l = lo; l <= hi; l++) {
		layer_signature(plan, l, cur, sizeof cur);
		if (!cur[0])
			continue;
		if (have && l == last + 1 && l > 0 && !strcmp(cur, prev)) {
			last = l;
			continue;
		}
		if (have)
			log_range(first, last, prev);
		snprintf(prev, sizeof prev, "%s", cur);
		first = last = l;
		have = 1;
	}
	if (have)
		log_range(first, last, prev);
}
