#include "variants/linear.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {

// Tokens per chunk of the causal sum rule: a multiple of gemm_tile's 6-row and 8-column blocks,
// small enough that the masked chunk x chunk product stays cheap next to the state products.
constexpr std::size_t kChunk = 48;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// favor, causal: exp(E_j - c_i) is computed as exp(E_j - c_end) · exp(c_end - c_i). When the
// stabiliser grows by more than this within one chunk the first factor could underflow, so the
// chunk's intra part is then computed directly (slow, exact).
constexpr float kMaxSpread = 60.0f;

// x[i] = exp(x[i] - c).
void exp_shifted(float* x, std::size_t n, float c) {
  for (std::size_t i = 0; i < n; ++i) x[i] = (x[i] - c) * kLog2e;
  kernels::exp2_inplace(x, n);
}

float row_max(const float* x, std::size_t n) { return *std::max_element(x, x + n); }

// Eight independent partial sums: a plain float reduction is one serial chain of dependent
// adds (GCC may not reorder it), which cost as much as the chunk's products.
float dot(const float* a, const float* b, std::size_t n) {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float x : acc) s += x;
  return s;
}

float sum(const float* a, std::size_t n) {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += a[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i];
  for (float x : acc) s += x;
  return s;
}

// phi for `rows` rows; favor stabilised by each row's own max (see the header).
void row_features(const FeatureMap& map, const float* x, std::size_t rows, float* out) {
  if (rows == 0) return;
  map.map(x, rows, out);
  if (!map.logarithmic()) return;
  const std::size_t p = map.dim();
  for (std::size_t i = 0; i < rows; ++i) exp_shifted(out + i * p, p, row_max(out + i * p, p));
}

// phi / sum(phi) per row (delta rule); a zero row stays zero.
void sum_normalise(float* f, std::size_t rows, std::size_t p) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* row = f + i * p;
    const float total = sum(row, p);
    if (total > 0.0f)
      for (std::size_t c = 0; c < p; ++c) row[c] /= total;
  }
}

// out_i /= den_i + eps, zeros where the denominator is zero.
void divide_rows(float* out, std::size_t rows, std::size_t dv, const float* den, float eps) {
  for (std::size_t i = 0; i < rows; ++i) {
    const float inv = den[i] > 0.0f ? 1.0f / (den[i] + eps) : 0.0f;
    for (std::size_t c = 0; c < dv; ++c) out[i * dv + c] *= inv;
  }
}

// out[dv] = f[p] · m[p x dv] (a one-row product on the dispatched kernels).
void vec_mat(const float* f, const float* m, std::size_t p, std::size_t dv, float* out) {
  kernels::gemm_tile(1, dv, p, f, p, m, dv, out, dv, false);
}

struct Workspace {
  std::size_t p, dv;
  std::vector<float> fq, fk, fkt, a, den, c, s, z, tmp;
  Workspace(std::size_t p_, std::size_t dv_)
      : p(p_), dv(dv_), fq(kChunk * p), fk(kChunk * p), fkt(p * kChunk), a(kChunk * kChunk),
        den(kChunk), c(kChunk), s(p * dv), z(p), tmp(std::max(p, dv)) {}

  void clear_state() {
    std::fill(s.begin(), s.end(), 0.0f);
    std::fill(z.begin(), z.end(), 0.0f);
  }
  // (S, z) re-expressed at a larger favor stabiliser: multiply by exp(from - to).
  void restabilise(float from, float to) {
    if (from == kNegInf || to <= from) return;  // an empty state stays zero
    const float f = std::exp(from - to);
    for (float& x : s) x *= f;
    for (float& x : z) x *= f;
  }
};

// Key features of one chunk of `rows` keys of which the first `valid` are real, transposed into
// w.fkt [P x kChunk] (padding columns zero). favor: w.fk keeps the log-features, w.c[i] is the
// running stabiliser after key i (starting from c_prev), and fkt is taken at the chunk's last
// one, which is returned.
float key_features(const FeatureMap& map, const float* k, std::size_t rows, std::size_t valid,
                   float c_prev, Workspace& w) {
  const std::size_t p = w.p;
  if (valid > 0) map.map(k, valid, w.fk.data());
  float c = c_prev;
  if (map.logarithmic())
    for (std::size_t i = 0; i < rows; ++i) {
      if (i < valid) c = std::max(c, row_max(&w.fk[i * p], p));
      w.c[i] = c;
    }
  for (std::size_t j = 0; j < kChunk; ++j) {
    const bool real = j < valid;
    const float* src = &w.fk[j * p];
    if (real && map.logarithmic()) {
      std::copy(src, src + p, w.tmp.data());
      exp_shifted(w.tmp.data(), p, c);
      src = w.tmp.data();
    }
    for (std::size_t r = 0; r < p; ++r) w.fkt[r * kChunk + j] = real ? src[r] : 0.0f;
  }
  return c;
}

