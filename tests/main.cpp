// Catch2's runner, plus two rules: the tests run on the OpenBLAS core attnlab's programs pick
// (blas::use_fitting_core, as cli/main.cpp: the CLI a test starts then reports the same BLAS as
// the test), and for the per-path runs of tests/meson.build, under ATTNLAB_ISA a kernel path
// this CPU cannot run (or a bf16 path this build has no kernels for) is a skipped test (exit 77,
// with the reason), not a failure.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>

#include "attnlab/blas.hpp"
#include "attnlab/kernels.hpp"

int main(int argc, char** argv) {
  attnlab::blas::use_fitting_core(argv);  // may re-execute us once, with OPENBLAS_CORETYPE set
  if (const char* isa = std::getenv("ATTNLAB_ISA"); isa && *isa) {
    namespace k = attnlab::kernels;
    if (k::Bf16Path path; k::parse_bf16_path(isa, path)) {
      if (!k::bf16_path_supported(path)) {  // the CPU, or this build, lacks it: say which
        std::printf("ATTNLAB_ISA=%s: %s; skipped\n", isa,
                    k::cpu_has_bf16_path(path) ? "this build has no kernels for that bf16 path"
                                               : "this CPU lacks that bf16 path's instructions");
        return 77;
      }
    } else if (!k::isa_supported(k::parse_isa(isa))) {
      std::printf("ATTNLAB_ISA=%s: this CPU cannot run that kernel path; skipped\n", isa);
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
