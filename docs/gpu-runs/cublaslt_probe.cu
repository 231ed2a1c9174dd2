// Which cuBLASLt FP8 block-scaled configurations does the heuristic accept on this GPU?
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
int main() {
  cublasLtHandle_t h; cublasLtCreate(&h);
  int ver = (int)cublasLtGetVersion(); printf("cublasLt version %d\n", ver);
  int modes[] = {CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F};
  const char *mn[] = {"VEC128", "BLK128", "SCALAR", "OUTER"};
  cudaDataType_t dts[] = {CUDA_R_16BF, CUDA_R_32F}; const char *dn[] = {"bf16", "f32"};
  int shapes[][3] = {{1024, 128, 4096}, {1024, 1, 4096}, {1024, 16, 4096}, {4096, 256, 1024}};
  void *ws; cudaMalloc(&ws, 64<<20);
  float *sa, *sb; cudaMalloc(&sa, 1<<24); cudaMalloc(&sb, 1<<24);
  for (int si = 0; si < 4; si++) for (int ta = 0; ta < 2; ta++) for (int tb = 0; tb < 2; tb++)
  for (int am = 0; am < 4; am++) for (int bm = 0; bm < 4; bm++) for (int di = 0; di < 2; di++) {
    int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
    cublasLtMatmulDesc_t d; cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    int32_t a = modes[am], b = modes[bm];
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a, sizeof a);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b, sizeof b);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, ta ? k : m, ta ? m : k, ta ? k : m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, tb ? n : k, tb ? k : n, tb ? n : k);
    cublasLtMatrixLayoutCreate(&lc, dts[di], m, n, m);
    cublasLtMatmulPreference_t pref; cublasLtMatmulPreferenceCreate(&pref);
    size_t wsb = 64 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t res; int cnt = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pref, 1, &res, &cnt);
    if (s == CUBLAS_STATUS_SUCCESS && cnt > 0)
      printf("OK m%d n%d k%d A%s(%s) B%s(%s) D=%s\n", m, n, k, ta?"T":"N", mn[am], tb?"T":"N", mn[bm], dn[di]);
    cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc); cublasLtMatmulDescDestroy(d);
  }
  printf("done\n");
}
