#include "variants/kv_cache.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/kernels.hpp"
#include "attnlab/kernels_table.hpp"
#include "variants/linear_scan.hpp"

namespace attnlab {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr std::size_t kPiece = 512;    // keys scored at once: 2 KiB of scores a row, in L1
constexpr std::size_t kMinPart = 256;  // keys per flash-decoding part, at least

// A run of consecutive slots holding consecutive positions: [slot, slot + count) holds
// positions [pos, pos + count).
struct Run {
  std::size_t slot, pos, count;
};

// One unit of work: item b, KV head kvh and the query heads [h0, h0 + rows) it serves.
struct Unit {
  std::size_t b, kvh, h0, rows;
};

// Some query rows' online softmax over some keys: running max m (log2 units), sum l, output
// acc (rows x Dv).
struct Partial {
  std::vector<float> m, l, acc;
  void reset(std::size_t rows, std::size_t dv) {
    m.assign(rows, kNegInf);
    l.assign(rows, 0.0f);
    acc.assign(rows * dv, 0.0f);
  }
};

class KvCacheDecoder final : public TokenDecoder {
 public:
  KvCacheDecoder(const Attention& variant, const DecodeConfig& config, KvCacheLayout layout)
      : TokenDecoder(variant, config),
        own_(make_attention(variant.spec())),
        layout_(std::move(layout)),
        group_(config.heads / config.kv()) {
    if (config.window && config.window->left >= 0) {  // keys before p - left are never read
      const auto span = static_cast<std::size_t>(config.window->left) + 1;
      layout_.ring = layout_.ring > 0 ? std::min(layout_.ring, span) : span;
    }
    if (config.softcap) cap2_ = static_cast<float>(*config.softcap) * kLog2e;
    if (layout_.ring > 0) {
      reserve(layout_.fixed + layout_.ring);
    } else if (config.max_tokens > 0) {
      reserve(config.max_tokens);
    }
  }

  std::size_t bytes() const override {
    return (keys_.size() + values_.size()) * sizeof(float) +
           (gates_.size() + gate_now_.size()) * sizeof(double);
  }

 protected:
  void do_prefill(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in,
                  const std::vector<std::size_t>& lengths, Tensor& out) override {
    const DecodeConfig& c = config_;
    const std::size_t n = q.shape()[2];
    const bool empty = std::all_of(held_.begin(), held_.end(), [](std::size_t t) { return !t; });
    std::size_t most = 0;
    for (std::size_t b = 0; b < c.batch; ++b) most = std::max(most, held_[b] + lengths[b]);
    grow(most);
    if (in.log_decay) start_gates();
    if (!empty) {
      for (std::size_t i = 0; i < n; ++i) token(q, k, v, in, n, i, lengths, out);
      return;
    }
    Mask mask;
    mask.causal = Causal::top_left;
    mask.scale = c.scale;
    mask.key_lengths.assign(lengths.begin(), lengths.end());
    mask.window = c.window;
    mask.softcap = c.softcap;
    TokenInputs with = in;
    if (!c.sinks.empty()) with.sinks = std::span<const float>(c.sinks);
    if (!c.alibi_slopes.empty()) with.alibi_slopes = std::span<const float>(c.alibi_slopes);
    if (layout_.prompt_forward)
      layout_.prompt_forward(q, k, v, mask, with, out);
    else
      own_->forward(q, k, v, mask, with, out);
    const auto heads = static_cast<std::ptrdiff_t>(c.batch * c.kv());
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t t = 0; t < heads; ++t) {
      const auto bh = static_cast<std::size_t>(t);
      const std::size_t real = lengths[bh / c.kv()];
      for (std::size_t i = 0; i < real; ++i)
        if (kept(i, real))
          append(bh, i, k.data() + (bh * n + i) * c.dk, v.data() + (bh * n + i) * c.dv);
    }
    if (!in.log_decay) return;
    for (std::size_t bh = 0; bh < c.batch * c.heads; ++bh) {
      const std::size_t real = lengths[bh / c.heads];
      for (std::size_t i = 0; i < real; ++i) {
        gate_now_[bh] += (*in.log_decay)(bh / c.heads, bh % c.heads, i);
        if (kept(i, real)) gates_[bh * slots_ + slot(i)] = gate_now_[bh];
      }
    }
  }

