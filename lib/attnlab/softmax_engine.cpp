#include "attnlab/softmax_engine.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>

#include "attnlab/error.hpp"
#include "attnlab/kernels_table.hpp"

namespace attnlab::engine {
namespace {

using Index = std::int64_t;
using kernels::OnlineSoftmax;
using kernels::SoftmaxBackward;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr Index kNever = std::numeric_limits<Index>::max();

std::size_t round_up(std::size_t n, std::size_t m) {
  return (n + m - 1) / m * m;
}

// The number of keys first + step·t (t >= 0) below j: the first t at or past key j.
Index keys_below(Index j, Index first, Index step) {
  return j <= first ? 0 : (j - first + step - 1) / step;
}

// Everything a call shares among its tiles: the inputs, the key layout and the modifiers in the
// form the kernels take them (log2 units).
struct Problem {
  TensorRef q, k, v;
  const Mask& mask;
  const TokenInputs& in;
  const Dims& d;
  const Sparsity& sparsity;
  KeyLayout layout;
  float scale;              // the softmax scale (natural units)
  float cap2 = 0.0f;        // softcap in log2 units; 0: none
  std::vector<double> fox;  // F per (b, h) over key positions [B·H·Nk]; empty: none
  std::array<std::size_t, 4> bias_stride{};  // element strides of bias, 0 on broadcast axes

  Problem(TensorRef q_, TensorRef k_, TensorRef v_, const Mask& m, const TokenInputs& in_,
          const Dims& d_, const Sparsity& s)
      : q(q_),
        k(k_),
        v(v_),
        mask(m),
        in(in_),
        d(d_),
        sparsity(s),
        layout(s.layout(d_, m)),
        scale(static_cast<float>(m.softmax_scale(d_.dk))) {
    if (m.softcap) cap2 = static_cast<float>(*m.softcap) * kLog2e;
    if (in.log_decay) {  // F_t = g_0 + ... + g_t over the unpadded keys, in float64
      fox.assign(d.batch * d.heads * d.nk, 0.0);
      for (std::size_t b = 0; b < d.batch; ++b)
        for (std::size_t h = 0; h < d.heads; ++h) {
          double* f = fox.data() + (b * d.heads + h) * d.nk;
          const std::size_t valid = m.valid_keys(b, d.nk);
          double sum = 0;
          for (std::size_t t = 0; t < d.nk; ++t) {
            if (t < valid) sum += (*in.log_decay)(b, h, t);
            f[t] = sum;
          }
        }
    }
    if (in.bias) {
      const auto& s = in.bias->shape();
      std::size_t stride = 1;
      for (std::size_t a = 4; a-- > 0;) {
        bias_stride[a] = s[a] == 1 ? 0 : stride;
        stride *= s[a];
      }
    }
  }

  bool has_mods() const { return cap2 > 0 || !fox.empty() || in.alibi_slopes || in.bias; }
  const float* kv_rows(TensorRef t, std::size_t b, std::size_t h, std::size_t dim) const {
    return t.data() + (b * d.kv() + d.kv_head(h)) * d.nk * dim;
  }
  // F of (b, h) at key position p, clamped into the keys.
  double fox_at(std::size_t b, std::size_t h, Index p) const {
    const Index last = static_cast<Index>(d.nk) - 1;
    return fox[(b * d.heads + h) * d.nk + static_cast<std::size_t>(std::clamp<Index>(p, 0, last))];
  }
};

// The rows of one query tile of (b, h), with what each needs from the mask and the modifiers.
struct Rows {
  std::size_t b = 0, h = 0, n = 0;
  QueryTile tile;
  std::size_t i[kMaxRows];
  KeySpan span[kMaxRows];
  Index p[kMaxRows];
  float pos[kMaxRows];  // p as a float (ALiBi)
  const bool* allowed[kMaxRows];
  const float* bias[kMaxRows];  // bias row of the query (key 0), or null

