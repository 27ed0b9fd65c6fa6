// End-to-end tests of the attnlab executable (path in $ATTNLAB_CLI, set by meson test): exit codes,
// the one-line error messages, no output file on failure, and that a good run's output equals
// make_attention(spec)->forward in-process.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <span>

#include <xtensor/xadapt.hpp>

#include "attnlab/blas.hpp"
#include "attnlab/kernels.hpp"
#include "attnlab/npy.hpp"
#include "cli_helpers.hpp"
#include "helpers.hpp"

using namespace attnlab;
using attnlab::test::attnlab_cli;
using attnlab::test::CliResult;
using attnlab::test::random_tensor;
using attnlab::test::raw_bytes;
using attnlab::test::read_text;
using attnlab::test::TempDir;
using attnlab::test::write_npy_raw;

namespace {

// Saves t, [B,H,N,D], as a .npy of `rank` axes (leading axes of t must be 1 where dropped).
void save(const TempDir& dir, const std::string& name, const Tensor& t, std::size_t rank = 4) {
  save_npy(dir.file(name), from_bhnd(t, rank));
}

// A failed run: exit 2, exactly one line "attnlab: error: ..." holding every fragment, no o.npy.
void require_failure(const TempDir& dir, const std::string& args,
                     std::initializer_list<std::string> fragments) {
  std::filesystem::remove(dir.file("o.npy"));
  const CliResult r = attnlab_cli(dir, args);
  INFO("attnlab " << args << "\nstderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.err.rfind("attnlab: error: ", 0) == 0);
  REQUIRE(!r.err.empty());
  CHECK(r.err.find('\n') == r.err.size() - 1);  // one line
  for (const auto& part : fragments) CHECK(r.err.find(part) != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("o.npy")));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))  // no temp file left
    CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
}

// Runs the CLI on q, k, v already saved in dir and checks o.npy against forward in-process.
void require_same_as_library(const TempDir& dir, const std::string& spec, const std::string& flags,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                             std::size_t rank) {
  std::filesystem::remove(dir.file("o.npy"));
  const CliResult r = attnlab_cli(
      dir, "run --spec '" + spec + "' --q q.npy --k k.npy --v v.npy " + flags + " --out o.npy");
  INFO("flags: " << flags << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  const auto out = load_npy_float(dir.file("o.npy"));
  REQUIRE(out.dimension() == rank);
  const Tensor expected = make_attention(spec)->forward(q, k, v, mask);
  const Tensor got = to_bhnd(out, "o.npy");
  REQUIRE(shape_string(got) == shape_string(expected));
  // Same code on the same data; allowed to differ only by the float32 rounding of a different
  // OpenMP schedule, so the bound is a few ulps of O(1) outputs.
  const float max_diff = xt::amax(xt::abs(got - expected))();
  CHECK(max_diff <= 1e-6f);
}

}  // namespace

TEST_CASE("--help and --version behave as users expect", "[cli]") {
  TempDir dir("cli");
  CliResult r = attnlab_cli(dir, "--help");
  CHECK(r.code == 0);
  CHECK(r.out.find("Usage: attnlab") != std::string::npos);
  CHECK(r.out.find("run") != std::string::npos);
  CHECK(r.out.find("full") != std::string::npos);  // lists the variants
  CHECK(r.err.empty());

  r = attnlab_cli(dir, "run --help");
  CHECK(r.code == 0);
  CHECK(r.out.find("--key-lengths") != std::string::npos);
  // --log-decay and --beta name the variants that take them, as their support() says: the
  // comma-separated list after `before` (in the option's help), up to `end`.
  const auto listed = [&](const std::string& option, const std::string& before, char end) {
    const auto at = r.out.find(before, r.out.find(option));
    REQUIRE(at != std::string::npos);
    std::string text = r.out.substr(at + before.size());
    text = text.substr(0, text.find(end));
    std::set<std::string> names;
    std::string name;
    for (char c : text + ",") {
      if (c == ',')
        names.insert(name), name.clear();
      else if (!std::isspace(static_cast<unsigned char>(c)))
        name += c;
    }
    return names;
  };
  const auto log_decay = listed("--log-decay", "a memory's decay: ", ';');
  const auto gate = listed("--log-decay", "forgetting gate, with --causal: ", ')');
  const auto beta = listed("--beta", "--log-decay (", ')');
  for (const std::string& name : attention_names()) {
    INFO(name);
    const Support s = make_attention(name)->support();
    CHECK(log_decay.count(name) == std::size_t(s.log_decay));
    CHECK(gate.count(name) == std::size_t(s.forgetting_gate));
    CHECK(beta.count(name) == std::size_t(s.beta));
  }

  r = attnlab_cli(dir, "--version");
  CHECK(r.code == 0);
  const std::string path = kernels::isa_name(kernels::active_isa());  // same environment
  const std::string bf16 = kernels::bf16_path_name(kernels::active_bf16_path());
  // Same environment, so the same OpenBLAS core and threads as this test process.
  CHECK(r.out == std::string("attnlab ") + ATTNLAB_VERSION + " (kernels: " + path +
                     ", bf16: " + bf16 + ")\nBLAS: " + blas::describe(blas::info()) + "\n");

  require_failure(dir, "", {"subcommand is required", "--help"});
  require_failure(dir, "frobnicate", {"unknown command 'frobnicate'", "run"});
}

