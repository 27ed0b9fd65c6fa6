#include "variants/sliding.hpp"

#include <omp.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {

using kernels::OnlineSoftmax;
using Index = std::int64_t;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr std::size_t kRows = OnlineSoftmax::kRows, kCols = OnlineSoftmax::kCols;
// Queries per tile. A tile's keys form a parallelogram inside the rectangle that is computed:
// with T rows the rectangle is T + L + R keys wide for L + R + 1 useful ones, so tiles shorter
// than the softmax's 48 rows waste less (24: 280 computed for 257 useful at L = R = 128).
constexpr std::size_t kTileRows = 24;
static_assert(kTileRows <= kRows);

Index floor_mod(Index a, Index m) {
  return ((a % m) + m) % m;
}

// Where every key and query of one problem lives. Keys are split into residue classes mod the
// dilation s (key j = rho + s·t is number t of class rho); a class is a contiguous run of
// columns in the transposed keys, so a dilated window is a plain window inside one class.
struct Layout {
  Index s = 1, left = 0, right = 0, offset = 0;  // query i sits at key position i + offset
  Index nq = 0, nk = 0, gq = 0, gk = 0;          // global queries / keys: i < gq, j < gk
  std::vector<Index> count, column;              // per class: its keys, its first column

  Layout(const SlidingConfig& c, const Dims& d, const Mask& mask) {
    nq = static_cast<Index>(d.nq);
    nk = static_cast<Index>(d.nk);
    offset = mask.causal == Causal::bottom_right ? nk - nq : 0;
    // A window key at distance >= nq + nk from a query is outside the sequence, so larger
    // values mean the same pattern; clamping keeps the index arithmetic far from overflow.
    s = std::min(c.dilation, nq + nk);
    left = std::min(c.left, nq + 2 * nk);
    right = std::min(c.right, nq + 2 * nk);
    gq = std::min(c.global, nq);
    gk = std::min(c.global, nk);
    count.resize(static_cast<std::size_t>(s));
    column.resize(static_cast<std::size_t>(s));
    Index col = 0;
    for (Index rho = 0; rho < s; ++rho) {
      column[rho] = col;
      count[rho] = below(rho, nk);
      col += count[rho];
    }
  }

  /// Keys of class rho with index j < limit.
  Index below(Index rho, Index limit) const {
    return limit > rho ? (std::min(limit, nk) - 1 - rho) / s + 1 : 0;
  }
  /// Key t of a run is key index `first` + `step`·t: of a class, at column `column` + t; of the
  /// global keys j < gk (spread over the classes when dilated), kept apart (Keys::at).
  struct Run {
    Index column, first, step;
    bool global;
  };
  Run class_run(Index rho) const { return {column[rho], rho, s, false}; }
  Run global_run() const { return {0, 0, 1, true}; }
  Index residue(Index i) const { return floor_mod(i + offset, s); }
  /// Position of query i inside its class (may be negative or past the keys when Nq != Nk).
  Index slot(Index i) const { return (i + offset - residue(i)) / s; }
};

// A tile: `rows` queries of one class, first, first + step, ... (global rows: step 1).
struct Task {
  bool global;
  Index first, step, rows;
};

std::vector<Task> plan_tiles(const Layout& g) {
  std::vector<Task> tasks;
  const Index tile = static_cast<Index>(kTileRows);
  for (Index i0 = 0; i0 < g.gq; i0 += tile)  // first: global rows are the longest
    tasks.push_back({true, i0, 1, std::min(tile, g.gq - i0)});
  for (Index rho = 0; rho < g.s; ++rho) {
    const Index first = g.gq + floor_mod(rho - g.gq - g.offset, g.s);
    const Index members = first < g.nq ? (g.nq - 1 - first) / g.s + 1 : 0;
    for (Index m = 0; m < members; m += tile)
      tasks.push_back({false, first + m * g.s, g.s, std::min(tile, members - m)});
  }
  return tasks;
}

// Consecutive tiles [first, end) of one kind (global rows, or rows of one class) laid out and
// run together by one thread: the columns [lo, hi) of the class layout they read, and whether
// they also read the global keys (rows of a class, when there are global keys).
struct Segment {
  std::size_t first, end;
  Index lo, hi;
  bool globals;
};

// Tiles per segment: 32 x 24 rows read about 1,050 keys at L = R = 128 (a 270 KB layout, in L2),
// each laid out for 768 queries.
constexpr std::size_t kSegmentTiles = 32;

