/*
 * kernels/device/probe_images.cu: run the probe of every compiled image.
 */
#include <stdint.h>

extern "C" {
#include "dsv4_config.h"
#include "kernels/device/device.h"
#include "kernels/device/probe.h"
}

extern "C" uint32_t kern_probe_images(uint32_t compiled)
{
	uint32_t ok = 0;
#if DSV4_HAVE_SM_80
	if ((compiled & KERN_TARGET_SM80) && kern_probe_sm80())
		ok |= KERN_TARGET_SM80;
#endif
#if DSV4_HAVE_SM_90A
	if ((compiled & KERN_TARGET_SM90A) && kern_probe_sm90a())
		ok |= KERN_TARGET_SM90A;
#endif
#if DSV4_HAVE_SM_100A
	if ((compiled & KERN_TARGET_SM100A) && kern_probe_sm100a())
		ok |= KERN_TARGET_SM100A;
#endif
#if DSV4_HAVE_SM_120A
	if ((compiled & KERN_TARGET_SM120A) && kern_probe_sm120a())
		ok |= KERN_TARGET_SM120A;
#endif
#if DSV4_HAVE_SM_121A
	if ((compiled & KERN_TARGET_SM121A) && kern_probe_sm121a())
		ok |= KERN_TARGET_SM121A;
#endif
	return ok;
}
