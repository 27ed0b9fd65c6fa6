#include "attnlab/attention.hpp"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {

// "q has NaN at [0, 1, 5, 3] of [...]" for the first non-finite entry of t, or "" when there is
// none. For k and v (`keys`) only the rows a query may read count: padded keys are never read, so
// their contents do not matter. The scan runs at memory speed: |x| <= FLT_MAX is false for NaN and
// Inf and vectorises, and the (item, head) slices are shared among the threads.
std::string non_finite(TensorRef t, const char* label, const Mask& mask, bool keys) {
  const std::size_t heads = t.shape()[1], n = t.shape()[2], dim = t.shape()[3];
  const auto rows = [&](std::size_t b) { return keys ? mask.valid_keys(b, n) : n; };
  const auto slices = static_cast<std::ptrdiff_t>(t.shape()[0] * heads);
  int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (t.size() > (1 << 18))
  for (std::ptrdiff_t s = 0; s < slices; ++s) {
    const float* p = t.data() + static_cast<std::size_t>(s) * n * dim;
    const std::size_t count = rows(static_cast<std::size_t>(s) / heads) * dim;
    for (std::size_t i = 0; i < count; ++i) bad |= !(std::abs(p[i]) <= FLT_MAX);
  }
  if (!bad) return "";
  for (std::size_t s = 0;; ++s)
    for (std::size_t i = 0; i < rows(s / heads) * dim; ++i) {
      const float x = t.data()[s * n * dim + i];
      if (std::isfinite(x)) continue;
      const std::size_t index[] = {s / heads, s % heads, i / dim, i % dim};
      std::string where = label;  // appended piece by piece: GCC 12 misreads a + chain here
      where.append(" has ").append(std::isnan(x) ? "NaN" : "Inf").append(" at [");
      for (std::size_t a = 0; a < 4; ++a)
        where.append(a ? ", " : "").append(std::to_string(index[a]));
      return where.append("] of ").append(shape_string(t));
    }
}

// Whether [a, a + na) and [b, b + nb) share a float.
bool shares(const float* a, std::size_t na, const float* b, std::size_t nb) {
  return na != 0 && nb != 0 && a < b + nb && b < a + na;
}

// Whether state `read` (a view) shares storage with `written` or with `out`.
bool state_overlaps(const std::optional<StateRef>& read, const RecurrentState& written,
                    const Tensor* out) {
  if (!read) return false;
  std::vector<std::pair<const float*, std::size_t>> views = {
      {read->memory.data(), read->memory.size()}};
  if (read->key_sum) {
    const auto& z = read->key_sum->shape();
    views.push_back({read->key_sum->data(), z[0] * z[1] * z[2]});
  }
  for (const auto& [p, n] : views)
    if (shares(p, n, written.memory.data(), written.memory.size()) ||
        shares(p, n, written.key_sum.data(), written.key_sum.size()) ||
        (out && shares(p, n, out->data(), out->size())))
      return true;
  return false;
}

// Shapes `state` for `sequences` sequences of d.heads heads per `sd` (storage kept when it fits).
void shape_state(RecurrentState& state, std::size_t sequences, const Dims& d, const StateDims& sd) {
  kernels::shape_buffer(state.memory,
                        std::array<std::size_t, 4>{sequences, d.heads, sd.rows, sd.columns});
  if (sd.key_sum)
    kernels::shape_buffer(state.key_sum, std::array<std::size_t, 3>{sequences, d.heads, sd.rows});
  else
    state.key_sum = TokenTensor();
}

}  // namespace

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
  item(backward, "backward");
  item(channel_decay, "per-channel decay");
  item(state, "recurrent state");
  item(documents, "packed documents");
  item(grouped_heads, "grouped heads");
  item(window, "window");
  item(prefix, "prefix-LM");
  item(custom, "custom mask");
  item(softcap, "softcap");
  item(bias, "bias");
  item(sinks, "sinks");
  item(alibi, "ALiBi");
  item(forgetting_gate, "forgetting gate");
  return out.empty() ? "no masks" : out;
}

