#include "variants/bigbird.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "attnlab/decoder.hpp"
#include "attnlab/error.hpp"
#include "attnlab/seed.hpp"
#include "attnlab/softmax_engine.hpp"
#include "variants/kv_cache.hpp"

namespace attnlab {
namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

// First ceil(G/2) and last floor(G/2) of `count` blocks.
bool is_global(std::size_t j, std::size_t count, std::int64_t global) {
  const auto front = static_cast<std::size_t>(global / 2 + global % 2);
  const auto back = static_cast<std::size_t>(global / 2);
  return j < front || j + back >= count;
}

using Row = std::vector<std::pair<std::uint32_t, BlockKind>>;  // (key block, kind), ascending

// The row of query block i in head h, in O(G + W + R) for a sparse query block (not O(key
// blocks): the layout stays linear in N). `moved` is scratch for the random draws.
void layout_row(const BigBirdConfig& c, const BigBirdLayout& l, std::size_t h, std::size_t i,
                Row& row, std::vector<std::pair<std::size_t, std::size_t>>& moved) {
  const std::size_t last = l.last_key_block(i);
  const auto entry = [](std::size_t j, BlockKind kind) {
    return std::pair{static_cast<std::uint32_t>(j), kind};
  };
  row.clear();
  if (is_global(i, l.query_blocks, c.global)) {
    for (std::size_t j = 0; j <= last; ++j) row.push_back(entry(j, BlockKind::global));
    return;
  }
  // Ascending: the first global blocks, the window's other blocks, the last global blocks.
  const auto front = static_cast<std::size_t>(c.global / 2 + c.global % 2);
  const auto back = static_cast<std::size_t>(c.global / 2);
  const std::size_t back_first = std::max(front, l.key_blocks - std::min(back, l.key_blocks));
  for (std::size_t j = 0; j < std::min(front, last + 1); ++j)
    row.push_back(entry(j, BlockKind::global));
  const auto half = static_cast<std::size_t>((c.window - 1) / 2);
  for (std::size_t j = std::max(i > half ? i - half : 0, front);
       j <= std::min(last, i + half) && j < back_first; ++j)
    row.push_back(entry(j, BlockKind::window));
  for (std::size_t j = back_first; j <= last; ++j) row.push_back(entry(j, BlockKind::global));
  // A partial Fisher-Yates shuffle of the candidates (the blocks not yet in the row, ascending),
  // the first R picks not depending on R. Only the positions it moved are stored (`moved`,
  // position -> candidate rank); candidate rank x is block x plus the row's blocks at or below it.
  const std::size_t candidates = last + 1 - row.size();
  moved.clear();
  const auto at = [&](std::size_t x) {
    for (const auto& [position, rank] : moved)
      if (position == x) return rank;
    return x;
  };
  const auto put = [&](std::size_t x, std::size_t rank) {
    for (auto& [position, r] : moved)
      if (position == x) return void(r = rank);
    moved.emplace_back(x, rank);
  };
  const std::size_t fixed = row.size();
  // One SplitMix64 stream per (seed, h, i): portable, so a seed draws the same blocks with every
  // compiler and standard library (std:: distributions are implementation-defined).
  std::uint64_t state = static_cast<std::uint64_t>(c.seed);
  state = splitmix64_next(state) ^ h;
  state = splitmix64_next(state) ^ i;
  const std::size_t draws = std::min(static_cast<std::size_t>(c.random), candidates);
  for (std::size_t r = 0; r < draws; ++r) {
    const std::size_t pick = r + splitmix64_next(state) % (candidates - r);
    const std::size_t drawn = at(pick);
    put(pick, at(r));
    put(r, drawn);
    std::size_t j = drawn;
    for (std::size_t f = 0; f < fixed && row[f].first <= j; ++f) ++j;
    row.push_back(entry(j, BlockKind::random));
  }
  std::sort(row.begin(), row.end());
}

// Contiguous key ranges [first, second) covered by a sorted list of key blocks.
void key_ranges(std::span<const std::uint32_t> blocks, std::size_t block, std::size_t nk,
                std::vector<std::pair<std::size_t, std::size_t>>& ranges) {
  ranges.clear();
  for (const std::uint32_t j : blocks) {
    const std::size_t lo = j * block, hi = std::min(nk, lo + block);
    if (!ranges.empty() && ranges.back().second == lo)
      ranges.back().second = hi;
    else
      ranges.emplace_back(lo, hi);
  }
}

}  // namespace

