// The kernels of every instruction-set path this CPU runs (scalar, AVX2, AVX-512), each against a
// float64 computation, on sizes that are not multiples of any vector width or register block.
// The variants' own tests run again under each forced path (ATTNLAB_ISA, tests/meson.build).
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attnlab/kernels.hpp"
#include "attnlab/kernels_table.hpp"
#include "helpers.hpp"

using namespace attnlab;
using kernels::Isa;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Runs `check` once per supported path, restoring the path that was active.
template <class F>
void for_each_isa(F&& check) {
  const Isa before = kernels::active_isa();
  for (Isa isa : kernels::supported_isas()) {
    kernels::use_isa(isa);
    INFO("kernel path " << kernels::isa_name(isa));
    check();
  }
  kernels::use_isa(before);
}

std::vector<float> normal(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = g(rng);
  return x;
}

// C (+)= A·B on sub-matrices with leading dimensions wider than the operands, then checks C
// against float64 and that every float outside C's m x n block kept its guard value. With
// a_transposed, gemm_tile_at with A given as its [k x m] transpose.
void check_gemm(std::size_t m, std::size_t n, std::size_t k, bool accumulate,
                bool a_transposed = false) {
  const std::size_t lda = (a_transposed ? m : k) + 3, ldb = n + 5, ldc = n + 7;
  const std::vector<float> a = normal((a_transposed ? k : m) * lda, m * 1000 + k),
                           b = normal(k * ldb, n * 1000 + k);
  const auto a_at = [&](std::size_t i, std::size_t p) {
    return double(a_transposed ? a[p * lda + i] : a[i * lda + p]);
  };
  const float guard = 12345.0f;
  std::vector<float> c(m * ldc + 16, guard);
  const std::vector<float> c0 = normal(m * ldc, m + n + k);
  if (accumulate)
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = c0[i * ldc + j];
  (a_transposed ? kernels::gemm_tile_at : kernels::gemm_tile)(m, n, k, a.data(), lda, b.data(), ldb,
                                                              c.data(), ldc, accumulate);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (j >= n) {
        if (got != guard)
          FAIL("gemm_tile" << (a_transposed ? "_at " : " ") << m << "x" << n << "x" << k
                           << " wrote C(" << i << ", " << j << ")");
        continue;
      }
      double want = accumulate ? c0[i * ldc + j] : 0.0, size = std::abs(want);
      for (std::size_t p = 0; p < k; ++p) {
        want += a_at(i, p) * b[p * ldb + j];
        size += std::abs(a_at(i, p) * b[p * ldb + j]);
      }
      // float32 sums of k products: rounding below k · 2^-24 of the sum of magnitudes.
      if (!(std::abs(got - want) <= 1e-6 * (1.0 + size) * double(k + 1)))
        FAIL("gemm_tile" << (a_transposed ? "_at " : " ") << m << "x" << n << "x" << k
                         << " accumulate=" << accumulate << " C(" << i << ", " << j << ") = " << got
                         << ", expected " << want);
    }
  for (std::size_t j = m * ldc; j < c.size(); ++j) REQUIRE(c[j] == guard);
}

}  // namespace

TEST_CASE("kernel paths: names parse, unsupported ones are refused by name", "[exact]") {
  const std::vector<Isa> paths = kernels::supported_isas();
  REQUIRE(!paths.empty());
  CHECK(paths.front() == Isa::scalar);  // plain C++ runs everywhere
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    CHECK(kernels::parse_isa(kernels::isa_name(isa)) == isa);
    if (!kernels::isa_supported(isa))
      test::require_error([&] { kernels::use_isa(isa); },
                          {kernels::isa_name(isa), "supported here"});
  }
  test::require_error([] { kernels::parse_isa("avx1024"); },
                      {"'avx1024'", "scalar, avx2 or avx512"});
  const Isa before = kernels::active_isa();
  for (Isa isa : paths) {
    kernels::use_isa(isa);
    CHECK(kernels::active_isa() == isa);
  }
  kernels::use_isa(before);
}

