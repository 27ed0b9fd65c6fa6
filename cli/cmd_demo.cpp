// attnlab demo: every registered variant with its default spec on one random problem, timed and
// compared on a sample of query rows with the exact fp64 reference, softmax attention; a variant
// that computes something else (Support::approximates_softmax false: retnet, gla, ...) with its
// own fp64 definition instead, and marked so. A quick look, not a benchmark (that is what
// `attnlab sweep` and the benchmarks/ binaries are for).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnlab/attnlab.hpp"
#include "cli/options.hpp"
#include "variants/recurrence_reference.hpp"

namespace attnlab::cli {
namespace {

struct DemoOptions {
  std::size_t n = 1024, heads = 8, dim = 64, rows = 64;
  std::string causal = "none";
  unsigned seed = 1;
};

Tensor random_input(const DemoOptions& o, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Tensor t = Tensor::from_shape({1, o.heads, o.n, o.dim});
  for (float& x : t) x = normal(rng);
  return t;
}

// Rows `rows` of out along the sequence axis, to compare with the sampled reference.
Tensor pick_rows(const Tensor& out, const std::vector<std::size_t>& rows) {
  const auto& s = out.shape();
  Tensor picked = Tensor::from_shape({s[0], s[1], rows.size(), s[3]});
  for (std::size_t b = 0; b < s[0]; ++b)
    for (std::size_t h = 0; h < s[1]; ++h)
      for (std::size_t r = 0; r < rows.size(); ++r)
        for (std::size_t d = 0; d < s[3]; ++d) picked(b, h, r, d) = out(b, h, rows[r], d);
  return picked;
}

void demo(const DemoOptions& o) {
  if (o.n == 0 || o.heads == 0 || o.dim == 0)
    throw Error("demo: --n, --heads and --dim must be > 0");
  const Tensor q = random_input(o, o.seed), k = random_input(o, o.seed + 1),
               v = random_input(o, o.seed + 2);
  Mask mask;
  mask.causal = parse_causal(o.causal);
  std::vector<std::size_t> rows;  // evenly spread, always including the first and last query
  const std::size_t count = std::max<std::size_t>(1, std::min(o.rows, o.n));
  for (std::size_t r = 0; r < count; ++r)
    rows.push_back(count == 1 ? 0 : r * (o.n - 1) / (count - 1));
  const Tensor64 ref = reference_attention(q, k, v, mask, rows);

  std::printf(
      "attnlab demo: B=1 H=%zu N=%zu D=%zu causal=%s, error vs fp64 reference on %zu rows\n",
      o.heads, o.n, o.dim, o.causal.c_str(), rows.size());
  std::printf("%-48s %10s  %s\n", "spec", "ms (best3)", "error");
  for (const std::string& name : attention_names()) {
    const auto attention = make_attention(name);
    try {
      double best = 1e300;
      Tensor out;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        out = attention->forward(q, k, v, mask);
        const auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      // A variant that is not softmax attention against its own definition (its numerical
      // error); its distance from softmax would say nothing of it.
      const bool own = !attention->support().approximates_softmax;
      const ErrorMetrics e =
          own ? compare(pick_rows(out, rows), own_reference(*attention, q, k, v, mask, {}, rows))
              : compare(pick_rows(out, rows), ref);
      std::printf("%-48s %10.2f  %s%s\n", attention->spec().c_str(), best, e.str().c_str(),
                  own ? " (vs its own fp64 definition: not softmax attention)" : "");
    } catch (const Unsupported& e) {
      std::printf("%-48s %10s  %s\n", attention->spec().c_str(), "-", e.what());
    }
  }
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Every variant's default spec on one random problem: time and error vs exact softmax "
      "attention (a variant that is not softmax attention: vs its own fp64 definition)");
  cmd->add_option("--n", o->n, "Sequence length")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--heads", o->heads, "Heads")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--dim", o->dim, "Head dimension")->check(kNotNegative)->capture_default_str();
  cmd->add_option("--rows", o->rows, "Query rows checked against the fp64 reference")
      ->check(kNotNegative)
      ->capture_default_str();
  cmd->add_option("--causal", o->causal, "none, top-left or bottom-right")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Input seed")->check(kNotNegative)->capture_default_str();
  cmd->callback([o] { demo(*o); });
}

}  // namespace attnlab::cli
