/*
 * kernels/quant/wmat.c: weight-matrix format descriptions, the per-row
 * decode used by the CPU reference ops, and the E8M0 -> f32 scale widening
 * that prepare() steps use for kernels taking fp32 block scales.
 */
#include "kernels/quant/wmat.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant/quant.h"

const char *kern_wfmt_name(enum kern_wfmt f)
{
	switch (f) {
	case KERN_WFMT_NONE: return "none";
	case KERN_WFMT_F32: return "f32";
	case KERN_WFMT_BF16: return "bf16";
	case KERN_WFMT_FP8_E8M0_B128: return "fp8_e8m0_b128";
	case KERN_WFMT_FP8_F32_B128: return "fp8_f32_b128";
	case KERN_WFMT_MXFP4: return "mxfp4";
	case KERN_WFMT_NVFP4: return "nvfp4";
	case KERN_WFMT_FP8_F32_R128: return "fp8_f32_r128";
	default: return "unknown";
	}
}

int kern_wfmt_block_rows(enum kern_wfmt f)
{
	switch (f) {
	case KERN_WFMT_FP8_E8M0_B128:
	case KERN_WFMT_FP8_F32_B128: return 128;
	case KERN_WFMT_MXFP4:
	case KERN_WFMT_NVFP4:
	case KERN_WFMT_FP8_F32_R128: return 1;
	default: return 0;
	}
}

int kern_wfmt_block_cols(enum kern_wfmt f)
{
	switch (f) {
	case KERN_WFMT_FP8_E8M0_B128:
	case KERN_WFMT_FP8_F32_B128:
	case KERN_WFMT_FP8_F32_R128: return 128;
	case KERN_WFMT_MXFP4: return 32;
	case KERN_WFMT_NVFP4: return 16;
	default: return 0;
	}
}

size_t kern_wmat_data_bytes(const struct kern_wmat *m)
{
	size_t n = (size_t)m->rows * (size_t)m->cols;
	switch (m->fmt) {
	case KERN_WFMT_F32: return n * 4;
	case KERN_WFMT_BF16: return n * 2;
	case KERN_WFMT_FP8_E8M0_B128:
	case KERN_WFMT_FP8_F32_B128:
	case KERN_WFMT_FP8_F32_R128: return n;
	case KERN_WFMT_MXFP4:
	case KERN_WFMT_NVFP4: return n / 2;
	default: return 0;
	}
}

size_t kern_wmat_scale_bytes(const struct kern_wmat *m)
{
	int br = kern_wfmt_block_rows(m->fmt), bc = kern_wfmt_block_cols(m->fmt);
	if (!br)
		return 0;
	size_t n = (size_t)((m->rows + br - 1) / br) * (size_t)((m->cols + bc - 1) / bc);
	return m->fmt == KERN_WFMT_FP8_F32_B128 || m->fmt == KERN_WFMT_FP8_F32_R128 ? n * 4 : n;
}

enum status kern_wmat_validate(const struct kern_wmat *m, const char *what, struct err *e)
{
	if (m->fmt <= KERN_WFMT_NONE || m->fmt >= KERN_WFMT_COUNT)
		return err_set(e, ST_INVALID, "%s: unknown weight format %d", what, (int)m->fmt);
	if (m->rows <= 0 || m->cols <= 0)
		return err_set(e, ST_INVALID, "%s: shape [%lld, %lld] is empty", what, (long long)m->rows,
			       (long long)m->cols);
	int bc = kern_wfmt_block_cols(m->fmt);
	if ((m->fmt == KERN_WFMT_MXFP4 || m->fmt == KERN_WFMT_NVFP4) && m->cols % bc)
		return err_set(e, ST_INVALID, "%s: %s needs in (%lld) to be a multiple of %d", what,
			       kern_wfmt_name(m->fmt), (long long)m->cols, bc);
	if (!m->data || (kern_wfmt_block_rows(m->fmt) && !m->scale))
		return err_set(e, ST_INVALID, "%s: %s data or scale pointer missing", what,
			       kern_wfmt_name(m->fmt));
	return ST_OK;
}

