/*
 * tests/kernels/test_device.c: capability tables and simulated devices.
 * Runs without a GPU; the real detection is exercised by the gpu suite.
 */
#include "kernels/device/device.h"
#include "tests/test.h"

int main(void)
{
	struct kern_device d;
	struct err e;
	int ma, mi;
	T_CHECK(kern_cc_parse("12.1", &ma, &mi, &e) == ST_OK && ma == 12 && mi == 1);
	T_CHECK(kern_cc_parse("9.0", &ma, &mi, &e) == ST_OK && ma == 9 && mi == 0);
	T_CHECK(kern_cc_parse("9", &ma, &mi, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "'9'");
	T_CHECK(kern_cc_parse("9.0x", &ma, &mi, &e) == ST_INVALID);
	T_CHECK(kern_cc_parse("", &ma, &mi, &e) == ST_INVALID);
	T_CHECK(kern_cc_parse(NULL, &ma, &mi, &e) == ST_INVALID);

	/* Arch-specific features belong to one family only. */
	T_CHECK(kern_features_for_cc(9, 0) & KERN_FEAT_WGMMA);
	T_CHECK(!(kern_features_for_cc(10, 0) & KERN_FEAT_WGMMA));
	T_CHECK(kern_features_for_cc(10, 0) & KERN_FEAT_TCGEN05);
	T_CHECK(!(kern_features_for_cc(12, 1) & KERN_FEAT_TCGEN05));
	T_CHECK(kern_features_for_cc(12, 1) & KERN_FEAT_FP4_MMA_SYNC);
	T_CHECK(!(kern_features_for_cc(8, 0) & KERN_FEAT_FP8_MMA));
	T_CHECK(kern_features_for_cc(8, 9) & KERN_FEAT_FP8_MMA);

	/* A simulated GB10 can load only the sm_121a and generic images. */
	kern_device_simulate(&d, 12, 1);
	T_CHECK(d.simulated);
	T_CHECK(!(d.loadable & (KERN_TARGET_SM100A | KERN_TARGET_SM90A | KERN_TARGET_SM120A)));
	T_CHECK((d.loadable & ~d.compiled) == 0);
	if (d.compiled & KERN_TARGET_SM121A)
		T_CHECK(d.loadable & KERN_TARGET_SM121A);
	kern_device_simulate(&d, 7, 5);
	T_CHECK(d.loadable == 0);

	char buf[64];
	kern_targets_str(KERN_TARGET_SM80 | KERN_TARGET_SM121A, buf, sizeof buf);
	T_CHECK(!strcmp(buf, "sm_80,sm_121a"));
	kern_targets_str(0, buf, sizeof buf);
	T_CHECK(!strcmp(buf, "none"));

	kern_device_cpu(&d);
	T_CHECK(d.index == -1 && d.cc_major == 0 && d.features == 0);
	T_CHECK(kern_device_count() >= 0);
	return test_exit();
}
