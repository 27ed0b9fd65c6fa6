#include "variants/sliding.hpp"

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

Index floor_mod(Index a, Index m) { return ((a % m) + m) % m; }

// Where every key and query of one problem lives. Keys are split into residue classes mod the
// dilation s (key j = rho + s·t is number t of class rho); a class is a contiguous run of
// columns in the transposed keys, so a dilated window is a plain window inside one class.
struct Layout {
  Index s = 1, left = 0, right = 0, offset = 0;  // query i sits at key position i + offset
  Index nq = 0, nk = 0, gq = 0, gk = 0;          // global queries / keys: i < gq, j < gk
  std::vector<Index> count, column;              // per class: its keys, its first column
  Index global_column = 0;                       // global keys j < gk: columns from here on
  std::size_t keys = 0, ldk = 0;                 // columns used / allocated per head

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
    // With dilation the global keys are spread over the classes: a copy of them, contiguous
    // after the classes, lets a tile fold them as one block. Without, they are columns 0..gk.
    global_column = s > 1 ? nk : 0;
    keys = static_cast<std::size_t>(s > 1 ? nk + gk : nk);
    // An odd number of 16-float lines per row spreads the Dk rows of a tile over all cache
    // sets (a power-of-two stride would map them to one set).
    ldk = (keys + 15) / 16 * 16;
    if (ldk / 16 % 2 == 0) ldk += 16;
  }

  /// Keys of class rho with index j < limit.
  Index below(Index rho, Index limit) const {
    return limit > rho ? (std::min(limit, nk) - 1 - rho) / s + 1 : 0;
  }
  /// Key t of a run is column `column` + t and key index `first` + `step`·t.
  struct Run {
    Index column, first, step;
  };
  Run class_run(Index rho) const { return {column[rho], rho, s}; }
  Run global_run() const { return {global_column, 0, 1}; }
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

// The inputs of one (batch item, head), in the class layout.
struct Head {
  const float* kt;  // [Dk, ldk], classes one after another, then the global keys if dilated
  const float* v;   // [keys, Dv], rows in the same order
  std::size_t b, h;
};

// Per-thread scratch: the online softmax, gathered queries and each row's key range.
struct Scratch {
  OnlineSoftmax softmax;
  std::vector<float> q;
  Index lo[kRows], hi[kRows];
  const bool* allowed[kRows];
  explicit Scratch(const Dims& d) : softmax(d.dk, d.dv), q(kRows * d.dk) {}
};

// Folds keys t in [t0, t1) of a run; row r keeps only t in [lo[r], hi[r]) and, under a
// boolean mask, the keys its mask row allows.
void fold_run(const Layout& g, const Head& head, const Dims& d, Layout::Run run, Index t0,
              Index t1, Scratch& sc) {
  const std::size_t rows = sc.softmax.rows();
  const float* kt = head.kt + run.column;
  const float* v = head.v + static_cast<std::size_t>(run.column) * d.dv;
  for (Index c0 = t0; c0 < t1; c0 += static_cast<Index>(kCols)) {
    const Index cols = std::min(static_cast<Index>(kCols), t1 - c0);
    float* s = sc.softmax.scores(kt + c0, g.ldk, static_cast<std::size_t>(cols));
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = s + r * kCols;
      const Index a = std::clamp<Index>(sc.lo[r] - c0, 0, cols);
      const Index z = std::clamp<Index>(sc.hi[r] - c0, a, cols);
      std::fill(row, row + a, kNegInf);
      std::fill(row + z, row + cols, kNegInf);
      if (const bool* allowed = sc.allowed[r])
        for (Index t = a; t < z; ++t)
          if (!allowed[run.first + run.step * (c0 + t)]) row[t] = kNegInf;
    }
    sc.softmax.fold(v + static_cast<std::size_t>(c0) * d.dv, d.dv, static_cast<std::size_t>(cols));
  }
}

// Folds the keys of every class with index below limit(r) for each row r (limit in key indices).
template <class Limit>
void fold_prefixes(const Layout& g, const Head& head, const Dims& d, Limit limit, Scratch& sc) {
  const Index rows = static_cast<Index>(sc.softmax.rows());
  for (Index rho = 0; rho < g.s; ++rho) {
    Index t1 = 0;
    for (Index r = 0; r < rows; ++r) {
      sc.lo[r] = 0;
      sc.hi[r] = g.below(rho, limit(r));
      t1 = std::max(t1, sc.hi[r]);
    }
    fold_run(g, head, d, g.class_run(rho), 0, t1, sc);
  }
}