TEST_CASE("gemm_tile equals float64 on every edge of the register blocks", "[exact]") {
  for_each_isa([] {
    // Rows around the 4- and 6-row blocks; columns around 8, 16, 32 and 64-column panels.
    for (std::size_t m : {1, 2, 3, 5, 6, 7, 11, 13, 48})
      for (std::size_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 47, 63, 64, 65, 100, 129})
        for (std::size_t k : {1, 5, 64}) {
          check_gemm(m, n, k, false);
          check_gemm(m, n, k, true);
        }
  });
}

TEST_CASE("gemm_tile_at (A given transposed) equals float64 on every edge of the blocks",
          "[exact]") {
  for_each_isa([] {
    for (std::size_t m : {1, 5, 6, 7, 13, 128})
      for (std::size_t n : {1, 7, 16, 17, 33, 64, 65})
        for (std::size_t k : {1, 5, 48, 65}) {
          check_gemm(m, n, k, false, true);
          check_gemm(m, n, k, true, true);
        }
  });
}

TEST_CASE("exp2 kernels: accurate, exactly 0 below -126, tails included", "[exact]") {
  for_each_isa([] {
    std::vector<float> x;
    for (float v = -140.0f; v <= 127.0f; v += 0.37f) x.push_back(v);
    x.insert(x.end(), {-kInf, -126.0f, -126.001f, -0.5f, 0.5f, 0.0f, -1e-8f, 1e-8f});
    for (std::size_t n : {x.size(), std::size_t(1), std::size_t(5), std::size_t(17)}) {
      std::vector<float> y(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n));
      y.push_back(7.0f);  // beyond n: must stay untouched
      kernels::exp2_inplace(y.data(), n);
      CHECK(y[n] == 7.0f);
      for (std::size_t i = 0; i < n; ++i) {
        INFO("2^" << x[i]);
        if (x[i] < -126.0f)
          CHECK(y[i] == 0.0f);
        else  // a degree-6 polynomial on |f| <= 1/2 (vector paths) or libm: ~1e-7 relative
          CHECK(std::abs(y[i] - std::exp2(double(x[i]))) <= 4e-7 * std::exp2(double(x[i])));
      }
    }
  });
}

TEST_CASE("row_max and exp2_shifted_sum over every length up to three vectors", "[exact]") {
  for_each_isa([] {
    for (std::size_t n = 0; n <= 50; ++n) {
      INFO("n = " << n);
      std::vector<float> x = normal(n + 1, n);
      for (float& v : x) v = -10.0f - std::abs(v);  // all negative: a zero fill would win a max
      if (n > 2) x[n / 2] = -kInf;                  // a masked score
      x[n] = 1e30f;                                 // beyond n: never read as data
      double max = -kInf;
      for (std::size_t i = 0; i < n; ++i) max = std::max(max, double(x[i]));
      CHECK(kernels::row_max(x.data(), n) == static_cast<float>(max));
      if (n == 0) continue;
      const float shift = static_cast<float>(max);
      double want = 0;
      for (std::size_t i = 0; i < n; ++i) want += std::exp2(double(x[i]) - shift);
      const std::vector<float> before = x;
      const float got = kernels::exp2_shifted_sum(x.data(), n, shift);
      CHECK(std::abs(got - want) <= 1e-6 * want);
      for (std::size_t i = 0; i < n; ++i)
        CHECK(std::abs(x[i] - std::exp2(double(before[i]) - shift)) <= 1e-6);
      CHECK(x[n] == 1e30f);
    }
  });
}

