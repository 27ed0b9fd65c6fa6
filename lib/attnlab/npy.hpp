// NumPy .npy files (format 1.0, 2.0 and 3.0; little-endian; C order), the interop format of the
// CLI and the harness. Reads float32/float64 arrays (float64 is rounded to float32), bool/uint8
// masks and one-dimensional int32/int64 arrays (offsets, lengths); writes float32. Every failure
// throws Error naming the file and the problem: missing file, bad magic or header, truncated data,
// wrong dtype (which one was found, which are accepted), Fortran order, wrong rank, a NaN or Inf in
// the values (and where).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include "attnlab/tensor.hpp"

namespace attnlab {

/// A float32 or float64 array whose rank is one of `ranks`, as float32. Rejects NaN and Inf.
xt::xarray<float> load_npy_float(const std::string& path,
                                 const std::vector<std::size_t>& ranks = {2, 3, 4});

/// A bool or uint8 array (uint8 entries must be 0 or 1) whose rank is one of `ranks`.
xt::xarray<bool> load_npy_mask(const std::string& path,
                               const std::vector<std::size_t>& ranks = {2, 3, 4});

/// A one-dimensional int32 or int64 array (offsets such as cu_seqlens, lengths) as int64.
std::vector<std::int64_t> load_npy_ints(const std::string& path);

/// Writes `a` as float32 ("<f4", C order, format 1.0). The file appears atomically (written to a
/// temporary name beside it, then renamed), so a failure never leaves a partial `path`.
void save_npy(const std::string& path, const xt::xarray<float>& a);

/// [N, D] -> [1, 1, N, D], [H, N, D] -> [1, H, N, D], [B, H, N, D] unchanged; `what` names the
/// array in the error for any other rank ("q.npy").
Tensor to_bhnd(const xt::xarray<float>& a, const std::string& what);

/// The same lift for boolean masks: [Nq, Nk] -> [1, 1, Nq, Nk], [H, Nq, Nk] -> [1, H, Nq, Nk].
xt::xtensor<bool, 4> mask_to_bhnd(const xt::xarray<bool>& a, const std::string& what);

/// Undoes to_bhnd: drops leading axes so the result has `rank` (2, 3 or 4) axes. The dropped axes
/// must have size 1 (throws Error otherwise).
xt::xarray<float> from_bhnd(const Tensor& t, std::size_t rank);

}  // namespace attnlab
