// The main job as a newcomer meets it: `./dev run` in a fresh copy of the repository, on a tiny
// grid (the default config's variants, causal settings and inputs at N = 64 and 128). It must
// measure into the git-ignored runs/default/, leave the committed results/ and `git status`
// untouched, render report.md and the PNG plots, and print a summary whose numbers are those of
// the rows. The copy reuses this build (BUILD_DIR) instead of building again.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "attnlab/factory.hpp"
#include "harness/config.hpp"
#include "harness/grid.hpp"
#include "harness/report.hpp"
#include "harness/trained_inputs.hpp"
#include "npy_helpers.hpp"

using namespace attnlab;
using namespace attnlab::harness;
using namespace attnlab::test;
namespace fs = std::filesystem;

namespace {

int shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The tracked files of the source tree, as they are now, committed in a new repository.
void fresh_copy(const fs::path& to) {
  const std::string src = ATTNLAB_SOURCE_DIR, dst = to.string();
  REQUIRE(shell("mkdir -p '" + dst + "' && cd '" + src +
                "' && git ls-files -z | "
                "xargs -0 cp --parents -t '" +
                dst + "'") == 0);
  REQUIRE(shell("cd '" + dst +
                "' && git init -q && git add -A && git -c user.name=t "
                "-c user.email=t@t commit -qm copy") == 0);
}

// The words of the line of `text` whose first word is `label`, or of the line below it.
std::vector<std::string> words_of(const std::string& text, const std::string& label,
                                  bool below = false) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string first;
    if (!(in >> first) || first != label) continue;
    if (below && !std::getline(lines, line)) break;
    std::istringstream words_in(line);
    std::vector<std::string> words;
    for (std::string w; words_in >> w;) words.push_back(w);
    return words;
  }
  return {};
}

}  // namespace

