// What BLAS attnlab's matrix products run on, and the OpenBLAS core that fits this CPU.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels once, when it loads: the core
// named by OPENBLAS_CORETYPE, else the one its CPU detection finds. On a CPU it does not know
// (0.3.21 on Sapphire Rapids, Zen 4/5) the detection falls back to Prescott- or Zen-era kernels
// and every GEMM runs 3-5x slower than the CPU allows. fitting_core() says which core the CPU
// supports; attnlab's programs call use_fitting_core() first thing in main, which re-executes the
// program once with OPENBLAS_CORETYPE set (the only moment the variable takes effect). A value
// the user set is never overridden. Code that links the library without that call (a user's
// program) gets one warning on stderr, from warn_if_slow(), naming the variable to set.
//
// OpenBLAS's pthreads build (Debian's default) keeps a pool of threads of its own that spin
// between calls; beside the OpenMP threads of attnlab's kernels the two pools take turns on the
// same cores (a 2-layer training step ran up to twice as slow on 2 cores). Its OpenMP build
// runs on OpenMP's threads; scripts/install-deps.sh selects it, and warn_if_slow() names it.
#pragma once

#include <string>
#include <string_view>

namespace attnlab::blas {

/// Who chose the OpenBLAS core this process runs.
enum class CoreSource {
  openblas,  ///< OPENBLAS_CORETYPE unset: OpenBLAS's own CPU detection
  user,      ///< OPENBLAS_CORETYPE set by the user (or whoever started us): never overridden
  attnlab,   ///< OPENBLAS_CORETYPE set by use_fitting_core() before it re-executed the program
};

/// "openblas", "user" or "attnlab".
const char* source_name(CoreSource source);

/// What BLAS runs in this process.
struct Info {
  std::string corename;  ///< openblas_get_corename(): the kernels in use ("Haswell", "Prescott")
  int threads = 0;       ///< openblas_get_num_threads()
  std::string config;    ///< openblas_get_config(): version and build options
  CoreSource source = CoreSource::openblas;  ///< who chose `corename`
  std::string coretype;                      ///< OPENBLAS_CORETYPE's value, "" when unset
  /// What OpenBLAS's detection picked on its own: `corename` when source is openblas, the core
  /// it reported before the re-execution when attnlab, "" when the user chose (not known).
  std::string detected;
  /// fitting_core(corename, this CPU's flags): the better core this CPU supports, "" if none.
  std::string better;
  /// How OpenBLAS runs its threads (openblas_get_parallel()): "OpenMP", "pthreads" or
  /// "sequential".
  std::string threading;
};

/// This process's BLAS. Reads the environment and /proc/cpuinfo on each call.
Info info();

/// One line for --version, summaries and logs, e.g. "OpenBLAS 0.3.21 ... core SkylakeX, OpenMP,
/// 2 threads (OPENBLAS_CORETYPE=SkylakeX set by attnlab: OpenBLAS detected Prescott)".
std::string describe(const Info& info);

/// The OpenBLAS core (an OPENBLAS_CORETYPE value) whose kernels fit a CPU with `cpu_flags`
/// (the space-separated "flags" of /proc/cpuinfo) better than `corename`, or "" to keep
/// `corename`: Cooperlake with AVX-512 F/BW/DQ/VL and BF16, SkylakeX with AVX-512 F/BW/DQ/VL,
/// Haswell with AVX2 + FMA, Sandybridge with AVX. Kept: a core at or above the CPU's level, and
/// any core name this table does not know (another architecture, a newer OpenBLAS's name).
/// Haswell stands for the AVX2 level on AMD too: OpenBLAS's Zen core uses Haswell's sgemm.
std::string fitting_core(std::string_view corename, std::string_view cpu_flags);

/// The "flags" line of the first processor in /proc/cpuinfo ("" where there is none).
std::string cpu_flags();

/// The "model name" line of the first processor in /proc/cpuinfo ("" where there is none).
std::string cpu_model();

/// For main() of attnlab's programs, before anything else: when OPENBLAS_CORETYPE is unset and
/// fitting_core() names a better core than OpenBLAS chose, sets OPENBLAS_CORETYPE to it (and a
/// marker naming the detected core, which info() reports) and re-executes /proc/self/exe with
/// `argv`. Returns without doing anything otherwise; a failed exec prints one warning and
/// returns. The re-executed program finds the variable set and does not loop.
void use_fitting_core(char** argv);

/// Whether OpenBLAS's own pool of threads runs beside `omp_threads` OpenMP threads: its
/// pthreads build with more than one thread while OpenMP has more than one.
bool competing_thread_pools(const Info& info, int omp_threads);

/// Prints on stderr, once per process (the library's matrix products call it), a warning when
/// OpenBLAS's own detection chose a core weaker than this CPU supports (silent when the user or
/// attnlab set OPENBLAS_CORETYPE), and one when competing_thread_pools() with OpenMP's threads.
void warn_if_slow();

}  // namespace attnlab::blas
