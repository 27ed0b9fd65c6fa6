// The linear-attention scan engine: one memory S [Dk x Dv] per (batch item, head) written token
// by token and read by the queries, with two hooks, a per-token decay and a write rule. The
// decay-and-delta family (delta, retnet, gla, gated-delta) are thin clients of it
// (ScanAttention below); each client's header is its spec.
//
// The recurrence, for token t with prepared query q_t, key k_t, value v_t (rows of Dk, Dk, Dv),
// log-decay g_t <= 0 (a_t = exp(g_t); g = 0 when not given) and write strength beta_t:
//   sum rule    S_t = a_t S_{t-1} + k_t v_t^T
//   delta rule  S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T
//                   = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
//   per-channel decay (Head::gc, g_t a row of Dk log-decays): a_t S_{t-1} becomes
//               Diag(exp g_t) S_{t-1}, channel by channel (GLA as published; with the delta rule
//               Kimi Delta Attention, S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} +
//               beta_t k_t v_t^T)
//   S_0 = 0, or a given initial state (and z_0 with it). Causal (Nq == Nk): out_t = S_t^T q_t.
//   Non-causal: every query reads the last state. The final state (after the last valid key)
//   is what a following call starts from: a sequence cut into segments, each started from the
//   last one's final state, computes what one call computes (forward and backward).
// Key padding: tokens at or after the item's key length neither write nor decay (S carries over
// unchanged); their g and beta are never read and get zero gradients.
// Grouped KV heads (k, v [B, Hkv, Nk, D], H a multiple of Hkv): the state is per query head h
// (its own decay, g and beta [B, H, Nk], initial and final state [B, H, Dk, Dv]), which reads k
// and v rows of KV head h / (H / Hkv) in place, never copied; the backward computes each query
// head's dk and dv rows apart and adds them over each group in head order (KeyGradients): the
// repeated call's gradients summed, bitwise the same with any number of threads.
// Packed documents (Mask::documents, a batch of one, FlashAttention's cu_seqlens): each
// document of each head is a sequence of its own (sequences()), from its own initial state
// (zeros unless given) to its own final state; its chunks start at its first token, so no chunk
// spans two documents (a document's last chunk is a shorter one, in the same chunked form) and
// the result is, bitwise, that of running each document alone.
//
// Causal forward in chunks of C = 64 tokens (Yang et al. 2024, "Parallelizing Linear
// Transformers with the Delta Rule over Sequence Length": the WY/UT form; with decay as in
// Gated DeltaNet, Yang, Kautz, Hatamizadeh 2024). Within a chunk, b_i = g_1 + ... + g_i (float64)
// and every factor is exp of a difference b_i - b_j <= 0, so nothing overflows for any g <= 0:
//   sum rule:   U = V.
//   delta rule: (I + L) X = diag(beta) [V | diag(e^b) K], L_ij = beta_i e^{b_i - b_j} k_i·k_j for
//               j < i (a unit lower-triangular solve), U = X_V - X_K S_0: the pseudo-values with
//               S_i = e^{b_i} S_0 + sum_{j<=i} e^{b_i - b_j} k_j u_j^T.
//   O = diag(e^b) Q S_0 + (Q K^T ∘ E) U, E_ij = e^{b_i - b_j} for j <= i, 0 above;
//   S_C = e^{b_C} S_0 + (diag(e^{b_C - b}) K)^T U.
// Cost: O(N·C·(Dk + Dv) + N·Dk·Dv) per head, matrix products per chunk (kernels::gemm_tile);
// memory O(Dk·Dv + C·(C + Dk + Dv)) per thread: q and k are prepared (scaled, normalised) chunk
// by chunk, in cache, not copied per head.
// Per-channel decay (Head::gc: GLA as published; with the delta rule Kimi Delta Attention): the
// same chunks, with b_i a row of Dk cumulative log-decays (float64) and, as
// flash-linear-attention's chunked GLA and KDA, sub-chunks of 16 tokens. A query sub-chunk from
// r reads the keys of earlier sub-chunks through factored rows, (q_i ∘ e^{b_i - b_r}) ·
// (k_j ∘ e^{b_r - b_j}), both exponents <= 0, one matrix product per sub-chunk; pairs inside
// one sub-chunk are weighted elementwise, A_ij = sum_c q_ic k_jc e^{b_ic - b_jc}, the weights of
// row i those of row i - 1 times e^{g_i} (products of one-step decays <= 1).
//   sum rule:   U = V.
//   delta rule: the WY form above with L_ij = beta_i sum_c k_ic k_jc e^{b_ic - b_jc} (the same
//               sub-chunk products, keys against keys) and R = diag(beta) (V - (K ∘ e^b) S_0).
//   O = (Q ∘ e^b) S_0 + A U,  S_C = Diag(e^{b_C}) S_0 + (K ∘ e^{b_C - b})^T U.
// Nothing overflows for any g <= 0, and a factor that underflows to 0 stands for a product
// below it (g = -1e4 per step: exact zeros, no NaN). The backward transposes these products;
// d(log_decay) per channel is the suffix sum of db_i = q_i ∘ dq_i - k_i ∘ dk_i (each factor
// e^{b_i - b_j} carries q_i or k_i on the side that grows with b_i, k_j on the side that
// shrinks), with the terms of the state at the chunk's last key and the delta rule's keys on
// the growing side (derived in channel_chunk_backward_chunked). Cost as the scalar gate's
// chunked form plus O(N·16·Dk) for the weights of the pairs inside sub-chunks and a few
// exponentials per token and channel; the per-channel form carries no key sum z (no client
// asks for it).
// The sum rule can carry the key sum z beside S (z_t = a_t z_{t-1} + k_t, den_t = q_t·z_t, in the
// same chunks: z_C = e^{b_C} z_0 + K^T e^{b_C - b}, den = diag(e^b) Q z_0 + (Q K^T ∘ E) 1), which
// is linear attention's denominator without a column of ones in V.
// Backward, from the states at the chunk starts (saved by a causal forward given a Saved, else
// recomputed by a forward without outputs), chunk by chunk in reverse, the forward's products
// transposed (matrix products per chunk, see chunk_backward and delta_backward in the source):
// the delta rule recomputes the chunk's T and U and takes the WY form's gradients through
// (I + L) U = diag(beta) (V - diag(e^b) K S_0) (derived here; the tests check it against
// differences and torch). Gradients of q, k, v, g, beta (and of den), and of the initial state
// given the final state's: the state's gradient flows back through the chunks from dS_N (zero
// when the loss does not read the final state) to dS_0. O(N·C·(Dk + Dv) + N·Dk·Dv) time,
// O((N / C)·Dk·Dv + C·(C + Dk + Dv)) memory per head.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "attnlab/attention.hpp"

