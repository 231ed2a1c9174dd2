/*
 * tests/tiny_dir.h: the tiny checkpoints every model-level test uses,
 * generated once per build directory by scripts/make_tiny_model --variant all
 * under a file lock (tests run in parallel; tests/server/test_kernels_cli.py
 * and tests/model/test_generate.py take the same lock from Python).
 */
#ifndef DSV4_TESTS_TINY_DIR_H
#define DSV4_TESTS_TINY_DIR_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* The directory holding tiny-{bf16,fp8,nvfp4,fp8-deq,nvfp4-deq}, generating
 * it when needed; NULL when that is impossible (the test then skips). */
static inline const char *fh_tiny_dir(void)
{
	static char dir[1024];
	const char *env = getenv("DSV4_TINY_DIR");
	if (env && *env)
		return env;
	const char *src = getenv("DSV4_SOURCE_ROOT"), *bld = getenv("DSV4_BUILD_ROOT");
	if (!src || !bld)
		return NULL;
	snprintf(dir, sizeof dir, "%s/tiny-models", bld);
	char stamp[1200];
	snprintf(stamp, sizeof stamp, "%s/tiny-nvfp4-deq/.make_tiny_model.stamp", dir);
	struct stat sb;
	if (stat(stamp, &sb) == 0)
		return dir;
	/* tests run in parallel: one generates, the others wait on the lock */
	char lock[1200];
	snprintf(lock, sizeof lock, "%s.lock", dir);
	int fd = open(lock, O_CREAT | O_RDWR, 0644);
	if (fd < 0 || flock(fd, LOCK_EX) != 0) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	int rc = 0;
	if (stat(stamp, &sb) != 0) {
		char cmd[4096];
		snprintf(cmd, sizeof cmd,
			 "'%s/.venv/bin/python3' '%s/scripts/make_tiny_model' --variant all --out '%s' >/dev/null", src, src,
			 dir);
		rc = system(cmd);
	}
	flock(fd, LOCK_UN);
	close(fd);
	return rc == 0 && stat(stamp, &sb) == 0 ? dir : NULL;
}

#endif