Support Support::softmax_engine() {
  Support s;
  s.backward = true;
  s.forgetting_gate = true;
  s.grouped_heads = s.window = s.documents = s.prefix = s.custom = s.softcap = true;
  s.bias = s.sinks = s.alibi = true;
  return s;
}

std::vector<float> alibi_slopes(std::size_t heads) {
  // The paper's get_slopes: a geometric sequence from 2^(-8/n) for n a power of two; otherwise
  // the power of two below, then every other slope of twice that power.
  const auto power_of_two = [](std::size_t n) {
    std::vector<float> s(n);
    const double start = std::exp2(-8.0 / static_cast<double>(n));
    double x = start;
    for (std::size_t h = 0; h < n; ++h, x *= start) s[h] = static_cast<float>(x);
    return s;
  };
  if (heads == 0) return {};
  std::size_t below = 1;
  while (below * 2 <= heads) below *= 2;
  std::vector<float> slopes = power_of_two(below);
  const std::vector<float> above = power_of_two(2 * below);
  for (std::size_t h = 0; slopes.size() < heads; h += 2) slopes.push_back(above[h]);
  return slopes;
}

double Attention::flops(const Dims&, const Mask&) const {
  return std::numeric_limits<double>::quiet_NaN();
}

std::string Attention::name() const {
  const std::string s = spec();
  return s.substr(0, s.find(':'));
}

Tensor Attention::forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                          const TokenInputs& in) const {
  Tensor out;
  forward(q, k, v, mask, in, out);
  return out;
}

void Attention::refuse_overlap(const Tensor& written, std::initializer_list<TensorRef> read,
                               const char* what) const {
  // Checked before anything is resized: resizing `written` would free storage a view reads.
  for (const TensorRef& r : read)
    if (r.overlaps(written))
      throw Error(name() + ": " + what + " (it is read while the result is written)");
}

Dims Attention::validate(TensorRef q, TensorRef k, TensorRef v, const Mask& mask) const {
  const Dims d = check_qkv(q, k, v);
  mask.validate(d);
  // Checked here, not left to show in the output: the kernels clamp logits, so a NaN in q or k
  // would pass as a silently ignored key.
  for (const auto& [t, label, keys] :
       {std::tuple{&q, "q", false}, std::tuple{&k, "k", true}, std::tuple{&v, "v", true}})
    if (const std::string bad = non_finite(*t, label, mask, keys); !bad.empty())
      throw Error(name() + ": " + bad + ": inputs must be finite");
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
  if (mask.has_documents() && !s.documents) refuse("packed documents");
  if (d.nq != d.nk && !s.cross) refuse("cross-attention (Nq != Nk)");
  if (d.dv != d.dk && !s.value_dim) refuse("Dv != Dk");
  if (d.grouped() && !s.grouped_heads)
    refuse("grouped heads (H = " + std::to_string(d.heads) +
           " query heads over Hkv = " + std::to_string(d.kv()) + " key and value heads)");
  if (mask.window && !s.window) refuse("a window (Mask::window)");
  if (!mask.prefix_lengths.empty() && !s.prefix) refuse("prefix-LM (Mask::prefix_lengths)");
  if (mask.custom && !s.custom) refuse("a custom mask (Mask::custom)");
  if (mask.softcap && !s.softcap) refuse("softcap (Mask::softcap)");
  return d;
}

Dims Attention::prepare_forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                const TokenInputs& in, Tensor& out) const {
  refuse_overlap(out, {q, k, v}, "forward's output must not share storage with q, k or v");
  const Dims d = validate(q, k, v, mask);
  validate_tokens(in, d, mask);
  kernels::shape_buffer(out, std::array<std::size_t, 4>{d.batch, d.heads, d.nq, d.dv});
  return d;
}

