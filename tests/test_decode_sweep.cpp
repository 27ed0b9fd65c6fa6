// The decode sweep (harness/decode.hpp) at a tiny size: its rows, the statuses of what a variant
// refuses, rejects or passes the memory budget with, the bytes a KV cache holds, delta-product's
// rows per token, full's one-thread steps, resume, and shards merged; and what is rendered from
// rows (the speed checks, the crossover against full, the summary's lines) on synthetic rows
// whose answers are worked out by hand.
#include <omp.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "attnlab/csv.hpp"
#include "harness/decode.hpp"
#include "harness/summary.hpp"
#include "helpers.hpp"
#include "npy_helpers.hpp"

using namespace attnlab;
using attnlab::test::read_text;
using attnlab::test::TempDir;

namespace {

harness::DecodeSweep tiny() {
  harness::DecodeSweep s;
  s.specs = {"full", "gla", "linformer:k=4"};
  s.contexts = {64, 200};
  s.prefill_lengths = {32};
  s.dims = {8};
  s.kv_heads = {2, 1};
  s.heads = 2;
  s.steps = 3;
  s.reps = 1;
  s.bandwidth_bytes = std::size_t(1) << 20;
  return s;
}

// <folder>/decode.csv's rows (the header dropped) as {key: record}.
std::map<std::string, CsvRecord> rows(const std::string& folder) {
  const auto records = read_csv(folder + "/decode.csv");
  REQUIRE(records.front() == harness::decode_columns());
  std::map<std::string, CsvRecord> by_key;
  for (std::size_t i = 1; i < records.size(); ++i) by_key[records[i][0]] = records[i];
  return by_key;
}

std::map<std::string, CsvRecord> rows(const TempDir& dir) {
  return rows(dir.path().string());
}

std::string cell(const CsvRecord& r, const std::string& column) {
  const auto& names = harness::decode_columns();
  return r.at(std::size_t(std::find(names.begin(), names.end(), column) - names.begin()));
}

// A decode.csv row: kind, spec, D, Hkv, context, seconds, bytes held, GB/s (B = 1, H = 8), and
// for a prefill row the token-by-token seconds per token.
CsvRecord row(const std::string& kind, const std::string& spec, int dim, int kv, long context,
              double seconds, double bytes, double gbps, double steps_per_token = 0) {
  std::map<std::string, std::string> by_column = {
      {"key", kind + "|" + spec + "|" + std::to_string(dim) + "|" + std::to_string(kv) + "|" +
                  std::to_string(context)},
      {"kind", kind},
      {"spec", spec},
      {"variant", spec.substr(0, spec.find(':'))},
      {"batch", "1"},
      {"heads", "8"},
      {"kv_heads", std::to_string(kv)},
      {"dim", std::to_string(dim)},
      {"context", std::to_string(context)},
      {"status", "ok"},
      {"time_median_s", format_number(seconds)},
      {"bytes_held", format_number(bytes)},
      {"read_gbps", gbps > 0 ? format_number(gbps) : ""},
      {"steps_s_per_token", steps_per_token > 0 ? format_number(steps_per_token) : ""}};
  CsvRecord r;
  for (const std::string& column : harness::decode_columns()) r.push_back(by_column[column]);
  return r;
}

// `r` timed on `threads` threads, and on one in `one_thread` seconds.
CsvRecord threaded(CsvRecord r, int threads, double one_thread) {
  r[r.size() - 2] = std::to_string(threads);
  r.back() = format_number(one_thread);
  return r;
}

CsvRecord bandwidth_row(int n, double gbps, int threads) {
  CsvRecord r(harness::decode_columns().size());
  r[0] = "bandwidth|" + std::to_string(n);
  r[1] = "bandwidth";
  r[9] = "ok";
  r[17] = format_number(gbps);
  r[19] = std::to_string(threads);
  return r;
}

// Bandwidth rows an invocation writes: on every thread, and on one when it has more.
std::size_t yardsticks() {
  return omp_get_max_threads() > 1 ? 2 : 1;
}

// The verdict of the check whose text holds every part, or "" when none does.
std::string verdict_of(const std::vector<harness::DecodeCheck>& checks,
                       std::initializer_list<std::string> parts) {
  for (const auto& c : checks)
    if (std::all_of(parts.begin(), parts.end(),
                    [&](const std::string& p) { return c.text.find(p) != std::string::npos; }))
      return c.verdict;
  return "";
}

// The words of the line of `text` whose first word is `first`.
std::vector<std::string> line_words(const std::string& text, const std::string& first) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    if (!words.empty() && words[0] == first) return words;
  }
  return {};
}

}  // namespace

