// Small dense kernels shared by the fast variants: a register-blocked float32 GEMM for tiles
// (no BLAS threads inside our own OpenMP regions) and a vectorised exp2.
#pragma once

#include <cstddef>

namespace attnlab::kernels {

/// C[M x N] (+)= A[M x K] · B[K x N], all row-major with leading dimensions lda, ldb, ldc.
/// accumulate = false overwrites C.
void gemm_tile(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
               const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate);

/// x[i] = 2^x[i]; inputs below -126 (including -inf) give exactly 0.
void exp2_inplace(float* x, std::size_t n);

}  // namespace attnlab::kernels