  void do_extend(TensorRef, TensorRef k, TensorRef v, const TokenInputs& in) override {
    const DecodeConfig& c = config_;
    const std::size_t n = k.shape()[2];
    std::size_t most = 0;
    for (std::size_t b = 0; b < c.batch; ++b) most = std::max(most, held_[b] + n);
    grow(most);
    if (in.log_decay) start_gates();
    const auto heads = static_cast<std::ptrdiff_t>(c.batch * c.kv());
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t t = 0; t < heads; ++t) {
      const auto bk = static_cast<std::size_t>(t);
      const std::size_t start = held_[bk / c.kv()];
      for (std::size_t i = 0; i < n; ++i)
        if (layout_.ring == 0 || start + i < layout_.fixed || i + layout_.ring >= n)
          append(bk, start + i, k.data() + (bk * n + i) * c.dk, v.data() + (bk * n + i) * c.dv);
    }
    if (gates_.empty()) return;
    for (std::size_t bh = 0; bh < c.batch * c.heads; ++bh)
      for (std::size_t i = 0; i < n; ++i) {
        gate_now_[bh] += in.log_decay ? (*in.log_decay)(bh / c.heads, bh % c.heads, i) : 0.0f;
        gates_[bh * slots_ + slot(held_[bh / c.heads] + i)] = gate_now_[bh];
      }
  }

  void do_step(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in, Tensor& out) override {
    std::size_t most = 0;
    for (std::size_t b = 0; b < config_.batch; ++b) most = std::max(most, held_[b] + 1);
    grow(most);
    if (in.log_decay) start_gates();
    token(q, k, v, in, 1, 0, std::vector<std::size_t>(config_.batch, 1), out);
  }

 private:
  // Token i of a call of n tokens per item (items with lengths[b] <= i sit it out): appends its
  // keys, values and gates, then its queries attend; out row i of each (item, head) written.
  void token(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in, std::size_t n,
             std::size_t i, const std::vector<std::size_t>& lengths, Tensor& out) {
    const DecodeConfig& c = config_;
    const std::size_t kv = c.kv();
    std::vector<Unit> units;
    for (std::size_t b = 0; b < c.batch; ++b) {
      if (i >= lengths[b]) continue;
      const std::size_t p = held_[b] + i;
      for (std::size_t kvh = 0; kvh < kv; ++kvh) {
        const std::size_t bk = b * kv + kvh;
        append(bk, p, k.data() + (bk * n + i) * c.dk, v.data() + (bk * n + i) * c.dv);
        if (layout_.per_head) {
          for (std::size_t g = 0; g < group_; ++g) units.push_back({b, kvh, kvh * group_ + g, 1});
        } else {
          units.push_back({b, kvh, kvh * group_, group_});
        }
      }
      if (!gates_.empty())
        for (std::size_t h = 0; h < c.heads; ++h) {
          const std::size_t bh = b * c.heads + h;
          gate_now_[bh] += in.log_decay ? (*in.log_decay)(b, h, i) : 0.0f;
          gates_[bh * slots_ + slot(p)] = gate_now_[bh];
        }
    }
    // Plan: each unit's runs of slots, split into parts when units alone would leave cores idle.
    const std::size_t threads = std::size_t(std::max(1, omp_get_max_threads()));
    struct Task {
      std::size_t unit, first, last;  // keys [first, last) of the unit's runs
    };
    std::vector<Task> tasks;
    std::vector<std::vector<Run>> runs(units.size());
    std::vector<std::vector<float>> queries(units.size());
    PositionRanges ranges;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const Unit& w = units[u];
      const std::size_t p = held_[w.b] + i;
      queries[u].resize(w.rows * c.dk);
      const auto f = static_cast<float>(*c.scale) * kLog2e;
      for (std::size_t r = 0; r < w.rows; ++r) {
        const float* row = q.data() + ((w.b * c.heads + w.h0 + r) * n + i) * c.dk;
        for (std::size_t x = 0; x < c.dk; ++x) queries[u][r * c.dk + x] = f * row[x];
      }
      plan(w.h0, p, ranges, runs[u]);
      const std::size_t keys = count(runs[u]);
      std::size_t parts = 1;
      if (units.size() < 2 * threads)
        parts = std::clamp<std::size_t>((2 * threads + units.size() - 1) / units.size(), 1,
                                        std::max<std::size_t>(1, keys / kMinPart));
      for (std::size_t x = 0; x < parts; ++x)
        tasks.push_back({u, keys * x / parts, keys * (x + 1) / parts});
    }
    std::vector<Partial> partials(tasks.size());
    const auto count_tasks = static_cast<std::ptrdiff_t>(tasks.size());