  void set(const Problem& pr, std::size_t b_, std::size_t h_, const QueryTile& t) {
    b = b_, h = h_, n = t.rows, tile = t;
    for (std::size_t r = 0; r < n; ++r) {
      i[r] = t.first + t.step * r;
      span[r] = pr.mask.key_span(b, i[r], pr.d);
      p[r] = pr.mask.position(i[r], pr.d);
      pos[r] = static_cast<float>(p[r]);
      allowed[r] = pr.mask.allowed_row(b, h, i[r]);
      if (pr.in.bias) {
        const auto& st = pr.bias_stride;
        bias[r] = pr.in.bias->data() + b * st[0] + h * st[1] + i[r] * st[2];
      }
    }
  }
};

// Per-thread scratch of the tile loop: each row's range in the run being visited and, for the
// chunk being computed, the modifiers and row ranges in the kernels' form.
struct Scratch {
  Index a[kMaxRows], z[kMaxRows];  // row r reads run keys t in [a[r], z[r])
  float row_add[kMaxRows], col_add[kCols];
  float col_lo[kMaxRows], col_hi[kMaxRows];  // row r's visible columns of the chunk
  const float* bias_rows[kMaxRows];
  float* grad_bias_rows[kMaxRows];
  kernels::detail::ScoreMods mods;
};

// What one chunk of a run is, read off the rows' ranges, the boolean mask and the custom mask.
TileClass classify(const Problem& pr, const Rows& rows, const Scratch& sc, Index max_a, Index min_z,
                   Index c0, Index cols, Index j0, Index j_last) {
  bool full = max_a <= c0 && min_z >= c0 + cols;
  if (!full) {
    bool any = false;
    for (std::size_t r = 0; r < rows.n && !any; ++r) any = sc.a[r] < c0 + cols && sc.z[r] > c0;
    if (!any) return TileClass::empty;
  }
  if (pr.mask.has_allowed()) full = false;
  if (pr.mask.custom) {
    if (!pr.mask.custom->classify) return TileClass::partial;
    const TileClass declared = pr.mask.custom->classify(
        rows.b, rows.h, rows.i[0], rows.i[rows.n - 1] + 1, static_cast<std::size_t>(j0),
        static_cast<std::size_t>(j_last) + 1);
    if (declared == TileClass::empty) return TileClass::empty;
    if (declared == TileClass::partial) full = false;
  }
  return full ? TileClass::full : TileClass::partial;
}

// The modifiers of a chunk of `cols` keys j0 + step·c into sc.mods, and for a partial chunk each
// row's range there: the kernels apply both in the pass that reads every score.
const kernels::detail::ScoreMods* chunk_mods(const Problem& pr, const Rows& rows, Scratch& sc,
                                             Index c0, Index cols, Index j0, Index step,
                                             bool partial) {
  if (!pr.has_mods() && !partial) return nullptr;
  kernels::detail::ScoreMods& m = sc.mods;
  m = {};
  m.cap = pr.cap2;
  if (!pr.fox.empty()) {  // F_p - F_j as (F_p - F_j0) + (F_j0 - F_j): small numbers in float
    const double base = pr.fox_at(rows.b, rows.h, j0);
    for (std::size_t r = 0; r < rows.n; ++r)
      sc.row_add[r] = static_cast<float>((pr.fox_at(rows.b, rows.h, rows.p[r]) - base) * kLog2e);
    for (Index c = 0; c < cols; ++c)
      sc.col_add[c] =
          static_cast<float>((base - pr.fox_at(rows.b, rows.h, j0 + step * c)) * kLog2e);
    m.row_add = sc.row_add;
    m.col_add = sc.col_add;
  }
  if (pr.in.alibi_slopes) {
    m.slope = (*pr.in.alibi_slopes)[rows.h] * kLog2e;
    m.row_pos = rows.pos;
    m.col_pos = static_cast<float>(j0);
    m.col_step = static_cast<float>(step);
  }
  if (pr.in.bias) {
    for (std::size_t r = 0; r < rows.n; ++r)
      sc.bias_rows[r] = rows.bias[r] + static_cast<std::size_t>(j0) * pr.bias_stride[3];
    m.bias_rows = sc.bias_rows;
    m.bias_step = static_cast<std::size_t>(step) * pr.bias_stride[3];
    m.bias_scale = kLog2e;
  }
  if (partial) {
    for (std::size_t r = 0; r < rows.n; ++r) {
      const Index a = std::clamp<Index>(sc.a[r] - c0, 0, cols);
      sc.col_lo[r] = static_cast<float>(a);
      sc.col_hi[r] = static_cast<float>(std::clamp<Index>(sc.z[r] - c0, a, cols));
    }
    m.col_lo = sc.col_lo;
    m.col_hi = sc.col_hi;
  }
  return &m;
}

// Masks the keys of a partial score tile that the boolean or custom mask forbids, inside each
// row's range (the range itself is applied with the modifiers).
void mask_elements(const Problem& pr, const Rows& rows, const Scratch& sc, float* s, Index c0,
                   Index cols, Index first, Index step) {
  if (!pr.mask.has_allowed() && !pr.mask.custom) return;
  for (std::size_t r = 0; r < rows.n; ++r) {
    float* row = s + r * kCols;
    const Index a = std::clamp<Index>(sc.a[r] - c0, 0, cols);
    const Index z = std::clamp<Index>(sc.z[r] - c0, a, cols);
    if (const bool* allowed = rows.allowed[r])
      for (Index t = a; t < z; ++t)
        if (!allowed[first + step * (c0 + t)]) row[t] = kNegInf;
    if (pr.mask.custom)
      for (Index t = a; t < z; ++t)
        if (row[t] != kNegInf &&
            !pr.mask.custom->allows(rows.b, rows.h, rows.i[r],
                                    static_cast<std::size_t>(first + step * (c0 + t))))
          row[t] = kNegInf;
  }
}

// Every chunk of the runs of one query tile that is not empty: engine.scores on this head's key
// tiles kt, the boolean and custom masks where partial, then consume(chunk), which hands
// chunk.mods (the modifiers and, where partial, the row ranges) to the kernel's pass over the
// scores. Shared by the forward and the backward so that both see exactly the same scores.
struct Chunk {
  Index c0, cols;      // run keys [c0, c0 + cols)
  Index j0, step;      // keys j0 + step·c
  std::size_t column;  // the layout column of run key c0
  float* scores;
  const kernels::detail::ScoreMods* mods;  // null: none, and no range to apply
};

// Every chunk of the runs that some row of the tile reaches, with its class: the one
// classification, which the forward and backward compute by and tile_classes() reports.
// visit(c0, cols, j0, step, column, cls) for each, empty ones included.
template <class Visit>
void for_each_class(const Problem& pr, const Rows& rows, const std::vector<KeyRun>& runs,
                    Scratch& sc, Visit visit) {
  const KeyLayout& layout = pr.layout;
  for (const KeyRun& run : runs) {
    const auto first = static_cast<Index>(layout.first(run.cls));
    const auto step = static_cast<Index>(layout.step(run.cls));
    Index lo = kNever, hi = 0, max_a = 0, min_z = kNever;
    for (std::size_t r = 0; r < rows.n; ++r) {
      Index a = std::max(run.t0, keys_below(rows.span[r].lo, first, step));
      Index z = std::min(run.t1, keys_below(rows.span[r].hi, first, step));
      if (run.limited) a = std::max(a, run.lo[r]), z = std::min(z, run.hi[r]);
      if (a >= z) a = kNever, z = 0;  // sees nothing here: never full
      sc.a[r] = a, sc.z[r] = z;
      max_a = std::max(max_a, a), min_z = std::min(min_z, z);
      if (a < z) lo = std::min(lo, a), hi = std::max(hi, z);
    }
    const std::size_t base = layout.base(run.cls);
    for (Index c0 = lo, cols = 0; c0 < hi; c0 += cols) {
      const std::size_t column = base + static_cast<std::size_t>(c0);
      cols = std::min<Index>(static_cast<Index>(kCols - column % kCols), hi - c0);
      const Index j0 = first + step * c0;
      visit(c0, cols, j0, step, column,
            classify(pr, rows, sc, max_a, min_z, c0, cols, j0, j0 + step * (cols - 1)));
    }
  }
}

template <class Engine, class Consume>
void for_each_chunk(const Problem& pr, const Rows& rows, const std::vector<KeyRun>& runs,
                    const float* kt, Scratch& sc, Engine& engine, Consume consume) {
  for_each_class(
      pr, rows, runs, sc,
      [&](Index c0, Index cols, Index j0, Index step, std::size_t column, TileClass cls) {
        if (cls == TileClass::empty) return;
        float* s = engine.scores(kt + column / kCols * pr.d.dk * kCols + column % kCols, kCols,
                                 static_cast<std::size_t>(cols));
        const bool partial = cls == TileClass::partial;
        if (partial)  // the run's first key: j0 - step·c0
          mask_elements(pr, rows, sc, s, c0, cols, j0 - step * c0, step);
        consume(Chunk{c0, cols, j0, step, column, s,
                      chunk_mods(pr, rows, sc, c0, cols, j0, step, partial)});
      });
}

// Scratch floats kept by the calling thread from call to call, grown when a call needs more:
// fresh pages for the key layouts (32 MiB at B = 1, H = 8, N = 16384) cost a sliding window's
// forward 6% of its time, a cost that does not shrink with the mask.
class KeptScratch {
 public:
  float* get(std::size_t n) {
    if (n > size_) data_ = kernels::scratch_floats(n), size_ = n;
    return data_.get();
  }

