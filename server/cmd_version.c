/*
 * server/cmd_version.c: `dsv4 version`.
 */
#include <stdio.h>

#include "cli.h"
#include "dsv4_config.h"
#include "kernels/device/device.h"

int cmd_version(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	char targets[128];
	kern_targets_str(kern_compiled_targets(), targets, sizeof targets);
	printf("dsv4 %s\ncuda: %s\ncuda targets: %s\ngpus visible: %d\n", DSV4_VERSION,
	       DSV4_HAVE_CUDA ? "yes" : "no", targets, kern_device_count());
	return CLI_EXIT_OK;
}
