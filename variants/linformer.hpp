// linformer: softmax attention over keys and values projected to k rows along the sequence
// (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity", arXiv 2006.04768).
//
// For each item b and head h, with E_h, F_h in R^{k x max_len} and Nk <= max_len keys:
//   K' = E_h[:, :Nk] · K   [k, Dk],   V' = F_h[:, :Nk] · V   [k, Dv],
//   out = softmax(Q K'^T · scale) V'   — only the first Nk columns are used (the fairseq way), so
// any length up to max_len works. The attention over (Q, K', V') runs on kernels::OnlineSoftmax,
// the engine of our exact `full` kernel, in the same parallel region as the projections.
//
// Spec: "linformer:k=256,share=none,init=gaussian,max_len=4096,seed=0"
//   k        rows of E and F (the projected length); 1 <= k <= max_len. k may exceed Nk: the
//            k projected keys are then mixtures of fewer tokens (correct, only not cheaper).
//   share    none: each head has its own E_h and F_h (2·H matrices);
//            kv: E_h = F_h for each head (H matrices; the paper's key-value sharing);
//            layer: one matrix E for every head and for both keys and values (F = E; the paper's
//            "layerwise" sharing, restricted to this one attention object).
//   init     gaussian: i.i.d. N(0, 1/k) entries (the paper's Johnson-Lindenstrauss theory);
//            xavier: Glorot uniform U(-a, a), a = sqrt(6 / (k + max_len)) (fan_in = max_len,
//            fan_out = k; fairseq uses xavier_uniform_ for its compress_k layer);
//            identity: E = [I_k | 0] (keeps the first k tokens).
//            Drawn per (matrix, head) column by column from seed, so column j never depends on
//            Nk and the same seed gives bitwise-identical output. Columns are drawn on first use
//            and kept: they are the layer's parameters.
//   max_len  columns of E and F, the longest key sequence accepted; >= 1.
//   seed     >= 0; the only source of randomness.
// Learned matrices: set_projections(E, F) with shape [k, max_len] (shared by all heads) or
// [H, k, max_len] (one per head; H must then equal the heads of every call), E = F under
// share=kv and share=layer (and [k, max_len] under layer); spec() then says init=supplied, which
// make_attention refuses (the matrices are not in the string). Through the interface's one door
// (parameters(), set_parameters(), backward's AllGradients::parameters) the learned tensors are
// the distinct matrices of `share`: E and F [H, k, max_len] (none), E [H, k, max_len] (kv), E
// [k, max_len] (layer), each gradient the sum over the matrix's uses.
// Cost: O(B·H·Nk·k·(Dk + Dv)) for the projections (kernels::gemm_tile, in parallel over items,
// heads and K/V) plus O(B·H·Nq·k·(Dk + Dv)) for the attention: linear in N for fixed k. Memory
// beyond inputs and output: a transposed copy of K and V, O(B·H·Nk·(Dk + Dv)), the projected
// K', V', O(B·H·k·(Dk + Dv)), and the drawn matrices, k·Nk floats per distinct matrix.
// Thread safety: forward() may be called concurrently; the projections run under a lock.
// Masks: key padding (keys and values j >= key_lengths[b] are zeroed before the projection, so
// they still hold softmax weight exp(0 - max) but add nothing to the values — the fairseq rule),
// cross-attention (projection on the key side), Dv != Dk, explicit scale. Causal masks and boolean
// masks are Unsupported: every projected key mixes all positions (see why_unsupported).
// Backward: K' and V' are recomputed (O(B·H·Nk·k·(Dk + Dv)), the forward's projection cost),
// full attention's FlashAttention-2 backward gives dQ, dK', dV' from the saved row
// log-sum-exp, then dK = E^T dK' and dV = F^T dV' on the unpadded rows.
// The backward also returns, as AllGradients::parameters "E" and "F" (one "E" under share=kv
// or layer), dE = dK' K^T and dF = dV' V^T summed over the batch (and over a tied matrix's
// uses): E and F are learned. Extra memory O(B·H·k·(Dk + Dv)) plus O(H·k·max_len) for dE and dF.
// Exact reduction: k = Nk with init=identity gives full attention (K' = K, V' = V exactly).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include "attnlab/attention.hpp"
#include "attnlab/factory.hpp"

