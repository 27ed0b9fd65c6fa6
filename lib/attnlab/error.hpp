// Errors: two tiers, as in faiss. User mistakes throw attnlab::Error with a message naming the
// parameter, the value and what was expected; internal invariants use ATTNLAB_ASSERT (debug only).
#pragma once

#include <cassert>
#include <exception>
#include <stdexcept>
#include <string>

namespace attnlab {

/// Bad input from a user: a shape, a parameter, a file or a factory string.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A backend was asked for a mask or option it cannot honour. Never silently ignored.
class Unsupported : public Error {
 public:
  /// "<variant> does not support <feature>" (the feature may end with ": why").
  Unsupported(const std::string& variant, const std::string& feature)
      : Error(variant + " does not support " + feature) {}
};

/// What to tell a user about `e`: an Error's own message; for anything else a sentence of ours,
/// never the standard library's text ("std::bad_alloc", "cannot create std::vector larger than
/// max_size()"): "out of memory", a file system error as "PATH: reason", and any other exception
/// (a bug) as "unexpected error: ..." without its std:: names.
std::string user_message(const std::exception& e);

}  // namespace attnlab

#define ATTNLAB_ASSERT(cond) assert(cond)
