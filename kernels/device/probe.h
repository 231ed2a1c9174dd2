/*
 * kernels/device/probe.h: one probe per arch-specific image. Each
 * probe_<target>.cu is compiled for its own target only and exports a
 * function that reports whether its image loads on the current device.
 */
#ifndef DSV4_KERNELS_PROBE_H
#define DSV4_KERNELS_PROBE_H

#include <stdbool.h>
#include <stdint.h>

bool kern_probe_sm80(void);
bool kern_probe_sm90a(void);
bool kern_probe_sm100a(void);
bool kern_probe_sm120a(void);
bool kern_probe_sm121a(void);

/* Mask of compiled targets whose image loads on the current device. */
uint32_t kern_probe_images(uint32_t compiled);

#endif
