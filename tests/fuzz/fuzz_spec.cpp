// libFuzzer target: the factory string parser (attnlab::make_attention). Any input must give a
// backend whose spec() round-trips, or an attnlab::Error; nothing else (crash, leak, UB, another
// exception type) is allowed. scripts/fuzz.sh builds and runs it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "attnlab/attnlab.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto attention = attnlab::make_attention(text);
    const std::string canonical = attention->spec();
    if (attnlab::make_attention(canonical)->spec() != canonical) __builtin_trap();
  } catch (const attnlab::Error&) {
  }
  return 0;
}