TEST_CASE("demo measures each variant against what it computes", "[cli]") {
  TempDir dir("cli-demo");
  const CliResult r = attnlab_cli(dir, "demo --n 96 --heads 2 --dim 16 --rows 8");
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  for (const std::string& name : attention_names()) {
    const auto a = make_attention(name);
    const auto at = r.out.find("\n" + a->spec() + " ");
    REQUIRE(at != std::string::npos);
    const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
    INFO(line);
    const bool own = !a->support().approximates_softmax;
    CHECK((line.find("(vs its own fp64 definition") != std::string::npos) == own);
    // Against its own definition only the float32 kernels' rounding is left (about 1e-7
    // relative over 96 tokens: below 1e-5 with margin).
    if (own) {
      const auto rel = line.find("rel_fro=");
      REQUIRE(rel != std::string::npos);
      CHECK(std::stod(line.substr(rel + 8)) < 1e-5);
    }
  }
}

TEST_CASE("--version names the kernel path; ATTNLAB_ISA forces one or fails in one line", "[cli]") {
  TempDir dir("cli");
  setenv("ATTNLAB_ISA", "scalar", 1);
  CliResult r = attnlab_cli(dir, "--version");
  CHECK(r.code == 0);
  CHECK(r.out.rfind(std::string("attnlab ") + ATTNLAB_VERSION +
                        " (kernels: scalar, bf16: bf16-via-f32)\nBLAS: ",
                    0) == 0);
  setenv("ATTNLAB_ISA", "avx1024", 1);
  r = attnlab_cli(dir, "--version");
  unsetenv("ATTNLAB_ISA");
  CHECK(r.code == 2);
  CHECK(r.err.find("'avx1024'") != std::string::npos);
  CHECK(r.err.find("scalar, avx2 or avx512") != std::string::npos);
  // The bfloat16 paths: the converted one anywhere; amx and avx512bf16 have no kernels in this
  // build, so forcing one fails in one line whether or not the CPU has the instructions.
  setenv("ATTNLAB_ISA", "bf16-via-f32", 1);
  r = attnlab_cli(dir, "--version");
  CHECK(r.code == 0);
  CHECK(r.out.find(", bf16: bf16-via-f32)") != std::string::npos);
  for (const auto path : {kernels::Bf16Path::amx, kernels::Bf16Path::avx512bf16}) {
    const std::string name = kernels::bf16_path_name(path);
    INFO(name);
    setenv("ATTNLAB_ISA", name.c_str(), 1);
    r = attnlab_cli(dir, "--version");
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find("ATTNLAB_ISA=" + name + ": ") != std::string::npos);
    CHECK(r.err.find(kernels::cpu_has_bf16_path(path)
                         ? "this build does not have it"
                         : "this CPU cannot run it") != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  unsetenv("ATTNLAB_ISA");
}

TEST_CASE("run on rank 4, 3 and 2 inputs equals forward in-process, output keeps the rank",
          "[cli]") {
  TempDir dir("cli");
  const Tensor q = random_tensor(2, 3, 7, 5, 1), k = random_tensor(2, 3, 9, 5, 2),
               v = random_tensor(2, 3, 9, 4, 3);
  save(dir, "q.npy", q), save(dir, "k.npy", k), save(dir, "v.npy", v);
  require_same_as_library(dir, "full", "", q, k, v, {}, 4);

  Mask m;
  m.causal = Causal::bottom_right;
  m.key_lengths = {9, 6};
  m.scale = 0.3;
  require_same_as_library(dir, "full", "--causal bottom-right --key-lengths 9,6 --scale 0.3", q, k,
                          v, m, 4);

  const Tensor q3 = random_tensor(1, 3, 8, 5, 4), k3 = random_tensor(1, 3, 8, 5, 5),
               v3 = random_tensor(1, 3, 8, 5, 6);
  save(dir, "q.npy", q3, 3), save(dir, "k.npy", k3, 3), save(dir, "v.npy", v3, 3);
  Mask causal;
  causal.causal = Causal::top_left;
  require_same_as_library(dir, "full", "--causal top-left", q3, k3, v3, causal, 3);

  const Tensor q2 = random_tensor(1, 1, 6, 8, 7), k2 = random_tensor(1, 1, 10, 8, 8),
               v2 = random_tensor(1, 1, 10, 3, 9);
  save(dir, "q.npy", q2, 2), save(dir, "k.npy", k2, 2), save(dir, "v.npy", v2, 2);
  require_same_as_library(dir, "full", "", q2, k2, v2, {}, 2);
  // the output file is float32 ('<f4') whatever the input
  CHECK(read_text(dir.file("o.npy")).find("'descr': '<f4'") != std::string::npos);
}

TEST_CASE("run --dtype bf16: the library's bf16 forward of the rounded inputs, as float32",
          "[cli]") {
  TempDir dir("cli");
  const Tensor q = random_tensor(1, 2, 9, 8, 21), k = random_tensor(1, 2, 11, 8, 22),
               v = random_tensor(1, 2, 11, 6, 23);
  save(dir, "q.npy", q), save(dir, "k.npy", k), save(dir, "v.npy", v);
  const std::vector<float> sinks = {0.5f, -1.0f};  // the modifiers stay float32
  write_npy_raw(dir.file("s.npy"), "<f4", "2,", raw_bytes(sinks));
  const CliResult r = attnlab_cli(dir,
                                  "run --spec full --q q.npy --k k.npy --v v.npy --causal "
                                  "bottom-right --sinks s.npy --dtype bf16 --out o.npy");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const Tensor got = to_bhnd(load_npy_float(dir.file("o.npy")), "o.npy");
  Mask m;
  m.causal = Causal::bottom_right;
  TokenInputs in;
  in.sinks = std::span<const float>(sinks);
  const auto full = make_attention("full");
  const TensorBf16 want = full->forward(to_bf16(q), to_bf16(k), to_bf16(v), m, in);
  // The same computation in another process: bit for bit (the engine is deterministic).
  CHECK((to_float32(want) == got));
  CHECK_FALSE((full->forward(q, k, v, m, in) == got));  // not the float32 result
}

TEST_CASE("run reads float64 inputs and bool or uint8 mask files", "[cli]") {
  TempDir dir("cli");
  const Tensor q = random_tensor(1, 1, 5, 4, 11), k = random_tensor(1, 1, 6, 4, 12),
               v = random_tensor(1, 1, 6, 4, 13);
  // float64 files holding float32-representable values, so the in-process inputs are identical
  const auto as_f64 = [](const Tensor& t) { return std::vector<double>(t.begin(), t.end()); };
  write_npy_raw(dir.file("q.npy"), "<f8", "5, 4", raw_bytes(as_f64(q)));
  write_npy_raw(dir.file("k.npy"), "<f8", "6, 4", raw_bytes(as_f64(k)));
  write_npy_raw(dir.file("v.npy"), "<f8", "6, 4", raw_bytes(as_f64(v)));
  require_same_as_library(dir, "full", "", q, k, v, {}, 2);

  xt::xtensor<bool, 2> allowed = xt::xtensor<bool, 2>::from_shape({5, 6});
  std::string bits;
  for (std::size_t i = 0; i < 5; ++i)
    for (std::size_t j = 0; j < 6; ++j) {
      allowed(i, j) = (i + 2 * j) % 3 != 0;
      bits += allowed(i, j) ? '\1' : '\0';
    }
  Mask m;
  m.allow(allowed);
  write_npy_raw(dir.file("m.npy"), "|b1", "5, 6", bits);
  require_same_as_library(dir, "full", "--mask m.npy", q, k, v, m, 2);
  write_npy_raw(dir.file("m.npy"), "|u1", "5, 6", bits);
  require_same_as_library(dir, "full", "--mask m.npy", q, k, v, m, 2);
}

TEST_CASE("run passes --log-decay and --beta to the linear family as forward does", "[cli]") {
  TempDir dir("cli");
  const Tensor q = random_tensor(1, 2, 9, 4, 31), k = random_tensor(1, 2, 9, 4, 32),
               v = random_tensor(1, 2, 9, 3, 33);
  save(dir, "q.npy", q, 3), save(dir, "k.npy", k, 3), save(dir, "v.npy", v, 3);
  // g in [-0.9, 0) and beta in (0, 0.9], varying per head and token; saved as [H, N] for rank-3 q
  TokenTensor g = TokenTensor::from_shape({1, 2, 9}), beta = TokenTensor::from_shape({1, 2, 9});
  xt::xarray<float> g2 = xt::xarray<float>::from_shape({2, 9}), beta2 = g2;
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t t = 0; t < 9; ++t) {
      g(0, h, t) = g2(h, t) = -0.1f * static_cast<float>((t + 3 * h) % 9 + 1);
      beta(0, h, t) = beta2(h, t) = 0.09f * static_cast<float>((2 * t + h) % 10 + 1);
    }
  save_npy(dir.file("g.npy"), g2);
  save_npy(dir.file("beta.npy"), beta2);
  const CliResult r =
      attnlab_cli(dir,
                  "run --spec gated-delta --q q.npy --k k.npy --v v.npy "
                  "--causal top-left --log-decay g.npy --beta beta.npy --out o.npy");
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  Mask mask;
  mask.causal = Causal::top_left;
  TokenInputs in;
  in.log_decay = g;
  in.beta = beta;
  Tensor expected, plain;
  Saved saved;
  const auto a = make_attention("gated-delta");
  a->forward(q, k, v, mask, in, expected, saved);
  const Tensor got = to_bhnd(load_npy_float(dir.file("o.npy")), "o.npy");
  REQUIRE(shape_string(got) == shape_string(expected));
  CHECK(xt::amax(xt::abs(got - expected))() <= 1e-6f);
  a->forward(q, k, v, mask, {}, plain);  // the inputs were read: without them the output differs
  CHECK(xt::amax(xt::abs(got - plain))() > 1e-3f);
}

