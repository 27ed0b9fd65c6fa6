// The hot loops behind kernels.hpp, one table per instruction-set path: kernels_isa.cpp is
// compiled once per path with that path's flags and defines one of the tables below; kernels.cpp
// picks one at run time. Internal: not installed.
#pragma once

#include <cstddef>
#include <cstdint>

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

/// The score modifiers of one score tile (log2 units), applied in place in this order: tanh
/// soft-capping s = cap · tanh(s / cap) (cap > 0; cap_grad, when given, receives 1 - tanh², the
/// derivative, at the same places), then the additive terms row_add[r] + col_add[c] (the
/// forgetting gate), - slope · |row_pos[r] - (col_pos + col_step · c)| (ALiBi; slope 0: none)
/// and bias_scale · bias_rows[r][bias_step · c] (an additive bias). Null pointers: not given.
struct ScoreMods {
  float* scores;
  std::size_t ld, rows, cols;
  float cap;
  float* cap_grad;
  const float* row_add;
  const float* col_add;
  float slope;
  const float* row_pos;
  float col_pos, col_step;
  const float* const* bias_rows;
  std::size_t bias_step;
  float bias_scale;
};

/// What the score modifiers take from one tile's score gradient dS = ds · unit (ds as
/// SoftmaxBackward leaves it): bias_rows[r][bias_step · c] = dS (an additive bias's gradient),
/// row_sums[r] += sum_c dS and col_sums[col_sums_step · c] += sum_r dS (the forgetting gate's),
/// alibi_rows[r] += sum_c dS · |row_pos[r] - (col_pos + col_step · c)| (ALiBi's, unsigned);
/// then ds *= cap_grad (soft-capping's chain rule). Null pointers: not wanted.
struct ScoreModsGrad {
  float* ds;
  std::size_t ld, rows, cols;
  float unit;
  float* const* bias_rows;
  std::size_t bias_step;
  float* row_sums;
  float* col_sums;
  std::size_t col_sums_step;
  float* alibi_rows;
  const float* row_pos;
  float col_pos, col_step;
  const float* cap_grad;
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
  /// ScoreMods, in place.
  void (*score_mods)(const ScoreMods& tile);
  /// ScoreModsGrad.
  void (*score_mods_grad)(const ScoreModsGrad& tile);
  /// round_to_bf16 (bf16.hpp): float32 to bfloat16 bits, round to nearest even, NaN quieted.
  void (*round_to_bf16)(const float* src, std::uint16_t* dst, std::size_t n);
  /// widen_bf16: bfloat16 bits to float32, exact.
  void (*widen_bf16)(const std::uint16_t* src, float* dst, std::size_t n);
};

extern const Table scalar_table;
#ifdef ATTNLAB_X86_KERNELS
extern const Table avx2_table;
extern const Table avx512_table;
#endif

}  // namespace attnlab::kernels::detail