#pragma omp parallel if (count_tasks > 1)
    {
      std::vector<float> scores(group_ * kPiece), terms(kPiece);
#pragma omp for schedule(dynamic, 1)
      for (std::ptrdiff_t t = 0; t < count_tasks; ++t) {
        const Task& task = tasks[static_cast<std::size_t>(t)];
        const Unit& w = units[task.unit];
        attend(w, held_[w.b] + i, queries[task.unit].data(), runs[task.unit], task.first, task.last,
               partials[static_cast<std::size_t>(t)], scores.data(), terms.data());
      }
    }
    for (std::size_t t = 0, first = 0; t <= tasks.size(); ++t)  // merge each unit's parts
      if (t == tasks.size() || tasks[t].unit != tasks[first].unit) {
        const Unit& w = units[tasks[first].unit];
        finish(w, {partials.data() + first, t - first}, out.data(), n, i);
        first = t;
      }
  }

  // Whether position i of a prompt of `real` tokens into an empty cache stays in it.
  bool kept(std::size_t i, std::size_t real) const {
    return layout_.ring == 0 || i < layout_.fixed || i + layout_.ring >= real;
  }

  std::size_t slot(std::size_t p) const {
    if (layout_.ring == 0 || p < layout_.fixed) return p;
    return layout_.fixed + (p - layout_.fixed) % layout_.ring;
  }

  // Storage for `slots` slots per head, keeping what is held.
  void reserve(std::size_t slots) {
    const DecodeConfig& c = config_;
    resize_slots(keys_, c.batch * c.kv(), c.dk, slots);
    resize_slots(values_, c.batch * c.kv(), c.dv, slots);
    if (!gates_.empty()) resize_slots(gates_, c.batch * c.heads, 1, slots);
    slots_ = slots;
  }

  // data [heads, slots_, width] -> [heads, slots, width], keeping what fits.
  template <class T>
  void resize_slots(std::vector<T>& data, std::size_t heads, std::size_t width,
                    std::size_t slots) const {
    std::vector<T> fresh(heads * slots * width);
    if (!data.empty())
      for (std::size_t h = 0; h < heads; ++h)
        std::copy_n(data.data() + h * slots_ * width, std::min(slots_, slots) * width,
                    fresh.data() + h * slots * width);
    data.swap(fresh);
  }

  // Room for `positions` positions per head: the cache doubles (a ring never grows).
  void grow(std::size_t positions) {
    if (layout_.ring > 0 || positions <= slots_) return;
    reserve(std::max({positions, 2 * slots_, std::size_t(64)}));
  }

  // The forgetting gate's sums, from the first call that gives g (before it, g was 0).
  void start_gates() {
    if (!gates_.empty()) return;
    gates_.assign(config_.batch * config_.heads * slots_, 0.0);
    gate_now_.assign(config_.batch * config_.heads, 0.0);
  }

  void append(std::size_t bk, std::size_t p, const float* k, const float* v) {
    const DecodeConfig& c = config_;
    const std::size_t s = slot(p);
    std::copy_n(k, c.dk, keys_.data() + (bk * slots_ + s) * c.dk);
    std::copy_n(v, c.dv, values_.data() + (bk * slots_ + s) * c.dv);
  }

  // The runs of slots the query of head h at position p reads: the pattern within the window.
  void plan(std::size_t h, std::size_t p, PositionRanges& ranges, std::vector<Run>& runs) const {
    ranges.clear();
    runs.clear();
    layout_.pattern(h, p, ranges);
    std::size_t lowest = 0;
    if (config_.window && config_.window->left >= 0 &&
        p > static_cast<std::size_t>(config_.window->left))
      lowest = p - static_cast<std::size_t>(config_.window->left);
    for (auto [first, last] : ranges) {
      first = std::max(first, lowest);
      while (first < last) {  // split where the ring wraps
        const std::size_t s = slot(first);
        std::size_t run = last - first;
        if (layout_.ring > 0 && first >= layout_.fixed)
          run = std::min(run, layout_.fixed + layout_.ring - s);
        runs.push_back({s, first, run});
        first += run;
      }
    }
  }

  static std::size_t count(const std::vector<Run>& runs) {
    std::size_t n = 0;
    for (const Run& r : runs) n += r.count;
    return n;
  }

  // The online softmax of unit w's queries qs (rows x Dk, scaled to log2 units) at position p
  // over keys [first, last) of `runs`, into `part`.
  void attend(const Unit& w, std::size_t p, const float* qs, const std::vector<Run>& runs,
              std::size_t first, std::size_t last, Partial& part, float* scores,
              float* terms) const {
    const DecodeConfig& c = config_;
    part.reset(w.rows, c.dv);
    const std::size_t bk = w.b * c.kv() + w.kvh;
    const float* keys = keys_.data() + bk * slots_ * c.dk;
    const float* values = values_.data() + bk * slots_ * c.dv;
    const bool mods = cap2_ > 0 || !gates_.empty() || !c.alibi_slopes.empty();
    std::size_t at = 0;  // keys of the runs before this one
    for (const Run& run : runs) {
      const std::size_t from = std::max(first, at), to = std::min(last, at + run.count);
      for (std::size_t j0 = from; j0 < to; j0 += kPiece) {
        const std::size_t cols = std::min(kPiece, to - j0), s0 = run.slot + (j0 - at),
                          pos0 = run.pos + (j0 - at);
        kernels::row_dots(w.rows, cols, c.dk, qs, keys + s0 * c.dk, scores, kPiece);
        for (std::size_t r = 0; r < w.rows; ++r) {
          float* row = scores + r * kPiece;
          if (mods) modify(w.b, w.h0 + r, p, s0, pos0, cols, row, terms);
          const float top = kernels::row_max(row, cols);
          float& m = part.m[r];
          if (top > m) {
            const float f = m == kNegInf ? 0.0f : std::exp2(m - top);
            part.l[r] *= f;
            for (std::size_t x = 0; x < c.dv; ++x) part.acc[r * c.dv + x] *= f;
            m = top;
          }
          if (m == kNegInf) {
            std::fill(row, row + cols, 0.0f);
          } else {
            part.l[r] += kernels::exp2_shifted_sum(row, cols, m);
          }
        }
        kernels::gemm_tile(w.rows, c.dv, cols, scores, kPiece, values + s0 * c.dv, c.dv,
                           part.acc.data(), c.dv, true);
      }
      at += run.count;
    }
  }

  // The score modifiers on one row of `cols` scores (log2 units) of query head h at position p
  // against positions pos0 + c in slots s0 + c, as the engine's forward applies them.
  void modify(std::size_t b, std::size_t h, std::size_t p, std::size_t s0, std::size_t pos0,
              std::size_t cols, float* row, float* terms) const {
    const DecodeConfig& c = config_;
    kernels::detail::ScoreMods m{};
    m.cap = cap2_;
    float row_add = 0.0f;
    if (!gates_.empty()) {  // F_p - F_j as (F_p - F_pos0) + (F_pos0 - F_j): small in float
      const std::size_t bh = b * c.heads + h;
      const double* f = gates_.data() + bh * slots_;
      const double base = f[s0];
      row_add = static_cast<float>((gate_now_[bh] - base) * kLog2e);
      for (std::size_t x = 0; x < cols; ++x)
        terms[x] = static_cast<float>((base - f[s0 + x]) * kLog2e);
      m.row_add = &row_add;
      m.col_add = terms;
    }
    const float position = static_cast<float>(p);
    if (!c.alibi_slopes.empty()) {
      m.slope = c.alibi_slopes[h] * kLog2e;
      m.row_pos = &position;
      m.col_pos = static_cast<float>(pos0);
      m.col_step = 1.0f;
    }
    kernels::score_mods(m, row, kPiece, 1, cols);
  }

  // Merges unit w's parts (and each head's sink) into output row i of n of its query heads:
  // zeros for a row that saw no key.
  void finish(const Unit& w, std::span<const Partial> parts, float* out, std::size_t n,
              std::size_t i) const {
    const DecodeConfig& c = config_;
    for (std::size_t r = 0; r < w.rows; ++r) {
      const std::size_t h = w.h0 + r;
      float* o = out + ((w.b * c.heads + h) * n + i) * c.dv;
      const float sink = c.sinks.empty() ? kNegInf : c.sinks[h] * kLog2e;
      float top = sink;
      for (const Partial& part : parts) top = std::max(top, part.m[r]);
      std::fill(o, o + c.dv, 0.0f);
      if (top == kNegInf) continue;
      float total = sink == kNegInf ? 0.0f : std::exp2(sink - top);  // the sink adds no value
      for (const Partial& part : parts) {
        if (part.m[r] == kNegInf) continue;
        const float f = std::exp2(part.m[r] - top);
        total += f * part.l[r];
        for (std::size_t x = 0; x < c.dv; ++x) o[x] += f * part.acc[r * c.dv + x];
      }
      for (std::size_t x = 0; x < c.dv; ++x) o[x] /= total;
    }
  }

  std::unique_ptr<Attention> own_;  // made from the spec: the decoder outlives its maker
  KvCacheLayout layout_;
  std::size_t group_;  // query heads per KV head
  float cap2_ = 0.0f;  // softcap in log2 units; 0: none
  std::size_t slots_ = 0;
  std::vector<float> keys_, values_;      // [B·Hkv, slots, Dk], [B·Hkv, slots, Dv]
  std::vector<double> gates_, gate_now_;  // F [B·H, slots] at each held position, and now
};

}  // namespace

std::unique_ptr<TokenDecoder> make_kv_cache_decoder(const Attention& variant,
                                                    const DecodeConfig& config,
                                                    KvCacheLayout layout) {
  return std::make_unique<KvCacheDecoder>(variant, config, std::move(layout));
}

}  // namespace attnlab