TEST_CASE("row_dots equals float64 for every row and key block and tail", "[exact]") {
  for_each_isa([] {
    for (std::size_t rows : {1, 2, 3, 4, 5, 8})
      for (std::size_t cols : {1, 2, 7, 8, 9, 17})
        for (std::size_t dk : {1, 7, 8, 16, 33, 64}) {
          INFO(rows << " rows, " << cols << " keys, dk " << dk);
          const std::size_t ld = cols + 5;
          const std::vector<float> q = normal(rows * dk, rows), keys = normal(cols * dk, dk);
          std::vector<float> scores(rows * ld, -1.0f);
          kernels::row_dots(rows, cols, dk, q.data(), keys.data(), scores.data(), ld);
          for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t j = 0; j < ld; ++j) {
              if (j >= cols) {  // past the keys: untouched
                CHECK(scores[r * ld + j] == -1.0f);
                continue;
              }
              double want = 0, size = 0;
              for (std::size_t p = 0; p < dk; ++p) {
                want += double(q[r * dk + p]) * keys[j * dk + p];
                size += std::abs(double(q[r * dk + p]) * keys[j * dk + p]);
              }
              // float32 sums of dk products in any order: within dk ulps of the magnitudes.
              CHECK(std::abs(scores[r * ld + j] - want) <= 1.2e-7 * double(dk) * size);
            }
        }
  });
}

TEST_CASE("transpose moves every element once and nothing else", "[exact]") {
  for_each_isa([] {
    for (std::size_t rows : {1, 7, 8, 15, 16, 17, 33, 48})
      for (std::size_t cols : {1, 5, 8, 16, 24, 31, 64}) {
        const std::size_t lds = cols + 3, ldd = rows + 9;
        const std::vector<float> src = normal(rows * lds, rows * 100 + cols);
        std::vector<float> dst(cols * ldd, -1.0f);
        kernels::transpose(rows, cols, src.data(), lds, dst.data(), ldd);
        for (std::size_t c = 0; c < cols; ++c)
          for (std::size_t j = 0; j < ldd; ++j)
            if (dst[c * ldd + j] != (j < rows ? src[j * lds + c] : -1.0f))
              FAIL("transpose " << rows << "x" << cols << ": dst(" << c << ", " << j << ")");
      }
  });
}

TEST_CASE("every path gives full attention within fp32 rounding of the fp64 reference", "[exact]") {
  // One problem with every mask part at once (the per-path runs of test_full cover the rest).
  const Tensor q = test::random_tensor(2, 3, 77, 24, 1), k = test::random_tensor(2, 3, 131, 24, 2);
  const Tensor v = test::random_tensor(2, 3, 131, 40, 3);
  Mask mask;
  mask.causal = Causal::bottom_right;
  mask.key_lengths = {131, 70};
  xt::xtensor<bool, 2> allowed = xt::xtensor<bool, 2>::from_shape({77, 131});
  std::mt19937_64 rng(4);
  for (auto&& x : allowed) x = rng() % 4 != 0;
  mask.allow(allowed);
  const Tensor64 want = reference_attention(q, k, v, mask);
  const auto full = make_attention("full");
  for_each_isa([&] { test::require_close(full->forward(q, k, v, mask), want, 1e-4, 2e-5); });
}

TEST_CASE("score_mods soft-caps within 3.5e-7 of float64, keeping -inf and NaN", "[exact]") {
  const float cap = 3.0f;
  std::vector<float> x;
  for (int e = -30; e <= 2; ++e)  // tiny to saturated, both signs
    for (float m : {1.0f, 1.7f, 2.9f, 5.3f, 8.1f}) {
      x.push_back(m * std::pow(10.0f, static_cast<float>(e)) * cap);
      x.push_back(-x.back());
    }
  x.push_back(0.0f);
  x.push_back(-kInf);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  kernels::detail::ScoreMods mods{};
  mods.cap = cap;
  for_each_isa([&] {
    std::vector<float> s = x;
    kernels::score_mods(mods, s.data(), s.size(), 1, s.size());
    for (std::size_t i = 0; i + 2 < x.size(); ++i) {
      const double want = cap * std::tanh(static_cast<double>(x[i]) / cap);
      INFO("x = " << x[i]);
      // The rational tanh: 3.5e-7 relative at most, then one rounding of cap · tanh.
      CHECK(std::abs(s[i] - want) <= 4.5e-7 * std::abs(want));
    }
    CHECK(s[x.size() - 2] == -kInf);  // a key masked before stays masked
    CHECK(std::isnan(s[x.size() - 1]));
  });
}

