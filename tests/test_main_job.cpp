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
#include <set>
#include <sstream>
#include <string>
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

  // Every point of the grid has its row; every spec a speed-up row and an error row, with the
  // rows' numbers: an approximation of softmax attention in the table of the synthetic inputs and
  // in that of the trained model's, a variant that computes something else in its own table.
  const auto rows = read_report_rows((run / "rows.csv").string());
  SweepConfig config = default_config();
  config.n = {64, 128};
  REQUIRE(rows.size() == make_grid(config).size());
  std::vector<std::string> synthetic, trained;
  for (const auto& input : config.input)
    (is_trained_input(input) ? trained : synthetic).push_back(input);
  REQUIRE(synthetic.size() == 2);
  REQUIRE(trained.size() == 2);  // the KJV model's two layers
  const auto errors = out.substr(out.find("Error against exact softmax attention (fp64)"));
  const auto learned = out.substr(out.find("on a trained model's q, k, v"));
  const auto others = out.substr(out.find("Not softmax attention"));
  const auto speedups = out.substr(0, out.find("causal top-left"));
  std::map<std::int64_t, double> full_time;  // n -> geometric mean over inputs, causal none
  for (const auto& r : rows)
    if (r.variant == "full" && r.causal == "none")
      full_time[r.n] += std::log(*r.time_median_s) / double(synthetic.size());
  for (const auto& spec : config.specs) {
    const std::string label = short_spec(spec);
    INFO(label);
    const bool softmax = make_attention(spec)->support().approximates_softmax;
    std::vector<std::string> speed{label}, rel_fro{label}, cos{"mean", "cosine"};
    for (std::int64_t n : {64, 128}) {
      double worst = 0, lowest_cos = 1, log_speedup = 0;
      for (const auto& r : rows) {
        if (r.spec != spec || r.n != n || !r.ok()) continue;
        CHECK(r.approximates_softmax() == softmax);
        if (r.causal == "none")  // the synthetic inputs' table
          log_speedup += (full_time[n] - std::log(*r.time_median_s)) / double(synthetic.size());
        if (softmax && is_trained_input(r.input)) continue;  // in the trained model's table
        worst = std::max(worst, *r.rel_fro);
        lowest_cos = std::min(lowest_cos, *r.mean_cos);
      }
      rel_fro.push_back(fmt::format("{:.2g}", worst));
      cos.push_back(fmt::format("{:.4f}", lowest_cos));
      if (spec == "full") {  // "1.23 ms": two words
        const std::string t = time_text(std::exp(full_time[n]));
        speed.push_back(t.substr(0, t.find(' ')));
        speed.push_back(t.substr(t.find(' ') + 1));
      } else {
        speed.push_back(fmt::format("{:.2f}x", std::exp(log_speedup)));
      }
    }
    CHECK(words_of(speedups, label) == speed);
    CHECK(words_of(softmax ? errors : others, label) == rel_fro);
    CHECK(words_of(softmax ? errors : others, label, true) == cos);
    if (!softmax) continue;
    // The trained model's table: a column per layer and length, causal rows only.
    std::vector<std::string> on_trained{label};
    for (const auto& input : trained)
      for (std::int64_t n : {64, 128})
        for (const auto& r : rows)
          if (r.spec == spec && r.n == n && r.input == input) {
            CHECK(r.causal == "top-left");
            on_trained.push_back(r.ok() ? fmt::format("{:.2g}", *r.rel_fro) : "unsup.");
          }
    CHECK(words_of(learned, label) == on_trained);
  }
}
