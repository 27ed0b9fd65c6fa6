// The sweep engine: config parsing and its errors, input distributions, the rows file (quoting,
// torn lines), a tiny sweep end to end, resume after a SIGKILL mid-run, shard + merge == an
// unsharded run, and (tag [mpi], run by the sweep_mpi test when MPI is found) mpirun -n 2.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/bf16.hpp"
#include "attnlab/csv.hpp"
#include "attnlab/inputs.hpp"
#include "attnlab/metrics.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/reference.hpp"
#include "harness/config.hpp"
#include "harness/grid.hpp"
#include "harness/heap.hpp"
#include "harness/mask_spec.hpp"
#include "harness/measure.hpp"
#include "harness/report.hpp"
#include "harness/rows.hpp"
#include "harness/sweep.hpp"
#include "harness/trained_inputs.hpp"
#include "helpers.hpp"
#include "training/trainer.hpp"
#include "variants/recurrence_reference.hpp"

using namespace attnlab;
using attnlab::test::require_error;
using namespace attnlab::harness;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("attnlab_sweep_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str(const std::string& sub = "") const { return (path / sub).string(); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Small and fast: timing is not what these tests check.
const char* kMeasure = R"(
[measure]
warmup = 1
min_reps = 1
max_reps = 2
target_seconds = 0.001
error_rows = 24
)";

// Exact kernels only (full, sliding): their outputs do not depend on the thread count, so runs
// in different processes give identical non-timing columns.
std::string small_config(const std::string& name) {
  return "name = \"" + name + "\"\n" +
         R"(variants = ["full", "sliding:left=[4,16],right=0"]
n = [32, 48]
batch = 1
heads = 2
dim = 8
causal = ["none", "top-left"]
input = ["gaussian:temp=0.5", "local:width=4"]
seed = 3
)" + kMeasure;
}

std::map<std::string, Row> by_key(const std::vector<Row>& rows) {
  std::map<std::string, Row> m;
  for (const Row& r : rows) {
    INFO("duplicate key " << r[Col::key]);
    CHECK(m.emplace(r[Col::key], r).second);
  }
  return m;
}

// Same keys, and every non-timing column equal.
void require_same_results(const std::vector<Row>& a, const std::vector<Row>& b) {
  const auto ma = by_key(a), mb = by_key(b);
  REQUIRE(ma.size() == mb.size());
  for (const auto& [key, ra] : ma) {
    const auto it = mb.find(key);
    REQUIRE(it != mb.end());
    for (std::size_t c = 0; c < kColumnCount; ++c) {
      if (is_timing_column(static_cast<Col>(c))) continue;
      INFO("key " << key << " column " << column_names()[c]);
      CHECK(ra.cells[c] == it->second.cells[c]);
    }
  }
}

SweepSummary sweep_quietly(const SweepConfig& c, const std::string& dir, Shard shard = {}) {
  SweepOptions o;
  o.out_dir = dir;
  o.shard = shard;
  o.progress = nullptr;
  return run_sweep(c, o);
}

std::string driver() {
  const char* path = std::getenv("SWEEP_DRIVER");
  return path ? path : "";
}

int run_command(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a config file gives the grid it says", "[harness]") {
  const SweepConfig c = parse_config(R"(
name = "demo"
variants = ["full"]
n = "64..256"
batch = [1, 2]
heads = 4
dim = 16
causal = ["none", "top-left"]
input = ["gaussian:temp=0.5", "lowrank:r=4,temp=2"]
seed = [1, 2]
peers = false

[[variant]]
spec = "sliding:right=0"
left = [8, 32]
max_n = 128

[max_n]
full = 128

[measure]
min_reps = 2
max_reps = 4
error_rows = 100
memory_budget = 0.25
)",
                                     "demo.toml");
  CHECK(c.name == "demo");
  CHECK(c.n == std::vector<std::int64_t>{64, 128, 256});
  CHECK(c.batch == std::vector<std::int64_t>{1, 2});
  CHECK(c.heads == std::vector<std::int64_t>{4});
  CHECK(c.causal == std::vector<std::string>{"none", "top-left"});
  CHECK(c.input == std::vector<std::string>{"gaussian:temp=0.5", "lowrank:r=4,temp=2"});
  REQUIRE(c.specs.size() == 3);
  CHECK(c.specs[0] == "full");
  // [[variant]] lists expand to one canonical spec per value, every key printed.
  CHECK(c.specs[1] == make_attention("sliding:left=8,right=0")->spec());
  CHECK(c.specs[2] == make_attention("sliding:left=32,right=0")->spec());
  CHECK(c.max_n.at("full") == 128);
  CHECK(c.max_n.at(c.specs[1]) == 128);
  CHECK(c.measure.min_reps == 2);
  CHECK(c.measure.error_rows == 100);
  CHECK(c.measure.memory_budget == 0.25);

  // 3 specs x 3 n x 2 batch x 2 causal x 2 inputs x 2 seeds, minus n = 256 for all three specs.
  const auto grid = make_grid(c);
  CHECK(grid.size() == 3 * 2 * 2 * 2 * 2 * 2);
  std::set<std::string> keys;
  for (const auto& p : grid) {
    CHECK(p.n <= 128);
    CHECK(p.key == point_key(p));
    keys.insert(p.key);
  }
  CHECK(keys.size() == grid.size());
}

TEST_CASE("spec lists expand through the factory", "[harness]") {
  const auto specs = expand_spec("sliding:left=[4,8],right=[0,2]");
  CHECK(specs.size() == 4);
  CHECK(specs[0] == make_attention("sliding:left=4,right=0")->spec());
  const auto all = expand_spec("*");
  CHECK(all.size() == attention_names().size());  // every registered variant, new ones included
  require_error([] { expand_spec("sliding:left=[4,8"); }, {"left=[4,8", "missing ']'"});
  require_error([] { expand_spec("sliding:left=[]"); }, {"empty value"});
  require_error([] { expand_spec("nosuch:k=[1,2]"); }, {"unknown variant", "nosuch"});
}

TEST_CASE("config errors name the file, line and key", "[harness]") {
  require_error(
      [] {
        parse_config("n = [64]\nvariants = [\"full\"]\ninput = \"gaussian\"\nbogus = 1\n",
                     "a.toml");
      },
      {"a.toml:4", "bogus", "unknown key"});
  require_error(
      [] {
        parse_config("variants = [\"full\"]\ninput = \"gaussian\"\nn = [64, \"x\"]\n", "b.toml");
      },
      {"b.toml:3", "n", "integer"});
  require_error(
      [] { parse_config("n = [64]\ninput = \"gaussian\"\nvariants = [\"fulll\"]\n", "c.toml"); },
      {"c.toml:3", "variants", "fulll", "unknown variant"});
  require_error(
      [] {
        parse_config("n = [64]\ninput = \"gaussian\"\nvariants = [\"full:window=3\"]\n", "d.toml");
      },
      {"d.toml:3", "window=3", "unknown key"});
  require_error(
      [] {
        parse_config("n = [64]\nvariants = [\"full\"]\ninput = \"gaussian:temp=-1\"\n", "e.toml");
      },
      {"e.toml:3", "input", "temp=-1", "positive"});
  require_error(
      [] {
        parse_config(
            "n = [64]\nvariants = [\"full\"]\ninput = \"gaussian\"\ncausal = \"sideways\"\n",
            "f.toml");
      },
      {"f.toml:4", "causal", "sideways"});
  require_error(
      [] {
        parse_config(
            "n = [64]\nvariants = [\"full\"]\ninput = \"gaussian\"\n[measure]\nmin_reps = 0\n",
            "g.toml");
      },
      {"g.toml", "measure.min_reps", ">= 1"});
  require_error(
      [] {
        parse_config("n = [64]\nvariants = [\"full\"]\ninput = \"gaussian\"\n[measure]\nreps = 3\n",
                     "h.toml");
      },
      {"h.toml:5", "measure.reps", "unknown key"});
  require_error([] { parse_config("n = [64\n", "i.toml"); }, {"i.toml:"});
  require_error([] { parse_config("variants = [\"full\"]\ninput = \"gaussian\"\n", "j.toml"); },
                {"j.toml", "n", "no values"});
  require_error(
      [] {
        parse_config(
            "n = [64]\nvariants = [\"full\"]\ninput = \"gaussian\"\n[max_n]\nlinformer = 4\n",
            "k.toml");
      },
      {"k.toml:5", "max_n.linformer", "no variant"});
  require_error([] { load_config("/nonexistent/sweep.toml"); }, {"/nonexistent/sweep.toml"});
  require_error([] { parse_int_list("--n", "64,0"); }, {"--n", "'0'"});
  require_error([] { parse_input_list("--input", "lowrank:temp=2"); }, {"--input", "r=R"});
  require_error([] { parse_shard("3/2"); }, {"--shard", "3/2"});
  require_error([] { parse_shard("1of2"); }, {"--shard", "1of2"});
}