Dims Attention::check_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                               TensorRef out, TensorRef d_out, const RowLogSumExp& lse) const {
  const Dims d = validate(q, k, v, mask);
  const std::array<std::size_t, 4> expected = {d.batch, d.heads, d.nq, d.dv};
  const std::string want =
      "[" + std::to_string(d.batch) + ", " + std::to_string(d.heads) + ", " + std::to_string(d.nq);
  for (const auto& [t, what] : {std::pair{&out, "out"}, std::pair{&d_out, "d_out"}})
    if (!std::equal(expected.begin(), expected.end(), t->shape().begin()))
      throw Error(name() + ": backward's " + what + " has shape " + shape_string(*t) +
                  ", expected [B, H, Nq, Dv] = " + want + ", " + std::to_string(d.dv) + "]");
  if (lse.size() != 0 &&
      !(lse.shape()[0] == d.batch && lse.shape()[1] == d.heads && lse.shape()[2] == d.nq))
    throw Error(name() + ": backward's saved lse has shape [" + std::to_string(lse.shape()[0]) +
                ", " + std::to_string(lse.shape()[1]) + ", " + std::to_string(lse.shape()[2]) +
                "], expected [B, H, Nq] = " + want + "] (or empty: recomputed)");
  if (!support().backward) throw Unsupported(name(), "backward passes");
  return d;
}

TokenRef::TokenRef(const float* data, const Shape& shape) : data_(data), shape_(shape) {
  if (!data && shape[0] * shape[1] * shape[2] != 0)
    throw Error("token input view [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) +
                ", " + std::to_string(shape[2]) + "]: no data (a null pointer)");
}

TokenInputs TokenInputs::of(const TokenTensor* g, const TokenTensor* beta) {
  TokenInputs in;
  if (g) in.log_decay = *g;
  if (beta) in.beta = *beta;
  return in;
}

StateRef RecurrentState::ref() const {
  StateRef r{memory, std::nullopt};
  if (key_sum.size() != 0) r.key_sum = key_sum;
  return r;
}

StateDims Attention::state_dims(const Dims& d) const {
  return {d.dk, d.dv, false};
}

void Attention::validate_state(const StateRef& state, const char* label, const Dims& d,
                               const Mask& mask) const {
  if (!support().state) {
    const std::string why = why_unsupported("a recurrent state");
    throw Unsupported(
        name(), std::string("a recurrent state (") + label + ")" + (why.empty() ? "" : ": " + why));
  }
  const StateDims sd = state_dims(d);
  const std::size_t sequences = mask.sequences(d.batch);
  const std::array<std::size_t, 4> want = {sequences, d.heads, sd.rows, sd.columns};
  const std::string first = mask.has_documents() ? "documents" : "B";
  const auto list = [](const auto& shape, std::size_t n) {
    std::string out = "[";
    for (std::size_t a = 0; a < n; ++a) out += (a ? ", " : "") + std::to_string(shape[a]);
    return out + "]";
  };
  if (state.memory.shape() != want)
    throw Error(name() + ": " + label + " has shape " + shape_string(state.memory) +
                ", expected [" + first + ", H, rows, Dv] = " + list(want, 4) +
                " (rows: " + (sd.rows == d.dk ? "Dk" : "the feature map's dimension") + ")");
  if (state.key_sum.has_value() != sd.key_sum)
    throw Error(name() + ": " + label + (sd.key_sum ? " has no" : " has a") + " key sum: " +
                (sd.key_sum ? "this variant's state is S and z [" + first + ", H, rows]"
                            : "this variant's state is S alone"));
  if (const std::string bad = non_finite(state.memory, label, Mask(), false); !bad.empty())
    throw Error(name() + ": " + bad + ": a state must be finite");
  if (!state.key_sum) return;
  const TokenRef& z = *state.key_sum;
  if (z.shape() != std::array<std::size_t, 3>{sequences, d.heads, sd.rows})
    throw Error(name() + ": " + label + "'s key sum has shape " + list(z.shape(), 3) +
                ", expected [" + first + ", H, rows] = " + list(want, 3));
  for (std::size_t i = 0; i < sequences * d.heads * sd.rows; ++i)
    if (!std::isfinite(z.data()[i]))
      throw Error(name() + ": " + label + "'s key sum has " +
                  (std::isnan(z.data()[i]) ? "NaN" : "Inf") + " at [" +
                  std::to_string(i / (d.heads * sd.rows)) + ", " +
                  std::to_string(i / sd.rows % d.heads) + ", " + std::to_string(i % sd.rows) +
                  "]: a state must be finite");
}

