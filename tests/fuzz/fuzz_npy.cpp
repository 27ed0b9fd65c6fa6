// libFuzzer target: the .npy reader for q, k, v (load_npy_float, then to_bhnd as `attnlab run`
// does). Any file must load or throw attnlab::Error.
#include <cstddef>
#include <cstdint>

#include "attnlab/error.hpp"
#include "attnlab/npy.hpp"
#include "npy_memfd.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto a = attnlab::load_npy_float(memfd_path(data, size));
    attnlab::to_bhnd(a, "fuzz.npy");
  } catch (const attnlab::Error&) {
  }
  return 0;
}
