/*
 * kernels/device/graph_cuda.cu: kern_graph (kernels/device/graph.h) over the
 * CUDA runtime's stream capture and executable-graph update.
 */
#include <cuda_runtime.h>
#include <stdlib.h>

extern "C" {
#include "kernels/device/graph.h"
}

/* Distinct keys kept at once: decode batch sizes up to max_num_seqs; the
 * least recently used executable goes when a new key needs room. */
#define GRAPH_SLOTS 64
#define WARM_KEYS 256

struct slot {
	uint64_t key;
	cudaGraphExec_t exec; /* NULL: free */
	uint64_t used;        /* last use, for eviction */
};

struct kern_graph {
	cudaStream_t stream;
	int capturing;
	uint64_t clock;
	struct slot slots[GRAPH_SLOTS];
	uint64_t warm[WARM_KEYS];
	int n_warm;
	struct kern_graph_stats stats;
};

static enum status cerr(cudaError_t ce, const char *what, struct err *e)
{
	if (ce == cudaSuccess)
		return ST_OK;
	cudaGetLastError();
	return err_set(e, ST_CUDA, "CUDA graph: %s: %s", what, cudaGetErrorString(ce));
}

extern "C" enum status kern_graph_create(struct kern_graph **out, const struct kern_mem *m, struct err *e)
{
	*out = NULL;
	if (!m->device || !m->stream)
		return err_set(e, ST_UNSUPPORTED, "CUDA graphs need a device stream of its own");
	struct kern_graph *g = (struct kern_graph *)calloc(1, sizeof *g);
	if (!g)
		return err_set(e, ST_NOMEM, "CUDA graph cache");
	g->stream = (cudaStream_t)m->stream;
	*out = g;
	return ST_OK;
}

extern "C" void kern_graph_destroy(struct kern_graph *g)
{
	if (!g)
		return;
	if (g->capturing) {
		cudaGraph_t gr = NULL;
		if (cudaStreamEndCapture(g->stream, &gr) == cudaSuccess && gr)
			cudaGraphDestroy(gr);
		cudaGetLastError();
	}
	for (int i = 0; i < GRAPH_SLOTS; i++)
		if (g->slots[i].exec)
			cudaGraphExecDestroy(g->slots[i].exec);
	free(g);
}

extern "C" bool kern_graph_warm(struct kern_graph *g, uint64_t key)
{
	for (int i = 0; i < g->n_warm; i++)
		if (g->warm[i] == key)
			return true;
	g->stats.warmups++;
	if (g->n_warm < WARM_KEYS)
		g->warm[g->n_warm++] = key;
	return false;
}

extern "C" enum status kern_graph_begin(struct kern_graph *g, struct err *e)
{
	if (g->capturing)
		return err_set(e, ST_INVALID, "CUDA graph: a capture is already open");
	enum status st = cerr(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal), "begin capture", e);
	g->capturing = !st;
	return st;
}

static struct slot *find(struct kern_graph *g, uint64_t key)
{
	for (int i = 0; i < GRAPH_SLOTS; i++)
		if (g->slots[i].exec && g->slots[i].key == key)
			return &g->slots[i];
	return NULL;
}

static struct slot *take(struct kern_graph *g)
{
	struct slot *v = &g->slots[0];
	for (int i = 0; i < GRAPH_SLOTS; i++) {
		if (!g->slots[i].exec)
			return &g->slots[i];
		if (g->slots[i].used < v->used)
			v = &g->slots[i];
	}
	cudaGraphExecDestroy(v->exec);
	v->exec = NULL;
	return v;
}

extern "C" enum status kern_graph_end(struct kern_graph *g, uint64_t key, int ok, struct err *e)
{
	if (!g->capturing)
		return err_set(e, ST_INVALID, "CUDA graph: no capture is open");
	g->capturing = 0;
	cudaGraph_t gr = NULL;
	cudaError_t ce = cudaStreamEndCapture(g->stream, &gr);
	if (!ok) {
		if (gr)
			cudaGraphDestroy(gr);
		cudaGetLastError();
		return ST_OK;
	}
	if (ce != cudaSuccess || !gr) {
		if (gr)
			cudaGraphDestroy(gr);
		return cerr(ce != cudaSuccess ? ce : cudaErrorStreamCaptureInvalidated, "end capture", e);
	}
	g->stats.captures++;
	/* the same key with another node count is another topology (a
	 * compressor window that closes in this step): keep both executables
	 * rather than re-instantiating one back and forth */
	size_t n_nodes = 0;
	if (cudaGraphGetNodes(gr, NULL, &n_nodes) != cudaSuccess)
		cudaGetLastError();
	key = key * 0x9E3779B97F4A7C15ull ^ (uint64_t)n_nodes;
	struct slot *s = find(g, key);
	enum status st = ST_OK;
	if (s) {
		cudaGraphExecUpdateResultInfo info;
		if (cudaGraphExecUpdate(s->exec, gr, &info) == cudaSuccess) {
			g->stats.updates++;
		} else {
			cudaGetLastError(); /* topology changed: a new executable for this key */
			cudaGraphExecDestroy(s->exec);
			s->exec = NULL;
		}
	}
	if (!s || !s->exec) {
		if (!s)
			s = take(g);
		st = cerr(cudaGraphInstantiate(&s->exec, gr, 0), "instantiate", e);
		if (st)
			s->exec = NULL;
		else
			g->stats.instantiates++;
		s->key = key;
	}
	if (!st) {
		s->used = ++g->clock;
		st = cerr(cudaGraphLaunch(s->exec, g->stream), "launch", e);
	}
	cudaGraphDestroy(gr);
	return st;
}

extern "C" void kern_graph_get_stats(const struct kern_graph *g, struct kern_graph_stats *out)
{
	*out = g->stats;
}
