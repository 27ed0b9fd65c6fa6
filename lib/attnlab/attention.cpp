#include "attnlab/attention.hpp"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <limits>
#include <tuple>

#include "attnlab/error.hpp"

namespace attnlab {
namespace {

// "q has NaN at [0, 1, 5, 3] of [...]" for the first non-finite entry of t, or "" when there is
// none. For k and v (`keys`) only the rows a query may read count: padded keys are never read, so
// their contents do not matter. The scan runs at memory speed: |x| <= FLT_MAX is false for NaN and
// Inf and vectorises, and the (item, head) slices are shared among the threads.
std::string non_finite(const Tensor& t, const char* label, const Mask& mask, bool keys) {
  const std::size_t heads = t.shape()[1], n = t.shape()[2], dim = t.shape()[3];
  const auto rows = [&](std::size_t b) {
    return keys && mask.has_key_lengths() ? static_cast<std::size_t>(mask.key_lengths[b]) : n;
  };
  const auto slices = static_cast<std::ptrdiff_t>(t.shape()[0] * heads);
  int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (t.size() > (1 << 18))
  for (std::ptrdiff_t s = 0; s < slices; ++s) {
    const float* p = t.data() + static_cast<std::size_t>(s) * n * dim;
    const std::size_t count = rows(static_cast<std::size_t>(s) / heads) * dim;
    for (std::size_t i = 0; i < count; ++i) bad |= !(std::abs(p[i]) <= FLT_MAX);
  }
  if (!bad) return "";
  for (std::size_t s = 0;; ++s)
    for (std::size_t i = 0; i < rows(s / heads) * dim; ++i) {
      const float x = t.data()[s * n * dim + i];
      if (std::isfinite(x)) continue;
      const std::size_t index[] = {s / heads, s % heads, i / dim, i % dim};
      std::string where = label;  // appended piece by piece: GCC 12 misreads a + chain here
      where.append(" has ").append(std::isnan(x) ? "NaN" : "Inf").append(" at [");
      for (std::size_t a = 0; a < 4; ++a) where.append(a ? ", " : "").append(std::to_string(index[a]));
      return where.append("] of ").append(shape_string(t));
    }
}

}  // namespace

std::string Support::describe() const {
  std::string out;
  auto item = [&](bool on, const char* what) {
    if (!on) return;
    if (!out.empty()) out += ", ";
    out += what;
  };
  item(causal, "causal");
  item(causal_cross, "causal cross-attention");
  item(key_lengths, "key padding");
  item(allowed, "boolean mask");
  item(cross, "cross-attention (Nq != Nk)");
  item(value_dim, "Dv != Dk");
  return out.empty() ? "no masks" : out;
}

double Attention::flops(const Dims&, const Mask&) const {
  return std::numeric_limits<double>::quiet_NaN();
}

std::string Attention::name() const {
  const std::string s = spec();
  return s.substr(0, s.find(':'));
}

Tensor Attention::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Mask& mask) const {
  Tensor out;
  forward(q, k, v, mask, out);
  return out;
}

void Attention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                        Tensor& out) const {
  if (&out == &q || &out == &k || &out == &v)
    throw Error(name() + ": forward's output must not be one of q, k, v (it is read while out "
                         "is written)");
  const Dims d = check_qkv(q, k, v);
  mask.validate(d);
  // Checked here, not left to show in the output: the kernels clamp logits, so a NaN in q or k
  // would pass as a silently ignored key.
  for (const auto& [t, label, keys] : {std::tuple{&q, "q", false}, std::tuple{&k, "k", true},
                                       std::tuple{&v, "v", true}})
    if (const std::string bad = non_finite(*t, label, mask, keys); !bad.empty())
      throw Error(name() + ": " + bad + ": inputs must be finite");
  const Support s = support();
  const auto refuse = [&](const std::string& feature) {
    const std::string why = why_unsupported(feature);
    throw Unsupported(name(), why.empty() ? feature : feature + ": " + why);
  };
  const bool causal = mask.causal != Causal::none;
  if (causal && !s.causal) refuse("causal masks");
  if (causal && d.nq != d.nk && !s.causal_cross) refuse("causal masks with Nq != Nk");
  if (mask.has_key_lengths() && !s.key_lengths) refuse("key padding");
  if (mask.has_allowed() && !s.allowed) refuse("boolean masks");
  if (d.nq != d.nk && !s.cross) refuse("cross-attention (Nq != Nk)");
  if (d.dv != d.dk && !s.value_dim) refuse("Dv != Dk");
  const std::array<std::size_t, 4> shape = {d.batch, d.heads, d.nq, d.dv};
  if (!std::equal(shape.begin(), shape.end(), out.shape().begin())) out.resize(shape);
  compute(q, k, v, mask, d, out);
}

}  // namespace attnlab
