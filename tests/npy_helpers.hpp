// Test helpers for .npy files: a scratch directory and a writer of raw .npy bytes, so the tests
// can build files numpy would write (float64, bool, uint8, format 2.0) and broken ones.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace attnlab::test {

/// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("attnlab-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// The bytes of element values in the host's (little-endian) order.
template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  std::string s(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(s.data(), values.data(), s.size());
  return s;
}

/// Writes a .npy file with the given header fields and data bytes, padded as numpy pads it.
/// `shape` is the tuple text without parentheses, e.g. "2, 3" or "4,".
inline void write_npy_raw(const std::string& path, const std::string& descr,
                          const std::string& shape, const std::string& data, bool fortran = false,
                          int major = 1) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                     ", 'shape': (" + shape + "), }";
  const std::size_t prefix = major == 1 ? 10 : 12;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  const std::size_t n = dict.size();
  bytes += static_cast<char>(n & 0xff);
  bytes += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) {
    bytes += static_cast<char>((n >> 16) & 0xff);
    bytes += static_cast<char>((n >> 24) & 0xff);
  }
  std::ofstream(path, std::ios::binary) << bytes << dict << data;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace attnlab::test
