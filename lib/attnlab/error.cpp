#include "attnlab/error.hpp"

#include <filesystem>
#include <new>

namespace attnlab {

std::string user_message(const std::exception& e) {
  if (dynamic_cast<const Error*>(&e)) return e.what();
  // bad_array_new_length is a bad_alloc: a length computed from sizes too large to allocate.
  if (dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const std::length_error*>(&e))
    return "out of memory: the sizes asked for do not fit (smaller ones need less)";
  if (const auto* f = dynamic_cast<const std::filesystem::filesystem_error*>(&e)) {
    std::string paths = f->path1().string();
    if (!f->path2().empty()) paths += " -> " + f->path2().string();
    return (paths.empty() ? std::string("file system") : paths) + ": " + f->code().message();
  }
  std::string text = e.what();
  for (auto at = text.find("std::"); at != std::string::npos; at = text.find("std::", at))
    text.erase(at, 5);
  return "unexpected error (please report it): " + text;
}

}  // namespace attnlab
