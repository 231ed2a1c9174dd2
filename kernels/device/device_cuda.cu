/*
 * kernels/device/device_cuda.cu: CUDA device detection and the image probe.
 *
 * The probe asks the runtime for the attributes of one tiny kernel from each
 * arch-specific image (probe_<target>.cu). cudaFuncGetAttributes fails with
 * cudaErrorNoKernelImageForDevice (or InvalidDeviceFunction) when the image
 * cannot run here; that is what demotes a variant whose guard was wrong.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "kernels/device/device.h"
#include "kernels/device/probe.h"
}

extern "C" int kern_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError(); /* clear: no driver / no GPU is not an error here */
		return 0;
	}
	return n;
}

extern "C" enum status kern_device_detect(int idx, struct kern_device *dev, struct err *e)
{
	kern_device_cpu(dev);
	int n = kern_device_count();
	if (idx < 0 || idx >= n)
		return err_set(e, ST_NOTFOUND, "GPU %d: not present (%d CUDA device(s) visible)", idx, n);
	cudaDeviceProp p;
	cudaError_t ce = cudaGetDeviceProperties(&p, idx);
	if (ce != cudaSuccess)
		return err_set(e, ST_CUDA, "GPU %d: cudaGetDeviceProperties: %s", idx, cudaGetErrorString(ce));
	ce = cudaSetDevice(idx);
	if (ce != cudaSuccess)
		return err_set(e, ST_CUDA, "GPU %d: cudaSetDevice: %s", idx, cudaGetErrorString(ce));
	dev->index = idx;
	dev->cc_major = p.major;
	dev->cc_minor = p.minor;
	dev->sm_count = p.multiProcessorCount;
	dev->mem_bytes = p.totalGlobalMem;
	dev->smem_optin_bytes = (int)p.sharedMemPerBlockOptin;
	size_t fr = 0, tot = 0;
	if (cudaMemGetInfo(&fr, &tot) == cudaSuccess)
		dev->free_bytes = fr;
	dev->features = kern_features_for_cc(p.major, p.minor);
	snprintf(dev->name, sizeof dev->name, "%s", p.name);
	dev->loadable = kern_probe_images(dev->compiled);
	return ST_OK;
}
