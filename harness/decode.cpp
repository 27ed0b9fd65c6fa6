#include "harness/decode.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/attnlab.hpp"
#include "attnlab/csv.hpp"
#include "attnlab/inputs.hpp"
#include "harness/config.hpp"
#include "harness/measure.hpp"
#include "harness/meta.hpp"
#include "harness/plot.hpp"
#include "harness/progress.hpp"

namespace attnlab::harness {
namespace {

using Clock = std::chrono::steady_clock;

enum Column : std::size_t {
  kKey,
  kKind,
  kSpec,
  kVariant,
  kBatch,
  kHeads,
  kKvHeads,
  kDim,
  kContext,
  kStatus,
  kMessage,
  kReps,
  kMedian,
  kMin,
  kMax,
  kStepsPerToken,
  kBytesHeld,
  kReadGbps,
  kShard,
  kThreads,
  kOneThread,
  kColumns
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A point of the sweep; `index` in grid order decides its shard.
struct DecodePoint {
  std::string kind, spec;
  std::int64_t kv = 0, dim = 0, context = 0;
  std::size_t index = 0;
};

std::string key_of(const DecodeSweep& s, const DecodePoint& p) {
  return p.kind + "|" + p.spec + "|B=" + std::to_string(s.batch) + "|H=" + std::to_string(s.heads) +
         "|Hkv=" + std::to_string(p.kv) + "|D=" + std::to_string(p.dim) +
         "|N=" + std::to_string(p.context);
}

CsvRecord base_row(const DecodeSweep& s, const DecodePoint& p) {
  CsvRecord r(kColumns);
  r[kKey] = key_of(s, p);
  r[kKind] = p.kind;
  r[kSpec] = p.spec;
  r[kVariant] = p.spec.substr(0, p.spec.find(':'));
  r[kBatch] = std::to_string(s.batch);
  r[kHeads] = std::to_string(s.heads);
  r[kKvHeads] = std::to_string(p.kv);
  r[kDim] = std::to_string(p.dim);
  r[kContext] = std::to_string(p.context);
  r[kStatus] = "ok";
  r[kShard] = s.shard.active() ? s.shard.str() : "";
  return r;
}

// Random tokens, made once per shape: q [B, H, n, D], k and v [B, Hkv, n, D].
struct Tokens {
  Tensor q, k, v;
};

// The inputs of the sweep's distribution (lib/attnlab/inputs.hpp) for n tokens: q of H heads,
// one row a token; k and v of Hkv, `rows` rows a token.
Tokens tokens(const DecodeSweep& s, const DecodePoint& p, std::size_t n, std::size_t rows) {
  const auto b = std::size_t(s.batch), d = std::size_t(p.dim);
  QKV queries = make_inputs("gaussian", b, std::size_t(s.heads), n, d, 1);
  QKV keys = make_inputs("gaussian", b, std::size_t(p.kv), n * rows, d, 2);
  return {std::move(queries.q), std::move(keys.k), std::move(keys.v)};
}

// Rows of k and v a token brings: delta-product's steps (its decoder takes n_h rows of k, v,
// g and beta per token; g and beta are not given, so beta is the spec's), else 1.
std::size_t rows_per_token(const Attention& a) {
  return a.support().rows_per_token;
}

// Rows [first, first + n) of a token tensor's third axis.
Tensor token_rows(const Tensor& x, std::size_t first, std::size_t n) {
  return xt::view(x, xt::all(), xt::all(), xt::range(first, first + n), xt::all());
}

DecodeConfig config_of(const DecodeSweep& s, const DecodePoint& p, std::size_t max_tokens) {
  DecodeConfig c(std::size_t(s.batch), std::size_t(s.heads), std::size_t(p.dim),
                 std::size_t(p.dim));
  c.kv_heads = std::size_t(p.kv);
  c.max_tokens = max_tokens;
  return c;
}

// The bytes of a KV cache of every token: what full and bigbird hold (sliding holds its ring, a
// recurrent variant its state, whatever the context).
double cache_bytes(const DecodeSweep& s, const DecodePoint& p, std::size_t tokens) {
  return double(s.batch) * double(p.kv) * double(tokens) * 2.0 * double(p.dim) * sizeof(float);
}

bool holds_every_token(const Attention& a) {
  return a.name() == "full" || a.name() == "bigbird";
}

// Tokens a decoder of this point holds room for: the context, then 2 untimed and `steps` timed
// steps, twice for a threads row (all threads, then one); 0, no limit, for a decoder that does
// not hold every token (run_step times it in bursts); a prefill row's prompt.
std::size_t capacity(const DecodeSweep& s, const DecodePoint& p, const Attention& a) {
  if (p.kind == "prefill") return std::size_t(p.context);
  if (!holds_every_token(a)) return 0;
  return std::size_t(p.context) + std::size_t(s.steps + 2) * (p.kind == "threads" ? 2 : 1);
}

// A decoder of `a` holding `context` random tokens, filled by extend (room for `capacity`).
std::unique_ptr<TokenDecoder> filled_decoder(const DecodeSweep& s, const DecodePoint& p,
                                             const Attention& a) {
  const auto context = std::size_t(p.context);
  auto decoder = a.start_decoding(config_of(s, p, capacity(s, p, a)));
  const std::size_t rows = rows_per_token(a);
  constexpr std::size_t kChunk = 4096;  // tokens per extend: the same random chunk again
  const Tokens chunk = tokens(s, p, std::min(context, kChunk), rows);
  for (std::size_t held = 0; held < context;) {
    const std::size_t n = std::min(kChunk, context - held);
    if (n * rows == chunk.k.shape()[2])
      decoder->extend(chunk.k, chunk.v);
    else
      decoder->extend(token_rows(chunk.k, 0, n * rows), token_rows(chunk.v, 0, n * rows));
    held += n;
  }
  return decoder;
}

// Runs `measure`; an exception that belongs to the point becomes its row's status and message
// (a point the variant refuses or rejects, or that runs out of memory, never ends the sweep).
template <class Measure>
void record_failure(CsvRecord& row, Measure&& measure) {
  try {
    measure();
  } catch (const Unsupported& e) {
    row[kStatus] = "unsupported";
    row[kMessage] = e.what();
  } catch (const Error& e) {
    row[kStatus] = "error";
    row[kMessage] = e.what();
  } catch (const std::bad_alloc&) {
    row[kStatus] = "skipped";
    row[kMessage] = "out of memory";
  }
}

// Every timed step's seconds, and the least median of a burst.
struct Bursts {
  std::vector<double> times;
  double best = INFINITY;
};

// Bursts of `steps` timed steps of `one` for at least `seconds` (0: one burst), into `out`.
void add_bursts(TokenDecoder& decoder, const Tokens& one, std::size_t steps, double seconds,
                Bursts& out) {
  const auto start = Clock::now();
  do {
    std::vector<double> burst;
    for (std::size_t i = 0; i < steps; ++i) {
      const auto t0 = Clock::now();
      decoder.step(one.q, one.k, one.v);
      burst.push_back(seconds_since(t0));
    }
    out.best = std::min(out.best, time_stats(burst).median);
    out.times.insert(out.times.end(), burst.begin(), burst.end());
  } while (seconds_since(start) < seconds);
}

// 2 untimed steps of `one`, then one burst of `steps` timed steps.
Bursts time_burst(TokenDecoder& decoder, const Tokens& one, std::size_t steps) {
  for (int i = 0; i < 2; ++i) decoder.step(one.q, one.k, one.v);  // untimed
  Bursts out;
  add_bursts(decoder, one, steps, 0, out);
  return out;
}

// A row's timing columns from its bursts, and the bytes the decoder holds after them.
void record_bursts(const Bursts& bursts, const TokenDecoder& decoder, CsvRecord& row) {
  const TimeStats t = time_stats(bursts.times);
  row[kReps] = std::to_string(bursts.times.size());
  row[kMedian] = format_number(bursts.best);
  row[kMin] = format_number(t.min);
  row[kMax] = format_number(t.max);
  row[kBytesHeld] = std::to_string(decoder.bytes());
  row[kReadGbps] = format_number(double(decoder.bytes()) / bursts.best / 1e9);
}

// One step row of a KV cache of every token: fill the context by extend, then time one burst
// (more steps would grow its context; where its checks read it, a burst outlasts a shared
// machine's slow episodes, see run_step_turns).
void run_step(const DecodeSweep& s, const DecodePoint& p, const Attention& a, CsvRecord& row) {
  const auto decoder = filled_decoder(s, p, a);
  const Tokens one = tokens(s, p, 1, rows_per_token(a));
  record_bursts(time_burst(*decoder, one, std::size_t(s.steps)), *decoder, row);
}

// The step rows of one constant-size decoder (a state or a ring: its work does not depend on the
// tokens seen) at several contexts, timed in turns. A step takes ~10 us, a burst of `steps`
// ~0.3 ms, while a shared machine slows cache-bound code ~1.5x in episodes of ~10 ms to
// seconds that are none of ours (a plain read-modify-write stream over the state's bytes slows
// as much in them; a latency-bound chain does not). Timed one context after another, a run of
// contexts landed in one episode and the row's max / min measured the machine. So every decoder
// is filled first, then each gets bursts for kTurnSeconds in turn, kTurns rounds: the least
// burst median of a context comes from windows spread over the whole group's timing, as every
// other context's does. `rows[i]` is points[i]'s; a point whose decoder fails is its row's
// status, the others go on.
void run_step_turns(const DecodeSweep& s, const std::vector<DecodePoint>& points,
                    const Attention& a, std::vector<CsvRecord>& rows, Progress& bar) {
  constexpr int kTurns = 10;
  constexpr double kTurnSeconds = 0.025;  // 0.25 s a context in all, as many bursts as fit
  std::vector<std::unique_ptr<TokenDecoder>> decoders(points.size());
  std::vector<Tokens> ones(points.size());
  for (std::size_t i = 0; i < points.size(); ++i) {
    bar.start(key_of(s, points[i]) + " (filling)");
    record_failure(rows[i], [&] {
      decoders[i] = filled_decoder(s, points[i], a);
      ones[i] = tokens(s, points[i], 1, rows_per_token(a));
      for (int w = 0; w < 2; ++w) decoders[i]->step(ones[i].q, ones[i].k, ones[i].v);  // untimed
    });
  }
  std::vector<Bursts> bursts(points.size());
  for (int turn = 0; turn < kTurns; ++turn)
    for (std::size_t i = 0; i < points.size(); ++i)
      if (rows[i][kStatus] == "ok")
        record_failure(rows[i], [&] {
          add_bursts(*decoders[i], ones[i], std::size_t(s.steps), kTurnSeconds, bursts[i]);
        });
  for (std::size_t i = 0; i < points.size(); ++i)
    if (rows[i][kStatus] == "ok") record_bursts(bursts[i], *decoders[i], rows[i]);
}

// Runs its scope on one OpenMP thread, restoring the thread count after (exceptions too).
class OneThread {
 public:
  OneThread() : threads_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(threads_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int threads_;
};

// One threads row (full's): a step row's burst, then one more on one thread.
void run_threads(const DecodeSweep& s, const DecodePoint& p, const Attention& a, CsvRecord& row) {
  const auto decoder = filled_decoder(s, p, a);
  const Tokens one = tokens(s, p, 1, rows_per_token(a));
  record_bursts(time_burst(*decoder, one, std::size_t(s.steps)), *decoder, row);
  const OneThread scope;
  row[kOneThread] = format_number(time_burst(*decoder, one, std::size_t(s.steps)).best);
}

// One prefill row: chunked prefill of the prompt against as many steps, per token.
void run_prefill(const DecodeSweep& s, const DecodePoint& p, const Attention& a, CsvRecord& row) {
  const auto n = std::size_t(p.context);
  const std::size_t rows = rows_per_token(a);
  const Tokens prompt = tokens(s, p, n, rows);
  std::vector<Tensor> rows_q, rows_k, rows_v;
  for (std::size_t i = 0; i < n; ++i) {
    rows_q.push_back(token_rows(prompt.q, i, 1));
    rows_k.push_back(token_rows(prompt.k, i * rows, rows));
    rows_v.push_back(token_rows(prompt.v, i * rows, rows));
  }
  double chunked = 0, stepped = 0, worst = 0;
  for (std::int64_t r = 0; r < s.reps; ++r) {
    auto decoder = a.start_decoding(config_of(s, p, n));
    auto t0 = Clock::now();
    decoder->prefill(prompt.q, prompt.k, prompt.v);
    const double c = seconds_since(t0) / double(n);
    decoder = a.start_decoding(config_of(s, p, n));
    t0 = Clock::now();
    for (std::size_t i = 0; i < n; ++i) decoder->step(rows_q[i], rows_k[i], rows_v[i]);
    const double st = seconds_since(t0) / double(n);
    chunked = r == 0 ? c : std::min(chunked, c);
    stepped = r == 0 ? st : std::min(stepped, st);
    worst = std::max(worst, c);
    row[kBytesHeld] = std::to_string(decoder->bytes());
  }
  row[kReps] = std::to_string(s.reps);
  row[kMedian] = format_number(chunked);  // best of reps, per token
  row[kMin] = format_number(chunked);
  row[kMax] = format_number(worst);
  row[kStepsPerToken] = format_number(stepped);
}

// The points of the sweep's shard, in grid order.
std::vector<DecodePoint> points(const DecodeSweep& s) {
  std::vector<DecodePoint> all;
  for (const std::string& spec : s.specs)
    for (const std::int64_t d : s.dims)
      for (const std::int64_t kv : s.kv_heads) {
        for (const std::int64_t n : s.contexts) all.push_back({"step", spec, kv, d, n});
        for (const std::int64_t n : s.prefill_lengths) all.push_back({"prefill", spec, kv, d, n});
        // full's step at the largest context, on every thread and on one.
        if (spec.substr(0, spec.find(':')) == "full" && !s.contexts.empty())
          all.push_back(
              {"threads", spec, kv, d, *std::max_element(s.contexts.begin(), s.contexts.end())});
      }
  std::vector<DecodePoint> mine;
  for (std::size_t i = 0; i < all.size(); ++i) {
    all[i].index = i;
    if (s.shard.contains(i)) mine.push_back(all[i]);
  }
  return mine;
}

void check(const DecodeSweep& s) {
  if (s.heads < 1 || s.batch < 1 || s.steps < 1 || s.reps < 1 || s.bandwidth_bytes < 4096)
    throw Error(
        "decode sweep: heads, batch, steps and reps must be >= 1, the bandwidth buffer >= 4 KiB");
  if (s.shard.count < 1 || s.shard.index < 1 || s.shard.index > s.shard.count)
    throw Error("--shard '" + s.shard.str() + "': expected I/N with 1 <= I <= N (e.g. 2/4)");
  for (const std::int64_t kv : s.kv_heads)
    if (kv < 1 || s.heads % kv != 0)
      throw Error("--kv-heads " + std::to_string(kv) +
                  ": expected a divisor of --heads = " + std::to_string(s.heads));
  for (const auto& [values, name] :
       {std::pair{&s.contexts, "--contexts"}, std::pair{&s.prefill_lengths, "--prefill"},
        std::pair{&s.dims, "--dims"}})
    for (const std::int64_t x : *values)
      if (x < 1) throw Error(std::string(name) + " " + std::to_string(x) + ": expected >= 1");
  for (const std::string& spec : s.specs) make_attention(spec);  // Error naming a bad spec
}

}  // namespace

const std::vector<std::string>& decode_columns() {
  static const std::vector<std::string> names = {
      "key",           "kind",       "spec",       "variant",
      "batch",         "heads",      "kv_heads",   "dim",
      "context",       "status",     "message",    "reps",
      "time_median_s", "time_min_s", "time_max_s", "steps_s_per_token",
      "bytes_held",    "read_gbps",  "shard",      "threads",
      "time_1thread_s"};
  return names;
}

double measure_read_bandwidth(std::size_t bytes, int reps) {
  // Sums in kLanes independent lanes, which the compiler vectorises: one float accumulator
  // waits ~4 cycles on each add, ~3 GB/s a core, and measured that chain, not the memory.
  constexpr std::size_t kLanes = 32;
  const auto blocks = static_cast<std::ptrdiff_t>(bytes / sizeof(float) / kLanes);
  std::unique_ptr<float[]> data(new float[std::size_t(blocks) * kLanes]);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t b = 0; b < blocks; ++b)  // touched by the thread that reads it
    std::fill_n(data.get() + std::size_t(b) * kLanes, kLanes, 1.0f);
  double best = 0;
  volatile float sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
      float lanes[kLanes] = {};
#pragma omp for schedule(static)
      for (std::ptrdiff_t b = 0; b < blocks; ++b) {
        const float* block = data.get() + std::size_t(b) * kLanes;
        for (std::size_t j = 0; j < kLanes; ++j) lanes[j] += block[j];
      }
      for (const float x : lanes) total += x;
    }
    const double s = seconds_since(t0);
    sink = sink + total;
    best = std::max(best, double(blocks) * kLanes * sizeof(float) / s / 1e9);
  }
  return best;
}

