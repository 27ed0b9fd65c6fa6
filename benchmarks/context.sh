# Sourced by benchmarks/run_*.sh. bench_context BUILD GIT-DIFF-ARGS... sets the array `context`:
# Google Benchmark --benchmark_context flags naming the commit (with "-dirty" when
# `git diff --quiet GIT-DIFF-ARGS...` finds changes to what the benchmark measures), the
# environment (OPENBLAS_CORETYPE, OMP_NUM_THREADS), compiler, CPU, BUILD's meson options and the
# load average before the run. Scripts append their own fields with context+=(...).
bench_context() {
  local build=$1
  shift
  local flags
  flags=$(meson introspect --buildoptions "$build" 2>/dev/null | /usr/bin/python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(" ".join(f"{k}:{o.get(k)}" for k in ("buildtype", "native", "b_ndebug", "b_sanitize")))' ||
    echo unknown)
  context=(--benchmark_context=git_commit="$(git rev-parse --short HEAD)$(git diff --quiet "$@" || echo -dirty)"
           --benchmark_context=openblas_coretype="${OPENBLAS_CORETYPE:-unset}"
           --benchmark_context=omp_num_threads="${OMP_NUM_THREADS:-unset}"
           --benchmark_context=compiler="$(c++ --version | head -1)"
           --benchmark_context=build="$flags"
           --benchmark_context=cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) x $(nproc)"
           --benchmark_context=load_before="$(cut -d' ' -f1-3 /proc/loadavg)")
}
