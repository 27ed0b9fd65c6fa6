// The OpenBLAS core attnlab asks for (blas::fitting_core) from a table of (core, CPU flags)
// cases, so the decision is covered on machines where OpenBLAS recognises the CPU; and what
// blas::info() reports for this process. OPENBLAS_CORETYPE is never changed here: the choice
// takes effect only when OpenBLAS loads (use_fitting_core re-executes the program for it).
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "attnlab/blas.hpp"

using namespace attnlab;

namespace {

// /proc/cpuinfo flags of real CPUs, cut to the ones that matter and some around them.
constexpr const char* kSse = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt";
constexpr const char* kAvx = "fpu sse sse2 sse4_2 avx xsave";
constexpr const char* kAvx2 = "fpu sse4_2 avx avx2 fma bmi1 bmi2 f16c";
constexpr const char* kAvx2NoFma = "fpu sse4_2 avx avx2";
// Skylake-SP, Ice Lake: AVX-512 F/BW/DQ/VL without BF16.
constexpr const char* kAvx512 = "avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl";
// Cooper Lake, Sapphire Rapids, Zen 4/5: with BF16.
constexpr const char* kAvx512Bf16 =
    "avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 amx_tile";
// Knights Landing: AVX-512 F without BW/DQ/VL, which SkylakeX's kernels need.
constexpr const char* kAvx512FOnly = "avx avx2 fma avx512f avx512cd avx512er avx512pf";

}  // namespace

TEST_CASE("fitting_core: a weaker core than the CPU supports is raised to the CPU's level",
          "[blas]") {
  struct Case {
    const char* core;
    const char* flags;
    const char* expected;  // "" = keep
  };
  const Case cases[] = {
      // OpenBLAS 0.3.21's fallbacks on CPUs it does not know (issue 17: Sapphire Rapids).
      {"Prescott", kAvx512Bf16, "Cooperlake"},
      {"Prescott", kAvx512, "SkylakeX"},
      {"Nehalem", kAvx512, "SkylakeX"},
      {"Unknown", kAvx2, "Haswell"},
      {"Core2", kAvx2, "Haswell"},
      {"Barcelona", kAvx, "Sandybridge"},
      {"Sandybridge", kAvx2, "Haswell"},
      {"Zen", kAvx512Bf16, "Cooperlake"},  // Zen 4/5 named Zen: its kernels are AVX2
      {"Haswell", kAvx512, "SkylakeX"},
      {"prescott", kAvx2, "Haswell"},  // OpenBLAS compares names without case
      // Kept: the core is at the CPU's level or above it.
      {"Haswell", kAvx2, ""},
      {"Zen", kAvx2, ""},
      {"SkylakeX", kAvx512, ""},
      {"SkylakeX", kAvx512Bf16, ""},  // same sgemm kernels as Cooperlake
      {"Cooperlake", kAvx512Bf16, ""},
      {"SapphireRapids", kAvx512Bf16, ""},
      {"Sandybridge", kAvx, ""},
      {"Nehalem", kSse, ""},        // nothing better for an SSE-only CPU
      {"Haswell", kAvx2NoFma, ""},  // no FMA: the CPU is at the AVX level, below Haswell
      {"Nehalem", kAvx2NoFma, "Sandybridge"},
      {"Haswell", kAvx512FOnly, ""},  // AVX-512 F alone is not SkylakeX's level
      {"Nehalem", kAvx512FOnly, "Haswell"},
      // Kept: names this table does not know (other architectures, later OpenBLAS versions).
      {"neoversen1", kAvx512, ""},
      {"POWER9", kAvx2, ""},
      {"GraniteRapids", kAvx512Bf16, ""},
      {"", kAvx512, ""},
      // No flags (no /proc/cpuinfo): keep.
      {"Prescott", "", ""},
  };
  for (const Case& c : cases) {
    INFO("core '" << c.core << "', flags '" << c.flags << "'");
    CHECK(blas::fitting_core(c.core, c.flags) == c.expected);
  }
}

TEST_CASE("fitting_core never names a core that needs flags the CPU lacks", "[blas]") {
  // A forced core above the CPU's level would die on an illegal instruction.
  CHECK(blas::fitting_core("Prescott", "avx512bw avx512dq avx512vl avx2 fma") == "Haswell");
  CHECK(blas::fitting_core("Prescott", "avx512f avx512bw avx512vl avx512_bf16 avx") ==
        "Sandybridge");
  CHECK(blas::fitting_core("Prescott", "avx2") == "");  // AVX2 without AVX: not a real CPU
}