void add_key_sums(Workspace& w, const float* v, std::size_t valid) {
  if (valid == 0) return;
  kernels::gemm_tile(w.p, w.dv, valid, w.fkt.data(), kChunk, v, w.dv, w.s.data(), w.dv, true);
  for (std::size_t r = 0; r < w.p; ++r) w.z[r] += sum(&w.fkt[r * kChunk], valid);
}

// One head of the sum rule, every query reading all `valid` keys.
void sum_all(const FeatureMap& map, const float* q, const float* k, const float* v,
             std::size_t nq, std::size_t valid, std::size_t dk, float eps, float* out,
             Workspace& w) {
  w.clear_state();
  float c = kNegInf;
  for (std::size_t j0 = 0; j0 < valid; j0 += kChunk) {
    const std::size_t rows = std::min(kChunk, valid - j0);
    const float c_new = key_features(map, k + j0 * dk, rows, rows, c, w);
    if (map.logarithmic()) w.restabilise(c, c_new);
    c = c_new;
    add_key_sums(w, v + j0 * w.dv, rows);
  }
  for (std::size_t i0 = 0; i0 < nq; i0 += kChunk) {
    const std::size_t rows = std::min(kChunk, nq - i0);
    row_features(map, q + i0 * dk, rows, w.fq.data());
    float* o = out + i0 * w.dv;
    kernels::gemm_tile(rows, w.dv, w.p, w.fq.data(), w.p, w.s.data(), w.dv, o, w.dv, false);
    for (std::size_t i = 0; i < rows; ++i) w.den[i] = dot(&w.fq[i * w.p], w.z.data(), w.p);
    divide_rows(o, rows, w.dv, w.den.data(), eps);
  }
}

// One head of the causal sum rule (Nq == Nk = n) in chunked form.
void sum_causal(const FeatureMap& map, const float* q, const float* k, const float* v,
                std::size_t n, std::size_t valid_keys, std::size_t dk, float eps, float* out,
                Workspace& w) {
  const std::size_t p = w.p, dv = w.dv;
  const bool log_form = map.logarithmic();
  w.clear_state();
  float c = kNegInf;
  for (std::size_t t0 = 0; t0 < n; t0 += kChunk) {
    const std::size_t rows = std::min(kChunk, n - t0);
    const std::size_t valid = std::min(rows, valid_keys > t0 ? valid_keys - t0 : 0);
    const float c_prev = c;
    const float c_end = key_features(map, k + t0 * dk, rows, valid, c_prev, w);
    row_features(map, q + t0 * dk, rows, w.fq.data());
    float* o = out + t0 * dv;
    // Earlier chunks, through the carried state (at stabiliser c_prev).
    kernels::gemm_tile(rows, dv, p, w.fq.data(), p, w.s.data(), dv, o, dv, false);
    for (std::size_t i = 0; i < rows; ++i) w.den[i] = dot(&w.fq[i * p], w.z.data(), p);
    // This chunk: the masked product phi(Q) phi(K)^T.
    kernels::gemm_tile(rows, rows, p, w.fq.data(), p, w.fkt.data(), kChunk, w.a.data(), kChunk,
                       false);
    if (log_form) {
      const bool direct = valid > 0 && c_end - w.c[0] > kMaxSpread;
      for (std::size_t i = 0; i < rows; ++i) {
        const float ci = w.c[i];
        const float alpha = (ci == kNegInf || c_prev == kNegInf) ? 0.0f : std::exp(c_prev - ci);
        const float gamma = ci == kNegInf ? 0.0f : std::exp(c_end - ci);
        for (std::size_t col = 0; col < dv; ++col) o[i * dv + col] *= alpha;
        w.den[i] *= alpha;
        float* arow = &w.a[i * kChunk];
        for (std::size_t j = 0; j < rows; ++j) arow[j] *= gamma;
        if (direct && ci != kNegInf)
          for (std::size_t j = 0; j <= i && j < valid; ++j) {
            float sum = 0.0f;
            for (std::size_t r = 0; r < p; ++r)
              sum += w.fq[i * p + r] * std::exp(w.fk[j * p + r] - ci);
            arow[j] = sum;
          }
      }
    }
    for (std::size_t i = 0; i < rows; ++i) {
      float* arow = &w.a[i * kChunk];
      for (std::size_t j = i + 1; j < rows; ++j) arow[j] = 0.0f;
      w.den[i] += sum(arow, std::min(i + 1, valid));
    }
    if (valid > 0)
      kernels::gemm_tile(rows, dv, valid, w.a.data(), kChunk, v + t0 * dv, dv, o, dv, true);
    divide_rows(o, rows, dv, w.den.data(), eps);
    if (log_form) w.restabilise(c_prev, c_end);
    add_key_sums(w, v + t0 * dv, valid);
    c = c_end;
  }
}