TEST_CASE("the built-in default config parses and covers every variant", "[harness]") {
  const SweepConfig c = default_config();
  CHECK(c.name == "default");
  for (const auto& name : attention_names()) {
    bool found = false;
    for (const auto& s : c.specs) found = found || s.substr(0, s.find(':')) == name;
    INFO("variant " << name);
    CHECK(found);
  }
  // ./dev run shows the mask axis: every point also with 16 packed documents.
  CHECK(c.mask == std::vector<std::string>{"none", "documents:count=16"});
  // The compiled-in text is benchmarks/configs/default.toml.
  CHECK(c.text == read_file(std::string(ATTNLAB_SOURCE_DIR) + "/benchmarks/configs/default.toml"));
}

TEST_CASE("input distributions are seeded and shaped as documented", "[harness]") {
  const QKV a = make_inputs("gaussian:temp=0.5", 1, 2, 64, 16, 7);
  const QKV b = make_inputs("gaussian:temp=0.5", 1, 2, 64, 16, 7);
  const QKV c = make_inputs("gaussian:temp=0.5", 1, 2, 64, 16, 8);
  CHECK(a.q == b.q);
  CHECK(a.v == b.v);
  CHECK(a.q != c.q);

  // Logits q·k/sqrt(D) have standard deviation 1/T (sample estimate over 2·64·64 logits).
  auto logit_std = [](const QKV& t) {
    double sum = 0, sq = 0, count = 0;
    const std::size_t d = t.q.shape(3);
    for (std::size_t h = 0; h < t.q.shape(1); ++h)
      for (std::size_t i = 0; i < t.q.shape(2); ++i)
        for (std::size_t j = 0; j < t.k.shape(2); ++j) {
          double dot = 0;
          for (std::size_t c = 0; c < d; ++c) dot += t.q(0, h, i, c) * t.k(0, h, j, c);
          dot /= std::sqrt(double(d));
          sum += dot, sq += dot * dot, ++count;
        }
    return std::sqrt(sq / count - (sum / count) * (sum / count));
  };
  CHECK(logit_std(make_inputs("gaussian:temp=0.5", 1, 2, 64, 16, 1)) == Approx(2.0).epsilon(0.1));
  CHECK(logit_std(make_inputs("gaussian:temp=4", 1, 2, 64, 16, 1)) == Approx(0.25).epsilon(0.1));
  CHECK(logit_std(make_inputs("lowrank:r=4,temp=1", 1, 2, 64, 16, 1)) == Approx(1.0).epsilon(0.15));

  // lowrank: q lies in an r-dimensional subspace: the 5th pivot of Gaussian elimination on a
  // 6 x 16 block of q vanishes (to float rounding).
  {
    const QKV t = make_inputs("lowrank:r=4", 1, 1, 6, 16, 2);
    std::vector<std::vector<double>> m(6, std::vector<double>(16));
    for (std::size_t i = 0; i < 6; ++i)
      for (std::size_t c = 0; c < 16; ++c) m[i][c] = t.q(0, 0, i, c);
    std::size_t rank = 0;
    for (std::size_t col = 0; col < 16 && rank < 6; ++col) {
      std::size_t best = rank;
      for (std::size_t r = rank; r < 6; ++r)
        if (std::abs(m[r][col]) > std::abs(m[best][col])) best = r;
      if (std::abs(m[best][col]) < 1e-4) continue;  // float32 inputs of size ~1
      std::swap(m[best], m[rank]);
      for (std::size_t r = rank + 1; r < 6; ++r) {
        const double f = m[r][col] / m[rank][col];
        for (std::size_t c = 0; c < 16; ++c) m[r][c] -= f * m[rank][c];
      }
      ++rank;
    }
    CHECK(rank == 4);
  }

  // local: most attention mass lies within 3 widths of the diagonal (measured ~0.9 at N=256,
  // D=64, width 8; a far key gets about exp(-6) of a near one).
  {
    const QKV t = make_inputs("local:width=8", 1, 1, 256, 64, 3);
    double near = 0, total = 0;
    for (std::size_t i = 0; i < 256; i += 16) {
      std::vector<double> w(256);
      double top = -1e300;
      for (std::size_t j = 0; j < 256; ++j) {
        double dot = 0;
        for (std::size_t c = 0; c < 64; ++c) dot += t.q(0, 0, i, c) * t.k(0, 0, j, c);
        w[j] = dot / 8.0;
        top = std::max(top, w[j]);
      }
      for (std::size_t j = 0; j < 256; ++j) {
        const double e = std::exp(w[j] - top);
        total += e;
        if (std::abs(double(i) - double(j)) <= 24) near += e;
      }
    }
    CHECK(near / total > 0.7);
  }

  require_error([] { make_inputs("lowrank:r=32", 1, 1, 8, 16, 1); }, {"r=32", "exceeds dim 16"});
  require_error([] { make_inputs("uniform", 1, 1, 8, 16, 1); },
                {"uniform", "unknown distribution"});
  require_error([] { make_inputs("local:temp=2", 1, 1, 8, 16, 1); }, {"unknown key 'temp'"});
  require_error([] { make_inputs("gaussian:temp=abc", 1, 1, 8, 16, 1); }, {"temp=abc"});
}

TEST_CASE("token inputs are seeded, in range, and what the rows' errors were measured with",
          "[harness]") {
  const TokenValues a = make_token_inputs(2, 3, 500, 7), b = make_token_inputs(2, 3, 500, 7);
  CHECK(a.log_decay == b.log_decay);
  CHECK(a.beta == b.beta);
  CHECK(a.log_decay != make_token_inputs(2, 3, 500, 8).log_decay);
  CHECK(a.log_decay.shape(2) == 500);
  // g = log sigmoid(z) / 16 with z ~ N(0, 1): in (log sigmoid(-6) / 16, 0) for 3000 draws (6
  // sigma), mean E[log sigmoid(z)] / 16 = -0.0504 (numerically integrated), within 0.003 (the
  // standard error of the mean of 3000 draws is 0.0006); beta = sigmoid(z'), mean 0.5.
  CHECK(xt::amax(a.log_decay)() < 0);
  CHECK(xt::amin(a.log_decay)() > -6.0025 / 16);
  CHECK(xt::mean(a.log_decay)() == Approx(-0.0504).margin(0.003));
  CHECK(xt::amin(a.beta)() > 0);
  CHECK(xt::amax(a.beta)() < 1);
  CHECK(xt::mean(a.beta)() == Approx(0.5).margin(0.02));
  // Its own streams: q, k and v are those of make_inputs alone.
  CHECK(std::string(kTokenInputsRecipe).find("log sigmoid(z) / 16") != std::string::npos);

  // A sweep's error of gated-delta is that of its forward with these inputs against its own
  // float64 definition on the sampled rows: the row is reproducible from (input, seed) alone.
  TempDir dir;
  const SweepConfig c = parse_config(std::string(R"(
variants = ["gated-delta", "retnet"]
n = [96]
heads = 2
dim = 8
causal = ["top-left"]
input = ["gaussian:temp=0.5"]
seed = 5
)") + kMeasure,
                                     "tokens.toml");
  sweep_quietly(c, dir.str());
  const auto rows = read_rows(dir.str("rows.csv"));
  REQUIRE(rows.size() == 2);
  const QKV t = make_inputs("gaussian:temp=0.5", 1, 2, 96, 8, 5);
  const TokenValues tokens = make_token_inputs(1, 2, 96, 5);
  Mask causal;
  causal.causal = Causal::top_left;
  for (const Row& r : rows) {
    INFO(r[Col::spec] << ": " << r[Col::message]);
    REQUIRE(r[Col::status] == "ok");
    CHECK(r[Col::error_vs] == "own");
    const auto a = make_attention(r[Col::spec]);
    const bool gated = a->support().log_decay;
    CHECK(r[Col::token_inputs] == (gated ? "g,beta" : ""));
    const TokenInputs in = gated ? TokenInputs::of(&tokens.log_decay, &tokens.beta) : TokenInputs{};
    Tensor out;
    a->forward(t.q, t.k, t.v, causal, in, out);
    const auto sample = error_rows(96, 24, 5);
    Tensor picked = Tensor::from_shape({1, 2, sample.size(), 8});
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 0; i < sample.size(); ++i)
        for (std::size_t c2 = 0; c2 < 8; ++c2) picked(0, h, i, c2) = out(0, h, sample[i], c2);
    const ErrorMetrics e = compare(picked, own_reference(*a, t.q, t.k, t.v, causal, in, sample));
    CHECK(std::stod(r[Col::rel_fro]) == Approx(e.rel_fro).epsilon(1e-6));
    // Without the gates the same kernel computes something else: the rows used them.
    if (gated) {
      Tensor plain;
      a->forward(t.q, t.k, t.v, causal, {}, plain);
      CHECK(xt::amax(xt::abs(plain - out))() > 1e-2);
    }
  }
}

