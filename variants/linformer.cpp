#include "variants/linformer.hpp"

#include <algorithm>
#include <cmath>

#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {

using kernels::OnlineSoftmax;
constexpr std::size_t kChunk = 256;  // keys per gemm_tile call in the projections

const char* share_name(LinformerAttention::Share s) {
  using S = LinformerAttention::Share;
  return s == S::none ? "none" : s == S::kv ? "kv" : "layer";
}

const char* init_name(LinformerAttention::Init i) {
  using I = LinformerAttention::Init;
  return i == I::gaussian ? "gaussian"
         : i == I::xavier ? "xavier"
         : i == I::identity ? "identity"
                            : "supplied";
}

std::string shape_of(const xt::xarray<float>& t) {
  std::string out = "[";
  for (std::size_t i = 0; i < t.dimension(); ++i)
    out += (i ? ", " : "") + std::to_string(t.shape()[i]);
  return out + "]";
}

// (P X)^T [dim x k] = X^T [dim x n] · P^T [n x k] for one head's n keys or values x [n x dim]
// and a projection stored transposed (pt [n x k]), kChunk keys at a time so that the slice of
// P^T stays in L2 across the dim rows. `chunk` holds kChunk x dim floats.
void project_transposed(const float* x, std::size_t n, std::size_t dim, const float* pt,
                        std::size_t k, float* chunk, float* out) {
  for (std::size_t p = 0; p < n; p += kChunk) {
    const std::size_t cols = std::min(kChunk, n - p);
    for (std::size_t j = 0; j < cols; ++j)
      for (std::size_t c = 0; c < dim; ++c) chunk[c * cols + j] = x[(p + j) * dim + c];
    kernels::gemm_tile(dim, k, cols, chunk, cols, pt + p * k, k, out, k, p > 0);
  }
}

// Softmax attention of `rows` queries over k projected keys kpt [Dk x k] and values vp [k x Dv].
void attend(OnlineSoftmax& softmax, const float* q, std::size_t rows, float scale,
            const float* kpt, const float* vp, std::size_t k, std::size_t dv, float* out) {
  softmax.start(q, rows, scale);
  for (std::size_t c0 = 0; c0 < k; c0 += OnlineSoftmax::kCols) {
    const std::size_t cols = std::min(OnlineSoftmax::kCols, k - c0);
    softmax.scores(kpt + c0, k, cols);
    softmax.fold(vp + c0 * dv, dv, cols);
  }
  softmax.finish(out, dv);
}

}  // namespace

LinformerAttention::LinformerAttention(std::size_t k, Share share, Init init, std::size_t max_len,
                                       std::uint64_t seed)
    : k_(k), max_len_(max_len), share_(share), init_(init), seed_(seed) {
  if (k == 0) throw Error("linformer: k = 0: must be at least 1");
  if (max_len == 0) throw Error("linformer: max_len = 0: must be at least 1");
  if (k > max_len)
    throw Error("linformer: k = " + std::to_string(k) + " must not exceed max_len = " +
                std::to_string(max_len) + " (E and F are k x max_len)");
  if (init == Init::supplied)
    throw Error("linformer: init = supplied: give the matrices with set_projections");
}

std::string LinformerAttention::spec() const {
  return SpecWriter("linformer")
      .add("k", static_cast<std::int64_t>(k_))
      .add("share", share_name(share_))
      .add("init", init_name(init_))
      .add("max_len", static_cast<std::int64_t>(max_len_))
      .add("seed", static_cast<std::int64_t>(seed_))
      .str();
}

Support LinformerAttention::support() const {
  Support s;
  s.causal = s.causal_cross = false;
  s.allowed = false;
  return s;
}

std::string LinformerAttention::why_unsupported(const std::string& feature) const {
  if (feature.starts_with("causal"))
    return "each projected key E·K (and value F·V) is a weighted sum over all Nk positions, "
           "future ones included, so no query can be kept from seeing the future";
  if (feature == "boolean masks")
    return "a mask over the Nk original keys has no counterpart on the k projected keys, each "
           "of which mixes all of them (key padding, applied before the projection, is supported)";
  return {};
}

double LinformerAttention::flops(const Dims& d, const Mask& mask) const {
  double projected = 0;  // keys that enter the projections, summed over the batch
  for (std::size_t b = 0; b < d.batch; ++b)
    projected += mask.has_key_lengths()
                     ? static_cast<double>(std::min<std::int64_t>(
                           mask.key_lengths[b], static_cast<std::int64_t>(d.nk)))
                     : static_cast<double>(d.nk);
  const double per_row = 2.0 * static_cast<double>(k_ * (d.dk + d.dv)) * d.heads;
  return per_row * (projected + static_cast<double>(d.batch * d.nq));
}

