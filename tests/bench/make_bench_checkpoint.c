/*
 * tests/bench/make_bench_checkpoint.c: writes a real-dimension checkpoint of
 * N layers, in the real layout, for the load benchmark (scripts/bench_load).
 *
 *   make_bench_checkpoint CONFIG.json N_LAYERS OUT_DIR TOKENIZER_DIR
 *
 * The weights must come from somewhere and never from a hub: the real config
 * with its first N layers (--hf-overrides' merge, model/config_overrides.h)
 * goes to OUT_DIR/config.json, the tokenizer files beside it, and the tensors
 * are those of `--load-format dummy` on that directory (model/dummy.h: the
 * schema's names, shapes and stored formats, deterministic finite values),
 * written out as safetensors shards of at most 4 GiB with an index, as the
 * released checkpoints are. Loading the result gives the same bytes as the
 * dummy load of the same config and seed.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/checkpoint.h"
#include "model/config_overrides.h"
#include "model/dummy.h"

#define SHARD_MAX_BYTES ((uint64_t)4 << 30)
#define SEED 0

static char *read_file(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long len = -1;
	if (f && !fseek(f, 0, SEEK_END) && (len = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
	    (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
		buf[len] = 0;
		*n = (size_t)len;
	} else {
		free(buf);
		buf = NULL;
	}
	if (f)
		fclose(f);
	return buf;
}

static int write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	int rc = f && fwrite(p, 1, n, f) == n ? 0 : -1;
	if (f && fclose(f))
		rc = -1;
	return rc;
}

static int fail(const char *what, const char *why)
{
	fprintf(stderr, "make_bench_checkpoint: %s: %s\n", what, why);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: make_bench_checkpoint CONFIG.json N_LAYERS OUT_DIR TOKENIZER_DIR\n");
		return 2;
	}
	int n_layers = atoi(argv[2]);
	const char *out = argv[3];
	char path[4096], src[4096];
	size_t n = 0, mn = 0;
	char *cfg_text = read_file(argv[1], &n), *merged = NULL;
	if (!cfg_text)
		return fail(argv[1], "cannot read");
	json_t *cj = json_loads(cfg_text, 0, NULL);
	json_int_t hash = json_integer_value(json_object_get(cj, "num_hash_layers"));
	json_decref(cj);
	/* hash routing covers the first layers only: fewer layers than that need it lowered too */
	char ov[128];
	snprintf(ov, sizeof ov, "{\"num_hidden_layers\": %d, \"num_hash_layers\": %d}", n_layers,
		 (int)(hash < n_layers ? hash : n_layers));
	struct err e = {0};
	if (model_config_apply_overrides(cfg_text, n, argv[1], ov, &merged, &mn, &e))
		return fail(argv[1], e.msg);
	if (mkdir(out, 0755) && errno != EEXIST)
		return fail(out, strerror(errno));
	snprintf(path, sizeof path, "%s/config.json", out);
	if (write_file(path, merged, mn))
		return fail(path, "cannot write");
	const char *tok_files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
	for (int i = 0; i < 3; i++) {
		char *t;
		snprintf(src, sizeof src, "%s/%s", argv[4], tok_files[i]);
		snprintf(path, sizeof path, "%s/%s", out, tok_files[i]);
		if (!(t = read_file(src, &n)) || write_file(path, t, n)) {
			if (i < 2) /* generation_config.json is optional */
				return fail(src, "cannot copy");
		}
		free(t);
	}
	/* the dummy load of OUT_DIR: every tensor, its values generated as it is written */
	struct model_checkpoint_options co = {.dir = out, .load_format = MODEL_LOAD_DUMMY, .dummy_seed = SEED,
					      .dummy_no_fill = true};
	struct model_checkpoint *ck = NULL;
	if (model_checkpoint_create(&ck, &co, &e))
		return fail(out, e.msg);
	const struct model_config *cfg = model_checkpoint_config(ck);
	size_t nt = model_checkpoint_n_tensors(ck);
	int *shard = calloc(nt + 1, sizeof *shard);
	uint64_t *off = calloc(nt + 1, sizeof *off), in_shard = 0, total = 0, biggest = 0;
	int n_shards = 1;
	for (size_t i = 0; shard && off && i < nt; i++) {
		const struct model_tensor *t = model_checkpoint_tensor_at(ck, i);
		if (in_shard && in_shard + t->n_bytes > SHARD_MAX_BYTES) {
			n_shards++;
			in_shard = 0;
		}
		shard[i] = n_shards - 1;
		off[i] = in_shard;
		in_shard += t->n_bytes;
		total += t->n_bytes;
		biggest = t->n_bytes > biggest ? t->n_bytes : biggest;
	}
	void *buf = malloc(biggest ? biggest : 1);
	if (!shard || !off || !buf)
		return fail(out, "out of memory");
	json_t *wmap = json_object();
	for (int s = 0; s < n_shards; s++) {
		char fname[64];
		snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
		json_t *hdr = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
		for (size_t i = 0; i < nt; i++) {
			const struct model_tensor *t = model_checkpoint_tensor_at(ck, i);
			if (shard[i] != s)
				continue;
			json_t *sh = json_array();
			for (int d = 0; d < t->n_dims; d++)
				json_array_append_new(sh, json_integer(t->shape[d]));
			json_object_set_new(hdr, t->name,
					    json_pack("{s:s,s:o,s:[I,I]}", "dtype", model_dtype_str(t->dtype), "shape", sh,
						      "data_offsets", (json_int_t)off[i], (json_int_t)(off[i] + t->n_bytes)));
			json_object_set_new(wmap, t->name, json_string(fname));
		}
		char *h = json_dumps(hdr, JSON_COMPACT);
		json_decref(hdr);
		size_t hl = strlen(h), pad = (8 - hl % 8) % 8;
		uint64_t hlen = hl + pad;
		snprintf(path, sizeof path, "%s/%s", out, fname);
		FILE *f = fopen(path, "wb");
		int rc = !f || fwrite(&hlen, 8, 1, f) != 1 || fwrite(h, 1, hl, f) != hl || fwrite("        ", 1, pad, f) != pad;
		free(h);
		for (size_t i = 0; !rc && i < nt; i++) {
			const struct model_tensor *t = model_checkpoint_tensor_at(ck, i);
			if (shard[i] != s)
				continue;
			rc = model_dummy_fill_cpu(cfg, t, SEED, buf) || fwrite(buf, 1, t->n_bytes, f) != t->n_bytes;
		}
		if (f && fclose(f))
			rc = 1;
		if (rc)
			return fail(path, "write failed");
	}
	json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
	if (json_dump_file(idx, path, JSON_INDENT(1)))
		return fail(path, "cannot write");
	json_decref(idx);
	printf("%s: %zu tensors, %d shards, %.2f GiB\n", out, nt, n_shards, (double)total / (1u << 30));
	model_checkpoint_destroy(ck);
	free(buf);
	free(shard);
	free(off);
	free(cfg_text);
	free(merged);
	return 0;
}