TEST_CASE("rows are CSV with quoting, and a torn last line is dropped", "[harness]") {
  CHECK(csv_line(std::vector<std::string>{"a", "b,c", "say \"hi\"", ""}) ==
        "a,\"b,c\",\"say \"\"hi\"\"\",\n");
  const auto records = parse_csv("a,\"b,c\",\"say \"\"hi\"\"\",\nx,y,z,w\nhalf,li");
  std::size_t torn = 0;
  parse_csv("a,b\nhalf,li", &torn);
  CHECK(torn == 4);
  REQUIRE(records.size() == 2);
  CHECK(records[0] == std::vector<std::string>{"a", "b,c", "say \"hi\"", ""});
  std::vector<std::size_t> lines;  // where each record starts: a quoted line break is a line
  CHECK(parse_csv("h1,h2\r\n\"two\nlines\",x\ny,z\n", nullptr, &lines).back() ==
        std::vector<std::string>{"y", "z"});
  CHECK(lines == std::vector<std::size_t>{1, 2, 4});
  CHECK(format_number(0.1f) == "0.100000001");  // %.9g round-trips a float
  CHECK(static_cast<float>(std::stod(format_number(0.1f))) == 0.1f);

  TempDir dir;
  const std::string path = dir.str("rows.csv");
  Row row;
  row[Col::key] = "k1";
  row[Col::message] = "a, \"quoted\" message";
  {
    RowsFile f(path);
    f.append(row);
    require_error([&] { RowsFile again(path); }, {"locked"});  // one writer at a time
  }
  {
    std::ofstream out(path, std::ios::app);
    out << "k2,half a ro";  // a crash inside write()
  }
  RowsFile f(path);
  CHECK(f.repaired_bytes() == std::string("k2,half a ro").size());
  REQUIRE(f.rows().size() == 1);
  CHECK(f.rows()[0][Col::message] == row[Col::message]);
  CHECK(f.has("k1"));
  CHECK_FALSE(f.has("k2"));
  CHECK(read_file(path).back() == '\n');

  std::ofstream(dir.str("bad.csv")) << "key,spec\n";
  require_error([&] { read_rows(dir.str("bad.csv")); }, {"bad.csv:1", "header"});
}

TEST_CASE("a CSV log appears with its first row, torn tails go, keep_only cuts it back",
          "[harness]") {
  TempDir dir;
  const std::string path = dir.str("log.csv");
  const CsvRecord header = {"step", "x"};
  const CsvAppendOptions lazy = {.header_now = false, .holder = "another test"};
  { CsvAppender never(path, header, lazy); }
  CHECK_FALSE(fs::exists(path));  // a writer that never appended leaves no file
  {
    CsvAppender log(path, header, lazy);
    log.append({"1", "a"});
    log.append({"2", "b,c"});
    require_error([&] { CsvAppender again(path, header, lazy); },
                  {"log.csv is locked", "another test"});
  }
  CHECK(read_file(path) == "step,x\n1,a\n2,\"b,c\"\n");
  std::ofstream(path, std::ios::app) << "3,tor";  // a crash inside write()
  CsvAppender log(path, header, lazy);
  CHECK(log.repaired_bytes() == 5);
  REQUIRE(log.records().size() == 3);
  CHECK(log.records()[2] == CsvRecord{"2", "b,c"});
  CHECK(log.keep_only([](const CsvRecord& r) { return r[0] == "1"; }) == 1);
  log.append({"2", "d"});
  CHECK(read_file(path) == "step,x\n1,a\n2,d\n");
  CHECK(log.keep_only([](const CsvRecord&) { return true; }) == 0);
}

TEST_CASE("timing statistics, error rows and heap accounting", "[harness]") {
  const TimeStats s = time_stats({5, 1, 3, 2, 4});
  CHECK(s.median == 3);
  CHECK(s.min == 1);
  CHECK(s.max == 5);
  CHECK(s.iqr == 2);  // quartiles 2 and 4

  CHECK(error_rows(100, 256, 1).empty());  // all rows
  const auto rows = error_rows(1000, 64, 1);
  CHECK(rows.size() == 64);
  CHECK(std::is_sorted(rows.begin(), rows.end()));
  CHECK(std::set<std::size_t>(rows.begin(), rows.end()).size() == 64);
  CHECK(rows.back() < 1000);
  CHECK(rows == error_rows(1000, 64, 1));
  CHECK(rows != error_rows(1000, 64, 2));

  REQUIRE(heap::counting());
  heap::reset_peak();
  const auto base = heap::live_bytes();
  {
    std::vector<char> big(1 << 20);
    big[5] = 1;
    CHECK(heap::live_bytes() - base >= (1 << 20));
  }
  CHECK(heap::peak_bytes() - base >= (1 << 20));
  CHECK(heap::live_bytes() - base < (1 << 20));
}

TEST_CASE("a tiny sweep over every variant writes one row per point", "[harness]") {
  TempDir dir;
  SweepConfig c = parse_config(std::string(R"(
name = "tiny"
variants = ["*"]
n = [64]
batch = 1
heads = 2
dim = 16
causal = ["none", "top-left"]
input = ["gaussian:temp=0.5", "lowrank:r=32"]
)") + kMeasure,
                               "tiny.toml");
  const auto summary = sweep_quietly(c, dir.str());
  const auto grid = make_grid(c);
  CHECK(summary.grid == grid.size());
  CHECK(summary.ran == grid.size());

  const std::string header = read_file(dir.str("rows.csv")).substr(0, 40);
  CHECK(header == std::string("key,spec,variant,n,batch,heads,dim,causal").substr(0, 40));
  const auto rows = read_rows(dir.str("rows.csv"));
  REQUIRE(rows.size() == grid.size());
  const auto m = by_key(rows);
  for (const auto& p : grid) {
    REQUIRE(m.count(p.key));
    const Row& r = m.at(p.key);
    INFO(p.spec << " " << p.causal << " " << p.input << ": " << r[Col::message]);
    CHECK(r[Col::spec] == p.spec);
    const std::string status = r[Col::status];
    CHECK((status == "ok" || status == "unsupported" || status == "error"));
    if (p.input.rfind("lowrank", 0) == 0) {
      // r = 32 > dim 16: the inputs cannot be made; the point fails, the sweep goes on.
      CHECK(status == "error");
      CHECK(r[Col::message].find("exceeds dim 16") != std::string::npos);
      continue;
    }
    if (status == "unsupported")
      CHECK(r[Col::message].find("does not support") != std::string::npos);
    if (status != "ok") continue;
    CHECK(r[Col::message].empty());
    CHECK(std::stoi(r[Col::reps]) >= 1);
    CHECK(std::stod(r[Col::time_min_s]) <= std::stod(r[Col::time_median_s]));
    CHECK(std::stod(r[Col::time_median_s]) <= std::stod(r[Col::time_max_s]));
    CHECK(std::stoll(r[Col::peak_mem_bytes]) >= 2 * 64 * 16 * 4);  // at least the output
    CHECK(r[Col::err_rows] == "24");  // n = 64 > error_rows = 24: a sample
    CHECK(std::stod(r[Col::sgemm_gflops]) > 0);
    CHECK(std::stod(r[Col::mean_cos]) <= 1.0 + 1e-12);
    // What the variant declares decides what its error is measured against; a variant that is
    // not softmax attention is measured against its own float64 definition, given the token
    // inputs it takes, and then its error is only the float32 kernels' rounding: fp32 chunked
    // kernels against fp64 over 64 tokens, measured below 1e-6; softmax variants are not all
    // that close to softmax (linear attention is not).
    const Support support = make_attention(p.spec)->support();
    CHECK(r[Col::error_vs] == (support.approximates_softmax ? "softmax" : "own"));
    if (!support.approximates_softmax) CHECK(std::stod(r[Col::rel_fro]) < 1e-5);
    const std::string tokens = std::string(support.log_decay ? "g" : "") +
                               (support.log_decay && support.beta ? "," : "") +
                               (support.beta ? "beta" : "");
    CHECK(r[Col::token_inputs] == tokens);
    if (p.spec == "full") {
      // exact: fp32 with an online softmax against fp64, ~1e-7 relative
      CHECK(std::stod(r[Col::rel_fro]) < 1e-5);
      const double pairs = p.causal == "none" ? 64.0 * 64 : 64.0 * 65 / 2;
      CHECK(std::stod(r[Col::flops]) == 2 * pairs * 2 * (16 + 16));
      CHECK(
          std::stod(r[Col::gflops]) ==
          Approx(std::stod(r[Col::flops]) / std::stod(r[Col::time_median_s]) / 1e9).epsilon(1e-6));
    }
  }
  const auto meta = nlohmann::json::parse(read_file(dir.str("meta.json")));
  for (const char* key : {"git_commit", "git_dirty", "compiler", "compiler_flags", "build_type",
                          "cpu_model", "cpu_flags", "blas", "OPENBLAS_CORETYPE", "threads", "date",
                          "hostname", "config", "grid", "sgemm_gflops", "runs", "token_inputs"}) {
    INFO("meta.json key " << key);
    CHECK(meta.contains(key));
  }

  // Rerunning the finished sweep runs nothing and duplicates nothing.
  const auto again = sweep_quietly(c, dir.str());
  CHECK(again.ran == 0);
  CHECK(again.done_before == grid.size());
  CHECK(read_rows(dir.str("rows.csv")).size() == grid.size());
  CHECK(nlohmann::json::parse(read_file(dir.str("meta.json")))["runs"].size() == 2);
}

