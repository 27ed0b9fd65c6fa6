// Learned tensors of the model layers: named references, seeded initialisation, and the weights
// folder.
//
// Layout, used by every model layer: activations are float32 [batch, seq, features], row-major;
// a weight matrix is [out_features, in_features] and a bias [out_features], as in
// torch.nn.Linear, so y = x W^T + b.
//
// The weights folder holds one .npy file per learned tensor, named by its PyTorch state_dict key:
// "<key>.npy", e.g. "layers.0.self_attn.in_proj_weight.npy". A model built like its PyTorch twin
// (see models/transformer.hpp for the names) loads the twin's weights as they are:
//     for key, t in module.state_dict().items(): numpy.save(f"{dir}/{key}.npy", t.numpy())
// Files are float32 or float64 (rounded to float32) of exactly the parameter's shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <xtensor/xtensor.hpp>

namespace attnlab::models {

/// Activations [batch, seq, features].
using Activations = xt::xtensor<float, 3>;
/// A weight matrix [out, in].
using Matrix = xt::xtensor<float, 2>;
/// A bias or LayerNorm vector.
using Vector = xt::xtensor<float, 1>;

/// One learned tensor as the weights folder (and a backward pass) sees it: its state_dict key, its
/// shape and the layer's own row-major storage.
struct ParameterRef {
  std::string name;                ///< e.g. "layers.0.linear1.weight"
  std::vector<std::size_t> shape;  ///< e.g. {2048, 512}
  float* data = nullptr;           ///< the layer's storage, product(shape) floats

  /// The number of elements, product(shape).
  std::size_t size() const;
};

/// A layer's learned tensors in a fixed order (PyTorch's state_dict order).
using Parameters = std::vector<ParameterRef>;

/// A reference to `m` named `name`.
ParameterRef parameter(const std::string& name, Matrix& m);
/// A reference to `v` named `name`.
ParameterRef parameter(const std::string& name, Vector& v);

/// Writes `dir/NAME.npy` (float32) for every parameter, creating `dir` when needed; each file
/// appears atomically. Throws Error naming the file that could not be written.
void save_weights(const std::string& dir, const Parameters& params);

/// Reads `dir/NAME.npy` into every parameter. Every file is read and checked (exists, float32 or
/// float64, exactly the parameter's shape, no NaN or Inf) before any parameter is written, so a
/// failure changes nothing; the Error names the file, the shape found and the one expected.
/// Returns the names of the .npy files in `dir` that no parameter read (sorted), for a note.
std::vector<std::string> load_weights(const std::string& dir, const Parameters& params);

/// U(-bound, bound) entries from a stream of its own, derived from (seed, p.name): the same seed
/// gives the same tensor under the same name whatever else the model holds.
void fill_uniform(const ParameterRef& p, double bound, std::uint64_t seed);

/// N(0, stddev^2) entries from the stream of (seed, p.name), as fill_uniform.
void fill_normal(const ParameterRef& p, double stddev, std::uint64_t seed);

/// Every entry `value`.
void fill_constant(const ParameterRef& p, float value);

}  // namespace attnlab::models
