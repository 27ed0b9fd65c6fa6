// The fuzzers' bytes as a file the .npy readers can open: an in-memory file (memfd) named by its
// /proc/self/fd path, so no disk is touched and the readers run exactly as on a real file.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

inline std::string memfd_path(const std::uint8_t* data, std::size_t size) {
  static const int fd = memfd_create("fuzz.npy", 0);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    __builtin_trap();
  return "/proc/self/fd/" + std::to_string(fd);
}
