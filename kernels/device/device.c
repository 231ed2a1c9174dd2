/*
 * kernels/device/device.c: capability tables and simulated devices, pure C.
 * The CUDA side (detection and probes) is device_cuda.cu; without CUDA the
 * detection entry points say there is no GPU.
 */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"

uint32_t kern_compiled_targets(void)
{
	uint32_t m = 0;
	if (DSV4_HAVE_SM_80)
		m |= KERN_TARGET_SM80;
	if (DSV4_HAVE_SM_90A)
		m |= KERN_TARGET_SM90A;
	if (DSV4_HAVE_SM_100A)
		m |= KERN_TARGET_SM100A;
	if (DSV4_HAVE_SM_120A)
		m |= KERN_TARGET_SM120A;
	if (DSV4_HAVE_SM_121A)
		m |= KERN_TARGET_SM121A;
	return m;
}

void kern_device_cpu(struct kern_device *dev)
{
	memset(dev, 0, sizeof *dev);
	dev->index = -1;
	dev->compiled = kern_compiled_targets();
	snprintf(dev->name, sizeof dev->name, "cpu");
}

uint32_t kern_features_for_cc(int major, int minor)
{
	int cc = major * 10 + minor;
	uint32_t f = 0;
	if (cc >= 80)
		f |= KERN_FEAT_BF16_MMA;
	if (cc >= 89)
		f |= KERN_FEAT_FP8_MMA;
	if (cc >= 90)
		f |= KERN_FEAT_TMA;
	/* Arch-specific ("a") features exist only on their own family. */
	if (cc == 90)
		f |= KERN_FEAT_WGMMA;
	if (cc == 100 || cc == 103)
		f |= KERN_FEAT_TCGEN05;
	if (cc == 120 || cc == 121)
		f |= KERN_FEAT_FP4_MMA_SYNC;
	return f;
}

uint32_t kern_target_native_for_cc(int major, int minor)
{
	switch (major * 10 + minor) {
	case 90: return KERN_TARGET_SM90A;
	case 100: return KERN_TARGET_SM100A;
	case 120: return KERN_TARGET_SM120A;
	case 121: return KERN_TARGET_SM121A;
	default: return 0;
	}
}

void kern_device_simulate(struct kern_device *dev, int major, int minor)
{
	memset(dev, 0, sizeof *dev);
	dev->index = 0;
	dev->cc_major = major;
	dev->cc_minor = minor;
	dev->sm_count = 48;
	dev->mem_bytes = 128ull << 30;
	dev->free_bytes = dev->mem_bytes;
	dev->smem_optin_bytes = major >= 9 ? 227 * 1024 : 99 * 1024;
	dev->features = kern_features_for_cc(major, minor);
	dev->compiled = kern_compiled_targets();
	uint32_t can = kern_target_native_for_cc(major, minor);
	if (major * 10 + minor >= 80)
		can |= KERN_TARGET_SM80;
	dev->loadable = dev->compiled & can;
	dev->simulated = true;
	snprintf(dev->name, sizeof dev->name, "simulated sm_%d%d", major, minor);
}

enum status kern_cc_parse(const char *s, int *major, int *minor, struct err *e)
{
	int ma = 0, mi = 0, n = 0;
	if (!s || sscanf(s, "%d.%d%n", &ma, &mi, &n) != 2 || s[n] != '\0' || ma < 1 || ma > 20 ||
	    mi < 0 || mi > 9)
		return err_set(e, ST_INVALID, "compute capability '%s': expected MAJOR.MINOR such as 9.0 or 12.1",
			       s ? s : "");
	*major = ma;
	*minor = mi;
	return ST_OK;
}

void kern_targets_str(uint32_t mask, char *buf, int n)
{
	static const struct { uint32_t bit; const char *name; } names[] = {
		{KERN_TARGET_SM80, "sm_80"},   {KERN_TARGET_SM90A, "sm_90a"},
		{KERN_TARGET_SM100A, "sm_100a"}, {KERN_TARGET_SM120A, "sm_120a"},
		{KERN_TARGET_SM121A, "sm_121a"},
	};
	int off = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		if (!(mask & names[i].bit) || off >= n)
			continue;
		off += snprintf(buf + off, (size_t)(n - off), "%s%s", off ? "," : "", names[i].name);
	}
	if (!buf[0])
		snprintf(buf, (size_t)n, "none");
}

#if !DSV4_HAVE_CUDA
int kern_device_count(void) { return 0; }

enum status kern_device_detect(int idx, struct kern_device *dev, struct err *e)
{
	kern_device_cpu(dev);
	return err_set(e, ST_UNSUPPORTED, "GPU %d: this dsv4 was built without CUDA", idx);
}
#endif
