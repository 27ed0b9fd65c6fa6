// linear: linear ("fast-weight") attention, a feature map phi in place of the softmax kernel,
// so that attention becomes a running memory of key-value outer products (Katharopoulos et al.
// 2020, "Transformers are RNNs"; Schlag, Irie, Schmidhuber 2021, "Linear Transformers Are
// Secretly Fast Weight Programmers"; Choromanski et al. 2020, Performer / FAVOR+).
//
// Spec: "linear:feature=elu1,m=256,nu=1,rule=sum,beta=1,eps=1e-06,seed=1" (the defaults).
//   feature  elu1 | relu | favor | dpfp | taylor, the map phi (feature_maps.hpp)  default elu1
//   m        favor's number of random features, >= 1                              default 256
//   nu       dpfp's number of rolls, 1 <= nu < 2·Dk (checked at forward time)      default 1
//   rule     sum | delta                                                           default sum
//   beta     delta rule's write strength, 0 < beta <= 1                            default 1
//   eps      sum rule's denominator guard, finite, >= 0                            default 1e-6
//   seed     favor's and taylor's projection                                       default 1
//   taylor_dim  taylor's feature dim d' (Based: 16), 0 <= d' <= Dk (checked at     default 0
//            forward time); 0: d' = Dk, no projection. Given and printed only with
//            feature=taylor (the other maps' canonical specs, and the results keyed by them,
//            stay as they were); with another feature it is refused. feature=taylor takes
//            rule=sum only (refused with delta: its mixed-sign features are not bounded by the
//            sum normalisation, and the delta rule's I - beta phi phi^T can then expand).
// Based (Arora et al. 2024) is feature=taylor with the sum rule, causal, beside a small
// sliding window in the model.
//
// What it computes, for each batch item and head:
//   rule=sum    out_i = phi(q_i)^T S / (phi(q_i)^T z + eps), S = sum_j phi(k_j) v_j^T,
//               z = sum_j phi(k_j); a row with phi(q_i)^T z = 0 outputs zeros.
//   rule=delta  phi(q), phi(k) sum-normalised (phi / sum(phi); a zero phi stays zero);
//               W_0 = 0, W_j = W_{j-1} + beta (v_j - W_{j-1} phi(k_j)) phi(k_j)^T.
//               Causal: out_i = W_i phi(q_i); non-causal: every query reads W_N.
// Sums and writes run over the keys a query sees: all valid keys, or under a causal mask keys
// j <= i (causal forms need Nq == Nk, where top-left and bottom-right agree).
// The softmax scale (Mask::scale, default 1/sqrt(Dk)) is used by favor only.
//
// FAVOR+ stabilisation: phi = exp(log phi - c) with c subtracted before exponentiating.
//   queries: c = the row's own max over its m log-features (cancels between numerator and
//            denominator up to eps; cancels exactly under the delta rule's normalisation);
//   keys:    sum rule: c_i = the max log-feature over all keys query i sees (global per head
//            when non-causal, the running prefix max when causal, so the recurrent state and
//            the causal batch agree and nothing overflows); delta rule: per key row (cancels).
//   The sum rule with favor is therefore exp-stabilised softmax-kernel estimation in which eps
//   is measured in units of the stabilised features.
//
// Kernels: a client of the scan engine (variants/linear_scan.hpp), one OpenMP task per (batch,
//   head). The sum rule runs the engine's sum rule with its key sum z carried beside S (the
//   engine's den output is phi(q)^T z), then divides the rows in place; favor's running key
//   stabiliser enters as the engine's log-decay, g_t = c_{t-1} - c_t <= 0 (decaying S and z
//   alike), keys as exp(E_t - c_t). The delta rule runs the engine's delta rule on the
//   sum-normalised features with the constant beta. Causal forms in the engine's chunks of 64
//   tokens (matrix products per chunk; the delta rule's WY/UT form), non-causal ones as chunked
//   state sums.
// Cost: O(B·H·N·(64·(Dphi + Dv) + Dphi·Dv)) time, O(B·H·Dphi·Dv) state memory, plus per thread
//   one head's features, O(N·Dphi), kept across calls (no page faults per call);
//   Dphi = Dk (elu1, relu), m (favor), 2·Dk·nu (dpfp), 1 + d' + d'^2 (taylor).
// FLOPs (flops()): those of the recurrent form, whatever kernel runs: per key, the memory write
//   (sum: 2·Dphi·(Dv + 1) for S and z; delta: 4·Dphi·Dv, read W phi(k) then the rank-1 update),
//   per query the read (sum: 2·Dphi·(Dv + 1); delta: 2·Dphi·Dv); favor adds 2·Dk·m per q and k
//   row for its projection, taylor 2·Dk·d' when it projects; elementwise feature maps (and
//   taylor's outer product) are not counted.
// Masks: causal (Nq == Nk), key padding (padded keys write nothing), cross-attention for the
//   non-causal forms, Dv != Dk. Boolean masks: Unsupported (no per-pair weights exist).
// Grouped KV heads (k, v [B, Hkv, Nk, D]): as the scan engine (a state per query head, phi(k)
//   of its KV head's keys; dk and dv summed over each group in head order).
// Recurrent state (TokenInputs::initial_state, Saved::final_state): S [B, H, Dphi, Dv], plus
//   the key sum z [B, H, Dphi] under rule=sum (the delta rule's W_0 is S_0^T); both enter the
//   sums above (num = phi(q)^T (S_0 + ...), den = phi(q)^T (z_0 + ...)). Not for favor with
//   rule=sum, whose stabilised S and z are relative to a running max kept outside them
//   (Unsupported).
// Packed documents (Mask::documents): each document on its own, as the scan engine runs them
//   (variants/linear_scan.hpp), favor's stabiliser restarting with each.
// Exactness: none against softmax; feature=favor approaches softmax attention as m grows;
// feature=taylor with d' = Dk weighs key j by exactly 1 + t + t^2/2, t = q·k / sqrt(Dk) (the
// second-order Taylor expansion of softmax's exp(t)), its normalised sum rule being that kernel's
// attention.
// Backward (every form above, every feature map; favor's stabilisers held constant, as
// Performer implementations do: they cancel up to eps, and exactly under the delta rule): the
// division's gradient (dnum = g / (den + eps), dden = -(g·out) / (den + eps); num and den from
// one more engine forward, which also saves the causal chunk states), then the engine's
// backward (variants/linear_scan.hpp: chunk by chunk in matrix products) on the same inputs,
// with dden as its den's
// gradient, then the sum normalisation's and the feature map's backward. O(B·H·N·(64·(Dphi +
// Dv) + Dphi·Dv)) time, O((N / 64 + 64)·Dphi·Dv) memory per head. Padded keys and values get
// zero gradients.
// Decoding (start_decoding): the recurrence, O(Dphi·Dv) per head and token, prefill in chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/attention.hpp"
#include "attnlab/factory.hpp"
#include "variants/feature_maps.hpp"