std::size_t run_decode_sweep(const std::string& dir, const DecodeSweep& sweep,
                             std::FILE* progress) {
  check(sweep);
  std::filesystem::create_directories(dir);
  CsvAppendOptions options;
  options.holder = "another decode sweep";
  CsvAppender file(dir + "/decode.csv", decode_columns(), options);
  if (file.records().front() != decode_columns())
    throw Error(dir + "/decode.csv:1: the header is not the decode.csv schema of this attnlab (" +
                std::to_string(file.records().front().size()) + " columns, expected " +
                std::to_string(kColumns) + "); measure again into a new folder");
  std::vector<std::string> done;
  for (std::size_t i = 1; i < file.records().size(); ++i) done.push_back(file.records()[i][kKey]);
  std::vector<DecodePoint> todo;
  for (const DecodePoint& p : points(sweep))
    if (std::find(done.begin(), done.end(), key_of(sweep, p)) == done.end()) todo.push_back(p);
  SweepConfig config;
  config.origin = "attnlab decode";
  nlohmann::json extra;
  extra["decode_points"] = todo.size();
  extra["shard"] = sweep.shard.active() ? sweep.shard.str() : "";
  extra["threads"] = omp_get_max_threads();
  record_run(dir, config, extra);
  const double budget = sweep.memory_budget_bytes > 0
                            ? sweep.memory_budget_bytes
                            : 0.5 * static_cast<double>(mem_available_bytes());
  std::size_t appended = 0;
  // The yardstick, in every invocation: on every thread, and on one (full's threads check
  // compares its step's speed-up with the memory's).
  const auto earlier = std::count_if(done.begin(), done.end(), [](const std::string& key) {
    return key.rfind("bandwidth|", 0) == 0;
  });
  std::vector<int> yardstick_threads = {omp_get_max_threads()};
  if (omp_get_max_threads() > 1) yardstick_threads.push_back(1);
  for (const int threads : yardstick_threads) {
    CsvRecord row(kColumns);
    // Numbered: two invocations within one second still get keys of their own; a shard's
    // carry it, so that shards started together keep theirs when merged.
    row[kKey] = "bandwidth|" + (sweep.shard.active() ? sweep.shard.str() + "|" : std::string()) +
                std::to_string(earlier + std::ptrdiff_t(appended) + 1) + "|" + utc_now();
    row[kKind] = "bandwidth";
    row[kStatus] = "ok";
    {
      std::optional<OneThread> scope;
      if (threads == 1) scope.emplace();
      row[kReadGbps] = format_number(measure_read_bandwidth(sweep.bandwidth_bytes));
    }
    row[kShard] = sweep.shard.active() ? sweep.shard.str() : "";
    row[kThreads] = std::to_string(threads);
    file.append(row);
    ++appended;
  }
  Progress bar(todo.size(), progress);
  for (std::size_t at = 0; at < todo.size();) {
    const DecodePoint& p = todo[at];
    const auto a = make_attention(p.spec);  // check() has made every spec once
    // A constant-size decoder's step rows, its contexts one after another in the grid, are
    // timed together (run_step_turns); any other point alone.
    const bool turns = p.kind == "step" && !holds_every_token(*a);
    std::size_t end = at + 1;
    while (turns && end < todo.size() && todo[end].kind == "step" && todo[end].spec == p.spec &&
           todo[end].dim == p.dim && todo[end].kv == p.kv)
      ++end;
    const auto t0 = Clock::now();
    std::vector<CsvRecord> rows;
    for (std::size_t i = at; i < end; ++i) {
      rows.push_back(base_row(sweep, todo[i]));
      rows.back()[kThreads] = std::to_string(omp_get_max_threads());
    }
    if (turns) {
      run_step_turns(sweep, {todo.begin() + std::ptrdiff_t(at), todo.begin() + std::ptrdiff_t(end)},
                     *a, rows, bar);
    } else {
      bar.start(key_of(sweep, p));
      CsvRecord& row = rows.front();
      record_failure(row, [&] {
        const std::size_t tokens = capacity(sweep, p, *a);
        if (holds_every_token(*a) && cache_bytes(sweep, p, tokens) > budget) {
          row[kStatus] = "skipped";
          row[kMessage] = "a KV cache of " + std::to_string(tokens) +
                          " tokens would pass the memory budget of " + format_number(budget) +
                          " bytes";
        } else if (p.kind == "step") {
          run_step(sweep, p, *a, row);
        } else if (p.kind == "threads") {
          run_threads(sweep, p, *a, row);
        } else {
          run_prefill(sweep, p, *a, row);
        }
      });
    }
    const double each = seconds_since(t0) / double(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      file.append(rows[i]);
      ++appended;
      bar.done(key_of(sweep, todo[at + i]), rows[i][kStatus], each);
    }
    at = end;
  }
  render_decode_report(dir, sweep.gnuplot);
  return appended;
}

