// mqar: multi-query associative recall (training/tasks.hpp has the definition).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "training/tasks/task_kit.hpp"

namespace attnlab::training {
namespace {

using detail::bounded;
using detail::empty_batch;
using detail::Random;

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
    pairs_ = bounded(p, "pairs", std::max<std::int64_t>(1, most / 4), 1,
                     std::max<std::int64_t>(1, most));
    vocab_ = bounded(p, "vocab", 256, 6, 65536);
    if (4 * pairs_ > n) p.fail("pairs", "expected 4 * pairs <= N = " + std::to_string(n));
    if (pairs_ > vocab_ / 2 - 1)
      p.fail("vocab", "expected vocab / 2 - 1 >= pairs = " + std::to_string(pairs_) +
                          " (distinct keys from [1, vocab / 2))");
  }
  std::string spec() const override {
    return SpecWriter("mqar")
        .add("pairs", std::int64_t(pairs_))
        .add("vocab", std::int64_t(vocab_))
        .str();
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

std::unique_ptr<Task> make_mqar(Params& p, std::size_t n) {
  return std::make_unique<Mqar>(p, n);
}

const Registrar<TaskMaker> kRegistrar(task_registry(), "mqar", {make_mqar, "pairs=N/16,vocab=256"},
                                      10);

}  // namespace

}  // namespace attnlab::training
