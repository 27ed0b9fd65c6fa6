// What the task generators (training/tasks/*.cpp) share: the seeded random stream of a batch, a
// bounded integer key, an empty batch. Internal (not installed).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "attnlab/factory.hpp"
#include "attnlab/seed.hpp"
#include "training/tasks.hpp"

namespace attnlab::training::detail {

/// A batch's random stream: splitmix64 of the seed, then mt19937_64, whose output is the same on
/// every platform; draws use only its raw 64-bit output, not std's distributions (whose
/// algorithms differ between standard libraries).
class Random {
 public:
  /// The stream of batch seed `seed`.
  explicit Random(std::uint64_t seed) : engine_(stream_seed(seed)) {}
  /// Uniform in [0, k), k >= 1.
  std::size_t below(std::size_t k) { return static_cast<std::size_t>(unit() * double(k)); }
  /// Uniform in [0, 1).
  double unit() { return double(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

/// The integer value of `key` (or `fallback`), which must lie in [lo, hi].
inline std::size_t bounded(Params& p, const std::string& key, std::int64_t fallback,
                           std::int64_t lo, std::int64_t hi) {
  const std::int64_t v = p.integer(key, fallback);
  if (v < lo || v > hi)
    p.fail(key, "expected " + std::to_string(lo) + " <= " + key + " <= " + std::to_string(hi));
  return static_cast<std::size_t>(v);
}

/// `size` sequences of n tokens, every target kNoTarget, no padding.
inline Batch empty_batch(std::size_t size, std::size_t n, std::size_t target_columns) {
  Batch b;
  b.tokens = models::Tokens::from_shape({size, n});
  b.targets = models::Tokens::from_shape({size, target_columns});
  b.targets.fill(kNoTarget);
  b.lengths.assign(size, static_cast<std::int64_t>(n));
  return b;
}

}  // namespace attnlab::training::detail