std::pair<std::size_t, std::size_t> merge_decode_results(const std::string& out_dir,
                                                         const std::vector<std::string>& in_dirs,
                                                         const std::string& gnuplot) {
  namespace fs = std::filesystem;
  if (in_dirs.empty()) throw Error("merge: no input directories");
  std::vector<std::string> sources;
  if (fs::exists(out_dir + "/decode.csv")) sources.push_back(out_dir);
  for (const std::string& d : in_dirs) {
    if (!fs::exists(d + "/decode.csv")) throw Error("merge: " + d + "/decode.csv does not exist");
    bool listed = false;  // the same directory given twice is read once
    for (const std::string& s : sources) listed = listed || fs::equivalent(s, d);
    if (!listed) sources.push_back(d);
  }
  // Columns that differ between two measurements of one point.
  const std::set<std::size_t> measured = {kReps,     kMedian, kMin,     kMax,       kStepsPerToken,
                                          kReadGbps, kShard,  kThreads, kOneThread, kBytesHeld};
  std::vector<CsvRecord> merged;
  std::map<std::string, std::pair<std::size_t, std::string>> seen;  // key -> (index, source)
  std::size_t duplicates = 0;
  for (const std::string& dir : sources) {
    const auto records = read_csv(dir + "/decode.csv");
    if (records.empty() || records.front() != decode_columns())
      throw Error("merge: " + dir +
                  "/decode.csv:1: the header is not the decode.csv schema of this attnlab");
    for (std::size_t i = 1; i < records.size(); ++i) {
      const CsvRecord& r = records[i];
      if (r.size() != kColumns)
        throw Error("merge: " + dir + "/decode.csv: record " + std::to_string(i + 1) + " has " +
                    std::to_string(r.size()) + " fields, expected " + std::to_string(kColumns));
      const auto it = seen.find(r[kKey]);
      if (it == seen.end()) {
        seen.emplace(r[kKey], std::make_pair(merged.size(), dir));
        merged.push_back(r);
        continue;
      }
      ++duplicates;
      const CsvRecord& first = merged[it->second.first];
      for (std::size_t c = 0; c < kColumns; ++c)
        if (!measured.count(c) && first[c] != r[c])
          throw Error("merge: key " + r[kKey] + " has conflicting " + decode_columns()[c] + ": '" +
                      first[c] + "' in " + it->second.second + " and '" + r[c] + "' in " + dir);
    }
  }
  fs::create_directories(out_dir);
  std::string text = csv_line(decode_columns());
  for (const CsvRecord& r : merged) text += csv_line(r);
  write_merged_meta(out_dir, sources);  // before the rows: reads out_dir/meta.json if a source
  write_atomically(out_dir + "/decode.csv", text);
  render_decode_report(out_dir, gnuplot);
  return {merged.size(), duplicates};
}