 private:
  std::unique_ptr<float[], void (*)(void*)> data_{nullptr, std::free};
  std::size_t size_ = 0;
};

// A sink's logit for head h (natural log), or -infinity.
float sink_of(const TokenInputs& in, std::size_t h) {
  return in.sinks ? (*in.sinks)[h] : kNegInf;
}

}  // namespace

KeyLayout::KeyLayout(std::size_t nk, std::size_t stride, std::size_t lead)
    : stride_(std::max<std::size_t>(stride, 1)), lead_(std::min(lead, nk)) {
  std::size_t column = round_up(lead_, kCols);
  count_.resize(stride_);
  base_.resize(stride_);
  for (std::size_t rho = 0; rho < stride_; ++rho) {
    count_[rho] = nk > rho ? (nk - 1 - rho) / stride_ + 1 : 0;
    base_[rho] = column;
    column += round_up(count_[rho], kCols);
  }
  columns_ = column;
}

void KeyLayout::lay_out(const float* src, std::size_t dim, float* dst) const {
  const auto block = [&](std::size_t first, std::size_t step, std::size_t count, std::size_t base) {
    for (std::size_t t = 0; t < count; t += kCols)
      kernels::transpose(std::min(kCols, count - t), dim, src + (first + step * t) * dim,
                         step * dim, dst + (base + t) / kCols * dim * kCols, kCols);
  };
  block(0, 1, lead_, 0);
  for (std::size_t rho = 0; rho < stride_; ++rho) block(rho, stride_, count_[rho], base_[rho]);
}

KeyLayout Sparsity::layout(const Dims& d, const Mask&) const {
  return KeyLayout(d.nk);
}

std::vector<QueryTile> Sparsity::tiles(const Dims& d, const Mask&, std::size_t max_rows) const {
  // Last rows first: under a causal mask they read the most keys.
  std::vector<QueryTile> tiles;
  for (std::size_t i0 = (d.nq - 1) / max_rows * max_rows;; i0 -= max_rows) {
    tiles.push_back({i0, 1, std::min(max_rows, d.nq - i0)});
    if (i0 == 0) break;
  }
  return tiles;
}

void Sparsity::runs(const KeyLayout& layout, std::size_t, std::size_t, const QueryTile&,
                    std::vector<KeyRun>& runs) const {
  KeyRun& all = runs.emplace_back();
  all.cls = 0;
  all.t0 = 0;
  all.t1 = static_cast<Index>(layout.count(0));
}

void check(const Mask& mask, const TokenInputs& in, const Dims&) {
  if (in.log_decay && mask.causal == Causal::none)
    throw Error(
        "log_decay: the forgetting gate (FoX) of softmax attention needs a causal mask "
        "(causal = top-left or bottom-right): it decays scores over j < t <= i");
}

std::vector<TileVisit> tile_classes(const Mask& mask, const Dims& d, const Sparsity& sparsity,
                                    std::size_t b, std::size_t h) {
  mask.validate(d);
  const Tensor none;
  const TokenInputs in;
  const Problem pr(none, none, none, mask, in, d, sparsity);
  std::vector<TileVisit> visits;
  Rows rows;
  Scratch sc;
  std::vector<KeyRun> runs;
  for (const QueryTile& tile : sparsity.tiles(d, mask, OnlineSoftmax::kRows)) {
    rows.set(pr, b, h, tile);
    runs.clear();
    sparsity.runs(pr.layout, b, h, tile, runs);
    for_each_class(pr, rows, runs, sc,
                   [&](Index, Index cols, Index j0, Index step, std::size_t, TileClass cls) {
                     visits.push_back({tile, j0, step, cols, cls});
                   });
  }
  return visits;
}

double visible_pairs(const Mask& mask, const Dims& d) {
  double pairs = 0;
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t i = 0; i < d.nq; ++i) {
      const KeySpan s = mask.key_span(b, i, d);
      pairs += static_cast<double>(std::max<Index>(s.hi - s.lo, 0));
    }
  return pairs * static_cast<double>(d.heads);
}

void forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
             const Dims& d, const Sparsity& sparsity, Tensor& out, float* lse) {
  check(mask, in, d);
  const Problem pr(q, k, v, mask, in, d, sparsity);
  const std::vector<QueryTile> tiles = sparsity.tiles(d, mask, OnlineSoftmax::kRows);
  const std::size_t per_head = pr.layout.columns() * d.dk;
  // Every KV head's key tiles, left uninitialised (the padding columns are never read).
  static thread_local KeptScratch kept;
  float* const kt = kept.get(d.batch * d.kv() * per_head);
  const auto tasks = static_cast<std::ptrdiff_t>(d.batch * d.heads * tiles.size());
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (std::ptrdiff_t bk = 0; bk < static_cast<std::ptrdiff_t>(d.batch * d.kv()); ++bk)
      pr.layout.lay_out(k.data() + static_cast<std::size_t>(bk) * d.nk * d.dk, d.dk,
                        kt + static_cast<std::size_t>(bk) * per_head);
    OnlineSoftmax softmax(d.dk, d.dv);
    Rows rows;
    Scratch sc;
    std::vector<KeyRun> runs;
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < tasks; ++t) {
      const std::size_t bh = static_cast<std::size_t>(t) / tiles.size();
      const QueryTile& tile = tiles[static_cast<std::size_t>(t) % tiles.size()];
      const std::size_t b = bh / d.heads, h = bh % d.heads;
      rows.set(pr, b, h, tile);
      softmax.start(&q(b, h, tile.first, 0), tile.step * d.dk, tile.rows, pr.scale, sink_of(in, h));
      runs.clear();
      sparsity.runs(pr.layout, b, h, tile, runs);
      const float* keys = kt + (b * d.kv() + d.kv_head(h)) * per_head;
      const float* values = pr.kv_rows(v, b, h, d.dv);
      for_each_chunk(pr, rows, runs, keys, sc, softmax, [&](const Chunk& c) {
        softmax.fold(values + static_cast<std::size_t>(c.j0) * d.dv,
                     static_cast<std::size_t>(c.step) * d.dv, static_cast<std::size_t>(c.cols),
                     c.mods);
      });
      softmax.finish(&out(b, h, tile.first, 0), tile.step * d.dv,
                     lse ? lse + bh * d.nq + tile.first : nullptr, tile.step);
    }
  }
}

