/*
 * kernels/registry/registry.h: guarded kernel variants per op, and the load-
 * time selection that picks one per layer (design.md "Load time is where
 * decisions are made"; style.md rules 8-10).
 *
 * An op (linear, moe_gemm, rms_norm, ...) is one `const struct kern_op`,
 * defined in its own folder next to its reference implementation, holding a
 * table of `struct kern_variant`. Each variant declares its guard as data and
 * code: backend, capability range, the arch image it lives in, required
 * features, accepted weight formats, a supports() shape check, a priority,
 * prepare() (weight layout conversion at load) and run(). Entry 0 of every
 * table is the CPU reference, so selection never fails on the CPU.
 *
 * kern_select() applies, in this order, and records the first refusal reason
 * of every variant:
 *   1. disabled (DSV4_DISABLED_KERNELS, --disable-kernel, or dropped by self-check)
 *   2. backend matches the device (CPU device: cpu variants; GPU: cuda variants)
 *   3. cc_min <= cc <= cc_max
 *   4. the variant's image is in dev->loadable (the probe; an sm_100a image on
 *      sm_121 is refused here even if a cc range were wrong), and its run()
 *      is compiled into this binary
 *   5. required features present
 *   6. the stored weight format is one the variant accepts
 *   7. supports(problem, device) (shape limits, TP size), with its reason
 * and returns the accepted variant with the highest priority (ties: the
 * earlier entry). The hot path never comes back here: callers keep the
 * returned pointer (and the function pointer in it) in their layer plan.
 *
 * Thread rules: the tables are const; kern_select and the plan helpers touch
 * only their arguments, so any thread may call them.
 */
#ifndef DSV4_KERNELS_REGISTRY_H
#define DSV4_KERNELS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/device/device.h"
#include "kernels/quant/wmat.h"

#define KERN_NAME_BYTES 48       /* longest variant/op name + NUL */
#define KERN_REASON_BYTES 160    /* one refusal reason */
#define KERN_MAX_DISABLED 64     /* entries in a disable list */
#define KERN_CC_ANY 999          /* cc_max meaning "no upper limit" */

enum kern_backend {
	KERN_BACKEND_CPU = 0,
	KERN_BACKEND_CUDA = 1,
};

/* The problem one selection is about. The registry reads wfmt and tp_size;
 * `shape` points at the op's own shape struct (struct kern_linear_shape,
 * ...), which only that op's supports() functions interpret. */
struct kern_problem {
	enum kern_wfmt wfmt;   /* stored weight format, KERN_WFMT_NONE if the op has no weights */
	int tp_size;           /* tensor-parallel ranks (1 = none) */
	const void *shape;     /* op-specific, may be NULL */
};

/* A generic function pointer: each op casts run/run_host back to its own
 * exact type (for example kern_linear_fn) before calling. Converting through
 * void (*)(void) is the one cast -Wcast-function-type allows. */
typedef void (*kern_fn)(void);
#define KERN_FN(f) ((kern_fn)(f))

/* ---- table rows ----
 * Each variant is one row of its op's table: a KERN_ROW_* macro fills the
 * fields most rows share, and the row adds its own (wfmt_accept, supports,
 * prepare, desc, ...) as designated initialisers. A CUDA row's functions
 * exist only where this binary has its image: HAVE is that image's
 * DSV4_HAVE_* flag (0 or 1), and with 0 run and run_host are NULL, which
 * kern_select reports as "not compiled". H is NULL for rows without a
 * host-buffer entry. */
#define KERN_FN_IF(HAVE, f) ((HAVE) ? KERN_FN(f) : NULL)
/* Entry 0 of every table: the CPU reference REF, priority 0, run and run_host both REF. */
#define KERN_ROW_CPU_REF(NAME, REF, ...)                                                                      \
	{.name = (NAME), .backend = KERN_BACKEND_CPU, .priority = 0, .run = KERN_FN(REF), .run_host = KERN_FN(REF), \
	 __VA_ARGS__}
/* A CUDA variant for cc CC_MIN..CC_MAX whose code lives in image TGT. */
#define KERN_ROW_CUDA(NAME, CC_MIN, CC_MAX, TGT, PRIO, HAVE, R, H, ...)                                        \
	{.name = (NAME), .backend = KERN_BACKEND_CUDA, .cc_min = (CC_MIN), .cc_max = (CC_MAX), .target = (TGT),     \
	 .priority = (PRIO), .run = KERN_FN_IF(HAVE, R), .run_host = KERN_FN_IF(HAVE, H), __VA_ARGS__}
/* The common CUDA row: the generic sm_80 image, every cc >= 8.0, in every CUDA build. */
#define KERN_ROW_SM80(NAME, PRIO, R, H, ...) \
	KERN_ROW_CUDA(NAME, 80, KERN_CC_ANY, KERN_TARGET_SM80, PRIO, DSV4_HAVE_CUDA, R, H, __VA_ARGS__)