TEST_CASE("mask specs parse to canonical texts and make the Mask they say", "[harness]") {
  CHECK(parse_mask_spec("none").text() == "none");
  CHECK(parse_mask_spec(" documents:count=16 ").text() == "documents:count=16");
  CHECK(parse_mask_spec("prefix:frac=0.25").text() == "prefix:frac=0.25");
  CHECK(parse_mask_spec("window:left=512").text() == "window:left=512,right=512");
  CHECK(parse_mask_spec("window:right=0,left=-1").text() == "window:left=-1,right=0");
  for (const char* text : {"none", "documents:count=3", "prefix:frac=0.5", "window:left=4,right=0"})
    CHECK(parse_mask_spec(parse_mask_spec(text).text()).text() == text);

  Mask m;
  add_mask_part(parse_mask_spec("documents:count=3"), 10, 1, m);
  CHECK(m.documents == std::vector<std::int64_t>{0, 3, 6, 10});
  m = Mask{};
  m.causal = Causal::top_left;
  add_mask_part(parse_mask_spec("prefix:frac=0.25"), 10, 2, m);
  CHECK(m.prefix_lengths == std::vector<std::int64_t>{2, 2});
  m = Mask{};
  add_mask_part(parse_mask_spec("window:left=4,right=0"), 10, 1, m);
  REQUIRE(m.window);
  CHECK((m.window->left == 4 && m.window->right == 0));

  // Bad specs quote the spec and name the key.
  require_error([] { parse_mask_spec("documents:cnt=4"); }, {"mask 'documents:cnt=4'", "cnt"});
  require_error([] { parse_mask_spec("documents"); }, {"mask 'documents'", "count"});
  require_error([] { parse_mask_spec("documents:count=0"); }, {"count=0", ">= 1"});
  require_error([] { parse_mask_spec("prefix:frac=1.5"); }, {"frac=1.5", "[0, 1]"});
  require_error([] { parse_mask_spec("window:left=-2"); }, {"left=-2", "-1 (unbounded)"});
  require_error([] { parse_mask_spec("window"); }, {"mask 'window'", "left"});
  require_error([] { parse_mask_spec("causal"); }, {"unknown mask 'causal'", "documents"});
  require_error([] { parse_mask_list("--mask", "none;window:left=x"); },
                {"--mask", "window:left=x", "left=x"});
  require_error(
      [] {
        Mask two;
        add_mask_part(parse_mask_spec("documents:count=2"), 10, 2, two);
      },
      {"documents:count=2", "batch of one", "batch = 2"});
  require_error(
      [] {
        Mask unmasked;
        add_mask_part(parse_mask_spec("prefix:frac=0.5"), 10, 1, unmasked);
      },
      {"prefix:frac=0.5", "causal = none"});
  require_error(
      [] {
        Mask many;
        add_mask_part(parse_mask_spec("documents:count=11"), 10, 1, many);
      },
      {"count=11", "N = 10"});
}

TEST_CASE("the mask is a grid axis, each point measured against softmax under its mask",
          "[harness]") {
  TempDir dir;
  SweepConfig c = parse_config(std::string(R"(
name = "masks"
variants = ["full", "sliding:left=8,right=8", "linformer"]
n = [64]
batch = 1
heads = 2
dim = 16
causal = ["none", "top-left"]
mask = ["none", "documents:count=4", "prefix:frac=0.25", "window:left=8"]
input = ["gaussian:temp=0.5"]
)") + kMeasure,
                               "masks.toml");
  CHECK(c.mask == std::vector<std::string>{"none", "documents:count=4", "prefix:frac=0.25",
                                           "window:left=8,right=8"});
  const auto grid = make_grid(c);
  // Per spec: none, documents and window under both causal settings, prefix under top-left only.
  CHECK(grid.size() == 3 * 7);
  std::set<std::string> keys;
  for (const Point& p : grid) {
    keys.insert(p.key);
    CHECK_FALSE((p.mask == "prefix:frac=0.25" && p.causal == "none"));
  }
  CHECK(keys.size() == grid.size());  // the mask is part of the key

  sweep_quietly(c, dir.str());
  const auto rows = read_rows(dir.str("rows.csv"));
  REQUIRE(rows.size() == grid.size());
  for (const Row& r : rows) {
    INFO(r[Col::spec] << " " << r[Col::causal] << " " << r[Col::mask] << ": " << r[Col::message]);
    // The spec column holds the full spec (linformer:k=256,...): the variant names it.
    if (r[Col::variant] == "linformer") {  // takes no mask beyond causal padding: refused, named
      if (r[Col::mask] != "none") {
        CHECK(r[Col::status] == "unsupported");
        CHECK(r[Col::message].find("linformer") != std::string::npos);
      }
      continue;
    }
    REQUIRE(r[Col::status] == "ok");
    if (r[Col::variant] != "full") continue;
    // Exact under every mask: the reference applies the same mask (a reference without it
    // would be far off: a document sees a quarter of the keys). fp32 against fp64: ~1e-7.
    CHECK(std::stod(r[Col::rel_fro]) < 1e-5);
    // The flops count the visible pairs: the mask is applied, not only recorded.
    const bool causal = r[Col::causal] != "none";
    double pairs = causal ? 64.0 * 65 / 2 : 64.0 * 64;
    if (r[Col::mask] == "documents:count=4") pairs = causal ? 4 * 16.0 * 17 / 2 : 4 * 16.0 * 16;
    if (r[Col::mask] == "prefix:frac=0.25") pairs = 64.0 * 65 / 2 + 16.0 * 15 / 2;
    if (r[Col::mask] == "window:left=8,right=8") {
      pairs = 0;
      for (int i = 0; i < 64; ++i)
        pairs += std::min(63, causal ? i : i + 8) - std::max(0, i - 8) + 1;
    }
    CHECK(std::stod(r[Col::flops]) == 2 * pairs * 2 * (16 + 16));
  }

  // The grid refuses what its masks cannot take, naming the mask.
  c.causal = {"none"};
  require_error([&] { make_grid(c); }, {"prefix:frac=0.25", "causal", "top-left"});
  c.causal = {"top-left"};
  c.batch = {2};
  require_error([&] { make_grid(c); }, {"documents:count=4", "batch of one", "2"});
  c.batch = {1};
  c.n = {64, 2};  // a length shorter than the documents: refused before any point runs
  require_error([&] { make_grid(c); }, {"documents:count=4", "more documents", "N = 2"});
  require_error([] { parse_config("mask = [\"window:wide=3\"]\n", "bad.toml"); },
                {"bad.toml:1", "mask", "window:wide=3", "wide"});
}

