// Catch2's runner, plus two rules: the tests run on the OpenBLAS core attnlab's programs pick
// (blas::use_fitting_core, as cli/main.cpp: the CLI a test starts then reports the same BLAS as
// the test), and for the per-path runs of tests/meson.build, under ATTNLAB_ISA a kernel path
// this CPU cannot run is a skipped test (exit 77), not a failure.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>

#include "attnlab/blas.hpp"
#include "attnlab/kernels.hpp"

int main(int argc, char** argv) {
  attnlab::blas::use_fitting_core(argv);  // may re-execute us once, with OPENBLAS_CORETYPE set
  if (const char* isa = std::getenv("ATTNLAB_ISA"); isa && *isa) {
    if (!attnlab::kernels::isa_supported(attnlab::kernels::parse_isa(isa))) {
      std::printf("ATTNLAB_ISA=%s: this CPU cannot run that kernel path; skipped\n", isa);
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
