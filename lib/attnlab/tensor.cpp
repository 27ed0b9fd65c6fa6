#include "attnlab/tensor.hpp"

#include "attnlab/error.hpp"

namespace attnlab {

TensorRef::TensorRef(const float* data, const Shape& shape) : data_(data), shape_(shape) {
  if (!data && size() != 0)
    throw Error("tensor view " + shape_string(*this) + ": no data (a null pointer)");
}

std::string shape_string(TensorRef t) {
  std::string s = "[";
  for (std::size_t i = 0; i < t.shape().size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape()[i]);
  }
  return s + "]";
}

Dims check_qkv(TensorRef q, TensorRef k, TensorRef v) {
  const auto& qs = q.shape();
  const auto& ks = k.shape();
  const auto& vs = v.shape();
  auto fail = [&](const std::string& why) {
    throw Error("attention inputs q " + shape_string(q) + ", k " + shape_string(k) + ", v " +
                shape_string(v) + ": " + why);
  };
  if (qs[0] != ks[0] || qs[0] != vs[0]) fail("batch sizes differ");
  if (ks[1] != vs[1])
    fail("head counts differ: k has " + std::to_string(ks[1]) + " heads, v " +
         std::to_string(vs[1]) + " (both Hkv)");
  if (ks[1] == 0 || qs[1] % ks[1] != 0)
    fail("head counts: H = " + std::to_string(qs[1]) + " query heads is not a multiple of Hkv = " +
         std::to_string(ks[1]) + " key and value heads (grouped heads need H = g · Hkv)");
  if (ks[2] != vs[2]) fail("k and v have different sequence lengths");
  if (qs[3] != ks[3]) fail("q and k have different head dims (Dk)");
  Dims d{qs[0], qs[1], qs[2], ks[2], qs[3], vs[3], ks[1]};
  if (d.batch == 0 || d.heads == 0 || d.nq == 0 || d.nk == 0 || d.dk == 0 || d.dv == 0)
    fail("every dimension must be at least 1");
  return d;
}

}  // namespace attnlab