void Attention::validate_channel_decay(TensorRef g, const TokenInputs& in, const Dims& d,
                                       const Mask& mask) const {
  if (!support().channel_decay)
    throw Unsupported(name(), "a per-channel log-decay input (channel_log_decay)");
  if (in.log_decay)
    throw Error(name() +
                ": log_decay and channel_log_decay are both given: the memory decays by one, "
                "[B, H, Nk] or [B, H, Nk, Dk]");
  const std::array<std::size_t, 4> want = {d.batch, d.heads, d.nk, d.dk};
  if (g.shape() != want)
    throw Error(name() + ": channel_log_decay has shape " + shape_string(g) +
                ", expected [B, H, Nk, Dk] = [" + std::to_string(d.batch) + ", " +
                std::to_string(d.heads) + ", " + std::to_string(d.nk) + ", " +
                std::to_string(d.dk) + "]");
  const auto fits = [](float x) { return x >= -FLT_MAX && x <= 0.0f; };  // false for NaN
  for (std::size_t b = 0; b < d.batch; ++b) {
    const std::size_t count = mask.valid_keys(b, d.nk) * d.dk;
    for (std::size_t h = 0; h < d.heads; ++h) {
      // One branch-free pass over the head's rows (Dk times the scalar gate's values: element
      // access cost 6 % of a per-channel gla forward); the first bad value is found after it.
      const float* row = g.data() + (b * d.heads + h) * d.nk * d.dk;
      bool ok = true;
      for (std::size_t x = 0; x < count; ++x) ok &= fits(row[x]);
      if (ok) continue;
      const std::size_t x = std::size_t(std::find_if_not(row, row + count, fits) - row);
      throw Error(name() + ": channel_log_decay is " + std::to_string(row[x]) + " at [" +
                  std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(x / d.dk) +
                  ", " + std::to_string(x % d.dk) + "]: it must be finite and <= 0");
    }
  }
}