namespace {

// Modifiers of every kind on a rows x cols tile, and per-row ranges with rows that see nothing,
// everything, and ranges that start and end inside and at the edges of vectors.
struct ModTile {
  static constexpr std::size_t rows = 13, cols = 37, dk = 12, dv = 10;
  std::vector<float> q = normal(rows * dk, 11), kt = normal(dk * cols, 12),
                     v = normal(cols * dv, 13);
  std::vector<float> k = normal(cols * dk, 14), vt = normal(dv * cols, 15);
  std::vector<float> out_grad = normal(rows * dv, 16), row_pos, row_add, col_add, bias, lo, hi;
  std::vector<const float*> bias_rows;

  ModTile() {
    for (std::size_t r = 0; r < rows; ++r) {
      row_pos.push_back(static_cast<float>(40 + 3 * r));
      row_add.push_back(-0.1f * static_cast<float>(r));
      const std::size_t a = (r * 5) % cols, z = r == 3 ? a : std::min(cols, a + 1 + (r * 7) % 30);
      lo.push_back(static_cast<float>(r == 4 ? 0 : a));
      hi.push_back(static_cast<float>(r == 4 ? cols : z));
    }
    for (std::size_t c = 0; c < cols; ++c) col_add.push_back(0.05f * static_cast<float>(c % 7));
    bias = normal(rows * cols, 17);
    for (std::size_t r = 0; r < rows; ++r) bias_rows.push_back(bias.data() + r * cols);
  }
  // Parts: 1 soft-cap, 2 ALiBi, 4 the forgetting gate's terms and a bias.
  kernels::detail::ScoreMods mods(int parts) const {
    kernels::detail::ScoreMods m{};
    if (parts & 1) m.cap = 2.5f;
    if (parts & 2) m.slope = 0.125f, m.row_pos = row_pos.data(), m.col_pos = 17, m.col_step = 2;
    if (parts & 4) {
      m.row_add = row_add.data(), m.col_add = col_add.data();
      m.bias_rows = bias_rows.data(), m.bias_step = 1, m.bias_scale = 1.4f;
    }
    return m;
  }
  // The same modifiers with each row's column range applied in the same pass.
  kernels::detail::ScoreMods ranged(int parts) const {
    kernels::detail::ScoreMods m = mods(parts);
    m.col_lo = lo.data(), m.col_hi = hi.data();
    return m;
  }
  // Sets the scores outside each row's range to -infinity, as an element-wise mask does.
  void mask_elements(float* s) const {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        if (c < lo[r] || c >= hi[r]) s[r * kernels::OnlineSoftmax::kCols + c] = -kInf;
  }
};

}  // namespace

TEST_CASE("fold with modifiers and row ranges equals the element-wise mask and separate passes",
          "[exact]") {
  const ModTile t;
  for_each_isa([&] {
    for (int parts = 0; parts < 8; ++parts) {
      INFO("parts " << parts);
      const kernels::detail::ScoreMods ranged = t.ranged(parts);
      const kernels::detail::ScoreMods plain = t.mods(parts);
      std::vector<float> out_range(t.rows * t.dv), out_elements(t.rows * t.dv),
          out_separate(t.rows * t.dv), lse_range(t.rows), lse_elements(t.rows),
          lse_separate(t.rows);
      kernels::OnlineSoftmax a(t.dk, t.dv), b(t.dk, t.dv), c(t.dk, t.dv);
      a.start(t.q.data(), t.rows, 0.3f);  // the row ranges inside the fused pass
      a.scores(t.kt.data(), t.cols, t.cols);
      a.fold(t.v.data(), t.dv, t.cols, &ranged);
      a.finish(out_range.data(), t.dv, lse_range.data());
      b.start(t.q.data(), t.rows, 0.3f);  // masked element by element first
      t.mask_elements(b.scores(t.kt.data(), t.cols, t.cols));
      b.fold(t.v.data(), t.dv, t.cols, &plain);
      b.finish(out_elements.data(), t.dv, lse_elements.data());
      c.start(t.q.data(), t.rows, 0.3f);  // the modifiers as a pass of their own, then the mask
      float* s = c.scores(t.kt.data(), t.cols, t.cols);
      kernels::score_mods(plain, s, kernels::OnlineSoftmax::kCols, t.rows, t.cols);
      t.mask_elements(s);
      c.fold(t.v.data(), t.dv, t.cols);
      c.finish(out_separate.data(), t.dv, lse_separate.data());
      // The same operations on the same floats: equal, not merely close.
      CHECK(out_range == out_elements);
      CHECK(lse_range == lse_elements);
      CHECK(out_range == out_separate);
      CHECK(lse_range == lse_separate);
      CHECK(lse_range[3] == -kInf);  // the row that sees nothing
    }
  });
}

