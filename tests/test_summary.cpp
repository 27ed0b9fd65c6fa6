// The terminal summary of a sweep (harness/summary.hpp), on rows built here with times chosen so
// every expected cell is exact in decimal.
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "harness/summary.hpp"

using namespace attnlab::harness;

namespace {

const std::string kSliding = "sliding:left=32,right=128,dilation=1,global=0";

ReportRow row(const std::string& spec, std::int64_t n, const std::string& causal,
              const std::string& input, double seconds, double rel_fro, double cos) {
  ReportRow r;
  r.spec = spec;
  r.variant = spec.substr(0, spec.find(':'));
  r.key = spec + "|" + std::to_string(n) + "|" + causal + "|" + input;
  r.n = n;
  r.batch = 1;
  r.heads = 8;
  r.dim = 64;
  r.causal = causal;
  r.input = input;
  r.seed = "1";
  r.status = "ok";
  r.time_median_s = seconds;
  r.rel_fro = rel_fro;
  r.mean_cos = cos;
  r.sgemm_gflops = 100.0;
  return r;
}

ReportRow refused(const std::string& spec, std::int64_t n, const std::string& causal,
                  const std::string& input) {
  ReportRow r = row(spec, n, causal, input, 0, 0, 0);
  r.status = "unsupported";
  r.time_median_s = r.rel_fro = r.mean_cos = std::nullopt;
  return r;
}

// The first line of `text` that starts (after indentation) with `label` and a space, or the
// line `below` lines under it.
std::string line_of(const std::string& text, const std::string& label, int below = 0) {
  std::size_t start = 0;
  int countdown = -1;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    const auto first = line.find_first_not_of(' ');
    if (countdown < 0 && first != std::string::npos &&
        line.compare(first, label.size() + 1, label + " ") == 0)
      countdown = below;
    if (countdown-- == 0) return line;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  FAIL("no line starting with '" << label << "' (or " << below << " lines below) in:\n" << text);
  return {};
}

// The whitespace-separated words of a line.
std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}
using Words = std::vector<std::string>;

// The section of `text` from the first line containing `heading` to the next blank line.
std::string section(const std::string& text, const std::string& heading) {
  const auto at = text.find(heading);
  REQUIRE(at != std::string::npos);
  const auto end = text.find("\n\n", at);
  return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

}  // namespace

TEST_CASE("the summary shows speed-ups, full's time and errors taken from the rows", "[summary]") {
  SummaryRun run{"runs/default", {}, nullptr};
  // full: 10 ms and 40 ms at N = 1024 (two inputs), 80 ms at 2048 (one input).
  run.rows = {row("full", 1024, "none", "a", 0.010, 1e-7, 1.0),
              row("full", 1024, "none", "b", 0.040, 2e-7, 1.0),
              row("full", 2048, "none", "a", 0.080, 3e-7, 1.0),
              row(kSliding, 1024, "none", "a", 0.005, 0.10, 0.99),  // 2x
              row(kSliding, 1024, "none", "b", 0.005, 0.30, 0.95),  // 8x: geometric mean 4x
              row(kSliding, 2048, "none", "a", 0.010, 0.20, 0.97),  // 8x
              row("full", 1024, "top-left", "a", 0.006, 1e-7, 1.0),
              refused("linformer", 1024, "top-left", "a"),
              row("linformer", 1024, "none", "a", 0.0025, 1.5, 0.5)};  // 4x
  const std::string text = sweep_summary(run);
  INFO(text);
  CHECK(text.find("Summary of runs/default: 9 points (8 ok, 1 unsupported)\n") !=
        std::string::npos);

  const std::string plain = section(text, "causal none");
  // full's row: geometric mean of 10 and 40 ms = 20 ms; at 2048, 80 ms.
  CHECK(line_of(plain, "full").find("20 ms") != std::string::npos);
  CHECK(line_of(plain, "full").find("80 ms") != std::string::npos);
  // sliding, labelled by its non-default settings only.
  CHECK(line_of(plain, "sliding:left=32").find("4.00x") != std::string::npos);
  CHECK(line_of(plain, "sliding:left=32").find("8.00x") != std::string::npos);
  CHECK(line_of(plain, "linformer").find("4.00x") != std::string::npos);
  CHECK(line_of(plain, "linformer").find(" - ") == std::string::npos);
  CHECK(line_of(plain, "linformer").back() == '-');  // not run at 2048

  const std::string causal = section(text, "causal top-left");
  CHECK(line_of(causal, "full").find("6 ms") != std::string::npos);
  CHECK(line_of(causal, "linformer").find("unsup.") != std::string::npos);

  // Errors: the worst over inputs and causal settings.
  const std::string errors = section(text, "Error against exact softmax attention (fp64)");
  CHECK(words(line_of(errors, "sliding:left=32")) == Words{"sliding:left=32", "0.3", "0.2"});
  CHECK(words(line_of(errors, "sliding:left=32", 1)) ==
        Words{"mean", "cosine", "0.9500", "0.9700"});
  CHECK(words(line_of(errors, "linformer")) == Words{"linformer", "1.5", "-"});
  CHECK(words(line_of(errors, "linformer", 1)) == Words{"mean", "cosine", "0.5000"});

  CHECK(text.find("sgemm 1024^3 at 100.0 GFLOP/s") != std::string::npos);
}