void BigBirdConfig::validate() const {
  auto fail = [](const std::string& token, const std::string& why) {
    throw Error("bigbird: " + token + ": " + why);
  };
  if (block < 1) fail("block=" + std::to_string(block), "expected an integer >= 1");
  if (window < 1 || window % 2 == 0)
    fail("window=" + std::to_string(window), "expected an odd integer >= 1");
  if (global < 0) fail("global=" + std::to_string(global), "expected an integer >= 0");
  if (random < 0) fail("random=" + std::to_string(random), "expected an integer >= 0");
  if (seed < 0) fail("seed=" + std::to_string(seed), "expected an integer >= 0");
}

std::span<const std::uint32_t> BigBirdLayout::blocks(std::size_t h, std::size_t i) const {
  const std::size_t row = h * query_blocks + i;
  return {blocks_.data() + offsets_[row], offsets_[row + 1] - offsets_[row]};
}

BlockKind BigBirdLayout::kind(std::size_t h, std::size_t i, std::size_t j) const {
  const auto row = blocks(h, i);
  const auto it = std::lower_bound(row.begin(), row.end(), j);
  if (it == row.end() || *it != j) return BlockKind::none;
  return kinds_[offsets_[h * query_blocks + i] + static_cast<std::size_t>(it - row.begin())];
}

double BigBirdLayout::pairs(std::size_t nq, std::size_t nk) const {
  double total = 0;
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < query_blocks; ++i) {
      std::size_t keys = 0;
      for (const std::uint32_t j : blocks(h, i)) keys += std::min(nk, (j + 1) * block) - j * block;
      total += double(std::min(nq, (i + 1) * block) - i * block) * double(keys);
    }
  return total;
}

std::size_t BigBirdLayout::last_key_block(std::size_t i) const {
  return causal ? reach_[i] : key_blocks - 1;
}

BigBirdLayout bigbird_layout(const BigBirdConfig& config, std::size_t heads, std::size_t nq,
                             std::size_t nk, bool causal) {
  Mask mask;
  if (causal) mask.causal = Causal::top_left;
  return bigbird_layout(config, Dims{1, heads, nq, nk, 1, 1}, mask, 0);
}

BigBirdLayout bigbird_layout(const BigBirdConfig& config, const Dims& d, const Mask& mask,
                             std::size_t item) {
  config.validate();
  const bool causal = mask.causal != Causal::none;
  if (causal && d.nq != d.nk)
    throw Error("bigbird layout: causal needs Nq == Nk (got " + std::to_string(d.nq) + " and " +
                std::to_string(d.nk) + ")");
  if (d.nq == 0 || d.nk == 0) throw Error("bigbird layout: sequence lengths must be at least 1");
  BigBirdLayout l;
  l.heads = d.heads;
  l.block = static_cast<std::size_t>(config.block);
  l.query_blocks = ceil_div(d.nq, l.block);
  l.key_blocks = ceil_div(d.nk, l.block);
  l.causal = causal;
  if (causal) {  // the diagonal block, or the last prefix block the block's queries see
    l.reach_.resize(l.query_blocks);
    for (std::size_t i = 0; i < l.query_blocks; ++i) l.reach_[i] = std::min(i, l.key_blocks - 1);
    const auto open_prefix = [&](std::size_t q0, std::size_t q1, std::size_t prefix_end) {
      if (q0 >= q1 || prefix_end == 0) return;  // no queries, or an empty prefix
      const std::size_t last = std::min((prefix_end - 1) / l.block, l.key_blocks - 1);
      for (std::size_t i = q0 / l.block; i <= (q1 - 1) / l.block; ++i)
        l.reach_[i] = std::max(l.reach_[i], last);
    };
    if (!mask.prefix_lengths.empty() && mask.has_documents()) {
      for (std::size_t doc = 0; doc + 1 < mask.documents.size(); ++doc) {
        const auto [q0, q1] = mask.document_queries(doc);
        const std::size_t k0 = mask.document_keys(doc).first;
        open_prefix(q0, q1, k0 + static_cast<std::size_t>(mask.prefix_lengths[doc]));
      }
    } else if (!mask.prefix_lengths.empty()) {
      open_prefix(0, d.nq, static_cast<std::size_t>(mask.prefix_lengths[item]));
    }
  }
  l.offsets_.reserve(d.heads * l.query_blocks + 1);
  l.offsets_.push_back(0);
  Row row;
  std::vector<std::pair<std::size_t, std::size_t>> moved;
  for (std::size_t h = 0; h < d.heads; ++h)
    for (std::size_t i = 0; i < l.query_blocks; ++i) {
      layout_row(config, l, h, i, row, moved);
      for (const auto& [j, kind] : row) {
        l.blocks_.push_back(j);
        l.kinds_.push_back(kind);
      }
      l.offsets_.push_back(l.blocks_.size());
    }
  return l;
}

