// Minimal NumPy .npy files (format 1.0/2.0, little-endian float32/float64, C order): enough to
// hand tensors to the Python peers and to read users' activations back.
#pragma once

#include <string>

#include "attnlab/tensor.hpp"

namespace attnlab::harness {

/// Writes a float32 [B, H, N, D] tensor; throws Error when the file cannot be written.
void save_npy(const std::string& path, const Tensor& t);

/// Reads a 4-d float32 or float64 array (float64 is rounded to float32). Throws Error naming the
/// file and what is wrong (missing, not .npy, Fortran order, wrong dtype or rank).
Tensor load_npy(const std::string& path);

}  // namespace attnlab::harness
