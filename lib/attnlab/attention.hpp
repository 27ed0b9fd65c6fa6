// The one attention interface. Every backend, exact or approximate, is an Attention built by
// make_attention("name:key=value,...") and called as forward(q, k, v, mask); the harness, the
// CLI, the model layers and the tests all go through this door.
#pragma once

#include <any>
#include <array>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/bf16.hpp"
#include "attnlab/mask.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

class TokenDecoder;
struct DecodeConfig;

/// What a backend can honour. Anything requested outside it throws Unsupported.
struct Support {
  bool causal = true;          ///< causal masks with Nq == Nk
  bool causal_cross = true;    ///< causal masks with Nq != Nk (both alignments)
  bool key_lengths = true;     ///< key padding
  bool allowed = true;         ///< arbitrary boolean masks
  bool cross = true;           ///< Nq != Nk
  bool value_dim = true;       ///< Dv != Dk
  bool backward = false;       ///< backward(): gradients for everything the forward above honours
  bool log_decay = false;      ///< takes TokenInputs::log_decay
  bool channel_decay = false;  ///< takes TokenInputs::channel_log_decay
  bool beta = false;           ///< takes TokenInputs::beta
  /// A recurrent state handed in and out: TokenInputs::initial_state and d_final_state,
  /// Saved::final_state, AllGradients::d_initial_state (the linear family).
  bool state = false;
  bool documents = false;      ///< packed documents (Mask::documents)
  bool grouped_heads = false;  ///< grouped KV heads: Hkv < H (GQA, MQA)
  bool window = false;         ///< Mask::window
  bool prefix = false;         ///< Mask::prefix_lengths
  bool custom = false;         ///< Mask::custom
  bool softcap = false;        ///< Mask::softcap
  bool bias = false;           ///< takes TokenInputs::bias
  bool sinks = false;          ///< takes TokenInputs::sinks
  bool alibi = false;          ///< takes TokenInputs::alibi_slopes
  /// Takes TokenInputs::log_decay as softmax attention's forgetting gate (FoX), under causal
  /// masks; apart from log_decay (a memory's decay) so that model layers, which learn a gate
  /// for a core that decays its memory, do not add one to softmax attention unasked.
  bool forgetting_gate = false;
  /// Whether the output is softmax attention's, exactly or approximately (full, sliding,
  /// bigbird, linformer, linear's kernel feature maps under the sum rule). False for a backend
  /// that computes a function of its own (a decaying or delta-rule memory: retnet, gla, delta,
  /// gated-delta, linear's delta rule): its distance from softmax attention says nothing about
  /// its quality, so comparisons (attnlab sweep, demo) measure it against its own float64
  /// definition (variants/recurrence_reference.hpp) and list it apart.
  bool approximates_softmax = true;
  /// Key rows per query token: k, v and the per-token inputs (g, beta) carry this many rows per
  /// token, row t·rows_per_token + j the j-th of token t (DeltaProduct's n_h steps; 1 for every
  /// other backend). A model layer projects that many keys, values and betas per token.
  std::size_t rows_per_token = 1;

  /// Everything the softmax engine (lib/attnlab/softmax_engine.hpp) honours, backward included.
  static Support softmax_engine();

  /// "causal, key padding, boolean mask, ...": the features that are supported.
  std::string describe() const;
};

/// Gradients of a scalar loss with respect to one call's q, k and v, shaped like them.
struct Gradients {
  Tensor dq;  ///< dL/dq [B, H, Nq, Dk]
  Tensor dk;  ///< dL/dk [B, Hkv, Nk, Dk]: summed over the query heads that share a KV head
  Tensor dv;  ///< dL/dv [B, Hkv, Nk, Dv]: likewise
};

/// What a softmax forward saves for its backward: the row log-sum-exp, [B, H, Nq],
/// lse[b, h, i] = log sum_j exp(scale · q_i · k_j) over the keys query i sees (natural log;
/// -infinity for a row that sees no key). FlashAttention-2 rebuilds every probability tile
/// from it, exp(scale · q_i · k_j - lse_i), so the backward never forms or stores Nq x Nk.
using RowLogSumExp = xt::xtensor<float, 3>;

/// One value per (batch item, head, key token): [B, H, Nk].
using TokenTensor = xt::xtensor<float, 3>;

