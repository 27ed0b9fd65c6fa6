#include "harness/sweep.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "attnlab/error.hpp"
#include "attnlab/inputs.hpp"
#include "harness/measure.hpp"
#include "harness/meta.hpp"
#include "harness/mpi.hpp"
#include "harness/point_guard.hpp"
#include "harness/progress.hpp"

namespace attnlab::harness {
namespace {

namespace fs = std::filesystem;

// Shape first, spec last: a terminal line cuts the end of long specs.
std::string label(const Point& p) {
  return "n=" + std::to_string(p.n) + " b=" + std::to_string(p.batch) +
         " h=" + std::to_string(p.heads) + " d=" + std::to_string(p.dim) + " " + p.causal +
         (p.mask == "none" ? "" : " " + p.mask) + (p.dtype == "float32" ? "" : " " + p.dtype) +
         " " + p.input + " seed=" + std::to_string(p.seed) + " " + p.spec;
}

std::int64_t budget_bytes(const MeasureOptions& m) {
  if (m.memory_budget > 1)  // bytes; beyond int64 means no limit
    return m.memory_budget >= 9e18 ? std::numeric_limits<std::int64_t>::max()
                                   : static_cast<std::int64_t>(m.memory_budget);
  const std::int64_t available = mem_available_bytes();
  return available > 0 ? static_cast<std::int64_t>(m.memory_budget * double(available))
                       : std::int64_t{8} << 30;  // unknown: 8 GiB
}

Row parse_row_line(const std::string& line) {
  const auto records = parse_csv(line);
  if (records.size() != 1 || records[0].size() != kColumnCount)
    throw Error("MPI: a malformed row arrived from another rank");
  Row r;
  for (std::size_t c = 0; c < kColumnCount; ++c) r.cells[c] = records[0][c];
  return r;
}

}  // namespace

std::string default_out_dir(const SweepConfig& config) {
  return "runs/" + config.name;
}

std::string reference_dir(const SweepConfig& config) {
  return "results/" + config.name;
}

SweepSummary run_sweep(const SweepConfig& config, const SweepOptions& options) {
  validate(config);
  SweepSummary summary;
  summary.dir = options.out_dir.empty() ? default_out_dir(config) : options.out_dir;
  const bool use_mpi = options.mpi;
  if (use_mpi) mpi::init();
  const int rank = use_mpi ? mpi::rank() : 0, ranks = use_mpi ? mpi::size() : 1;
  const bool root = rank == 0;

  const std::vector<Point> grid = make_grid(config);
  summary.grid = grid.size();
  std::vector<const Point*> selected;
  for (const Point& p : grid)
    if (options.shard.contains(p.index)) selected.push_back(&p);
  summary.selected = selected.size();

  // Rank 0 (or the only process) owns the directory and knows what is done.
  std::unique_ptr<RowsFile> rows;
  std::string done_keys;
  // A run that fails before its first point leaves no folder it created (a typo in --out, a full
  // disk): what it made there is removed again.
  bool created_dir = false;
  const auto undo_start = [&] {
    rows.reset();
    std::error_code ec;
    if (created_dir) fs::remove_all(summary.dir, ec);
  };
  if (root) {
    try {
      if (fs::exists(summary.dir) && !fs::is_directory(summary.dir))
        throw Error(summary.dir + ": exists and is not a directory (the results folder)");
      created_dir = fs::create_directories(summary.dir);
      const std::string path = summary.dir + "/rows.csv";
      if (options.restart && fs::exists(path)) {
        fs::rename(path, path + ".old");
        std::remove((summary.dir + "/running").c_str());
      }
      rows = std::make_unique<RowsFile>(path);
      summary.repaired_bytes = rows->repaired_bytes();
      if (options.retry_errors)
        summary.retried = rows->drop([](const Row& r) { return r[Col::status] == "error"; });
      for (const Row& r : rows->rows()) done_keys += r[Col::key] + "\n";
    } catch (...) {
      undo_start();
      throw;
    }
  }
  if (use_mpi) mpi::broadcast(done_keys);
  std::unordered_set<std::string> done;
  {
    std::istringstream in(done_keys);
    for (std::string k; std::getline(in, k);) done.insert(k);
  }

  std::vector<const Point*> todo, mine;
  for (const Point* p : selected) {
    if (done.count(p->key)) {
      ++summary.done_before;
      continue;
    }
    todo.push_back(p);
  }
  for (std::size_t i = 0; i < todo.size(); ++i)
    if (static_cast<int>(i % static_cast<std::size_t>(ranks)) == rank) mine.push_back(todo[i]);

  summary.sgemm_gflops = measure_sgemm_gflops();
  const std::int64_t budget = budget_bytes(config.measure);
  const std::string shard = use_mpi ? std::to_string(rank + 1) + "/" + std::to_string(ranks)
                                    : (options.shard.active() ? options.shard.str() : "");
  if (root) {
    nlohmann::json extra = {{"sgemm_gflops", summary.sgemm_gflops},
                            {"memory_budget_bytes", budget},
                            {"shard", options.shard.active() ? options.shard.str() : ""},
                            {"mpi_ranks", use_mpi ? ranks : 0},
                            {"grid_points", summary.grid},
                            {"selected_points", summary.selected},
                            {"done_before", summary.done_before},
                            {"token_inputs", kTokenInputsRecipe}};
    const MeasureOptions& m = config.measure;
    extra["grid"] = {{"name", config.name},
                     {"specs", config.specs},
                     {"n", config.n},
                     {"batch", config.batch},
                     {"heads", config.heads},
                     {"dim", config.dim},
                     {"causal", config.causal},
                     {"mask", config.mask},
                     {"dtype", config.dtype},
                     {"input", config.input},
                     {"seed", config.seed},
                     {"peers", config.peers},
                     {"max_n", config.max_n},
                     {"measure",
                      {{"warmup", m.warmup},
                       {"min_reps", m.min_reps},
                       {"max_reps", m.max_reps},
                       {"target_seconds", m.target_seconds},
                       {"long_call_seconds", m.long_call_seconds},
                       {"error_rows", m.error_rows},
                       {"memory_budget", m.memory_budget}}}};
    try {
      record_run(summary.dir, config, extra);
    } catch (...) {
      undo_start();
      throw;
    }
  }

  PointRunner runner(config.measure, summary.sgemm_gflops, budget, shard);
  if (root)
    for (const Row& r : rows->rows()) runner.remember(r);
  Progress progress(todo.size(), root ? options.progress : nullptr);
  std::unique_ptr<PointGuard> guard;  // rank 0 keeps <dir>/running
  // Until its first row is stored, a failure (a full disk writing `running`) undoes the start.
  const auto undo_before_first_row = [&] {
    if (!root || summary.ran > 0) return;
    guard.reset();
    undo_start();
  };
  try {
    if (root) {
      guard = std::make_unique<PointGuard>(summary.dir);
      guard->discard_if_stored(done);
    }
  } catch (...) {
    undo_before_first_row();
    throw;
  }

  auto store = [&](const Row& r) {  // rank 0 only
    rows->append(r);
    ++summary.ran;
    ++summary.by_status[r[Col::status]];
    if (options.on_row) options.on_row(r);
  };
  int ranks_finished = 0;
  auto drain = [&](bool block) {  // rank 0: rows other ranks sent
    std::string line;
    bool finished = false;
    while (mpi::receive(line, finished, block)) {
      if (finished) {
        ++ranks_finished;
      } else {
        const Row r = parse_row_line(line);
        store(r);
        progress.done("n=" + r[Col::n] + " " + r[Col::causal] + " " + r[Col::mask] + " " +
                          r[Col::dtype] + " " + r[Col::input] + " " + r[Col::spec] + " (rank " +
                          r[Col::shard] + ")",
                      r[Col::status], -1.0);
      }
      if (block) return;
    }
  };

  try {
    for (const Point* p : mine) {
      progress.start(label(*p));
      const auto t0 = std::chrono::steady_clock::now();
      Row r;
      const int faults = root ? guard->faults(p->key) : 0;
      if (faults >= 2) {
        r = status_row(*p, "error",
                       "this point killed the process twice (last: " + guard->cause() +
                           "); not tried again (attnlab sweep --retry-errors tries it again)",
                       shard);
      } else {
        if (root) guard->begin(p->key);
        if (options.on_point) options.on_point(*p);
        r = runner.run(*p);
      }
      runner.remember(r);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (root) {
        store(r);
        guard->end();
        progress.done(label(*p), r[Col::status], seconds);
        if (use_mpi) drain(false);
      } else {
        mpi::send_row(csv_line(r));
      }
    }
  } catch (...) {
    undo_before_first_row();
    throw;
  }
  if (use_mpi) {
    if (root) {
      while (ranks_finished < ranks - 1) drain(true);
    } else {
      mpi::send_done();
    }
    mpi::barrier();
    summary.ran = root ? summary.ran : 0;
  }
  return summary;
}

MergeSummary merge_results(const std::string& out_dir, const std::vector<std::string>& in_dirs) {
  if (in_dirs.empty()) throw Error("merge: no input directories");
  std::vector<std::string> sources;
  const std::string out_rows = out_dir + "/rows.csv";
  if (fs::exists(out_rows)) sources.push_back(out_dir);
  for (const auto& d : in_dirs) {
    if (!fs::exists(d + "/rows.csv")) throw Error("merge: " + d + "/rows.csv does not exist");
    bool listed = false;  // the same directory given twice is read once
    for (const auto& s : sources) listed = listed || fs::equivalent(s, d);
    if (!listed) sources.push_back(d);
  }
  MergeSummary summary;
  std::vector<Row> merged;
  std::map<std::string, std::pair<std::size_t, std::string>> seen;  // key -> (index, source)
  for (const auto& dir : sources) {
    for (const Row& r : read_rows(dir + "/rows.csv")) {
      const auto it = seen.find(r[Col::key]);
      if (it == seen.end()) {
        seen.emplace(r[Col::key], std::make_pair(merged.size(), dir));
        merged.push_back(r);
        continue;
      }
      ++summary.duplicates;
      const Row& first = merged[it->second.first];
      for (std::size_t c = 0; c < kColumnCount; ++c) {
        const auto col = static_cast<Col>(c);
        if (is_timing_column(col) || first.cells[c] == r.cells[c]) continue;
        throw Error("merge: key " + r[Col::key] + " (" + r[Col::spec] + " n=" + r[Col::n] +
                    ") has conflicting " + column_names()[c] + ": '" + first.cells[c] + "' in " +
                    it->second.second + " and '" + r.cells[c] + "' in " + dir);
      }
    }
  }
  fs::create_directories(out_dir);
  std::string text;
  const auto& names = column_names();
  text += csv_line(std::vector<std::string>(names.begin(), names.end()));
  for (const Row& r : merged) text += csv_line(r);
  write_merged_meta(out_dir, sources);  // before rows: reads out_dir/meta.json if it is a source
  write_atomically(out_rows, text);
  summary.rows = merged.size();
  return summary;
}

}  // namespace attnlab::harness