TEST_CASE(
    "the dtype is a grid axis: a bf16 point is the bf16 forward, measured against the float64 "
    "reference of the float32 inputs",
    "[harness]") {
  TempDir dir;
  SweepConfig c = parse_config(std::string(R"(
name = "dtypes"
variants = ["full", "sliding:left=8,right=8", "gla"]
n = [48]
batch = 1
heads = 2
dim = 16
causal = ["top-left"]
dtype = ["float32", "bf16"]
input = ["gaussian:temp=0.5"]
peers = true
)") + kMeasure,
                               "dtypes.toml");
  CHECK(c.dtype == std::vector<std::string>{"float32", "bf16"});
  CHECK(default_config().dtype == std::vector<std::string>{"float32"});
  const auto grid = make_grid(c);
  // 3 specs in both dtypes; the peers in float32 only (they are handed float32 arrays).
  REQUIRE(grid.size() == 3 * 2 + 2);
  std::set<std::string> keys;
  for (const Point& p : grid) {
    keys.insert(p.key);
    if (p.peer) CHECK(p.dtype == "float32");
  }
  CHECK(keys.size() == grid.size());
  // A float32 point keeps the key it had before the axis existed.
  SweepConfig plain = c;
  plain.dtype = {"float32"};
  for (const Point& p : make_grid(plain)) CHECK(keys.count(p.key));

  c.peers = false;  // the grid above is what was checked; running Python is not
  sweep_quietly(c, dir.str());
  const auto rows = read_rows(dir.str("rows.csv"));
  REQUIRE(rows.size() == 6);
  std::map<std::string, const Row*> by;  // "spec|dtype"
  for (const Row& r : rows) by[r[Col::variant] + "|" + r[Col::dtype]] = &r;
  REQUIRE(by.size() == 6);
  for (const Row& r : rows) {
    INFO(r[Col::spec] << " " << r[Col::dtype] << ": " << r[Col::message]);
    REQUIRE(r[Col::status] == "ok");
    CHECK(std::stoi(r[Col::reps]) >= 1);
    CHECK(std::stoll(r[Col::peak_mem_bytes]) > 0);
    // The same useful work in either type.
    CHECK(r[Col::flops] == (*by.at(r[Col::variant] + "|float32"))[Col::flops]);
  }

  // full in bf16: exactly the error of Attention's bf16 forward of the rounded inputs, against
  // float64 attention of the float32 inputs (not of the rounded ones), on the same rows.
  const QKV t = make_inputs("gaussian:temp=0.5", 1, 2, 48, 16, 1);
  Mask causal;
  causal.causal = Causal::top_left;
  const std::vector<std::size_t> sampled = error_rows(48, 24, 1);
  auto gather = [&](const Tensor& out) {
    Tensor g = Tensor::from_shape({1, 2, sampled.size(), 16});
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 0; i < sampled.size(); ++i)
        std::copy_n(&out(0, h, sampled[i], 0), 16, &g(0, h, i, 0));
    return g;
  };
  const Tensor out16 =
      to_float32(make_attention("full")->forward(to_bf16(t.q), to_bf16(t.k), to_bf16(t.v), causal));
  const ErrorMetrics expected =
      compare(gather(out16), reference_attention(t.q, t.k, t.v, causal, sampled));
  const double full16 = std::stod((*by.at("full|bf16"))[Col::rel_fro]);
  // The row holds %.9g of the same float64 computation (the reference made per head).
  CHECK(full16 == Approx(expected.rel_fro).epsilon(1e-7));
  // bf16 keeps 8 significant bits: rounding the output alone is up to 2^-9 = 2.0e-3 relative per
  // element, and q and k's rounding moves the sharp logits (std 2) by about as much again;
  // measured 4.2e-3 here (3.7e-3 to 8.3e-3 at N = 48 and 1024, both inputs, causal or not).
  // float32 full: 1.5e-7.
  CHECK(full16 > 1e-4);
  CHECK(full16 < 2e-2);
  CHECK(std::stod((*by.at("full|float32"))[Col::rel_fro]) < 1e-5);
  // A variant measured against its own definition is, in bf16, too (its float32 inputs'):
  // measured 3.4e-3 (float32: 1.2e-7).
  CHECK((*by.at("gla|bf16"))[Col::error_vs] == "own");
  CHECK((*by.at("gla|bf16"))[Col::token_inputs] == "g");
  CHECK(std::stod((*by.at("gla|bf16"))[Col::rel_fro]) > 1e-4);
  CHECK(std::stod((*by.at("gla|bf16"))[Col::rel_fro]) < 2e-2);

  const auto meta = nlohmann::json::parse(read_file(dir.str("meta.json")));
  CHECK(meta["grid"]["dtype"] == nlohmann::json({"float32", "bf16"}));
  // The report's precision section, from these rows.
  ReportOptions options;
  options.plots = false;
  render_report(dir.str(), options);
  const std::string md = read_file(dir.str("report.md"));
  const auto precision = md.find("## Precision");
  REQUIRE(precision != std::string::npos);
  char full16_text[32];
  std::snprintf(full16_text, sizeof full16_text, "%.2e", full16);
  CHECK(md.find("| `full` | `gaussian:temp=0.5` | top-left | 1,2,16 | 1 |", precision) !=
        std::string::npos);
  CHECK(md.find(full16_text, precision) != std::string::npos);

  // Bad dtypes are refused naming the key or the flag.
  require_error([] { parse_config("dtype = [\"float32\", \"fp16\"]\n", "bad.toml"); },
                {"bad.toml:1", "dtype", "'fp16'", "float32 or bf16"});
  require_error([] { parse_config("dtype = []\n", "empty.toml"); },
                {"empty.toml:1", "dtype", "empty"});
  require_error([] { parse_config("dtype = 16\n", "int.toml"); },
                {"int.toml:1", "dtype", "string"});
  require_error([] { parse_dtype_list("--dtype", "bf16,float16"); }, {"--dtype", "'float16'"});
  SweepConfig half = c;
  half.dtype = {"half"};
  require_error([&] { validate(half); }, {"dtype", "'half'", "float32 or bf16"});
  Point p = grid.front();
  p.dtype = "half";
  PointRunner runner(c.measure, 1.0, std::int64_t(1) << 32, "");
  const Row refused = runner.run(p);
  CHECK(refused[Col::status] == "error");
  CHECK(refused[Col::message].find("dtype 'half'") != std::string::npos);
  // The peers take float32 arrays: a bf16 peer point (the grid makes none) is refused, named.
  const auto first_peer =
      std::find_if(grid.begin(), grid.end(), [](const Point& x) { return x.peer; });
  REQUIRE(first_peer != grid.end());
  Point peer = *first_peer;
  peer.dtype = "bf16";
  const Row peer_row = runner.run(peer);
  CHECK(peer_row[Col::status] == "error");
  CHECK(peer_row[Col::message].find("dtype 'bf16'") != std::string::npos);
}

TEST_CASE("points over the memory budget are refused as oom without running", "[harness]") {
  TempDir dir;
  SweepConfig c = parse_config(small_config("oom"), "oom.toml");
  c.measure.memory_budget = 2;  // bytes
  sweep_quietly(c, dir.str());
  const auto rows = read_rows(dir.str("rows.csv"));
  REQUIRE(rows.size() == make_grid(c).size());
  for (const Row& r : rows) {
    CHECK(r[Col::status] == "oom");
    CHECK(r[Col::message].find("memory budget") != std::string::npos);
    CHECK(r[Col::time_median_s].empty());
  }
}