// W += beta (v - W phi_k) phi_k^T, with W stored transposed as wt [P x Dv]: a read, a rank-1
// update, and with fq given the read out = W phi_q of the updated memory, all on gemm_tile.
void delta_write(const float* fk, const float* v, float beta, std::size_t p, std::size_t dv,
                 float* wt, float* tmp, const float* fq = nullptr, float* out = nullptr) {
  vec_mat(fk, wt, p, dv, tmp);
  for (std::size_t c = 0; c < dv; ++c) tmp[c] = beta * (v[c] - tmp[c]);
  kernels::gemm_tile(p, dv, 1, fk, 1, tmp, dv, wt, dv, true);
  if (fq) vec_mat(fq, wt, p, dv, out);
}

void delta_features(const FeatureMap& map, const float* x, std::size_t rows, float* out) {
  row_features(map, x, rows, out);
  sum_normalise(out, rows, map.dim());
}

// One head of the delta rule. causal: out_i = W_i phi(q_i) (Nq == Nk); else all read W_valid.
void delta_head(const FeatureMap& map, const float* q, const float* k, const float* v,
                std::size_t nq, std::size_t nk, std::size_t valid_keys, std::size_t dk,
                float beta, bool causal, float* out, Workspace& w) {
  const std::size_t p = w.p, dv = w.dv;
  w.clear_state();  // w.s holds W^T
  const std::size_t writes = causal ? nk : valid_keys;
  for (std::size_t t0 = 0; t0 < writes; t0 += kChunk) {
    const std::size_t rows = std::min(kChunk, writes - t0);
    const std::size_t valid = std::min(rows, valid_keys > t0 ? valid_keys - t0 : 0);
    delta_features(map, k + t0 * dk, valid, w.fk.data());
    if (causal) delta_features(map, q + t0 * dk, rows, w.fq.data());
    for (std::size_t i = 0; i < rows; ++i) {
      const float* fq = causal ? &w.fq[i * p] : nullptr;
      float* o = causal ? out + (t0 + i) * dv : nullptr;
      if (i < valid)
        delta_write(&w.fk[i * p], v + (t0 + i) * dv, beta, p, dv, w.s.data(), w.tmp.data(), fq, o);
      else if (causal)
        vec_mat(fq, w.s.data(), p, dv, o);
    }
  }
  if (causal) return;
  for (std::size_t i0 = 0; i0 < nq; i0 += kChunk) {
    const std::size_t rows = std::min(kChunk, nq - i0);
    delta_features(map, q + i0 * dk, rows, w.fq.data());
    kernels::gemm_tile(rows, dv, p, w.fq.data(), p, w.s.data(), dv, out + i0 * dv, dv, false);
  }
}

}  // namespace

std::pair<std::string, std::string> linear_config_problem(const LinearConfig& c) {
  auto text = [](double x) { return std::to_string(x); };
  if (c.m < 1)
    return {"m", "m=" + std::to_string(c.m) + ": favor needs at least 1 random feature"};
  if (c.nu < 1) return {"nu", "nu=" + std::to_string(c.nu) + ": dpfp needs nu >= 1"};
  if (!(c.beta > 0.0 && c.beta <= 1.0))  // also refuses NaN
    return {"beta", "beta=" + text(c.beta) + ": the delta rule needs 0 < beta <= 1"};
  if (!(c.eps >= 0.0 && std::isfinite(c.eps)))
    return {"eps", "eps=" + text(c.eps) + ": must be finite and >= 0"};
  if (c.seed < 0) return {"seed", "seed=" + std::to_string(c.seed) + ": must be >= 0"};
  return {"", ""};
}