/// A read-only view of one per-token input [B, H, Nk], row-major, as TensorRef is of q, k, v:
/// a TokenTensor converts to it, and a buffer of the caller's is read in place.
class TokenRef {
 public:
  using Shape = std::array<std::size_t, 3>;  ///< [batch, heads, key tokens]

  /// A view of t's storage (implicit: every TokenTensor argument reads in place).
  TokenRef(const TokenTensor& t)  // NOLINT(google-explicit-constructor)
      : data_(t.data()), shape_{t.shape()[0], t.shape()[1], t.shape()[2]} {}
  /// A view of `shape`'s product floats at `data`. Throws Error when `data` is null and the
  /// shape holds a float.
  TokenRef(const float* data, const Shape& shape);

  const float* data() const { return data_; }    ///< the first float
  const Shape& shape() const { return shape_; }  ///< [B, H, Nk]
  /// Element [b, h, j].
  float operator()(std::size_t b, std::size_t h, std::size_t j) const {
    return data_[(b * shape_[1] + h) * shape_[2] + j];
  }

 private:
  const float* data_;
  Shape shape_;
};

/// The size of one (sequence, head)'s recurrent state: the memory S [rows x columns] and, where
/// the variant normalises by it, the key sum z [rows].
struct StateDims {
  std::size_t rows = 0;     ///< Dk, or the feature dimension of linear's map
  std::size_t columns = 0;  ///< Dv
  bool key_sum = false;     ///< z is part of the state (linear's sum rule)
  /// Every field equal.
  bool operator==(const StateDims&) const = default;
};

/// A read-only view of the recurrent states of S sequences (the batch items, or the documents
/// under Mask::documents) and H heads:
/// memory S [S, H, rows, columns] and, where StateDims::key_sum, the key sum z [S, H, rows].
struct StateRef {
  TensorRef memory;                 ///< S
  std::optional<TokenRef> key_sum;  ///< z, or empty where the variant has none
};

/// Recurrent states the library hands back, in StateRef's layout: a forward's final state, a
/// backward's gradient of the initial state. Empty when not produced.
struct RecurrentState {
  Tensor memory;        ///< S [S, H, rows, columns]
  TokenTensor key_sum;  ///< z [S, H, rows], or empty
  /// Whether it holds a state.
  bool empty() const { return memory.size() == 0; }
  /// A view of it (key_sum only when it holds one).
  StateRef ref() const;
};

/// Inputs of one call beyond q, k, v and the mask, for the variants whose support() takes them
/// (others throw Unsupported when one is given). Views, not owned; empty: not given.
struct TokenInputs {
  /// g [B, H, Nk]: the log of a decay at each key token, <= 0 (finite). The linear family's
  /// memory decay (Support::log_decay); for softmax attention the forgetting gate
  /// (Support::forgetting_gate; FoX, Lin et al. 2025): with F_t = g_0 + ... + g_t over key
  /// tokens, score(i, j) += F_p(i) - F_j, the sum of g over j < t <= p(i) (causal masks only;
  /// padded tokens count as 0; p(i): Mask::position).
  std::optional<TokenRef> log_decay;
  /// g [B, H, Nk, Dk]: a log-decay per key token and key channel, <= 0 (finite), for the
  /// memories that take one (Support::channel_decay): S_t = Diag(exp g_t) S_{t-1} before token
  /// t writes (GLA's per-channel gate as published; with the delta rule Kimi Delta
  /// Attention). In place of log_decay, never beside it.
  std::optional<TensorRef> channel_log_decay;
  /// beta [B, H, Nk]: the delta rule's write strength at each key token, in [0, 1].
  std::optional<TokenRef> beta;
  /// The recurrent state before the first token (support().state; shape per state_dims(), one
  /// state per batch item, or per document under Mask::documents, finite); empty: zeros. The
  /// backward reads it too.
  std::optional<StateRef> initial_state;
  /// Backward only: dL/d(final state), the gradient of the forward's Saved::final_state, in its
  /// shape; empty: the loss does not read the final state. A forward refuses it (Error).
  std::optional<StateRef> d_final_state;
  /// An additive bias on the scores, broadcastable to [B, H, Nq, Nk] (each axis its size or 1):
  /// T5's relative bias, Graphormer's, PyTorch's float attn_mask. No NaN or +infinity; -infinity
  /// masks a pair. H counts query heads, here and below.
  std::optional<TensorRef> bias;
  /// Attention sinks [H] (gpt-oss): one logit per head that joins every row's softmax
  /// denominator and attends to nothing. No NaN or +infinity; -infinity: no sink.
  std::optional<std::span<const float>> sinks;
  /// ALiBi slopes [H] (Press et al. 2022), finite and >= 0: score(i, j) -= slope_h · |p(i) - j|
  /// (p(i): Mask::position). alibi_slopes(H) gives the paper's geometric slopes.
  std::optional<std::span<const float>> alibi_slopes;
  /// None is given.
  bool empty() const {
    return !log_decay && !channel_log_decay && !beta && !initial_state && !d_final_state && !bias &&
           !sinks && !alibi_slopes;
  }
  /// The inputs at `g` and `beta`, each null when not given.
  static TokenInputs of(const TokenTensor* g, const TokenTensor* beta);
};