TEST_CASE("the decode sweep: rows, refusals, bytes held and resume", "[decoding][harness]") {
  TempDir dir("decode");
  // 3 specs · 2 Hkv · (2 steps + 1 prefill), and full's threads row per Hkv.
  constexpr std::size_t kPoints = 3 * 2 * 3 + 2;
  CHECK(harness::run_decode_sweep(dir.path().string(), tiny(), nullptr) == yardsticks() + kPoints);
  const auto by_key = rows(dir);
  REQUIRE(by_key.size() == yardsticks() + kPoints);
  std::size_t bandwidth = 0;
  for (const auto& [key, r] : by_key) {
    INFO(key << ": " << cell(r, "message"));
    const std::string kind = cell(r, "kind"), variant = cell(r, "variant");
    if (kind == "bandwidth") {
      ++bandwidth;
      CHECK(std::stod(cell(r, "read_gbps")) > 0);
      continue;
    }
    const bool refused = variant == "linformer";  // gla decodes grouped heads too
    CHECK(cell(r, "status") == (refused ? "unsupported" : "ok"));
    if (refused) {
      CHECK(cell(r, "message").find("decoding") != std::string::npos);
      continue;
    }
    CHECK(std::stod(cell(r, "time_median_s")) > 0);
    if (kind == "prefill") CHECK(std::stod(cell(r, "steps_s_per_token")) > 0);
    CHECK(cell(r, "threads") == std::to_string(omp_get_max_threads()));
    CHECK(cell(r, "shard").empty());
    // full's threads rows: its step at the largest context, 200, on every thread and on one.
    const bool threads = kind == "threads";
    if (threads) CHECK((variant == "full" && cell(r, "context") == "200"));
    CHECK(cell(r, "time_1thread_s").empty() == !threads);
    if (threads) CHECK(std::stod(cell(r, "time_1thread_s")) > 0);
    if (variant == "full" && kind != "prefill") {
      // A cache of context + (steps + 2) slots, twice the steps in a threads row; Hkv heads.
      const std::size_t slots = std::stoul(cell(r, "context")) + (3 + 2) * (threads ? 2 : 1);
      CHECK(cell(r, "bytes_held") ==
            std::to_string(slots * std::stoul(cell(r, "kv_heads")) * 16 * sizeof(float)));
    }
    if (kind == "step" && variant == "gla")
      CHECK(cell(r, "bytes_held") == std::to_string(2 * 64 * 4));
    if (kind == "step") {  // bursts of 3 steps: one for a KV cache, turns of them for gla
      const std::size_t timed = std::stoul(cell(r, "reps"));
      CHECK(timed % 3 == 0);
      CHECK((variant == "full" ? timed == 3 : timed > 3));
      const double median = std::stod(cell(r, "time_median_s"));  // the least burst median
      CHECK(std::stod(cell(r, "time_min_s")) <= median);
      CHECK(median <= std::stod(cell(r, "time_max_s")));
    }
  }
  CHECK(bandwidth == yardsticks());
  // The report, rendered from the rows: a table per (D, Hkv) with every decoded variant.
  const std::string report = read_text(dir.file("report.md"));
  for (const char* part : {"## D = 8, Hkv = 2", "## D = 8, Hkv = 1", "`full`", "`gla`", "N = 32"})
    CHECK(report.find(part) != std::string::npos);
  CHECK(report.find("gnuplot failed") == std::string::npos);  // the plots' scripts run
  // The summary of the grid's points: one table per (D, Hkv), full and gla in each.
  const std::vector<std::string> keys = harness::decode_point_keys(tiny());
  const std::string summary =
      harness::decode_summary("x", harness::read_decode_results(dir.file("decode.csv"), &keys));
  INFO(summary);
  CHECK(summary.find("B=1 H=2 Hkv=2 D=8") != std::string::npos);
  CHECK(summary.find("B=1 H=2 Hkv=1 D=8") != std::string::npos);
  CHECK(line_words(summary, "gla").size() == 7);  // gla 200 1.2 us 2 KiB 64
  CHECK(summary.find("full's step at 200 on one thread: ") != std::string::npos);
  // Resume: every point is there, so a second run adds its bandwidth rows only.
  CHECK(harness::run_decode_sweep(dir.path().string(), tiny(), nullptr) == yardsticks());
  CHECK(rows(dir).size() == 2 * yardsticks() + kPoints);
}

