// The catalogue of bad input: one row per case, across the C++ API, spec strings, TOML configs,
// .npy files (data and masks), rows.csv and every attnlab subcommand. Each row asserts that the
// message names the problem (every listed fragment appears); a CLI row also asserts exit status
// 2, exactly one line "attnlab: error: ..." on stderr, and that the scratch directory is exactly
// as before (no output file, no partial or temporary file, no input touched). The sanitizer
// build of CI runs the same table, so a row that crashes fails there. A new public entry point or
// file format adds its rows here.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <vector>

#include "attnlab/npy.hpp"
#include "cli_helpers.hpp"
#include "harness/config.hpp"
#include "harness/rows.hpp"
#include "helpers.hpp"
#include "models/transformer.hpp"
#include "training/trainer.hpp"
#include "variants/linear.hpp"

using namespace attnlab;
using attnlab::test::attnlab_cli;
using attnlab::test::CliResult;
using attnlab::test::random_tensor;
using attnlab::test::raw_bytes;
using attnlab::test::read_text;
using attnlab::test::TempDir;
using attnlab::test::write_npy_raw;
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------------
// C++ API rows: the call must throw attnlab::Error (Unsupported is one) naming the problem.

struct ApiCase {
  const char* what;
  std::function<void()> call;
  std::vector<std::string> fragments;
};

Tensor t(std::size_t b, std::size_t h, std::size_t n, std::size_t d) {
  return random_tensor(b, h, n, d, 1 + b + 10 * h + 100 * n + 1000 * d);
}

void forward(const std::string& spec, const Tensor& q, const Tensor& k, const Tensor& v,
             const Mask& mask = {}) {
  make_attention(spec)->forward(q, k, v, mask);
}

Tensor with(Tensor x, std::size_t flat, float value) {
  x.data()[flat] = value;
  return x;
}

Mask scaled(double s) {
  Mask m;
  m.scale = s;
  return m;
}