namespace {

// Sums of a tensor over the axes where `shape` is 1: dense [B, H, Nq, Nk] into `into` (shape).
void sum_broadcast(const std::vector<float>& dense, const Dims& d, Tensor& into) {
  std::fill(into.begin(), into.end(), 0.0f);
  const auto& s = into.shape();
  std::size_t at = 0;
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t i = 0; i < d.nq; ++i)
        for (std::size_t j = 0; j < d.nk; ++j)
          into(s[0] == 1 ? 0 : b, s[1] == 1 ? 0 : h, s[2] == 1 ? 0 : i, s[3] == 1 ? 0 : j) +=
              dense[at++];
}

}  // namespace

void backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
              const Dims& d, const Sparsity& sparsity, TensorRef out, TensorRef d_out,
              const RowLogSumExp& lse, AllGradients& g) {
  check(mask, in, d);
  const Problem pr(q, k, v, mask, in, d, sparsity);
  const std::vector<QueryTile> tiles = sparsity.tiles(d, mask, SoftmaxBackward::kRows);
  const std::size_t group = d.heads / d.kv();       // query heads per KV head
  const std::size_t per_kv = group * tiles.size();  // the query tiles of one KV head
  const std::size_t kv_heads = d.batch * d.kv();
  const std::size_t kd = d.nk * d.dk, vd = d.nk * d.dv;
  const bool fox = in.log_decay.has_value();
  const std::size_t fd = fox ? group * d.nk : 0;  // a KV head's forgetting-gate column sums
  // The split depends on the shape alone, never on the thread count, and the partial sums are
  // added in group order: the gradients are bitwise the same with any number of threads.
  constexpr std::size_t kTasks = 16;  // enough tasks to keep 16 threads busy
  const std::size_t groups =
      kv_heads >= kTasks ? 1
                         : std::clamp<std::size_t>((kTasks + kv_heads - 1) / kv_heads, 1, per_kv);
  Tensor& dk = g.qkv.dk;
  Tensor& dv = g.qkv.dv;
  std::fill(dk.begin(), dk.end(), 0.0f);
  std::fill(dv.begin(), dv.end(), 0.0f);
  // Kept from call to call (assign reuses the storage): fresh pages for the partial sums (64 MiB
  // at B = 1, H = 8, N = 16384) cost a sliding window's backward a fifth of its time.
  static thread_local std::vector<float> partial_sums;
  const std::size_t stride = kd + vd + fd;
  partial_sums.assign((groups - 1) * kv_heads * stride, 0.0f);
  float* const partial = partial_sums.data();
  // Per row: the forgetting gate's row sums, ALiBi's distance-weighted sums, the sink's share.
  std::vector<float> fox_rows(fox ? d.batch * d.heads * d.nq : 0, 0.0f);
  std::vector<float> fox_cols(fox ? d.batch * d.heads * d.nk : 0, 0.0f);
  std::vector<float> alibi_rows(in.alibi_slopes ? d.batch * d.heads * d.nq : 0, 0.0f);
  std::vector<float> sink_rows(in.sinks ? d.batch * d.heads * d.nq : 0, 0.0f);
  // dS of every pair when a bias is given: into d_bias itself when it has every axis, else into
  // a dense buffer summed over the broadcast axes afterwards.
  const bool dense_bias = in.bias && in.bias->size() != d.batch * d.heads * d.nq * d.nk;
  std::vector<float> bias_grad(dense_bias ? d.batch * d.heads * d.nq * d.nk : 0, 0.0f);
  if (in.bias) std::fill(g.d_bias.begin(), g.d_bias.end(), 0.0f);
  float* const bias_out = in.bias ? (dense_bias ? bias_grad.data() : g.d_bias.data()) : nullptr;
  const auto tasks = static_cast<std::ptrdiff_t>(kv_heads * groups);
  // Every KV head's key and value tiles, laid out once for all its tasks (not once per task:
  // with B x Hkv = 1 all 16 tasks read the same head), uninitialised as the forward's.
  const std::size_t kt_head = pr.layout.columns() * d.dk, vt_head = pr.layout.columns() * d.dv;
  static thread_local KeptScratch kept;
  float* const kt_all = kept.get(kv_heads * (kt_head + vt_head));
  float* const vt_all = kt_all + kv_heads * kt_head;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (std::ptrdiff_t bk = 0; bk < static_cast<std::ptrdiff_t>(kv_heads); ++bk) {
      const auto head = static_cast<std::size_t>(bk);
      pr.layout.lay_out(k.data() + head * kd, d.dk, kt_all + head * kt_head);
      pr.layout.lay_out(v.data() + head * vd, d.dv, vt_all + head * vt_head);
    }
    SoftmaxBackward grad(d.dk, d.dv);
    Rows rows;
    Scratch sc;
    std::vector<KeyRun> runs;
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t task = 0; task < tasks; ++task) {
      const std::size_t bk = static_cast<std::size_t>(task) / groups;
      const std::size_t part = static_cast<std::size_t>(task) % groups;
      const std::size_t b = bk / d.kv(), kvh = bk % d.kv();
      const float* const kt = kt_all + bk * kt_head;
      const float* const vt = vt_all + bk * vt_head;
      float* dkh =
          part == 0 ? dk.data() + bk * kd : partial + ((part - 1) * kv_heads + bk) * stride;
      float* dvh = part == 0 ? dv.data() + bk * vd : dkh + kd;
      float* fch = part == 0
                       ? (fox ? fox_cols.data() + (b * d.heads + kvh * group) * d.nk : nullptr)
                       : dkh + kd + vd;
      for (std::size_t u = part; u < per_kv; u += groups) {
        const std::size_t h = kvh * group + u / tiles.size();
        const QueryTile& tile = tiles[u % tiles.size()];
        const std::size_t row0 = (b * d.heads + h) * d.nq;
        rows.set(pr, b, h, tile);
        grad.start(&q(b, h, tile.first, 0), tile.step * d.dk, &out(b, h, tile.first, 0),
                   &d_out(b, h, tile.first, 0), tile.step * d.dv, lse.data() + row0 + tile.first,
                   tile.step, tile.rows, pr.scale);
        float row_sums[kMaxRows] = {}, alibi_sums[kMaxRows] = {};
        runs.clear();
        sparsity.runs(pr.layout, b, h, tile, runs);
        const float* keys = k.data() + bk * kd;
        const bool take_grads = bias_out || fox || in.alibi_slopes;
        for_each_chunk(pr, rows, runs, kt, sc, grad, [&](const Chunk& c) {
          kernels::detail::ScoreModsGrad m{};
          if (take_grads) {
            m.unit = kLog2e;  // ds is dS · ln 2
            if (bias_out) {
              for (std::size_t r = 0; r < rows.n; ++r)
                sc.grad_bias_rows[r] = bias_out + (row0 + rows.i[r]) * d.nk + c.j0;
              m.bias_rows = sc.grad_bias_rows;
              m.bias_step = static_cast<std::size_t>(c.step);
            }
            if (fox) {
              m.row_sums = row_sums;
              m.col_sums = fch + (h - kvh * group) * d.nk + c.j0;
              m.col_sums_step = static_cast<std::size_t>(c.step);
            }
            if (in.alibi_slopes) m.alibi_rows = alibi_sums;
          }
          grad.gradient(vt + c.column / kCols * d.dv * kCols + c.column % kCols, kCols,
                        static_cast<std::size_t>(c.cols), c.mods, take_grads ? &m : nullptr);
          const auto j0 = static_cast<std::size_t>(c.j0), step = static_cast<std::size_t>(c.step);
          grad.accumulate(keys + j0 * d.dk, step * d.dk, dkh + j0 * d.dk, step * d.dk,
                          dvh + j0 * d.dv, step * d.dv, static_cast<std::size_t>(c.cols));
        });
        grad.finish(&g.qkv.dq(b, h, tile.first, 0), tile.step * d.dk);
        for (std::size_t r = 0; r < rows.n; ++r) {
          const std::size_t at = row0 + rows.i[r];
          if (fox) fox_rows[at] = row_sums[r];
          if (in.alibi_slopes) alibi_rows[at] = alibi_sums[r];
          if (in.sinks) {  // d(sink) = -p_sink · rowsum(dO ∘ O), p_sink = exp(sink - lse)
            const float sink = (*in.sinks)[h];
            const float p = sink == kNegInf ? 0.0f : std::exp(sink - lse.data()[at]);
            sink_rows[at] = -p * grad.delta(r);
          }
        }
      }
    }
    if (groups > 1) {
#pragma omp for schedule(static)
      for (std::ptrdiff_t bk = 0; bk < static_cast<std::ptrdiff_t>(kv_heads); ++bk) {
        const auto head = static_cast<std::size_t>(bk);
        float* dkh = dk.data() + head * kd;
        float* dvh = dv.data() + head * vd;
        float* fch =
            fox ? fox_cols.data() + (head / d.kv() * d.heads + head % d.kv() * group) * d.nk
                : nullptr;
        for (std::size_t part = 1; part < groups; ++part) {
          const float* src = partial + ((part - 1) * kv_heads + head) * stride;
          for (std::size_t i = 0; i < kd; ++i) dkh[i] += src[i];
          for (std::size_t i = 0; i < vd; ++i) dvh[i] += src[kd + i];
          for (std::size_t i = 0; i < fd; ++i) fch[i] += src[kd + vd + i];
        }
      }
    }
  }
  // The per-head sums, each in a fixed order.
  for (std::size_t h = 0; h < d.heads; ++h) {
    double sink = 0, slope = 0;
    for (std::size_t b = 0; b < d.batch; ++b)
      for (std::size_t i = 0; i < d.nq; ++i) {
        const std::size_t at = (b * d.heads + h) * d.nq + i;
        if (in.sinks) sink += sink_rows[at];
        if (in.alibi_slopes) slope += alibi_rows[at];
      }
    if (in.sinks) g.d_sinks[h] = static_cast<float>(sink);
    if (in.alibi_slopes) g.d_alibi_slopes[h] = static_cast<float>(-slope);
  }
  if (fox) {  // dF_p(i) += row sums, dF_j -= column sums; dg_s = sum of dF_t over t >= s
    std::vector<double> df(d.nk);
    for (std::size_t b = 0; b < d.batch; ++b)
      for (std::size_t h = 0; h < d.heads; ++h) {
        const std::size_t bh = b * d.heads + h;
        for (std::size_t j = 0; j < d.nk; ++j) df[j] = -fox_cols[bh * d.nk + j];
        for (std::size_t i = 0; i < d.nq; ++i) {
          const Index p = mask.position(i, d);
          if (p < 0) continue;  // sees no key: no gradient
          df[std::min<std::size_t>(static_cast<std::size_t>(p), d.nk - 1)] +=
              fox_rows[bh * d.nq + i];
        }
        const std::size_t valid = mask.valid_keys(b, d.nk);
        double sum = 0;
        for (std::size_t t = d.nk; t-- > 0;) {
          sum += df[t];
          g.d_log_decay(b, h, t) = t < valid ? static_cast<float>(sum) : 0.0f;
        }
      }
  }
  if (dense_bias) sum_broadcast(bias_grad, d, g.d_bias);
}

}  // namespace attnlab::engine
