/*
 * kernels/device/graph.h: CUDA graphs for repeated steps of one stream.
 *
 * A decode step launches hundreds of small kernels; issued one by one, the
 * GPU idles between them while the host launches the next. Here the work of
 * a step is captured from its stream (every op keeps launching exactly as it
 * does eagerly, so the captured graph is by construction the step's own
 * work) and replayed as one graph launch. Graphs are cached under a key the
 * caller chooses (the step's shape: batch size); the next capture under the
 * same key updates the cached executable in place (cudaGraphExecUpdate:
 * only the kernels' parameters and copy sizes change between decode steps),
 * which costs far less than instantiating, and a capture whose topology
 * differs (a compressor window that closes in this step only) instantiates
 * anew. Nothing inside a captured region may synchronise the stream or
 * allocate: the forward pass already keeps every value on the device within
 * a step (model/forward.c).
 */
#ifndef DSV4_KERNELS_GRAPH_H
#define DSV4_KERNELS_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/device/mem.h"

struct kern_graph;

struct kern_graph_stats {
	uint64_t captures;     /* regions captured */
	uint64_t updates;      /* replayed through an in-place update of a cached executable */
	uint64_t instantiates; /* a new executable (first of a key, or a topology change) */
	uint64_t warmups;      /* regions run eagerly because their key was new (kern_graph_warm) */
};

/* A graph cache for the stream of m (a device kern_mem). ST_UNSUPPORTED
 * without CUDA or for a host kern_mem. */
enum status kern_graph_create(struct kern_graph **out, const struct kern_mem *m, struct err *e) DSV4_WUR;
void kern_graph_destroy(struct kern_graph *g);

/* Whether key was seen before (and remember it). The first region of a key
 * runs eagerly: kernels that set themselves up on their first call with a
 * shape (a cuBLASLt plan, a workspace that grows) must not do that inside a
 * capture, where allocating or synchronising invalidates it. */
bool kern_graph_warm(struct kern_graph *g, uint64_t key);

/* Start capturing the stream's work (thread-local mode: other threads'
 * CUDA calls are unaffected). */
enum status kern_graph_begin(struct kern_graph *g, struct err *e) DSV4_WUR;

/* End the capture begun last and, when ok, launch it under key (a cached
 * executable of the same key and node count updated in place, or a new one). When !ok (the region failed
 * part-way) the capture is discarded and nothing runs. A capture the CUDA
 * runtime invalidated (something in the region synchronised) is an error. */
enum status kern_graph_end(struct kern_graph *g, uint64_t key, int ok, struct err *e) DSV4_WUR;

void kern_graph_get_stats(const struct kern_graph *g, struct kern_graph_stats *out);

#endif
