#include "training/tasks.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/seed.hpp"

namespace attnlab::training {
namespace {

// A batch's random stream: splitmix64 of the seed, then mt19937_64, whose output is the same on
// every platform; draws below use only its raw 64-bit output, not std's distributions (whose
// algorithms differ between standard libraries).
class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(stream_seed(seed)) {}
  /// Uniform in [0, k), k >= 1.
  std::size_t below(std::size_t k) { return static_cast<std::size_t>(unit() * double(k)); }
  /// Uniform in [0, 1).
  double unit() { return double(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

// The integer value of `key` (or `fallback`), which must lie in [lo, hi].
std::size_t bounded(Params& p, const std::string& key, std::int64_t fallback, std::int64_t lo,
                    std::int64_t hi) {
  const std::int64_t v = p.integer(key, fallback);
  if (v < lo || v > hi)
    p.fail(key, "expected " + std::to_string(lo) + " <= " + key + " <= " + std::to_string(hi));
  return static_cast<std::size_t>(v);
}

Batch empty_batch(std::size_t size, std::size_t n, std::size_t target_columns) {
  Batch b;
  b.tokens = models::Tokens::from_shape({size, n});
  b.targets = models::Tokens::from_shape({size, target_columns});
  b.targets.fill(kNoTarget);
  b.lengths.assign(size, static_cast<std::int64_t>(n));
  return b;
}

// `count` distinct values of [0, range) drawn in turn with probability proportional to
// weight[i] among those left: numpy's choice(replace=False, p=...), which Zoology uses.
std::vector<std::size_t> draw_without_replacement(std::vector<double> weight, std::size_t count,
                                                  Random& rng) {
  std::vector<std::size_t> drawn;
  double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  for (std::size_t c = 0; c < count; ++c) {
    double r = rng.unit() * total;
    std::size_t i = 0;
    while (i + 1 < weight.size() && (weight[i] == 0 || r >= weight[i])) r -= weight[i++];
    drawn.push_back(i);
    total -= weight[i];
    weight[i] = 0;
  }
  return drawn;
}

class Mqar final : public Task {
 public:
  Mqar(Params& p, std::size_t n) : n_(n) {
    const auto most = static_cast<std::int64_t>(n / 4);
    pairs_ = bounded(p, "pairs", std::max<std::int64_t>(1, most / 4), 1, std::max<std::int64_t>(1, most));
    vocab_ = bounded(p, "vocab", 256, 6, 65536);
    if (4 * pairs_ > n) p.fail("pairs", "expected 4 * pairs <= N = " + std::to_string(n));
    if (pairs_ > vocab_ / 2 - 1)
      p.fail("vocab", "expected vocab / 2 - 1 >= pairs = " + std::to_string(pairs_) +
                          " (distinct keys from [1, vocab / 2))");
  }
  std::string spec() const override {
    return SpecWriter("mqar").add("pairs", std::int64_t(pairs_)).add("vocab", std::int64_t(vocab_)).str();
  }
  std::size_t vocab() const override { return vocab_; }
  std::size_t classes() const override { return vocab_; }
  Output output() const override { return Output::per_token; }
  std::size_t length() const override { return n_; }

  Batch batch(std::size_t size, std::uint64_t seed) const override {
    Random rng(seed);
    Batch b = empty_batch(size, n_, n_);
    const std::size_t half = vocab_ / 2, context = 2 * pairs_, space = (n_ - context) / 2;
    std::vector<double> power(space);
    for (std::size_t g = 0; g < space; ++g) power[g] = std::pow(double(g + 1), 0.01 - 1.0);
    std::vector<double> key_weight(half - 1, 1.0), value_weight(vocab_ - half, 1.0);
    for (std::size_t e = 0; e < size; ++e) {
      std::int64_t* x = &b.tokens(e, 0);
      std::int64_t* y = &b.targets(e, 0);
      const auto keys = draw_without_replacement(key_weight, pairs_, rng);
      const auto values = draw_without_replacement(value_weight, pairs_, rng);
      const auto gaps = draw_without_replacement(power, pairs_, rng);
      std::vector<bool> is_key(vocab_, false);
      for (std::size_t k : keys) is_key[1 + k] = true;
      for (std::size_t i = 0; i < n_; ++i) {
        std::size_t t = rng.below(vocab_);
        while (is_key[t]) t = rng.below(vocab_);  // one answer per query (see the header)
        x[i] = static_cast<std::int64_t>(t);
      }
      for (std::size_t i = 0; i < pairs_; ++i) {
        const auto key = static_cast<std::int64_t>(1 + keys[i]);
        const auto value = static_cast<std::int64_t>(half + values[i]);
        x[2 * i] = key;
        x[2 * i + 1] = value;
        x[context + 2 * gaps[i]] = key;
        y[context + 2 * gaps[i]] = value;
      }
    }
    return b;
  }

 private:
  std::size_t n_, pairs_, vocab_;
};

// ListOps token ids.
enum : std::int64_t { kPad = 0, kDigit0 = 1, kMin = 11, kMax = 12, kMed = 13, kSumMod = 14, kEnd = 15 };

class ListOps final : public Task {
 public:
  ListOps(Params& p, std::size_t n) : n_(n) {
    max_len_ = bounded(p, "max_len", std::int64_t(n), 3, std::int64_t(n));
    min_len_ = bounded(p, "min_len", std::int64_t(max_len_ / 4), 0, std::int64_t(max_len_) - 2);
    depth_ = bounded(p, "depth", 10, 2, 64);
    args_ = bounded(p, "args", 10, 2, 64);
  }
  std::string spec() const override {
    return SpecWriter("listops").add("max_len", std::int64_t(max_len_))
        .add("min_len", std::int64_t(min_len_)).add("depth", std::int64_t(depth_))
        .add("args", std::int64_t(args_)).str();
  }
  std::size_t vocab() const override { return 16; }
  std::size_t classes() const override { return 10; }
  Output output() const override { return Output::per_sequence; }
  std::size_t length() const override { return n_; }

  Batch batch(std::size_t size, std::uint64_t seed) const override {
    Random rng(seed);
    Batch b = empty_batch(size, n_, 1);
    std::vector<std::int64_t> tokens;
    for (std::size_t e = 0; e < size; ++e) {
      int value = -1;
      do {  // LRA's rejection loop; a tree is abandoned as soon as it reaches max_len
        tokens.clear();
        value = tree(1, rng, tokens);
      } while (value < 0 || tokens.size() <= min_len_);
      std::copy(tokens.begin(), tokens.end(), &b.tokens(e, 0));
      std::fill(&b.tokens(e, 0) + tokens.size(), &b.tokens(e, 0) + n_, kPad);
      b.targets(e, 0) = value;
      b.lengths[e] = static_cast<std::int64_t>(tokens.size());
    }
    return b;
  }

 private:
  // LRA's generate_tree(depth): appends the tokens of one (sub)tree and returns its value, or -1
  // once the sequence has reached max_len (such a tree is rejected whatever follows, so giving
  // up early changes only the time, not the distribution).
  int tree(std::size_t depth, Random& rng, std::vector<std::int64_t>& out) const {
    if (out.size() >= max_len_) return -1;
    const double r = depth < depth_ ? rng.unit() : 1.0;
    if (r > 0.25) {
      const int digit = static_cast<int>(rng.below(10));
      out.push_back(kDigit0 + digit);
      return digit;
    }
    const std::size_t count = 2 + rng.below(args_ - 1);  // randint(2, args)
    std::vector<int> values;
    const std::size_t op_at = out.size();
    out.push_back(kPad);  // the operator, drawn after its children as LRA does
    for (std::size_t i = 0; i < count; ++i) {
      const int v = tree(depth + 1, rng, out);
      if (v < 0) return -1;
      values.push_back(v);
    }
    const std::int64_t op = kMin + static_cast<std::int64_t>(rng.below(4));
    out[op_at] = op;
    out.push_back(kEnd);
    if (out.size() >= max_len_) return -1;
    std::sort(values.begin(), values.end());
    const std::size_t m = values.size();
    switch (op) {
      case kMin: return values.front();
      case kMax: return values.back();
      case kMed:  // int(np.median(values)): the mean of the middle two, truncated
        return m % 2 ? values[m / 2] : (values[m / 2 - 1] + values[m / 2]) / 2;
      default: return std::accumulate(values.begin(), values.end(), 0) % 10;
    }
  }

  std::size_t n_, max_len_, min_len_, depth_, args_;
};

class Copy final : public Task {
 public:
  Copy(Params& p, std::size_t n) : n_(n) {
    vocab_ = bounded(p, "vocab", 10, 3, 65536);
    if (n < 3) throw Error("copy: N = " + std::to_string(n) + ": expected N >= 3");
  }
  std::string spec() const override { return SpecWriter("copy").add("vocab", std::int64_t(vocab_)).str(); }
  std::size_t vocab() const override { return vocab_; }
  std::size_t classes() const override { return vocab_; }
  Output output() const override { return Output::per_token; }
  std::size_t length() const override { return n_; }

  Batch batch(std::size_t size, std::uint64_t seed) const override {
    Random rng(seed);
    Batch b = empty_batch(size, n_, n_);
    const std::size_t m = (n_ - 1) / 2;
    for (std::size_t e = 0; e < size; ++e) {
      std::int64_t* x = &b.tokens(e, 0);
      std::fill(x, x + n_, 0);
      x[m] = 1;
      for (std::size_t i = 0; i < m; ++i) {
        x[i] = static_cast<std::int64_t>(2 + rng.below(vocab_ - 2));
        b.targets(e, m + 1 + i) = x[i];
      }
    }
    return b;
  }

 private:
  std::size_t n_, vocab_;
};

}  // namespace

std::unique_ptr<Task> make_task(std::string_view spec, std::size_t n) {
  Params p(spec);
  if (n == 0) throw Error("task '" + p.spec() + "': N = 0: expected N >= 1");
  std::unique_ptr<Task> task;
  if (p.name() == "mqar") task = std::make_unique<Mqar>(p, n);
  else if (p.name() == "listops") task = std::make_unique<ListOps>(p, n);
  else if (p.name() == "copy") task = std::make_unique<Copy>(p, n);
  else throw Error("unknown task '" + p.name() + "' in '" + p.spec() + "' (tasks: mqar, listops, copy)");
  p.check_all_used();
  return task;
}

std::vector<std::string> task_names() { return {"mqar", "listops", "copy"}; }

const std::vector<std::string>& listops_tokens() {
  static const std::vector<std::string> names = {"<pad>", "0", "1", "2", "3", "4", "5", "6", "7",
                                                 "8", "9", "[MIN", "[MAX", "[MED", "[SM", "]"};
  return names;
}

}  // namespace attnlab::training