TEST_CASE(
    "variants that are not softmax attention keep their speed-up but leave the softmax error "
    "table; a trained model's inputs get their own",
    "[summary]") {
  SummaryRun run{"runs/default", {}, nullptr};
  const std::string retnet = "retnet:schedule=retnet", trained = "trained:ckpt/kjv,layer=2";
  ReportRow own = row(retnet, 1024, "none", "a", 0.001, 2e-7, 1.0);  // 10x
  own.error_vs = "own";
  ReportRow own_trained = row(retnet, 1024, "top-left", trained, 0.002, 3e-7, 1.0);
  own_trained.error_vs = "own";
  own_trained.heads = 2;
  ReportRow full_trained = row("full", 1024, "top-left", trained, 0.004, 1e-7, 1.0);
  full_trained.heads = 2;
  ReportRow sliding_trained = row(kSliding, 1024, "top-left", trained, 0.001, 0.04, 0.999);
  sliding_trained.heads = 2;
  run.rows = {row("full", 1024, "none", "a", 0.010, 1e-7, 1.0),
              row(kSliding, 1024, "none", "a", 0.005, 0.10, 0.99),
              own,
              full_trained,
              sliding_trained,
              own_trained};
  const std::string text = sweep_summary(run);
  INFO(text);
  // The speed-up tables hold every spec, per shape: the trained model's has 2 heads.
  CHECK(words(line_of(section(text, "causal none, B=1 H=8"), "retnet")) ==
        Words{"retnet", "10.00x"});
  CHECK(words(line_of(section(text, "causal top-left, B=1 H=2"), "retnet")) ==
        Words{"retnet", "2.00x"});
  // The softmax table: synthetic inputs only, no retnet.
  const std::string softmax = section(text, "Error against exact softmax attention (fp64)");
  CHECK(words(line_of(softmax, "sliding:left=32")) == Words{"sliding:left=32", "0.1"});
  CHECK(softmax.find("retnet") == std::string::npos);
  // The trained model's inputs: one column per input and length, named by folder and layer.
  const std::string learned = section(text, "on a trained model's q, k, v");
  CHECK(learned.find("kjv, layer 2, N=1024") != std::string::npos);
  CHECK(words(line_of(learned, "sliding:left=32")) == Words{"sliding:left=32", "0.04"});
  CHECK(learned.find("retnet") == std::string::npos);
  // The others: their numerical error, the worst over every input.
  const std::string other = section(text, "Not softmax attention");
  CHECK(words(line_of(other, "retnet")) == Words{"retnet", "3e-07"});
  CHECK(other.find("sliding") == std::string::npos);
  CHECK(other.find("full") == std::string::npos);

  // Without such rows, no table for them.
  run.rows = {row("full", 1024, "none", "a", 0.010, 1e-7, 1.0)};
  CHECK(sweep_summary(run).find("Not softmax attention") == std::string::npos);
  CHECK(sweep_summary(run).find("trained model") == std::string::npos);
}

TEST_CASE("bf16 points get speed-up tables over full in bf16 and an error table of their own",
          "[summary]") {
  SummaryRun run{"runs/default", {}, nullptr};
  // A bf16 row as parse_report_rows makes it: the dtype also ends the causal setting.
  const auto bf16 = [](ReportRow r) {
    r.dtype = "bf16";
    r.causal += ", bf16";
    r.key += "|bf16";
    return r;
  };
  run.rows = {row("full", 1024, "none", "a", 0.010, 1e-7, 1.0),
              row(kSliding, 1024, "none", "a", 0.005, 0.10, 0.99),  // 2x
              bf16(row("full", 1024, "none", "a", 0.020, 3e-3, 0.9999)),
              bf16(row(kSliding, 1024, "none", "a", 0.004, 0.11, 0.98))};  // 5x
  run.rows[2].gflops = 500.0;  // full's best rate is a float32 row's: sgemm is float32
  run.rows[0].gflops = 50.0;
  const std::string text = sweep_summary(run);
  INFO(text);
  CHECK(words(line_of(section(text, "causal none, B=1"), "sliding:left=32")) ==
        Words{"sliding:left=32", "2.00x"});
  CHECK(words(line_of(section(text, "causal none, bf16, B=1"), "sliding:left=32")) ==
        Words{"sliding:left=32", "5.00x"});
  // float32's error table holds the float32 rows only; bf16's, the bf16 rows.
  const std::string float32 = section(text, "Error against exact softmax attention (fp64)");
  CHECK(words(line_of(float32, "full")) == Words{"full", "1e-07"});
  CHECK(words(line_of(float32, "sliding:left=32")) == Words{"sliding:left=32", "0.1"});
  const std::string in_bf16 = section(text, "In bf16");
  CHECK(words(line_of(in_bf16, "full")) == Words{"full", "0.003"});
  CHECK(words(line_of(in_bf16, "sliding:left=32")) == Words{"sliding:left=32", "0.11"});
  CHECK(text.find("exact full at best 50.0 GFLOP/s") != std::string::npos);

  run.rows.resize(2);  // no bf16 rows: no bf16 table
  CHECK(sweep_summary(run).find("In bf16") == std::string::npos);
}