TEST_CASE("the decode sweep skips a KV cache past the memory budget", "[decoding][harness]") {
  TempDir dir("decode-budget");
  harness::DecodeSweep s = tiny();
  s.specs = {"full", "sliding:left=8,right=0"};
  s.prefill_lengths = {};
  s.kv_heads = {2};
  s.memory_budget_bytes = 4096;  // 64 tokens' cache is 64·2·16·4 = 8 KiB
  harness::run_decode_sweep(dir.path().string(), s, nullptr);
  for (const auto& [key, r] : rows(dir)) {
    if (cell(r, "kind") == "bandwidth") continue;
    INFO(key);
    CHECK(cell(r, "status") == (cell(r, "variant") == "full" ? "skipped" : "ok"));
  }
  s.contexts = {0};
  CHECK_THROWS_WITH(harness::run_decode_sweep(dir.path().string(), s, nullptr),
                    Catch::Contains("--contexts 0"));
}

TEST_CASE("the decode report's speed checks, crossover and summary come from the rows",
          "[decoding][harness]") {
  TempDir dir("decode-render");
  const double state = 8 * 128 * 128 * 4;      // a recurrent state of H = 8, D = 128: 512 KiB
  const double ring = 1025 * 8 * 2 * 128 * 4;  // sliding:left=1024's ring of 1025 tokens
  const std::vector<CsvRecord> records = {
      harness::decode_columns(), bandwidth_row(1, 10, 2), bandwidth_row(2, 20, 2),
      bandwidth_row(3, 30, 2),  // median 20 GB/s on 2 threads
      bandwidth_row(4, 10, 1),  // 10 on one: the memory scales by 2.0
      // full at 64K reads 16 GB/s (0.8x), at 1M 13 GB/s (0.65x): the check fails at 1M.
      row("step", "full", 128, 8, 1024, 1e-4, 8.4e6, 84),
      row("step", "full", 128, 8, 65536, 5e-3, 5.4e8, 16),
      row("step", "full", 128, 8, 1048576, 8e-2, 8.6e9, 13),
      // full's step at 1M on 2 threads, and on one: 2.00 >= 0.8 x min(2, 2.0) = 1.6.
      threaded(row("threads", "full", 128, 8, 1048576, 8e-2, 8.6e9, 0), 2, 0.16),
      // cheaper than full at 1K, not at 64K, again at 1M: cheaper from 1M (it must stay so).
      row("step", "bigbird", 128, 8, 1024, 5e-5, 8.4e6, 0),
      row("step", "bigbird", 128, 8, 65536, 6e-3, 5.4e8, 0),
      row("step", "bigbird", 128, 8, 1048576, 7e-2, 8.6e9, 0),
      // 1.15 max / min; a step of 11 us against 2·512 KiB / 20 GB/s = 52.4 us: 0.21x.
      row("step", "gla", 128, 8, 1024, 1e-5, state, 0),
      row("step", "gla", 128, 8, 65536, 1.1e-5, state, 0),
      row("step", "gla", 128, 8, 1048576, 1.15e-5, state, 0),
      // flat (1.00), but 100 us a step: 1.91x the state's read and write.
      row("step", "linear", 128, 8, 1024, 1e-4, state, 0),
      row("step", "linear", 128, 8, 65536, 1e-4, state, 0),
      row("step", "linear", 128, 8, 1048576, 1e-4, state, 0),
      // never cheaper than full; 500x from 1K to 1M.
      row("step", "delta", 128, 8, 1024, 2e-4, state, 0),
      row("step", "delta", 128, 8, 65536, 1e-2, state, 0),
      row("step", "delta", 128, 8, 1048576, 0.1, state, 0),
      // its 1K row sits inside the window (1025 tokens): flat over 64K to 1M, 1.10.
      row("step", "sliding:left=1024,right=0", 128, 8, 1024, 2e-4, ring, 0),
      row("step", "sliding:left=1024,right=0", 128, 8, 65536, 5e-5, ring, 0),
      row("step", "sliding:left=1024,right=0", 128, 8, 1048576, 5.5e-5, ring, 0),
      // prefill: gla's worst at D = 128 is N = 4096 (1.5); N = 128 and D = 32 are outside the
      // claim (N >= 256, D >= 64) though slower still; full's 0.5.
      row("prefill", "gla", 128, 8, 256, 1e-6, state, 0, 2e-6),
      row("prefill", "gla", 128, 8, 4096, 3e-6, state, 0, 2e-6),
      row("prefill", "gla", 128, 8, 128, 9e-6, state, 0, 1e-6),
      row("prefill", "full", 32, 8, 4096, 5e-6, 1, 0, 1e-6),
      row("prefill", "full", 128, 8, 1024, 1e-6, 1, 0, 2e-6)};
  {
    std::ofstream out(dir.file("decode.csv"));
    for (const CsvRecord& r : records) out << csv_line(r);
  }
  const auto results = harness::read_decode_results(dir.file("decode.csv"));
  CHECK(results.bandwidth_gbps == 20);
  CHECK(results.one_thread_bandwidth_gbps == 10);
  CHECK(results.rows.size() == records.size() - 5);

  CHECK(harness::cheaper_than_full_from(results, "gla", 128, 8) == 1024);
  CHECK(harness::cheaper_than_full_from(results, "bigbird", 128, 8) == 1048576);
  CHECK(harness::cheaper_than_full_from(results, "sliding:left=1024,right=0", 128, 8) == 65536);
  CHECK_FALSE(harness::cheaper_than_full_from(results, "delta", 128, 8));
  CHECK_FALSE(harness::cheaper_than_full_from(results, "gla", 64, 8));  // no such shape

  const auto checks = harness::decode_speed_checks(results);
  for (const auto& c : checks) INFO(c.verdict << " " << c.text);
  CHECK(verdict_of(checks, {"`full`'s step reads", "0.65x at worst", "1M"}) == "FAIL");
  // full's threads row at 1M: 0.16 s on one thread against 0.08 s on 2, 2.00 >= 1.6.
  CHECK(verdict_of(checks, {"`full`'s step uses every core", "here 1.60): 2.00 at worst",
                            "160.00 ms on one thread, 80.00 ms on 2, 1M",
                            "bandwidth 20.0 GB/s on 2 threads, 10.0 on one"}) == "pass");
  CHECK(verdict_of(checks, {"`gla`'s step time is flat", "1.15 at worst", "1K to 1M"}) == "pass");
  CHECK(verdict_of(checks, {"`linear`'s step time is flat", "1.00"}) == "pass");
  CHECK(verdict_of(checks, {"`delta`'s step time is flat", "500.00"}) == "FAIL");
  CHECK(verdict_of(checks, {"`sliding:left=1024,right=0`'s step time is flat beyond its window",
                            "1.10 at worst", "64K to 1M"}) == "pass");
  CHECK(verdict_of(checks, {"`bigbird`'s step time is flat"}).empty());  // a KV cache grows
  CHECK(verdict_of(checks, {"`gla`'s step at D = 128", "0.21x"}) == "pass");
  CHECK(verdict_of(checks, {"`linear`'s step at D = 128", "1.91x"}) == "FAIL");
  CHECK(verdict_of(checks, {"`sliding:left=1024,right=0`'s step at D = 128"}).empty());
  CHECK(verdict_of(checks, {"`gla`'s chunked prefill at D = 128", "1.50 at worst", "N = 4096"}) ==
        "FAIL");
  CHECK(verdict_of(checks, {"`full`'s chunked prefill at D = 128", "0.50"}) == "pass");
  CHECK(verdict_of(checks, {"`full`'s chunked prefill at D = 32"}).empty());

  // The summary: per variant its largest context, step, bytes held and crossover.
  const std::string summary = harness::decode_summary("runs/x", results);
  INFO(summary);
  CHECK(summary.find("bandwidth 20.0 GB/s") != std::string::npos);
  CHECK(summary.find("B=1 H=8 Hkv=8 D=128") != std::string::npos);
  CHECK(line_words(summary, "full") ==
        std::vector<std::string>{"full", "1M", "80.00", "ms", "8.01", "GiB", "-"});
  CHECK(line_words(summary, "gla") ==
        std::vector<std::string>{"gla", "1M", "11.5", "us", "512", "KiB", "1K"});
  CHECK(line_words(summary, "bigbird").back() == "1M");
  CHECK(line_words(summary, "delta") == std::vector<std::string>{"delta", "1M", "100.00", "ms",
                                                                 "512", "KiB", "none", "up", "to",
                                                                 "1M"});
  CHECK(line_words(summary, "sliding:left=1024,right=0").back() == "64K");

  // report.md holds the checks as lines, and the tables.
  harness::render_decode_report(dir.path().string(), "no-such-gnuplot");
  const std::string report = read_text(dir.file("report.md"));
  for (const char* part :
       {"## Speed checks", "- **FAIL** `full`'s step reads its KV cache at >= 0.7x",
        "- **pass** `gla`'s step time is flat", "## D = 128, Hkv = 8", "| `bigbird` | 1M |",
        "| `delta` | not in the measured range |", "| `gla` | 9.00 | 0.50 | - | 1.50 |",
        "| 1M | 13.00 | 0.65 |", "could not be run"})
    CHECK(report.find(part) != std::string::npos);
}

