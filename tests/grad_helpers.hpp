// Gradient checks shared by the backward tests: central finite differences in float64 and
// PyTorch autograd (tests/torch_grads.py through /usr/bin/python3), two references that share
// no code with our kernels.
#pragma once

#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <xtensor/xarray.hpp>

#include "attnlab/attnlab.hpp"
#include "attnlab/npy.hpp"
#include "helpers.hpp"
#include "npy_helpers.hpp"

namespace attnlab::test {

using Arrays64 = std::vector<xt::xarray<double>>;

/// d(sum(f(x) ∘ w))/dx for every element of every input x, by central differences in float64:
/// (L(x + h) - L(x - h)) / 2h. For smooth f the error is O(h²) truncation plus O(eps·|L|/h)
/// rounding: about 1e-10 at the default h = 1e-5 for losses of size ~10.
inline Arrays64 central_differences(const std::function<xt::xarray<double>(const Arrays64&)>& f,
                                    Arrays64 x, const xt::xarray<double>& w, double h = 1e-5) {
  const auto loss = [&] { return xt::sum(f(x) * w)(); };
  Arrays64 grads;
  for (auto& input : x) {
    xt::xarray<double> g = xt::zeros<double>(input.shape());
    for (std::size_t i = 0; i < input.size(); ++i) {
      const double keep = input.data()[i];
      input.data()[i] = keep + h;
      const double up = loss();
      input.data()[i] = keep - h;
      const double down = loss();
      input.data()[i] = keep;
      g.data()[i] = (up - down) / (2 * h);
    }
    grads.push_back(std::move(g));
  }
  return grads;
}

/// |got - want| <= atol + rtol · |want| element by element; names the array and the first
/// element that fails.
inline void require_close_grad(const xt::xarray<double>& got, const xt::xarray<double>& want,
                               double rtol, double atol, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got.data()[i], r = want.data()[i];
    if (!(std::abs(g - r) <= atol + rtol * std::abs(r)))
      FAIL(what << ": element " << i << " is " << g << ", expected " << r << " (rtol " << rtol
                << ", atol " << atol << ")");
  }
}

/// Cases collected first and differentiated by PyTorch autograd in float64 in one python
/// process (importing torch takes seconds). Each case is a folder of float32 .npy inputs and a
/// case.json; the script writes d<name>.npy for every input it differentiates (float64).
class TorchGrads {
 public:
  TorchGrads() : dir_("torch-grads") {}

  /// A case: `spec` holds "kind" and its parameters (see tests/torch_grads.py); `inputs`
  /// include d_out, the gradient of the loss with respect to the output. Returns its index.
  std::size_t add(const nlohmann::json& spec,
                  const std::vector<std::pair<std::string, xt::xarray<float>>>& inputs) {
    const std::string folder = dir_.file("case" + std::to_string(cases_));
    std::filesystem::create_directories(folder);
    for (const auto& [name, a] : inputs) save_npy(folder + "/" + name + ".npy", a);
    std::ofstream(folder + "/case.json") << spec.dump();
    return cases_++;
  }

  /// Runs every case. False, after a WARN saying why, when python or torch is missing; a
  /// failure inside the script fails the test.
  bool run() {
    const std::string log = dir_.file("log.txt");
    const std::string cmd = "/usr/bin/python3 '" + std::string(ATTNLAB_TORCH_GRADS) + "' '" +
                            dir_.path().string() + "' > '" + log + "' 2>&1";
    const int status = std::system(cmd.c_str());
    const std::string result = read_text(dir_.file("status.json"));
    if (result.empty()) {
      WARN("torch gradients skipped: no result from " << cmd << " (exit " << status
                                                      << "): " << read_text(log));
      return false;
    }
    const nlohmann::json j = nlohmann::json::parse(result);
    if (j["status"] == "skipped") {
      WARN("torch gradients skipped: " << j["message"].get<std::string>());
      return false;
    }
    INFO(read_text(log));
    REQUIRE(j["status"] == "ok");
    return true;
  }

  /// d(sum(out ∘ d_out))/d(input) of case i, as computed by torch.
  xt::xarray<double> grad(std::size_t i, const std::string& input) const {
    return xt::cast<double>(load_npy_float(
        dir_.file("case" + std::to_string(i) + "/d" + input + ".npy"), {1, 2, 3, 4}));
  }

 private:
  TempDir dir_;
  std::size_t cases_ = 0;
};

/// Our gradients of one TorchGrads case (ours[i] of the input names[i]), labelled `what`.
struct TorchExpected {
  std::size_t index;
  std::vector<xt::xarray<double>> ours;
  std::vector<std::string> names;
  std::string what;
};

/// Runs torch's cases and requires each expected gradient close to torch's (rtol, atol); when
/// python or torch is missing, run() has warned and nothing is compared.
inline void require_close_to_torch(TorchGrads& torch, const std::vector<TorchExpected>& expected,
                                   double rtol, double atol) {
  if (!torch.run()) return;
  for (const TorchExpected& e : expected)
    for (std::size_t i = 0; i < e.ours.size(); ++i)
      require_close_grad(e.ours[i], torch.grad(e.index, e.names[i]), rtol, atol,
                         e.what + " d" + e.names[i] + " vs torch");
}

/// A dense boolean pattern [B, H, Nq, Nk] as 0/1 floats, for the torch script.
inline xt::xarray<float> dense_pattern(const Pattern& allowed, const Dims& d) {
  xt::xarray<float> a = xt::zeros<float>({d.batch, d.heads, d.nq, d.nk});
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t i = 0; i < d.nq; ++i)
        for (std::size_t j = 0; j < d.nk; ++j) a(b, h, i, j) = allowed(b, h, i, j) ? 1.0f : 0.0f;
  return a;
}

}  // namespace attnlab::test
