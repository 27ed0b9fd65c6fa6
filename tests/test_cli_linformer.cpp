// `attnlab run --E e.npy [--F f.npy]` end to end (executable in $ATTNLAB_CLI, set by meson test):
// the learned matrices reach the backend, and every misuse is one line on stderr with exit 2.
#include <algorithm>
#include <filesystem>

#include "attnlab/npy.hpp"
#include "cli_helpers.hpp"
#include "helpers.hpp"
#include "variants/linformer.hpp"

using namespace attnlab;
using attnlab::test::attnlab_cli;
using attnlab::test::CliResult;
using attnlab::test::random_tensor;
using attnlab::test::TempDir;

namespace {

xt::xarray<float> random_matrix(std::vector<std::size_t> shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  xt::xarray<float> m = xt::xarray<float>::from_shape(shape);
  for (float& x : m) x = normal(rng);
  return m;
}

const std::string kSpec = "linformer:k=8,max_len=40";
const std::string kRun = "run --spec " + kSpec + " --q q.npy --k k.npy --v v.npy --out o.npy ";

}  // namespace

TEST_CASE("attnlab run --E/--F uses the learned matrices", "[linformer][cli]") {
  TempDir dir("linformer");
  const Tensor q = random_tensor(2, 3, 17, 8, 1), k = random_tensor(2, 3, 33, 8, 2),
               v = random_tensor(2, 3, 33, 8, 3);
  save_npy(dir.file("q.npy"), q);
  save_npy(dir.file("k.npy"), k);
  save_npy(dir.file("v.npy"), v);
  const auto per_head_e = random_matrix({3, 8, 40}, 4), per_head_f = random_matrix({3, 8, 40}, 5);
  const auto shared = random_matrix({8, 40}, 6);
  save_npy(dir.file("e.npy"), per_head_e);
  save_npy(dir.file("f.npy"), per_head_f);
  save_npy(dir.file("shared.npy"), shared);

  const auto expect = [&](const xt::xarray<float>& e, const xt::xarray<float>& f,
                          const std::string& flags) {
    std::filesystem::remove(dir.file("o.npy"));
    const CliResult r = attnlab_cli(dir, kRun + flags);
    INFO("flags: " << flags << "\nstderr: " << r.err);
    REQUIRE(r.code == 0);
    LinformerAttention a(8, LinformerAttention::Share::none, LinformerAttention::Init::gaussian, 40,
                         0);
    a.set_projections(e, f);
    const Tensor expected = a.forward(q, k, v);
    // Same code on the same data: only the OpenMP schedule may differ, so a few ulps.
    CHECK(xt::amax(xt::abs(to_bhnd(load_npy_float(dir.file("o.npy")), "o.npy") - expected))() <=
          1e-6f);
    // And the learned matrices did change the result.
    CHECK(xt::amax(xt::abs(expected - make_attention(kSpec)->forward(q, k, v)))() > 1e-3f);
  };
  expect(per_head_e, per_head_f, "--E e.npy --F f.npy");
  expect(shared, shared, "--E shared.npy");  // --F defaults to --E
}

TEST_CASE("attnlab run --E/--F misuse is one line, exit 2, no output", "[linformer][cli]") {
  TempDir dir("linformer-bad");
  const Tensor x = random_tensor(1, 2, 20, 8, 1);
  for (const char* name : {"q.npy", "k.npy", "v.npy"}) save_npy(dir.file(name), x);
  save_npy(dir.file("e.npy"), random_matrix({8, 40}, 1));
  save_npy(dir.file("short.npy"), random_matrix({8, 39}, 2));
  save_npy(dir.file("heads3.npy"), random_matrix({3, 8, 40}, 3));
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {"--E short.npy", {"--E short.npy", "E has shape [8, 39]", "[8, 40]"}},
      {"--E e.npy --F heads3.npy", {"F has shape [3, 8, 40]", "both must be shared"}},
      {"--F e.npy", {"--F e.npy", "give --E as well"}},
      {"--E missing.npy", {"missing.npy"}},
      {"--E heads3.npy --F heads3.npy", {"3 heads", "input has 2"}},
  };
  for (const auto& [flags, fragments] : cases) {
    std::filesystem::remove(dir.file("o.npy"));
    const CliResult r = attnlab_cli(dir, kRun + flags);
    INFO("flags: " << flags << "\nstderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("attnlab: error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    for (const auto& part : fragments) CHECK(r.err.find(part) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(dir.file("o.npy")));
  }
  const CliResult r = attnlab_cli(dir,
                                  "run --spec full --q q.npy --k k.npy --v v.npy --out o.npy "
                                  "--E e.npy");
  CHECK(r.code == 2);
  CHECK(r.err.find("linformer specs only, not 'full'") != std::string::npos);
}