void kern_wmat_decode_row(const struct kern_wmat *m, int64_t r, float *out)
{
	int64_t cols = m->cols;
	switch (m->fmt) {
	case KERN_WFMT_F32:
		memcpy(out, (const float *)m->data + r * cols, (size_t)cols * sizeof(float));
		return;
	case KERN_WFMT_BF16: {
		const uint16_t *d = (const uint16_t *)m->data + r * cols;
		for (int64_t c = 0; c < cols; c++)
			out[c] = kern_bf16_to_f32(d[c]);
		return;
	}
	case KERN_WFMT_FP8_E8M0_B128:
	case KERN_WFMT_FP8_F32_B128: {
		const uint8_t *d = (const uint8_t *)m->data + r * cols;
		int64_t nbc = (cols + 127) / 128;
		int64_t srow = (r / 128) * nbc;
		for (int64_t b = 0; b < nbc; b++) {
			float s = m->fmt == KERN_WFMT_FP8_F32_B128 ? ((const float *)m->scale)[srow + b]
								   : kern_e8m0_to_f32(((const uint8_t *)m->scale)[srow + b]);
			int64_t c1 = (b + 1) * 128 < cols ? (b + 1) * 128 : cols;
			for (int64_t c = b * 128; c < c1; c++)
				out[c] = kern_e4m3_to_f32(d[c]) * s;
		}
		return;
	}
	case KERN_WFMT_FP8_F32_R128: {
		const uint8_t *d = (const uint8_t *)m->data + r * cols;
		const float *s = (const float *)m->scale;
		for (int64_t c = 0; c < cols; c++)
			out[c] = kern_e4m3_to_f32(d[c]) * s[(c / 128) * m->rows + r];
		return;
	}
	case KERN_WFMT_MXFP4:
	case KERN_WFMT_NVFP4: {
		const uint8_t *d = (const uint8_t *)m->data + r * (cols / 2);
		int bc = kern_wfmt_block_cols(m->fmt);
		const uint8_t *sr = (const uint8_t *)m->scale + r * (cols / bc);
		for (int64_t b = 0; b < cols / bc; b++) {
			float s = m->fmt == KERN_WFMT_MXFP4 ? kern_e8m0_to_f32(sr[b])
							    : kern_e4m3_to_f32(sr[b]) * m->global_scale;
			for (int64_t c = b * bc; c < (b + 1) * bc; c++)
				out[c] = kern_e2m1_to_f32(kern_e2m1_code_at(d, c)) * s;
		}
		return;
	}
	default:
		for (int64_t c = 0; c < cols; c++)
			out[c] = 0.0f;
	}
}

enum status kern_wmat_widen_e8m0(const struct kern_wmat *in, struct kern_wmat *out, struct err *e)
{
	if (in->fmt != KERN_WFMT_FP8_E8M0_B128)
		return err_set(e, ST_INVALID, "widen e8m0: weight is %s, not fp8_e8m0_b128", kern_wfmt_name(in->fmt));
	size_t n = kern_wmat_scale_bytes(in);
	float *s = malloc(n * sizeof(float) + 1);
	if (!s)
		return err_set(e, ST_NOMEM, "widen e8m0: %zu scales", n);
	const uint8_t *src = in->scale;
	for (size_t i = 0; i < n; i++)
		s[i] = kern_e8m0_to_f32(src[i]);
	*out = *in;
	out->fmt = KERN_WFMT_FP8_F32_B128;
	out->scale = s;
	out->owned = s;
	return ST_OK;
}

/* ---- shards and fusion ---- */

/* Bytes per element of the data array, as a fraction num/den. */
static void data_elem_bytes(enum kern_wfmt f, int *num, int *den)
{
	*den = 1;
	switch (f) {
	case KERN_WFMT_F32: *num = 4; break;
	case KERN_WFMT_BF16: *num = 2; break;
	case KERN_WFMT_MXFP4:
	case KERN_WFMT_NVFP4: *num = 1; *den = 2; break;
	default: *num = 1; break;
	}
}

static int scale_elem_bytes(enum kern_wfmt f)
{
	return f == KERN_WFMT_FP8_F32_B128 || f == KERN_WFMT_FP8_F32_R128 ? 4 : 1;
}

