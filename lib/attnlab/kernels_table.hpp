// The hot loops behind kernels.hpp, one table per instruction-set path: kernels_isa.cpp is
// compiled once per path with that path's flags and defines one of the tables below; kernels.cpp
// picks one at run time. Internal: not installed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attnlab::kernels::detail {

struct ScoreMods;
struct ScoreModsGrad;

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
  const ScoreMods* mods;       // applied to the scores first (the soft-cap's chain rule on dS)
  const ScoreModsGrad* grads;  // taken from dS on the way
};

/// The score modifiers of one score tile (log2 units), applied in place in this order: tanh
/// soft-capping s = cap · tanh(s / cap) (cap > 0; a -infinity, a key masked before, stays
/// -infinity), then the additive terms row_add[r] + col_add[c] (the forgetting gate),
/// - slope · |row_pos[r] - (col_pos + col_step · c)| (ALiBi; slope 0: none) and
/// bias_scale · bias_rows[r][bias_step · c] (an additive bias), then the row ranges: row r keeps
/// columns c in [col_lo[r], col_hi[r]) and the others become -infinity (the interval parts of a
/// mask in a partial tile). Null pointers: not given. The online softmax's fold and backward
/// apply them in the pass that already reads every score (no sweep of their own).
struct ScoreMods {
  float cap;
  const float* row_add;
  const float* col_add;
  float slope;
  const float* row_pos;
  float col_pos, col_step;
  const float* const* bias_rows;
  std::size_t bias_step;
  float bias_scale;
  const float* col_lo;  // whole numbers below 2^24, exact in float
  const float* col_hi;
};

/// What the score modifiers take from one tile's score gradient dS = ds · unit (ds as the
/// backward computes it before the soft-cap's chain rule): bias_rows[r][bias_step · c] = dS (an
/// additive bias's gradient), row_sums[r] += sum_c dS and col_sums[col_sums_step · c] +=
/// sum_r dS (the forgetting gate's), alibi_rows[r] += sum_c dS · |row_pos[r] - (col_pos +
/// col_step · c)| (ALiBi's, unsigned; the positions of the ScoreMods beside it). Null pointers:
/// not wanted.
struct ScoreModsGrad {
  float unit;
  float* const* bias_rows;
  std::size_t bias_step;
  float* row_sums;
  float* col_sums;
  std::size_t col_sums_step;
  float* alibi_rows;
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
  void (*row_dots)(std::size_t rows, std::size_t cols, std::size_t dk, const float* q,
                   const float* keys, float* scores, std::size_t ld);
  void (*transpose)(std::size_t rows, std::size_t cols, const float* src, std::size_t lds,
                    float* dst, std::size_t ldd);
  /// OnlineSoftmax::fold: the masked score tile (modified first by mods, when not null) and
  /// values v[j * ldv + c] into the state.
  void (*fold)(const SoftmaxTile& tile, const ScoreMods* mods, const float* v, std::size_t ldv,
               std::size_t cols);
  /// SoftmaxBackward's elementwise step over `cols` columns of every row of the tile.
  void (*softmax_grad)(const SoftmaxGradTile& tile, std::size_t cols);
  /// ScoreMods on `rows` x `cols` scores (row stride ld), in place.
  void (*score_mods)(const ScoreMods& mods, float* scores, std::size_t ld, std::size_t rows,
                     std::size_t cols);
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