BigBirdAttention::BigBirdAttention(const BigBirdConfig& config) : config_(config) {
  config_.validate();
}

std::string BigBirdAttention::spec() const {
  return SpecWriter("bigbird")
      .add("block", config_.block)
      .add("window", config_.window)
      .add("global", config_.global)
      .add("random", config_.random)
      .add("seed", config_.seed)
      .str();
}

Support BigBirdAttention::support() const {
  Support s = Support::softmax_engine();
  s.causal_cross = false;  // the block diagonal is only defined for Nq == Nk
  return s;
}

std::string BigBirdAttention::why_unsupported(const std::string& feature) const {
  if (feature == "causal masks with Nq != Nk")
    return "the block diagonal that causality cuts is defined only for Nq == Nk";
  return {};
}

double BigBirdAttention::flops(const Dims& d, const Mask& mask) const {
  if (mask.causal != Causal::none && d.nq != d.nk)
    return std::numeric_limits<double>::quiet_NaN();  // unsupported
  double pairs = 0;
  for (std::size_t b = 0; b < d.batch; ++b) {
    const BigBirdLayout layout = bigbird_layout(config_, d, mask, b);
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t i = 0; i < d.nq; ++i) {
        const KeySpan span = mask.key_span(b, i, d);
        for (const std::uint32_t j : layout.blocks(h, i / layout.block)) {
          const auto lo = std::max<std::int64_t>(span.lo, j * layout.block);
          const auto hi = std::min<std::int64_t>(span.hi, (j + 1) * layout.block);
          pairs += double(std::max<std::int64_t>(hi - lo, 0));
        }
      }
  }
  return 2.0 * pairs * double(d.dk + d.dv);
}

namespace {

// Each query block is cut into equal row tiles of at most max_rows (the engine's), multiples
// of the 6-row GEMM block where possible (forward: 64 -> 36 + 28; backward: 64).
std::size_t tile_rows(std::size_t block, std::size_t nq, std::size_t max_rows) {
  const std::size_t rows = std::min(block, nq);
  const std::size_t tiles = ceil_div(rows, max_rows);
  return std::min(max_rows, ceil_div(ceil_div(rows, tiles), 6) * 6);
}

// The sparsity the engine runs: row tiles inside each query block (global blocks, the
// heaviest, first), each reading its block's key blocks as runs of contiguous keys.
class BigBirdSparsity final : public engine::Sparsity {
 public:
  BigBirdSparsity(const BigBirdConfig& c, const Dims& d, const Mask& mask) : config_(c), nk_(d.nk) {
    // One layout per item where items' prefixes (prefix-LM) move the causal cut differently.
    const bool per_item =
        mask.causal != Causal::none && !mask.prefix_lengths.empty() && !mask.has_documents();
    for (std::size_t b = 0; b < (per_item ? d.batch : 1); ++b)
      own_.push_back(bigbird_layout(c, d, mask, b));
    for (const BigBirdLayout& layout : own_) layouts_.push_back(&layout);
  }

  // A decoder's prompt: its first d.nk tokens under `layout`, the causal layout of max_tokens
  // >= d.nk tokens (a prompt's own layout would make its last blocks the global ones).
  BigBirdSparsity(const BigBirdConfig& c, const Dims& d, const BigBirdLayout& layout)
      : config_(c), layouts_{&layout}, nk_(d.nk) {}
  BigBirdSparsity(const BigBirdSparsity&) = delete;  // layouts_ may point into own_
  BigBirdSparsity& operator=(const BigBirdSparsity&) = delete;

  std::vector<engine::QueryTile> tiles(const Dims& d, const Mask&,
                                       std::size_t max_rows) const override {
    const BigBirdLayout& layout = *layouts_.front();  // every item's has the same blocks
    const std::size_t block = layout.block, rows = tile_rows(block, d.nq, max_rows);
    std::vector<engine::QueryTile> tiles;
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t qb = 0; qb < layout.query_blocks; ++qb) {
        if (is_global(qb, layout.query_blocks, config_.global) != (pass == 0)) continue;
        const std::size_t end = std::min(d.nq, (qb + 1) * block);
        for (std::size_t i0 = qb * block; i0 < end; i0 += rows)
          tiles.push_back({i0, 1, std::min(rows, end - i0)});
      }
    return tiles;
  }