TEST_CASE("the backward with modifiers and row ranges equals the element-wise mask", "[exact]") {
  const ModTile t;
  for_each_isa([&] {
    for (int parts = 0; parts < 8; ++parts) {
      INFO("parts " << parts);
      const kernels::detail::ScoreMods ranged = t.ranged(parts);
      const kernels::detail::ScoreMods plain = t.mods(parts);
      // The forward's outputs and row log-sum-exp, which the backward reads.
      std::vector<float> out(t.rows * t.dv), lse(t.rows);
      kernels::OnlineSoftmax f(t.dk, t.dv);
      f.start(t.q.data(), t.rows, 0.3f);
      f.scores(t.kt.data(), t.cols, t.cols);
      f.fold(t.v.data(), t.dv, t.cols, &ranged);
      f.finish(out.data(), t.dv, lse.data());
      struct Result {
        std::vector<float> dq, dk, dv, d_bias, row_sums, col_sums, alibi;
      };
      const auto run = [&](const kernels::detail::ScoreMods& m, bool elements) {
        Result g{std::vector<float>(t.rows * t.dk),       std::vector<float>(t.cols * t.dk, 0.0f),
                 std::vector<float>(t.cols * t.dv, 0.0f), std::vector<float>(t.rows * t.cols, 0.0f),
                 std::vector<float>(t.rows, 0.0f),        std::vector<float>(t.cols, 0.0f),
                 std::vector<float>(t.rows, 0.0f)};
        std::vector<float*> bias_rows;
        for (std::size_t r = 0; r < t.rows; ++r) bias_rows.push_back(g.d_bias.data() + r * t.cols);
        kernels::detail::ScoreModsGrad grads{};
        grads.unit = 1.4f;
        if (m.bias_rows) grads.bias_rows = bias_rows.data(), grads.bias_step = 1;
        if (m.row_add) grads.row_sums = g.row_sums.data(), grads.col_sums = g.col_sums.data();
        if (m.row_pos) grads.alibi_rows = g.alibi.data();
        grads.col_sums_step = 1;
        kernels::SoftmaxBackward b(t.dk, t.dv);
        b.start(t.q.data(), t.dk, out.data(), t.out_grad.data(), t.dv, lse.data(), 1, t.rows, 0.3f);
        float* s = b.scores(t.kt.data(), t.cols, t.cols);
        if (elements) t.mask_elements(s);
        b.gradient(t.vt.data(), t.cols, t.cols, &m, &grads);
        b.accumulate(t.k.data(), t.dk, g.dk.data(), t.dk, g.dv.data(), t.dv, t.cols);
        b.finish(g.dq.data(), t.dk);
        return g;
      };
      const Result a = run(ranged, false), e = run(plain, true);
      CHECK(a.dq == e.dq);
      CHECK(a.dk == e.dk);
      CHECK(a.dv == e.dv);
      CHECK(a.d_bias == e.d_bias);
      CHECK(a.row_sums == e.row_sums);
      CHECK(a.col_sums == e.col_sums);
      CHECK(a.alibi == e.alibi);
      if (parts & 2) CHECK(a.alibi != std::vector<float>(t.rows, 0.0f));  // taken at all
    }
  });
}
