// Factory strings: "name:key=value,key=value". A registry maps names to makers: each variant
// exports make_<name>(Params&) and registers it from its own .cpp with one AttentionRegistrar,
// so lib/ knows no variant and a new variant touches only its own files. Unknown names, unknown
// keys, malformed values and broken constraints throw Error quoting the token and the whole
// string.
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
  /// Splits "name:key=value,..."; throws Error for a missing name, a token that is not
  /// key=value, or a key given twice.
  explicit Params(std::string_view spec);

  /// The variant name, before ':'.
  const std::string& name() const { return name_; }
  /// The whole string as given.
  const std::string& spec() const { return spec_; }

  /// The integer value of `key`, or `fallback` when absent; Error when it is not an integer.
  std::int64_t integer(const std::string& key, std::int64_t fallback);
  /// The number value of `key`, or `fallback` when absent; Error when it is not a number.
  double number(const std::string& key, double fallback);
  /// The value of `key`, one of `options`, or `fallback` when absent; Error otherwise.
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
  /// Starts the string with the variant name.
  explicit SpecWriter(std::string name) : out_(std::move(name)) {}
  /// Appends key=value (the first with ':', the rest with ',').
  SpecWriter& add(const std::string& key, std::int64_t value);
  /// Appends key=value in the shortest text that reads back as the same double.
  SpecWriter& add(const std::string& key, double value);
  /// Appends key=value as given.
  SpecWriter& add(const std::string& key, const std::string& value);
  /// The string so far.
  const std::string& str() const { return out_; }

 private:
  std::string out_;
  bool first_ = true;
};

/// Builds the backend a factory string names (see the header comment); throws Error for an
/// unknown name or key, a malformed value or a broken constraint.
std::unique_ptr<Attention> make_attention(std::string_view spec);

/// The registered names, in listing order (full, bigbird, linformer, sliding, linear today).
std::vector<std::string> attention_names();

/// A variant's maker: reads its keys from the Params (which checks them) and builds the backend.
using AttentionMaker = std::unique_ptr<Attention> (*)(Params&);

/// Adds a variant to the registry. `position` orders attention_names() and the --help listing
/// (ascending; static initialisation order across files is unspecified, so it is explicit).
/// Throws Error when the name is empty or already registered.
void register_attention(const std::string& name, AttentionMaker make, int position);

/// Registers a variant at static-initialisation time: one namespace-scope object in the
/// variant's .cpp, e.g. `const AttentionRegistrar kRegistrar("full", make_full, 10);`. The
/// registry itself is a function-local static, so it exists before the first registrar runs.
/// In a static attnlab (default_library=static) link with --whole-archive: the linker drops
/// object files nothing references, and their registrars with them.
struct AttentionRegistrar {
  /// Calls register_attention(name, make, position).
  AttentionRegistrar(const std::string& name, AttentionMaker make, int position) {
    register_attention(name, make, position);
  }
};

}  // namespace attnlab
