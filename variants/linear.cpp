#include "variants/linear.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnlab/decoder.hpp"
#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"
#include "variants/linear_scan.hpp"

namespace attnlab {
namespace {

// Linear attention as a client of the scan engine (variants/linear_scan.hpp). The sum rule's
// denominator phi(q)^T z is the engine's den: it carries the key sum z beside S. favor's
// running key stabiliser c_t is the engine's decay: keys enter as exp(E_t - c_t) with g_t =
// c_{t-1} - c_t <= 0, so the state after t is sum_j exp(E_j - c_t) v_j^T (and z likewise), what
// the stabilised sums are, and nothing overflows.

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// x[i] = exp(x[i] - c).
void exp_shifted(float* x, std::size_t n, float c) {
  for (std::size_t i = 0; i < n; ++i) x[i] = (x[i] - c) * kLog2e;
  kernels::exp2_inplace(x, n);
}

float row_max(const float* x, std::size_t n) {
  return *std::max_element(x, x + n);
}

using scan::dot;
using scan::sum;

// phi for `rows` rows; favor stabilised by each row's own max (see the header).
void row_features(const FeatureMap& map, const float* x, std::size_t rows, float* out) {
  if (rows == 0) return;
  map.map(x, rows, out);
  if (!map.logarithmic()) return;
  const std::size_t p = map.dim();
  for (std::size_t i = 0; i < rows; ++i) exp_shifted(out + i * p, p, row_max(out + i * p, p));
}

// Delta-rule features of `rows` rows: phi as the feature map's backward needs it (favor:
// stabilised by the row's max), hat = phi / sum(phi) (zero rows stay zero), and the sums.
void delta_rows(const FeatureMap& map, const float* x, std::size_t rows, float* phi, float* hat,
                float* sums) {
  const std::size_t p = map.dim();
  row_features(map, x, rows, phi);
  for (std::size_t i = 0; i < rows; ++i) {
    sums[i] = sum(phi + i * p, p);
    for (std::size_t r = 0; r < p; ++r)
      hat[i * p + r] = sums[i] > 0.0f ? phi[i * p + r] / sums[i] : 0.0f;
  }
}

// d/dphi of hat = phi / sum(phi), in place: (dhat - dhat·hat) / sum; zero where the sum is 0.
void hat_backward(const float* hat, const float* sums, std::size_t rows, std::size_t p, float* d) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* row = d + i * p;
    const float along = dot(row, hat + i * p, p);
    for (std::size_t r = 0; r < p; ++r) row[r] = sums[i] > 0.0f ? (row[r] - along) / sums[i] : 0.0f;
  }
}

// Key features of the sum rule for the first `valid` of `rows` keys: favor's exp(E_t - c_t)
// with c_t the running max log-feature from c (updated) and g_t = c_{t-1} - c_t (0 for the
// first key, which meets an empty state); other maps phi(k_t), no g. Padding rows zero.
void sum_key_features(const FeatureMap& map, const float* k, std::size_t rows, std::size_t valid,
                      float* fk, float* g, float& c) {
  const std::size_t p = map.dim();
  if (valid > 0) map.map(k, valid, fk);
  std::fill(fk + valid * p, fk + rows * p, 0.0f);
  if (!map.logarithmic()) return;
  for (std::size_t t = 0; t < valid; ++t) {
    const float next = std::max(c, row_max(fk + t * p, p));
    g[t] = c == kNegInf ? 0.0f : c - next;
    c = next;
    exp_shifted(fk + t * p, p, c);
  }
  std::fill(g + valid, g + rows, 0.0f);
}

// Per-thread copies of one head's features and the engine's inputs and outputs.
struct HeadWork {
  std::vector<float> fq, fk, hq, hk, sq, sk, g, den, num, dnum, dden, dfq, dfk, checkpoints;
};

