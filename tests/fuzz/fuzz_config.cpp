// libFuzzer target: the TOML sweep config reader (harness::parse_config, which also expands the
// spec lists through the factory). Any input must parse or throw attnlab::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "attnlab/error.hpp"
#include "harness/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    attnlab::harness::parse_config(text, "fuzz.toml");
  } catch (const attnlab::Error&) {
  }
  return 0;
}
