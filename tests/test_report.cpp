// attnlab report: tables and plots rendered from a FIXED rows file (tests/data/report_rows.csv),
// whose numbers are chosen so every expected ratio is exact in decimal (e.g. 0.01 s / 0.005 s).
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <catch2/catch.hpp>

#include "attnlab/error.hpp"
#include "harness/anchors.hpp"
#include "harness/plot.hpp"
#include "harness/report.hpp"
#include "harness/rows.hpp"

using namespace attnlab;
using namespace attnlab::harness;
namespace fs = std::filesystem;

namespace {

const std::string kRows = std::string(ATTNLAB_TEST_DATA) + "/report_rows.csv";
const std::string kSliding = "sliding:left=128,right=128,dilation=1,global=0";

const ReportRow& find(const std::vector<ReportRow>& rows, const std::string& spec, std::int64_t n,
                      const std::string& causal = "none") {
  for (const auto& r : rows)
    if (r.spec == spec && r.n == n && r.causal == causal) return r;
  FAIL("no row " << spec << " n=" << n << " causal=" << causal);
  throw;  // unreachable
}

bool contains(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

// Ratios of decimal inputs are not exact in binary floating point: compare to 1e-12.
constexpr double kRatioTol = 1e-12;

}  // namespace

TEST_CASE("rows.csv is parsed by column name, quotes and empty cells included", "[report]") {
  const auto rows = read_report_rows(kRows);
  REQUIRE(rows.size() == 18);
  const auto& bad = find(rows, "linformer:k=256,share=kv,init=gaussian,max_len=65536,seed=0", 2048);
  CHECK(bad.status == "error");
  CHECK(bad.message == "boom, \"bad\" input");
  CHECK_FALSE(bad.time_median_s.has_value());
  const auto& s = find(rows, kSliding, 1024);
  CHECK(s.variant == "sliding");
  CHECK(s.batch == 1);
  CHECK(s.heads == 8);
  CHECK(s.dim == 64);
  CHECK(s.input == "gaussian:temp=1");
  CHECK(*s.time_median_s == 0.005);
  CHECK(*s.rel_fro == 0.31);
  CHECK_FALSE(s.gflops.has_value());
}

TEST_CASE("bad rows files are refused with the file, line and column", "[report]") {
  std::istringstream no_status("key,spec,variant,n\na,full,full,64\n");
  CHECK_THROWS_WITH(parse_report_rows(no_status, "x.csv"),
                    Catch::Contains("x.csv") && Catch::Contains("'status'"));
  std::istringstream bad_number("spec,variant,n,status,time_median_s\nfull,full,64,ok,fast\n");
  CHECK_THROWS_WITH(parse_report_rows(bad_number, "y.csv"), Catch::Contains("y.csv: line 2") &&
                                                                Catch::Contains("time_median_s") &&
                                                                Catch::Contains("'fast'"));
  CHECK_THROWS_AS(read_report_rows("/nonexistent/rows.csv"), Error);
  // Lines count as in an editor (a quoted line break is one); a last line without '\n' is read.
  std::istringstream two_lines(
      "spec,variant,n,status,message\nfull,full,64,ok,\"a\nb\"\nfull,full,x,ok,\"\"");
  CHECK_THROWS_WITH(parse_report_rows(two_lines, "w.csv"),
                    Catch::Contains("w.csv: line 4: column 'n'") && Catch::Contains("'x'"));
  std::istringstream unterminated("spec,variant,n,status\nfull,full,64,ok\nfull,full,128,ok");
  CHECK(parse_report_rows(unterminated, "u.csv").back().n == 128);
  std::istringstream torn("spec,variant,n,status\nfull,full,64,ok\nfull,fu");
  CHECK_THROWS_WITH(parse_report_rows(torn, "t.csv"),
                    Catch::Contains("t.csv: line 3 has 2 fields, the header 4"));
  std::istringstream empty("");
  CHECK_THROWS_WITH(parse_report_rows(empty, "z.csv"), Catch::Contains("z.csv: empty"));
}

TEST_CASE("speed-up and memory are joined with full of the same problem", "[report]") {
  const auto rows = read_report_rows(kRows);
  const auto rel = relative_to_full(rows);
  auto at = [&](const ReportRow& r) { return rel[std::size_t(&r - rows.data())]; };
  const auto s1 = at(find(rows, kSliding, 1024));
  CHECK(*s1.speedup == Approx(2.0).epsilon(kRatioTol));
  CHECK(*s1.memory_ratio == Approx(0.5).epsilon(kRatioTol));
  CHECK(*at(find(rows, kSliding, 4096)).speedup == Approx(10.0).epsilon(kRatioTol));
  // The causal sliding row joins the causal full row (0.004 s), not the non-causal one.
  CHECK(*at(find(rows, kSliding, 1024, "top-left")).speedup == Approx(4.0).epsilon(kRatioTol));
  // No full row at 3072, and a failed row: no numbers.
  CHECK_FALSE(at(find(rows, kSliding, 3072)).speedup.has_value());
  CHECK_FALSE(
      at(find(rows, "linformer:k=256,share=kv,init=gaussian,max_len=65536,seed=0", 2048)).speedup);
  CHECK(*at(find(rows, "full", 1024)).speedup == 1.0);
}

TEST_CASE("LRA table: ours beside the paper's, missing points as a dash", "[report]") {
  const std::string t = lra_table(read_report_rows(kRows));
  // The paper-setting spec is shown for local attention, not the faster left=64 one.
  CHECK(contains(t, "| Local Attention | ours `" + kSliding +
                        "` | 2.00x | 5.00x | — | 10.00x | 0.50x (0.5 MiB) | 0.38x (0.8 MiB) | — | "
                        "0.25x (1.0 MiB) |"));
  CHECK_FALSE(contains(t, "left=64"));
  // Paper: 9.2 / 8.1 steps/s = 1.14x and 0.42 / 0.85 GB = 0.49x at 1K.
  CHECK(contains(t,
                 "| | paper (TPU v3) | 9.2 steps/s (1.14x) | 8.4 steps/s (1.71x) | "
                 "7.4 steps/s (3.22x) | 7.4 steps/s (5.29x) | 0.49x (0.42 GB)"));
  CHECK(contains(t,
                 "| Linformer | ours `linformer:k=256,share=kv,init=gaussian,max_len=65536,"
                 "seed=0` | 2.50x | — | — | 8.00x |"));
  CHECK(contains(t, "| BigBird | ours — | — | — | — | — | — | — | — | — |"));
  CHECK(contains(t,
                 "| Linear Transformer | ours `linear:feature=elu1,m=64,nu=1,rule=sum,beta=1,"
                 "eps=1e-06,seed=0` | 5.00x |"));
  // No favor spec in the rows: the Performer row has no "ours" (never another linear spec).
  CHECK(contains(t, "| Performer | ours — | — |"));
  CHECK(contains(t, "| Transformer | ours `full` | 10 ms | 40 ms | — | 160 ms | 1.0 MiB |"));
  CHECK(contains(t, "Tay et al. 2020"));
}

TEST_CASE("Linformer n x k table: ours / paper per cell", "[report]") {
  const std::string t = linformer_table(read_report_rows(kRows));
  CHECK(contains(t, "| 1024 | 4.00x / 1.7x | 2.50x / 1.6x | — / 1.3x | — / — | — / — |"));
  CHECK(contains(t, "| 4096 | — / 3.4x | 8.00x / 3.2x | — / 2.8x | — / 2.2x | — / 1.3x |"));
  CHECK(contains(t, "| 65536 | — / 20x | — / 18x | — / 16x | — / 14x | — / 7.9x |"));
  CHECK(contains(t, "Wang et al. 2020"));
  // The anchor table itself: a value, and the paper's "-" where k >= n.
  CHECK(*anchors::linformer_speedup(16384, 256) == 7.8);
  CHECK_FALSE(anchors::linformer_speedup(512, 512).has_value());
}

TEST_CASE("error tables list every row per length, failures with their status", "[report]") {
  const std::string t = error_tables(read_report_rows(kRows));
  CHECK(contains(t, "### N = 1024"));
  CHECK(contains(t, "### N = 3072"));
  CHECK(contains(t, "| `" + kSliding +
                        "` | `gaussian:temp=1` | none | 1,8,64 | ok | 3.10e-01 | "
                        "5.00e-02 | 0.930000 | 5.20e-01 | 1024 | 2.00x | 5 ms | — |"));
  CHECK(contains(t, "| error: boom, \"bad\" input | — | — | — | — | — | — |"));
  CHECK(contains(t,
                 "| `peer:torch` | `gaussian:temp=1` | none | 1,8,64 | skipped: torch not "
                 "importable | — |"));
  CHECK(contains(t,
                 "| `full` | `gaussian:temp=1` | none | 1,8,64 | ok | 1.50e-07 | 2.00e-06 | "
                 "1.000000 | 3.00e-07 | 1024 | 1.00x | 10 ms | 107 (0.54) |"));
  // Full comes first in each length's table.
  const auto n1024 = t.find("### N = 1024");
  CHECK(t.find("| `full` |", n1024) < t.find("| `sliding:", n1024));
}

namespace {

// A rows.csv of this attnlab's schema: every column, the given cells set by name.
std::string rows_text(const std::vector<std::map<std::string, std::string>>& rows) {
  const auto& names = column_names();
  std::string text = csv_line(std::vector<std::string>(names.begin(), names.end()));
  for (const auto& cells : rows) {
    std::vector<std::string> line(kColumnCount);
    for (const auto& [name, value] : cells) {
      Col c;
      REQUIRE(find_column(name, c));
      line[static_cast<std::size_t>(c)] = value;
    }
    text += csv_line(line);
  }
  return text;
}

std::map<std::string, std::string> ok_row(const std::string& spec, const std::string& seconds,
                                          const std::string& rel_fro, const std::string& vs,
                                          const std::string& tokens = "",
                                          const std::string& n = "1024") {
  return {{"key", spec + n},
          {"spec", spec},
          {"variant", spec.substr(0, spec.find(':'))},
          {"n", n},
          {"batch", "1"},
          {"heads", "8"},
          {"dim", "64"},
          {"causal", "none"},
          {"input", "gaussian:temp=1"},
          {"seed", "1"},
          {"status", "ok"},
          {"time_median_s", seconds},
          {"rel_fro", rel_fro},
          {"max_abs", "1e-06"},
          {"mean_cos", "0.99"},
          {"p99_row", "1e-06"},
          {"err_rows", "256"},
          {"error_vs", vs},
          {"token_inputs", tokens}};
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE(
    "variants that are not softmax attention are listed apart, out of the softmax error tables "
    "and frontiers, in the time plot",
    "[report]") {
  const std::string retnet = "retnet:schedule=retnet";
  const fs::path dir =
      fs::temp_directory_path() / ("attnlab-report-own-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "rows.csv") << rows_text(
      {ok_row("full", "0.01", "1e-07", "softmax"), ok_row(kSliding, "0.005", "0.3", "softmax"),
       ok_row(retnet, "0.001", "2e-07", "own"), ok_row("gla", "0.002", "3e-07", "own", "g"),
       ok_row("full", "0.04", "1e-07", "softmax", "", "2048"),
       ok_row(kSliding, "0.01", "0.4", "softmax", "", "2048"),
       ok_row(retnet, "0.002", "2e-07", "own", "", "2048"),
       ok_row("gla", "0.004", "3e-07", "own", "g", "2048")});
  const auto rows = read_report_rows((dir / "rows.csv").string());
  const std::string softmax = error_tables(rows), own = own_error_tables(rows);
  CHECK(contains(softmax, "| `" + kSliding + "` |"));
  CHECK_FALSE(contains(softmax, "retnet"));
  CHECK_FALSE(contains(softmax, "`gla`"));
  CHECK(
      contains(own, "| `" + retnet +
                        "` | `gaussian:temp=1` | none | 1,8,64 | none | ok | 2.00e-07 | 1.00e-06 | "
                        "0.990000 | 1.00e-06 | 256 | 10.00x | 1 ms |"));
  CHECK(contains(own, "| `gla` | `gaussian:temp=1` | none | 1,8,64 | g | ok | 3.00e-07 |"));
  CHECK_FALSE(contains(own, "| `full` |"));
  CHECK(contains(own_error_tables({}), "No such rows"));

  ReportOptions options;
  options.gnuplot = "/nonexistent/gnuplot";  // the data files are what is checked
  render_report(dir.string(), options);
  const std::string pareto = read_text(dir / "plots" / "pareto_n1024.dat");
  CHECK(contains(pareto, "\"full\""));
  CHECK_FALSE(contains(pareto, "retnet"));
  CHECK_FALSE(contains(pareto, "gla"));
  const std::string errors = read_text(dir / "plots" / "error_vs_n_gaussian_temp_1.dat");
  CHECK(contains(errors, "# sliding"));
  CHECK_FALSE(contains(errors, "retnet"));
  const std::string numerical =
      read_text(dir / "plots" / "numerical_error_vs_n_gaussian_temp_1.dat");
  CHECK(contains(numerical, "# retnet"));
  CHECK(contains(numerical, "# gla"));
  CHECK_FALSE(contains(numerical, "sliding"));
  const std::string times = read_text(dir / "plots" / "time_vs_n.dat");
  for (const char* title : {"# full", "# sliding", "# retnet", "# gla"})
    CHECK(contains(times, title));
  fs::remove_all(dir);
}

TEST_CASE("bf16 points read as a setting of their own: speed-ups join bf16 with bf16", "[report]") {
  // A row at dtype bf16: its own key, otherwise the same problem.
  const auto bf16 = [](std::map<std::string, std::string> row) {
    row["dtype"] = "bf16";
    row["key"] += "|bf16";
    return row;
  };
  std::istringstream text(rows_text({ok_row("full", "0.01", "1e-07", "softmax"),
                                     ok_row(kSliding, "0.005", "0.0003", "softmax"),
                                     bf16(ok_row("full", "0.02", "0.004", "softmax")),
                                     bf16(ok_row(kSliding, "0.008", "0.005", "softmax"))}));
  const auto with = parse_report_rows(text);
  // An older run's rows (no dtype column) are float32.
  std::istringstream older("spec,variant,n,status,rel_fro\nfull,full,64,ok,1e-07\n");
  CHECK(parse_report_rows(older).at(0).dtype == "float32");
  // The dtype reads as part of the causal setting, so speed-ups join bf16 with bf16.
  const ReportRow& sliding16 = find(with, kSliding, 1024, "none, bf16");
  CHECK(sliding16.dtype == "bf16");
  const auto rel = relative_to_full(with);
  const auto speedup = rel[std::size_t(&sliding16 - with.data())].speedup;
  REQUIRE(speedup);
  CHECK(*speedup == Approx(0.02 / 0.008).epsilon(kRatioTol));
  CHECK(contains(error_tables(with), "| `" + kSliding + "` | `gaussian:temp=1` | none, bf16 |"));
  // The peers run in float32 only: full's bf16 rows get no line in their table.
  auto numpy = ok_row("peer:numpy", "0.05", "1e-07", "softmax");
  numpy["variant"] = "numpy";
  std::istringstream with_peer(rows_text({ok_row("full", "0.01", "1e-07", "softmax"), numpy,
                                          bf16(ok_row("full", "0.02", "0.004", "softmax"))}));
  const std::string peers = peers_table(parse_report_rows(with_peer));
  CHECK(contains(peers, "| 1024 | 1,8,64 | none | `gaussian:temp=1` | 10 ms | 50 ms (5.00x) |"));
  CHECK_FALSE(contains(peers, "bf16"));
}

TEST_CASE("the precision section sets full's bf16 error beside each approximation's float32 error",
          "[report]") {
  const std::string linear = "linear:feature=elu";
  // A row at dtype bf16: its own key, otherwise the same problem.
  const auto bf16 = [](std::map<std::string, std::string> row) {
    row["dtype"] = "bf16";
    row["key"] += "|bf16";
    return row;
  };
  const auto rows = [&](bool with_bf16) {
    std::vector<std::map<std::string, std::string>> cells = {
        ok_row("full", "0.01", "1e-07", "softmax"), ok_row(kSliding, "0.005", "0.0003", "softmax"),
        ok_row(linear, "0.002", "0.5", "softmax"), ok_row("gla", "0.002", "3e-07", "own", "g")};
    if (with_bf16) {
      cells.push_back(bf16(ok_row("full", "0.02", "0.004", "softmax")));
      cells.push_back(bf16(ok_row(kSliding, "0.008", "0.005", "softmax")));
      cells.push_back(bf16(ok_row("gla", "0.004", "0.003", "own", "g")));
    }
    std::istringstream text(rows_text(cells));
    return parse_report_rows(text);
  };
  // A run without bf16 points (an older one among them: no dtype column) has no such section.
  CHECK(precision_tables(rows(false)).empty());
  std::istringstream older("spec,variant,n,status,rel_fro\nfull,full,64,ok,1e-07\n");
  CHECK(precision_tables(parse_report_rows(older)).empty());

  const std::string t = precision_tables(rows(true));
  INFO(t);
  CHECK(contains(t, "## Precision: bf16 rounding beside each approximation's error"));
  // Per spec: its float32 error, its bf16 error (where measured), full's bf16 error, and the
  // ratio of the first to the third: the rows' numbers, nothing typed.
  CHECK(contains(t,
                 "| `full` | `gaussian:temp=1` | none | 1,8,64 | 1 | 1.00e-07 | 4.00e-03 | "
                 "4.00e-03 | 2.5e-05 (more accurate) |"));
  CHECK(contains(t, "| `" + kSliding +
                        "` | `gaussian:temp=1` | none | 1,8,64 | 1 | 3.00e-04 | "
                        "5.00e-03 | 4.00e-03 | 0.075 (more accurate) |"));
  CHECK(contains(t, "| `" + linear +
                        "` | `gaussian:temp=1` | none | 1,8,64 | 1 | 5.00e-01 | — | "
                        "4.00e-03 | 1.2e+02 |"));
  // full first; the variants that are not softmax attention are left out.
  CHECK(t.find("| `full` |") < t.find("| `sliding:"));
  CHECK_FALSE(contains(t, "`gla`"));

  // render_report adds it after the other tables.
  const fs::path dir =
      fs::temp_directory_path() / ("attnlab-report-bf16-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "rows.csv") << rows_text({ok_row("full", "0.01", "1e-07", "softmax"),
                                                bf16(ok_row("full", "0.02", "0.004", "softmax"))});
  ReportOptions options;
  options.plots = false;
  render_report(dir.string(), options);
  const std::string md = read_text(dir / "report.md");
  REQUIRE(contains(md, "## Precision"));
  CHECK(md.find("## Precision") > md.find("## Variants that are not softmax attention"));
  fs::remove_all(dir);
}

TEST_CASE("an older run's rows: a variant that is not softmax attention keeps no softmax error",
          "[report]") {
  // Before error_vs, every row was measured against softmax attention; a variant that declares
  // that it computes something else is classed by its declaration and its error dropped.
  std::istringstream text(
      "spec,variant,n,status,rel_fro,mean_cos\n"
      "full,full,64,ok,1e-07,1\n"
      "retnet:schedule=retnet,retnet,64,ok,250,0.1\n"
      "\"linear:rule=delta\",linear,64,unsupported,,\n"
      "peer:numpy,numpy,64,ok,1e-07,1\n");
  const auto rows = parse_report_rows(text);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].error_vs == "softmax");
  CHECK(rows[0].rel_fro == 1e-7);
  CHECK(rows[1].error_vs == "own");
  CHECK_FALSE(rows[1].rel_fro);
  CHECK_FALSE(rows[1].mean_cos);
  CHECK(rows[2].error_vs == "own");
  CHECK(rows[3].approximates_softmax());
}

