/*
 * kernels/device/graph.c: the stand-in of kernels/device/graph_cuda.cu in
 * builds without CUDA: there are no graphs to make, so creating a cache is
 * ST_UNSUPPORTED (the executor then runs every step eagerly).
 */
#include "kernels/device/graph.h"

#include "dsv4_config.h"

#if !DSV4_HAVE_CUDA
enum status kern_graph_create(struct kern_graph **out, const struct kern_mem *m, struct err *e)
{
	(void)m;
	*out = NULL;
	return err_set(e, ST_UNSUPPORTED, "CUDA graphs: this binary was built without CUDA");
}

void kern_graph_destroy(struct kern_graph *g)
{
	(void)g;
}

bool kern_graph_warm(struct kern_graph *g, uint64_t key)
{
	(void)g, (void)key;
	return false;
}

enum status kern_graph_begin(struct kern_graph *g, struct err *e)
{
	(void)g;
	return err_set(e, ST_UNSUPPORTED, "CUDA graphs: this binary was built without CUDA");
}

enum status kern_graph_end(struct kern_graph *g, uint64_t key, int ok, struct err *e)
{
	(void)g, (void)key, (void)ok;
	return err_set(e, ST_UNSUPPORTED, "CUDA graphs: this binary was built without CUDA");
}

void kern_graph_get_stats(const struct kern_graph *g, struct kern_graph_stats *out)
{
	(void)g;
	*out = (struct kern_graph_stats){0};
}
#endif
