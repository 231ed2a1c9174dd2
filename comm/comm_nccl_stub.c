/*
 * comm/comm_nccl_stub.c: the NCCL entry points of a build without CUDA.
 *
 * meson compiles this file instead of comm_nccl.c when CUDA is disabled, so
 * that callers need no #ifdef: asking for NCCL is a clear ST_UNSUPPORTED.
 */
#include "comm/comm.h"

enum status comm_nccl_unique_id(uint8_t id[COMM_UNIQUE_ID_BYTES], struct err *e)
{
	(void)id;
	return err_set(e, ST_UNSUPPORTED, "comm nccl: this dsv4 was built without CUDA (meson -Dcuda=disabled)");
}

enum status comm_nccl_create(struct comm **out, const struct comm_nccl_options *opt, struct err *e)
{
	(void)opt;
	*out = NULL;
	return err_set(e, ST_UNSUPPORTED, "comm nccl: this dsv4 was built without CUDA (meson -Dcuda=disabled)");
}