TEST_CASE("every series of a plot has its own colour and marker; axes name their units",
          "[report]") {
  std::set<std::string> colours, markers;
  for (std::size_t i = 0; i < 67; ++i) {
    const SeriesStyle style = series_style(i);
    INFO(i << ": " << style.gnuplot());
    CHECK(style.colour.size() == 7);
    CHECK(colours.insert(style.colour).second);
    CHECK(markers.insert(style.marker).second);
  }
  const fs::path dir =
      fs::temp_directory_path() / ("attnlab-report-styles-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kRows, dir / "rows.csv");
  ReportOptions options;
  options.gnuplot = "/nonexistent/gnuplot";
  render_report(dir.string(), options);
  for (const auto& e : fs::directory_iterator(dir / "plots")) {
    if (e.path().extension() != ".gp") continue;
    const std::string gp = read_text(e.path());
    INFO(e.path().filename().string() << ":\n" << gp);
    // Every series' colour is distinct from the others' (labels reuse their frontier's colour).
    std::set<std::string> seen;
    for (std::size_t at = gp.find("lc rgb '"); at != std::string::npos;
         at = gp.find("lc rgb '", at + 1))
      CHECK(seen.insert(gp.substr(at, 16)).second);
    CHECK(seen.size() >= 2);
    for (const char* label : {"set xlabel '", "set ylabel "}) CHECK(contains(gp, label));
    if (contains(gp, "sequence length")) CHECK(contains(gp, "N (tokens)"));
    if (contains(gp, "time per forward call")) CHECK(contains(gp, "(s)"));
    if (contains(gp, "relative error")) CHECK(contains(gp, "dimensionless"));
  }
  fs::remove_all(dir);
}

TEST_CASE("peers table: time and ratio to full, skipped peers say why", "[report]") {
  const std::string t = peers_table(read_report_rows(kRows));
  CHECK(contains(t,
                 "| 1024 | 1,8,64 | none | `gaussian:temp=1` | 10 ms | 50 ms (5.00x) | "
                 "skipped: torch not importable |"));
  CHECK(contains(peers_table({}), "No peer rows"));
}

TEST_CASE("Pareto frontier on a hand-made set", "[report]") {
  const std::vector<ParetoPoint> points = {
      {1, 1e-7},   // 0: exact and slowest: on the frontier
      {2, 1e-3},   // 1: on
      {2, 1e-2},   // 2: same speed, worse error than 1: off
      {5, 1e-1},   // 3: as bad as 5 and slower: off
      {3, 1e-1},   // 4: off
      {10, 1e-1},  // 5: fastest: on
      {10, 1e-1},  // 6: duplicate of 5: the first one is kept
      {0.5, 1},    // 7: slower and worse than everything: off
  };
  CHECK(pareto_frontier(points) == std::vector<std::size_t>{0, 1, 5});
  CHECK(pareto_frontier({}).empty());
  CHECK(pareto_frontier({{3, 0.2}}) == std::vector<std::size_t>{0});
}

TEST_CASE("plots are written atomically: no truncated .dat, .gp or PNG on failure", "[report]") {
  const fs::path dir =
      fs::temp_directory_path() / ("attnlab-plot-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A gnuplot that answers the probes, then writes half a PNG where the script's output goes
  // (the -e output='...' it is given, else the script's own name) and fails, as on a full disk.
  const fs::path fake = dir / "fake-gnuplot";
  std::ofstream(fake) << R"(#!/bin/sh
[ "$1" = -V ] && exit 0
case "$2" in "set terminal"*) exit 0;; esac
out=x.png
[ "$1" = -e ] && out=$(echo "$2" | sed "s/output='\(.*\)'/\1/")
printf 'half a png' > "$out"
exit 1
)";
  fs::permissions(fake, fs::perms::owner_all);
  PlotFiles files;
  Plotter plotter(dir / "plots", fake.string(), files);
  plotter.plot("x", {{"a", {{1, 2}, {2, 3}}}}, "", "with lines");
  CHECK(files.pngs.empty());
  CHECK(contains(files.plot_note, "gnuplot failed on x.gp"));
  CHECK(!fs::exists(dir / "plots" / "x.png"));
  CHECK(!fs::exists(dir / "plots" / "x.png.tmp"));

  // A file size limit below the data's size: the write fails naming the file and the reason, and
  // leaves neither the file nor a temporary.
  std::vector<std::pair<double, double>> many;
  for (int i = 0; i < 2000; ++i) many.emplace_back(i, i);
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  rlimit small = saved;
  small.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &small);
  std::string message;
  try {
    plotter.plot("big", {{"a", many}}, "", "with lines");
  } catch (const attnlab::Error& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
  CHECK(contains(message, "big.dat"));
  CHECK(contains(message, "File too large"));
  for (const auto& e : fs::directory_iterator(dir / "plots"))
    CHECK(e.path().filename().string().rfind("big", 0) != 0);
  fs::remove_all(dir);
}

