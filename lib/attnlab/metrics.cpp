#include "attnlab/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "attnlab/error.hpp"

namespace attnlab {

std::string ErrorMetrics::str() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "rel_fro=%.3e max_abs=%.3e mean_cos=%.6f p99_row=%.3e", rel_fro,
                max_abs, mean_cos, p99_row);
  return buf;
}

namespace {

// The metrics of `count` rows of `width` values; the reference in float or double.
template <class Ref>
ErrorMetrics compare_rows(const float* out, const Ref* ref, std::size_t count, std::size_t width) {
  ErrorMetrics m;
  if (count == 0 || width == 0) return m;
  double diff2 = 0, ref2 = 0, cos_sum = 0;
  std::vector<double> row_err(count);
  for (std::size_t r = 0; r < count; ++r) {
    const float* o = out + r * width;
    const Ref* e = ref + r * width;
    double rd = 0, rr = 0, oo = 0, oe = 0;
    for (std::size_t c = 0; c < width; ++c) {
      const double delta = static_cast<double>(o[c]) - e[c];
      m.max_abs = std::max(m.max_abs, std::abs(delta));
      rd += delta * delta;
      rr += static_cast<double>(e[c]) * e[c];
      oo += static_cast<double>(o[c]) * o[c];
      oe += o[c] * static_cast<double>(e[c]);
    }
    diff2 += rd;
    ref2 += rr;
    row_err[r] = rr > 0 ? std::sqrt(rd / rr) : std::sqrt(rd);
    if (oo == 0 && rr == 0)
      cos_sum += 1;
    else if (oo > 0 && rr > 0)
      cos_sum += oe / std::sqrt(oo * rr);
  }
  m.rel_fro = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  m.mean_cos = cos_sum / static_cast<double>(count);
  // Nearest-rank percentile: the smallest error at or above 99% of the rows.
  const std::size_t rank = static_cast<std::size_t>(std::ceil(0.99 * count)) - 1;
  std::nth_element(row_err.begin(), row_err.begin() + rank, row_err.end());
  m.p99_row = row_err[rank];
  if (std::isnan(diff2)) m.rel_fro = m.max_abs = m.p99_row = std::nan("");
  return m;
}

}  // namespace

ErrorMetrics compare(const Tensor& out, const Tensor64& ref) {
  if (!std::equal(out.shape().begin(), out.shape().end(), ref.shape().begin()))
    throw Error("compare: output " + shape_string(out) + " and reference shapes differ");
  const std::size_t width = out.shape()[3];
  return compare_rows(out.data(), ref.data(), width ? out.size() / width : 0, width);
}

ErrorMetrics compare(const float* out, const float* ref, std::size_t rows, std::size_t width) {
  return compare_rows(out, ref, rows, width);
}

}  // namespace attnlab