// Class-layout columns [lo, hi) a tile reads: every class's keys for global rows, else the
// window of its class past the class's global keys (those come from the global run).
std::pair<Index, Index> tile_columns(const Layout& g, const Task& t) {
  if (t.global) return {0, g.nk};
  const Index rho = g.residue(t.first), u0 = g.slot(t.first);
  const Index lo = std::max(u0 - g.left, g.below(rho, g.gk));
  const Index hi = std::min(u0 + t.rows - 1 + g.right + 1, g.count[rho]);
  return {g.column[rho] + lo, g.column[rho] + std::max(lo, hi)};
}

std::vector<Segment> plan_segments(const Layout& g, const std::vector<Task>& tiles) {
  std::vector<Segment> segments;
  for (std::size_t i = 0; i < tiles.size();) {
    const Task& t = tiles[i];
    Segment seg{i, i, std::numeric_limits<Index>::max(), 0, !t.global && g.gk > 0};
    for (; seg.end < tiles.size() && seg.end - i < kSegmentTiles; ++seg.end) {
      const Task& next = tiles[seg.end];
      if (next.global != t.global || (!t.global && g.residue(next.first) != g.residue(t.first)))
        break;
      const auto [lo, hi] = tile_columns(g, next);
      if (lo < hi) seg.lo = std::min(seg.lo, lo), seg.hi = std::max(seg.hi, hi);
    }
    if (seg.lo >= seg.hi) seg.lo = seg.hi = 0;  // no window key at all
    segments.push_back(seg);
    i = seg.end;
  }
  return segments;
}

// The keys one segment reads, transposed by the thread that runs it: the global keys (if it
// reads them) in columns [0, globals), then class-layout columns [lo, hi). Small enough to stay
// in L2 while the segment's tiles read it; nothing of the size of a head is written. The values
// are read where they are: a run's rows are evenly spaced (stride step·Dv).
struct Keys {
  std::vector<float> kt;  // [Dk, ld]
  std::vector<float> vt;  // backward: [Dv, ld], the values transposed like kt
  std::size_t ld = 0;
  Index globals = 0, lo = 0;
  const float* v = nullptr;  // the head's values [Nk, Dv]
  std::size_t b = 0, h = 0;
  /// Column of key t of a run.
  std::size_t at(const Layout::Run& run, Index t) const {
    return static_cast<std::size_t>(run.global ? t : globals + run.column + t - lo);
  }
};

// ksrc [Nk, Dk] of one head into keys, for the segment's columns; with vsrc (the backward), its
// values [Nk, Dv] too, transposed the same way into keys.vt (the operand of dO V^T).
void lay_out_segment(const Layout& g, const float* ksrc, const Dims& d, const Segment& seg,
                     Keys& keys, const float* vsrc = nullptr) {
  keys.globals = seg.globals ? g.gk : 0;
  keys.lo = seg.lo;
  const auto columns = static_cast<std::size_t>(keys.globals + seg.hi - seg.lo);
  // An odd number of 16-float lines per row spreads the Dk rows of a tile over all cache sets
  // (a power-of-two stride would map them to one set).
  keys.ld = (columns + 15) / 16 * 16;
  if (keys.ld / 16 % 2 == 0) keys.ld += 16;
  if (keys.kt.size() < d.dk * keys.ld) keys.kt.resize(d.dk * keys.ld);
  if (vsrc && keys.vt.size() < d.dv * keys.ld) keys.vt.resize(d.dv * keys.ld);
  const auto globals = static_cast<std::size_t>(keys.globals);
  kernels::transpose(globals, d.dk, ksrc, d.dk, keys.kt.data(), keys.ld);
  if (vsrc) kernels::transpose(globals, d.dv, vsrc, d.dv, keys.vt.data(), keys.ld);
  const std::size_t step = static_cast<std::size_t>(g.s);
  // The classes whose columns meet [lo, hi): one for rows of a class, all for global rows.
  const auto first = std::upper_bound(g.column.begin(), g.column.end(), seg.lo) - 1;
  for (Index rho = first - g.column.begin(); rho < g.s && g.column[rho] < seg.hi; ++rho) {
    const Index t0 = std::max<Index>(seg.lo - g.column[rho], 0);
    const Index t1 = std::min(seg.hi - g.column[rho], g.count[rho]);
    if (t0 >= t1) continue;
    const std::size_t keys_in = static_cast<std::size_t>(t1 - t0);
    const std::size_t col = keys.at(g.class_run(rho), t0);
    const std::size_t j0 = static_cast<std::size_t>(rho) + step * static_cast<std::size_t>(t0);
    kernels::transpose(keys_in, d.dk, ksrc + j0 * d.dk, step * d.dk, keys.kt.data() + col, keys.ld);
    if (vsrc)
      kernels::transpose(keys_in, d.dv, vsrc + j0 * d.dv, step * d.dv, keys.vt.data() + col,
                         keys.ld);
  }
}