TEST_CASE("run takes the softmax engine's modifiers, each read, all at once", "[cli]") {
  // Two documents packed in a batch of one, grouped heads (4 query heads on 2 KV heads), and
  // every modifier: the CLI's output equals forward in-process with the same Mask and inputs,
  // also with any one flag left out, which changes the output (none is read and then ignored).
  TempDir dir("cli-mods");
  const std::size_t heads = 4, n = 20;
  const Tensor q = random_tensor(1, heads, n, 8, 31), k = random_tensor(1, 2, n, 8, 32),
               v = random_tensor(1, 2, n, 8, 33);
  save(dir, "q.npy", q), save(dir, "k.npy", k), save(dir, "v.npy", v);
  const auto save_ints = [&](const std::string& name, const std::vector<std::int64_t>& x) {
    write_npy_raw(dir.file(name), "<i8", std::to_string(x.size()) + ",", raw_bytes(x));
  };
  save_ints("cu.npy", {0, 7, 20});
  save_ints("prefix.npy", {3, 4});  // per document
  save_ints("prefix1.npy", {3});    // per batch item, when the documents are left out
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  save_npy(dir.file("sinks.npy"),
           xt::xarray<float>(xt::adapt(sinks, std::vector<std::size_t>{heads})));
  const Tensor bias = random_tensor(1, 1, n, n, 34, 0.5f);
  save(dir, "bias.npy", bias, 2);
  const TokenTensor g = test::uniform_tokens(1, heads, n, -0.3, 0.0, 35);
  save_npy(dir.file("g.npy"), xt::xarray<float>(g));
  const std::vector<float> slopes = alibi_slopes(heads);

  enum Part { documents, window, prefix, softcap, sink, alibi, additive, gate, parts };
  const char* flags[parts] = {
      "--cu-seqlens cu.npy", "--window 5,2",      "--prefix-lengths prefix.npy",
      "--softcap 4",         "--sinks sinks.npy", "--alibi-slopes paper",
      "--bias bias.npy",     "--log-decay g.npy"};
  for (const std::string& spec : test::engine_clients()) {
    Tensor all;
    for (int left_out = parts; left_out >= 0; --left_out) {  // parts: none left out
      INFO("spec " << spec << ", without " << (left_out < parts ? flags[left_out] : "nothing"));
      Mask mask;
      mask.causal = Causal::top_left;
      TokenInputs in;
      std::string args = "run --spec " + spec + " --q q.npy --k k.npy --v v.npy --causal top-left";
      for (int f = 0; f < parts; ++f) {
        if (f == left_out) continue;
        args += std::string(" ") +
                (f == prefix && left_out == documents ? "--prefix-lengths prefix1.npy" : flags[f]);
        switch (f) {
          case documents:
            mask.documents = {0, 7, 20};
            break;
          case window:
            mask.window = Window{5, 2};
            break;
          case prefix:
            mask.prefix_lengths = left_out == documents ? std::vector<std::int64_t>{3}
                                                        : std::vector<std::int64_t>{3, 4};
            break;
          case softcap:
            mask.softcap = 4.0;
            break;
          case sink:
            in.sinks = std::span<const float>(sinks);
            break;
          case alibi:
            in.alibi_slopes = std::span<const float>(slopes);
            break;
          case additive:
            in.bias = TensorRef(bias);
            break;
          default:
            in.log_decay = g;
        }
      }
      Tensor expected;
      make_attention(spec)->forward(q, k, v, mask, in, expected);
      std::filesystem::remove(dir.file("o.npy"));
      const CliResult r = attnlab_cli(dir, args + " --out o.npy");
      INFO("attnlab " << args << "\nstderr: " << r.err);
      REQUIRE(r.code == 0);
      const Tensor got = to_bhnd(load_npy_float(dir.file("o.npy")), "o.npy");
      REQUIRE(shape_string(got) == shape_string(expected));
      CHECK(xt::amax(xt::abs(got - expected))() <= 1e-6f);  // the same code on the same data
      if (left_out == parts)
        all = got;
      else
        CHECK(xt::amax(xt::abs(got - all))() > 1e-4f);
      if (spec != "full") break;  // the others: all at once only
    }
  }
}

