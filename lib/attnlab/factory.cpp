#include "attnlab/factory.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "attnlab/error.hpp"

namespace attnlab {
namespace {

struct Entry {
  std::string name;
  AttentionMaker make;
  int position;
};

// The registry, filled by the variants' registrars; sorted by position. A function-local static,
// so it is constructed on first use, before any registrar (in any file) writes to it.
std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t") - b + 1));
}

}  // namespace

Params::Params(std::string_view spec) : spec_(spec) {
  const auto colon = spec.find(':');
  name_ = trim(spec.substr(0, colon));
  if (name_.empty()) throw Error("attention spec '" + spec_ + "': missing variant name");
  if (colon == std::string_view::npos) return;
  std::string_view rest = spec.substr(colon + 1);
  while (true) {
    const auto comma = rest.find(',');
    const std::string token = trim(rest.substr(0, comma));
    const auto eq = token.find('=');
    if (eq == std::string::npos || trim(std::string_view(token).substr(0, eq)).empty())
      throw Error("attention spec '" + spec_ + "': token '" + token + "' is not key=value");
    const std::string key = trim(std::string_view(token).substr(0, eq));
    if (!values_.emplace(key, trim(std::string_view(token).substr(eq + 1))).second)
      throw Error("attention spec '" + spec_ + "': key '" + key + "' given twice");
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
}

const std::string* Params::find(const std::string& key) {
  const auto it = values_.find(key);
  if (it == values_.end()) return nullptr;
  used_.insert(key);
  return &it->second;
}

void Params::fail(const std::string& key, const std::string& why) const {
  const auto it = values_.find(key);
  const std::string token = it == values_.end() ? key : key + "=" + it->second;
  throw Error("attention spec '" + spec_ + "': " + token + ": " + why);
}

std::int64_t Params::integer(const std::string& key, std::int64_t fallback) {
  const std::string* text = find(key);
  if (!text) return fallback;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || text->empty())
    fail(key, "expected an integer");
  return value;
}

double Params::number(const std::string& key, double fallback) {
  const std::string* text = find(key);
  if (!text) return fallback;
  double value = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || text->empty())
    fail(key, "expected a number");
  return value;
}

std::string Params::choice(const std::string& key, const std::string& fallback,
                           std::initializer_list<std::string_view> options) {
  const std::string* text = find(key);
  if (!text) return fallback;
  std::string expected;
  for (auto o : options) {
    if (*text == o) return *text;
    expected += (expected.empty() ? "" : "|") + std::string(o);
  }
  fail(key, "expected one of " + expected);
}

void Params::check_all_used() const {
  for (const auto& [key, value] : values_)
    if (!used_.count(key)) fail(key, "unknown key for variant '" + name_ + "'");
}

SpecWriter& SpecWriter::add(const std::string& key, const std::string& value) {
  out_ += (first_ ? ":" : ",") + key + "=" + value;
  first_ = false;
  return *this;
}

SpecWriter& SpecWriter::add(const std::string& key, std::int64_t value) {
  return add(key, std::to_string(value));
}

SpecWriter& SpecWriter::add(const std::string& key, double value) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, value);
  return add(key, std::string(buf, res.ptr));
}

void register_attention(const std::string& name, AttentionMaker make, int position) {
  auto& entries = registry();
  if (name.empty() || make == nullptr)
    throw Error("register_attention: a variant needs a name and a maker");
  for (const Entry& e : entries)
    if (e.name == name) throw Error("register_attention: variant '" + name + "' registered twice");
  const auto at = std::upper_bound(entries.begin(), entries.end(), position,
                                   [](int p, const Entry& e) { return p < e.position; });
  entries.insert(at, Entry{name, make, position});
}

std::unique_ptr<Attention> make_attention(std::string_view spec) {
  Params params(spec);
  for (const Entry& e : registry()) {
    if (params.name() != e.name) continue;
    auto attention = e.make(params);
    params.check_all_used();
    return attention;
  }
  std::string known;
  for (const auto& name : attention_names()) known += (known.empty() ? "" : ", ") + name;
  throw Error("attention spec '" + std::string(spec) + "': unknown variant '" + params.name() +
              "' (known: " + known + ")");
}

std::vector<std::string> attention_names() {
  std::vector<std::string> names;
  for (const Entry& e : registry()) names.push_back(e.name);
  return names;
}

}  // namespace attnlab
