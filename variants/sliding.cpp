#include "variants/sliding.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "attnlab/decoder.hpp"
#include "attnlab/softmax_engine.hpp"
#include "variants/kv_cache.hpp"

namespace attnlab {
namespace {

using Index = std::int64_t;
// Queries per window tile. A tile's keys form a parallelogram inside the rectangle that is
// computed: with T rows the rectangle is T + L + R keys wide for L + R + 1 useful ones, so tiles
// shorter than the engine's 48 rows waste less (24: 280 computed for 257 useful at L = R = 128).
constexpr std::size_t kTileRows = 24;

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
  Index residue(Index i) const { return floor_mod(i + offset, s); }
  /// Position of query i inside its class (may be negative or past the keys when Nq != Nk).
  Index slot(Index i) const { return (i + offset - residue(i)) / s; }
};

// The sparsity the engine runs: global rows read every class; a window tile of one class reads
// the global keys j < G (the layout's lead block) and the window inside its class, past the
// class's own global keys so that no key is counted twice.
class SlidingSparsity final : public engine::Sparsity {
 public:
  SlidingSparsity(const SlidingConfig& c, const Dims& d, const Mask& mask) : g_(c, d, mask) {}

  engine::KeyLayout layout(const Dims& d, const Mask&) const override {
    return engine::KeyLayout(d.nk, static_cast<std::size_t>(g_.s),
                             static_cast<std::size_t>(g_.gq < g_.nq ? g_.gk : 0));
  }

  std::vector<engine::QueryTile> tiles(const Dims&, const Mask&,
                                       std::size_t max_rows) const override {
    std::vector<engine::QueryTile> tiles;
    const auto global = static_cast<Index>(max_rows);
    for (Index i0 = 0; i0 < g_.gq; i0 += global)  // first: global rows are the longest
      tiles.push_back(tile(i0, 1, std::min(global, g_.gq - i0)));
    const auto window = static_cast<Index>(std::min(kTileRows, max_rows));
    for (Index rho = 0; rho < g_.s; ++rho) {
      const Index first = g_.gq + floor_mod(rho - g_.gq - g_.offset, g_.s);
      const Index members = first < g_.nq ? (g_.nq - 1 - first) / g_.s + 1 : 0;
      for (Index m = 0; m < members; m += window)
        tiles.push_back(tile(first + m * g_.s, g_.s, std::min(window, members - m)));
    }
    return tiles;
  }

  void runs(const engine::KeyLayout& layout, std::size_t, std::size_t, const engine::QueryTile& t,
            std::vector<engine::KeyRun>& runs) const override {
    const auto first = static_cast<Index>(t.first);
    if (first < g_.gq) {  // full attention rows: every class
      for (Index rho = 0; rho < g_.s; ++rho) {
        engine::KeyRun& run = runs.emplace_back();
        run.cls = static_cast<std::size_t>(rho);
        run.t1 = g_.count[rho];
      }
      return;
    }
    if (layout.count(engine::KeyLayout::kLead) > 0) {
      engine::KeyRun& run = runs.emplace_back();
      run.cls = engine::KeyLayout::kLead;
      run.t1 = g_.gk;
    }
    const Index rho = g_.residue(first), u0 = g_.slot(first), tg = g_.below(rho, g_.gk);
    engine::KeyRun& run = runs.emplace_back();
    run.cls = static_cast<std::size_t>(rho);
    run.limited = true;
    run.t0 = std::numeric_limits<Index>::max();
    for (std::size_t r = 0; r < t.rows; ++r) {
      const Index u = u0 + static_cast<Index>(r);
      run.lo[r] = std::max(u - g_.left, tg);
      run.hi[r] = std::min(u + g_.right + 1, g_.count[rho]);
      if (run.lo[r] < run.hi[r])
        run.t0 = std::min(run.t0, run.lo[r]), run.t1 = std::max(run.t1, run.hi[r]);
    }
    if (run.t0 >= run.t1) runs.pop_back();  // no window key at all
  }

 private:
  static engine::QueryTile tile(Index first, Index step, Index rows) {
    return {static_cast<std::size_t>(first), static_cast<std::size_t>(step),
            static_cast<std::size_t>(rows)};
  }
  Layout g_;
};

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
                               const TokenInputs& in, const Dims& d, Tensor& out,
                               Saved* saved) const {
  engine::forward(q, k, v, mask, in, d, SlidingSparsity(config_, d, mask), out,
                  saved_lse(saved, d));
}

void SlidingAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                        const TokenInputs& in, const Dims& d, TensorRef out,
                                        TensorRef d_out, const Saved& saved,
                                        AllGradients& grads) const {
  RowLogSumExp storage;
  const RowLogSumExp& lse = lse_or_recompute(q, k, v, mask, in, d, saved, storage);
  engine::backward(q, k, v, mask, in, d, SlidingSparsity(config_, d, mask), out, d_out, lse, grads);
}

std::unique_ptr<TokenDecoder> SlidingAttention::start_decoding(const DecodeConfig& config) const {
  // Causal: the global keys [0, G), then the window's keys p - S·a (a = L .. 0) past them; a
  // global query (p < G) attends every key before it. The ring holds the last L·S + 1.
  const auto left = std::size_t(config_.left), stride = std::size_t(config_.dilation),
             global = std::size_t(config_.global);
  KvCacheLayout layout;
  layout.fixed = global;
  layout.ring = left * stride + 1;
  layout.pattern = [=](std::size_t, std::size_t p, PositionRanges& out) {
    if (p < global) {
      out.push_back({0, p + 1});
      return;
    }
    if (global > 0) out.push_back({0, global});
    for (std::size_t a = left + 1; a-- > 0;) {
      if (a * stride > p - global) continue;  // before the window's first key past the globals
      const std::size_t j = p - a * stride;
      if (stride == 1) {
        out.push_back({j, p + 1});
        return;
      }
      out.push_back({j, j + 1});
    }
  };
  return make_kv_cache_decoder(*this, config, std::move(layout));
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
