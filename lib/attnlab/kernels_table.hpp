// The hot loops behind kernels.hpp, one table per instruction-set path: kernels_isa.cpp is
// compiled once per path with that path's flags and defines one of the tables below; kernels.cpp
// picks one at run time. Internal: not installed.
#pragma once

#include <cstddef>

namespace attnlab::kernels::detail {

/// One query tile of the online softmax (OnlineSoftmax's state).
struct SoftmaxTile {
  float* scores;  // rows x cols, row stride ld
  std::size_t ld;
  float* acc;  // rows x dv: unnormalised outputs
  float* max;  // per row: running max (log2 units)
  float* sum;  // per row: running sum of 2^(score - max)
  std::size_t rows, dv;
};

/// One score tile of SoftmaxBackward: scores become P = 2^(S - lse2) in place, dP becomes
/// dS · factor = P ∘ (dP - delta) · factor in place.
struct SoftmaxGradTile {
  float* scores;  // rows x cols, row stride ld: masked scores (log2 units) in, P out
  float* dp;      // rows x cols, row stride ld: dO V^T in, dS · factor out
  std::size_t ld;
  const float* lse2;   // per row: log-sum-exp in log2 units (-inf: the row sees no key)
  const float* delta;  // per row: rowsum(dO ∘ O)
  float factor;
  std::size_t rows;
};

/// Entry points of one path; the semantics are those of the functions in kernels.hpp.
struct Table {
  void (*gemm_tile)(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                    const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate);
  void (*gemm_tile_at)(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                       const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate);
  void (*exp2_inplace)(float* x, std::size_t n);
  float (*exp2_shifted_sum)(float* x, std::size_t n, float shift);
  float (*row_max)(const float* x, std::size_t n);
  void (*transpose)(std::size_t rows, std::size_t cols, const float* src, std::size_t lds,
                    float* dst, std::size_t ldd);
  /// OnlineSoftmax::fold: the masked score tile and values v[j * ldv + c] into the state.
  void (*fold)(const SoftmaxTile& tile, const float* v, std::size_t ldv, std::size_t cols);
  /// SoftmaxBackward's elementwise step over `cols` columns of every row of the tile.
  void (*softmax_grad)(const SoftmaxGradTile& tile, std::size_t cols);
};

extern const Table scalar_table;
#ifdef ATTNLAB_X86_KERNELS
extern const Table avx2_table;
extern const Table avx512_table;
#endif

}  // namespace attnlab::kernels::detail