void attend_tile(const Layout& g, const Head& head, const Tensor& q, const Mask& mask,
                 const Dims& d, const Task& task, float scale, Scratch& sc, Tensor& out) {
  const std::size_t first = static_cast<std::size_t>(task.first);
  const std::size_t rows = static_cast<std::size_t>(task.rows);
  const std::size_t step = static_cast<std::size_t>(task.step);
  Index visible[kRows];
  for (std::size_t r = 0; r < rows; ++r) {
    visible[r] = static_cast<Index>(mask.visible_keys(head.b, first + r * step, d));
    sc.allowed[r] = mask.allowed_row(head.b, head.h, first + r * step);
  }
  const float* q_rows = &q(head.b, head.h, first, 0);
  if (step != 1) {  // dilated: gather the class's queries into contiguous rows
    for (std::size_t r = 0; r < rows; ++r)
      std::copy_n(q_rows + r * step * d.dk, d.dk, sc.q.data() + r * d.dk);
    q_rows = sc.q.data();
  }
  sc.softmax.start(q_rows, rows, scale);

  if (task.global) {  // full attention rows
    fold_prefixes(g, head, d, [&](Index r) { return visible[r]; }, sc);
  } else {
    // The global keys j < gk as one block, then the window inside this query class; the
    // window starts after the class's global keys so that no key is counted twice.
    if (g.gk > 0) {
      Index t1 = 0;
      for (std::size_t r = 0; r < rows; ++r) {
        sc.lo[r] = 0;
        sc.hi[r] = std::min(visible[r], g.gk);
        t1 = std::max(t1, sc.hi[r]);
      }
      fold_run(g, head, d, g.global_run(), 0, t1, sc);
    }
    const Index rho = g.residue(task.first), u0 = g.slot(task.first);
    const Index tg = g.below(rho, g.gk);
    Index t0 = std::numeric_limits<Index>::max(), t1 = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const Index u = u0 + static_cast<Index>(r);
      sc.lo[r] = std::max(u - g.left, tg);
      sc.hi[r] = std::min({u + g.right + 1, g.count[rho], g.below(rho, visible[r])});
      if (sc.lo[r] < sc.hi[r]) {
        t0 = std::min(t0, sc.lo[r]);
        t1 = std::max(t1, sc.hi[r]);
      }
    }
    if (t0 < t1) fold_run(g, head, d, g.class_run(rho), t0, t1, sc);
  }
  sc.softmax.finish(&out(head.b, head.h, first, 0), step * d.dv);
}

// One head's keys ksrc [Nk, Dk] -> kdst [Dk, ldk] in class order, and with dilation its values
// vsrc [Nk, Dv] -> vdst [keys, Dv] in the same order (without, the values are used as they are).
// Shared among the threads of the caller's parallel region in runs of 512 keys of a class (every
// thread meets the same sequence of loops); ends with a barrier.
void lay_out_head(const Layout& g, const float* ksrc, const float* vsrc, const Dims& d,
                  float* kdst, float* vdst) {
  constexpr Index kRun = 512;
  const std::size_t step = static_cast<std::size_t>(g.s);
  for (Index rho = 0; rho < g.s; ++rho) {  // class rho: keys rho, rho + s, ...
#pragma omp for schedule(static) nowait
    for (Index t0 = 0; t0 < g.count[rho]; t0 += kRun) {
      const std::size_t keys = static_cast<std::size_t>(std::min(kRun, g.count[rho] - t0));
      const std::size_t col = static_cast<std::size_t>(g.column[rho] + t0);
      const std::size_t j0 = static_cast<std::size_t>(rho) + step * static_cast<std::size_t>(t0);
      kernels::transpose(keys, d.dk, ksrc + j0 * d.dk, step * d.dk, kdst + col, g.ldk);
      if (g.s > 1)
        for (std::size_t t = 0; t < keys; ++t)
          std::copy_n(vsrc + (j0 + step * t) * d.dv, d.dv, vdst + (col + t) * d.dv);
    }
  }
#pragma omp single  // with dilation, the global keys again, contiguous; then the barrier
  if (g.s > 1) {
    const std::size_t col = static_cast<std::size_t>(g.global_column);
    kernels::transpose(static_cast<std::size_t>(g.gk), d.dk, ksrc, d.dk, kdst + col, g.ldk);
    std::copy_n(vsrc, static_cast<std::size_t>(g.gk) * d.dv, vdst + col * d.dv);
  }
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

void SlidingAttention::compute(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Mask& mask, const Dims& d, Tensor& out) const {
  const Layout g(config_, d, mask);
  // One head at a time in two alternating buffers, left uninitialised (the padding columns past
  // the keys are never read): a head's layout stays in cache while its tiles read it, and no
  // layout of every head is allocated (and page-faulted) per call.
  const std::size_t head_k = d.dk * g.ldk, head_v = g.s > 1 ? g.keys * d.dv : 0;
  const std::unique_ptr<float[]> kt(new float[2 * head_k]);
  const std::unique_ptr<float[]> vc(head_v > 0 ? new float[2 * head_v] : nullptr);
  const std::vector<Task> tiles = plan_tiles(g);
  const float scale = static_cast<float>(mask.softmax_scale(d.dk));
  const auto tasks = static_cast<std::ptrdiff_t>(tiles.size());
#pragma omp parallel  // one region: a loaded machine makes every fork and join expensive
  {
    Scratch scratch(d);
    for (std::size_t bh = 0; bh < d.batch * d.heads; ++bh) {
      // No thread still reads these buffers (head bh - 2): each passed the layout barrier of
      // head bh - 1 after its last tile of head bh - 2.
      float* keys = kt.get() + (bh % 2) * head_k;
      float* values = head_v > 0 ? vc.get() + (bh % 2) * head_v : nullptr;
      const float* v_in = v.data() + bh * d.nk * d.dv;
      lay_out_head(g, k.data() + bh * d.nk * d.dk, v_in, d, keys, values);
      const Head head{keys, values ? values : v_in, bh / d.heads, bh % d.heads};
#pragma omp for schedule(dynamic, 4) nowait
      for (std::ptrdiff_t t = 0; t < tasks; ++t)
        attend_tile(g, head, q, mask, d, tiles[static_cast<std::size_t>(t)], scale, scratch, out);
    }
  }
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