void Attention::validate_tokens(const TokenInputs& in, const Dims& d, const Mask& mask,
                                bool backward) const {
  if (in.initial_state) validate_state(*in.initial_state, "initial_state", d, mask);
  if (in.d_final_state) {
    if (!backward)
      throw Error(name() +
                  ": d_final_state is read by backward only (the gradient of "
                  "Saved::final_state)");
    validate_state(*in.d_final_state, "d_final_state", d, mask);
  }
  const Support s = support();
  for (const auto& [t, label, taken, low, high] :
       {std::tuple{in.log_decay, "log-decay g", s.log_decay || s.forgetting_gate, -FLT_MAX, 0.0f},
        std::tuple{in.beta, "beta", s.beta, 0.0f, 1.0f}}) {
    if (!t) continue;
    if (!taken) throw Unsupported(name(), std::string("a per-token ") + label + " input");
    const auto& shape = t->shape();
    if (shape[0] != d.batch || shape[1] != d.heads || shape[2] != d.nk)
      throw Error(name() + ": " + label + " has shape [" + std::to_string(shape[0]) + ", " +
                  std::to_string(shape[1]) + ", " + std::to_string(shape[2]) +
                  "], expected [B, H, Nk] = [" + std::to_string(d.batch) + ", " +
                  std::to_string(d.heads) + ", " + std::to_string(d.nk) + "]");
    for (std::size_t b = 0; b < d.batch; ++b)
      for (std::size_t h = 0; h < d.heads; ++h)
        for (std::size_t j = 0; j < mask.valid_keys(b, d.nk); ++j) {
          const float x = (*t)(b, h, j);
          if (x >= low && x <= high) continue;  // false for NaN
          throw Error(name() + ": " + label + " is " + std::to_string(x) + " at [" +
                      std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(j) +
                      "]: it must be " + (high == 0.0f ? "finite and <= 0" : "in [0, 1]"));
        }
  }
  if (in.channel_log_decay) validate_channel_decay(*in.channel_log_decay, in, d, mask);
  const auto refuse = [&](const std::string& feature) {
    const std::string why = why_unsupported(feature);
    throw Unsupported(name(), why.empty() ? feature : feature + ": " + why);
  };
  if (in.log_decay && !s.log_decay && mask.causal == Causal::none)
    refuse(
        "the forgetting gate (log_decay) without a causal mask: it decays scores over "
        "j < t <= i, the keys before each query");
  if (in.bias) {
    if (!s.bias) refuse("an additive bias (TokenInputs::bias)");
    const std::array<std::size_t, 4> full = {d.batch, d.heads, d.nq, d.nk};
    for (std::size_t a = 0; a < 4; ++a)
      if (in.bias->shape(a) != 1 && in.bias->shape(a) != full[a])
        throw Error(name() + ": bias has shape " + shape_string(*in.bias) +
                    ", which does not broadcast to [B, H, Nq, Nk] = [" + std::to_string(d.batch) +
                    ", " + std::to_string(d.heads) + ", " + std::to_string(d.nq) + ", " +
                    std::to_string(d.nk) + "]: each axis must be its size or 1");
    const float* x = in.bias->data();
    for (std::size_t i = 0; i < in.bias->size(); ++i)
      if (std::isnan(x[i]) || x[i] == std::numeric_limits<float>::infinity())
        throw Error(name() + ": bias is " + (std::isnan(x[i]) ? "NaN" : "+inf") +
                    " at flat index " + std::to_string(i) + " of " + shape_string(*in.bias) +
                    ": it must not be NaN or +infinity (-infinity masks a pair)");
  }
  for (const auto& [t, label, taken, slope] :
       {std::tuple{in.sinks, "sinks", s.sinks, false},
        std::tuple{in.alibi_slopes, "alibi_slopes", s.alibi, true}}) {
    if (!t) continue;
    if (!taken)
      refuse(slope ? "ALiBi (TokenInputs::alibi_slopes)" : "attention sinks (TokenInputs::sinks)");
    if (t->size() != d.heads)
      throw Error(name() + ": " + label + " has " + std::to_string(t->size()) +
                  " entries, expected one per query head (H = " + std::to_string(d.heads) + ")");
    for (std::size_t h = 0; h < d.heads; ++h) {
      const float x = (*t)[h];
      const bool ok = slope ? (std::isfinite(x) && x >= 0.0f)
                            : !(std::isnan(x) || x == std::numeric_limits<float>::infinity());
      if (!ok)
        throw Error(name() + ": " + label + "[" + std::to_string(h) + "] = " + std::to_string(x) +
                    ": expected " +
                    (slope ? "a finite slope >= 0" : "a logit, not NaN or +infinity"));
    }
  }
}

void Attention::forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, Tensor& out, Saved& saved) const {
  if (state_overlaps(in.initial_state, saved.final_state, &out))
    throw Error(name() +
                ": initial_state must not share storage with the output or the final "
                "state (it is read while they are written: copy it first)");
  const Dims d = prepare_forward(q, k, v, mask, in, out);
  if (support().state)
    shape_state(saved.final_state, mask.sequences(d.batch), d, state_dims(d));
  else
    saved.final_state = RecurrentState();
  compute(q, k, v, mask, in, d, out, &saved);
}

void Attention::forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                        const TokenInputs& in, Tensor& out) const {
  if (state_overlaps(in.initial_state, RecurrentState(), &out))
    throw Error(name() +
                ": initial_state must not share storage with the output (it is read "
                "while the output is written)");
  compute(q, k, v, mask, in, prepare_forward(q, k, v, mask, in, out), out, nullptr);
}

float* Attention::saved_lse(Saved* saved, const Dims& d) {
  if (!saved) return nullptr;
  kernels::shape_buffer(saved->lse, std::array<std::size_t, 3>{d.batch, d.heads, d.nq});
  saved->state.reset();
  return saved->lse.data();
}

