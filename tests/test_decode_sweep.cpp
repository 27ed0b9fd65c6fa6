// The decode sweep (harness/decode.hpp) at a tiny size: its rows, the statuses of what a variant
// refuses and of what passes the memory budget, the bytes a KV cache holds, and resume.
#include <algorithm>
#include <map>
#include <string>

#include "attnlab/csv.hpp"
#include "harness/decode.hpp"
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

// decode.csv's rows (the header dropped) as {key: record}.
std::map<std::string, CsvRecord> rows(const TempDir& dir) {
  const auto records = read_csv(dir.file("decode.csv"));
  REQUIRE(records.front() == harness::decode_columns());
  std::map<std::string, CsvRecord> by_key;
  for (std::size_t i = 1; i < records.size(); ++i) by_key[records[i][0]] = records[i];
  return by_key;
}

std::string cell(const CsvRecord& r, const std::string& column) {
  const auto& names = harness::decode_columns();
  return r.at(std::size_t(std::find(names.begin(), names.end(), column) - names.begin()));
}

}  // namespace

TEST_CASE("the decode sweep: rows, refusals, bytes held and resume", "[decoding][harness]") {
  TempDir dir("decode");
  CHECK(harness::run_decode_sweep(dir.path().string(), tiny(), nullptr) == 1 + 3 * 2 * 3);
  const auto by_key = rows(dir);
  REQUIRE(by_key.size() == 1 + 3 * 2 * 3);
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
    if (kind == "step" && variant == "full") {  // a cache of context + steps + 2 slots, Hkv heads
      const std::size_t slots = std::stoul(cell(r, "context")) + 3 + 2;
      CHECK(cell(r, "bytes_held") ==
            std::to_string(slots * std::stoul(cell(r, "kv_heads")) * 16 * sizeof(float)));
    }
    if (kind == "step" && variant == "gla")
      CHECK(cell(r, "bytes_held") == std::to_string(2 * 64 * 4));
  }
  CHECK(bandwidth == 1);
  // The report, rendered from the rows: a table per (D, Hkv) with every decoded variant.
  const std::string report = read_text(dir.file("report.md"));
  for (const char* part : {"## D = 8, Hkv = 2", "## D = 8, Hkv = 1", "`full`", "`gla`", "N = 32"})
    CHECK(report.find(part) != std::string::npos);
  // Resume: every point is there, so a second run adds its bandwidth row only.
  CHECK(harness::run_decode_sweep(dir.path().string(), tiny(), nullptr) == 1);
  CHECK(rows(dir).size() == 2 + 3 * 2 * 3);
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