// Each row's keys in the run being visited: row r keeps t in [lo[r], hi[r]) and, under a
// boolean mask, the keys its mask row allows.
struct RowLimits {
  Index lo[kRows], hi[kRows];
  const bool* allowed[kRows];
};

// Per-thread scratch of the forward: the online softmax, a segment's keys, gathered queries and
// each row's key range.
struct Scratch {
  OnlineSoftmax softmax;
  Keys keys;
  std::vector<float> q;
  RowLimits limits;
  explicit Scratch(const Dims& d) : softmax(d.dk, d.dv), q(kRows * d.dk) {}
};

// Keys t in [t0, t1) of a run in chunks of at most kCols: engine.scores, each row masked to its
// limits with -inf, then consume(c0, cols, column of key c0 in keys). Shared by the forward
// (OnlineSoftmax) and the backward (SoftmaxBackward), so that both apply the same masks.
template <class Engine, class Consume>
void masked_run(const Keys& keys, Layout::Run run, Index t0, Index t1, const RowLimits& limits,
                Engine& engine, Consume consume) {
  const std::size_t rows = engine.rows();
  for (Index c0 = t0; c0 < t1; c0 += static_cast<Index>(kCols)) {
    const Index cols = std::min(static_cast<Index>(kCols), t1 - c0);
    const std::size_t col = keys.at(run, c0);
    float* s = engine.scores(keys.kt.data() + col, keys.ld, static_cast<std::size_t>(cols));
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = s + r * kCols;
      const Index a = std::clamp<Index>(limits.lo[r] - c0, 0, cols);
      const Index z = std::clamp<Index>(limits.hi[r] - c0, a, cols);
      std::fill(row, row + a, kNegInf);
      std::fill(row + z, row + cols, kNegInf);
      if (const bool* allowed = limits.allowed[r])
        for (Index t = a; t < z; ++t)
          if (!allowed[run.first + run.step * (c0 + t)]) row[t] = kNegInf;
    }
    consume(c0, static_cast<std::size_t>(cols), col);
  }
}

// The tile's rows: the keys each passes the causal and padding limits for, and its boolean
// mask row.
void row_limits(const Mask& mask, const Dims& d, const Keys& keys, const Task& task, Index* visible,
                RowLimits& limits) {
  for (Index r = 0; r < task.rows; ++r) {
    const std::size_t i = static_cast<std::size_t>(task.first + r * task.step);
    visible[r] = static_cast<Index>(mask.visible_keys(keys.b, i, d));
    limits.allowed[r] = mask.allowed_row(keys.b, keys.h, i);
  }
}

// The runs a tile reads: visit(run, t0, t1) with each row's limits in that run set.
template <class Visit>
void for_each_run(const Layout& g, const Task& task, const Index* visible, RowLimits& limits,
                  Visit visit) {
  const Index rows = task.rows;
  if (task.global) {  // full attention rows: every class up to each row's limit
    for (Index rho = 0; rho < g.s; ++rho) {
      Index t1 = 0;
      for (Index r = 0; r < rows; ++r) {
        limits.lo[r] = 0;
        limits.hi[r] = g.below(rho, visible[r]);
        t1 = std::max(t1, limits.hi[r]);
      }
      visit(g.class_run(rho), 0, t1);
    }
    return;
  }
  // The global keys j < gk as one block, then the window inside this query class; the window
  // starts after the class's global keys so that no key is counted twice.
  if (g.gk > 0) {
    Index t1 = 0;
    for (Index r = 0; r < rows; ++r) {
      limits.lo[r] = 0;
      limits.hi[r] = std::min(visible[r], g.gk);
      t1 = std::max(t1, limits.hi[r]);
    }
    visit(g.global_run(), 0, t1);
  }
  const Index rho = g.residue(task.first), u0 = g.slot(task.first);
  const Index tg = g.below(rho, g.gk);
  Index t0 = std::numeric_limits<Index>::max(), t1 = 0;
  for (Index r = 0; r < rows; ++r) {
    const Index u = u0 + r;
    limits.lo[r] = std::max(u - g.left, tg);
    limits.hi[r] = std::min({u + g.right + 1, g.count[rho], g.below(rho, visible[r])});
    if (limits.lo[r] < limits.hi[r]) {
      t0 = std::min(t0, limits.lo[r]);
      t1 = std::max(t1, limits.hi[r]);
    }
  }
  if (t0 < t1) visit(g.class_run(rho), t0, t1);
}