TEST_CASE("render_report writes report.md and the plots", "[report]") {
  const fs::path dir =
      fs::temp_directory_path() / ("attnlab-report-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kRows, dir / "rows.csv");
  std::ofstream(dir / "meta.json")
      << R"({"git": {"commit": "abc123", "dirty": false}, "threads": 2})";

  SECTION("with gnuplot when it can run") {
    const auto out = render_report(dir.string());
    std::ifstream in(out.markdown_path);
    std::stringstream md;
    md << in.rdbuf();
    CHECK(contains(md.str(), "## Long Range Arena efficiency table"));
    CHECK(contains(md.str(), "## Linformer"));
    CHECK(contains(md.str(), "## Error against exact softmax attention, per length"));
    CHECK(contains(md.str(), "- git.commit: abc123"));
    CHECK(contains(md.str(), "18 rows: 1 error 16 ok 1 skipped"));
    CHECK(fs::exists(dir / "plots" / "time_vs_n.dat"));
    CHECK(fs::exists(dir / "plots" / "time_vs_n.gp"));
    CHECK(fs::exists(dir / "plots" / "pareto_n1024.gp"));
    if (std::system("gnuplot -V >/dev/null 2>&1") != 0) {
      WARN("gnuplot not found: PNGs not checked (" << out.plot_note << ")");
    } else {
      INFO(out.plot_note);
      for (const char* png :
           {"time_vs_n.png", "error_vs_n_gaussian_temp_1.png", "pareto_n1024.png"}) {
        INFO(png);
        REQUIRE(fs::exists(dir / "plots" / png));
        CHECK(fs::file_size(dir / "plots" / png) > 1000);
      }
      CHECK(contains(md.str(), "![time vs N](plots/time_vs_n.png)"));
    }
  }
  SECTION("without gnuplot: data and scripts, and a note") {
    ReportOptions options;
    options.gnuplot = "/nonexistent/gnuplot";
    const auto out = render_report(dir.string(), options);
    CHECK(out.pngs.empty());
    CHECK(contains(out.plot_note, "could not be run"));
    CHECK_FALSE(out.data_files.empty());
  }
  // N=1024, non-causal: full (1x, 1.5e-7), sliding-128 (2x, 0.31), sliding-64 (5x, 0.6) are the
  // frontier; linear (5x, 0.95) and both linformers (2.5x, 0.8; 4x, 0.9) are beaten by sliding-64.
  std::ifstream dat(dir / "plots" / "pareto_n1024.dat");
  std::stringstream text;
  text << dat.rdbuf();
  const auto all = text.str().substr(0, text.str().find("# Pareto frontier"));
  const auto frontier = text.str().substr(text.str().find("# Pareto frontier"));
  // Labels are short (settings that differ from the variant's defaults), so match prefixes.
  CHECK(contains(all, "\"linear"));
  CHECK(contains(frontier, "\"full\""));
  CHECK(contains(frontier, "left=64"));
  const auto first_sliding = frontier.find("\"sliding");
  REQUIRE(first_sliding != std::string::npos);
  CHECK(frontier.find("\"sliding", first_sliding + 1) != std::string::npos);  // both windows
  CHECK_FALSE(contains(frontier, "\"linear"));
  CHECK_FALSE(contains(frontier, "\"linformer"));
  CHECK_FALSE(contains(frontier, "peer:"));
  fs::remove_all(dir);
}
