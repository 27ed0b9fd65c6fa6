#include "attnlab/attention.hpp"

#include <algorithm>
#include <array>
#include <limits>

#include "attnlab/error.hpp"

namespace attnlab {

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