// Runs the sweep driver on `config` into `out`; it SIGKILLs itself right after storing its
// `rows`-th row, before it removes the `running` marker.
void sweep_killed_after(const std::string& config, const std::string& out, std::size_t rows) {
  const std::string count = std::to_string(rows);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    execl(driver().c_str(), driver().c_str(), config.c_str(), out.c_str(), "--kill-after",
          count.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}

TEST_CASE("a sweep killed mid-run resumes with no row lost or duplicated", "[harness]") {
  if (driver().empty()) FAIL("SWEEP_DRIVER is not set (meson test sets it)");
  TempDir dir;
  const std::string config = dir.str("sweep.toml");
  std::ofstream(config) << small_config("kill");
  const std::string out = dir.str("out");
  const SweepConfig c = load_config(config);
  const auto grid = make_grid(c);
  REQUIRE(grid.size() > 6);

  sweep_killed_after(config, out, 4);
  CHECK(read_rows(out + "/rows.csv").size() == 4);
  CHECK(fs::exists(out + "/running"));  // the killed process was between points

  // And a crash inside write() left half a row behind.
  {
    std::ofstream torn(out + "/rows.csv", std::ios::app);
    const std::string line = csv_line(read_rows(out + "/rows.csv").front());
    torn << line.substr(0, line.size() / 2);
  }

  const auto summary = sweep_quietly(c, out);
  CHECK(summary.done_before == 4);
  CHECK(summary.ran == grid.size() - 4);
  const auto rows = read_rows(out + "/rows.csv");
  CHECK(rows.size() == grid.size());
  const auto m = by_key(rows);
  for (const auto& p : grid) CHECK(m.count(p.key) == 1);
  CHECK_FALSE(fs::exists(out + "/running"));

  // The same result as a sweep that was never interrupted.
  TempDir clean;
  sweep_quietly(c, clean.str());
  require_same_results(rows, read_rows(clean.str("rows.csv")));
}

TEST_CASE(
    "a sweep killed after storing its last row: the rerun has nothing to do and clears the marker",
    "[harness]") {
  if (driver().empty()) FAIL("SWEEP_DRIVER is not set (meson test sets it)");
  TempDir dir;
  const std::string config = dir.str("sweep.toml"), out = dir.str("out");
  std::ofstream(config) << small_config("last");
  const SweepConfig c = load_config(config);
  const std::size_t points = make_grid(c).size();
  sweep_killed_after(config, out, points);
  CHECK(read_rows(out + "/rows.csv").size() == points);
  REQUIRE(fs::exists(out + "/running"));  // names the last point, whose row is stored
  const auto summary = sweep_quietly(c, out);
  CHECK(summary.done_before == points);
  CHECK(summary.ran == 0);
  CHECK_FALSE(fs::exists(out + "/running"));
}

TEST_CASE("a point that crashes the process twice is an error; --retry-errors runs it again",
          "[harness]") {
  if (driver().empty()) FAIL("SWEEP_DRIVER is not set (meson test sets it)");
  TempDir dir;
  const std::string config = dir.str("sweep.toml"), out = dir.str("out");
  std::ofstream(config) << small_config("crash");
  const SweepConfig c = load_config(config);
  const auto grid = make_grid(c);
  // The 3rd point crashes with SIGSEGV (under ASan its report ends the process instead)...
  const std::string crash = driver() + " " + config + " " + out + " 2>/dev/null --crash-at ";
  CHECK(run_command(crash + "3") != 0);
  CHECK(read_rows(out + "/rows.csv").size() == 2);
  CHECK(read_file(out + "/running").find("signal SIGSEGV") != std::string::npos);
  CHECK(run_command(crash + "1") != 0);  // ...and again as the first point of the resumed run
  CHECK(read_rows(out + "/rows.csv").size() == 2);

  REQUIRE(run_command(driver() + " " + config + " " + out) == 0);
  auto m = by_key(read_rows(out + "/rows.csv"));
  REQUIRE(m.size() == grid.size());
  const Row& bad = m.at(grid[2].key);
  CHECK(bad[Col::status] == "error");
  CHECK(bad[Col::message].find("killed the process twice") != std::string::npos);
  CHECK(bad[Col::message].find("crashed with SIGSEGV") != std::string::npos);
  CHECK(bad[Col::message].find("--retry-errors") != std::string::npos);
  for (const auto& p : grid)
    if (p.key != grid[2].key) CHECK(m.at(p.key)[Col::status] == "ok");
  CHECK_FALSE(fs::exists(out + "/running"));

  // Resuming with retry_errors measures that point again: the result equals a clean run.
  SweepOptions o;
  o.out_dir = out;
  o.progress = nullptr;
  o.retry_errors = true;
  const SweepSummary s = run_sweep(c, o);
  CHECK(s.retried == 1);
  CHECK(s.ran == 1);
  TempDir clean;
  sweep_quietly(c, clean.str());
  require_same_results(read_rows(out + "/rows.csv"), read_rows(clean.str("rows.csv")));
}

TEST_CASE("a marker left by an outside kill costs the point nothing", "[harness]") {
  TempDir dir;
  const SweepConfig c = parse_config(small_config("outside"), "outside.toml");
  const auto grid = make_grid(c);
  // As if SIGKILLed from outside twice while running the first point (the marker of the
  // second death says it had no fault before): it runs again and is ok.
  std::ofstream(dir.str("running"))
      << "key " << grid.front().key << "\nfaults 0\npid 999999999\noom_kills -1\nstarted_us 0\n";
  sweep_quietly(c, dir.str());
  const auto m = by_key(read_rows(dir.str("rows.csv")));
  CHECK(m.at(grid.front().key)[Col::status] == "ok");
  // One earlier crash recorded plus a crash now: that is twice.
  TempDir twice;
  std::ofstream(twice.str("running"))
      << "key " << grid.front().key << "\nfaults 1\npid 999999999\nsignal SIGBUS\n";
  sweep_quietly(c, twice.str());
  const auto m2 = by_key(read_rows(twice.str("rows.csv")));
  CHECK(m2.at(grid.front().key)[Col::status] == "error");
  CHECK(m2.at(grid.front().key)[Col::message].find("crashed with SIGBUS") != std::string::npos);
}

TEST_CASE("shard 1/2 + shard 2/2 + merge equals an unsharded run", "[harness]") {
  TempDir dir;
  const SweepConfig c = parse_config(small_config("shards"), "shards.toml");
  const auto whole = sweep_quietly(c, dir.str("whole"));
  const auto s1 = sweep_quietly(c, dir.str("s1"), parse_shard("1/2"));
  const auto s2 = sweep_quietly(c, dir.str("s2"), parse_shard("2/2"));
  CHECK(s1.selected + s2.selected == whole.selected);
  CHECK(s1.selected > 0);
  CHECK(s2.selected > 0);
  const auto r1 = read_rows(dir.str("s1/rows.csv"));
  for (const Row& r : r1) CHECK(r[Col::shard] == "1/2");

  // A directory named twice is read once; a copy of a shard gives identical duplicates, which
  // are dropped. The result equals the unsharded run.
  fs::copy(dir.path / "s1", dir.path / "s1copy");
  const auto merged = merge_results(
      dir.str("merged"), {dir.str("s1"), dir.str("s2"), dir.str("s1"), dir.str("s1copy")});
  CHECK(merged.rows == whole.selected);
  CHECK(merged.duplicates == r1.size());
  require_same_results(read_rows(dir.str("merged/rows.csv")), read_rows(dir.str("whole/rows.csv")));
  const auto meta = nlohmann::json::parse(read_file(dir.str("merged/meta.json")));
  CHECK(meta["merged_from"].size() == 3);
  CHECK(meta.contains("git_commit"));

  // A key whose non-timing columns differ between inputs is a conflict, not a silent pick.
  fs::create_directories(dir.str("bad"));
  auto rows = read_rows(dir.str("s2/rows.csv"));
  rows[0][Col::rel_fro] = "0.5";
  std::string text =
      csv_line(std::vector<std::string>(column_names().begin(), column_names().end()));
  for (const Row& r : rows) text += csv_line(r);
  std::ofstream(dir.str("bad/rows.csv")) << text;
  require_error(
      [&] {
        merge_results(dir.str("m2"), {dir.str("s2"), dir.str("bad")});
      },
      {"conflicting rel_fro", rows[0][Col::key]});
  require_error([&] { merge_results(dir.str("m3"), {dir.str("nothing")}); }, {"nothing/rows.csv"});
}

TEST_CASE("npy:<dir> inputs are the user's arrays, with their own shape", "[harness]") {
  TempDir dir;
  const QKV t = make_inputs("gaussian", 1, 2, 40, 8, 5);
  for (const auto& [name, x] : {std::pair{"q", &t.q}, std::pair{"k", &t.k}, std::pair{"v", &t.v}}) {
    const xt::xarray<float> hnd = xt::view(*x, 0);  // [H, N, D]: lifted to [1, H, N, D]
    save_npy(dir.str(std::string(name) + ".npy"), hnd);
  }
  SweepConfig c =
      parse_config(std::string("variants = [\"full\"]\nn = [4096]\ncausal = [\"none\"]\n"
                               "input = [\"npy:") +
                       dir.str() + "\"]\n" + kMeasure,
                   "npy.toml");
  const auto grid = make_grid(c);
  REQUIRE(grid.size() == 1);  // the grid's n does not apply: the files' shape does
  CHECK(grid[0].n == 40);
  CHECK(grid[0].heads == 2);
  CHECK(grid[0].dim == 8);
  sweep_quietly(c, dir.str("out"));
  const auto rows = read_rows(dir.str("out/rows.csv"));
  REQUIRE(rows.size() == 1);
  CHECK(rows[0][Col::status] == "ok");
  CHECK(rows[0][Col::input] == "npy:" + dir.str());
  CHECK(std::stod(rows[0][Col::rel_fro]) < 1e-5);  // full is exact (fp32 vs fp64)

  // Their batch is the files': packed documents on a batch of two are refused up front.
  const QKV two = make_inputs("gaussian", 2, 2, 40, 8, 6);
  fs::create_directory(dir.str("two"));
  for (const auto& [name, x] :
       {std::pair{"q", &two.q}, std::pair{"k", &two.k}, std::pair{"v", &two.v}})
    save_npy(dir.str("two/" + std::string(name) + ".npy"), xt::xarray<float>(*x));
  c.input = {"npy:" + dir.str("two")};
  c.mask = {"none", "documents:count=4"};
  require_error([&] { make_grid(c); }, {"documents:count=4", "batch of one", "has 2"});
  c.mask = {"none"};

  // A missing directory is a config error, found before anything runs.
  c.input = {"npy:" + dir.str("missing")};
  require_error([&] { make_grid(c); }, {"missing/q.npy"});
}

TEST_CASE(
    "trained:DIR inputs are a checkpoint's q, k, v on held-out text, at the lengths it serves",
    "[harness]") {
  // The committed KJV model (benchmarks/checkpoints/kjv): causal, N = 1024, 2 layers, 2 heads
  // of 64.
  const std::string kjv = std::string(ATTNLAB_SOURCE_DIR) + "/benchmarks/checkpoints/kjv";
  const TrainedInput in = parse_trained_input("trained:" + kjv + ",layer=2");
  CHECK(in.dir == kjv);
  CHECK(in.layer == 2);
  CHECK(parse_trained_input("trained:" + kjv).layer == 1);
  CHECK(trained_input_label("trained:" + kjv + ",layer=2") == "kjv, layer 2");
  const TrainedShape shape = trained_shape(in);
  CHECK(shape.max_n == 1024);
  CHECK(shape.heads == 2);
  CHECK(shape.dim == 64);
  CHECK(shape.causal);

  const QKV a = trained_inputs(in, 64, 2, 7), b = trained_inputs(in, 64, 2, 7);
  CHECK(shape_string(a.q) == "[2, 2, 64, 64]");
  CHECK(a.q == b.q);  // a function of (input, n, batch, seed)
  CHECK(a.v == b.v);
  CHECK(a.k != trained_inputs(in, 64, 2, 8).k);
  CHECK(a.q != trained_inputs(parse_trained_input("trained:" + kjv + ",layer=1"), 64, 2, 7).q);
  // Learned structure: the trained layer's causal attention rows are far from uniform. Mean row
  // entropy over rows 32..63 of both heads and items: uniform log(i + 1), mean 3.86 nats; this
  // checkpoint's layer 2 measured 2.26 (2.24-2.27 over seeds 7-9), its initialisation (the same
  // config untrained) 3.78.
  double entropy = 0, count = 0;
  for (std::size_t item = 0; item < 2; ++item)
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 32; i < 64; ++i) {
        std::vector<double> logit(i + 1);
        for (std::size_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::size_t c = 0; c < 64; ++c)
            dot += double(a.q(item, h, i, c)) * a.k(item, h, j, c);
          logit[j] = dot / 8.0;
        }
        const double top = *std::max_element(logit.begin(), logit.end());
        double z = 0, e = 0;
        for (double l : logit) z += std::exp(l - top);
        for (double l : logit) {
          const double p = std::exp(l - top) / z;
          if (p > 0) e -= p * std::log(p);
        }
        entropy += e, ++count;
      }
  CHECK(entropy / count < 3.0);

  // In a sweep: the model's heads and head size, the grid's n up to 1024, causal settings only.
  SweepConfig c = parse_config(std::string(R"(
variants = ["full", "sliding:left=8,right=0", "gla"]
n = [64, 2048]
causal = ["none", "top-left"]
input = ["trained:)") + kjv + R"(,layer=2"]
)" + kMeasure,
                               "trained.toml");
  const auto grid = make_grid(c);
  REQUIRE(grid.size() == 3);
  for (const Point& p : grid) {
    CHECK(p.n == 64);
    CHECK(p.heads == 2);
    CHECK(p.dim == 64);
    CHECK(p.causal == "top-left");
  }
  TempDir dir;
  sweep_quietly(c, dir.str());
  const auto rows = read_rows(dir.str("rows.csv"));
  REQUIRE(rows.size() == 3);
  for (const Row& r : rows) {
    INFO(r[Col::spec] << ": " << r[Col::message]);
    CHECK(r[Col::status] == "ok");
    CHECK(r[Col::heads] == "2");
    if (r[Col::spec] == "full") CHECK(std::stod(r[Col::rel_fro]) < 1e-5);  // exact
    if (r[Col::spec] == "gla") CHECK(r[Col::error_vs] == "own");
  }

  // Bad input names the field and what was expected.
  const std::string ckpt = "trained:" + kjv;
  require_error([] { parse_trained_input("trained:"); }, {"trained:", "dir", "empty"});
  require_error([] { parse_trained_input("trained:,layer=1"); }, {"dir", "empty"});
  require_error([&] { parse_trained_input(ckpt + ",layer=0"); }, {"layer=0", "1 or more"});
  require_error([&] { parse_trained_input(ckpt + ",layer=two"); }, {"layer=two"});
  require_error([&] { parse_trained_input(ckpt + ",depth=1"); }, {"unknown key 'depth'", "layer"});
  require_error([&] { parse_trained_input(ckpt + ",2"); }, {"'2'", "not key=value"});
  require_error([&] { trained_shape(parse_trained_input(ckpt + ",layer=3")); },
                {"layer=3", "2 layers"});
  require_error([&] { trained_shape(parse_trained_input("trained:" + dir.str("nothing"))); },
                {"dir=", "nothing", "state.txt"});
  require_error([&] { trained_inputs(in, 2048, 1, 1); }, {"n=2048", "trained at N = 1024"});
  {  // A Llama-style model rotates q and k inside its blocks: refused, naming the architecture.
    training::TrainConfig llama;
    llama.task = "copy";
    llama.n = 16;
    llama.layers = 1;
    llama.d_model = 16;
    llama.heads = 2;
    llama.ffn = 32;
    llama.arch = models::Arch::llama;
    training::Trainer(llama).save(dir.str("llama"));
    require_error([&] { trained_shape(parse_trained_input("trained:" + dir.str("llama"))); },
                  {"dir=", "--arch llama"});
  }
  c.n = {2048, 4096};
  require_error([&] { make_grid(c); }, {"n:", "N <= 1024", "2048, 4096"});
  c.n = {64};
  c.causal = {"none"};
  require_error([&] { make_grid(c); }, {"causal:", "causal masks only"});
  require_error([] { parse_input_list("--input", "trained:,layer=1"); }, {"--input", "dir"});
  require_error(
      [] {
        parse_config("variants = [\"full\"]\nn = [64]\ninput = [\"trained:x,layer=-1\"]\n",
                     "t.toml");
      },
      {"t.toml:3", "input", "layer=-1"});
}