TEST_CASE("./dev run on a fresh copy measures into runs/, reports and summarises", "[main-job]") {
  TempDir tmp("main-job");
  const fs::path repo = tmp.path() / "repo";
  fresh_copy(repo);
  const std::string build = fs::absolute(ATTNLAB_BUILD_DIR).string();
  const int code = shell("cd '" + repo.string() + "' && BUILD_DIR='" + build +
                         "' ./dev run "
                         "sweep --n 64,128 --reps 1 --warmup 0 --quiet >stdout.txt 2>stderr.txt "
                         "</dev/null");
  const std::string out = read_text((repo / "stdout.txt").string());
  INFO("stdout:\n" << out << "\nstderr:\n" << read_text((repo / "stderr.txt").string()));
  REQUIRE(code == 0);
  fs::remove(repo / "stdout.txt");
  fs::remove(repo / "stderr.txt");

  // Nothing committed changed and nothing new is untracked: runs/ is ignored.
  REQUIRE(shell("cd '" + repo.string() + "' && test -z \"$(git status --porcelain)\"") == 0);
  const fs::path run = repo / "runs" / "default";
  REQUIRE(fs::exists(run / "rows.csv"));
  CHECK(fs::file_size(run / "report.md") > 0);
  std::set<std::string> pngs;
  for (const auto& e : fs::directory_iterator(run / "plots"))
    if (e.path().extension() == ".png") {
      CHECK(read_text(e.path().string()).substr(1, 3) == "PNG");
      pngs.insert(e.path().filename().string());
    }
  CHECK(pngs.count("time_vs_n.png"));
  CHECK(pngs.count("pareto_n128.png"));
  CHECK(out.find("Report: runs/default/report.md") != std::string::npos);
  CHECK(out.find("Plots: runs/default/plots/ (") != std::string::npos);

  // Every point of the grid has its row; every spec a speed-up row per masking setting and an
  // error row, with the rows' numbers, recomputed here as harness/summary.cpp takes them: a
  // speed-up table per causal setting and mask ("none, documents:count=16": the report's causal
  // holds the mask), the geometric mean over the synthetic inputs of each row's speed-up over the
  // full row of its point; the errors the worst over every input and masking setting of a cell:
  // an approximation of softmax attention in the table of the synthetic inputs and in that of the
  // trained model's, a variant that computes something else in its own table.
  const auto rows = read_report_rows((run / "rows.csv").string());
  SweepConfig config = default_config();
  config.n = {64, 128};
  REQUIRE(rows.size() == make_grid(config).size());
  REQUIRE(config.mask == std::vector<std::string>{"none", "documents:count=16"});
  std::vector<std::string> synthetic, trained;
  for (const auto& input : config.input)
    (is_trained_input(input) ? trained : synthetic).push_back(input);
  REQUIRE(synthetic.size() == 2);
  REQUIRE(trained.size() == 2);  // the KJV model's two layers
  const auto errors = out.substr(out.find("Error against exact softmax attention (fp64)"));
  const auto learned = out.substr(out.find("on a trained model's q, k, v"));
  const auto others = out.substr(out.find("Not softmax attention"));
  // The speed-up table of one masking setting on the synthetic inputs' shape (B=1 H=8 D=64).
  auto speedup_table = [&](const std::string& setting) {
    const auto at = out.find("Speed-up over exact full, causal " + setting + ", B=1 H=8 D=64");
    REQUIRE(at != std::string::npos);
    return out.substr(at, out.find("\n\n", at) - at);
  };
  const std::vector<std::string> settings{"none", "none, documents:count=16", "top-left",
                                          "top-left, documents:count=16"};
  std::map<std::tuple<std::int64_t, std::string, std::string>, double> full_time;
  for (const auto& r : rows)
    if (r.variant == "full" && r.ok()) full_time[{r.n, r.causal, r.input}] = *r.time_median_s;
  // A cell with no figure prints its first row's status ("unsup." for unsupported).
  auto status_of = [](const std::vector<const ReportRow*>& cell) -> std::string {
    if (cell.empty()) return "-";
    return cell.front()->status == "unsupported" ? "unsup." : cell.front()->status;
  };
  auto geomean = [](const std::vector<double>& xs) {
    double log_sum = 0;
    for (double x : xs) log_sum += std::log(x);
    return std::exp(log_sum / double(xs.size()));
  };
  std::set<std::string> masked_ok;  // the specs with a figure under 16 documents
  for (const auto& spec : config.specs) {
    const std::string label = short_spec(spec);
    INFO(label);
    const bool softmax = make_attention(spec)->support().approximates_softmax;
    for (const auto& setting : settings) {
      INFO("causal " << setting);
      std::vector<std::string> speed{label};
      for (std::int64_t n : {64, 128}) {
        std::vector<const ReportRow*> cell;
        std::vector<double> values;  // full's times, the others' speed-ups over full
        for (const auto& r : rows) {
          if (r.spec != spec || r.n != n || r.causal != setting || is_trained_input(r.input))
            continue;
          cell.push_back(&r);
          const auto full = full_time.find({r.n, r.causal, r.input});
          if (r.ok() && full != full_time.end())
            values.push_back(spec == "full" ? *r.time_median_s : full->second / *r.time_median_s);
        }
        REQUIRE(cell.size() == synthetic.size());
        if (values.empty()) {
          speed.push_back(status_of(cell));
        } else if (spec == "full") {  // "1.23 ms": two words
          const std::string t = time_text(geomean(values));
          speed.push_back(t.substr(0, t.find(' ')));
          speed.push_back(t.substr(t.find(' ') + 1));
        } else {
          speed.push_back(fmt::format("{:.2f}x", geomean(values)));
        }
        if (!values.empty() && setting.find("documents") != std::string::npos)
          masked_ok.insert(spec);
      }
      CHECK(words_of(speedup_table(setting), label) == speed);
    }
    // The error tables: the worst over the inputs and masking settings of each cell.
    std::vector<std::string> rel_fro{label}, cos{"mean", "cosine"};
    for (std::int64_t n : {64, 128}) {
      std::vector<const ReportRow*> cell;
      std::optional<double> worst, lowest_cos;
      for (const auto& r : rows) {
        if (r.spec != spec || r.n != n) continue;
        if (softmax && is_trained_input(r.input)) continue;  // in the trained model's table
        cell.push_back(&r);
        if (!r.ok()) continue;
        CHECK(r.approximates_softmax() == softmax);
        worst = std::max(worst.value_or(0.0), *r.rel_fro);
        lowest_cos = std::min(lowest_cos.value_or(1.0), *r.mean_cos);
      }
      rel_fro.push_back(worst ? fmt::format("{:.2g}", *worst) : status_of(cell));
      if (lowest_cos) cos.push_back(fmt::format("{:.4f}", *lowest_cos));
    }
    CHECK(words_of(softmax ? errors : others, label) == rel_fro);
    CHECK(words_of(softmax ? errors : others, label, true) == cos);
    if (!softmax) continue;
    // The trained model's table: a column per layer and length, causal rows only (with and
    // without the documents), the worst of each.
    std::vector<std::string> on_trained{label};
    for (const auto& input : trained)
      for (std::int64_t n : {64, 128}) {
        std::vector<const ReportRow*> cell;
        std::optional<double> worst;
        for (const auto& r : rows)
          if (r.spec == spec && r.n == n && r.input == input) {
            CHECK(r.causal.rfind("top-left", 0) == 0);
            cell.push_back(&r);
            if (r.ok()) worst = std::max(worst.value_or(0.0), *r.rel_fro);
          }
        REQUIRE(cell.size() == 2);  // top-left, and with the documents
        on_trained.push_back(worst ? fmt::format("{:.2g}", *worst) : status_of(cell));
      }
    CHECK(words_of(learned, label) == on_trained);
  }
  // The documents are applied, not only recorded: the engine's clients run them, and a
  // variant that takes no documents is refused (its row says unsup.).
  CHECK(masked_ok.count("full"));
  CHECK(masked_ok.size() < config.specs.size());
}
