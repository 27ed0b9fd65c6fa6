// attnlab decode: the decode sweep (harness/decode.hpp): time per decoded token and bytes held
// as the context grows, for every causal variant, with the streaming read bandwidth of the same
// run as the yardstick, into <out>/decode.csv + meta.json (a second run resumes), then
// report.md and plots/ from the rows, and on stdout the summary of this grid (harness/summary.hpp).
//   attnlab decode --out DIR [--variant SPEC ...] [--contexts 1024..1048576] [--prefill 256,4096]
//                  [--dims 64,128] [--kv-heads 8,2] [--heads 8] [--batch 1] [--steps 32]
//                  [--reps 3] [--memory-budget BYTES] [--bandwidth-mib 1024] [--shard I/N]
//                  [--quiet]
// Shards as the sweep's: each runs the points i with i mod N = I - 1 into its own folder, and
// `attnlab merge OUT DIR...` joins them.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnlab/error.hpp"
#include "harness/config.hpp"
#include "harness/decode.hpp"
#include "harness/grid.hpp"
#include "harness/summary.hpp"

namespace attnlab::cli {
namespace {

struct DecodeFlags {
  std::string out, contexts = "1024..1048576", prefill = "256,1024,4096", dims = "64,128",
                   kv_heads = "8,2", shard;
  std::vector<std::string> variants;
  std::int64_t heads = 8, batch = 1, steps = 32, reps = 3, bandwidth_mib = 1024;
  double memory_budget = 0;
  bool quiet = false;
};

// The variants decoded by default: a KV cache, a window's ring, recurrent states.
const char* const kDefaultVariants[] = {
    "full", "sliding:left=1024,right=0", "linear", "retnet", "gla", "gated-delta"};

void run(const DecodeFlags& f) {
  harness::DecodeSweep s;
  const std::vector<std::string> given =
      f.variants.empty()
          ? std::vector<std::string>(std::begin(kDefaultVariants), std::end(kDefaultVariants))
          : f.variants;
  for (const std::string& v : given)
    for (const std::string& spec : harness::expand_spec(v)) s.specs.push_back(spec);
  s.contexts = harness::parse_int_list("--contexts", f.contexts);
  s.prefill_lengths = f.prefill == "none" ? std::vector<std::int64_t>{}
                                          : harness::parse_int_list("--prefill", f.prefill);
  s.dims = harness::parse_int_list("--dims", f.dims);
  s.kv_heads = harness::parse_int_list("--kv-heads", f.kv_heads);
  s.heads = f.heads;
  s.batch = f.batch;
  s.steps = f.steps;
  s.reps = f.reps;
  s.memory_budget_bytes = f.memory_budget;
  s.bandwidth_bytes = std::size_t(f.bandwidth_mib) << 20;
  if (!f.shard.empty()) s.shard = harness::parse_shard(f.shard);
  const std::size_t rows = harness::run_decode_sweep(f.out, s, f.quiet ? nullptr : stderr);
  std::printf("%zu rows appended to %s/decode.csv; report: %s/report.md\n", rows, f.out.c_str(),
              f.out.c_str());
  // The summary of this grid's points (a folder may hold other grids' rows too).
  const std::vector<std::string> keys = harness::decode_point_keys(s);
  const std::string csv = f.out + "/decode.csv";
  std::printf("%s",
              harness::decode_summary(f.out, harness::read_decode_results(csv, &keys)).c_str());
}

}  // namespace

void add_decode_command(CLI::App& app) {
  auto f = std::make_shared<DecodeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "decode",
      "decode sweep: time per decoded token and bytes held against context length, every causal "
      "variant (docs/decoding.md)");
  const CLI::Range positive(std::int64_t(1), std::int64_t(1) << 40, "an integer >= 1");
  cmd->add_option("--out", f->out, "results folder: decode.csv and meta.json")->required();
  cmd->add_option(
      "--variant", f->variants,
      "variant specs (repeatable; default: " + std::string("full, sliding, the linear family)"));
  cmd->add_option("--contexts", f->contexts, "contexts of the step rows: 1024..1048576 or a list");
  cmd->add_option("--prefill", f->prefill, "prompt lengths of the prefill rows, or none");
  cmd->add_option("--dims", f->dims, "head dimensions D = Dk = Dv");
  cmd->add_option("--kv-heads", f->kv_heads, "KV head counts Hkv (divisors of --heads)");
  cmd->add_option("--heads", f->heads, "query heads H")->check(positive);
  cmd->add_option("--batch", f->batch, "sequences decoded side by side")->check(positive);
  cmd->add_option("--steps", f->steps, "timed steps per burst of a step row")->check(positive);
  cmd->add_option("--reps", f->reps, "prefill rows: best of")->check(positive);
  cmd->add_option("--memory-budget", f->memory_budget,
                  "most bytes a KV cache may hold (default: half of MemAvailable)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--bandwidth-mib", f->bandwidth_mib,
                  "the bandwidth row's buffer, MiB (far past the caches)")
      ->check(positive);
  cmd->add_option(
      "--shard", f->shard,
      "run the I-th of N disjoint slices of the points: I/N (attnlab merge joins them)");
  cmd->add_flag("--quiet", f->quiet, "no progress lines");
  cmd->callback([f] { run(*f); });
}

}  // namespace attnlab::cli
