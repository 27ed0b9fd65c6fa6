// Factory strings: "name:key=value,key=value". One central table (factory.cpp) maps names to
// makers; each variant exports make_<name>(Params&). Unknown names, unknown keys, malformed
// values and broken constraints throw Error quoting the token and the whole string.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/attention.hpp"

namespace attnlab {

/// A parsed factory string. Makers read keys through the typed getters (which also check
/// them); make_attention then rejects any key no maker read.
class Params {
 public:
  explicit Params(std::string_view spec);

  const std::string& name() const { return name_; }
  const std::string& spec() const { return spec_; }

  std::int64_t integer(const std::string& key, std::int64_t fallback);
  double number(const std::string& key, double fallback);
  std::string choice(const std::string& key, const std::string& fallback,
                     std::initializer_list<std::string_view> options);

  /// Throws Error: "<spec>: <key>=<value>: <why>".
  [[noreturn]] void fail(const std::string& key, const std::string& why) const;

  /// Throws Error for the first key that no getter read.
  void check_all_used() const;

 private:
  const std::string* find(const std::string& key);
  std::string spec_, name_;
  std::map<std::string, std::string> values_;
  std::set<std::string> used_;
};

/// Builds canonical spec strings: SpecWriter("bigbird").add("block", 64).str().
class SpecWriter {
 public:
  explicit SpecWriter(std::string name) : out_(std::move(name)) {}
  SpecWriter& add(const std::string& key, std::int64_t value);
  SpecWriter& add(const std::string& key, double value);  // shortest text that round-trips
  SpecWriter& add(const std::string& key, const std::string& value);
  const std::string& str() const { return out_; }

 private:
  std::string out_;
  bool first_ = true;
};

std::unique_ptr<Attention> make_attention(std::string_view spec);

/// The names in the factory table, in table order.
std::vector<std::string> attention_names();

}  // namespace attnlab