AllGradients Attention::backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                 const TokenInputs& in, TensorRef out, TensorRef d_out,
                                 const Saved& saved) const {
  AllGradients g;
  backward(q, k, v, mask, in, out, d_out, saved, g);
  return g;
}

void Attention::backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                         const TokenInputs& in, TensorRef out, TensorRef d_out, const Saved& saved,
                         AllGradients& g) const {
  for (const Tensor* grad : {&g.qkv.dq, &g.qkv.dk, &g.qkv.dv})
    refuse_overlap(*grad, {q, k, v, out, d_out},
                   "backward's gradients must not share storage with q, k, v, out or d_out");
  for (const auto* state : {&in.initial_state, &in.d_final_state})
    if (state_overlaps(*state, g.d_initial_state, nullptr))
      throw Error(name() +
                  ": backward's d_initial_state must not share storage with "
                  "initial_state or d_final_state (they are read while it is written)");
  const Dims d = check_backward(q, k, v, mask, out, d_out, saved.lse);
  validate_tokens(in, d, mask, true);
  kernels::shape_buffer(g.qkv.dq, std::array<std::size_t, 4>{d.batch, d.heads, d.nq, d.dk});
  kernels::shape_buffer(g.qkv.dk, std::array<std::size_t, 4>{d.batch, d.kv(), d.nk, d.dk});
  kernels::shape_buffer(g.qkv.dv, std::array<std::size_t, 4>{d.batch, d.kv(), d.nk, d.dv});
  const std::array<std::size_t, 3> tokens = {d.batch, d.heads, d.nk};
  if (in.log_decay)
    kernels::shape_buffer(g.d_log_decay, tokens);
  else
    g.d_log_decay = TokenTensor();
  if (in.channel_log_decay)
    kernels::shape_buffer(g.d_channel_log_decay,
                          std::array<std::size_t, 4>{d.batch, d.heads, d.nk, d.dk});
  else
    g.d_channel_log_decay = Tensor();
  if (in.beta)
    kernels::shape_buffer(g.d_beta, tokens);
  else
    g.d_beta = TokenTensor();
  if (in.initial_state) {
    shape_state(g.d_initial_state, mask.sequences(d.batch), d, state_dims(d));
  } else {
    g.d_initial_state = RecurrentState();
  }
  if (in.bias)
    kernels::shape_buffer(g.d_bias, in.bias->shape());
  else
    g.d_bias = Tensor();
  g.d_sinks.assign(in.sinks ? d.heads : 0, 0.0f);
  g.d_alibi_slopes.assign(in.alibi_slopes ? d.heads : 0, 0.0f);
  g.parameters.clear();
  compute_backward(q, k, v, mask, in, d, out, d_out, saved, g);
}

void Attention::compute_backward(TensorRef, TensorRef, TensorRef, const Mask&, const TokenInputs&,
                                 const Dims&, TensorRef, TensorRef, const Saved&,
                                 AllGradients&) const {
  throw Unsupported(name(), "backward passes");  // reached only if support() claims backward
}

const RowLogSumExp& Attention::lse_or_recompute(TensorRef q, TensorRef k, TensorRef v,
                                                const Mask& mask, const TokenInputs& in,
                                                const Dims& d, const Saved& saved,
                                                RowLogSumExp& storage) const {
  if (saved.lse.size() != 0) return saved.lse;
  Tensor scratch = Tensor::from_shape({d.batch, d.heads, d.nq, d.dv});
  Saved recomputed;
  compute(q, k, v, mask, in, d, scratch, &recomputed);
  storage = std::move(recomputed.lse);
  return storage;
}

std::vector<ParameterTensor> Attention::parameters(std::size_t) const {
  return {};
}

void Attention::set_parameters(const std::vector<ParameterTensor>& values) {
  if (!values.empty()) throw Unsupported(name(), "learned parameters of its own");
}

}  // namespace attnlab
