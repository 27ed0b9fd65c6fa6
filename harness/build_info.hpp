// How this program was built, for meta.json (filled in by harness/meson.build at build time).
#pragma once

#include <string>

namespace attnlab::harness::build_info {

std::string git_describe();  // "git describe --always --dirty" of the source tree when built
std::string compiler();      // "gcc 12.2.0"
std::string flags();         // the options that shape the code: optimisation, -march, sanitizers
std::string build_type();    // meson buildtype

}  // namespace attnlab::harness::build_info