// One head prepared for the engine: features (the delta rule's sum-normalised) and favor's g,
// its running stabiliser starting from *running (and left there) when given, else -infinity.
scan::Head prepare(const FeatureMap& map, const LinearConfig& c, const float* q, const float* k,
                   const float* v, std::size_t nq, std::size_t nk, std::size_t valid, bool causal,
                   HeadWork& w, float* running = nullptr) {
  const std::size_t p = map.dim();
  scan::Head h;
  h.nq = nq;
  h.nk = nk;
  h.valid = valid;
  h.causal = causal;
  w.fq.resize(nq * p);
  w.fk.resize(nk * p);
  if (c.rule == LinearRule::delta) {
    w.hq.resize(nq * p);
    w.hk.resize(nk * p);
    w.sq.resize(nq);
    w.sk.resize(nk);
    delta_rows(map, q, nq, w.fq.data(), w.hq.data(), w.sq.data());
    delta_rows(map, k, valid, w.fk.data(), w.hk.data(), w.sk.data());
    w.g.assign(nk, static_cast<float>(c.beta));  // the constant beta, in g's buffer
    h.q = w.hq.data();
    h.k = w.hk.data();
    h.v = v;
    h.beta = w.g.data();
    return h;
  }
  row_features(map, q, nq, w.fq.data());
  w.g.resize(nk);
  float stabiliser = running ? *running : kNegInf;  // a decoder's, carried from call to call
  sum_key_features(map, k, nk, valid, w.fk.data(), w.g.data(), stabiliser);
  if (running) *running = stabiliser;
  h.q = w.fq.data();
  h.k = w.fk.data();
  h.v = v;
  h.g = map.logarithmic() ? w.g.data() : nullptr;
  return h;
}

// The sum rule with favor: S and z are kept relative to the keys' running max log-feature.
bool favor_stabilised(const LinearConfig& c) {
  return c.feature == Feature::favor && c.rule == LinearRule::sum;
}

// Head bh's slice of a state the call hands back (S, and z for the sum rule), or nothing.
scan::StateOut head_state(RecurrentState* state, std::size_t bh, std::size_t p, std::size_t dv) {
  if (!state || state->empty()) return {};
  return {state->memory.data() + bh * p * dv,
          state->key_sum.size() != 0 ? state->key_sum.data() + bh * p : nullptr};
}

// The call's initial state for head bh (S [p x dv], and z for the sum rule), when given.
void with_initial_state(scan::Head& h, const TokenInputs& in, std::size_t bh, std::size_t p,
                        std::size_t dv) {
  if (!in.initial_state) return;
  h.initial = in.initial_state->memory.data() + bh * p * dv;
  if (in.initial_state->key_sum) h.initial_key_sum = in.initial_state->key_sum->data() + bh * p;
}

// 1 / (den + eps), or 0 where den = 0 (such a row outputs zeros).
float inverse_den(float den, float eps) {
  return den > 0.0f ? 1.0f / (den + eps) : 0.0f;
}

// out_i = num_i / (den_i + eps) in place.
void divide_rows(float* num, const float* den, std::size_t rows, std::size_t dv, float eps) {
  for (std::size_t i = 0; i < rows; ++i) {
    const float inv = inverse_den(den[i], eps);
    for (std::size_t c = 0; c < dv; ++c) num[i * dv + c] *= inv;
  }
}

}  // namespace

std::pair<std::string, std::string> linear_config_problem(const LinearConfig& c) {
  auto text = [](double x) { return std::to_string(x); };
  if (c.m < 1) return {"m=" + std::to_string(c.m), "favor needs at least 1 random feature"};
  if (c.nu < 1) return {"nu=" + std::to_string(c.nu), "dpfp needs nu >= 1"};
  if (!(c.beta > 0.0 && c.beta <= 1.0))  // also refuses NaN
    return {"beta=" + text(c.beta), "the delta rule needs 0 < beta <= 1"};
  if (!(c.eps >= 0.0 && std::isfinite(c.eps)))
    return {"eps=" + text(c.eps), "must be finite and >= 0"};
  if (c.seed < 0) return {"seed=" + std::to_string(c.seed), "must be >= 0"};
  if (c.taylor_dim < 0)
    return {"taylor_dim=" + std::to_string(c.taylor_dim), "must be >= 0 (0: Dk, no projection)"};
  if (c.feature == Feature::taylor && c.rule == LinearRule::delta)
    return {"rule=delta",
            "feature=taylor takes the sum rule only: its features have mixed signs, so the "
            "sum normalisation does not bound |phi| and the delta rule's I - beta phi phi^T "
            "can expand the memory step after step"};
  if (c.taylor_dim != 0 && c.feature != Feature::taylor)
    return {"taylor_dim=" + std::to_string(c.taylor_dim), "only feature=taylor reads it"};
  return {"", ""};
}