namespace attnlab {

/// The per-head kernels of the scan engine (see the header comment).
namespace scan {

/// Tokens per chunk of the causal chunked form.
inline constexpr std::size_t kChunk = 64;

/// One head's inputs: rows of q [nq x dk], k [nk x dk], v [nk x dv].
struct Head {
  const float* q = nullptr;        ///< queries, prepared by the engine per q_scale and normalise
  const float* k = nullptr;        ///< keys, prepared by the engine per normalise
  const float* v = nullptr;        ///< values
  const float* g = nullptr;        ///< log-decay per key token (<= 0), or nullptr: no decay
  const float* gc = nullptr;       ///< or a log-decay per key token and channel [nk x dk] (<= 0)
  const float* beta = nullptr;     ///< delta rule strength per key token, or nullptr: sum rule
  std::size_t nq = 0;              ///< queries
  std::size_t nk = 0;              ///< keys
  std::size_t valid = 0;           ///< keys that write (< valid); the rest are padding
  bool causal = false;             ///< out_t = S_t^T q_t (nq == nk), else every query reads S_nk
  float q_scale = 1.0f;            ///< queries times this before use (the softmax scale)
  bool normalise = false;          ///< q, k -> x / sqrt(|x|^2 + 1e-6) before use (DeltaNet)
  const float* initial = nullptr;  ///< S_0 [dk x dv], or nullptr: zeros
  const float* initial_key_sum = nullptr;  ///< z_0 [dk] where z is carried, or nullptr: zeros
};

/// Where one head's state (S [dk x dv], z [dk]) is written: a forward's final state or a
/// backward's initial-state gradient. A null pointer: not wanted (z: only where carried).
struct StateOut {
  float* memory = nullptr;   ///< S
  float* key_sum = nullptr;  ///< z
};

/// A head's state read: the gradient of the final state in a backward. Null: zeros.
struct StateIn {
  const float* memory = nullptr;   ///< S
  const float* key_sum = nullptr;  ///< z
};

/// a · b over n floats, in eight independent partial sums (one chain of dependent adds is
/// latency-bound: it cost as much as a chunk's products).
float dot(const float* a, const float* b, std::size_t n);

/// a[0] + ... + a[n-1], in eight partial sums as dot().
float sum(const float* a, std::size_t n);

/// One (sequence, head) of a call: a batch item's head, or under packed documents
/// (Mask::documents, a batch of one) a document's, and where its rows lie.
struct Sequence {
  std::size_t slice = 0;  ///< the [Nq or Nk, D] slice of q, k, v, out it lies in: b·H + h
  std::size_t head = 0;   ///< h
  std::size_t q0 = 0;     ///< its first query row in the slice
  std::size_t nq = 0;     ///< its queries
  std::size_t k0 = 0;     ///< its first key row (of k, v, g, beta)
  std::size_t nk = 0;     ///< its keys
  std::size_t valid = 0;  ///< its keys that are not padding (the first `valid`)
  std::size_t state = 0;  ///< its index among the call's states [S, H, ...]: sequence·H + h
  /// The [Nk, D] slice of k and v it reads: b·Hkv + h / (H / Hkv) (grouped heads share one).
  std::size_t kv_slice = 0;
  /// Its first query's row in [B·H·Nq] rows.
  std::size_t query_row(const Dims& d) const { return slice * d.nq + q0; }
  /// Its first key's row in [B·H·Nk] rows: of the per-query-head token inputs g and beta and
  /// their gradients.
  std::size_t key_row(const Dims& d) const { return slice * d.nk + k0; }
  /// Its first key's row in k and v, [B·Hkv·Nk] rows.
  std::size_t kv_row(const Dims& d) const { return kv_slice * d.nk + k0; }
};

/// The (sequence, head) pairs of a call of sizes d under `mask`, in state order. Throws
/// Unsupported naming variant `name` for a causal call with key_documents unlike documents.
std::vector<Sequence> sequences(const Mask& mask, const Dims& d, const std::string& name);

/// Where a backward writes each (sequence, head)'s key and value gradients (rows of Dk and Dv
/// floats): straight into the call's dk and dv [B, Hkv, Nk, D] when every query head has a KV
/// head of its own; under grouped heads into rows per query head [B, H, Nk, D], which sum() adds
/// over each group's query heads in head order into dk and dv. Each query head's rows are then
/// those of the call with k and v repeated to H heads, and their sums the same whatever the
/// number of threads. Costs B·H·Nk·(Dk + Dv) floats under grouped heads, nothing otherwise.
class KeyGradients {
 public:
  /// For a call of sizes d writing into dk and dv (shaped [B, Hkv, Nk, Dk or Dv]).
  KeyGradients(const Dims& d, Tensor& dk, Tensor& dv);
  /// Sequence s's first row of dk (Dk floats a row).
  float* dk(const Sequence& s);
  /// Sequence s's first row of dv (Dv floats a row).
  float* dv(const Sequence& s);
  /// Under grouped heads, each group's rows summed into dk and dv (nothing otherwise); after
  /// every sequence's rows are written.
  void sum();

