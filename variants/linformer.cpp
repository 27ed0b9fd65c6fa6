#include "variants/linformer.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>

#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"
#include "variants/full.hpp"

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
  return i == I::gaussian   ? "gaussian"
         : i == I::xavier   ? "xavier"
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
void attend(OnlineSoftmax& softmax, const float* q, std::size_t rows, float scale, const float* kpt,
            const float* vp, std::size_t k, std::size_t dv, float* out, float* lse) {
  softmax.start(q, rows, scale);
  for (std::size_t c0 = 0; c0 < k; c0 += OnlineSoftmax::kCols) {
    const std::size_t cols = std::min(OnlineSoftmax::kCols, k - c0);
    softmax.scores(kpt + c0, k, cols);
    softmax.fold(vp + c0 * dv, dv, cols);
  }
  softmax.finish(out, dv, lse);
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
  s.backward = true;
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
    projected += static_cast<double>(mask.valid_keys(b, d.nk));
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
        case Init::gaussian:
          column[r] = normal(m.rng);
          break;
        case Init::xavier:
          column[r] = uniform(m.rng);
          break;
        default:
          column[r] = r == j ? 1.0f : 0.0f;
          break;
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
  if (share_ != Share::none && e != f)
    throw Error(std::string("linformer: share=") + share_name(share_) +
                " ties F to E: the F given differs from E");
  if (share_ == Share::layer && e.dimension() != 2)
    throw Error("linformer: share=layer has one matrix for every head: E has shape " + shape_of(e) +
                ", expected [k, max_len]");
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
    throw Error("linformer: " + std::to_string(columns) +
                " columns requested, max_len = " + std::to_string(max_len_));
  if (init_ == Init::supplied && supplied_heads_ > 1 && head >= supplied_heads_)
    throw Error("linformer: head " + std::to_string(head) +
                " requested, the supplied E and F "
                "have " +
                std::to_string(supplied_heads_) + " heads");
  std::lock_guard lock(mutex_);
  const Matrix& m = matrix(which, head, columns);
  xt::xtensor<float, 2> out = xt::xtensor<float, 2>::from_shape({k_, columns});
  for (std::size_t r = 0; r < k_; ++r)
    for (std::size_t j = 0; j < columns; ++j) out(r, j) = m.et[j * k_ + r];
  return out;
}

std::vector<ParameterTensor> LinformerAttention::parameters(std::size_t heads) const {
  if (heads == 0) throw Error("linformer: parameters for 0 heads");
  const std::size_t per_head = share_ == Share::layer ? 1 : heads;
  std::vector<ParameterTensor> out;
  for (const char which : share_ == Share::none ? std::string("EF") : std::string("E")) {
    ParameterTensor p{std::string(1, which), {k_, max_len_}, {}};
    if (share_ != Share::layer) p.shape.insert(p.shape.begin(), heads);
    for (std::size_t h = 0; h < per_head; ++h) {
      const xt::xtensor<float, 2> m = projection(which, h, max_len_);
      p.values.insert(p.values.end(), m.begin(), m.end());
    }
    out.push_back(std::move(p));
  }
  return out;
}

void LinformerAttention::set_parameters(const std::vector<ParameterTensor>& values) {
  const std::string expected = share_ == Share::none ? "E and F" : "E";
  const auto find = [&](const char* name) -> const ParameterTensor* {
    for (const ParameterTensor& p : values)
      if (p.name == name) return &p;
    return nullptr;
  };
  for (const ParameterTensor& p : values)
    if (p.name != "E" && (p.name != "F" || share_ != Share::none))
      throw Error("linformer (share=" + std::string(share_name(share_)) + "): no parameter '" +
                  p.name + "' (its parameters: " + expected + ")");
  const ParameterTensor* e = find("E");
  const ParameterTensor* f = share_ == Share::none ? find("F") : e;
  if (!e || !f)
    throw Error("linformer (share=" + std::string(share_name(share_)) + "): parameter " +
                (e ? "F" : "E") + " not given (its parameters: " + expected + ")");
  const auto array = [](const ParameterTensor& p) {
    if (std::accumulate(p.shape.begin(), p.shape.end(), std::size_t{1}, std::multiplies<>()) !=
        p.values.size())
      throw Error("linformer: parameter " + p.name + " has " + std::to_string(p.values.size()) +
                  " values for its shape");
    return xt::xarray<float>(xt::adapt(p.values, p.shape));
  };
  set_projections(array(*e), array(*f));
}