TEST_CASE("run and mask take FlashAttention's --window-size as --window", "[cli]") {
  TempDir dir("cli-window");
  const Tensor q = random_tensor(1, 2, 40, 8, 41), k = random_tensor(1, 2, 40, 8, 42),
               v = random_tensor(1, 2, 40, 8, 43);
  save(dir, "q.npy", q), save(dir, "k.npy", k), save(dir, "v.npy", v);
  Mask mask;
  mask.window = Window{5, 2};
  require_same_as_library(dir, "full", "--window-size 5,2", q, k, v, mask, 4);
  require_same_as_library(dir, "full", "--window 5,2", q, k, v, mask, 4);
  const CliResult tiles = attnlab_cli(dir, "mask --n 300 --window-size 40,0");
  REQUIRE(tiles.code == 0);
  CHECK(tiles.out == attnlab_cli(dir, "mask --n 300 --window 40,0").out);
  CHECK(tiles.out.find("window 40,0") != std::string::npos);
}

TEST_CASE("--window and --window-size errors name the flag the user typed", "[cli]") {
  TempDir dir("cli-window-errors");
  const Tensor q = random_tensor(1, 2, 20, 8, 44);
  save(dir, "q.npy", q), save(dir, "k.npy", q), save(dir, "v.npy", q);
  const std::string run = "run --spec full --q q.npy --k k.npy --v v.npy --out o.npy ";
  for (const std::string flag : {"--window", "--window-size"}) {
    // Each message starts with the flag as typed; "--window '" alone would also match the
    // prefix of "--window-size '", so the whole token is checked.
    const std::string other = flag == "--window" ? "--window-size '" : "--window '";
    for (const auto& [value, why] : {std::pair<std::string, std::string>{"5", "LEFT,RIGHT"},
                                     {"5,x", "LEFT,RIGHT"},
                                     {"-2,3", "window.left = -2"},
                                     {"1,-7", "window.right = -7"}}) {
      require_failure(dir, run + flag + " " + value, {flag + " '" + value + "'", why});
      CHECK(attnlab_cli(dir, run + flag + " " + value).err.find(other) == std::string::npos);
    }
    // attnlab mask: bigbird's layout takes no window, said with the flag as typed.
    std::filesystem::remove(dir.file("m.png"));
    require_failure(dir, "mask --spec bigbird --n 64 --out m.png " + flag + " 3,3",
                    {"mask: " + flag + " draws the tile classes"});
    CHECK_FALSE(std::filesystem::exists(dir.file("m.png")));
  }
  require_failure(dir, run + "--window 1,1 --window-size 2,2", {"--window", "--window-size"});
}