namespace {

// A causal variant whose decoder rejects every call (an Error, not Unsupported): the sweep
// must make it a row and go on.
class RejectsDecoding final : public Attention {
 public:
  std::string spec() const override { return "test-rejects-decoding"; }
  Support support() const override { return {}; }
  std::unique_ptr<TokenDecoder> start_decoding(const DecodeConfig&) const override {
    throw Error("test-rejects-decoding: k has 1 row, expected 2");
  }

 protected:
  void compute(TensorRef, TensorRef, TensorRef, const Mask&, const TokenInputs&, const Dims&,
               Tensor& out, Saved*) const override {
    out.fill(0);
  }
};

}  // namespace

TEST_CASE("the decode sweep measures delta-product's rows and goes on past what cannot decode",
          "[decoding][harness]") {
  register_attention(
      "test-rejects-decoding",
      [](Params&) -> std::unique_ptr<Attention> { return std::make_unique<RejectsDecoding>(); },
      9999);
  TempDir dir("decode-refusals");
  harness::DecodeSweep s = tiny();
  s.specs = {"delta-product:steps=2", "linformer:k=4", "test-rejects-decoding",
             "delta-product:steps=3"};
  s.kv_heads = {2};
  s.gnuplot = "no-such-gnuplot";  // the plots' scripts are tested above
  CHECK(harness::run_decode_sweep(dir.path().string(), s, nullptr) == yardsticks() + 4 * 3);
  std::map<std::string, int> statuses;
  for (const auto& [key, r] : rows(dir)) {
    if (cell(r, "kind") == "bandwidth") continue;
    INFO(key << ": " << cell(r, "message"));
    const std::string spec = cell(r, "spec");
    ++statuses[cell(r, "variant") + " " + cell(r, "status")];
    if (spec.rfind("delta-product", 0) == 0) {
      CHECK(std::stod(cell(r, "time_median_s")) > 0);
      // Its state S per head, whatever the context and the rows a token brings: H·D·D floats.
      CHECK(cell(r, "bytes_held") == std::to_string(2 * 8 * 8 * sizeof(float)));
    } else if (spec == "test-rejects-decoding") {
      CHECK(cell(r, "message") == "test-rejects-decoding: k has 1 row, expected 2");
    } else {
      CHECK(cell(r, "message").find("linformer does not support decoding") != std::string::npos);
    }
  }
  CHECK(statuses == std::map<std::string, int>{{"delta-product ok", 6},
                                               {"linformer unsupported", 3},
                                               {"test-rejects-decoding error", 3}});
  // The report renders the rows that were measured.
  CHECK(read_text(dir.file("report.md")).find("`delta-product:steps=2`") != std::string::npos);
}

