#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, -fsanitize=fuzzer,address,undefined) and runs them:
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (default: 30 s each; spec, config, npy, mask)
# e.g. `scripts/fuzz.sh 3600 npy` fuzzes the .npy reader for an hour. The build folder is
# $FUZZ_BUILD_DIR (default build-fuzz). Each target starts from its seed corpus tests/fuzz/TARGET/
# and keeps what it learns in BUILD/corpus/TARGET/; a crash leaves BUILD/crash-TARGET-* and exits
# non-zero: fix it, then add the input to tests/fuzz/TARGET/ so it stays covered.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
shift || true
TARGETS=("$@")
if ((${#TARGETS[@]} == 0)); then TARGETS=(spec config npy mask); fi
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}

if [[ ! -f $BUILD/build.ninja ]]; then
  CC=clang CXX=clang++ meson setup "$BUILD" -Dfuzzers=enabled -Db_sanitize=address,undefined \
    -Db_lundef=false -Dtests=disabled -Dbenchmarks=disabled -Dmpi=disabled >/dev/null
fi
ninja -C "$BUILD" "${TARGETS[@]/#/tests/fuzz/fuzz_}"

# Huge allocations throw std::bad_alloc (as in a normal build) instead of aborting; leaks and UB
# are findings. One OpenMP thread: the targets are single inputs, small and many.
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
status=0
for t in "${TARGETS[@]}"; do
  mkdir -p "$BUILD/corpus/$t"
  echo "fuzz: $t for ${SECONDS_EACH}s"
  "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$BUILD/crash-$t-" "$BUILD/corpus/$t" "tests/fuzz/$t" \
    2>"$BUILD/fuzz-$t.log" || { status=1; tail -n 40 "$BUILD/fuzz-$t.log"; }
  grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$BUILD/fuzz-$t.log" || true
done
exit $status
