/*
 * kernels/device/device.h: what the device we run on can do.
 *
 * A struct kern_device describes one GPU (or the CPU, cc 0.0): its compute
 * capability, size, the instruction features that follow from the
 * capability, and which of the binary's arch-specific images actually load
 * on it (the probe: an sm_100a image must be refused on sm_121 even if a
 * guard were wrong). Selection (the registry) reads only this struct, so CI
 * can run it against simulated devices (kern_device_simulate).
 */
#ifndef DSV4_KERNELS_DEVICE_H
#define DSV4_KERNELS_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

/* Arch-specific images the binary may contain. */
enum kern_target {
	KERN_TARGET_SM80 = 1u << 0,   /* generic: sm_80 SASS + PTX, runs on every cc >= 8.0 */
	KERN_TARGET_SM90A = 1u << 1,  /* Hopper only (wgmma) */
	KERN_TARGET_SM100A = 1u << 2, /* datacenter Blackwell only (tcgen05) */
	KERN_TARGET_SM120A = 1u << 3, /* RTX Blackwell */
	KERN_TARGET_SM121A = 1u << 4, /* GB10 / DGX Spark */
};

/* Instruction features, derived from the capability (not from the name). */
enum kern_feature {
	KERN_FEAT_BF16_MMA = 1u << 0,     /* mma.sync bf16 (cc >= 8.0) */
	KERN_FEAT_FP8_MMA = 1u << 1,      /* fp8 mma.sync / cuBLASLt fp8 (cc >= 8.9) */
	KERN_FEAT_WGMMA = 1u << 2,        /* warpgroup mma (sm_90a only) */
	KERN_FEAT_TMA = 1u << 3,          /* tensor memory accelerator (cc >= 9.0) */
	KERN_FEAT_TCGEN05 = 1u << 4,      /* 5th-gen tensor cores (sm_100a/sm_103a) */
	KERN_FEAT_FP4_MMA_SYNC = 1u << 5, /* block-scaled fp4 mma.sync (sm_120a/sm_121a) */
};

struct kern_device {
	int index;               /* CUDA ordinal, -1 for the CPU */
	int cc_major, cc_minor;  /* 0.0 for the CPU */
	int sm_count;
	uint64_t mem_bytes;      /* total device memory */
	uint64_t free_bytes;     /* free at detection */
	int smem_optin_bytes;    /* max dynamic shared memory per block */
	uint32_t features;       /* enum kern_feature */
	uint32_t compiled;       /* enum kern_target: images present in the binary */
	uint32_t loadable;       /* enum kern_target: images that the probe loaded */
	bool simulated;          /* built by kern_device_simulate, nothing probed */
	char name[128];
};

/* Images compiled into this binary (from dsv4_config.h). */
uint32_t kern_compiled_targets(void);

/* The CPU as a device (cc 0.0, no features). */
void kern_device_cpu(struct kern_device *dev);

/* Features that compute capability major.minor has. */
uint32_t kern_features_for_cc(int major, int minor);

/* Which arch-specific target a capability would need (0 if none exists). */
uint32_t kern_target_native_for_cc(int major, int minor);

/* A device that pretends to be cc major.minor; loadable = the compiled
 * images a real device of that capability could load (native target and
 * generic). Used by --simulate-cc and by tests. */
void kern_device_simulate(struct kern_device *dev, int major, int minor);

/* Parse "12.1" into major/minor. */
enum status kern_cc_parse(const char *s, int *major, int *minor, struct err *e) DSV4_WUR;

/* Number of CUDA devices, 0 without CUDA or without a GPU (never an error). */
int kern_device_count(void);

/* Detect CUDA device ordinal idx and probe each compiled image on it. */
enum status kern_device_detect(int idx, struct kern_device *dev, struct err *e) DSV4_WUR;

/* Human-readable list of targets in mask, "sm_80,sm_90a". */
void kern_targets_str(uint32_t mask, char *buf, int n);

#endif