void LinformerAttention::draw_columns(Matrix& m, std::size_t columns) const {
  m.et.resize(columns * k_);
  const float a = static_cast<float>(std::sqrt(6.0 / static_cast<double>(k_ + max_len_)));
  std::normal_distribution<float> normal(0.0f, static_cast<float>(1.0 / std::sqrt(double(k_))));
  std::uniform_real_distribution<float> uniform(-a, a);
  for (std::size_t j = m.columns; j < columns; ++j) {
    float* column = m.et.data() + j * k_;
    for (std::size_t r = 0; r < k_; ++r) {
      switch (init_) {
        case Init::gaussian: column[r] = normal(m.rng); break;
        case Init::xavier: column[r] = uniform(m.rng); break;
        default: column[r] = r == j ? 1.0f : 0.0f; break;
      }
    }
  }
  m.columns = columns;
}

const LinformerAttention::Matrix& LinformerAttention::matrix(char which, std::size_t head,
                                                             std::size_t columns) const {
  int slot = which == 'E' ? 0 : 1;
  if (init_ == Init::supplied) {
    auto it = matrices_.find({slot, supplied_heads_ == 1 ? 0 : head});
    ATTNLAB_ASSERT(it != matrices_.end());
    return it->second;
  }
  if (share_ != Share::none) slot = 0;
  if (share_ == Share::layer) head = 0;
  auto [it, fresh] = matrices_.try_emplace({slot, head});
  if (fresh) {
    std::seed_seq seq{seed_ & 0xffffffffu, seed_ >> 32, std::uint64_t(slot), std::uint64_t(head)};
    it->second.rng.seed(seq);
  }
  if (it->second.columns < columns) draw_columns(it->second, columns);
  return it->second;
}

void LinformerAttention::set_projections(const xt::xarray<float>& e, const xt::xarray<float>& f) {
  const auto check = [&](const xt::xarray<float>& t, const char* name) {
    const auto& s = t.shape();
    const bool ok = (t.dimension() == 2 && s[0] == k_ && s[1] == max_len_) ||
                    (t.dimension() == 3 && s[0] >= 1 && s[1] == k_ && s[2] == max_len_);
    if (!ok)
      throw Error(std::string("linformer: ") + name + " has shape " + shape_of(t) +
                  ", expected [k, max_len] = [" + std::to_string(k_) + ", " +
                  std::to_string(max_len_) + "] or [H, " + std::to_string(k_) + ", " +
                  std::to_string(max_len_) + "]");
    if (!xt::all(xt::isfinite(t)))
      throw Error(std::string("linformer: ") + name + " has non-finite entries");
  };
  check(e, "E");
  check(f, "F");
  if (e.shape() != f.shape())
    throw Error("linformer: E has shape " + shape_of(e) + " but F has shape " + shape_of(f) +
                ": both must be shared or both per head");
  const std::size_t heads = e.dimension() == 2 ? 1 : e.shape()[0];
  std::lock_guard lock(mutex_);
  matrices_.clear();
  for (int slot = 0; slot < 2; ++slot) {
    const float* src = (slot == 0 ? e : f).data();
    for (std::size_t h = 0; h < heads; ++h) {
      Matrix& m = matrices_[{slot, h}];
      m.et.resize(max_len_ * k_);
      for (std::size_t r = 0; r < k_; ++r)
        for (std::size_t j = 0; j < max_len_; ++j)
          m.et[j * k_ + r] = src[(h * k_ + r) * max_len_ + j];
      m.columns = max_len_;
    }
  }
  init_ = Init::supplied;
  supplied_heads_ = heads;
}

xt::xtensor<float, 2> LinformerAttention::projection(char which, std::size_t head,
                                                     std::size_t columns) const {
  if (which != 'E' && which != 'F')
    throw Error(std::string("linformer: projection '") + which + "': expected 'E' or 'F'");
  if (columns > max_len_)
    throw Error("linformer: " + std::to_string(columns) + " columns requested, max_len = " +
                std::to_string(max_len_));
  if (init_ == Init::supplied && supplied_heads_ > 1 && head >= supplied_heads_)
    throw Error("linformer: head " + std::to_string(head) + " requested, the supplied E and F "
                "have " + std::to_string(supplied_heads_) + " heads");
  std::lock_guard lock(mutex_);
  const Matrix& m = matrix(which, head, columns);
  xt::xtensor<float, 2> out = xt::xtensor<float, 2>::from_shape({k_, columns});
  for (std::size_t r = 0; r < k_; ++r)
    for (std::size_t j = 0; j < columns; ++j) out(r, j) = m.et[j * k_ + r];
  return out;
}