namespace attnlab {

/// Linformer: keys and values projected along the sequence to k rows (see above).
class LinformerAttention final : public Attention {
 public:
  /// Which projections are shared: none (E, F per head), kv (E = F), layer (one for all heads).
  enum class Share { none, kv, layer };
  /// How E and F are drawn: N(0, 1/k), Xavier, identity rows, or supplied by set_projections.
  enum class Init { gaussian, xavier, identity, supplied };

  /// Throws Error naming k or max_len when 1 <= k <= max_len does not hold.
  LinformerAttention(std::size_t k, Share share, Init init, std::size_t max_len,
                     std::uint64_t seed);

  std::string spec() const override;
  Support support() const override;
  double flops(const Dims& d, const Mask& mask) const override;

  /// Replaces the drawn matrices by learned ones: [k, max_len] shared by all heads, or
  /// [H, k, max_len] one per head. Throws Error naming E or F and the expected shape, or when
  /// E != F under share=kv or layer, or E is per head under share=layer.
  void set_projections(const xt::xarray<float>& e, const xt::xarray<float>& f);

  /// The distinct matrices of `share` (see the header comment) as `heads` heads use them.
  std::vector<ParameterTensor> parameters(std::size_t heads) const override;
  /// set_projections from the distinct matrices of `share`, named and shaped as parameters().
  void set_parameters(const std::vector<ParameterTensor>& values) override;

  /// The first `columns` columns of E (which = 'E') or F (which = 'F') for `head`, [k, columns].
  xt::xtensor<float, 2> projection(char which, std::size_t head, std::size_t columns) const;

  /// Projected length k.
  std::size_t k() const { return k_; }
  /// The longest sequence the projections cover.
  std::size_t max_len() const { return max_len_; }

 protected:
  std::string why_unsupported(const std::string& feature) const override;
  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const override;
  /// Also reports E's and F's gradients as parameters (see the header comment).
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const override;

 private:
  // The gradients of one call with respect to the projection matrices, [H, k, max_len] each:
  // d_e[h] through head h's use of its E, d_f[h] through its use of its F; columns >= Nk are
  // zero. A tied matrix's gradient is the sum over its uses.
  struct ProjectionGradients {
    xt::xtensor<float, 3> d_e, d_f;
  };
  // Each head's E and F, stored transposed (Matrix::et); valid while mutex_ is held.
  struct Projections {
    std::vector<const float*> e, f;
  };
  // Throws Error when Nk or the heads do not fit the matrices; each item's unpadded length.
  std::vector<std::size_t> check_call(const Mask& mask, const Dims& d) const;
  Projections projections(const Dims& d) const;  // call with mutex_ held
  void run(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const Dims& d, Tensor& out,
           float* lse) const;
  void backward_impl(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const Dims& d,
                     TensorRef out, TensorRef d_out, const RowLogSumExp& lse, Gradients& g,
                     ProjectionGradients& grads) const;
  // dE and dF from dK', dV' (projected.dk, projected.dv) and the unpadded keys and values.
  void projection_gradients(TensorRef k, TensorRef v, const Dims& d,
                            const std::vector<std::size_t>& lengths, const Gradients& projected,
                            ProjectionGradients& grads) const;

  // One matrix, stored transposed ([columns, k]: column j of E contiguous) so that it grows by
  // columns without moving the ones already drawn.
  struct Matrix {
    std::mt19937_64 rng;
    std::vector<float> et;
    std::size_t columns = 0;
  };
  // The matrix playing `which` ('E' or 'F') for `head`, with at least `columns` columns drawn.
  // Call with mutex_ held; the reference stays valid while it is held.
  const Matrix& matrix(char which, std::size_t head, std::size_t columns) const;
  void draw_columns(Matrix& m, std::size_t columns) const;

  std::size_t k_, max_len_;
  Share share_;
  Init init_;
  std::uint64_t seed_;
  mutable std::mutex mutex_;  // guards matrices_, which forward() grows on demand
  mutable std::map<std::pair<int, std::size_t>, Matrix> matrices_;  // (0 = E / 1 = F, head)
  std::size_t supplied_heads_ = 0;                                  // 1 or H after set_projections
};

/// The factory's maker for "linformer:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_linformer(Params& params);

}  // namespace attnlab