enum status kern_wmat_slice(const struct kern_wmat *m, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
			    struct kern_wmat *out, struct err *e)
{
	memset(out, 0, sizeof *out);
	if (m->fmt == KERN_WFMT_FP8_F32_R128)
		return err_set(e, ST_INVALID, "slice of fp8_f32_r128: a prepared layout (slice before prepare)");
	if (r0 < 0 || r1 > m->rows || r0 >= r1 || c0 < 0 || c1 > m->cols || c0 >= c1)
		return err_set(e, ST_INVALID, "slice [%lld:%lld, %lld:%lld] of [%lld, %lld]", (long long)r0,
			       (long long)r1, (long long)c0, (long long)c1, (long long)m->rows, (long long)m->cols);
	int br = kern_wfmt_block_rows(m->fmt), bc = kern_wfmt_block_cols(m->fmt);
	int num, den;
	data_elem_bytes(m->fmt, &num, &den);
	int colq = bc ? bc : den; /* column granularity */
	if ((br && (r0 % br || (r1 % br && r1 != m->rows))) || c0 % colq || (c1 % colq && c1 != m->cols))
		return err_set(e, ST_INVALID, "slice [%lld:%lld, %lld:%lld] of %s: not on %dx%d block boundaries",
			       (long long)r0, (long long)r1, (long long)c0, (long long)c1, kern_wfmt_name(m->fmt),
			       br ? br : 1, colq);
	*out = *m;
	out->owned = NULL;
	out->rows = r1 - r0;
	out->cols = c1 - c0;
	int64_t nbc_in = bc ? (m->cols + bc - 1) / bc : 0, nbc_out = bc ? (out->cols + bc - 1) / bc : 0;
	int sb = scale_elem_bytes(m->fmt);
	int64_t srow0 = br ? r0 / br : 0, nsr = br ? (out->rows + br - 1) / br : 0;
	size_t row_in = (size_t)(m->cols * num / den), row_out = (size_t)(out->cols * num / den);
	if (c0 == 0 && c1 == m->cols) { /* a view */
		out->data = (const uint8_t *)m->data + (size_t)r0 * row_in;
		if (br)
			out->scale = (const uint8_t *)m->scale + (size_t)(srow0 * nbc_in) * (size_t)sb;
		return ST_OK;
	}
	size_t nd = (size_t)out->rows * row_out, ns = (size_t)(nsr * nbc_out) * (size_t)sb;
	size_t off_s = (nd + 15) & ~(size_t)15;
	uint8_t *buf = malloc(off_s + ns + 1);
	if (!buf)
		return err_set(e, ST_NOMEM, "slice of %s: %zu bytes", kern_wfmt_name(m->fmt), off_s + ns);
	for (int64_t r = 0; r < out->rows; r++)
		memcpy(buf + (size_t)r * row_out, (const uint8_t *)m->data + (size_t)(r0 + r) * row_in +
			       (size_t)(c0 * num / den), row_out);
	if (br)
		for (int64_t r = 0; r < nsr; r++)
			memcpy(buf + off_s + (size_t)(r * nbc_out) * (size_t)sb,
			       (const uint8_t *)m->scale + (size_t)((srow0 + r) * nbc_in + c0 / bc) * (size_t)sb,
			       (size_t)nbc_out * (size_t)sb);
	out->data = buf;
	out->scale = br ? buf + off_s : NULL;
	out->owned = buf;
	return ST_OK;
}

enum status kern_wmat_concat_rows(const struct kern_wmat *a, const struct kern_wmat *b, struct kern_wmat *out,
				  struct err *e)
{
	memset(out, 0, sizeof *out);
	if (a->fmt == KERN_WFMT_FP8_F32_R128)
		return err_set(e, ST_INVALID, "concat of fp8_f32_r128: a prepared layout (fuse before prepare)");
	if (a->fmt != b->fmt || a->cols != b->cols)
		return err_set(e, ST_INVALID, "concat: %s [%lld, %lld] and %s [%lld, %lld] differ", kern_wfmt_name(a->fmt),
			       (long long)a->rows, (long long)a->cols, kern_wfmt_name(b->fmt), (long long)b->rows,
			       (long long)b->cols);
	int br = kern_wfmt_block_rows(a->fmt);
	if (br > 1 && a->rows % br)
		return err_set(e, ST_INVALID, "concat: first part has %lld rows, not a multiple of %d", (long long)a->rows,
			       br);
	if (a->fmt == KERN_WFMT_NVFP4 && a->global_scale != b->global_scale)
		return err_set(e, ST_INVALID, "concat: nvfp4 global scales %g and %g differ", a->global_scale,
			       b->global_scale);
	size_t da = kern_wmat_data_bytes(a), db = kern_wmat_data_bytes(b);
	size_t sa = kern_wmat_scale_bytes(a), sbb = kern_wmat_scale_bytes(b);
	size_t off_s = (da + db + 15) & ~(size_t)15;
	uint8_t *buf = malloc(off_s + sa + sbb + 1);
	if (!buf)
		return err_set(e, ST_NOMEM, "concat: %zu bytes", off_s + sa + sbb);
	memcpy(buf, a->data, da);
	memcpy(buf + da, b->data, db);
	if (sa + sbb) {
		memcpy(buf + off_s, a->scale, sa);
		memcpy(buf + off_s + sa, b->scale, sbb);
	}
	*out = *a;
	out->rows = a->rows + b->rows;
	out->data = buf;
	out->scale = sa + sbb ? buf + off_s : NULL;
	out->owned = buf;
	return ST_OK;
}

