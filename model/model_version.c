/*
 * model/model_version.c: the version string every rank and node compares in
 * the bootstrap handshake.
 */
#include "dsv4_config.h"

const char *model_dsv4_version(void) { return DSV4_VERSION; }
