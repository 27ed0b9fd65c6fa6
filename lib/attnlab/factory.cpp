#include "attnlab/factory.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "attnlab/error.hpp"

namespace attnlab {
namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t") - b + 1));
}

}  // namespace

Params::Params(std::string_view spec, SpecKind kind) : spec_(spec), kind_(kind) {
  const std::string quoted = std::string(kind_.text) + " '" + spec_ + "'";
  const auto colon = spec.find(':');
  name_ = trim(spec.substr(0, colon));
  if (name_.empty()) throw Error(quoted + ": missing " + kind_.name + " name");
  if (colon == std::string_view::npos) return;
  std::string_view rest = spec.substr(colon + 1);
  while (true) {
    const auto comma = rest.find(',');
    const std::string token = trim(rest.substr(0, comma));
    const auto eq = token.find('=');
    if (eq == std::string::npos || trim(std::string_view(token).substr(0, eq)).empty())
      throw Error(quoted + ": token '" + token + "' is not key=value");
    const std::string key = trim(std::string_view(token).substr(0, eq));
    if (!values_.emplace(key, trim(std::string_view(token).substr(eq + 1))).second)
      throw Error(quoted + ": key '" + key + "' given twice");
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
}

const std::string* Params::find(const std::string& key) {
  if (std::find(asked_.begin(), asked_.end(), key) == asked_.end()) asked_.push_back(key);
  const auto it = values_.find(key);
  if (it == values_.end()) return nullptr;
  used_.insert(key);
  return &it->second;
}

void Params::fail(const std::string& key, const std::string& why) const {
  const auto it = values_.find(key);
  const std::string token = it == values_.end() ? key : key + "=" + it->second;
  throw Error(std::string(kind_.text) + " '" + spec_ + "': " + token + ": " + why);
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
  for (const auto& [key, value] : values_) {
    if (used_.count(key)) continue;
    throw Error(std::string(kind_.text) + " '" + spec_ + "': unknown key '" + key + "' (" +
                (asked_.empty() ? name_ + " takes no keys" : "known: " + join_names(asked_)) + ")");
  }
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

Registry<AttentionMaker>& attention_registry() {
  static Registry<AttentionMaker> registry("variant");
  return registry;
}

void register_attention(const std::string& name, AttentionMaker make, int position) {
  if (make == nullptr) throw Error("register: variant '" + name + "' needs a maker");
  attention_registry().add(name, make, position);
}

std::unique_ptr<Attention> make_attention(std::string_view spec) {
  Params params(spec);
  const AttentionMaker make =
      attention_registry().at(params.name(), "attention spec '" + params.spec() + "'");
  auto attention = make(params);
  params.check_all_used();
  return attention;
}

std::vector<std::string> attention_names() {
  return attention_registry().names();
}

}  // namespace attnlab