std::vector<std::size_t> LinformerAttention::check_call(const Mask& mask, const Dims& d) const {
  if (d.nk > max_len_)
    throw Error("linformer: Nk = " + std::to_string(d.nk) + " exceeds max_len = " +
                std::to_string(max_len_) + " (E and F have max_len columns)");
  if (init_ == Init::supplied && supplied_heads_ > 1 && supplied_heads_ != d.heads)
    throw Error("linformer: the supplied E and F have " + std::to_string(supplied_heads_) +
                " heads, the input has " + std::to_string(d.heads));
  std::vector<std::size_t> lengths(d.batch);  // padded keys and values count as zero
  for (std::size_t b = 0; b < d.batch; ++b) lengths[b] = mask.valid_keys(b, d.nk);
  return lengths;
}

LinformerAttention::Projections LinformerAttention::projections(const Dims& d) const {
  Projections p;
  for (std::size_t h = 0; h < d.heads; ++h) {
    p.e.push_back(matrix('E', h, d.nk).et.data());
    p.f.push_back(matrix('F', h, d.nk).et.data());
  }
  return p;
}

namespace {

// Projection task t of a parallel loop over 2·B·H tasks: K' of head t/2 (t even) into kpt
// ([Dk, k] per head: the layout OnlineSoftmax scores against) or V' (t odd) into vp ([k, Dv]).
// chunk and product are the calling thread's scratch (kChunk·max(Dk, Dv) and Dv·k floats).
void project_task(std::size_t t, TensorRef k, TensorRef v, const Dims& d,
                  const std::vector<std::size_t>& lengths, const std::vector<const float*>& e,
                  const std::vector<const float*>& f, std::size_t rows, float* kpt, float* vp,
                  float* chunk, float* product) {
  const bool value = t % 2 != 0;
  const std::size_t bh = t / 2, n = lengths[bh / d.heads];
  const std::size_t dim = value ? d.dv : d.dk;
  const float* x = (value ? v.data() : k.data()) + bh * d.nk * dim;
  const float* pt = value ? f[bh % d.heads] : e[bh % d.heads];
  project_transposed(x, n, dim, pt, rows, chunk, value ? product : kpt + bh * d.dk * rows);
  if (!value || n == 0) return;  // padded-out item: K', V' stay zero
  float* vp_h = vp + bh * rows * d.dv;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < d.dv; ++c) vp_h[r * d.dv + c] = product[c * rows + r];
}

}  // namespace

void LinformerAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                 const TokenInputs&, const Dims& d, Tensor& out,
                                 Saved* saved) const {
  run(q, k, v, mask, d, out, saved_lse(saved, d));
}

void LinformerAttention::run(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const Dims& d,
                             Tensor& out, float* lse) const {
  const std::vector<std::size_t> lengths = check_call(mask, d);
  const std::size_t heads = d.batch * d.heads;
  std::vector<float> kpt(heads * d.dk * k_, 0.0f), vp(heads * k_ * d.dv, 0.0f);
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  const std::size_t tiles = (d.nq + OnlineSoftmax::kRows - 1) / OnlineSoftmax::kRows;

  std::lock_guard lock(mutex_);  // the matrices may not grow (move) while we read them
  const Projections p = projections(d);
  // One parallel region (our own tiles, no BLAS threads): first the projections, one task per
  // (item, head, K or V), then FlashAttention's online softmax over the k projected keys.
#pragma omp parallel
  {
    std::vector<float> chunk(std::max(d.dk, d.dv) * kChunk), product(d.dv * k_);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < static_cast<std::ptrdiff_t>(2 * heads); ++t)
      project_task(static_cast<std::size_t>(t), k, v, d, lengths, p.e, p.f, k_, kpt.data(),
                   vp.data(), chunk.data(), product.data());
    OnlineSoftmax softmax(d.dk, d.dv);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < static_cast<std::ptrdiff_t>(heads * tiles); ++t) {
      const std::size_t bh = static_cast<std::size_t>(t) / tiles, b = bh / d.heads;
      const std::size_t i0 = (static_cast<std::size_t>(t) % tiles) * OnlineSoftmax::kRows;
      attend(softmax, &q(b, bh % d.heads, i0, 0), std::min(OnlineSoftmax::kRows, d.nq - i0), scale,
             kpt.data() + bh * d.dk * k_, vp.data() + bh * k_ * d.dv, k_, d.dv,
             &out(b, bh % d.heads, i0, 0), lse ? lse + bh * d.nq + i0 : nullptr);
    }
  }
}

void LinformerAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                          const TokenInputs& in, const Dims& d, TensorRef out,
                                          TensorRef d_out, const Saved& saved,
                                          AllGradients& g) const {
  RowLogSumExp storage;
  const RowLogSumExp& lse = lse_or_recompute(q, k, v, mask, in, d, saved, storage);
  ProjectionGradients projections;
  backward_impl(q, k, v, mask, d, out, d_out, lse, g.qkv, projections);
  // The distinct matrices of `share`, each gradient summed over the matrix's uses.
  const auto reported = [&](const char* name, const auto& grad) {
    g.parameters.push_back(
        {name, {grad.shape().begin(), grad.shape().end()}, {grad.begin(), grad.end()}});
  };
  if (share_ == Share::none) {
    reported("E", projections.d_e);
    reported("F", projections.d_f);
  } else if (share_ == Share::kv) {
    reported("E", xt::xtensor<float, 3>(projections.d_e + projections.d_f));
  } else {
    reported("E", xt::xtensor<float, 2>(xt::sum(projections.d_e + projections.d_f, {0})));
  }
}

void LinformerAttention::backward_impl(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                       const Dims& d, TensorRef out, TensorRef d_out,
                                       const RowLogSumExp& lse, Gradients& g,
                                       ProjectionGradients& grads) const {
  const std::vector<std::size_t> lengths = check_call(mask, d);
  const std::size_t heads = d.batch * d.heads, rows = k_;
  std::lock_guard lock(mutex_);  // the matrices may not grow (move) while we read them
  const Projections p = projections(d);
  // Recompute K' and V' (cheaper than keeping them: O(N·k·D) against the attention's
  // O(Nq·k·D)), as [B, H, k, D] tensors: full attention's backward does the rest.
  std::vector<float> kpt(heads * d.dk * rows, 0.0f);
  Tensor kp = Tensor::from_shape({d.batch, d.heads, rows, d.dk});
  Tensor vp = xt::zeros<float>({d.batch, d.heads, rows, d.dv});
#pragma omp parallel
  {
    std::vector<float> chunk(std::max(d.dk, d.dv) * kChunk), product(d.dv * rows);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < static_cast<std::ptrdiff_t>(2 * heads); ++t)
      project_task(static_cast<std::size_t>(t), k, v, d, lengths, p.e, p.f, rows, kpt.data(),
                   vp.data(), chunk.data(), product.data());
#pragma omp for schedule(static)
    for (std::ptrdiff_t bh = 0; bh < static_cast<std::ptrdiff_t>(heads); ++bh)
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < d.dk; ++c)
          kp.data()[(bh * rows + r) * d.dk + c] = kpt[(bh * d.dk + c) * rows + r];
  }
  // softmax(Q K'^T · scale) V' is full attention without a mask (padding acted before the
  // projection), and its row log-sum-exp is the one this forward saved.
  Mask unmasked;
  unmasked.scale = mask.softmax_scale(d.dk);
  Saved saved;
  saved.lse = lse;  // B·H·Nq floats: a copy costs nothing next to the backward
  AllGradients all;
  all.qkv.dq = std::move(g.dq);
  FullAttention().backward(q, kp, vp, unmasked, {}, out, d_out, saved, all);
  const Gradients& projected = all.qkv;
  g.dq = std::move(all.qkv.dq);
  // dK = E^T dK', dV = F^T dV' on the unpadded rows (padded keys and values got no weight).
