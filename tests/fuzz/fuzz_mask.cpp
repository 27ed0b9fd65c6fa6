// libFuzzer target: the mask file reader (load_npy_mask, mask_to_bhnd and Mask::validate against
// a small problem, as `attnlab run --mask` does). Any file must load or throw attnlab::Error.
#include <cstddef>
#include <cstdint>

#include "attnlab/error.hpp"
#include "attnlab/mask.hpp"
#include "attnlab/npy.hpp"
#include "npy_memfd.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    attnlab::Mask mask;
    mask.allowed =
        attnlab::mask_to_bhnd(attnlab::load_npy_mask(memfd_path(data, size)), "fuzz.npy");
    mask.validate(attnlab::Dims{1, 2, 4, 4, 8, 8});
  } catch (const attnlab::Error&) {
  }
  return 0;
}
