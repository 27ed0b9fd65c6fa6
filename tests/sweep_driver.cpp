// A child process for tests/test_sweep.cpp: runs a sweep from a TOML file and, with
// --kill-after K, SIGKILLs itself right after the K-th row is safely appended (a sweep killed
// mid-run); with --crash-at K it raises SIGSEGV as the K-th point of this process starts (a point
// that crashes the process); with --mpi it is what `mpirun -n P` starts.
//   sweep_driver CONFIG OUT_DIR [--kill-after K] [--crash-at K] [--retry-errors] [--shard I/N]
//                [--mpi]
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "harness/mpi.hpp"
#include "harness/sweep.hpp"

int main(int argc, char** argv) {
  using namespace attnlab::harness;
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: sweep_driver CONFIG OUT_DIR [--kill-after K] [--crash-at K] "
                 "[--retry-errors] [--shard I/N] [--mpi]\n");
    return 2;
  }
  try {
    SweepOptions options;
    options.out_dir = argv[2];
    options.progress = nullptr;
    int kill_after = 0, rows = 0, crash_at = 0, points = 0;
    for (int i = 3; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--kill-after" && i + 1 < argc)
        kill_after = std::atoi(argv[++i]);
      else if (arg == "--crash-at" && i + 1 < argc)
        crash_at = std::atoi(argv[++i]);
      else if (arg == "--retry-errors")
        options.retry_errors = true;
      else if (arg == "--shard" && i + 1 < argc)
        options.shard = parse_shard(argv[++i]);
      else if (arg == "--mpi")
        options.mpi = true;
      else
        throw std::runtime_error("unknown argument " + arg);
    }
    if (kill_after > 0)
      options.on_row = [&](const Row&) {
        if (++rows == kill_after) std::raise(SIGKILL);
      };
    if (crash_at > 0)
      options.on_point = [&](const Point&) {
        if (++points == crash_at) std::raise(SIGSEGV);
      };
    run_sweep(load_config(argv[1]), options);
    if (options.mpi) mpi::finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sweep_driver: %s\n", e.what());
    return 2;
  }
  return 0;
}
