// Shared test helpers: seeded inputs and a tolerance check that says where it failed.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "attnlab/attnlab.hpp"

namespace attnlab::test {

/// Standard normal entries times `stddev`, reproducible from `seed`.
inline Tensor random_tensor(std::size_t b, std::size_t h, std::size_t n, std::size_t d,
                            std::uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  Tensor t = Tensor::from_shape({b, h, n, d});
  for (float& x : t) x = normal(rng);
  return t;
}

/// |out - ref| <= atol + rtol * |ref| everywhere; on failure reports the first bad element.
inline void require_close(const Tensor& out, const Tensor64& ref, double rtol, double atol) {
  REQUIRE(shape_string(out) == shape_string(xt::cast<float>(ref)));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double o = out.data()[i], r = ref.data()[i];
    if (!(std::abs(o - r) <= atol + rtol * std::abs(r))) {
      FAIL("element " << i << " of " << shape_string(out) << ": got " << o << ", expected " << r
                      << " (rtol " << rtol << ", atol " << atol << ")");
    }
  }
}

}  // namespace attnlab::test
