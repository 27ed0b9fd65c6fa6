// Checks shared by the subcommands' options.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace attnlab::cli {

/// For a count, size or seed option of an unsigned type: CLI11 2.1 would wrap "-5" around to
/// 2^64 - 5 (a run of 2^64 steps, or a bad_array_new_length), so a negative number is refused
/// here, before the conversion, with a message naming the option.
inline const CLI::Validator kNotNegative(
    [](std::string& text) -> std::string {
      const auto first = text.find_first_not_of(" \t");
      if (first != std::string::npos && text[first] == '-')
        return "'" + text + "' is negative: expected an integer >= 0";
      return {};
    },
    "INT>=0", "not negative");

}  // namespace attnlab::cli