void LinformerAttention::compute(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Mask& mask, const Dims& d, Tensor& out) const {
  if (d.nk > max_len_)
    throw Error("linformer: Nk = " + std::to_string(d.nk) + " exceeds max_len = " +
                std::to_string(max_len_) + " (E and F have max_len columns)");
  if (init_ == Init::supplied && supplied_heads_ > 1 && supplied_heads_ != d.heads)
    throw Error("linformer: the supplied E and F have " + std::to_string(supplied_heads_) +
                " heads, the input has " + std::to_string(d.heads));
  std::vector<std::size_t> lengths(d.batch, d.nk);  // padded keys and values count as zero
  if (mask.has_key_lengths())
    for (std::size_t b = 0; b < d.batch; ++b)
      lengths[b] = static_cast<std::size_t>(
          std::min<std::int64_t>(mask.key_lengths[b], static_cast<std::int64_t>(d.nk)));
  const std::size_t heads = d.batch * d.heads;
  // K' transposed ([Dk, k] per head: the layout OnlineSoftmax scores against) and V' [k, Dv].
  std::vector<float> kpt(heads * d.dk * k_, 0.0f), vp(heads * k_ * d.dv, 0.0f);
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  const std::size_t tiles = (d.nq + OnlineSoftmax::kRows - 1) / OnlineSoftmax::kRows;

  std::lock_guard lock(mutex_);  // the matrices may not grow (move) while we read them
  std::vector<const float*> e(d.heads), f(d.heads);
  for (std::size_t h = 0; h < d.heads; ++h) {
    e[h] = matrix('E', h, d.nk).et.data();
    f[h] = matrix('F', h, d.nk).et.data();
  }
  // One parallel region (our own tiles, no BLAS threads): first the projections, one task per
  // (item, head, K or V), then FlashAttention's online softmax over the k projected keys.
#pragma omp parallel
  {
    std::vector<float> chunk(std::max(d.dk, d.dv) * kChunk), product(d.dv * k_);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < static_cast<std::ptrdiff_t>(2 * heads); ++t) {
      const bool value = t % 2 != 0;
      const std::size_t bh = static_cast<std::size_t>(t) / 2, n = lengths[bh / d.heads];
      const std::size_t dim = value ? d.dv : d.dk;
      const float* x = (value ? v.data() : k.data()) + bh * d.nk * dim;
      const float* pt = value ? f[bh % d.heads] : e[bh % d.heads];
      float* kpt_h = kpt.data() + bh * d.dk * k_;
      project_transposed(x, n, dim, pt, k_, chunk.data(), value ? product.data() : kpt_h);
      if (!value || n == 0) continue;  // padded-out item: K', V' stay zero
      float* vp_h = vp.data() + bh * k_ * d.dv;
      for (std::size_t r = 0; r < k_; ++r)
        for (std::size_t c = 0; c < d.dv; ++c) vp_h[r * d.dv + c] = product[c * k_ + r];
    }
    OnlineSoftmax softmax(d.dk, d.dv);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < static_cast<std::ptrdiff_t>(heads * tiles); ++t) {
      const std::size_t bh = static_cast<std::size_t>(t) / tiles, b = bh / d.heads;
      const std::size_t i0 = (static_cast<std::size_t>(t) % tiles) * OnlineSoftmax::kRows;
      attend(softmax, &q(b, bh % d.heads, i0, 0), std::min(OnlineSoftmax::kRows, d.nq - i0),
             scale, kpt.data() + bh * d.dk * k_, vp.data() + bh * k_ * d.dv, k_, d.dv,
             &out(b, bh % d.heads, i0, 0));
    }
  }
}

std::unique_ptr<Attention> make_linformer(Params& params) {
  const std::int64_t k = params.integer("k", 256);
  const std::string share = params.choice("share", "none", {"none", "kv", "layer"});
  const std::string init =
      params.choice("init", "gaussian", {"gaussian", "xavier", "identity", "supplied"});
  const std::int64_t max_len = params.integer("max_len", 4096);
  const std::int64_t seed = params.integer("seed", 0);
  if (k < 1) params.fail("k", "must be at least 1");
  if (max_len < 1) params.fail("max_len", "must be at least 1");
  if (k > max_len)
    params.fail("k", "must not exceed max_len = " + std::to_string(max_len) +
                         " (E and F are k x max_len)");
  if (seed < 0) params.fail("seed", "must be >= 0");
  if (init == "supplied")
    params.fail("init", "learned matrices are not in the spec: give them with "
                        "LinformerAttention::set_projections or `attnlab run --E e.npy --F f.npy`");
  using S = LinformerAttention::Share;
  using I = LinformerAttention::Init;
  return std::make_unique<LinformerAttention>(
      static_cast<std::size_t>(k), share == "none" ? S::none : share == "kv" ? S::kv : S::layer,
      init == "gaussian" ? I::gaussian : init == "xavier" ? I::xavier : I::identity,
      static_cast<std::size_t>(max_len), static_cast<std::uint64_t>(seed));
}

namespace {
// Position 30 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("linformer", make_linformer, 30);
}  // namespace

}  // namespace attnlab