LinearAttention::LinearAttention(const LinearConfig& config) : config_(config) {
  const auto [key, why] = linear_config_problem(config);
  if (!key.empty()) throw Error("linear: " + why);
}

std::string LinearAttention::spec() const {
  return SpecWriter("linear")
      .add("feature", std::string(feature_name(config_.feature)))
      .add("m", config_.m)
      .add("nu", config_.nu)
      .add("rule", std::string(config_.rule == LinearRule::sum ? "sum" : "delta"))
      .add("beta", config_.beta)
      .add("eps", config_.eps)
      .add("seed", config_.seed)
      .str();
}

Support LinearAttention::support() const {
  Support s;
  s.causal_cross = false;  // the causal forms pair query i with key i
  s.allowed = false;       // no per-pair weights exist to mask
  return s;
}

double LinearAttention::flops(const Dims& d, const Mask& mask) const {
  const double dphi = config_.feature == Feature::favor  ? double(config_.m)
                      : config_.feature == Feature::dpfp ? 2.0 * double(d.dk * config_.nu)
                                                         : double(d.dk);
  double keys = 0;  // keys that write into the memory, over the batch
  for (std::size_t b = 0; b < d.batch; ++b)
    keys += mask.has_key_lengths() ? double(mask.key_lengths[b]) : double(d.nk);
  const double queries = double(d.batch * d.nq);
  const double dv = double(d.dv);
  const double write = config_.rule == LinearRule::sum ? 2 * dphi * (dv + 1) : 4 * dphi * dv;
  const double read = config_.rule == LinearRule::sum ? 2 * dphi * (dv + 1) : 2 * dphi * dv;
  const double favor = config_.feature == Feature::favor ? 2.0 * double(d.dk) * dphi : 0.0;
  return double(d.heads) * (keys * (write + favor) + queries * (read + favor));
}

FeatureMap LinearAttention::feature_map(std::size_t dk, double scale) const {
  if (config_.feature == Feature::dpfp && static_cast<std::size_t>(config_.nu) >= 2 * dk)
    throw Error(spec() + ": nu=" + std::to_string(config_.nu) + ": dpfp needs nu < 2·Dk = " +
                std::to_string(2 * dk) + " (Dk = " + std::to_string(dk) + ")");
  return FeatureMap(config_.feature, dk, static_cast<std::size_t>(config_.m),
                    static_cast<std::size_t>(config_.nu), static_cast<std::uint64_t>(config_.seed),
                    scale);
}

void LinearAttention::compute(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Mask& mask, const Dims& d, Tensor& out) const {
  const FeatureMap map = feature_map(d.dk, mask.softmax_scale(d.dk));
  const bool causal = mask.causal != Causal::none;
  const float eps = static_cast<float>(config_.eps), beta = static_cast<float>(config_.beta);
  const std::ptrdiff_t heads = static_cast<std::ptrdiff_t>(d.batch * d.heads);
#pragma omp parallel
  {
    Workspace w(map.dim(), d.dv);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < heads; ++t) {
      const std::size_t bh = static_cast<std::size_t>(t), b = bh / d.heads;
      const std::size_t valid =
          mask.has_key_lengths() ? static_cast<std::size_t>(mask.key_lengths[b]) : d.nk;
      const float* qh = q.data() + bh * d.nq * d.dk;
      const float* kh = k.data() + bh * d.nk * d.dk;
      const float* vh = v.data() + bh * d.nk * d.dv;
      float* oh = out.data() + bh * d.nq * d.dv;
      if (config_.rule == LinearRule::delta)
        delta_head(map, qh, kh, vh, d.nq, d.nk, valid, d.dk, beta, causal, oh, w);
      else if (causal)
        sum_causal(map, qh, kh, vh, d.nq, valid, d.dk, eps, oh, w);
      else
        sum_all(map, qh, kh, vh, d.nq, valid, d.dk, eps, oh, w);
    }
  }
}

LinearState LinearAttention::start(std::size_t batch, std::size_t heads, std::size_t dk,
                                   std::size_t dv, std::optional<double> scale) const {
  if (batch == 0 || heads == 0 || dk == 0 || dv == 0)
    throw Error(spec() + ": a recurrent state needs batch, heads, Dk and Dv >= 1");
  if (scale && !(*scale > 0.0 && std::isfinite(*scale)))
    throw Error(spec() + ": scale=" + std::to_string(*scale) + ": must be finite and > 0");
  return LinearState(config_, feature_map(dk, scale.value_or(1.0 / std::sqrt(double(dk)))), batch,
                     heads, dv);
}

