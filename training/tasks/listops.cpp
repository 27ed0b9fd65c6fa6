// listops: Long Range Arena ListOps (training/tasks.hpp has the definition).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "training/tasks/task_kit.hpp"

namespace attnlab::training {
namespace {

using detail::bounded;
using detail::empty_batch;
using detail::Random;

// ListOps token ids.
enum : std::int64_t {
  kPad = 0,
  kDigit0 = 1,
  kMin = 11,
  kMax = 12,
  kMed = 13,
  kSumMod = 14,
  kEnd = 15
};

class ListOps final : public Task {
 public:
  ListOps(Params& p, std::size_t n) : n_(n) {
    max_len_ = bounded(p, "max_len", std::int64_t(n), 3, std::int64_t(n));
    min_len_ = bounded(p, "min_len", std::int64_t(max_len_ / 4), 0, std::int64_t(max_len_) - 2);
    depth_ = bounded(p, "depth", 10, 2, 64);
    args_ = bounded(p, "args", 10, 2, 64);
  }
  std::string spec() const override {
    return SpecWriter("listops")
        .add("max_len", std::int64_t(max_len_))
        .add("min_len", std::int64_t(min_len_))
        .add("depth", std::int64_t(depth_))
        .add("args", std::int64_t(args_))
        .str();
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
      case kMin:
        return values.front();
      case kMax:
        return values.back();
      case kMed:  // int(np.median(values)): the mean of the middle two, truncated
        return m % 2 ? values[m / 2] : (values[m / 2 - 1] + values[m / 2]) / 2;
      default:
        return std::accumulate(values.begin(), values.end(), 0) % 10;
    }
  }

  std::size_t n_, max_len_, min_len_, depth_, args_;
};

std::unique_ptr<Task> make_listops(Params& p, std::size_t n) {
  return std::make_unique<ListOps>(p, n);
}

const Registrar<TaskMaker> kRegistrar(
    task_registry(), "listops", {make_listops, "max_len=N,min_len=max_len/4,depth=10,args=10"}, 20);

}  // namespace

const std::vector<std::string>& listops_tokens() {
  static const std::vector<std::string> names = {"<pad>", "0",    "1",   "2", "3", "4",
                                                 "5",     "6",    "7",   "8", "9", "[MIN",
                                                 "[MAX",  "[MED", "[SM", "]"};
  return names;
}

}  // namespace attnlab::training