TEST_CASE("decode shards resume on their own and merge into the unsharded run's rows",
          "[decoding][harness]") {
  TempDir dir("decode-shards");
  const auto run = [&](const std::string& name, harness::Shard shard) {
    harness::DecodeSweep s = tiny();
    s.shard = shard;
    s.gnuplot = "no-such-gnuplot";  // the plots' scripts are tested above
    return harness::run_decode_sweep(dir.file(name), s, nullptr);
  };
  const harness::Shard first = harness::parse_shard("1/2"), second = harness::parse_shard("2/2");
  // 3 specs · 2 Hkv · 3 points and full's 2 threads points: 20, 10 in each shard, and each
  // run its bandwidth row.
  CHECK(run("s1", first) == yardsticks() + 10);
  CHECK(run("s1", first) == yardsticks());  // resumed: every point of its shard is there
  CHECK(run("s2", second) == yardsticks() + 10);
  CHECK(run("all", {}) == yardsticks() + 20);
  harness::DecodeSweep s = tiny();
  s.shard = first;
  const auto keys = harness::decode_point_keys(s);
  CHECK(keys.size() == 10);
  for (const auto& [key, r] : rows(dir.file("s1"))) {
    if (cell(r, "kind") == "bandwidth") continue;
    CHECK(cell(r, "shard") == "1/2");
    CHECK(std::find(keys.begin(), keys.end(), key) != keys.end());
  }
  const auto [merged, duplicates] = harness::merge_decode_results(
      dir.file("merged"), {dir.file("s1"), dir.file("s2")}, "no-such-gnuplot");
  CHECK(merged == 3 * yardsticks() + 20);  // s1's 2 runs' bandwidth rows and s2's: keys apart
  CHECK(duplicates == 0);
  const auto unsharded = rows(dir.file("all"));
  const auto joined = rows(dir.file("merged"));
  std::size_t points = 0;
  for (const auto& [key, r] : unsharded) {
    if (cell(r, "kind") == "bandwidth") continue;
    ++points;
    REQUIRE(joined.count(key));
    for (const char* column : {"kind", "spec", "kv_heads", "context", "status", "message"})
      CHECK(cell(joined.at(key), column) == cell(r, column));
  }
  CHECK(points == 20);
  CHECK(read_text(dir.file("merged/report.md")).find("## D = 8, Hkv = 1") != std::string::npos);
  CHECK(read_text(dir.file("merged/meta.json")).find("merged_from") != std::string::npos);
  // A folder given twice is read once; merged again into the merged folder, s1's rows are
  // duplicates.
  CHECK(harness::merge_decode_results(dir.file("merged"), {dir.file("s1"), dir.file("s1")},
                                      "no-such-gnuplot") ==
        std::pair<std::size_t, std::size_t>(3 * yardsticks() + 20, 2 * yardsticks() + 10));
  CHECK_THROWS_WITH(harness::merge_decode_results(dir.file("merged"), {dir.file("none")}),
                    Catch::Contains("none/decode.csv does not exist"));
  // Bad shards name --shard, before anything is written.
  s.shard = harness::Shard{3, 2};
  CHECK_THROWS_WITH(harness::run_decode_sweep(dir.file("bad"), s, nullptr),
                    Catch::Contains("--shard '3/2'"));
  CHECK_FALSE(std::filesystem::exists(dir.file("bad")));
}