LinearAttention::LinearAttention(const LinearConfig& config) : config_(config) {
  const auto [setting, why] = linear_config_problem(config);
  if (!setting.empty()) throw Error("linear: " + setting + ": " + why);
}

std::string LinearAttention::spec() const {
  SpecWriter spec("linear");
  spec.add("feature", std::string(feature_name(config_.feature)))
      .add("m", config_.m)
      .add("nu", config_.nu)
      .add("rule", std::string(config_.rule == LinearRule::sum ? "sum" : "delta"))
      .add("beta", config_.beta)
      .add("eps", config_.eps)
      .add("seed", config_.seed);
  if (config_.feature == Feature::taylor) spec.add("taylor_dim", config_.taylor_dim);
  return spec.str();
}

namespace {

// The feature dim Dphi of `c` for head dim dk (taylor's d' as given, unchecked).
std::size_t feature_dim(const LinearConfig& c, std::size_t dk) {
  switch (c.feature) {
    case Feature::favor:
      return static_cast<std::size_t>(c.m);
    case Feature::dpfp:
      return 2 * dk * static_cast<std::size_t>(c.nu);
    case Feature::taylor: {
      const std::size_t d = c.taylor_dim == 0 ? dk : static_cast<std::size_t>(c.taylor_dim);
      return 1 + d + d * d;
    }
    default:
      return dk;
  }
}

}  // namespace

Support LinearAttention::support() const {
  Support s;
  s.backward = true;
  s.causal_cross = false;  // the causal forms pair query i with key i
  s.allowed = false;       // no per-pair weights exist to mask
  s.state = !favor_stabilised(config_);
  s.documents = true;
  s.grouped_heads = true;  // a state per query head, k and v read from its KV head
  // The sum rule estimates a softmax kernel (FAVOR+ converges to it); the delta rule overwrites.
  s.approximates_softmax = config_.rule == LinearRule::sum;
  return s;
}

StateDims LinearAttention::state_dims(const Dims& d) const {
  return {feature_dim(config_, d.dk), d.dv, config_.rule == LinearRule::sum};
}

std::string LinearAttention::why_unsupported(const std::string& feature) const {
  if (feature == "a recurrent state")
    return "feature=favor with rule=sum keeps its keys' running stabiliser outside S and z "
           "(rule=delta, or another feature map, has a state)";
  return {};
}

double LinearAttention::flops(const Dims& d, const Mask& mask) const {
  const double dphi = double(feature_dim(config_, d.dk));
  double keys = 0;  // keys that write into the memory, over the batch
  for (std::size_t b = 0; b < d.batch; ++b) keys += double(mask.valid_keys(b, d.nk));
  const double queries = double(d.batch * d.nq);
  const double dv = double(d.dv);
  const double write = config_.rule == LinearRule::sum ? 2 * dphi * (dv + 1) : 4 * dphi * dv;
  const double read = config_.rule == LinearRule::sum ? 2 * dphi * (dv + 1) : 2 * dphi * dv;
  double projection = config_.feature == Feature::favor ? 2.0 * double(d.dk) * dphi : 0.0;
  if (config_.feature == Feature::taylor && config_.taylor_dim != 0 &&
      std::size_t(config_.taylor_dim) < d.dk)  // taylor's P x
    projection = 2.0 * double(d.dk) * double(config_.taylor_dim);
  return double(d.heads) * (keys * (write + projection) + queries * (read + projection));
}