TEST_CASE("a sweep that fails before its first row removes the folder it created", "[harness]") {
  TempDir dir;
  const SweepConfig c = parse_config(std::string("variants = [\"full\"]\nn = [16, 32]\nheads = 1\n"
                                                 "dim = 8\ninput = [\"gaussian\"]\n") +
                                         kMeasure,
                                     "first.toml");
  SweepOptions o;
  o.out_dir = dir.str("res");
  o.progress = nullptr;
  // What a full disk does while `running` is written for the first point: an Error from there.
  o.on_point = [](const Point&) {
    throw Error("cannot write res/running: No space left on device");
  };
  require_error([&] { run_sweep(c, o); }, {"No space left on device"});
  CHECK(!fs::exists(dir.str("res")));  // no meta.json, no header-only rows.csv
  // After a first row the folder stays: its rows are kept for the resume.
  int points = 0;
  o.on_point = [&](const Point&) {
    if (++points == 2) throw Error("cannot write res/running: No space left on device");
  };
  require_error([&] { run_sweep(c, o); }, {"No space left on device"});
  CHECK(read_rows(dir.str("res/rows.csv")).size() == 1);
}

#if !defined(__SANITIZE_ADDRESS__)  // ASan aborts on an impossible allocation instead of throwing
TEST_CASE("an allocation that fails becomes status oom, and the sweep goes on", "[harness]") {
  TempDir dir;
  SweepConfig c = parse_config(std::string("variants = [\"full\"]\nn = [16, 1099511627776]\n"
                                           "heads = 1\ndim = 8\ninput = [\"gaussian\"]\n") +
                                   kMeasure,
                               "huge.toml");
  c.measure.memory_budget = 1e30;  // let the estimate pass: the allocation itself must fail
  sweep_quietly(c, dir.str());
  const auto rows = read_rows(dir.str("rows.csv"));
  REQUIRE(rows.size() == 2);
  CHECK(rows[0][Col::status] == "ok");
  CHECK(rows[1][Col::status] == "oom");
  CHECK(rows[1][Col::message] == "out of memory: an allocation failed");  // no std:: text
}
#endif

TEST_CASE("attnlab sweep and merge from the command line", "[harness]") {
  const char* cli = std::getenv("ATTNLAB_CLI");
  if (!cli) FAIL("ATTNLAB_CLI is not set (meson test sets it)");
  TempDir dir;
  const std::string flags =
      std::string(cli) +
      " sweep --quiet --variant full --variant 'sliding:left=[2,4]' --n 24,40 "
      "--heads 2 --dim 8 --causal none,top-left --input gaussian:temp=0.5 "
      "--reps 1 --error-rows 16";
  const std::string log = " > " + dir.str("log.txt") + " 2>&1";
  // Flags replace only the axes they name: without --mask the built-in default config's mask
  // axis (none and 16 packed documents) stays, as its seeds and batch do.
  REQUIRE(run_command(flags + " --dry-run" + log) == 0);
  const std::string points = read_file(dir.str("log.txt"));
  CHECK(std::count(points.begin(), points.end(), '\n') == 24);
  CHECK(points.find("mask=documents:count=16") != std::string::npos);
  CHECK(points.find("dtype=float32") != std::string::npos);  // the default: float32 only
  CHECK(points.find("dtype=bf16") == std::string::npos);
  // --dtype replaces the dtype axis: every point in float32 and in bf16.
  REQUIRE(run_command(flags + " --dtype float32,bf16 --dry-run" + log) == 0);
  const std::string both = read_file(dir.str("log.txt"));
  CHECK(std::count(both.begin(), both.end(), '\n') == 48);
  CHECK(both.find("dtype=bf16") != std::string::npos);
  const std::string base = flags + " --mask none";  // 3 specs x 2 N x 2 causal settings
  REQUIRE(run_command(base + " --out " + dir.str("whole") + log) == 0);
  CHECK(read_file(dir.str("log.txt")).find("12 run (12 ok)") != std::string::npos);
  REQUIRE(run_command(base + " --shard 1/2 --out " + dir.str("s1") + log) == 0);
  REQUIRE(run_command(base + " --shard 2/2 --out " + dir.str("s2") + log) == 0);
  REQUIRE(run_command(std::string(cli) + " merge " + dir.str("m") + " " + dir.str("s1") + " " +
                      dir.str("s2") + log) == 0);
  CHECK(read_file(dir.str("log.txt")).find("merge: 12 rows") != std::string::npos);
  require_same_results(read_rows(dir.str("m/rows.csv")), read_rows(dir.str("whole/rows.csv")));

  // Rerun: nothing to do, and it says so. Bad input: one line, exit 2, nothing written.
  REQUIRE(run_command(base + " --out " + dir.str("whole") + log) == 0);
  CHECK(read_file(dir.str("log.txt")).find("0 run") != std::string::npos);
  CHECK(run_command(base + " --causal sideways --out " + dir.str("bad") + log) == 2);
  CHECK(read_file(dir.str("log.txt")).find("attnlab: error: --causal") == 0);
  CHECK_FALSE(fs::exists(dir.str("bad")));
}

// 64 points of exact kernels (deterministic non-timing columns), each a few milliseconds.
std::string kill_config() {
  return std::string(R"(name = "kill"
variants = ["full", "sliding:left=[4,16],right=0", "sliding:left=8,right=8"]
n = [32, 48, 64, 80]
batch = 1
heads = 2
dim = 8
causal = ["none", "top-left"]
input = ["gaussian:temp=0.5", "local:width=4"]
seed = 3
)") + kMeasure;
}

std::size_t complete_rows(const std::string& path) {
  const std::string text = read_file(path);
  const auto lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
  return lines > 0 ? lines - 1 : 0;
}