#pragma omp parallel for schedule(dynamic, 1)
  for (std::ptrdiff_t t = 0; t < static_cast<std::ptrdiff_t>(2 * heads); ++t) {
    const bool value = t % 2 != 0;
    const std::size_t bh = static_cast<std::size_t>(t) / 2, n = lengths[bh / d.heads];
    const std::size_t dim = value ? d.dv : d.dk;
    float* dx = (value ? g.dv.data() : g.dk.data()) + bh * d.nk * dim;
    std::fill(dx, dx + d.nk * dim, 0.0f);
    const float* pt = value ? p.f[bh % d.heads] : p.e[bh % d.heads];
    const float* dxp = (value ? projected.dv.data() : projected.dk.data()) + bh * rows * dim;
    if (n > 0) kernels::gemm_tile(n, dim, rows, pt, rows, dxp, dim, dx, dim, false);
  }
  projection_gradients(k, v, d, lengths, projected, grads);
}

void LinformerAttention::projection_gradients(TensorRef k, TensorRef v, const Dims& d,
                                              const std::vector<std::size_t>& lengths,
                                              const Gradients& projected,
                                              ProjectionGradients& grads) const {
  const std::size_t rows = k_;
  grads.d_e = xt::zeros<float>({d.heads, rows, max_len_});
  grads.d_f = xt::zeros<float>({d.heads, rows, max_len_});
  // dE_h = sum over items of dK'_(b,h) K_(b,h)^T, computed transposed ([n, k] = K dK'^T) with
  // gemm_tile; likewise dF from dV' and V. One task per (head, E or F): no two write alike.
#pragma omp parallel
  {
    std::vector<float> dxpt(std::max(d.dk, d.dv) * rows), sum(d.nk * rows);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < static_cast<std::ptrdiff_t>(2 * d.heads); ++t) {
      const bool value = t % 2 != 0;
      const std::size_t h = static_cast<std::size_t>(t) / 2, dim = value ? d.dv : d.dk;
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (std::size_t b = 0; b < d.batch; ++b) {
        const std::size_t bh = b * d.heads + h, n = lengths[b];
        const float* dxp = (value ? projected.dv.data() : projected.dk.data()) + bh * rows * dim;
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t c = 0; c < dim; ++c) dxpt[c * rows + r] = dxp[r * dim + c];
        const float* x = (value ? v.data() : k.data()) + bh * d.nk * dim;
        if (n > 0)
          kernels::gemm_tile(n, rows, dim, x, dim, dxpt.data(), rows, sum.data(), rows, true);
      }
      auto& grad = value ? grads.d_f : grads.d_e;
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t j = 0; j < d.nk; ++j) grad(h, r, j) = sum[j * rows + r];
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
    params.fail(
        "k", "must not exceed max_len = " + std::to_string(max_len) + " (E and F are k x max_len)");
  if (seed < 0) params.fail("seed", "must be >= 0");
  if (init == "supplied")
    params.fail("init",
                "learned matrices are not in the spec: give them with "
                "LinformerAttention::set_projections or `attnlab run --E e.npy --F f.npy`");
  using S = LinformerAttention::Share;
  using I = LinformerAttention::Init;
  return std::make_unique<LinformerAttention>(static_cast<std::size_t>(k),
                                              share == "none" ? S::none
                                              : share == "kv" ? S::kv
                                                              : S::layer,
                                              init == "gaussian" ? I::gaussian
                                              : init == "xavier" ? I::xavier
                                                                 : I::identity,
                                              static_cast<std::size_t>(max_len),
                                              static_cast<std::uint64_t>(seed));
}

namespace {
// Position 30 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("linformer", make_linformer, 30);
}  // namespace

}  // namespace attnlab