struct kern_variant;
struct kern_op;

/* supports(): return true to accept; on refusal write a short reason into
 * why[why_bytes] ("in % 128 != 0"). Optional (NULL: any shape). */
typedef bool (*kern_supports_fn)(const struct kern_problem *p, const struct kern_device *dev, char *why,
				 size_t why_bytes);

/* prepare(): convert one stored weight matrix into the layout run() consumes,
 * in host memory (the loader uploads the result for CUDA variants). The
 * output may alias the input's data and owns only what it allocated (release
 * with kern_wmat_release). Optional (NULL: the stored view is used as is). */
typedef enum status (*kern_prepare_fn)(const struct kern_variant *v, const struct kern_wmat *in,
				       struct kern_wmat *out, struct err *e);

struct kern_variant {
	const char *name;          /* unique across all ops: "linear_cpu_ref", "linear_cuda_generic" */
	enum kern_backend backend;
	int cc_min, cc_max;        /* major*10+minor, inclusive; 0..0 for CPU variants; KERN_CC_ANY */
	uint32_t target;           /* enum kern_target image run() lives in; 0 for CPU */
	uint32_t features;         /* enum kern_feature bits required */
	uint32_t wfmt_accept;      /* KERN_WFMT_BIT() mask of stored formats accepted; 0 = op has no weights */
	enum kern_wfmt wfmt_run;   /* format run() receives after prepare(); KERN_WFMT_NONE: the stored one */
	int priority;              /* higher wins; the CPU reference is 0 */
	kern_supports_fn supports; /* optional */
	kern_prepare_fn prepare;   /* optional */
	kern_fn run;               /* the op's run type; NULL when not compiled into this binary */
	kern_fn run_host;          /* optional: same contract on host-resident buffers (copies in/out);
				    * used by self-checks and tests. CPU variants: same as run. */
	const char *desc;          /* one line for `dsv4 kernels --list` */
};

/* Optional per-op self-check: run variant v on a small random problem shaped
 * like p against the op's reference (entry 0) and return ST_OK if they agree;
 * otherwise ST_INVALID with the disagreement in e. */
typedef enum status (*kern_selfcheck_fn)(const struct kern_op *op, const struct kern_variant *v,
					 const struct kern_problem *p, const struct kern_device *dev, struct err *e);

struct kern_op {
	const char *name;                    /* "linear", "moe_gemm", "rms_norm" */
	const struct kern_variant *variants; /* [n_variants]; [0] is the CPU reference */
	int n_variants;
	kern_selfcheck_fn selfcheck;         /* optional */
};

/* ---- disable lists ---- */

struct kern_disabled {
	int n;
	char names[KERN_MAX_DISABLED][KERN_NAME_BYTES];
};

/* Start a list from a comma-separated string (may be NULL or empty) and,
 * when read_env, from $DSV4_DISABLED_KERNELS as well. Whitespace around
 * names is ignored. ST_INVALID if a name is too long or the list overflows. */
enum status kern_disabled_init(struct kern_disabled *d, const char *list, bool read_env, struct err *e) DSV4_WUR;
/* Add one name (idempotent). */
enum status kern_disabled_add(struct kern_disabled *d, const char *name, struct err *e) DSV4_WUR;
bool kern_disabled_has(const struct kern_disabled *d, const char *name);
/* ST_NOTFOUND naming the first entry that is no variant of any op in
 * ops[n_ops] (catches typos in --disable-kernel). */
enum status kern_disabled_check(const struct kern_disabled *d, const struct kern_op *const *ops, int n_ops,
				struct err *e) DSV4_WUR;

/* ---- selection ---- */

/* Why variant v would be refused for p on dev: returns true (accepted) or
 * false with the reason in why. disabled may be NULL. */
bool kern_variant_accepts(const struct kern_variant *v, const struct kern_problem *p,
			  const struct kern_device *dev, const struct kern_disabled *disabled, char *why,
			  size_t why_bytes);

/* Pick the best accepted variant of op for p on dev. layer (-1: not a layer
 * op) is only used in the error, which names layer, op and every variant's
 * reason: "layer 3, op linear (wfmt nvfp4): no variant fits: linear_cpu_ref:
 * weight format nvfp4 not accepted; ...". */
enum status kern_select(const struct kern_op *op, const struct kern_problem *p, const struct kern_device *dev,
			const struct kern_disabled *disabled, int layer, const struct kern_variant **out,
			struct err *e) DSV4_WUR;

/* Every variant of op with its verdict for p on dev, one line each
 * ("  * linear_cuda_generic     prio 10  chosen" / "    linear_cpu_ref  prio 0
 * refused: cpu variant, gpu device"), for `dsv4 kernels` and start-up
 * failures whose one-line error was truncated. Returns the length needed. */
