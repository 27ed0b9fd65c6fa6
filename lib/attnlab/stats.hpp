// Order statistics of measured samples (timings): one quantile and one median for the harness,
// the trainer's time split and the studies. Internal (not installed).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "attnlab/error.hpp"

namespace attnlab {

/// The p-quantile (0 <= p <= 1) of ascending `sorted` (not empty), interpolated linearly between
/// the two nearest ranks: numpy's default (method "linear").
inline double quantile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) throw Error("quantile: no samples");
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

/// The median of `x` (not empty): the middle value, or the mean of the middle two for an even
/// count (quantile 0.5, up to rounding: computed as (a + b) / 2).
inline double median(std::vector<double> x) {
  if (x.empty()) throw Error("median: no samples");
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

}  // namespace attnlab
