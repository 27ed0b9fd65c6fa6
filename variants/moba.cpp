#include "variants/moba.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "attnlab/error.hpp"
#include "attnlab/softmax_engine.hpp"

namespace attnlab {
namespace {

using Index = std::int64_t;

std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

void check_config(const MobaConfig& c) {
  if (c.block < 1) throw Error("moba: block=" + std::to_string(c.block) + ": expected >= 1");
  if (c.topk < 1) throw Error("moba: topk=" + std::to_string(c.topk) + ": expected >= 1");
}

// Each block's mean key over its valid keys, in float64: [B, Hkv, blocks, Dk]. A block without
// a valid key keeps zeros (it is never a candidate).
std::vector<double> block_means(TensorRef k, const Mask& mask, std::size_t block,
                                std::size_t blocks) {
  const std::size_t batch = k.shape(0), kv = k.shape(1), nk = k.shape(2), dk = k.shape(3);
  std::vector<double> means(batch * kv * blocks * dk, 0.0);
#pragma omp parallel for schedule(static) if (batch * kv * nk * dk > (1 << 16))
  for (std::ptrdiff_t s = 0; s < static_cast<std::ptrdiff_t>(batch * kv); ++s) {
    const auto bk = static_cast<std::size_t>(s);
    const std::size_t valid = mask.valid_keys(bk / kv, nk);
    for (std::size_t j = 0; j < blocks; ++j) {
      double* mean = means.data() + (bk * blocks + j) * dk;
      const std::size_t lo = j * block, hi = std::min(valid, lo + block);
      if (lo >= hi) continue;
      for (std::size_t t = lo; t < hi; ++t)
        for (std::size_t c = 0; c < dk; ++c) mean[c] += k(bk / kv, bk % kv, t, c);
      for (std::size_t c = 0; c < dk; ++c) mean[c] /= static_cast<double>(hi - lo);
    }
  }
  return means;
}

}  // namespace

std::span<const std::uint32_t> MobaSelection::blocks(std::size_t b, std::size_t h,
                                                     std::size_t i) const {
  const std::size_t row = (b * heads + h) * nq + i;
  return {blocks_.data() + row * topk, counts_[row]};
}

bool MobaSelection::selects(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
  const auto row = blocks(b, h, i);
  return std::binary_search(row.begin(), row.end(), static_cast<std::uint32_t>(j / block));
}

MobaSelection moba_selection(const MobaConfig& config, TensorRef q, TensorRef k, const Mask& mask) {
  check_config(config);
  const Dims d{q.shape(0), q.shape(1), q.shape(2), k.shape(2), q.shape(3), q.shape(3), k.shape(1)};
  MobaSelection s;
  s.block = static_cast<std::size_t>(std::min<std::int64_t>(config.block, 1 << 30));
  s.heads = d.heads;
  s.nq = d.nq;
  const std::size_t blocks = std::max<std::size_t>(ceil_div(d.nk, s.block), 1);
  s.topk = static_cast<std::size_t>(std::min<std::int64_t>(config.topk, Index(blocks)));
  s.blocks_.assign(d.batch * d.heads * d.nq * s.topk, 0);
  s.counts_.assign(d.batch * d.heads * d.nq, 0);
  const std::vector<double> means = block_means(k, mask, s.block, blocks);
  const bool causal = mask.causal != Causal::none;
  const auto rows = static_cast<std::ptrdiff_t>(d.batch * d.heads * d.nq);
#pragma omp parallel
  {
    std::vector<std::pair<double, std::uint32_t>> scored;  // (-score, block): best first
#pragma omp for schedule(static)
    for (std::ptrdiff_t row = 0; row < rows; ++row) {
      const auto r = static_cast<std::size_t>(row);
      const std::size_t b = r / (d.heads * d.nq), h = r / d.nq % d.heads, i = r % d.nq;
      const std::size_t valid = mask.valid_keys(b, d.nk);
      const Index p = mask.position(i, d);
      const bool has_own = p >= 0 && p < static_cast<Index>(d.nk);
      const std::size_t own = has_own ? static_cast<std::size_t>(p) / s.block : blocks;
      std::uint32_t* out = s.blocks_.data() + r * s.topk;
      std::uint32_t& count = s.counts_[r];
      if (has_own) out[count++] = static_cast<std::uint32_t>(own);
      scored.clear();
      const double* head_means = means.data() + (b * d.kv() + d.kv_head(h)) * blocks * d.dk;
      for (std::size_t j = 0; j < blocks; ++j) {
        if (j == own || j * s.block >= valid) continue;
        const Index last = static_cast<Index>(std::min(d.nk, (j + 1) * s.block)) - 1;
        if (causal && last > p) continue;  // a future block is never a candidate
        double score = 0;
        for (std::size_t c = 0; c < d.dk; ++c)
          score += double(q(b, h, i, c)) * head_means[j * d.dk + c];
        scored.emplace_back(-score, static_cast<std::uint32_t>(j));
      }
      const std::size_t keep = std::min(s.topk - count, scored.size());
      std::partial_sort(scored.begin(), scored.begin() + Index(keep), scored.end());
      for (std::size_t x = 0; x < keep; ++x) out[count++] = scored[x].second;
      std::sort(out, out + count);
    }
  }
  return s;
}

namespace {

// The sparsity the engine runs: row tiles inside each block of key positions (the last, the
// heaviest under a causal mask, first); a tile reads every block one of its rows selected, as a
// run whose rows that did not select it see none of its keys.
class MobaSparsity final : public engine::Sparsity {
 public:
  MobaSparsity(const MobaConfig& c, TensorRef q, TensorRef k, const Mask& mask, const Dims& d)
      : selection_(moba_selection(c, q, k, mask)), nk_(d.nk), offset_(mask.position(0, d)) {}

