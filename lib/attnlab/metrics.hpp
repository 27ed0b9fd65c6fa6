// Error of an output against a reference, defined once for the harness and the tests.
// Rows are the [b, h, i, :] vectors of length Dv.
#pragma once

#include <string>

#include "attnlab/tensor.hpp"

namespace attnlab {

/// How far an output is from a reference (compare()).
struct ErrorMetrics {
  double rel_fro = 0;   ///< ||out - ref||_F / ||ref||_F  (||out - ref||_F when ref is all zero)
  double max_abs = 0;   ///< max |out - ref|
  double mean_cos = 1;  ///< mean cosine similarity of rows; 1 for a pair of zero rows, 0 for one
  double p99_row = 0;  ///< 99th percentile of per-row ||out - ref|| / ||ref|| (absolute if ref = 0)
  /// "rel_fro=... max_abs=... mean_cos=... p99_row=..." for messages and logs.
  std::string str() const;
};

/// Shapes must match (throws Error otherwise).
ErrorMetrics compare(const Tensor& out, const Tensor64& ref);

/// The same metrics for `rows` rows of `width` floats each, against a float32 reference (e.g.
/// one model's activations against another's); allocates only one double per row.
ErrorMetrics compare(const float* out, const float* ref, std::size_t rows, std::size_t width);

}  // namespace attnlab