uint64_t kern_rand_u64(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

float kern_rand_f32(uint64_t *state)
{
	return (float)((int64_t)(kern_rand_u64(state) >> 40) - (1 << 23)) * 0x1p-23f;
}

enum status kern_wmat_make_random(struct kern_wmat *m, enum kern_wfmt fmt, int64_t rows, int64_t cols,
				  uint64_t *rng, struct err *e)
{
	memset(m, 0, sizeof *m);
	m->fmt = fmt;
	m->rows = rows;
	m->cols = cols;
	m->global_scale = 1.0f;
	size_t nd = kern_wmat_data_bytes(m), ns = kern_wmat_scale_bytes(m);
	size_t off_s = (nd + 15) & ~(size_t)15;
	uint8_t *buf = malloc(off_s + ns + 16);
	if (!buf)
		return err_set(e, ST_NOMEM, "random %s [%lld, %lld]", kern_wfmt_name(fmt), (long long)rows,
			       (long long)cols);
	m->owned = buf;
	m->data = buf;
	m->scale = ns ? buf + off_s : NULL;
	size_t n = (size_t)rows * (size_t)cols;
	switch (fmt) {
	case KERN_WFMT_F32:
		for (size_t i = 0; i < n; i++)
			((float *)buf)[i] = kern_rand_f32(rng);
		break;
	case KERN_WFMT_BF16:
		for (size_t i = 0; i < n; i++)
			((uint16_t *)buf)[i] = kern_f32_to_bf16(kern_rand_f32(rng));
		break;
	case KERN_WFMT_FP8_E8M0_B128:
	case KERN_WFMT_FP8_F32_B128:
		for (size_t i = 0; i < n; i++) {
			uint8_t c = (uint8_t)kern_rand_u64(rng);
			buf[i] = (c & 0x7F) == 0x7F ? (uint8_t)(c & 0xFE) : c; /* no NaN codes */
		}
		break;
	case KERN_WFMT_MXFP4:
	case KERN_WFMT_NVFP4:
		for (size_t i = 0; i < nd; i++)
			buf[i] = (uint8_t)kern_rand_u64(rng);
		break;
	default:
		kern_wmat_release(m);
		return err_set(e, ST_INVALID, "random weight: format %d", (int)fmt);
	}
	uint8_t *s8 = buf + off_s;
	for (size_t i = 0; i < ns; i++) {
		uint64_t r = kern_rand_u64(rng);
		if (fmt == KERN_WFMT_FP8_E8M0_B128 || fmt == KERN_WFMT_MXFP4)
			s8[i] = (uint8_t)(127 - 12 + (int)(r % 10)); /* 2^-12 .. 2^-3 */
		else if (fmt == KERN_WFMT_NVFP4)
			s8[i] = (uint8_t)(0x20 + (int)(r % 0x40)); /* e4m3 2^-3 .. ~2^4, positive */
		else if (fmt == KERN_WFMT_FP8_F32_B128 && i % 4 == 0)
			((float *)s8)[i / 4] = ldexpf(1.0f + (float)(r % 1000) / 1000.0f, -12 + (int)(r >> 40) % 9);
	}
	if (fmt == KERN_WFMT_NVFP4)
		m->global_scale = 0.01f + (float)(kern_rand_u64(rng) % 1000) / 1000.0f;
	return ST_OK;
}

void kern_wmat_release(struct kern_wmat *m)
{
	if (!m)
		return;
	free(m->owned);
	memset(m, 0, sizeof *m);
}