/// ALiBi's geometric slopes for `heads` heads (Press et al. 2022, the paper's code): for a power
/// of two n, 2^(-8 (h + 1) / n); otherwise those of the power of two below, then every other
/// slope of twice that power.
std::vector<float> alibi_slopes(std::size_t heads);

/// What a forward saves for its backward, opaque to the caller: the row log-sum-exp of a
/// softmax backend, and any other state the backend keeps (the scan engine's chunk states).
struct Saved {
  RowLogSumExp lse;  ///< a softmax backend's row log-sum-exp, else empty
  std::any state;    ///< the backend's own saved state, read only by that backend
  /// Where support().state: the recurrent state after the last token (the last valid key of
  /// each item, or document), what a following call takes as its initial_state; else empty.
  RecurrentState final_state;
};

/// One of a backend's own learned tensors (linformer's E), or its gradient summed over the batch.
struct ParameterTensor {
  std::string name;                ///< the parameter's name ("E", "F")
  std::vector<std::size_t> shape;  ///< its shape
  std::vector<float> values;       ///< its values, or dL/d(parameter), row-major
};

/// Gradients of everything one call read: q, k, v, the token inputs that were given, and the
/// backend's own learned parameters.
struct AllGradients {
  Gradients qkv;                      ///< dq, dk, dv
  TokenTensor d_log_decay;            ///< dL/dg [B, H, Nk] when g was given, else empty
  Tensor d_channel_log_decay;         ///< dL/dg [B, H, Nk, Dk] when channel_log_decay was given
  TokenTensor d_beta;                 ///< dL/dbeta [B, H, Nk] when given, else empty
  RecurrentState d_initial_state;     ///< dL/d(initial state) when one was given, else empty
  Tensor d_bias;                      ///< dL/d(bias) in bias's shape (summed over broadcast axes)
  std::vector<float> d_sinks;         ///< dL/d(sinks) [H] when given, else empty
  std::vector<float> d_alibi_slopes;  ///< dL/d(slopes) [H] when given, else empty
  std::vector<ParameterTensor> parameters;  ///< the backend's parameters (empty: none)
};

/// Gradients of a bfloat16 call (Attention::backward's bf16 overload): dq, dk, dv in bf16 and
/// `rest`, AllGradients in float32: the token inputs' and parameters' gradients, and in
/// rest.qkv the float32 dq, dk, dv they were rounded from (storage kept from call to call).
struct AllGradientsBf16 {
  TensorBf16 dq;      ///< dL/dq [B, H, Nq, Dk]
  TensorBf16 dk;      ///< dL/dk [B, Hkv, Nk, Dk]
  TensorBf16 dv;      ///< dL/dv [B, Hkv, Nk, Dv]
  AllGradients rest;  ///< everything else, float32
};

/// The one attention interface: every backend, exact or approximate, is an Attention built by
/// make_attention(spec) and called through forward() and backward().
class Attention {
 public:
  virtual ~Attention() = default;