 private:
  Dims d_;
  Tensor& dk_;
  Tensor& dv_;
  std::vector<float> head_dk_, head_dv_;  // grouped heads: the rows per query head
};

/// Floats of one head's state: S [dk x dv], then the key sum z [dk] (carried when asked for).
std::size_t state_floats(std::size_t dk, std::size_t dv);

/// Floats of the chunk-start states forward() saves for one head: chunks x state_floats.
std::size_t checkpoint_floats(std::size_t nk, std::size_t dk, std::size_t dv);

/// out [nq x dv] for one head; with `den` (the sum rule only) also den [nq], each query's
/// q·z with z the key sum decayed as S is (linear attention's denominator); writes the
/// chunk-start states into `checkpoints` when not null (z in them only when den is given) and
/// the final state into `final_state`.
void forward(const Head& h, std::size_t dk, std::size_t dv, float* out, float* den,
             float* checkpoints, StateOut final_state = {});

/// One head's gradients from d_out [nq x dv] and, when not null (the sum rule only), d_den
/// [nq], the gradient of forward's den, and d_final, the final state's: dq [nq x dk] and dk
/// [nk x dk] (of q and k as given), dv [nk x dv], dg, dbeta [nk] when not null (their inputs
/// must then be given; dg [nk x dk] for a per-channel decay), and the initial state's into
/// d_initial. `checkpoints`: a forward's with
/// the same den (given or not) and initial state, or nullptr (recomputed).
void backward(const Head& h, std::size_t dk, std::size_t dv, const float* d_out, const float* d_den,
              const float* checkpoints, float* dq, float* dk_out, float* dv_out, float* dg,
              float* dbeta, StateIn d_final = {}, StateOut d_initial = {});

/// One token of the recurrence on a state s [dk x dv] and, when z is not null, its key sum z
/// [dk]: decay both by exp(g), then the write (beta nullptr: the sum rule; z += k), then
/// out = S^T q and den = q·z when they are not null. `tmp` holds dv floats.
void step(float* s, float* z, const float* q, const float* k, const float* v, float g,
          const float* beta, std::size_t dk, std::size_t dv, float* out, float* den, float* tmp);

}  // namespace scan

/// What sets one client of the engine apart.
struct ScanRule {
  /// Where g comes from: nowhere (0), a fixed value per head, or the caller's per-token input.
  enum class Decay { none, per_head, input };
  bool delta = false;         ///< the delta rule (else the sum rule)
  bool normalise = false;     ///< q, k -> x / sqrt(|x|^2 + 1e-6) before use (DeltaNet)
  Decay decay = Decay::none;  ///< the decay hook
  bool beta_input = false;    ///< the delta rule takes a per-token beta [B, H, N]
  double beta = 1.0;          ///< the delta rule's strength when no beta is given
};

/// The delta rule's rule for variant `name` (delta; gated-delta when `gated`, with the g input):
/// q and k normalised, beta per token or the constant `beta`. Throws Error naming `name` unless
/// 0 <= beta <= 1.
ScanRule delta_rule(const std::string& name, double beta, bool gated);

/// What a recurrent decoder's prefill of N tokens per item runs its forward under: a causal
/// mask at `config`'s scale, item b's first lengths[b] tokens real.
Mask recurrent_prefill_mask(const DecodeConfig& config, const std::vector<std::size_t>& lengths);

/// An Attention that is a client of the scan engine: prepares q (softmax scale, optional
/// normalisation), k, g and beta per its ScanRule, and runs the engine forward and backward.
/// Masks: causal (Nq == Nk), key padding, cross-attention non-causal, Dv != Dk, grouped KV
/// heads; boolean masks are Unsupported. A recurrent state S [B, H, Dk, Dv] in and out
/// (support().state; no key sum).
/// forward(q, k, v, mask) without token inputs runs with g = 0 (no decay) and beta = the spec's, so
/// every caller of the plain interface gets a defined result.
class ScanAttention : public Attention {
 public:
  Support support() const override;
  /// The recurrence's FLOPs: per valid key the write (sum: 2·Dk·Dv; delta: 4·Dk·Dv), per query
  /// the read (2·Dk·Dv); the chunked form's intra-chunk products are extra work, not counted.
  double flops(const Dims& d, const Mask& mask) const override;

  /// Token-by-token decoding (lib/attnlab/decoder.hpp) with the recurrence: the state S per
  /// item and head, O(Dk·Dv) per token whatever the position; prefill runs the chunked form
  /// from the held state. max_tokens is not needed (nothing grows).
  std::unique_ptr<TokenDecoder> start_decoding(const DecodeConfig& config) const override;

  /// The rule it runs.
  const ScanRule& rule() const { return rule_; }

  /// The fixed log-decay of head h of `heads` (Decay::per_head clients override it).
  virtual double head_log_decay(std::size_t h, std::size_t heads) const;

 protected:
  /// A client running `rule`.
  explicit ScanAttention(const ScanRule& rule) : rule_(rule) {}

  void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               const Dims& d, Tensor& out, Saved* saved) const final;
  void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, const Dims& d, TensorRef out, TensorRef d_out,
                        const Saved& saved, AllGradients& g) const final;
  std::string why_unsupported(const std::string& feature) const override;

 private:
  void run_forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
                   const Dims& d, Tensor& out, std::vector<float>* checkpoints,
                   RecurrentState* final_state) const;

  friend class ScanDecoder;
  ScanRule rule_;
};

}  // namespace attnlab
