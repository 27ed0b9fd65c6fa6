// `attnlab run` options of the linformer variant: learned projection matrices.
//   --E e.npy [--F f.npy]   [k, max_len] (shared by all heads) or [H, k, max_len] (one per head),
//                           k and max_len as in --spec; --F defaults to --E (E = F, the paper's
//                           key-value sharing). float32 or float64 .npy.
#include <memory>
#include <string>

#include "attnlab/attnlab.hpp"
#include "attnlab/npy.hpp"
#include "cli/run.hpp"
#include "variants/linformer.hpp"

namespace attnlab::cli {

RunHook add_linformer_run_options(CLI::App& run) {
  struct Files {
    std::string e, f;
  };
  auto files = std::make_shared<Files>();
  run.add_option("--E", files->e,
                 "linformer only: learned key projection .npy, [k, max_len] or [H, k, max_len]");
  run.add_option("--F", files->f,
                 "linformer only: learned value projection .npy, shaped like --E (default: --E)");
  return [files](std::unique_ptr<Attention>& attention) {
    if (files->e.empty() && files->f.empty()) return;
    auto* linformer = dynamic_cast<LinformerAttention*>(attention.get());
    if (linformer == nullptr)
      throw Error("--E/--F: learned projections are for linformer specs only, not '" +
                  attention->spec() + "'");
    if (files->e.empty())
      throw Error("--F " + files->f + ": give --E as well (--F alone is ambiguous)");
    const xt::xarray<float> e = load_npy_float(files->e, {2, 3});
    const xt::xarray<float> f = files->f.empty() ? e : load_npy_float(files->f, {2, 3});
    try {
      linformer->set_projections(e, f);
    } catch (const Error& error) {
      throw Error("--E " + files->e + (files->f.empty() ? "" : " --F " + files->f) + ": " +
                  error.what());
    }
  };
}

}  // namespace attnlab::cli
