// The one attention interface. Every backend, exact or approximate, is an Attention built by
// make_attention("name:key=value,...") and called as forward(q, k, v, mask); the harness, the
// CLI, the model layers and the tests all go through this door.
#pragma once

#include <string>

#include "attnlab/mask.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

/// What a backend can honour. Anything requested outside it throws Unsupported.
struct Support {
  bool causal = true;        ///< causal masks with Nq == Nk
  bool causal_cross = true;  ///< causal masks with Nq != Nk (both alignments)
  bool key_lengths = true;   ///< key padding
  bool allowed = true;       ///< arbitrary boolean masks
  bool cross = true;         ///< Nq != Nk
  bool value_dim = true;     ///< Dv != Dk

  /// "causal, key padding, boolean mask, ...": the features that are supported.
  std::string describe() const;
};

/// The one attention interface: every backend, exact or approximate, is an Attention built by
/// make_attention(spec) and called through forward().
class Attention {
 public:
  virtual ~Attention() = default;

  /// q [B,H,Nq,Dk], k [B,H,Nk,Dk], v [B,H,Nk,Dv] -> [B,H,Nq,Dv]. Validates shapes and mask
  /// (throws Error), then refuses what support() excludes (throws Unsupported), then computes.
  /// A NaN or Inf in q, or in a key or value row that is not padding, throws Error naming the
  /// tensor and the index (padded rows are never read); finite inputs give a finite output.
  /// Thread-safe: several threads may call forward on one object at once (tests/test_threads.cpp,
  /// run under ThreadSanitizer in CI); each call uses its own OpenMP team.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask = {}) const;

  /// The same, written into `out`, which is resized only when its shape is not [B,H,Nq,Dv]:
  /// repeated calls at one shape reuse its storage. A fresh output above malloc's mmap threshold
  /// is page-faulted in on every call (40 to 60 ms for 128 MiB on our 2-core VM, a third of
  /// linear attention's forward at N = 65536: results/linear). `out` must not be q, k or v
  /// (throws Error); when a call throws, out's contents are unspecified.
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
               Tensor& out) const;

  /// The canonical factory string, every key in a fixed order: make_attention(spec()) rebuilds
  /// an identical backend.
  virtual std::string spec() const = 0;

  /// The masks and shapes this backend can honour; forward() refuses the rest (Unsupported).
  virtual Support support() const = 0;

  /// The factory name, the part of spec() before ':'.
  std::string name() const;

  /// Useful floating-point operations of one forward call on these sizes (a multiply-add counts
  /// 2), as the variant's header documents them; the harness divides by the time for GFLOP/s.
  /// NaN when the variant does not say (the default).
  virtual double flops(const Dims& d, const Mask& mask) const;

 protected:
  /// Why this backend cannot honour `feature` ("causal masks", "boolean masks", ...): appended
  /// to the Unsupported message, so a user learns the reason, not just the refusal. Empty: none.
  virtual std::string why_unsupported(const std::string& /*feature*/) const { return {}; }

  /// Called with validated, supported input only; `out` is [B,H,Nq,Dv] with unspecified
  /// contents, every element of which compute must write.
  virtual void compute(const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                       const Dims& d, Tensor& out) const = 0;
};

}  // namespace attnlab