// One tile of the forward over the segment laid out in sc.keys; lse (this head's row
// log-sum-exp, or nullptr) saved when given.
void attend_tile(const Layout& g, TensorRef q, const Mask& mask, const Dims& d, const Task& task,
                 float scale, Scratch& sc, Tensor& out, float* lse) {
  const std::size_t b = sc.keys.b, h = sc.keys.h;
  const std::size_t first = static_cast<std::size_t>(task.first);
  const std::size_t rows = static_cast<std::size_t>(task.rows);
  const std::size_t step = static_cast<std::size_t>(task.step);
  Index visible[kRows];
  row_limits(mask, d, sc.keys, task, visible, sc.limits);
  const float* q_rows = &q(b, h, first, 0);
  if (step != 1) {  // dilated: gather the class's queries into contiguous rows
    for (std::size_t r = 0; r < rows; ++r)
      std::copy_n(q_rows + r * step * d.dk, d.dk, sc.q.data() + r * d.dk);
    q_rows = sc.q.data();
  }
  sc.softmax.start(q_rows, rows, scale);
  for_each_run(g, task, visible, sc.limits, [&](Layout::Run run, Index t0, Index t1) {
    masked_run(sc.keys, run, t0, t1, sc.limits, sc.softmax,
               [&](Index c0, std::size_t cols, std::size_t) {  // values read in place
                 const auto first = static_cast<std::size_t>(run.first + run.step * c0);
                 sc.softmax.fold(sc.keys.v + first * d.dv,
                                 static_cast<std::size_t>(run.step) * d.dv, cols);
               });
  });
  sc.softmax.finish(&out(b, h, first, 0), step * d.dv, lse ? lse + first : nullptr, step);
}

// One tile of the backward over the segment laid out in keys (values transposed): the same runs
// and masks; keys' gradients added in place (key t of a run is row first + step·t of k and of
// this head's accumulators dk, dv). lse: this head's row log-sum-exp.
void backprop_tile(const Layout& g, const Keys& keys, TensorRef q, TensorRef k, TensorRef out,
                   TensorRef d_out, const float* lse, const Mask& mask, const Dims& d,
                   const Task& task, float scale, kernels::SoftmaxBackward& grad, Tensor& dq,
                   float* dk, float* dv) {
  const std::size_t b = keys.b, h = keys.h;
  const std::size_t first = static_cast<std::size_t>(task.first);
  const std::size_t step = static_cast<std::size_t>(task.step);
  Index visible[kRows];
  RowLimits limits;
  row_limits(mask, d, keys, task, visible, limits);
  grad.start(&q(b, h, first, 0), step * d.dk, &out(b, h, first, 0), &d_out(b, h, first, 0),
             step * d.dv, lse + first, step, static_cast<std::size_t>(task.rows), scale);
  for_each_run(g, task, visible, limits, [&](Layout::Run run, Index t0, Index t1) {
    masked_run(keys, run, t0, t1, limits, grad, [&](Index c0, std::size_t cols, std::size_t col) {
      const std::size_t j0 = static_cast<std::size_t>(run.first + run.step * c0);
      const std::size_t stride = static_cast<std::size_t>(run.step);
      grad.backprop(&k(b, h, j0, 0), stride * d.dk, keys.vt.data() + col, keys.ld, dk + j0 * d.dk,
                    stride * d.dk, dv + j0 * d.dv, stride * d.dv, cols);
    });
  });
  grad.finish(&dq(b, h, first, 0), step * d.dk);
}

}  // namespace

SlidingAttention::SlidingAttention(const SlidingConfig& config) : config_(config) {}

std::string SlidingAttention::spec() const {
  return SpecWriter("sliding")
      .add("left", config_.left)
      .add("right", config_.right)
      .add("dilation", config_.dilation)
      .add("global", config_.global)
      .str();
}