  void runs(const engine::KeyLayout&, std::size_t b, std::size_t h, const engine::QueryTile& t,
            std::vector<engine::KeyRun>& runs) const override {
    const BigBirdLayout& layout = *layouts_[layouts_.size() == 1 ? 0 : b];
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    key_ranges(layout.blocks(h, t.first / layout.block), layout.block, nk_, ranges);
    for (const auto& [lo, hi] : ranges) {
      engine::KeyRun& run = runs.emplace_back();
      run.t0 = static_cast<std::int64_t>(lo);
      run.t1 = static_cast<std::int64_t>(hi);
    }
  }

 private:
  BigBirdConfig config_;
  std::vector<BigBirdLayout> own_;             // the layouts made here, if any
  std::vector<const BigBirdLayout*> layouts_;  // one, or one per batch item
  std::size_t nk_;
};

}  // namespace

void BigBirdAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                               const TokenInputs& in, const Dims& d, Tensor& out,
                               Saved* saved) const {
  engine::forward(q, k, v, mask, in, d, BigBirdSparsity(config_, d, mask), out,
                  saved_lse(saved, d));
}

void BigBirdAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                        const TokenInputs& in, const Dims& d, TensorRef out,
                                        TensorRef d_out, const Saved& saved,
                                        AllGradients& g) const {
  RowLogSumExp storage;
  const RowLogSumExp& lse = lse_or_recompute(q, k, v, mask, in, d, saved, storage);
  engine::backward(q, k, v, mask, in, d, BigBirdSparsity(config_, d, mask), out, d_out, lse, g);
}

std::unique_ptr<TokenDecoder> BigBirdAttention::start_decoding(const DecodeConfig& config) const {
  if (config.max_tokens == 0)
    throw Error(spec() +
                ": decoding needs max_tokens: the causal block pattern (its last global "
                "blocks, its random blocks) depends on the sequence length");
  auto blocks = std::make_shared<const BigBirdLayout>(
      bigbird_layout(config_, config.heads, config.max_tokens, config.max_tokens, true));
  const auto block = std::size_t(config_.block);
  KvCacheLayout layout;
  layout.per_head = true;  // random blocks are drawn per head
  // A prompt into an empty cache: the engine over the first N tokens of the max_tokens pattern
  // (the prompt's own forward would lay out N tokens: other last, global, blocks), chunked.
  layout.prompt_forward = [c = config_, blocks](TensorRef q, TensorRef k, TensorRef v,
                                                const Mask& mask, const TokenInputs& in,
                                                Tensor& out) {
    const Dims d = check_qkv(q, k, v);
    mask.validate(d);
    engine::check(mask, in, d);
    engine::forward(q, k, v, mask, in, d, BigBirdSparsity(c, d, *blocks), out, nullptr);
  };
  layout.pattern = [blocks, block](std::size_t h, std::size_t p, PositionRanges& out) {
    for (const std::uint32_t j : blocks->blocks(h, p / block)) {
      const std::size_t first = j * block, last = std::min((j + 1) * block, p + 1);
      if (first >= last) continue;
      if (!out.empty() && out.back().second == first)
        out.back().second = last;
      else
        out.push_back({first, last});
    }
  };
  return make_kv_cache_decoder(*this, config, std::move(layout));
}

std::unique_ptr<Attention> make_bigbird(Params& params) {
  BigBirdConfig c;
  c.block = params.integer("block", c.block);
  c.window = params.integer("window", c.window);
  c.global = params.integer("global", c.global);
  c.random = params.integer("random", c.random);
  c.seed = params.integer("seed", c.seed);
  if (c.block < 1) params.fail("block", "expected an integer >= 1");
  if (c.window < 1 || c.window % 2 == 0) params.fail("window", "expected an odd integer >= 1");
  if (c.global < 0) params.fail("global", "expected an integer >= 0");
  if (c.random < 0) params.fail("random", "expected an integer >= 0");
  if (c.seed < 0) params.fail("seed", "expected an integer >= 0");
  return std::make_unique<BigBirdAttention>(c);
}

namespace {
// Position 20 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("bigbird", make_bigbird, 20);
}  // namespace

}  // namespace attnlab