std::vector<std::string> decode_point_keys(const DecodeSweep& sweep) {
  std::vector<std::string> keys;
  for (const DecodePoint& p : points(sweep)) keys.push_back(key_of(sweep, p));
  return keys;
}

namespace {

double number_or_nan(const std::string& text) {
  try {
    return text.empty() ? std::nan("") : std::stod(text);
  } catch (const std::exception&) {
    return std::nan("");
  }
}

std::string fixed(double x, int digits) {
  if (!std::isfinite(x)) return "-";
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << x;
  return s.str();
}

// The step rows of (spec, dim, kv), by context.
std::map<std::int64_t, const DecodeRow*> steps_of(const DecodeResults& results,
                                                  const std::string& spec, std::int64_t dim,
                                                  std::int64_t kv) {
  std::map<std::int64_t, const DecodeRow*> out;
  for (const DecodeRow& r : results.rows)
    if (r.kind == "step" && r.spec == spec && r.dim == dim && r.kv == kv) out[r.context] = &r;
  return out;
}

// In order of first appearance: the specs, and the (D, Hkv) shapes sorted.
std::vector<std::string> specs_of(const DecodeResults& results) {
  std::vector<std::string> specs;
  for (const DecodeRow& r : results.rows)
    if (std::find(specs.begin(), specs.end(), r.spec) == specs.end()) specs.push_back(r.spec);
  return specs;
}

std::set<std::pair<std::int64_t, std::int64_t>> shapes_of(const DecodeResults& results) {
  std::set<std::pair<std::int64_t, std::int64_t>> shapes;
  for (const DecodeRow& r : results.rows) shapes.insert({r.dim, r.kv});
  return shapes;
}

std::string shape_text(std::int64_t dim, std::int64_t kv) {
  return "D = " + std::to_string(dim) + ", Hkv = " + std::to_string(kv);
}

std::string ratio_text(double x) {
  return fixed(x, 2);
}

// "412.3 us", "12.34 ms": a step time.
std::string step_text(double seconds) {
  return seconds < 1e-3 ? fixed(seconds * 1e6, 1) + " us" : fixed(seconds * 1e3, 2) + " ms";
}

DecodeCheck verdict(bool pass, std::string text) {
  return {pass ? "pass" : "FAIL", std::move(text)};
}

// How a variant's decoder holds its context, read from the rows: a KV cache grows with the
// context; sliding keeps a ring of its window; the other constant-size decoders, a state.
enum class Holds { kCache, kRing, kState };

Holds holds_of(const std::map<std::int64_t, const DecodeRow*>& steps) {
  double lo = INFINITY, hi = 0;
  for (const auto& [n, r] : steps) {
    lo = std::min(lo, r->bytes);
    hi = std::max(hi, r->bytes);
  }
  if (hi > lo) return Holds::kCache;
  return steps.begin()->second->variant == "sliding" ? Holds::kRing : Holds::kState;
}

// Tokens a ring of `bytes` holds: B·Hkv·(K and V)·D floats a token.
double ring_tokens(const DecodeRow& r) {
  return r.bytes / (double(r.batch) * double(r.kv) * 2.0 * double(r.dim) * sizeof(float));
}

// Full's step reads its cache at >= 0.7x the bandwidth at contexts >= 64K: the worst point.
std::vector<DecodeCheck> full_bandwidth_check(const DecodeResults& results) {
  constexpr double kFloor = 0.7;
  constexpr std::int64_t kFrom = 65536;
  const DecodeRow* worst = nullptr;
  for (const DecodeRow& r : results.rows)
    if (r.kind == "step" && r.variant == "full" && r.context >= kFrom &&
        (!worst || r.gbps < worst->gbps))
      worst = &r;
  const std::string what =
      "`full`'s step reads its KV cache at >= 0.7x the run's bandwidth at contexts >= 64K";
  if (!worst || !std::isfinite(results.bandwidth_gbps))
    return {{"n/a", what + ": no full step row at 64K or more, or no bandwidth row"}};
  const double ratio = worst->gbps / results.bandwidth_gbps;
  return {verdict(ratio >= kFloor, what + ": " + ratio_text(ratio) + "x at worst (" +
                                       fixed(worst->gbps, 1) + " of " +
                                       fixed(results.bandwidth_gbps, 1) + " GB/s, " +
                                       tokens_text(worst->context) + ", " +
                                       shape_text(worst->dim, worst->kv) + ")")};
}

// Full's step at B = 1 uses every core: its speed-up on T threads over one (one thread's step
// time / T threads') >= 0.8 x what the memory allows, min(T, the run's bandwidth on T threads /
// on one), at the worst threads row at contexts >= 64K. The step reads its whole cache: where
// one core already draws most of the memory's bandwidth, no split gives T. A step on one core
// gives 1.0 and fails wherever the memory scales by more than 1.25 (1 / 0.8); below that the
// rows cannot tell the two apart: n/a.
std::vector<DecodeCheck> full_threads_check(const DecodeResults& results) {
  constexpr double kEfficiency = 0.8;
  constexpr std::int64_t kFrom = 65536;
  const double memory_scaling = results.bandwidth_gbps / results.one_thread_bandwidth_gbps;
  const auto speedup = [](const DecodeRow& r) { return r.one_thread_time / r.time; };
  const auto allowed = [&](const DecodeRow& r) {
    return std::min(double(r.threads), memory_scaling);
  };
  const DecodeRow* worst = nullptr;
  for (const DecodeRow& r : results.rows)
    if (r.kind == "threads" && r.batch == 1 && r.context >= kFrom && r.threads > 1 &&
        std::isfinite(r.one_thread_time) &&
        (!worst || speedup(r) / allowed(r) < speedup(*worst) / allowed(*worst)))
      worst = &r;
  const std::string what =
      "`full`'s step uses every core at contexts >= 64K (one thread's step time / T threads' >= "
      "0.8 x min(T, the memory's bandwidth on T threads / on one)";
  if (!worst) return {{"n/a", what + "): no threads row of full at B = 1, 64K or more and T >= 2"}};
  if (!std::isfinite(memory_scaling))
    return {{"n/a", what + "): no bandwidth rows on one thread and on more"}};
  const std::string where =
      " (" + step_text(worst->one_thread_time) + " on one thread, " + step_text(worst->time) +
      " on " + std::to_string(worst->threads) + ", " + tokens_text(worst->context) + ", " +
      shape_text(worst->dim, worst->kv) + "; bandwidth " + fixed(results.bandwidth_gbps, 1) +
      " GB/s on " + std::to_string(worst->threads) + " threads, " +
      fixed(results.one_thread_bandwidth_gbps, 1) + " on one)";
  const double floor = kEfficiency * allowed(*worst);
  if (floor <= 1.0)
    return {{"n/a", what + "): the memory scales by " + ratio_text(memory_scaling) +
                        " from one thread, too little to tell a split step from one core's" +
                        where}};
  return {verdict(speedup(*worst) >= floor, what + ", here " + fixed(floor, 2) + "): " +
                                                ratio_text(speedup(*worst)) + " at worst" + where)};
}

// Constant-memory steps are flat: max / min <= 1.2 (sliding's beyond its window).
std::vector<DecodeCheck> flat_checks(const DecodeResults& results) {
  constexpr double kCeiling = 1.2;
  std::vector<DecodeCheck> out;
  for (const std::string& spec : specs_of(results)) {
    double worst = 0;
    std::string where;
    bool any = false;
    for (const auto& [dim, kv] : shapes_of(results)) {
      const auto steps = steps_of(results, spec, dim, kv);
      if (steps.empty() || holds_of(steps) == Holds::kCache) continue;
      any = true;
      const bool ring = holds_of(steps) == Holds::kRing;
      double lo = INFINITY, hi = 0;
      std::int64_t first = 0, last = 0, count = 0;
      for (const auto& [n, r] : steps) {
        if (ring && double(n) < ring_tokens(*r)) continue;  // inside the window, it grows
        lo = std::min(lo, r->time);
        hi = std::max(hi, r->time);
        first = count++ == 0 ? n : first;
        last = n;
      }
      if (count < 2 || hi / lo <= worst) continue;
      worst = hi / lo;
      where = tokens_text(first) + " to " + tokens_text(last) + ", " + shape_text(dim, kv);
    }
    if (!any) continue;
    const std::string what = "`" + spec + "`'s step time is flat" +
                             (spec.rfind("sliding", 0) == 0 ? " beyond its window" : "") +
                             ", max / min <= 1.2";
    if (where.empty())
      out.push_back({"n/a", what + ": fewer than 2 contexts measured"});
    else
      out.push_back(verdict(worst <= kCeiling,
                            what + ": " + ratio_text(worst) + " at worst (" + where + ")"));
  }
  return out;
}

// A recurrent step at D = 128 takes <= 1.5x one read and one write of its state.
std::vector<DecodeCheck> state_traffic_checks(const DecodeResults& results) {
  constexpr double kCeiling = 1.5;
  constexpr std::int64_t kDim = 128;
  std::vector<DecodeCheck> out;
  for (const std::string& spec : specs_of(results)) {
    double worst = 0;
    std::string where;
    for (const auto& [dim, kv] : shapes_of(results)) {
      const auto steps = steps_of(results, spec, dim, kv);
      if (dim != kDim || steps.empty() || holds_of(steps) != Holds::kState) continue;
      std::vector<double> times;
      for (const auto& [n, r] : steps) times.push_back(r->time);
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      const double bytes = steps.begin()->second->bytes;
      const double ratio = median / (2 * bytes / (results.bandwidth_gbps * 1e9));
      if (!(ratio > worst)) continue;
      worst = ratio;
      where = "median step " + fixed(median * 1e6, 1) + " us over " + std::to_string(times.size()) +
              " contexts, a state of " + fixed(bytes / 1024.0, 0) + " KiB, " + shape_text(dim, kv);
    }
    if (where.empty()) continue;
    out.push_back(
        verdict(worst <= kCeiling, "`" + spec +
                                       "`'s step at D = 128 takes <= 1.5x one read and one write "
                                       "of its state at the run's bandwidth: " +
                                       ratio_text(worst) + "x at worst (" + where + ")"));
  }
  return out;
}

// Chunked prefill no slower than token by token for N >= 256, D >= 64: per variant and D.
std::vector<DecodeCheck> prefill_checks(const DecodeResults& results) {
  constexpr std::int64_t kFromN = 256, kFromDim = 64;
  std::vector<DecodeCheck> out;
  for (const std::string& spec : specs_of(results)) {
    std::map<std::int64_t, const DecodeRow*> worst;  // by D
    for (const DecodeRow& r : results.rows) {
      if (r.kind != "prefill" || r.spec != spec || r.context < kFromN || r.dim < kFromDim) continue;
      const DecodeRow*& w = worst[r.dim];
      if (!w || r.time / r.steps_per_token > w->time / w->steps_per_token) w = &r;
    }
    for (const auto& [dim, r] : worst) {
      const double ratio = r->time / r->steps_per_token;
      out.push_back(verdict(ratio <= 1.0,
                            "`" + spec + "`'s chunked prefill at D = " + std::to_string(dim) +
                                " is no slower than token by token (N >= 256): "
                                "chunked / token by token " +
                                ratio_text(ratio) + " at worst (N = " + std::to_string(r->context) +
                                ", Hkv = " + std::to_string(r->kv) + ")"));
    }
  }
  return out;
}

}  // namespace

