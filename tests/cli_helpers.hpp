// Runs the attnlab executable (path in $ATTNLAB_CLI, set by meson test) in a scratch directory,
// for the end-to-end tests.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "npy_helpers.hpp"

namespace attnlab::test {

struct CliResult {
  int code = -1;
  std::string out, err;
};

/// `attnlab <args>` with the working directory `dir`: exit code, stdout and stderr. `prefix` goes
/// before the executable (e.g. "ulimit -f 1;" or a command that drops privileges).
inline CliResult attnlab_cli(const TempDir& dir, const std::string& args,
                             const std::string& prefix = "") {
  const char* exe = std::getenv("ATTNLAB_CLI");
  if (exe == nullptr) FAIL("ATTNLAB_CLI is not set: run this test through `meson test`");
  const std::string cmd = "cd '" + dir.path().string() + "' && " + prefix + " '" + exe + "' " +
                          args + " >stdout.txt 2>stderr.txt </dev/null";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(dir.file("stdout.txt")),
          read_text(dir.file("stderr.txt"))};
}

}  // namespace attnlab::test
