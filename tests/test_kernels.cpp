// The kernels of every instruction-set path this CPU runs (scalar, AVX2, AVX-512), each against a
// float64 computation, on sizes that are not multiples of any vector width or register block.
// The variants' own tests run again under each forced path (ATTNLAB_ISA, tests/meson.build).
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attnlab/kernels.hpp"
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