void spec(const std::string& s) {
  make_attention(s);
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

std::vector<ApiCase> api_cases() {
  const Tensor q = t(2, 2, 8, 4), k = t(2, 2, 8, 4), v = t(2, 2, 8, 4);
  return {
      // shapes (the rank is fixed by the type: [B,H,N,D]; files of another rank are below)
      {"batch mismatch",
       [=] { forward("full", q, t(1, 2, 8, 4), v); },
       {"batch sizes differ", "[1, 2, 8, 4]"}},
      {"head mismatch", [=] { forward("full", q, k, t(2, 3, 8, 4)); }, {"head counts differ"}},
      {"Nk mismatch",
       [=] { forward("full", q, k, t(2, 2, 9, 4)); },
       {"k and v have different sequence lengths"}},
      {"Dk mismatch",
       [=] { forward("full", q, t(2, 2, 8, 5), v); },
       {"q and k have different head dims"}},
      {"Nq = 0",
       [=] { forward("full", t(2, 2, 0, 4), k, v); },
       {"every dimension must be at least 1"}},
      {"Nk = 0", [=] { forward("full", q, t(2, 2, 0, 4), t(2, 2, 0, 4)); }, {"at least 1"}},
      {"D = 0", [=] { forward("full", t(2, 2, 8, 0), t(2, 2, 8, 0), v); }, {"at least 1"}},
      {"B = 0",
       [=] { forward("full", t(0, 2, 8, 4), t(0, 2, 8, 4), t(0, 2, 8, 4)); },
       {"at least 1"}},
      {"output aliases q",
       [=] {
         Tensor x = q;
         make_attention("full")->forward(x, k, v, {}, {}, x);
       },
       {"must not share storage with q, k"}},
      // values
      {"NaN in q",
       [=] { forward("full", with(q, 5, NAN), k, v); },
       {"q has NaN at [0, 0, 1, 1]", "finite"}},
      {"NaN in k",
       [=] { forward("sliding:left=2,right=2", q, with(k, 0, NAN), v); },
       {"k has NaN at [0, 0, 0, 0]"}},
      {"-Inf in v",
       [=] { forward("linear", q, k, with(v, 70, -INFINITY)); },
       {"v has Inf at [1, 0, 1, 2]"}},
      {"NaN in v, bigbird",
       [=] { forward("bigbird:block=2", q, k, with(v, 3, NAN)); },
       {"v has NaN"}},
      // the mask
      {"scale 0", [=] { forward("full", q, k, v, scaled(0)); }, {"scale = 0", "finite number > 0"}},
      {"scale < 0", [=] { forward("full", q, k, v, scaled(-1)); }, {"scale = -1", "> 0"}},
      {"scale NaN", [=] { forward("full", q, k, v, scaled(kNaN)); }, {"scale = nan"}},
      {"scale Inf", [=] { forward("full", q, k, v, scaled(kInf)); }, {"scale = inf"}},
      {"key_lengths count",
       [=] {
         Mask m;
         m.key_lengths = {3};
         forward("full", q, k, v, m);
       },
       {"key_lengths has 1 entries", "one per batch item (2)"}},
      {"key_lengths < 0",
       [=] {
         Mask m;
         m.key_lengths = {3, -1};
         forward("full", q, k, v, m);
       },
       {"key_lengths[1] = -1"}},
      {"key_lengths > Nk",
       [=] {
         Mask m;
         m.key_lengths = {9, 1};
         forward("full", q, k, v, m);
       },
       {"key_lengths[0] = 9", "Nk = 8"}},
      {"boolean mask shape",
       [=] {
         Mask m;
         m.allow(xt::xtensor<bool, 2>::from_shape({8, 7}));
         forward("full", q, k, v, m);
       },
       {"boolean mask has shape [1, 1, 8, 7]"}},
      {"boolean mask batch",
       [=] {
         Mask m;
         m.allowed = xt::xtensor<bool, 4>::from_shape({3, 2, 8, 8});
         forward("full", q, k, v, m);
       },
       {"[3, 2, 8, 8]", "[B, H, Nq, Nk]"}},
      {"causal text", [] { parse_causal("sideways"); }, {"causal mode 'sideways'", "top-left"}},
      // what a backend cannot honour
      {"linformer causal",
       [=] {
         Mask m;
         m.causal = Causal::top_left;
         forward("linformer:k=4", q, k, v, m);
       },
       {"linformer does not support causal masks"}},
      {"linear boolean mask",
       [=] {
         Mask m;
         m.allow(xt::ones<bool>({8, 8}));
         forward("linear", q, k, v, m);
       },
       {"linear does not support boolean masks"}},
      {"linear causal cross",
       [=] {
         Mask m;
         m.causal = Causal::top_left;
         forward("linear", t(2, 2, 4, 4), k, v, m);
       },
       {"linear does not support causal masks with Nq != Nk"}},
      {"linear dpfp nu too big",
       [=] { forward("linear:feature=dpfp,nu=8", q, k, v); },
       {"nu=8", "2·Dk = 8"}},
      {"linformer N > max_len", [=] { forward("linformer:k=4,max_len=6", q, k, v); }, {"max_len"}},
      {"recurrent step shape",
       [] {
         const auto decoder = make_attention("linear")->start_decoding({1, 2, 4, 4});
         decoder->step(t(1, 2, 1, 4), t(1, 2, 1, 5), t(1, 2, 1, 4));
       },
       {"[1, 2, 1, 5]"}},
      // spec strings: syntax
      {"spec empty", [] { spec(""); }, {"missing variant name"}},
      {"spec no name", [] { spec(":left=4"); }, {"':left=4'", "missing variant name"}},
      {"spec unknown variant", [] { spec("fulll"); }, {"unknown variant 'fulll'", "known: full"}},
      {"spec unknown key",
       [] { spec("full:window=3"); },
       {"'full:window=3'", "unknown key 'window'", "full takes no keys"}},
      {"spec duplicate key", [] { spec("sliding:left=4,left=8"); }, {"key 'left' given twice"}},
      {"spec empty key", [] { spec("sliding:=4"); }, {"token '=4' is not key=value"}},
      {"spec empty value", [] { spec("sliding:left="); }, {"left=", "expected an integer"}},
      {"spec bare token", [] { spec("sliding:left"); }, {"token 'left' is not key=value"}},
      {"spec trailing comma", [] { spec("sliding:left=4,"); }, {"token '' is not key=value"}},
      {"spec unknown key, known keys",
       [] { spec("sliding:lft=4"); },
       {"unknown key 'lft' (known: left, right"}},
      {"spec not an integer",
       [] { spec("bigbird:block=abc"); },
       {"block=abc", "expected an integer"}},
      {"spec integer overflow",
       [] { spec("sliding:left=99999999999999999999"); },
       {"left=99999999999999999999", "expected an integer"}},
      {"spec not a number", [] { spec("linear:eps=tiny"); }, {"eps=tiny", "expected a number"}},
      // spec strings: every out-of-range parameter of every variant
      {"bigbird block 0", [] { spec("bigbird:block=0"); }, {"block=0", ">= 1"}},
      {"bigbird window even", [] { spec("bigbird:window=2"); }, {"window=2", "odd integer"}},
      {"bigbird window 0", [] { spec("bigbird:window=0"); }, {"window=0", "odd integer >= 1"}},
      {"bigbird global < 0", [] { spec("bigbird:global=-1"); }, {"global=-1", ">= 0"}},
      {"bigbird random < 0", [] { spec("bigbird:random=-1"); }, {"random=-1", ">= 0"}},
      {"bigbird seed < 0", [] { spec("bigbird:seed=-1"); }, {"seed=-1", ">= 0"}},
      {"sliding left < 0", [] { spec("sliding:left=-1"); }, {"left=-1", ">= 0"}},
      {"sliding right < 0", [] { spec("sliding:right=-3"); }, {"right=-3", ">= 0"}},
      {"moba block 0", [] { spec("moba:block=0"); }, {"block=0", ">= 1"}},
      {"moba topk 0", [] { spec("moba:topk=0"); }, {"topk=0", ">= 1"}},
      {"delta-product steps 0", [] { spec("delta-product:steps=0"); }, {"steps=0", ">= 1"}},
      {"linear taylor_dim < 0",
       [] { spec("linear:feature=taylor,taylor_dim=-2"); },
       {"taylor_dim=-2", ">= 0"}},
      {"linear taylor_dim without taylor",
       [] { spec("linear:taylor_dim=4"); },
       {"taylor_dim=4", "only feature=taylor"}},
      {"sliding dilation 0", [] { spec("sliding:dilation=0"); }, {"dilation=0", ">= 1"}},
      {"sliding global < 0", [] { spec("sliding:global=-2"); }, {"global=-2", ">= 0"}},
      {"linformer k 0", [] { spec("linformer:k=0"); }, {"k=0", "at least 1"}},
      {"linformer max_len 0", [] { spec("linformer:max_len=0"); }, {"max_len=0", "at least 1"}},
      {"linformer k > max_len",
       [] { spec("linformer:k=64,max_len=32"); },
       {"k=64", "max_len = 32"}},
      {"linformer seed < 0", [] { spec("linformer:seed=-1"); }, {"seed=-1", ">= 0"}},
      {"linformer share", [] { spec("linformer:share=heads"); }, {"share=heads", "none|kv|layer"}},
      {"linformer init", [] { spec("linformer:init=zeros"); }, {"init=zeros", "gaussian|xavier"}},
      {"linformer init supplied",
       [] { spec("linformer:init=supplied"); },
       {"init=supplied", "set_projections"}},
      {"linear feature",
       [] { spec("linear:feature=softmax"); },
       {"feature=softmax", "elu1|relu|favor|dpfp"}},
      {"linear rule", [] { spec("linear:rule=hebb"); }, {"rule=hebb", "sum|delta"}},
      {"linear m 0", [] { spec("linear:feature=favor,m=0"); }, {"m=0", "at least 1"}},
      {"linear m < 0 said once", [] { spec("linear:m=-1"); }, {"'linear:m=-1': m=-1: favor needs"}},
      {"linear m < 0, constructor",
       [] {
         LinearConfig c;
         c.m = -1;
         LinearAttention a(c);
       },
       {"linear: m=-1: favor needs"}},
      {"linear nu 0", [] { spec("linear:feature=dpfp,nu=0"); }, {"nu=0", "nu >= 1"}},
      {"linear beta 0", [] { spec("linear:rule=delta,beta=0"); }, {"beta=0", "0 < beta <= 1"}},
      {"linear beta > 1", [] { spec("linear:beta=1.5"); }, {"beta=1.5", "0 < beta <= 1"}},
      {"linear beta NaN", [] { spec("linear:beta=nan"); }, {"beta=nan", "0 < beta <= 1"}},
      {"linear eps < 0", [] { spec("linear:eps=-1e-6"); }, {"eps=-1e-6", "finite and >= 0"}},
      {"linear eps Inf", [] { spec("linear:eps=inf"); }, {"eps=inf", "finite"}},
      {"linear seed < 0", [] { spec("linear:seed=-5"); }, {"seed=-5", ">= 0"}},
      // TOML configs (parse_config; the CLI rows below read files)
      {"config syntax", [] { harness::parse_config("n = [64\n", "x.toml"); }, {"x.toml:"}},
      {"config wrong type",
       [] { harness::parse_config("variants = [\"full\"]\nn = \"abc\"\n", "x.toml"); },
       {"x.toml:2", "n", "'abc' is not a positive integer"}},
      {"config wrong element type",
       [] { harness::parse_config("variants = [\"full\"]\nn = [64, 1.5]\n", "x.toml"); },
       {"x.toml:2", "n", "expected an integer"}},
      {"config heads float",
       [] { harness::parse_config("variants = [\"full\"]\nn = 64\nheads = 1.5\n", "x.toml"); },
       {"x.toml:3", "heads"}},
      {"config unknown key",
       [] { harness::parse_config("variants = [\"full\"]\nn = 64\nrepeats = 3\n", "x.toml"); },
       {"x.toml:3", "repeats", "unknown key"}},
      {"config unknown measure key",
       [] {
         harness::parse_config("variants = [\"full\"]\nn = 64\n[measure]\nreps = 3\n", "x.toml");
       },
       {"x.toml:4", "measure.reps", "unknown key"}},
      {"config empty n",
       [] { harness::parse_config("variants = [\"full\"]\nn = []\n", "x.toml"); },
       {"x.toml:2", "n", "the list is empty"}},
      {"config empty variants",
       [] { harness::parse_config("variants = []\nn = [64]\n", "x.toml"); },
       {"x.toml:1", "variants", "empty"}},
      {"config no variants",
       [] { harness::parse_config("n = [64]\n", "x.toml"); },
       {"x.toml", "variants", "no values"}},
      {"config n = 0",
       [] { harness::parse_config("variants = [\"full\"]\nn = [64, 0]\n", "x.toml"); },
       {"x.toml:2", "n", "0", "positive"}},
      {"config n < 0",
       [] { harness::parse_config("variants = [\"full\"]\nn = -4\n", "x.toml"); },
       {"x.toml:2", "n", "-4", "positive"}},
      {"config dim 0",
       [] { harness::parse_config("variants = [\"full\"]\nn = 64\ndim = [0]\n", "x.toml"); },
       {"x.toml:3", "dim", "positive"}},
      {"config empty range",
       [] { harness::parse_config("variants = [\"full\"]\nn = \"512..64\"\n", "x.toml"); },
       {"x.toml:2", "range '512..64' is empty"}},
      {"config range ends not powers of two",
       [] { harness::parse_config("variants = [\"full\"]\nn = \"100..400\"\n", "x.toml"); },
       {"x.toml:2", "range '100..400'", "powers of two", "100 is not one"}},
      {"config range end not a power of two",
       [] { harness::parse_config("variants = [\"full\"]\nn = \"64..100\"\n", "x.toml"); },
       {"x.toml:2", "100 is not one"}},
      {"config bad variant",
       [] { harness::parse_config("variants = [\"bigbird:block=0\"]\nn = 64\n", "x.toml"); },
       {"x.toml:1", "block=0"}},
      {"config bad input",
       [] {
         harness::parse_config("variants = [\"full\"]\nn = 64\ninput = \"uniform\"\n", "x.toml");
       },
       {"x.toml:3", "uniform", "unknown distribution"}},
      {"config bad trained input",
       [] {
         harness::parse_config("variants = [\"full\"]\nn = 64\ninput = \"trained:x,layer=y\"\n",
                               "x.toml");
       },
       {"x.toml:3", "input", "layer=y"}},
      {"config bad causal",
       [] {
         harness::parse_config("variants = [\"full\"]\nn = 64\ncausal = [\"none\", 3]\n", "x.toml");
       },
       {"x.toml:3", "causal", "string"}},
      {"config measure min_reps",
       [] {
         harness::parse_config("variants = [\"full\"]\nn = 64\n[measure]\nmin_reps = 0\n",
                               "x.toml");
       },
       {"measure.min_reps", ">= 1"}},
      {"config measure type",
       [] {
         harness::parse_config("variants = [\"full\"]\nn = 64\n[measure]\nwarmup = \"x\"\n",
                               "x.toml");
       },
       {"x.toml:4", "measure.warmup", "integer"}},
      {"config name with /",
       [] {
         harness::parse_config(
             "name = \"a/b\"\nvariants = [\"full\"]\nn = 64\ninput = \"gaussian\"\n", "x.toml");
       },
       {"name", "'a/b'", "plain directory name"}},
      {"config variant table without spec",
       [] { harness::parse_config("n = 64\n[[variant]]\nk = [1, 2]\n", "x.toml"); },
       {"x.toml:2", "variant.spec", "missing"}},
      {"config max_n unknown",
       [] {
         harness::parse_config("variants = [\"full\"]\nn = 64\n[max_n]\nlinear = 4\n", "x.toml");
       },
       {"x.toml:4", "max_n.linear", "no variant"}},
      {"config list explosion",
       [] {
         harness::expand_spec(
             "linear:m=[1,2,3,4,5,6,7,8,9,10],nu=[1,2,3,4,5,6,7,8,9,10],seed=[1,2,3,4,5,6,7,8,9,10]"
             ",eps=[0,1,2,3,4,5,6,7,8,9],rule=[sum,delta]");
       },
       {"expand to more than 10000 specs"}},
      // rows.csv (read by resume, report and merge)
      {"rows foreign header",
       [] {
         TempDir d("rows");
         std::ofstream(d.file("rows.csv")) << "id,value\n1,2\n";
         harness::RowsFile f(d.file("rows.csv"));
       },
       {"rows.csv:1", "not the rows.csv schema"}},
      {"rows short record",
       [] {
         TempDir d("rows");
         const auto& names = harness::column_names();
         std::ofstream(d.file("rows.csv"))
             << harness::csv_line(std::vector<std::string>(names.begin(), names.end())) << "x,y\n";
         harness::read_rows(d.file("rows.csv"));
       },
       {"rows.csv: record", "fields, expected " + std::to_string(harness::kColumnCount)}},
      // .npy files through the library (the CLI rows below go through the same reader)
      {"npy missing",
       [] { load_npy_float("/nonexistent/q.npy"); },
       {"/nonexistent/q.npy: no such file"}},
      {"npy rank 1 via to_bhnd",
       [] { to_bhnd(xt::xarray<float>::from_shape({4}), "q.npy"); },
       {"q.npy: rank 1"}},
      {"from_bhnd drops a big axis", [] { from_bhnd(t(2, 1, 4, 4), 2); }, {"axis 0 is not 1"}},
      // models and training: sizes that cannot fit are refused before anything is allocated
      {"model layers 2^64-1",
       [] {
         models::ModelConfig c;
         c.layers = std::size_t(-1);
         models::EncoderModel m(c);
       },
       {"layers=18446744073709551615", "need at least", "this process may use"}},
      {"model d_model huge",
       [] {
         models::ModelConfig c;
         c.layer.d_model = c.layer.heads = 1000000000;
         c.validate();
       },
       {"d_model=1000000000", "need at least"}},
      {"train n huge",
       [] {
         training::TrainConfig c;
         c.task = "copy";
         c.n = 100000000;
         training::Trainer t(c);
       },
       {"n=100000000", "need at least", "TiB"}},
      {"train batch huge",
       [] {
         training::TrainConfig c;
         c.batch = std::size_t(1) << 40;
         c.validate();
       },
       {"batch=1099511627776", "need at least"}},
      // what a user is told about an exception that is not ours: no std:: text
      {"user_message bad_alloc",
       [] { throw Error(user_message(std::bad_alloc())); },
       {"out of memory"}},
      {"user_message length_error",
       [] {
         throw Error(
             user_message(std::length_error("cannot create std::vector larger than max_size()")));
       },
       {"out of memory"}},
      {"user_message filesystem",
       [] {
         throw Error(user_message(
             fs::filesystem_error("x", "a/b", std::make_error_code(std::errc::permission_denied))));
       },
       {"a/b: Permission denied"}},
      {"user_message other",
       [] { throw Error(user_message(std::runtime_error("std::foo failed"))); },
       {"unexpected error", "foo failed"}},
  };
}

TEST_CASE("every bad C++ call, spec string and config throws an Error naming the problem",
          "[cli]") {
  const auto cases = api_cases();
  CHECK(cases.size() >= 60);
  for (const ApiCase& c : cases) {
    INFO("case: " << c.what);
    try {
      c.call();
      FAIL_CHECK("no exception");
    } catch (const Error& e) {
      const std::string what = e.what();
      INFO("message: " << what);
      for (const auto& part : c.fragments) CHECK(what.find(part) != std::string::npos);
    } catch (const std::exception& e) {
      FAIL_CHECK("not an attnlab::Error: " << e.what());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// CLI rows: run in a scratch directory holding good q/k/v.npy ([H=2, N=16, D=8]) and whatever the
// row's setup adds; exit 2, one line, the directory unchanged.

struct CliCase {
  const char* what;
  std::function<void(const TempDir&)> setup;  // may be empty
  std::string args;
  std::vector<std::string> fragments;
  std::string prefix = "";  // before the executable: "ulimit -f 1;", a user switch
};

// Every file under dir with its contents, but the captured stdout.txt and stderr.txt.
std::map<std::string, std::string> snapshot(const TempDir& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
    const std::string rel = fs::relative(e.path(), dir.path()).string();
    if (rel == "stdout.txt" || rel == "stderr.txt") continue;
    files[rel] = e.is_regular_file() ? read_text(e.path().string()) : "<dir>";
  }
  return files;
}

void save3(const TempDir& d, const std::string& name, const Tensor& x) {
  save_npy(d.file(name), from_bhnd(x, 3));
}

// Writes name.npy with a header dict and data as given (numpy's padding).
auto npy(const std::string& name, const std::string& descr, const std::string& shape,
         const std::string& data, bool fortran = false, int major = 1) {
  return [=](const TempDir& d) { write_npy_raw(d.file(name), descr, shape, data, fortran, major); };
}
// Writes name.npy, an int64 vector (offsets, lengths).
auto ints(const std::string& name, std::vector<std::int64_t> values) {
  return [=](const TempDir& d) {
    write_npy_raw(d.file(name), "<i8", std::to_string(values.size()) + ",", raw_bytes(values));
  };
}
auto bytes_file(const std::string& name, const std::string& bytes) {
  return [=](const TempDir& d) { std::ofstream(d.file(name), std::ios::binary) << bytes; };
}
auto text_file(const std::string& name, const std::string& text) {
  return bytes_file(name, text);
}

std::string floats(std::size_t n, float value = 0.5f) {
  return raw_bytes(std::vector<float>(n, value));
}

// A v1 .npy whose header says it is `len` bytes long (the file has far fewer).
std::string header_claiming(std::size_t len, int major) {
  std::string b = "\x93NUMPY";
  b += static_cast<char>(major);
  b += '\0';
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) b += static_cast<char>((len >> (8 * i)) & 0xff);
  return b + "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 16, 8), }\n";
}

const std::string kRun = "run --spec full --q q.npy --k k.npy --v v.npy --out o.npy";
const std::string kSweepBase =
    "sweep --quiet --variant full --heads 1 --reps 1 --causal none --mask none --input gaussian "
    "--out res";
const std::string kSweep = kSweepBase + " --n 16 --dim 4";
// A row of the schema (every column) with key k1.
std::string rows_csv(const std::string& extra = "") {
  const auto& n = harness::column_names();
  std::string text = harness::csv_line(std::vector<std::string>(n.begin(), n.end()));
  std::vector<std::string> row(harness::kColumnCount, "");
  row[0] = "k1", row[1] = "full", row[2] = "full", row[3] = "16";
  return text + harness::csv_line(row) + extra;
}
const std::string kNobody =
    ::geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups" : "";

// res/decode.csv in a schema older than the decode sweep's.
void older_decode_csv(const TempDir& d) {
  fs::create_directory(d.file("res"));
  std::ofstream(d.file("res/decode.csv")) << "key,kind\n";
}

std::vector<CliCase> cli_cases() {
  const std::size_t n3 = 2 * 16 * 8;
  return {
      // the command line itself
      {"no command", {}, "", {"A subcommand is required"}},
      {"unknown command", {}, "frobnicate", {"unknown command 'frobnicate'", "run"}},
      {"unknown option", {}, kRun + " --bogus 1", {"--bogus"}},
      {"missing --out", {}, "run --spec full --q q.npy --k k.npy --v v.npy", {"--out is required"}},
      // attnlab decode
      {"decode: kv heads",
       {},
       "decode --out res --heads 8 --kv-heads 3",
       {"--kv-heads 3", "divisor"}},
      {"decode: spec", {}, "decode --out res --variant nosuch", {"nosuch"}},
      {"decode: context",
       {},
       "decode --out res --contexts 0",
       {"--contexts", "not a positive integer"}},
      {"decode: shard out of range", {}, "decode --out res --shard 3/2", {"--shard", "3/2"}},
      {"decode: shard syntax", {}, "decode --out res --shard 1of2", {"--shard", "1of2"}},
      {"decode: an older decode.csv",
       older_decode_csv,
       "decode --out res --contexts 8 --dims 4 --prefill none --bandwidth-mib 1",
       {"res/decode.csv:1", "decode.csv schema"}},
      {"merge: a foreign decode.csv",
       older_decode_csv,
       "merge out res",
       {"res/decode.csv:1", "decode.csv schema"}},
      // .npy inputs: the file
      {"missing file",
       {},
       "run --spec full --q q.npy --k k.npy --v nope.npy --out o.npy",
       {"nope.npy: no such file"}},
      {"directory as file",
       [](const TempDir& d) { fs::create_directory(d.file("dir.npy")); },
       "run --spec full --q dir.npy --k k.npy --v v.npy --out o.npy",
       {"dir.npy: is a directory"}},
      {"empty file",
       bytes_file("e.npy", ""),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: not a .npy file", "bad magic"}},
      {"text file",
       text_file("e.npy", "1,2,3\n4,5,6\n"),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: not a .npy file"}},
      {"truncated header",
       bytes_file("e.npy", header_claiming(300, 1)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: truncated .npy header"}},
      {"over-long header",
       bytes_file("e.npy", header_claiming(100000000, 2)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: bad .npy header: 100000000 bytes long", "65536"}},
      {"header cut in the magic",
       bytes_file("e.npy", "\x93NUMPY\x01"),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: not a .npy file"}},
      {"header not a dict",
       bytes_file("e.npy", std::string("\x93NUMPY\x01\x00\x08\x00garbage\n", 18)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: bad .npy header: expected a dict"}},
      {"header without descr",
       bytes_file(
           "e.npy",
           std::string("\x93NUMPY\x01\x00\x2c\x00{'fortran_order': False, 'shape': (2, 8), }\n",
                       54)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: bad .npy header: no 'descr'"}},
      {"format version 4",
       npy("e.npy", "<f4", "2, 16, 8", floats(n3), false, 4),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"unsupported .npy format version 4"}},
      {"big-endian",
       npy("e.npy", ">f4", "2, 16, 8", floats(n3)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: dtype '>f4' is not accepted", "'<f4'"}},
      {"Fortran order",
       npy("e.npy", "<f4", "2, 16, 8", floats(n3), true),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: array is in Fortran order"}},
      {"object array",
       npy("e.npy", "|O", "2, 16, 8", std::string(8 * n3, '\0')),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"dtype '|O' is not accepted"}},
      {"int32 array",
       npy("e.npy", "<i4", "2, 16, 8", floats(n3)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"dtype '<i4' is not accepted"}},
      {"bool array as data",
       npy("e.npy", "|b1", "2, 16, 8", std::string(n3, '\1')),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"dtype '|b1' is not accepted", "float32"}},
      {"element count overflows",
       npy("e.npy", "<f4", "4611686018427387904, 8", floats(4)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"(4611686018427387904, 8) has more elements than fit in 64 bits"}},
      {"byte count overflows",
       npy("e.npy", "<f8", "4611686018427387904, 1", floats(4)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"needs more bytes than fit in 64 bits"}},
      {"zero dimension beside overflowing ones",
       npy("e.npy", "<f4", "0, 41222222222223, 222222322", ""),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"(0, 41222222222223, 222222322) has more elements than fit in 64 bits"}},
      {"dimension too big",
       npy("e.npy", "<f4", "99999999999999999999999, 8", floats(4)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"shape '(99999999999999999999999, 8)' is not a tuple of non-negative integers"}},
      {"negative dimension",
       npy("e.npy", "<f4", "-1, 8", floats(8)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"shape '(-1, 8)'"}},
      {"shape not numbers",
       npy("e.npy", "<f4", "2, x", floats(8)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"shape '(2, x)'"}},
      {"truncated data",
       npy("e.npy", "<f4", "2, 16, 8", floats(n3 - 3)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: truncated: shape (2, 16, 8) needs 1024 bytes", "1012"}},
      {"trailing bytes",
       npy("e.npy", "<f4", "2, 16, 8", floats(n3 + 1)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"4 unexpected bytes after the data"}},
      {"NaN in q",
       [](const TempDir& d) { save3(d, "q.npy", with(t(1, 2, 16, 8), 17, NAN)); },
       kRun,
       {"q.npy: NaN at index [0, 2, 1]"}},
      {"Inf in v",
       [](const TempDir& d) { save3(d, "v.npy", with(t(1, 2, 16, 8), 200, -INFINITY)); },
       kRun,
       {"v.npy: Inf at index [1, 9, 0]"}},
      {"NaN in float64",
       npy("q.npy", "<f8", "2, 16, 8", raw_bytes(std::vector<double>(n3, std::nan("")))),
       kRun,
       {"q.npy: NaN at index [0, 0, 0]"}},
      {"rank 1",
       npy("e.npy", "<f4", "16,", floats(16)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: array has rank 1 (shape (16,))", "expected rank 2 or 3 or 4"}},
      {"rank 5",
       npy("e.npy", "<f4", "1, 2, 2, 2, 2", floats(16)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: array has rank 5"}},
      {"rank 0",
       npy("e.npy", "<f4", "", floats(1)),
       "run --spec full --q e.npy --k k.npy --v v.npy --out o.npy",
       {"e.npy: array has rank 0"}},
      // .npy inputs: shapes that do not fit together
      {"ranks differ",
       [](const TempDir& d) { save_npy(d.file("q.npy"), from_bhnd(t(1, 1, 16, 8), 2)); },
       kRun,
       {"must have the same rank"}},
      {"D differs",
       [](const TempDir& d) { save3(d, "k.npy", t(1, 2, 16, 4)); },
       kRun,
       {"q and k have different head dims"}},
      {"H differs",
       [](const TempDir& d) { save3(d, "v.npy", t(1, 3, 16, 8)); },
       kRun,
       {"head counts differ"}},
      {"Nk differs",
       [](const TempDir& d) { save3(d, "v.npy", t(1, 2, 15, 8)); },
       kRun,
       {"k and v have different sequence lengths"}},
      {"B differs",
       [](const TempDir& d) {
         for (const char* x : {"q.npy", "k.npy"}) save_npy(d.file(x), t(2, 2, 16, 8));
         save_npy(d.file("v.npy"), t(3, 2, 16, 8));
       },
       kRun,
       {"batch sizes differ"}},
      {"zero-length sequence",
       npy("q.npy", "<f4", "2, 0, 8", ""),
       kRun,
       {"every dimension must be at least 1"}},
      // masks and the other run options
      {"causal text", {}, kRun + " --causal sideways", {"causal mode 'sideways'"}},
      {"key lengths text",
       {},
       kRun + " --key-lengths 5,x",
       {"--key-lengths '5,x'", "'x' is not a non-negative integer"}},
      {"key lengths count", {}, kRun + " --key-lengths 5,6", {"key_lengths has 2 entries", "(1)"}},
      {"key length > Nk", {}, kRun + " --key-lengths 99", {"key_lengths[0] = 99", "Nk = 16"}},
      {"scale 0", {}, kRun + " --scale 0", {"scale = 0", "finite number > 0"}},
      {"scale < 0", {}, kRun + " --scale -1", {"scale = -1"}},
      {"scale NaN", {}, kRun + " --scale nan", {"scale = nan"}},
      {"scale Inf", {}, kRun + " --scale inf", {"scale = inf"}},
      {"scale text", {}, kRun + " --scale big", {"--scale", "big"}},
      {"mask shape",
       npy("m.npy", "|b1", "16, 15", std::string(240, '\1')),
       kRun + " --mask m.npy",
       {"boolean mask has shape [1, 1, 16, 15]"}},
      {"mask value 2",
       npy("m.npy", "|u1", "16, 16", std::string(255, '\1') + '\2'),
       kRun + " --mask m.npy",
       {"m.npy: mask value 2 at index [15, 15]", "0 or 1"}},
      {"mask float",
       npy("m.npy", "<f4", "16, 16", floats(256)),
       kRun + " --mask m.npy",
       {"m.npy: dtype '<f4' is not accepted for a mask"}},
      {"mask rank 1",
       npy("m.npy", "|b1", "16,", std::string(16, '\1')),
       kRun + " --mask m.npy",
       {"m.npy: array has rank 1"}},
      {"mask zero dimension overflowing",
       npy("m.npy", "|b1", "0, 2, 41222222222223, 222222322", ""),
       kRun + " --mask m.npy",
       {"m.npy: shape (0, 2, 41222222222223, 222222322) has more elements than fit in 64 bits"}},
      {"mask truncated",
       npy("m.npy", "|b1", "16, 16", std::string(100, '\1')),
       kRun + " --mask m.npy",
       {"m.npy: truncated"}},
      {"mask on linear",
       npy("m.npy", "|b1", "16, 16", std::string(256, '\1')),
       "run --spec linear --q q.npy --k k.npy --v v.npy --mask m.npy --out o.npy",
       {"linear does not support boolean masks"}},
      // the linear family's per-token inputs ([H, N] = [2, 16] for these rank-3 q, k, v)
      {"log-decay on full without a causal mask",
       npy("g.npy", "<f4", "2, 16", floats(32, -0.1f)),
       kRun + " --log-decay g.npy",
       {"full does not support", "log_decay", "causal mask"}},
      {"beta on gla",
       npy("b.npy", "<f4", "2, 16", floats(32)),
       "run --spec gla --q q.npy --k k.npy --v v.npy --causal top-left --beta b.npy --out o.npy",
       {"gla does not support", "beta"}},
      {"log-decay rank",
       npy("g.npy", "<f4", "1, 2, 16", floats(32, -0.1f)),
       "run --spec gla --q q.npy --k k.npy --v v.npy --causal top-left --log-decay g.npy --out "
       "o.npy",
       {"--log-decay g.npy has shape (1, 2, 16)", "expected [H, N]"}},
      {"log-decay > 0",
       npy("g.npy", "<f4", "2, 16", floats(32)),
       "run --spec gla --q q.npy --k k.npy --v v.npy --causal top-left --log-decay g.npy --out "
       "o.npy",
       {"log-decay g is 0.5", "[0, 0, 0]", "<= 0"}},
      {"beta > 1",
       npy("b.npy", "<f4", "2, 16", floats(32, 2.0f)),
       "run --spec delta --q q.npy --k k.npy --v v.npy --causal top-left --beta b.npy --out o.npy",
       {"beta is 2", "in [0, 1]"}},
      {"beta length",
       npy("b.npy", "<f4", "2, 15", floats(30)),
       "run --spec delta --q q.npy --k k.npy --v v.npy --causal top-left --beta b.npy --out o.npy",
       {"beta has shape [1, 2, 15]", "[1, 2, 16]"}},
      // the softmax engine's modifiers (q, k, v: [H, N] = [2, 16])
      {"cu-seqlens not from 0",
       ints("c.npy", {1, 16}),
       kRun + " --cu-seqlens c.npy",
       {"documents (cu_seqlens)", "offset 0 is 1"}},
      {"cu-seqlens decreasing",
       ints("c.npy", {0, 9, 4, 16}),
       kRun + " --cu-seqlens c.npy",
       {"documents (cu_seqlens)", "offset 2 is 4"}},
      {"cu-seqlens not ending at N",
       ints("c.npy", {0, 8, 12}),
       kRun + " --cu-seqlens c.npy",
       {"documents (cu_seqlens) ends at 12", "16"}},
      {"cu-seqlens float",
       npy("c.npy", "<f4", "2,", floats(2)),
       kRun + " --cu-seqlens c.npy",
       {"--cu-seqlens", "c.npy", "dtype '<f4'", "int64"}},
      {"cu-seqlens rank 2",
       npy("c.npy", "<i8", "1, 2", raw_bytes(std::vector<std::int64_t>{0, 16})),
       kRun + " --cu-seqlens c.npy",
       {"--cu-seqlens", "c.npy", "rank 2"}},
      {"cu-seqlens-k alone",
       ints("c.npy", {0, 16}),
       kRun + " --cu-seqlens-k c.npy",
       {"--cu-seqlens-k", "need --cu-seqlens"}},
      {"cu-seqlens-k documents differ",
       [](const TempDir& d) {
         ints("c.npy", {0, 8, 16})(d);
         ints("ck.npy", {0, 16})(d);
       },
       kRun + " --cu-seqlens c.npy --cu-seqlens-k ck.npy",
       {"key_documents (cu_seqlens_k) has 1", "2"}},
      {"window not two numbers", {}, kRun + " --window 5", {"--window '5'", "LEFT,RIGHT"}},
      {"window not a number", {}, kRun + " --window 5,x", {"--window '5,x'", "LEFT,RIGHT"}},
      {"window below -1", {}, kRun + " --window -2,3", {"window.left = -2", "-1 (unbounded)"}},
      {"window on linear",
       {},
       "run --spec linear --q q.npy --k k.npy --v v.npy --window 4,4 --out o.npy",
       {"linear does not support", "window"}},
      {"prefix without causal",
       ints("p.npy", {4}),
       kRun + " --prefix-lengths p.npy",
       {"prefix_lengths", "needs a causal mask"}},
      {"prefix too long",
       ints("p.npy", {20}),
       kRun + " --causal top-left --prefix-lengths p.npy",
       {"prefix_lengths[0] = 20", "Nk = 16"}},
      {"prefix count",
       ints("p.npy", {2, 3}),
       kRun + " --causal top-left --prefix-lengths p.npy",
       {"prefix_lengths has 2 entries", "batch item (1)"}},
      {"softcap zero", {}, kRun + " --softcap 0", {"softcap = 0", "> 0"}},
      {"dtype unknown", {}, kRun + " --dtype fp16", {"--dtype 'fp16'", "float32 or bf16"}},
      {"softcap on gla",
       {},
       "run --spec gla --q q.npy --k k.npy --v v.npy --causal top-left --softcap 5 --out o.npy",
       {"gla does not support", "softcap"}},
      {"sinks NaN",
       npy("s.npy", "<f4", "2,", raw_bytes(std::vector<float>{0.5f, std::nanf("")})),
       kRun + " --sinks s.npy",
       {"--sinks", "s.npy", "NaN"}},
      {"sinks count",
       npy("s.npy", "<f4", "3,", floats(3)),
       kRun + " --sinks s.npy",
       {"sinks has 3 entries", "H = 2"}},
      {"alibi slope negative",
       npy("a.npy", "<f4", "2,", raw_bytes(std::vector<float>{0.5f, -1.0f})),
       kRun + " --alibi-slopes a.npy",
       {"alibi_slopes[1]", "a finite slope >= 0"}},
      {"alibi not a file", {}, kRun + " --alibi-slopes pap", {"--alibi-slopes", "pap"}},
      {"alibi on gla",
       {},
       "run --spec gla --q q.npy --k k.npy --v v.npy --causal top-left --alibi-slopes paper "
       "--out o.npy",
       {"gla does not support", "ALiBi"}},
      {"bias not broadcasting",
       npy("b.npy", "<f4", "3, 16", floats(48)),
       kRun + " --bias b.npy",
       {"bias has shape", "does not broadcast", "[1, 2, 16, 16]"}},
      {"forgetting gate > 0",
       npy("g.npy", "<f4", "2, 16", floats(32)),
       kRun + " --causal top-left --log-decay g.npy",
       {"log-decay g is 0.5", "<= 0"}},
      {"beta int",
       npy("b.npy", "<i4", "2, 16", floats(32)),
       "run --spec delta --q q.npy --k k.npy --v v.npy --causal top-left --beta b.npy --out o.npy",
       {"b.npy: dtype '<i4'"}},
      {"spec unknown",
       {},
       "run --spec fulll --q q.npy --k k.npy --v v.npy --out o.npy",
       {"unknown variant 'fulll'"}},
      {"spec bad value",
       {},
       "run --spec bigbird:window=2 --q q.npy --k k.npy --v v.npy --out o.npy",
       {"window=2", "odd"}},
      {"linformer causal",
       {},
       "run --spec linformer:k=8 --q q.npy --k k.npy --v v.npy --causal top-left --out o.npy",
       {"linformer does not support causal masks"}},
      {"E for full",
       npy("e.npy", "<f4", "8, 16", floats(128)),
       kRun + " --E e.npy --F e.npy",
       {"--E"}},
      {"linear too many features",
       {},
       "run --spec linear:feature=favor,m=100000000000 --q q.npy --k k.npy --v v.npy --out o.npy",
       {"out of memory", "m=100000000000"}},
      // where the output goes
      {"output folder missing",
       {},
       "run --spec full --q q.npy --k k.npy --v v.npy --out nope/o.npy",
       {"nope/o.npy: cannot write", "No such file or directory"}},
      {"output folder read-only", {}, kRun, {"o.npy: cannot write", "Permission denied"}, kNobody},
      {"output over the file size limit",
       {},
       kRun,
       {"o.npy: cannot write", "File too large"},
       "ulimit -f 1;"},
      // sweep: configs
      {"sweep config missing", {}, "sweep --config nope.toml", {"--config", "nope.toml"}},
      {"sweep config syntax",
       text_file("c.toml", "n = [64\n"),
       "sweep --config c.toml",
       {"c.toml:"}},
      {"sweep config wrong type",
       text_file("c.toml", "variants = [\"full\"]\nn = true\n"),
       "sweep --config c.toml",
       {"c.toml:2", "n", "integer"}},
      {"sweep config unknown key",
       text_file("c.toml", "variants = [\"full\"]\nn = 16\nwarmup = 1\n"),
       "sweep --config c.toml",
       {"c.toml:3", "warmup", "unknown key"}},
      {"sweep config empty grid",
       text_file("c.toml", "variants = [\"full\"]\nn = 16\nseed = []\n"),
       "sweep --config c.toml",
       {"c.toml:3", "seed", "the list is empty"}},
      {"sweep config n not positive",
       text_file("c.toml", "variants = [\"full\"]\nn = [16, -16]\n"),
       "sweep --config c.toml",
       {"c.toml:2", "n", "-16", "positive"}},
      {"sweep config batch 0",
       text_file("c.toml", "variants = [\"full\"]\nn = 16\nbatch = 0\n"),
       "sweep --config c.toml",
       {"c.toml:3", "batch", "positive"}},
      {"sweep config memory budget",
       text_file("c.toml", "variants = [\"full\"]\nn = 16\n[measure]\nmemory_budget = -1\n"),
       "sweep --config c.toml",
       {"measure.memory_budget", "> 0"}},
      {"sweep config dtype",
       text_file("c.toml", "variants = [\"full\"]\nn = 16\ndtype = [\"bf16\", \"half\"]\n"),
       "sweep --config c.toml",
       {"c.toml:3", "dtype", "'half'", "float32 or bf16"}},
      {"sweep config npy input missing",
       text_file("c.toml", "variants = [\"full\"]\nn = 16\ninput = \"npy:nope\"\n"),
       "sweep --config c.toml --out res",
       {"nope/q.npy: no such file"}},
      // sweep: flags
      {"sweep --n 0", {}, kSweepBase + " --dim 4 --n 0", {"--n: '0' is not a positive integer"}},
      {"sweep --n text", {}, kSweepBase + " --dim 4 --n 16,abc", {"--n: 'abc'"}},
      {"sweep --n range not powers of two",
       {},
       kSweepBase + " --dim 4 --n 100..400",
       {"--n: range '100..400'", "powers of two"}},
      {"sweep --dim -4",
       {},
       kSweepBase + " --n 16 --dim=-4",
       {"--dim: '-4' is not a positive integer"}},
      {"sweep --reps 0", {}, kSweep + " --reps 0", {"--reps", "0"}},
      {"sweep --warmup -1", {}, kSweep + " --warmup -1", {"--warmup", "-1"}},
      {"sweep --memory-budget -1", {}, kSweep + " --memory-budget -1", {"--memory-budget", "-1"}},
      {"sweep --target-seconds 0", {}, kSweep + " --target-seconds 0", {"--target-seconds", "0"}},
      {"sweep --error-rows 0", {}, kSweep + " --error-rows 0", {"--error-rows", "0"}},
      {"sweep --variant",
       {},
       "sweep --variant 'sliding:left=[4,8' --out res",
       {"--variant", "missing ']'"}},
      {"sweep --causal",
       {},
       "sweep --n 16 --causal none,sideways --out res",
       {"--causal", "sideways"}},
      {"sweep --input", {}, kSweep + " --input lowrank:temp=2", {"--input", "r=R"}},
      {"sweep --input huge rank",
       {},
       kSweep + " --input lowrank:r=4e53",
       {"--input", "r=4e53", "below 2^32"}},
      {"sweep --input trained without a folder",
       {},
       kSweep + " --input trained:,layer=1",
       {"--input", "dir", "empty"}},
      {"sweep --input trained layer 0", {}, kSweep + " --input trained:ckpt,layer=0", {"layer=0"}},
      {"sweep --input trained unknown key",
       {},
       kSweep + " --input trained:ckpt,heads=2",
       {"unknown key 'heads'", "layer"}},
      {"sweep --input trained not a checkpoint",
       {},
       kSweep + " --input trained:nope",
       {"trained:nope", "dir=nope", "state.txt"}},
      {"sweep --shard", {}, kSweep + " --shard 3/2", {"--shard", "3/2"}},
      {"sweep --dtype", {}, kSweep + " --dtype float32,fp16", {"--dtype", "'fp16'", "bf16"}},
      {"sweep --mask key",
       {},
       kSweep + " --mask window:wide=3",
       {"--mask", "window:wide=3", "wide"}},
      {"sweep --mask documents batch",
       {},
       kSweep + " --batch 2 --mask documents:count=4",
       {"documents:count=4", "batch of one", "2"}},
      {"sweep default mask axis batch",  // the default config's documents, kept: the hint says so
       {},
       "sweep --quiet --variant full --n 16 --dim 4 --batch 2 --out res",
       {"documents:count=16", "batch of one", "--mask none"}},
      {"sweep --mask prefix no causal",
       {},
       kSweep + " --mask prefix:frac=0.5",
       {"prefix:frac=0.5", "causal", "top-left"}},
      // sweep: the results folder
      {"sweep foreign rows.csv",
       [](const TempDir& d) {
         fs::create_directory(d.file("res"));
         std::ofstream(d.file("res/rows.csv")) << "a,b\n1,2\n";
       },
       kSweep,
       {"res/rows.csv:1", "not the rows.csv schema"}},
      {"sweep broken rows.csv",
       [](const TempDir& d) {
         fs::create_directory(d.file("res"));
         std::ofstream(d.file("res/rows.csv")) << rows_csv("x,y\n");
       },
       kSweep,
       {"res/rows.csv: record 3 has 2 fields, expected " + std::to_string(harness::kColumnCount)}},
      {"sweep results folder is a file",
       text_file("res", "not a folder"),
       kSweep,
       {"res", "not a directory"}},
      {"sweep results folder read-only",
       [](const TempDir& d) { fs::create_directory(d.file("res")); },
       kSweep,
       {"cannot open res/rows.csv: Permission denied"},
       kNobody},
      {"sweep results file size limit",
       {},
       kSweep,
       {"res/meta.json", "File too large"},
       "ulimit -f 1;"},
      // report
      {"report no folder", {}, "report nope", {"nope"}},
      {"report no rows",
       [](const TempDir& d) { fs::create_directory(d.file("res")); },
       "report res",
       {"res/rows.csv"}},
      {"report decode --no-plots",
       [](const TempDir& d) {
         fs::create_directory(d.file("res"));
         std::ofstream(d.file("res/decode.csv")) << "key\n";
       },
       "report res --no-plots",
       {"--no-plots", "res", "decode sweep"}},
      {"report foreign rows.csv",
       [](const TempDir& d) {
         fs::create_directory(d.file("res"));
         std::ofstream(d.file("res/rows.csv")) << "a,b\n1,2\n";
       },
       "report res --no-plots",
       {"res/rows.csv", "header has no 'spec' column"}},
      {"report broken rows.csv",
       [](const TempDir& d) {
         fs::create_directory(d.file("res"));
         std::ofstream(d.file("res/rows.csv")) << rows_csv("x,y\n");
       },
       "report res --no-plots",
       {"res/rows.csv: line 3 has 2 fields, the header " + std::to_string(harness::kColumnCount)}},
      {"report read-only folder",
       [](const TempDir& d) {
         fs::create_directory(d.file("res"));
         std::ofstream(d.file("res/rows.csv")) << rows_csv();
       },
       "report res --no-plots",
       {"res/report.md", "Permission denied"},
       kNobody},
      // mask
      {"mask not bigbird",
       {},
       "mask --spec full --n 64 --out m.png",
       {"only bigbird has a block layout"}},
      {"mask n 0", {}, "mask --spec bigbird --n 0 --out m.png", {"--n", "0"}},
      {"mask n negative", {}, "mask --spec bigbird --n=-64 --out m.png", {"--n", "-64"}},
      {"mask extension",
       {},
       "mask --spec bigbird --n 64 --out m.jpg",
       {"'m.jpg'", ".png, .pgm or .svg"}},
      {"mask too many blocks",
       {},
       "mask --spec bigbird:block=1 --n 100000 --out m.png",
       {"100000 blocks a side", "at most 4096"}},
      {"mask head", {}, "mask --spec bigbird --n 64 --head 5000 --out m.png", {"--head 5000"}},
      {"mask head negative",
       {},
       "mask --spec bigbird --n 64 --head=-1 --out m.png",
       {"--head", "-1"}},
      {"mask bad spec", {}, "mask --spec bigbird:block=0 --n 64 --out m.png", {"block=0"}},
      {"run taylor projection above Dk",
       {},
       "run --spec linear:feature=taylor,taylor_dim=9 --q q.npy --k k.npy --v v.npy --out o.npy",
       {"taylor_dim=9", "Dk = 8"}},
      {"run delta-product rows not steps times the queries",
       {},
       "run --spec delta-product:steps=2 --causal top-left --q q.npy --k k.npy --v v.npy "
       "--out o.npy",
       {"Nk = 16 rows", "steps · Nq = 2 · 16 = 32"}},
      {"run moba topk 0",
       {},
       "run --spec moba:topk=0 --q q.npy --k k.npy --v v.npy --out o.npy",
       {"moba:topk=0", "topk=0", ">= 1"}},
      {"mask folder missing",
       {},
       "mask --spec bigbird --n 64 --out nope/m.png",
       {"nope/m.png", "No such file or directory"}},
      {"mask read-only folder",
       {},
       "mask --spec bigbird --n 64 --out m.svg",
       {"m.svg", "Permission denied"},
       kNobody},
      // train, model, demo, study: a negative count is refused, not wrapped around to 2^64 - k; a
      // size that cannot fit is refused before any file is written (no t/ folder, no train.csv)
      {"train --n -5",
       {},
       "train --task copy --spec linear --n -5 --steps 3 --out t",
       {"--n: '-5' is negative", ">= 0"}},
      {"train --n=-5",
       {},
       "train --task copy --spec linear --n=-5 --steps 3 --out t",
       {"--n: '-5' is negative"}},
      {"train --batch -1",
       {},
       "train --task copy --spec linear --batch -1 --steps 3 --out t",
       {"--batch: '-1' is negative"}},
      {"train --steps -1",
       {},
       "train --task copy --spec linear --steps -1 --out t",
       {"--steps: '-1' is negative"}},
      {"train --layers -1",
       {},
       "train --task copy --spec linear --layers -1 --out t",
       {"--layers: '-1' is negative"}},
      {"train --eval-every -1",
       {},
       "train --task copy --spec linear --eval-every -1 --out t",
       {"--eval-every: '-1' is negative"}},
      {"train --seed -1",
       {},
       "train --task copy --spec linear --seed -1 --out t",
       {"--seed: '-1' is negative"}},
      {"train truncated state.txt",
       [](const TempDir& d) {
         fs::create_directories(d.file("t/checkpoint"));
         std::ofstream(d.file("t/checkpoint/state.txt")) << "step 3\nseconds 0.5\n";
       },
       "train --task copy --spec linear --n 16 --steps 6 --out t",
       {"t/checkpoint/state.txt is truncated or corrupt",
        "ends before the config line 'task copy"}},
      {"train fails at its first step",
       {},
       "train --task copy --spec linformer:k=4,max_len=8 --n 16 --steps 3 --out t",
       {"max_len"}},
      {"train --n too big",
       {},
       "train --task copy --spec linear --n 100000000 --steps 3 --out t",
       {"n=100000000", "need at least", "TiB", "this process may use"}},
      {"train --d-model too big",
       {},
       "train --task copy --spec linear --d-model 1000000000 --heads 1 --steps 3 --out t",
       {"d_model=1000000000", "need at least"}},
      {"train --layers too big",
       {},
       "train --task copy --spec linear --layers 100000000000 --steps 3 --out t",
       {"layers=100000000000", "need at least"}},
      {"train --batch too big",
       {},
       "train --task copy --spec linear --batch 10000000 --steps 3 --out t",
       {"batch=10000000", "need at least"}},
      {"model --n -1", {}, "model --spec full --n -1", {"--n: '-1' is negative"}},
      {"model --heads -1", {}, "model --spec full --heads -1", {"--heads: '-1' is negative"}},
      {"model --n too big",
       {},
       "model --spec full --n 100000000 --save-weights w",
       {"--n 100000000", "need at least", "TiB"}},
      {"model --d-model too big",
       {},
       "model --spec full --d-model 100000000 --heads 1 --save-weights w",
       {"d_model=100000000", "need at least"}},
      {"demo --rows -3", {}, "demo --rows -3", {"--rows: '-3' is negative"}},
      {"study --seed -1",
       {},
       "study rank --size tiny --seed -1 --out s",
       {"--seed: '-1' is negative"}},
      {"study --weights not a checkpoint",
       [](const TempDir& d) { fs::create_directory(d.file("w")); },
       "study prune --size tiny --weights w --out s",
       {"'w' is not a checkpoint folder of attnlab train", "state.txt"}},
      {"study --weights on seeded weights",
       [](const TempDir& d) { fs::create_directory(d.file("w")); },
       "study spectrum --size tiny --weights w --out s",
       {"study spectrum runs on seeded weights and takes no --weights", "trained, prune"}},
      {"study trained without --weights",
       {},
       "study trained --size tiny --out s",
       {"study trained analyses a trained model", "--weights DIR"}},
      // merge
      {"merge input missing", {}, "merge out nope", {"nope/rows.csv does not exist"}},
      {"merge foreign rows.csv",
       [](const TempDir& d) {
         fs::create_directory(d.file("a"));
         std::ofstream(d.file("a/rows.csv")) << "a,b\n";
       },
       "merge out a",
       {"a/rows.csv:1", "not the rows.csv schema"}},
      {"merge conflict",
       [](const TempDir& d) {
         fs::create_directory(d.file("a"));
         fs::create_directory(d.file("b"));
         std::ofstream(d.file("a/rows.csv")) << rows_csv();
         std::string other = rows_csv();
         other.replace(other.find("k1,full,full,16"), 15, "k1,full,full,32");
         std::ofstream(d.file("b/rows.csv")) << other;
       },
       "merge out a b",
       {"key k1", "conflicting n", "'16' in a", "'32' in b"}},
      {"merge read-only output",
       [](const TempDir& d) {
         fs::create_directory(d.file("a"));
         std::ofstream(d.file("a/rows.csv")) << rows_csv();
       },
       "merge out a",
       {"out", "Permission denied"},
       kNobody},
  };
}

TEST_CASE("every bad command line, file and folder: exit 2, one line, nothing written", "[cli]") {
  const auto cases = cli_cases();
  CHECK(cases.size() >= 60);
  for (const CliCase& c : cases) {
    INFO("case: " << c.what << "\nattnlab " << c.args);
    TempDir dir("bad");
    save3(dir, "q.npy", t(1, 2, 16, 8));
    save3(dir, "k.npy", t(1, 2, 16, 8));
    save3(dir, "v.npy", t(1, 2, 16, 8));
    if (c.setup) c.setup(dir);
    // Read-only rows run as user nobody (root may write anywhere); without root they are skipped.
    if (std::string(c.what).find("read-only") != std::string::npos && kNobody.empty()) continue;
    const auto before = snapshot(dir);
    CliResult r = attnlab_cli(dir, c.args, c.prefix);
    // ASan's allocator announces a refused allocation on a line of its own ("==PID==WARNING:
    // AddressSanitizer failed to allocate ...") before our bad_alloc is caught: not ours, dropped.
    if (r.err.rfind("==", 0) == 0 &&
        r.err.find("AddressSanitizer failed to allocate") != std::string::npos)
      r.err.erase(0, r.err.find('\n') + 1);
    INFO("exit " << r.code << "\nstderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("attnlab: error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    for (const auto& part : c.fragments) CHECK(r.err.find(part) != std::string::npos);
    CHECK(r.err.find("std::") == std::string::npos);  // our words, never the library's
    CHECK(snapshot(dir) == before);
  }
}

#if !defined(__SANITIZE_ADDRESS__)  // ASan reserves terabytes of shadow memory: no ulimit -v
TEST_CASE("attnlab run out of memory after the forward names the spec and the shapes", "[cli]") {
  TempDir dir("oom-run");
  save3(dir, "q.npy", t(1, 2, 16, 8));
  save3(dir, "k.npy", t(1, 2, 16, 8));
  save3(dir, "v.npy", t(1, 2, 16, 8));
  // The address space a tiny run needs (libraries, BLAS buffers), by bisection. One thread:
  // where a limit leaves no room for another thread's stack, OpenBLAS's and OpenMP's start-up
  // can hang instead of failing (seen at 100 MiB here). And a time limit: OpenBLAS's OpenMP
  // build retries its start-up buffer forever under a limit it cannot meet, even on one thread
  // (64-200 MiB here), so a run that hangs counts as one that does not fit.
  const auto limited = [](std::size_t kib) {
    return "export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; ulimit -v " + std::to_string(kib) +
           "; timeout 10";
  };
  const auto runs_within = [&](std::size_t kib) {
    return attnlab_cli(dir, kRun, limited(kib)).code == 0;
  };
  std::size_t lo = 16 << 10, hi = 16 << 20;  // KiB: 16 MiB fails, 16 GiB runs
  REQUIRE(runs_within(hi));
  while (hi - lo > (8 << 10)) {
    const std::size_t mid = (lo + hi) / 2;
    (runs_within(mid) ? hi : lo) = mid;
  }
  fs::remove(dir.file("o.npy"));
  // q [4096, 1], k [1, 1], v [1, 16384]: tiny inputs, a 256 MiB output. Room for the forward's
  // output but not for its copy into the .npy array: the allocation after the forward fails.
  save_npy(dir.file("q.npy"), from_bhnd(t(1, 1, 4096, 1), 2));
  save_npy(dir.file("k.npy"), from_bhnd(t(1, 1, 1, 1), 2));
  save_npy(dir.file("v.npy"), from_bhnd(t(1, 1, 1, 16384), 2));
  const std::size_t limit = hi + (384 << 10);
  const CliResult r = attnlab_cli(dir, kRun, limited(limit));
  INFO("baseline " << hi << " KiB, limit " << limit << " KiB, exit " << r.code << ": " << r.err);
  CHECK(r.code == 2);
  CHECK(r.err.find("attnlab: error: out of memory running full") == 0);
  CHECK(r.err.find("q (4096, 1), k (1, 1), v (1, 16384)") != std::string::npos);
  CHECK(!fs::exists(dir.file("o.npy")));
}
#endif

TEST_CASE("a rows.csv with a torn last line is repaired on resume, with a note", "[cli]") {
  TempDir dir("torn");
  const CliResult first = attnlab_cli(dir, kSweepBase + " --dim 4 --n 16,24");
  REQUIRE(first.code == 0);
  const std::string whole = read_text(dir.file("res/rows.csv"));
  const std::string kept = whole.substr(0, whole.rfind('\n', whole.size() - 2) + 1);
  std::ofstream(dir.file("res/rows.csv"), std::ios::trunc) << kept << whole.substr(kept.size(), 30);
  const CliResult again = attnlab_cli(dir, kSweepBase + " --dim 4 --n 16,24");
  INFO("stderr: " << again.err);
  CHECK(again.code == 0);
  CHECK(again.err.find("res/rows.csv: dropped a torn last line (30 bytes") != std::string::npos);
  CHECK(again.out.find("1 already done, 1 run") != std::string::npos);
  const auto rows = harness::read_rows(dir.file("res/rows.csv"));
  CHECK(rows.size() == 2);
}

}  // namespace