TEST_CASE("attnlab sweep SIGKILLed at random moments 20 times loses and repeats nothing",
          "[harness]") {
  const char* cli = std::getenv("ATTNLAB_CLI");
  if (!cli) FAIL("ATTNLAB_CLI is not set (meson test sets it)");
  TempDir dir;
  const std::string config = dir.str("kill.toml");
  std::ofstream(config) << kill_config();
  const SweepConfig c = load_config(config);
  REQUIRE(make_grid(c).size() == 64);
  TempDir clean;
  sweep_quietly(c, clean.str());
  const auto clean_rows = read_rows(clean.str("rows.csv"));

  // A folder the kills left behind: one more run completes it, and it holds exactly the rows of
  // an uninterrupted run (no loss, no duplicate, every line complete).
  const auto complete_and_check = [&](const std::string& out) {
    REQUIRE(run_command(std::string(cli) + " sweep --quiet --config " + config + " --out " + out +
                        " > /dev/null") == 0);
    const auto rows = read_rows(out + "/rows.csv");
    for (const Row& r : rows) CHECK(r[Col::status] == "ok");
    CHECK_FALSE(fs::exists(out + "/running"));
    require_same_results(rows, clean_rows);
  };

  // Each round starts `attnlab sweep`, waits until a random number (0 to 2) of new rows is in,
  // then a random 0-10 ms more (during start-up, a point, an append, the marker), and SIGKILLs
  // it. The outcome does not depend on where the kills land, only the coverage does. A fast
  // machine may finish the grid between two kills: that folder is checked and the kills go on
  // in a new one, so every run makes 20 kills whatever the machine's speed.
  std::mt19937 rng(12);
  int kills = 0, folders = 0;
  std::string out = dir.str("out0");
  while (kills < 20) {
    const std::size_t target = complete_rows(out + "/rows.csv") + rng() % 3;
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      const int null = ::open("/dev/null", O_WRONLY);  // dup2: nothing of ours is flushed there
      ::dup2(null, 1);
      ::dup2(null, 2);
      execl(cli, cli, "sweep", "--config", config.c_str(), "--out", out.c_str(), "--quiet",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    bool exited = false;
    while (!exited && complete_rows(out + "/rows.csv") < target) {
      exited = waitpid(child, &status, WNOHANG) == child;
      ::usleep(500);
    }
    if (!exited) {
      ::usleep(rng() % 10000);
      ::kill(child, SIGKILL);
      REQUIRE(waitpid(child, &status, 0) == child);
    }
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      ++kills;
      continue;
    }
    INFO("exit status " << status);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    INFO("folder " << out << " finished after " << kills << " kills in all");
    complete_and_check(out);
    out = dir.str("out" + std::to_string(++folders));
  }
  INFO(complete_rows(out + "/rows.csv")
       << " of 64 rows in the last folder after " << kills << " kills");
  complete_and_check(out);
}

TEST_CASE("a full disk and a read-only results folder are one clear line; rows stay intact",
          "[harness]") {
  const char* cli = std::getenv("ATTNLAB_CLI");
  if (!cli) FAIL("ATTNLAB_CLI is not set (meson test sets it)");
  TempDir dir;
  const std::string config = dir.str("disk.toml"), out = dir.str("out");
  std::ofstream(config) << kill_config();
  const SweepConfig c = load_config(config);
  const std::string sweep = std::string(cli) + " sweep --quiet --config " + config + " --out ";

  // ulimit -f 16 in /bin/sh (dash counts 512-byte blocks): files of at most 8 KiB, as on a nearly
  // full disk: room for meta.json (~6.2 KiB), not for rows.csv (~12 KiB for the 64 points).
  CHECK(run_command("ulimit -f 16; " + sweep + out + " > /dev/null 2> " + dir.str("err.txt")) == 2);
  const std::string err = read_file(dir.str("err.txt"));
  CHECK(err.find("attnlab: error: cannot append to " + out + "/rows.csv: File too large") == 0);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  const std::string text = read_file(out + "/rows.csv");
  CHECK(text.back() == '\n');  // no torn row
  const std::size_t kept = read_rows(out + "/rows.csv").size();
  CHECK(kept > 10);
  CHECK(kept < 64);
  REQUIRE(run_command(sweep + out + " > /dev/null") == 0);  // room again: it resumes
  TempDir clean;
  sweep_quietly(c, clean.str());
  require_same_results(read_rows(out + "/rows.csv"), read_rows(clean.str("rows.csv")));

  // A results folder the user may not write to (root may write anywhere: run as nobody then).
  const std::string ro = dir.str("ro");
  fs::create_directories(ro);
  fs::permissions(dir.path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                          fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  const std::string as_user =
      ::geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "";
  // nobody must be able to run the binary: a build under a private folder (mktemp -d) is not.
  if (run_command(as_user + "'" + cli + "' --version >/dev/null 2>&1") != 0) {
    WARN("skipped the read-only folder check: " << cli << " cannot be run as uid 65534");
    return;
  }
  CHECK(run_command(as_user + sweep + ro + " > /dev/null 2> " + dir.str("err2.txt")) == 2);
  const std::string err2 = read_file(dir.str("err2.txt"));
  CHECK(err2.find("attnlab: error: cannot open " + ro + "/rows.csv: Permission denied") == 0);
  CHECK(std::count(err2.begin(), err2.end(), '\n') == 1);
  CHECK(fs::is_empty(ro));
  fs::permissions(ro, fs::perms::owner_all);
}

// The memory cgroup (v1) this process is in, when this process may create a child of it.
std::string writable_memory_cgroup() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const auto c2 = line.find(":memory:");
    if (c2 == std::string::npos) continue;
    const std::string dir = "/sys/fs/cgroup/memory" + line.substr(c2 + 8);
    if (::access((dir + "/cgroup.procs").c_str(), W_OK) == 0) return dir;
  }
  return "";
}

TEST_CASE("a point the kernel's OOM killer ends twice is an error, the rest runs", "[harness]") {
  const char* cli = std::getenv("ATTNLAB_CLI");
  if (!cli) FAIL("ATTNLAB_CLI is not set (meson test sets it)");
  const std::string parent = writable_memory_cgroup();
  if (parent.empty()) {
    WARN("skipped: no writable cgroup v1 memory controller here (needs root)");
    return;
  }
  // A child cgroup of 400 MiB; the second point's inputs alone need 768 MiB, past the memory
  // budget's estimate, which is switched off so that the kernel has to stop it.
  const std::string cg = parent + "/attnlab-oom-" + std::to_string(::getpid());
  REQUIRE(::mkdir(cg.c_str(), 0755) == 0);
  std::ofstream(cg + "/memory.limit_in_bytes") << (400 << 20) << std::flush;
  TempDir dir;
  const std::string out = dir.str("out");
  const std::string sweep =
      "sh -c 'echo $$ > " + cg + "/cgroup.procs && exec " + cli +
      " sweep --quiet --variant full --n 64,131072 --heads 8 --dim 64 --causal none "
      "--mask none --input gaussian --reps 1 --memory-budget 1e15 --out " +
      out + "' > /dev/null 2>&1";
  CHECK(run_command(sweep) != 0);  // killed by the OOM killer on the second point
  CHECK(read_rows(out + "/rows.csv").size() == 1);
  CHECK(run_command(sweep) != 0);  // and again
  CHECK(run_command(sweep) == 0);  // the third run records it and finishes
  ::rmdir(cg.c_str());
  const auto rows = read_rows(out + "/rows.csv");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0][Col::status] == "ok");
  CHECK(rows[1][Col::status] == "error");
  CHECK(rows[1][Col::message].find("killed the process twice (last: killed by the kernel's OOM "
                                   "killer)") != std::string::npos);
}

TEST_CASE("mpirun -n 2 sweep --mpi equals an unsharded run", "[.][mpi]") {
  const char* mpirun = std::getenv("MPIRUN");
  if (driver().empty() || !mpirun)
    FAIL("SWEEP_DRIVER and MPIRUN must be set (meson test sets them)");
  TempDir dir;
  const std::string config = dir.str("sweep.toml");
  std::ofstream(config) << small_config("mpi");
  // One thread per rank: two ranks share this machine. Root is allowed (CI runs as root).
  // Under ASan, Open MPI's dlopen'ed components leak by design at exit and their frames cannot be
  // symbolised (so .ci/lsan.supp cannot name them): leak checking is off in the two MPI ranks
  // only. The same harness code is leak-checked in every other test case of this file.
  const std::string cmd =
      "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 "
      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
      "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" " +
      std::string(mpirun) + " -n 2 --oversubscribe " + driver() + " " + config + " " +
      dir.str("mpi") + " --mpi";
  REQUIRE(run_command(cmd) == 0);
  const auto rows = read_rows(dir.str("mpi/rows.csv"));
  std::set<std::string> ranks;
  for (const Row& r : rows) ranks.insert(r[Col::shard]);
  CHECK(ranks == std::set<std::string>{"1/2", "2/2"});  // both ranks did work

  const SweepConfig c = load_config(config);
  sweep_quietly(c, dir.str("whole"));
  require_same_results(rows, read_rows(dir.str("whole/rows.csv")));
}