  std::vector<engine::QueryTile> tiles(const Dims& d, const Mask&,
                                       std::size_t max_rows) const override {
    const auto block = static_cast<Index>(selection_.block);
    std::vector<engine::QueryTile> tiles;
    for (std::size_t i0 = 0; i0 < d.nq;) {
      // The next block boundary of the key positions p(i) = i + offset.
      const Index p0 = static_cast<Index>(i0) + offset_;
      const Index next = p0 < 0 ? -offset_ : (p0 / block + 1) * block - offset_;
      const std::size_t end = std::min({d.nq, i0 + max_rows, static_cast<std::size_t>(next)});
      tiles.push_back({i0, 1, end - i0});
      i0 = end;
    }
    std::reverse(tiles.begin(), tiles.end());
    return tiles;
  }

  void runs(const engine::KeyLayout&, std::size_t b, std::size_t h, const engine::QueryTile& t,
            std::vector<engine::KeyRun>& runs) const override {
    thread_local std::vector<std::uint32_t> chosen;  // the union of the rows' blocks
    chosen.clear();
    for (std::size_t r = 0; r < t.rows; ++r)
      for (const std::uint32_t j : selection_.blocks(b, h, t.first + r)) chosen.push_back(j);
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
    for (const std::uint32_t j : chosen) {
      engine::KeyRun& run = runs.emplace_back();
      run.t0 = static_cast<Index>(j * selection_.block);
      run.t1 = static_cast<Index>(std::min(nk_, (j + 1) * selection_.block));
      run.limited = true;
      for (std::size_t r = 0; r < t.rows; ++r) {
        const auto row = selection_.blocks(b, h, t.first + r);
        const bool selected = std::binary_search(row.begin(), row.end(), j);
        run.lo[r] = run.t0;
        run.hi[r] = selected ? run.t1 : run.t0;
      }
    }
  }

 private:
  MobaSelection selection_;
  std::size_t nk_;
  Index offset_;  // p(i) - i
};

}  // namespace

MobaAttention::MobaAttention(const MobaConfig& config) : config_(config) {
  check_config(config_);
}

std::string MobaAttention::spec() const {
  return SpecWriter("moba").add("block", config_.block).add("topk", config_.topk).str();
}

Support MobaAttention::support() const {
  Support s = Support::softmax_engine();
  s.documents = false;
  return s;
}

std::string MobaAttention::why_unsupported(const std::string& feature) const {
  if (feature == "packed documents")
    return "MoBA's blocks would restart at each document (the paper's varlen form), which is "
           "not implemented";
  return {};
}

double MobaAttention::flops(const Dims& d, const Mask& mask) const {
  const auto block = static_cast<std::size_t>(config_.block);
  const bool causal = mask.causal != Causal::none;
  double pairs = 0;  // of one head, summed over the batch
  for (std::size_t b = 0; b < d.batch; ++b) {
    const std::size_t valid = mask.valid_keys(b, d.nk);
    for (std::size_t i = 0; i < d.nq; ++i) {
      const std::size_t visible = mask.visible_keys(b, i, d);  // causal and padding
      const Index p = mask.position(i, d);
      const bool has_own = p >= 0 && p < static_cast<Index>(d.nk);
      const std::size_t own = has_own ? static_cast<std::size_t>(p) / block : 0;
      double own_keys = 0;
      if (has_own && visible > own * block)
        own_keys = double(std::min(visible, (own + 1) * block) - own * block);
      // Candidates: blocks with a valid key (the first `reach`), under a causal mask only those
      // wholly at or before p.
      std::size_t reach = ceil_div(valid, block);
      if (causal) {
        const std::size_t before =
            p < 0 ? 0 : (p >= Index(d.nk) - 1 ? ceil_div(d.nk, block) : std::size_t(p + 1) / block);
        reach = std::min(reach, before);
      }
      const std::size_t candidates = reach - (has_own && own < reach ? 1 : 0);
      const std::size_t picks =
          std::min(static_cast<std::size_t>(config_.topk) - (has_own ? 1 : 0), candidates);
      pairs += own_keys + double(picks * block);
    }
  }
  return 2.0 * pairs * double(d.heads) * double(d.dk + d.dv);
}

void MobaAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                            const TokenInputs& in, const Dims& d, Tensor& out, Saved* saved) const {
  engine::forward(q, k, v, mask, in, d, MobaSparsity(config_, q, k, mask, d), out,
                  saved_lse(saved, d));
}

void MobaAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                     const TokenInputs& in, const Dims& d, TensorRef out,
                                     TensorRef d_out, const Saved& saved, AllGradients& g) const {
  RowLogSumExp storage;
  const RowLogSumExp& lse = lse_or_recompute(q, k, v, mask, in, d, saved, storage);
  engine::backward(q, k, v, mask, in, d, MobaSparsity(config_, q, k, mask, d), out, d_out, lse, g);
}

std::unique_ptr<Attention> make_moba(Params& params) {
  MobaConfig c;
  c.block = params.integer("block", c.block);
  c.topk = params.integer("topk", c.topk);
  if (c.block < 1) params.fail("block", "expected an integer >= 1");
  if (c.topk < 1) params.fail("topk", "expected an integer >= 1 (the own block counts as one)");
  return std::make_unique<MobaAttention>(c);
}

namespace {
// Position 45 in attention_names() and the --help listing: after sliding, the block-sparse
// softmax variants together.
const AttentionRegistrar kRegistrar("moba", make_moba, 45);
}  // namespace

}  // namespace attnlab