FeatureMap LinearAttention::feature_map(std::size_t dk, double scale) const {
  if (config_.feature == Feature::dpfp && static_cast<std::size_t>(config_.nu) >= 2 * dk)
    throw Error(spec() + ": nu=" + std::to_string(config_.nu) + ": dpfp needs nu < 2·Dk = " +
                std::to_string(2 * dk) + " (Dk = " + std::to_string(dk) + ")");
  std::size_t m = static_cast<std::size_t>(config_.m);
  if (config_.feature == Feature::taylor) {
    if (static_cast<std::size_t>(config_.taylor_dim) > dk)
      throw Error(spec() + ": taylor_dim=" + std::to_string(config_.taylor_dim) +
                  ": the Taylor projection maps Dk = " + std::to_string(dk) +
                  " down to d' <= Dk (0: no projection)");
    m = config_.taylor_dim == 0 ? dk : static_cast<std::size_t>(config_.taylor_dim);
  }
  return FeatureMap(config_.feature, dk, m, static_cast<std::size_t>(config_.nu),
                    static_cast<std::uint64_t>(config_.seed), scale);
}

void LinearAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                              const TokenInputs& in, const Dims& d, Tensor& out,
                              Saved* saved) const {
  if (saved) {  // the backward recomputes what it needs: nothing saved but the final state
    saved->lse = RowLogSumExp();
    saved->state.reset();
  }
  run(q, k, v, mask, in, d, out, saved ? &saved->final_state : nullptr);
}

void LinearAttention::run(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                          const TokenInputs& in, const Dims& d, Tensor& out,
                          RecurrentState* final_state, float* stabilisers) const {
  const FeatureMap map = feature_map(d.dk, mask.softmax_scale(d.dk));
  const bool causal = mask.causal != Causal::none;
  const float eps = static_cast<float>(config_.eps);
  const std::size_t p = map.dim();
  const std::vector<scan::Sequence> seqs = scan::sequences(mask, d, name());
  const auto count = static_cast<std::ptrdiff_t>(seqs.size());
#pragma omp parallel
  {
    // Kept per thread across calls: fresh head-sized buffers (4 MiB at N = 16384) were above
    // the mmap threshold and page-faulted in on every call (15% of the causal sum rule).
    static thread_local HeadWork w;
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < count; ++t) {
      const scan::Sequence& seq = seqs[static_cast<std::size_t>(t)];
      const std::size_t qr = seq.query_row(d), kr = seq.kv_row(d);
      scan::Head h = prepare(map, config_, q.data() + qr * d.dk, k.data() + kr * d.dk,
                             v.data() + kr * d.dv, seq.nq, seq.nk, seq.valid, causal, w,
                             stabilisers ? stabilisers + seq.state : nullptr);
      with_initial_state(h, in, seq.state, p, d.dv);
      float* oh = out.data() + qr * d.dv;
      const scan::StateOut final_head = head_state(final_state, seq.state, p, d.dv);
      if (config_.rule == LinearRule::delta) {
        scan::forward(h, p, d.dv, oh, nullptr, nullptr, final_head);
        continue;
      }
      w.den.resize(seq.nq);
      scan::forward(h, p, d.dv, oh, w.den.data(), nullptr, final_head);
      divide_rows(oh, w.den.data(), seq.nq, d.dv, eps);
    }
  }
}

void LinearAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                       const TokenInputs& in, const Dims& d, TensorRef,
                                       TensorRef d_out, const Saved&, AllGradients& all) const {
  Gradients& grads = all.qkv;
  const FeatureMap map = feature_map(d.dk, mask.softmax_scale(d.dk));
  const bool causal = mask.causal != Causal::none;
  const float eps = static_cast<float>(config_.eps);
  const std::size_t p = map.dim(), dv = d.dv;
  const std::vector<scan::Sequence> seqs = scan::sequences(mask, d, name());
  const auto count = static_cast<std::ptrdiff_t>(seqs.size());
  scan::KeyGradients key_grads(d, grads.dk, grads.dv);
#pragma omp parallel
  {
    // Kept per thread across calls: fresh head-sized buffers (4 MiB at N = 16384) were above
    // the mmap threshold and page-faulted in on every call (15% of the causal sum rule).
    static thread_local HeadWork w;
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < count; ++t) {
      const scan::Sequence& seq = seqs[static_cast<std::size_t>(t)];
      const std::size_t qr = seq.query_row(d), kr = seq.kv_row(d);
      const std::size_t nq = seq.nq, nk = seq.nk, valid = seq.valid;
      const float* qh = q.data() + qr * d.dk;
      const float* kh = k.data() + kr * d.dk;
      const float* gh = d_out.data() + qr * dv;
      float* dq = grads.dq.data() + qr * d.dk;
      float* dk = key_grads.dk(seq);
      float* dval = key_grads.dv(seq);
      scan::Head h = prepare(map, config_, qh, kh, v.data() + kr * dv, nq, nk, valid, causal, w);
      with_initial_state(h, in, seq.state, p, dv);
      scan::StateIn d_final;
      if (in.d_final_state) {
        d_final.memory = in.d_final_state->memory.data() + seq.state * p * dv;
        if (in.d_final_state->key_sum)
          d_final.key_sum = in.d_final_state->key_sum->data() + seq.state * p;
      }
      const scan::StateOut d_initial = head_state(&all.d_initial_state, seq.state, p, dv);
      w.dfq.resize(nq * p);
      w.dfk.resize(nk * p);
      if (config_.rule == LinearRule::delta) {
        scan::backward(h, p, dv, gh, nullptr, nullptr, w.dfq.data(), w.dfk.data(), dval, nullptr,
                       nullptr, d_final, d_initial);
        hat_backward(w.hq.data(), w.sq.data(), nq, p, w.dfq.data());
        hat_backward(w.hk.data(), w.sk.data(), valid, p, w.dfk.data());
      } else {
        // out = num / (den + eps): dnum = g / (den + eps), dden = -(g · out) / (den + eps),
        // zero where den = 0 (the forward outputs a constant 0 there). The engine runs again
        // for num and den (O(N·P·Dv), cheaper than keeping them), saving its chunk states for
        // the backward; favor's g (its stabilisers) is held constant: no dg.
        w.num.resize(nq * dv);
        w.den.resize(nq);
        w.checkpoints.resize(causal ? scan::checkpoint_floats(nk, p, dv) : 0);
        scan::forward(h, p, dv, w.num.data(), w.den.data(),
                      causal ? w.checkpoints.data() : nullptr);
        w.dnum.resize(nq * dv);
        w.dden.resize(nq);
        for (std::size_t i = 0; i < nq; ++i) {
          const float inv = inverse_den(w.den[i], eps);
          const float* gi = gh + i * dv;
          for (std::size_t c = 0; c < dv; ++c) w.dnum[i * dv + c] = gi[c] * inv;
          w.dden[i] = -inv * inv * dot(gi, &w.num[i * dv], dv);  // g · out / (den + eps)
        }
        scan::backward(h, p, dv, w.dnum.data(), w.dden.data(),
                       causal ? w.checkpoints.data() : nullptr, w.dfq.data(), w.dfk.data(), dval,
                       nullptr, nullptr, d_final, d_initial);
      }
      if (nq > 0) map.backward(qh, nq, w.fq.data(), w.dfq.data(), dq);
      if (valid > 0) map.backward(kh, valid, w.fk.data(), w.dfk.data(), dk);
      std::fill(dk + valid * d.dk, dk + nk * d.dk, 0.0f);
    }
  }
  key_grads.sum();
}

// The recurrent decoder: (S, z) or W of every item and head, and favor's running stabiliser
// under the sum rule; prefill through the chunked forward from them (its final state written
// back in place: each head reads its initial state before it writes its final one), steps
// through the engine's step on one row of features.
class LinearDecoder final : public TokenDecoder {
 public:
  LinearDecoder(const LinearAttention& owner, const DecodeConfig& c)
      : TokenDecoder(owner, c),
        own_(owner.config()),
        map_(own_.feature_map(c.dk, *config_.scale)),
        stabilisers_(favor_stabilised(own_.config()) ? c.batch * c.heads : 0, kNegInf) {
    const std::size_t p = map_.dim();
    state_.memory = xt::zeros<float>({c.batch, c.heads, p, c.dv});
    if (own_.config().rule == LinearRule::sum)
      state_.key_sum = xt::zeros<float>({c.batch, c.heads, p});
  }

  std::size_t bytes() const override {
    return (state_.memory.size() + state_.key_sum.size() + stabilisers_.size()) * sizeof(float);
  }

 protected:
  void do_prefill(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in,
                  const std::vector<std::size_t>& lengths, Tensor& out) override {
    const DecodeConfig& c = config_;
    const std::size_t n = q.shape()[2];
    const Mask mask = recurrent_prefill_mask(c, lengths);
    TokenInputs from = in;
    from.initial_state = state_.ref();
    own_.run(q, k, v, mask, from, Dims{c.batch, c.heads, n, n, c.dk, c.dv, c.kv()}, out, &state_,
             stabilisers_.empty() ? nullptr : stabilisers_.data());
  }