TEST_CASE("info reports this process's OpenBLAS and who chose its core", "[blas]") {
  const blas::Info i = blas::info();
  CHECK(!i.corename.empty());
  CHECK(i.threads >= 1);
  CHECK(i.config.find("OpenBLAS") != std::string::npos);
  CHECK(i.better == blas::fitting_core(i.corename, blas::cpu_flags()));
  CHECK((i.threading == "OpenMP" || i.threading == "pthreads" || i.threading == "sequential"));
  CHECK((i.threading == "OpenMP") == (i.config.find("USE_OPENMP") != std::string::npos));
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  CHECK(i.coretype == (coretype ? coretype : ""));
  if (!coretype || !*coretype) {
    CHECK(i.source == blas::CoreSource::openblas);
    CHECK(i.detected == i.corename);
  } else {
    CHECK(i.source != blas::CoreSource::openblas);
    if (i.source == blas::CoreSource::user) CHECK(i.detected.empty());
  }
  const std::string text = blas::describe(i);
  CHECK(text.find("core " + i.corename) != std::string::npos);
  CHECK(text.find(std::to_string(i.threads) + " thread") != std::string::npos);
  CHECK(text.find(i.source == blas::CoreSource::user ? "set by the user"
                  : i.source == blas::CoreSource::attnlab
                      ? "set by attnlab"
                      : "detected by OpenBLAS") != std::string::npos);
  CHECK(std::string(blas::source_name(i.source)) == (i.source == blas::CoreSource::user ? "user"
                                                     : i.source == blas::CoreSource::attnlab
                                                         ? "attnlab"
                                                         : "openblas"));
}

TEST_CASE("describe says who chose the core, and the better one the CPU supports", "[blas]") {
  blas::Info i;
  i.config = "OpenBLAS 0.3.21 DYNAMIC_ARCH";
  i.corename = "Cooperlake";
  i.threads = 2;
  i.source = blas::CoreSource::attnlab;
  i.coretype = "Cooperlake";
  i.detected = "Prescott";
  CHECK(blas::describe(i) ==
        "OpenBLAS 0.3.21 DYNAMIC_ARCH, core Cooperlake, 2 threads (OPENBLAS_CORETYPE=Cooperlake "
        "set by attnlab: OpenBLAS detected Prescott)");
  i = {};
  i.config = "OpenBLAS";
  i.corename = "Haswell";
  i.threads = 1;
  i.source = blas::CoreSource::user;
  i.coretype = "Haswell";
  i.better = "SkylakeX";
  CHECK(blas::describe(i) ==
        "OpenBLAS, core Haswell, 1 thread (OPENBLAS_CORETYPE=Haswell set by "
        "the user; this CPU supports SkylakeX)");
  i.source = blas::CoreSource::openblas;
  i.coretype = "";
  i.corename = i.detected = "Prescott";
  CHECK(blas::describe(i) ==
        "OpenBLAS, core Prescott, 1 thread (detected by OpenBLAS, "
        "OPENBLAS_CORETYPE unset; this CPU supports SkylakeX)");
  i.threading = "pthreads";
  CHECK(blas::describe(i) ==
        "OpenBLAS, core Prescott, pthreads, 1 thread (detected by "
        "OpenBLAS, OPENBLAS_CORETYPE unset; this CPU supports SkylakeX)");
}

TEST_CASE("two thread pools compete only for pthreads OpenBLAS and OpenMP, both threaded",
          "[blas]") {
  blas::Info i;
  i.threads = 2;
  i.threading = "pthreads";
  CHECK(blas::competing_thread_pools(i, 2));
  CHECK_FALSE(blas::competing_thread_pools(i, 1));  // OMP_NUM_THREADS=1
  i.threads = 1;                                    // OPENBLAS_NUM_THREADS=1
  CHECK_FALSE(blas::competing_thread_pools(i, 2));
  i.threads = 2;
  for (const char* one_pool : {"OpenMP", "sequential"}) {
    i.threading = one_pool;
    CHECK_FALSE(blas::competing_thread_pools(i, 2));
  }
}