LinearState::LinearState(const LinearConfig& config, FeatureMap map, std::size_t batch,
                         std::size_t heads, std::size_t dv)
    : config_(config), map_(std::move(map)), batch_(batch), heads_(heads), dv_(dv),
      memory_(batch * heads * map_.dim() * dv, 0.0f), z_(batch * heads * map_.dim(), 0.0f),
      c_(batch * heads, kNegInf), fq_(map_.dim()), fk_(map_.dim()) {}

Tensor LinearState::step(const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::size_t p = map_.dim(), dk = map_.dk();
  auto expect = [&](const Tensor& t, std::size_t dim, const char* what) {
    const auto& s = t.shape();
    if (s[0] != batch_ || s[1] != heads_ || s[2] != 1 || s[3] != dim)
      throw Error(std::string("LinearState::step: ") + what + " has shape " + shape_string(t) +
                  ", expected [" + std::to_string(batch_) + ", " + std::to_string(heads_) +
                  ", 1, " + std::to_string(dim) + "]");
  };
  expect(q, dk, "q");
  expect(k, dk, "k");
  expect(v, dv_, "v");
  Tensor out = Tensor::from_shape({batch_, heads_, 1, dv_});
  std::vector<float> tmp(dv_);
  for (std::size_t bh = 0; bh < batch_ * heads_; ++bh) {
    const float* qh = q.data() + bh * dk;
    const float* kh = k.data() + bh * dk;
    const float* vh = v.data() + bh * dv_;
    float* oh = out.data() + bh * dv_;
    float* mem = memory_.data() + bh * p * dv_;
    if (config_.rule == LinearRule::delta) {
      delta_features(map_, kh, 1, fk_.data());
      delta_write(fk_.data(), vh, static_cast<float>(config_.beta), p, dv_, mem, tmp.data());
      delta_features(map_, qh, 1, fq_.data());
      vec_mat(fq_.data(), mem, p, dv_, oh);
      continue;
    }
    float* z = z_.data() + bh * p;
    map_.map(kh, 1, fk_.data());
    if (map_.logarithmic()) {  // running key stabiliser, as in the causal batch form
      const float c_old = c_[bh], c_new = std::max(c_old, row_max(fk_.data(), p));
      if (c_old != kNegInf && c_new > c_old) {
        const float f = std::exp(c_old - c_new);
        for (std::size_t i = 0; i < p * dv_; ++i) mem[i] *= f;
        for (std::size_t i = 0; i < p; ++i) z[i] *= f;
      }
      exp_shifted(fk_.data(), p, c_new);
      c_[bh] = c_new;
    }
    for (std::size_t r = 0; r < p; ++r) z[r] += fk_[r];
    kernels::gemm_tile(p, dv_, 1, fk_.data(), 1, vh, dv_, mem, dv_, true);  // mem += phi_k v^T
    row_features(map_, qh, 1, fq_.data());
    vec_mat(fq_.data(), mem, p, dv_, oh);
    const float den = dot(fq_.data(), z, p);
    divide_rows(oh, 1, dv_, &den, static_cast<float>(config_.eps));
  }
  ++position_;
  return out;
}

std::unique_ptr<Attention> make_linear(Params& params) {
  LinearConfig c;
  const std::string feature = params.choice("feature", "elu1", {"elu1", "relu", "favor", "dpfp"});
  c.feature = feature == "relu"    ? Feature::relu
              : feature == "favor" ? Feature::favor
              : feature == "dpfp"  ? Feature::dpfp
                                   : Feature::elu1;
  c.m = params.integer("m", c.m);
  c.nu = params.integer("nu", c.nu);
  c.rule = params.choice("rule", "sum", {"sum", "delta"}) == "delta" ? LinearRule::delta
                                                                     : LinearRule::sum;
  c.beta = params.number("beta", c.beta);
  c.eps = params.number("eps", c.eps);
  c.seed = params.integer("seed", c.seed);
  const auto [key, why] = linear_config_problem(c);
  if (!key.empty()) params.fail(key, why);
  return std::make_unique<LinearAttention>(c);
}

namespace {
// Position 50 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("linear", make_linear, 50);
}  // namespace

}  // namespace attnlab