TEST_CASE("full's every-core check weighs its speed-up against the memory's",
          "[decoding][harness]") {
  const auto full = [](std::int64_t context, std::int64_t threads, double time, double one) {
    harness::DecodeRow r;
    r.kind = "threads";
    r.spec = r.variant = "full";
    r.batch = 1;
    r.heads = 8;
    r.kv = 2;
    r.dim = 64;
    r.context = context;
    r.time = time;
    r.threads = threads;
    r.one_thread_time = one;
    return r;
  };
  // The bandwidth on every thread and on one, GB/s.
  const auto check = [](std::vector<harness::DecodeRow> rows, double all, double one) {
    harness::DecodeResults results;
    results.rows = std::move(rows);
    results.bandwidth_gbps = all;
    results.one_thread_bandwidth_gbps = one;
    const auto checks = harness::decode_speed_checks(results);
    for (const auto& c : checks)
      if (c.text.find("uses every core") != std::string::npos) return c;
    return harness::DecodeCheck{};
  };
  const double none = std::nan("");
  // Memory that scales by 2: a step that ran on one core, 1.00 < 1.6, fails; the 1K row below
  // 64K is left out (2.00).
  auto c = check({full(1024, 2, 1e-4, 2e-4), full(65536, 2, 1e-2, 1e-2)}, 20, 10);
  CHECK(c.verdict == "FAIL");
  CHECK(c.text.find("here 1.60): 1.00 at worst (10.00 ms on one thread, 10.00 ms on 2, 64K") !=
        std::string::npos);
  // 4 threads, memory scaling by 4: the floor is 3.2; 3.5 passes.
  c = check({full(1048576, 4, 1e-1, 3.5e-1)}, 40, 10);
  CHECK(c.verdict == "pass");
  CHECK(c.text.find("here 3.20): 3.50") != std::string::npos);
  // Memory that scales by 1.5 from one thread: the floor is 1.2, whatever the threads.
  CHECK(check({full(65536, 2, 1e-2, 1.3e-2)}, 15, 10).verdict == "pass");
  c = check({full(65536, 2, 1e-2, 1.1e-2)}, 15, 10);
  CHECK(c.verdict == "FAIL");
  CHECK(c.text.find("here 1.20): 1.10") != std::string::npos);
  // Memory that scales by 1.2: a one-core step would pass 0.96, the rows cannot tell.
  c = check({full(65536, 2, 1e-2, 1e-2)}, 12, 10);
  CHECK(c.verdict == "n/a");
  CHECK(c.text.find("scales by 1.20") != std::string::npos);
  // Nothing to judge: no one-thread bandwidth, no one-thread time, only below 64K, or a run
  // of one thread.
  CHECK(check({full(65536, 2, 1e-2, 1e-2)}, 20, none).verdict == "n/a");
  CHECK(check({full(65536, 2, 1e-2, none), full(1024, 2, 1e-4, 2e-4)}, 20, 10).verdict == "n/a");
  c = check({full(65536, 1, 1e-2, 1e-2)}, 20, 10);
  CHECK(c.verdict == "n/a");
  CHECK(c.text.find("T >= 2") != std::string::npos);
}