double SlidingAttention::flops(const Dims& d, const Mask& mask) const {
  const Layout g(config_, d, mask);
  double pairs = 0;  // attended (query, key) pairs of one head, summed over the batch
  for (std::size_t b = 0; b < d.batch; ++b)
    for (Index i = 0; i < g.nq; ++i) {
      const Index visible =
          static_cast<Index>(mask.visible_keys(b, static_cast<std::size_t>(i), d));
      if (i < g.gq) {
        pairs += static_cast<double>(visible);
        continue;
      }
      const Index rho = g.residue(i), u = g.slot(i), lo = std::max<Index>(u - g.left, 0);
      const Index globals = std::min(g.gk, visible);
      const Index window = std::min({u + g.right + 1, g.count[rho], g.below(rho, visible)}) - lo;
      const Index global_in_window = std::min(u + g.right + 1, g.below(rho, globals)) - lo;
      pairs += static_cast<double>(std::max<Index>(window, 0) + globals -
                                   std::max<Index>(global_in_window, 0));
    }
  return 2.0 * pairs * static_cast<double>(d.heads * (d.dk + d.dv));
}

void SlidingAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                               const TokenInputs&, const Dims& d, Tensor& out, Saved* saved) const {
  run(q, k, v, mask, d, out, saved_lse(saved, d));
}

void SlidingAttention::run(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const Dims& d,
                           Tensor& out, float* lse) const {
  const Layout g(config_, d, mask);
  const std::vector<Task> tiles = plan_tiles(g);
  const std::vector<Segment> segments = plan_segments(g, tiles);
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  const auto tasks = static_cast<std::ptrdiff_t>(d.batch * d.heads * segments.size());
#pragma omp parallel  // one region and no barrier: a loaded machine makes each expensive
  {
    Scratch scratch(d);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < tasks; ++t) {
      const std::size_t bh = static_cast<std::size_t>(t) / segments.size();
      const Segment& seg = segments[static_cast<std::size_t>(t) % segments.size()];
      scratch.keys.b = bh / d.heads;
      scratch.keys.h = bh % d.heads;
      scratch.keys.v = v.data() + bh * d.nk * d.dv;
      lay_out_segment(g, k.data() + bh * d.nk * d.dk, d, seg, scratch.keys);
      for (std::size_t i = seg.first; i < seg.end; ++i)
        attend_tile(g, q, mask, d, tiles[i], scale, scratch, out, lse ? lse + bh * d.nq : nullptr);
    }
  }
}

void SlidingAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                        const TokenInputs& in, const Dims& d, TensorRef out,
                                        TensorRef d_out, const Saved& saved,
                                        AllGradients& grads) const {
  RowLogSumExp storage;
  const RowLogSumExp& lse = lse_or_recompute(q, k, v, mask, in, d, saved, storage);
  Gradients& g = grads.qkv;
  const Layout layout(config_, d, mask);
  const std::vector<Task> tiles = plan_tiles(layout);
  const std::vector<Segment> segments = plan_segments(layout, tiles);
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  // Each task lays its segment out, as the forward does, with the values transposed; one Keys
  // per thread of run_backward_tiles' parallel region.
  std::vector<Keys> keys(static_cast<std::size_t>(std::max(1, omp_get_max_threads())));
  kernels::run_backward_tiles(  // the segments are the tiles; nothing for the driver to lay out
      d, segments.size(), nullptr, nullptr,
      [&](std::size_t bh, std::size_t s, const float*, const float*, float* dk, float* dv,
          kernels::SoftmaxBackward& grad) {
        Keys& mine = keys[static_cast<std::size_t>(omp_get_thread_num())];
        mine.b = bh / d.heads;
        mine.h = bh % d.heads;
        const Segment& seg = segments[s];
        lay_out_segment(layout, k.data() + bh * d.nk * d.dk, d, seg, mine,
                        v.data() + bh * d.nk * d.dv);
        for (std::size_t i = seg.first; i < seg.end; ++i)
          backprop_tile(layout, mine, q, k, out, d_out, lse.data() + bh * d.nq, mask, d, tiles[i],
                        scale, grad, g.dq, dk, dv);
      },
      g.dk, g.dv);
}

std::unique_ptr<Attention> make_sliding(Params& params) {
  SlidingConfig c;
  const auto read = [&](const char* key, std::int64_t fallback, std::int64_t least) {
    const std::int64_t value = params.integer(key, fallback);
    if (value < least) params.fail(key, "expected an integer >= " + std::to_string(least));
    return value;
  };
  c.left = read("left", c.left, 0);
  c.right = read("right", c.right, 0);
  c.dilation = read("dilation", c.dilation, 1);
  c.global = read("global", c.global, 0);
  return std::make_unique<SlidingAttention>(c);
}

namespace {
// Position 40 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("sliding", make_sliding, 40);
}  // namespace

}  // namespace attnlab