size_t kern_select_report(const struct kern_op *op, const struct kern_problem *p, const struct kern_device *dev,
			  const struct kern_disabled *disabled, char *buf, size_t n);

/* kern_select, then (when the op has a self-check and the pick is not the
 * reference) self-check it; a variant that disagrees is added to *disabled,
 * logged at WARN with the reason, and selection repeats. */
enum status kern_select_checked(const struct kern_op *op, const struct kern_problem *p,
				const struct kern_device *dev, struct kern_disabled *disabled, int layer,
				const struct kern_variant **out, struct err *e) DSV4_WUR;

/* Apply v's prepare to one stored matrix (or copy the view when it has none),
 * then check that the result's format is v->wfmt_run: the coupling of
 * selection and conversion that vLLM #54125 lacked. */
enum status kern_prepare_weight(const struct kern_variant *v, const struct kern_wmat *in, struct kern_wmat *out,
				struct err *e) DSV4_WUR;

/* ---- comparing a variant with its reference ---- */

/* true when every got[i] is finite where ref[i] is, and
 * |got[i] - ref[i]| <= atol + rtol * max_j |ref[j]| (a tolerance scaled by the
 * output's magnitude, which is what block-scaled GEMMs can promise). On
 * failure why names the first bad index and both values. */
bool kern_compare_f32(const float *ref, const float *got, size_t n, double atol, double rtol, char *why,
		      size_t why_bytes);

/* ---- plans ---- */

/* One selection, for logging and for /metrics' dsv4_kernel_info{layer,op,kernel}. */
struct kern_plan_entry {
	int layer;           /* -1 for ops outside layers (embedding, head, sampling) */
	const char *op;      /* static: the op table's name */
	const char *variant; /* static: the variant's name */
};

struct kern_plan {
	int n, cap;
	struct kern_plan_entry *entries; /* owned */
};

void kern_plan_init(struct kern_plan *plan);
void kern_plan_free(struct kern_plan *plan);
enum status kern_plan_add(struct kern_plan *plan, int layer, const struct kern_op *op,
			  const struct kern_variant *v, struct err *e) DSV4_WUR;
/* Prometheus lines `dsv4_kernel_info{layer="3",op="linear",kernel="linear_cpu_ref"} 1\n`
 * into buf (NUL-terminated, truncated to n). Returns the length it needed. */
size_t kern_plan_metrics(const struct kern_plan *plan, char *buf, size_t n);
/* One log line per distinct per-layer plan: "layers 3-42: linear=linear_cpu_ref moe_gemm=...". */
void kern_plan_log(const struct kern_plan *plan);

/* ---- profiling hook (dsv4 bench decode: per-op timing, routing capture) ----
 *
 * kern_profile_install(h) makes every LATER kern_select / kern_select_checked
 * return a registry-owned copy of the chosen variant (one per variant, so
 * pointer equality between selections still holds) whose run() calls
 * h->before, the variant's own run() and h->after, the latter two only while
 * kern_profile_set_active(true). Without an install nothing changes: the
 * selections are the const table entries and a run() costs what it did;
 * installed but inactive, a call costs one extra indirect call. Plans built
 * before the install are untouched, so install before creating the executor
 * and keep h alive while it runs. A copy's run_host, guards and name are the
 * original's; kern_variant_base() gives the table entry back (code that
 * compares run pointers must compare the base's). At most
 * KERN_PROFILE_MAX_VARIANTS distinct variants are wrapped; later ones run
 * unwrapped (logged once). Not for serving: one process-wide hook. */
#define KERN_PROFILE_MAX_VARIANTS 128

struct kern_profile_hooks {
	void *user;
	/* args is the op's own argument struct (struct kern_linear_args * for
	 * op "linear", ...); base is the table entry that runs. */
	void (*before)(void *user, const struct kern_op *op, const struct kern_variant *base, const void *args);
	void (*after)(void *user, const struct kern_op *op, const struct kern_variant *base, const void *args,
		      enum status st);
};

/* Install (h non-NULL) or remove (NULL: later selections return table
 * entries again; existing wrapped plans keep calling through h, which must
 * then stay valid, or run unhooked when inactive). */
void kern_profile_install(const struct kern_profile_hooks *h);
void kern_profile_set_active(bool on);
/* The table entry a selection stands for (v itself when it is one). */
const struct kern_variant *kern_variant_base(const struct kern_variant *v);

/* ---- the op list ---- */

/* Every op table linked into the binary (for --list, name checks and tests). */
const struct kern_op *const *kern_registry_ops(int *n_ops);
/* The op named name, or NULL. */
const struct kern_op *kern_registry_find_op(const char *name);

#endif