TEST_CASE("decode prints its summary; report renders a decode folder again", "[cli][decoding]") {
  TempDir dir("cli-decode");
  const CliResult r = attnlab_cli(
      dir,
      "decode --out res --variant full --variant gla --contexts 32,64 --dims 8 --kv-heads 1 "
      "--heads 2 --steps 2 --prefill none --bandwidth-mib 1 --quiet");
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("Decode sweep of res: streaming read bandwidth") != std::string::npos);
  CHECK(r.out.find("Decoding, B=1 H=2 Hkv=1 D=8:") != std::string::npos);
  CHECK(r.out.find("\n  gla ") != std::string::npos);
  std::filesystem::remove(dir.file("res/report.md"));
  const CliResult again = attnlab_cli(dir, "report res");
  CHECK(again.code == 0);
  CHECK(read_text(dir.file("res/report.md")).find("## Speed checks") != std::string::npos);
}

TEST_CASE("bad input exits 2 with one line naming the problem and writes nothing", "[cli]") {
  TempDir dir("cli");
  const Tensor q = random_tensor(2, 2, 6, 4, 21);
  save(dir, "q.npy", q), save(dir, "k.npy", q), save(dir, "v.npy", q);
  const std::string base = "run --spec full --q q.npy --k k.npy --v v.npy --out o.npy";
  const auto with = [&](const std::string& a, const std::string& b) {
    std::string s = base;
    return s.replace(s.find(a), a.size(), b);
  };

  require_failure(dir, with("--q q.npy", "--q missing.npy"), {"missing.npy", "no such file"});

  const std::string bytes = read_text(dir.file("k.npy"));
  std::ofstream(dir.file("trunc.npy"), std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  require_failure(dir, with("--k k.npy", "--k trunc.npy"), {"trunc.npy", "truncated"});

  write_npy_raw(dir.file("i4.npy"), "<i4", "2, 2, 6, 4",
                raw_bytes(std::vector<std::int32_t>(96, 1)));
  require_failure(dir, with("--v v.npy", "--v i4.npy"), {"i4.npy", "dtype '<i4'", "float32"});

  save(dir, "k5.npy", random_tensor(2, 2, 6, 5, 22));
  require_failure(dir, with("--k k.npy", "--k k5.npy"), {"Dk"});
  save(dir, "v3.npy", random_tensor(1, 2, 6, 4, 23), 3);
  require_failure(dir, with("--v v.npy", "--v v3.npy"), {"v3.npy", "same rank"});

  std::vector<float> nan(96, 0.5f);
  nan[50] = std::nanf("");
  write_npy_raw(dir.file("nan.npy"), "<f4", "2, 2, 6, 4", raw_bytes(nan));
  require_failure(dir, with("--q q.npy", "--q nan.npy"), {"nan.npy", "NaN at index [1, 0, 0, 2]"});

  require_failure(dir, with("--spec full", "--spec fulll"), {"'fulll'", "unknown variant"});
  require_failure(dir, with("--spec full", "--spec full:window=3"), {"window=3", "unknown key"});
  require_failure(dir, base + " --key-lengths 5,x", {"--key-lengths '5,x'", "'x'"});
  require_failure(dir, base + " --key-lengths 5", {"key_lengths has 1 entries", "batch"});
  require_failure(dir, base + " --key-lengths 5,7", {"key_lengths[1] = 7", "Nk = 6"});
  require_failure(dir, base + " --causal sideways", {"causal mode 'sideways'", "top-left"});
  require_failure(dir, base + " --scale -1", {"scale", "> 0"});
  require_failure(dir, base + " --scale abc", {"--scale", "abc"});
  require_failure(dir, base + " --mask q.npy", {"q.npy", "dtype '<f4'", "mask"});
  write_npy_raw(dir.file("m.npy"), "|b1", "6, 5", std::string(30, '\1'));
  require_failure(dir, base + " --mask m.npy", {"boolean mask", "[Nq, Nk] = [6, 6]"});
  require_failure(dir, "run --spec full --q q.npy --k k.npy --v v.npy", {"--out", "required"});
  require_failure(dir, with("--out o.npy", "--out no-dir/o.npy"), {"no-dir/o.npy", "cannot write"});
}