TEST_CASE("a reference run's speed-ups for the same points sit in brackets", "[summary]") {
  SummaryRun run{"runs/default", {}, nullptr};
  run.rows = {
      row("full", 1024, "none", "a", 0.010, 0, 1), row(kSliding, 1024, "none", "a", 0.005, 0, 1),
      row("full", 2048, "none", "a", 0.040, 0, 1), row(kSliding, 2048, "none", "a", 0.010, 0, 1)};
  SummaryRun reference{"results/default", {}, nullptr};
  // The reference measured sliding at 1024 only, 3x; full at 1024 took 12 ms there.
  reference.rows = {row("full", 1024, "none", "a", 0.012, 0, 1),
                    row(kSliding, 1024, "none", "a", 0.004, 0, 1)};
  const std::string text = sweep_summary(run, &reference);
  INFO(text);
  CHECK(text.find("Reference results/default\n  measured on") != std::string::npos);
  const std::string plain = section(text, "causal none");
  CHECK(plain.find("below each spec: the same points in results/default") != std::string::npos);
  CHECK(words(line_of(plain, "full")) == Words{"full", "10", "ms", "40", "ms"});
  CHECK(words(line_of(plain, "full", 1)) == Words{"results/default", "12", "ms", "-"});
  CHECK(words(line_of(plain, "sliding:left=32")) == Words{"sliding:left=32", "2.00x", "4.00x"});
  CHECK(words(line_of(plain, "sliding:left=32", 1)) == Words{"results/default", "3.00x", "-"});
}

TEST_CASE("an empty run says so instead of printing empty tables", "[summary]") {
  const SummaryRun run{"runs/x", {}, nullptr};
  const std::string text = sweep_summary(run);
  CHECK(text.find("0 points (none)") != std::string::npos);
  CHECK(text.find("context unknown") != std::string::npos);
  CHECK(text.find("Speed-up") == std::string::npos);
}

TEST_CASE("the context line names the OpenBLAS core and who chose it", "[summary]") {
  nlohmann::json meta = {{"cpu_model", "AMD EPYC"},
                         {"threads", {{"omp_max_threads", 2}}},
                         {"OPENBLAS_CORETYPE", "Cooperlake"},
                         {"load_average", "0.5 0.5 0.5"},
                         {"date", "2026-12-01T22:00:00Z"},
                         {"blas",
                          {{"corename", "Cooperlake"},
                           {"core_source", "attnlab"},
                           {"detected", "Prescott"},
                           {"better_core", ""}}}};
  CHECK(
      sweep_summary({"runs/x", {}, meta})
          .find(
              "measured on AMD EPYC, 2 threads, OpenBLAS core Cooperlake (set by attnlab: OpenBLAS "
              "detected Prescott), load 0.5 0.5 0.5, 2026-12-01T22:00:00Z\n") != std::string::npos);
  meta["blas"] = {{"corename", "Haswell"},
                  {"core_source", "user"},
                  {"detected", ""},
                  {"better_core", "Cooperlake"}};
  meta["OPENBLAS_CORETYPE"] = "Haswell";
  CHECK(
      sweep_summary({"runs/x", {}, meta})
          .find(
              "OpenBLAS core Haswell (OPENBLAS_CORETYPE=Haswell set by the user; the CPU supports "
              "Cooperlake)") != std::string::npos);
  // A meta.json from before blas.core_source: the variable as it was.
  meta["blas"] = {{"corename", "Haswell"}};
  CHECK(sweep_summary({"runs/x", {}, meta}).find("2 threads, OPENBLAS_CORETYPE=Haswell, load") !=
        std::string::npos);
}
