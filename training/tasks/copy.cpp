// copy: the copy task (training/tasks.hpp has the definition).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "training/tasks/task_kit.hpp"

namespace attnlab::training {
namespace {

using detail::bounded;
using detail::empty_batch;
using detail::Random;

class Copy final : public Task {
 public:
  Copy(Params& p, std::size_t n) : n_(n) {
    vocab_ = bounded(p, "vocab", 10, 3, 65536);
    if (n < 3)
      throw Error("task '" + p.spec() + "': N = " + std::to_string(n) + ": expected N >= 3");
  }
  std::string spec() const override {
    return SpecWriter("copy").add("vocab", std::int64_t(vocab_)).str();
  }
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

std::unique_ptr<Task> make_copy(Params& p, std::size_t n) {
  return std::make_unique<Copy>(p, n);
}

const Registrar<TaskMaker> kRegistrar(task_registry(), "copy", {make_copy, "vocab=10"}, 30);

}  // namespace

}  // namespace attnlab::training
