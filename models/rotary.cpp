#include "models/rotary.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "attnlab/error.hpp"

namespace attnlab::models {

Rotary::Rotary(std::size_t head_dim, double base) : head_dim_(head_dim), base_(base) {
  if (head_dim == 0 || head_dim % 2 != 0)
    throw Error("rotary embeddings: head dimension " + std::to_string(head_dim) +
                " (d_model / heads), expected an even number: channel j turns with channel j + " +
                "head_dim / 2");
  if (!(base > 0) || !std::isfinite(base))
    throw Error("rotary embeddings: rope_base=" + std::to_string(base) +
                ", expected a finite number > 0");
}

void Rotary::apply(Tensor& x, bool inverse, std::size_t first,
                   std::size_t rows_per_position) const {
  if (x.shape()[3] != head_dim_)
    throw Error("rotary embeddings: heads of dimension " + std::to_string(x.shape()[3]) +
                ", expected " + std::to_string(head_dim_));
  const std::size_t rows = x.shape()[0] * x.shape()[1], n = x.shape()[2], half = head_dim_ / 2;
  // cos and sin of every (position, frequency), once for all rows.
  std::vector<float> cos(n * half), sin(n * half);
  for (std::size_t j = 0; j < half; ++j) {
    const double theta = std::pow(base_, -2.0 * double(j) / double(head_dim_));
    for (std::size_t p = 0; p < n; ++p) {
      const double angle = double(first + p / rows_per_position) * theta;
      cos[p * half + j] = static_cast<float>(std::cos(angle));
      sin[p * half + j] = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
    }
  }
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t p = 0; p < n; ++p) {
      float* v = x.data() + (r * n + p) * head_dim_;
      const float* c = &cos[p * half];
      const float* s = &sin[p * half];
      for (std::size_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a * c[j] - b * s[j];
        v[j + half] = b * c[j] + a * s[j];
      }
    }
}

}  // namespace attnlab::models
