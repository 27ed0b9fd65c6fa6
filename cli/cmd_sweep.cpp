// attnlab sweep: runs a grid of (variant spec x N x batch x heads x dim x causal x mask x dtype x
// input x seed) into runs/<name>/rows.csv + meta.json, then renders its report and prints a summary
// beside the committed reference run in results/<name>/. The engine is in harness/sweep.hpp; the
// config format, columns and commands are in docs/sweep.md.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnlab/error.hpp"
#include "harness/config.hpp"
#include "harness/mask_spec.hpp"
#include "harness/mpi.hpp"
#include "harness/report.hpp"
#include "harness/summary.hpp"
#include "harness/sweep.hpp"

namespace attnlab::cli {
namespace {

using namespace attnlab::harness;

struct SweepFlags {
  std::string config, name, out, n, batch, heads, dim, seed, causal, dtype, shard;
  std::vector<std::string> variants, inputs, masks;
  int reps = 0, warmup = -1;
  double target_seconds = 0, memory_budget = 0;
  std::int64_t error_rows = 0;
  bool peers = false, mpi = false, quiet = false, dry_run = false, restart = false,
       retry_errors = false, no_report = false;
};

SweepConfig build_config(const SweepFlags& f) {
  SweepConfig c = f.config.empty() ? default_config() : load_config(f.config);
  if (!f.name.empty()) c.name = f.name;
  if (!f.variants.empty()) {
    c.specs.clear();
    c.max_n.clear();
    for (const auto& v : f.variants) {
      try {
        for (const auto& s : expand_spec(v))
          if (std::find(c.specs.begin(), c.specs.end(), s) == c.specs.end()) c.specs.push_back(s);
      } catch (const Error& e) {
        throw Error(std::string("--variant: ") + e.what());
      }
    }
  }
  if (!f.n.empty()) c.n = parse_int_list("--n", f.n);
  if (!f.batch.empty()) c.batch = parse_int_list("--batch", f.batch);
  if (!f.heads.empty()) c.heads = parse_int_list("--heads", f.heads);
  if (!f.dim.empty()) c.dim = parse_int_list("--dim", f.dim);
  if (!f.seed.empty()) c.seed = parse_int_list("--seed", f.seed);
  if (!f.causal.empty()) c.causal = parse_causal_list("--causal", f.causal);
  if (!f.dtype.empty()) c.dtype = parse_dtype_list("--dtype", f.dtype);
  if (!f.masks.empty()) {
    c.mask.clear();
    for (const auto& m : f.masks)
      for (const auto& x : parse_mask_list("--mask", m))
        if (std::find(c.mask.begin(), c.mask.end(), x) == c.mask.end()) c.mask.push_back(x);
  }
  if (!f.inputs.empty()) {
    c.input.clear();
    for (const auto& i : f.inputs)
      for (const auto& x : parse_input_list("--input", i)) c.input.push_back(x);
  }
  if (f.reps > 0) c.measure.min_reps = c.measure.max_reps = f.reps;
  if (f.warmup >= 0) c.measure.warmup = f.warmup;
  if (f.target_seconds > 0) c.measure.target_seconds = f.target_seconds;
  if (f.error_rows > 0) c.measure.error_rows = f.error_rows;
  if (f.memory_budget > 0) c.measure.memory_budget = f.memory_budget;
  if (f.peers) c.peers = true;
  c.origin += " (with command-line overrides)";
  validate(c);
  return c;
}

// The rows of `dir` that belong to `keys` (a resumed folder may hold other grids' rows), with
// its meta.json.
SummaryRun summary_run(const std::string& dir, const std::set<std::string>& keys) {
  SummaryRun run{dir, {}, nullptr};
  for (auto& r : read_report_rows(dir + "/rows.csv"))
    if (keys.count(r.key)) run.rows.push_back(std::move(r));
  std::ifstream meta(dir + "/meta.json");
  if (meta) run.meta = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  return run;
}

// After the sweep: report.md and plots (unless --no-report), then the summary on stdout, beside
// the committed reference run of the same grid when one exists and holds any of its points.
void summarise(const SweepConfig& config, const SweepOptions& options, const SweepSummary& s,
               bool render) {
  std::set<std::string> keys;
  for (const Point& p : make_grid(config))
    if (options.shard.contains(p.index)) keys.insert(p.key);
  const SummaryRun run = summary_run(s.dir, keys);
  std::optional<SummaryRun> reference;
  const std::string ref_dir = reference_dir(config);
  namespace fs = std::filesystem;
  if (fs::exists(ref_dir + "/rows.csv") && !fs::equivalent(ref_dir, s.dir)) {
    reference = summary_run(ref_dir, keys);
    if (reference->rows.empty()) reference.reset();
  }
  std::printf("\n%s", sweep_summary(run, reference ? &*reference : nullptr).c_str());
  std::fflush(stdout);  // before the progress line on stderr, so a log of both reads in order
  if (!render) return;
  if (options.progress) std::fprintf(options.progress, "rendering the report and plots...\n");
  const ReportOutput out = render_report(s.dir);
  std::string pngs;
  for (const auto& png : out.pngs)
    pngs += (pngs.empty() ? "" : ", ") + fs::path(png).filename().string();
  std::printf(
      "\nReport: %s\nPlots: %s\n", out.markdown_path.c_str(),
      out.pngs.empty() ? out.plot_note.c_str() : (s.dir + "/plots/ (" + pngs + ")").c_str());
}

void sweep(const SweepFlags& f) {
  const SweepConfig config = build_config(f);
  SweepOptions options;
  options.out_dir = f.out;
  options.mpi = f.mpi;
  options.restart = f.restart;
  options.retry_errors = f.retry_errors;
  options.progress = f.quiet ? nullptr : stderr;
  if (!f.shard.empty()) options.shard = parse_shard(f.shard);
  if (f.dry_run) {
    for (const Point& p : make_grid(config))
      if (options.shard.contains(p.index))
        std::printf(
            "%s %s n=%lld batch=%lld heads=%lld dim=%lld causal=%s mask=%s dtype=%s input=%s "
            "seed=%lld\n",
            p.key.c_str(), p.spec.c_str(), (long long)p.n, (long long)p.batch, (long long)p.heads,
            (long long)p.dim, p.causal.c_str(), p.mask.c_str(), p.dtype.c_str(), p.input.c_str(),
            (long long)p.seed);
    return;
  }
  SweepSummary s;
  try {
    s = run_sweep(config, options);
  } catch (const std::exception& e) {
    if (f.mpi && mpi::size() > 1) {  // the other ranks may wait for this one: end them all
      std::fprintf(stderr, "attnlab: error: rank %d: %s\n", mpi::rank(), user_message(e).c_str());
      mpi::abort(2);
    }
    if (f.mpi) mpi::finalize();
    throw;
  }
  const bool root = !f.mpi || mpi::rank() == 0;
  if (f.mpi) mpi::finalize();
  if (!root) return;
  if (s.repaired_bytes > 0)
    std::fprintf(stderr,
                 "attnlab: note: %s/rows.csv: dropped a torn last line (%zu bytes, from a "
                 "crash during a write); its point ran again\n",
                 s.dir.c_str(), s.repaired_bytes);
  std::string statuses;
  for (const auto& [status, count] : s.by_status)
    statuses += (statuses.empty() ? "" : ", ") + std::to_string(count) + " " + status;
  std::printf(
      "sweep %s: %zu of %zu grid points in this run, %zu already done, %zu run (%s); "
      "sgemm %.1f GFLOP/s -> %s/rows.csv\n",
      config.name.c_str(), s.selected, s.grid, s.done_before, s.ran,
      statuses.empty() ? "none" : statuses.c_str(), s.sgemm_gflops, s.dir.c_str());
  if (s.retried > 0) std::printf("%zu error rows were run again (--retry-errors)\n", s.retried);
  if (s.ran == 0 && s.done_before > 0)
    std::printf(
        "every point was already in %s/rows.csv (a sweep resumes); --restart measures "
        "them again\n",
        s.dir.c_str());
  summarise(config, options, s, !f.no_report);
}

}  // namespace

// CLI::PositiveNumber would print its upper bound, 1.8e308, with all 309 digits.
const CLI::Range kPositive(1e-300, 1e300, "a positive number");
const CLI::Range kNonNegative(0.0, 1e300, "a number >= 0");

void add_sweep_command(CLI::App& app) {
  auto f = std::make_shared<SweepFlags>();
  CLI::App* cmd = app.add_subcommand(
      "sweep",
      "Run a grid of variant specs x N x batch x heads x dim x causal x mask x dtype x input x "
      "seed and append one row per point to <out>/rows.csv (resumable; see docs/sweep.md). "
      "Without --config: the built-in default (benchmarks/configs/default.toml). A flag replaces "
      "its axis of the config; an axis not given keeps the config's (the default's mask axis: "
      "none and documents:count=16; its dtype axis: float32).");
  cmd->add_option("--config", f->config, "TOML grid (docs/sweep.md)")->check(CLI::ExistingFile);
  cmd->add_option("--name", f->name, "result set name: runs/<name>/");
  cmd->add_option("--out", f->out,
                  "output directory (default runs/<name>, which git ignores; --out "
                  "results/<name> replaces the committed reference run)");
  cmd->add_option("--variant", f->variants,
                  "spec with optional lists, e.g. 'linformer:k=[64,128]' or '*' (repeatable; "
                  "replaces the config's variants)");
  cmd->add_option("--n", f->n, "sequence lengths: 256,1024 or 256..65536 (powers of two)");
  cmd->add_option("--batch", f->batch, "batch sizes, e.g. 1,4");
  cmd->add_option("--heads", f->heads, "head counts");
  cmd->add_option("--dim", f->dim, "head dimensions");
  cmd->add_option("--causal", f->causal, "none,top-left,bottom-right (comma-separated)");
  cmd->add_option(
      "--mask", f->masks,
      "none | documents:count=D | prefix:frac=F | window:left=L[,right=R] "
      "(';'-separated or repeatable; replaces the config's mask axis; --mask none: no mask)");
  cmd->add_option("--dtype", f->dtype,
                  "float32,bf16 (comma-separated; replaces the config's dtype axis, default "
                  "float32): bf16 rounds q, k, v to bfloat16 and runs the bf16 forward");
  cmd->add_option("--input", f->inputs,
                  "gaussian:temp=T | lowrank:r=R[,temp=T] | local:width=W[,gap=G] | npy:<dir> "
                  "(repeatable)");
  cmd->add_option("--seed", f->seed, "seeds, e.g. 1,2,3");
  cmd->add_option("--reps", f->reps, "exactly R timed calls per point")->check(kPositive);
  cmd->add_option("--warmup", f->warmup, "untimed calls before timing")->check(kNonNegative);
  cmd->add_option("--target-seconds", f->target_seconds, "timing budget per point")
      ->check(kPositive);
  cmd->add_option("--error-rows", f->error_rows, "query rows sampled for the error at long N")
      ->check(kPositive);
  cmd->add_option("--memory-budget", f->memory_budget,
                  "<= 1: fraction of MemAvailable; > 1: bytes. Larger points get status oom")
      ->check(kPositive);
  cmd->add_flag("--peers", f->peers, "add NumPy and PyTorch exact-attention rows");
  cmd->add_option("--shard", f->shard, "run the I-th of N disjoint slices of the grid: I/N");
  cmd->add_flag("--mpi", f->mpi,
                "split the grid across MPI ranks (mpirun -n P attnlab sweep --mpi)");
  cmd->add_flag("--restart", f->restart,
                "measure every point again (the old rows.csv is kept as rows.csv.old)");
  cmd->add_flag("--retry-errors", f->retry_errors,
                "run the points whose rows have status error again (their rows are replaced)");
  cmd->add_flag("--no-report", f->no_report,
                "do not render report.md and plots/ at the end (the summary is still printed)");
  cmd->add_flag("--quiet", f->quiet, "no progress on stderr");
  cmd->add_flag("--dry-run", f->dry_run, "print the points (key, spec, shape) and exit");
  cmd->callback([f] { sweep(*f); });
}

}  // namespace attnlab::cli