std::string tokens_text(std::int64_t n) {
  if (n >= (1 << 20) && n % (1 << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

DecodeResults read_decode_results(const std::string& csv, const std::vector<std::string>* keys) {
  const auto records = read_csv(csv);
  DecodeResults out;
  if (records.empty()) return out;
  // Where each column of this attnlab is in the file (an older file lacks the last ones).
  std::vector<std::size_t> at(kColumns, std::string::npos);
  for (std::size_t c = 0; c < kColumns; ++c) {
    const auto& header = records.front();
    const auto it = std::find(header.begin(), header.end(), decode_columns()[c]);
    if (it != header.end()) at[c] = std::size_t(it - header.begin());
  }
  for (const Column c : {kKey, kKind, kStatus})
    if (at[c] == std::string::npos)
      throw Error(csv + ":1: the header has no '" + decode_columns()[c] + "' column");
  std::map<std::int64_t, std::vector<double>> bandwidths;  // by threads (0: not recorded)
  const std::set<std::string> wanted =
      keys ? std::set<std::string>(keys->begin(), keys->end()) : std::set<std::string>();
  for (std::size_t i = 1; i < records.size(); ++i) {
    if (records[i].size() != records.front().size()) continue;
    const auto cell = [&](Column c) -> std::string {
      return at[c] == std::string::npos ? std::string() : records[i][at[c]];
    };
    if (cell(kStatus) != "ok") continue;
    const double threads = number_or_nan(cell(kThreads));
    if (cell(kKind) == "bandwidth") {
      bandwidths[std::isfinite(threads) ? std::int64_t(threads) : 0].push_back(
          number_or_nan(cell(kReadGbps)));
      continue;
    }
    if (keys && !wanted.count(cell(kKey))) continue;
    out.rows.push_back({cell(kKind), cell(kSpec), cell(kVariant), std::stoll(cell(kBatch)),
                        std::stoll(cell(kHeads)), std::stoll(cell(kKvHeads)),
                        std::stoll(cell(kDim)), std::stoll(cell(kContext)),
                        number_or_nan(cell(kMedian)), number_or_nan(cell(kStepsPerToken)),
                        number_or_nan(cell(kBytesHeld)), number_or_nan(cell(kReadGbps)),
                        std::isfinite(threads) ? std::int64_t(threads) : 0,
                        number_or_nan(cell(kOneThread))});
  }
  const auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  out.bandwidth_gbps = bandwidths.empty() ? std::nan("") : median(bandwidths.rbegin()->second);
  out.one_thread_bandwidth_gbps = std::nan("");
  if (bandwidths.count(1) && bandwidths.rbegin()->first > 1)
    out.one_thread_bandwidth_gbps = median(bandwidths.at(1));
  return out;
}

std::optional<std::int64_t> cheaper_than_full_from(const DecodeResults& results,
                                                   const std::string& spec, std::int64_t dim,
                                                   std::int64_t kv) {
  const auto mine = steps_of(results, spec, dim, kv);
  const auto full = steps_of(results, "full", dim, kv);
  std::optional<std::int64_t> from;
  for (const auto& [n, r] : mine) {
    const auto f = full.find(n);
    if (f == full.end()) continue;
    if (r->time < f->second->time) {
      if (!from) from = n;
    } else {
      from.reset();
    }
  }
  return from;
}

std::vector<DecodeCheck> decode_speed_checks(const DecodeResults& results) {
  std::vector<DecodeCheck> out;
  for (auto part : {full_bandwidth_check, full_threads_check, flat_checks, state_traffic_checks,
                    prefill_checks})
    for (DecodeCheck& c : part(results)) out.push_back(std::move(c));
  return out;
}

void render_decode_report(const std::string& dir, const std::string& gnuplot) {
  const DecodeResults results = read_decode_results(dir + "/decode.csv");
  const double bandwidth = results.bandwidth_gbps;
  const std::vector<std::string> specs = specs_of(results);
  std::set<std::int64_t> contexts, prompts;
  for (const DecodeRow& r : results.rows) {
    if (r.kind == "step") contexts.insert(r.context);
    if (r.kind == "prefill") prompts.insert(r.context);
  }
  const auto find = [&](const std::string& kind, const std::string& spec, std::int64_t d,
                        std::int64_t kv, std::int64_t n) -> const DecodeRow* {
    for (const DecodeRow& r : results.rows)
      if (r.kind == kind && r.spec == spec && r.dim == d && r.kv == kv && r.context == n) return &r;
    return nullptr;
  };
  std::ostringstream md;
  md << "# Decode sweep\n\nRendered by `attnlab decode` from decode.csv (harness/decode.hpp says "
        "what each column measures); the run's context is in meta.json. B = 1 unless the rows "
        "say otherwise.\n\n";
  md << "Streaming read bandwidth of the run (median of its bandwidth rows): "
     << fixed(bandwidth, 1) << " GB/s";
  if (std::isfinite(results.one_thread_bandwidth_gbps))
    md << " on every thread, " << fixed(results.one_thread_bandwidth_gbps, 1) << " on one";
  md << ".\n\n";
  md << "## Speed checks\n\nThe ratios of docs/decoding.md, each from the rows below (the worst "
        "over the shapes measured):\n\n";
  for (const DecodeCheck& c : decode_speed_checks(results))
    md << "- **" << c.verdict << "** " << c.text << "\n";
  PlotFiles files;
  Plotter plotter(std::filesystem::path(dir) / "plots", gnuplot, files);
  for (const auto& [d, kv] : shapes_of(results)) {
    const std::string shape = shape_text(d, kv);
    md << "\n## " << shape << "\n\nMicroseconds per decoded token at each context (bytes held "
       << "after it, MiB, in brackets):\n\n| variant |";
    for (const std::int64_t n : contexts) md << " " << tokens_text(n) << " |";
    md << " max / min |\n| --- |";
    for (std::size_t i = 0; i <= contexts.size(); ++i) md << " --- |";
    md << "\n";
    std::vector<Series> times, memory;
    for (const std::string& spec : specs) {
      Series t{spec, {}}, m{spec, {}};
      std::string line = "| `" + spec + "` |";
      double lo = INFINITY, hi = 0;
      for (const std::int64_t n : contexts) {
        const DecodeRow* r = find("step", spec, d, kv, n);
        if (!r) {
          line += " - |";
          continue;
        }
        line.append(" ").append(fixed(r->time * 1e6, 1));
        line.append(" (").append(fixed(r->bytes / 1048576.0, 1)).append(") |");
        t.xy.emplace_back(double(n), r->time);
        m.xy.emplace_back(double(n), r->bytes);
        lo = std::min(lo, r->time);
        hi = std::max(hi, r->time);
      }
      if (t.xy.empty()) continue;
      md << line << " " << fixed(hi / lo, 2) << " |\n";
      times.push_back(std::move(t));
      memory.push_back(std::move(m));
    }
    md << "\nThe context from which each variant's step is cheaper than `full`'s (the first "
          "measured context where it is, and stays so):\n\n| variant | context |\n| --- | --- |\n";
    for (const std::string& spec : specs) {
      if (spec == "full" || steps_of(results, spec, d, kv).empty()) continue;
      const auto from = cheaper_than_full_from(results, spec, d, kv);
      md << "| `" << spec << "` | " << (from ? tokens_text(*from) : "not in the measured range")
         << " |\n";
    }
    md << "\n`full`'s step reads its whole cache: GB/s read (bytes held / step time) and its "
          "fraction of the run's bandwidth:\n\n| context | GB/s | x bandwidth |\n| --- | --- | --- "
          "|\n";
    for (const std::int64_t n : contexts)
      if (const DecodeRow* f = find("step", "full", d, kv, n))
        md << "| " << tokens_text(n) << " | " << fixed(f->gbps, 2) << " | "
           << fixed(f->gbps / bandwidth, 2) << " |\n";
    if (!prompts.empty()) {
      md << "\nPrefill, seconds per token: chunked / token-by-token (below 1: chunked is "
            "faster):\n\n| variant |";
      for (const std::int64_t n : prompts) md << " N = " << n << " |";
      md << "\n| --- |";
      for (std::size_t i = 0; i < prompts.size(); ++i) md << " --- |";
      md << "\n";
      for (const std::string& spec : specs) {
        md << "| `" << spec << "` |";
        for (const std::int64_t n : prompts) {
          const DecodeRow* r = find("prefill", spec, d, kv, n);
          md << " " << (r ? fixed(r->time / r->steps_per_token, 2) : "-") << " |";
        }
        md << "\n";
      }
    }
    const std::string name = "d" + std::to_string(d) + "_hkv" + std::to_string(kv);
    const std::string common =
        "set grid\nset key below left Left reverse maxcols 2 noenhanced\nset logscale x 2\n"
        "set logscale y\nset xlabel 'context (tokens held)'\n";
    // The Plotter gives each series its colour and marker: the style names neither.
    plotter.plot("step_" + name, times,
                 common + "set ylabel 'seconds per decoded token'\nset title " +
                     gp_quote("Step time vs context (" + shape + ")") + " noenhanced\n",
                 "using 1:2 with linespoints lw 2");
    plotter.plot("memory_" + name, memory,
                 common + "set ylabel 'bytes held'\nset title " +
                     gp_quote("Memory vs context (" + shape + ")") + " noenhanced\n",
                 "using 1:2 with linespoints lw 2");
    md << "\n![step time](plots/step_" << name << ".png) ![memory](plots/memory_" << name
       << ".png)\n";
  }
  if (!files.plot_note.empty()) md << "\n" << files.plot_note << "\n";
  write_atomically(dir + "/report.md", md.str());
}

}  // namespace attnlab::harness