namespace attnlab {

/// How keys and values update the fast-weight memory: summed, or the delta rule.
enum class LinearRule { sum, delta };

/// Linear attention's parameters, as in the factory string (see above).
struct LinearConfig {
  Feature feature = Feature::elu1;    ///< the feature map phi
  std::int64_t m = 256;               ///< FAVOR+ random features (>= 1)
  std::int64_t nu = 1;                ///< DPFP rolls (1 <= nu < 2 Dk)
  LinearRule rule = LinearRule::sum;  ///< sum or delta (fast-weight) update
  double beta = 1.0;                  ///< delta rule write strength (0 < beta <= 1)
  double eps = 1e-6;                  ///< added to the denominator (finite, >= 0)
  std::int64_t seed = 1;              ///< FAVOR+ and Taylor projection seed (>= 0)
  std::int64_t taylor_dim = 0;        ///< Taylor's feature dim d' (0: Dk, no projection)
};

/// {"key=value", why} for the first broken constraint of `c` ({"", ""} when it is valid), e.g.
/// {"m=0", "favor needs at least 1 random feature"}: the why does not repeat the value. Constraints
/// that need Dk (nu < 2·Dk) are checked at forward time.
std::pair<std::string, std::string> linear_config_problem(const LinearConfig& c);

/// Linear (fast-weight) attention with a feature map in place of the softmax (see above).
class LinearAttention final : public Attention {
 public:
  /// Throws Error naming the broken parameter.
  explicit LinearAttention(const LinearConfig& config);

  std::string spec() const override;
  Support support() const override;
  /// The parameters it was built with.
  const LinearConfig& config() const { return config_; }

  /// The recurrent form's FLOPs (see the header comment).
  double flops(const Dims& d, const Mask& mask) const override;
  /// S [Dphi x Dv], and z [Dphi] for the sum rule.
  StateDims state_dims(const Dims& d) const override;

  /// phi for head size dk and q·k scale; throws Error when nu >= 2·dk under dpfp.
  FeatureMap feature_map(std::size_t dk, double scale) const;

  /// Token-by-token decoding (lib/attnlab/decoder.hpp) with the recurrence: (S, z) or W per
  /// item and head (and favor's running stabiliser), O(Dphi·Dv) per token whatever the
  /// position; prefill runs the chunked form from the held state.
  std::unique_ptr<TokenDecoder> start_decoding(const DecodeConfig& config) const override;

 protected:
  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const override;
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const override;
  std::string why_unsupported(const std::string& feature) const override;

 private:
  /// The forward, from in.initial_state when given, writing the final state when not null.
  /// `stabilisers` (favor's sum rule, one per sequence and head): the running stabilisers to
  /// start from and to leave, or nullptr (from -infinity, as every call but a decoder's).
  void run(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
           const Dims& d, Tensor& out, RecurrentState* final_state,
           float* stabilisers = nullptr) const;

  friend class LinearDecoder;
  LinearConfig config_;
};

/// The factory's maker for "linear:...": reads and checks the keys (throws Error).
std::unique_ptr<Attention> make_linear(Params& params);

}  // namespace attnlab