  /// q [B,H,Nq,Dk], k [B,Hkv,Nk,Dk], v [B,Hkv,Nk,Dv] -> [B,H,Nq,Dv], with the inputs `in`
  /// (none, or those support() takes). Validates shapes, mask and `in` (throws Error naming what
  /// is wrong: g and beta [B, H, Nk], finite on unpadded tokens, g <= 0, beta in [0, 1]; a state
  /// per state_dims(); bias broadcastable to [B, H, Nq, Nk], neither NaN nor +inf; sinks [H],
  /// neither NaN nor +inf; slopes [H], finite and >= 0), then refuses what support() excludes
  /// (throws Unsupported naming the variant and the feature: grouped heads, a mask modifier, an
  /// input), then computes.
  /// A NaN or Inf in q, or in a key or value row that is not padding, throws Error naming the
  /// tensor and the index (padded rows are never read); finite inputs give a finite output.
  /// Thread-safe: several threads may call forward on one object at once (tests/test_threads.cpp,
  /// run under ThreadSanitizer in CI); each call uses its own OpenMP team.
  Tensor forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask = {},
                 const TokenInputs& in = {}) const;

  /// The same, written into `out`, which is resized only when its shape is not [B,H,Nq,Dv]:
  /// repeated calls at one shape reuse its storage. A fresh output above malloc's mmap threshold
  /// is page-faulted in on every call (40 to 60 ms for 128 MiB on our 2-core VM, a third of
  /// linear attention's forward at N = 65536: results/archive/linear). `out` must not share
  /// storage with q, k, v or the initial state (throws Error); when a call throws, out's contents
  /// are unspecified. Keeps nothing for a backward: no row log-sum-exp, no chunk states (the scan
  /// variants' would cost N / C states a head).
  void forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               Tensor& out) const;

  /// The same, also filling `saved` with what backward() reads (a softmax backend's row
  /// log-sum-exp [B, H, Nq]: O(B·H·Nq) extra memory, no extra time worth measuring; the scan
  /// engine's chunk states) and, where support().state, the final state; its storage is reused
  /// from call to call where it fits.
  void forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
               Tensor& out, Saved& saved) const;

  /// The gradients of a scalar loss L through out = forward(q, k, v, mask, in), given
  /// d_out = dL/d(out) [B, H, Nq, Dv]: dq, dk, dv, the gradient of each token input given and
  /// of the initial state, and of the backend's own learned parameters. `out` must be that
  /// forward's output (read, as in FlashAttention-2, instead of recomputed) and `in` its inputs
  /// (plus d_final_state when the loss reads the final state); `saved` its Saved, or a default
  /// Saved (the default), when the backend recomputes what it needs with one more forward.
  /// Validates like forward, checks the shapes of out, d_out and saved.lse (throws Error naming
  /// the argument), and throws Unsupported when support().backward is false or the mask is
  /// outside support(). Each variant's header states the backward's cost and what it treats as
  /// constant.
  AllGradients backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, TensorRef out, TensorRef d_out,
                        const Saved& saved = {}) const;

  /// The same, written into `g`, whose tensors are resized only when their shapes differ from
  /// q's, k's, v's and the inputs': repeated calls at one shape reuse their storage (a fresh
  /// 8 MiB gradient costs page faults on every call, about 7% of full's backward at N = 2048).
  /// g's tensors must not share storage with any input (throws Error); when a call throws, g is
  /// unspecified.
  void backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
                TensorRef out, TensorRef d_out, const Saved& saved, AllGradients& g) const;

  /// bfloat16 q, k, v (bf16.hpp), computed on kernels::active_bf16_path(): today bf16-via-f32,
  /// the float32 kernels on the inputs widened (exactly) to float32, so every variant and
  /// modifier takes them, the row log-sum-exp and softmax statistics stay float32, and the
  /// results are rounded once, to the type of the tensor they are written to: `out` bf16 (the
  /// default) or float32 (on request). Validated as the float32 forward (a NaN or Inf in q, k,
  /// v refused, named); the token inputs stay float32. tests/test_bf16.cpp states and checks the
  /// error bound against float64 attention of the bf16 inputs.
  TensorBf16 forward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask = {},
                     const TokenInputs& in = {}) const;
  /// The same into `out`: bf16 or float32, with what backward reads in `saved` (null: nothing).
  void forward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
               const TokenInputs& in, TensorBf16& out, Saved* saved = nullptr) const;
  void forward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
               const TokenInputs& in, Tensor& out, Saved* saved = nullptr) const;  ///< likewise
  /// The backward of a bf16 forward: out and d_out in bf16, dq, dk, dv rounded to bf16 (the
  /// rest float32); or, on request, out, d_out and every gradient in float32.
  void backward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
                const TokenInputs& in, TensorRefBf16 out, TensorRefBf16 d_out, const Saved& saved,
                AllGradientsBf16& g) const;
  void backward(TensorRefBf16 q, TensorRefBf16 k, TensorRefBf16 v, const Mask& mask,
                const TokenInputs& in, TensorRef out, TensorRef d_out, const Saved& saved,
                AllGradients& g) const;  ///< likewise

  /// The backend's own learned tensors as `heads` heads use them (linformer: E and F), in the
  /// names and shapes backward's AllGradients::parameters reports their gradients in, so a
  /// trainer or a torch module can hold and update them; empty for a backend without any.
  virtual std::vector<ParameterTensor> parameters(std::size_t heads) const;

  /// Replaces the backend's own learned tensors by `values`: each tensor parameters() names, in
  /// its shape, and nothing else (throws Error naming the one missing, unknown, mis-shaped or
  /// not finite; Unsupported for a backend without any, unless `values` is empty). Not while a
  /// call runs on this object.
  virtual void set_parameters(const std::vector<ParameterTensor>& values);

  /// A decoder for token-by-token generation (lib/attnlab/decoder.hpp): a causal variant's KV
  /// cache, window or recurrent state. The default throws Unsupported naming decoding (and why,
  /// per why_unsupported("decoding")).
  virtual std::unique_ptr<TokenDecoder> start_decoding(const DecodeConfig& config) const;

  /// The size of one (sequence, head)'s recurrent state for a call of sizes `d` (support().state;
  /// the default: S [Dk x Dv], no key sum).
  virtual StateDims state_dims(const Dims& d) const;

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

  /// The forward, called with validated, supported input only: `in` holds only inputs
  /// support() takes; `out` is [B,H,Nq,Dv] with unspecified contents, every element of which
  /// compute must write. `saved` null: keep nothing for a backward; else fill it (a softmax
  /// backend through saved_lse, others setting saved->lse empty and their own saved->state;
  /// saved->final_state is already shaped where support().state).
  virtual void compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                       const TokenInputs& in, const Dims& d, Tensor& out, Saved* saved) const = 0;

  /// The backward, called with validated, supported input only, and only when
  /// support().backward is true: writes every element of g.qkv (shaped like q, k, v), of the
  /// token gradients (shaped [B, H, Nk] for the inputs given, empty for the others) and of
  /// d_initial_state (shaped when an initial state was given), and appends the backend's
  /// parameter gradients to g.parameters (empty on entry). `saved` is the caller's (see
  /// lse_or_recompute). The default throws Unsupported.
  virtual void compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                const TokenInputs& in, const Dims& d, TensorRef out,
                                TensorRef d_out, const Saved& saved, AllGradients& g) const;

  /// For a softmax backend's compute: saved->lse shaped [B, H, Nq] (its storage kept where it
  /// fits) and saved->state cleared, returning lse's first float; nullptr when `saved` is null.
  static float* saved_lse(Saved* saved, const Dims& d);

  /// saved.lse when the caller saved it, else the row log-sum-exp of one more forward, kept in
  /// `storage`: what a softmax backend's compute_backward starts from.
  const RowLogSumExp& lse_or_recompute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                       const TokenInputs& in, const Dims& d, const Saved& saved,
                                       RowLogSumExp& storage) const;

 private:
  /// Validates a backward call (as forward, then out, d_out, the saved lse and support()) and
  /// returns its sizes.
  Dims check_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, TensorRef out,
                      TensorRef d_out, const RowLogSumExp& lse) const;
  /// Throws Error ("name: what (...)") when `written` shares a float with any of `read`.
  void refuse_overlap(const Tensor& written, std::initializer_list<TensorRef> read,
                      const char* what) const;
  /// Shapes, mask and support() checks shared by forward and backward.
  Dims validate(TensorRef q, TensorRef k, TensorRef v, const Mask& mask) const;
  /// Shapes, values and support() checks of token inputs; `backward`: a backward's (which may
  /// carry d_final_state).
  void validate_tokens(const TokenInputs& in, const Dims& d, const Mask& mask,
                       bool backward = false) const;
  /// Support, exclusivity with log_decay, shape [B, H, Nk, Dk] and values (finite, <= 0 on the
  /// unpadded tokens) of TokenInputs::channel_log_decay `g`.
  void validate_channel_decay(TensorRef g, const TokenInputs& in, const Dims& d,
                              const Mask& mask) const;
  /// Shape, values and support() checks of a state input `label` (initial_state, d_final_state).
  void validate_state(const StateRef& state, const char* label, const Dims& d,
                      const Mask& mask) const;
  /// What every forward does before computing: refuses an output that shares storage with an
  /// input, validates q, k, v, the mask and `in`, and shapes `out` (kept when it fits).
  Dims prepare_forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                       const TokenInputs& in, Tensor& out) const;
};

}  // namespace attnlab