  void do_step(TensorRef q, TensorRef k, TensorRef v, const TokenInputs&, Tensor& out) override {
    const DecodeConfig& c = config_;
    const LinearConfig& lc = own_.config();
    const std::size_t p = map_.dim();
    std::vector<float> tmp(c.dv), fq(p), fk(p), phi(p), sums(1);
    for (std::size_t bh = 0; bh < c.batch * c.heads; ++bh) {
      const std::size_t kv = c.kv_slice(bh);  // the KV head query head bh reads
      const float* kh = k.data() + kv * c.dk;
      const float* vh = v.data() + kv * c.dv;
      float* oh = out.data() + bh * c.dv;
      float* s = state_.memory.data() + bh * p * c.dv;
      if (lc.rule == LinearRule::delta) {  // the engine's step on hat(q), hat(k)
        delta_rows(map_, kh, 1, phi.data(), fk.data(), sums.data());
        delta_rows(map_, q.data() + bh * c.dk, 1, phi.data(), fq.data(), sums.data());
        const float beta = static_cast<float>(lc.beta);
        scan::step(s, nullptr, fq.data(), fk.data(), vh, 0.0f, &beta, p, c.dv, oh, nullptr,
                   tmp.data());
        continue;
      }
      float g = 0.0f, unused = kNegInf;
      sum_key_features(map_, kh, 1, 1, fk.data(), &g,
                       stabilisers_.empty() ? unused : stabilisers_[bh]);
      row_features(map_, q.data() + bh * c.dk, 1, fq.data());
      float den = 0.0f;
      scan::step(s, state_.key_sum.data() + bh * p, fq.data(), fk.data(), vh, g, nullptr, p, c.dv,
                 oh, &den, tmp.data());
      divide_rows(oh, &den, 1, c.dv, static_cast<float>(lc.eps));
    }
  }

 private:
  LinearAttention own_;  // a copy of its maker: the decoder outlives it
  FeatureMap map_;
  RecurrentState state_;
  std::vector<float> stabilisers_;  // favor's sum rule: its running max log-feature per head
};

std::unique_ptr<TokenDecoder> LinearAttention::start_decoding(const DecodeConfig& config) const {
  return std::make_unique<LinearDecoder>(*this, config);
}

std::unique_ptr<Attention> make_linear(Params& params) {
  LinearConfig c;
  const std::string feature =
      params.choice("feature", "elu1", {"elu1", "relu", "favor", "dpfp", "taylor"});
  c.feature = feature == "relu"     ? Feature::relu
              : feature == "favor"  ? Feature::favor
              : feature == "dpfp"   ? Feature::dpfp
              : feature == "taylor" ? Feature::taylor
                                    : Feature::elu1;
  c.m = params.integer("m", c.m);
  c.nu = params.integer("nu", c.nu);
  c.rule = params.choice("rule", "sum", {"sum", "delta"}) == "delta" ? LinearRule::delta
                                                                     : LinearRule::sum;
  c.beta = params.number("beta", c.beta);
  c.eps = params.number("eps", c.eps);
  c.seed = params.integer("seed", c.seed);
  // Read with a sentinel so that taylor_dim given beside another feature is refused, not ignored.
  constexpr std::int64_t kAbsent = std::numeric_limits<std::int64_t>::min();
  const std::int64_t taylor_dim = params.integer("taylor_dim", kAbsent);
  if (taylor_dim != kAbsent && c.feature != Feature::taylor)
    params.fail("taylor_dim", "only feature=taylor reads it");
  if (taylor_dim != kAbsent) c.taylor_dim = taylor_dim;
  const auto [setting, why] = linear_config_problem(c);  // fail() quotes the key=value itself
  if (!setting.empty()) params.fail(setting.substr(0, setting.find('=')), why);
  return std::make_unique<LinearAttention>(c);
}

namespace {
// Position 50 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("linear", make_linear, 50);
}  // namespace

}  // namespace attnlab
