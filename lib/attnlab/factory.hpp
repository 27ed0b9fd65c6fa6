// Factory strings: "name:key=value,key=value". A registry maps names to makers: each variant
// exports make_<name>(Params&) and registers it from its own .cpp with one AttentionRegistrar,
// so lib/ knows no variant and a new variant touches only its own files. Unknown names, unknown
// keys, malformed values and broken constraints throw Error quoting the token and the whole
// string. The same Registry and Params serve the training tasks (training/tasks.hpp) and the
// studies (studies/study.hpp): one plugin mechanism and one parser, whose messages name what
// was parsed (SpecKind).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "attnlab/attention.hpp"
#include "attnlab/error.hpp"

namespace attnlab {

/// What a factory string names, for the messages: e.g. "attention spec 'x': unknown variant".
struct SpecKind {
  const char* text;  ///< what the whole string is called ("attention spec", "task")
  const char* name;  ///< what its name names ("variant", "task")
};

/// Attention factory strings (make_attention).
inline constexpr SpecKind kAttentionSpec{"attention spec", "variant"};

/// "a, b, c": names joined for messages and help texts.
inline std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += (text.empty() ? "" : ", ") + n;
  return text;
}

/// A parsed factory string. Makers read keys through the typed getters (which also check
/// them); make_attention then rejects any key no maker read.
class Params {
 public:
  /// Splits "name:key=value,..."; throws Error for a missing name, a token that is not
  /// key=value, or a key given twice. `kind` words the messages.
  explicit Params(std::string_view spec, SpecKind kind = kAttentionSpec);

  /// The name, before ':'.
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

  /// Throws Error: "<kind> '<spec>': <key>=<value>: <why>".
  [[noreturn]] void fail(const std::string& key, const std::string& why) const;

  /// Throws Error for the first key that no getter read: "<kind> '<spec>': unknown key 'k'
  /// (known: the keys the getters asked for, in the order asked)".
  void check_all_used() const;

 private:
  const std::string* find(const std::string& key);
  std::string spec_, name_;
  SpecKind kind_;
  std::map<std::string, std::string> values_;
  std::set<std::string> used_;
  std::vector<std::string> asked_;  // every key a getter asked for, first ask first
};

/// Names mapped to makers, in an explicit order: the one plugin mechanism, for the variants,
/// the training tasks and the studies. Each plugin adds itself from its own .cpp through a
/// Registrar; the registry object is a function-local static of its owner (attention_registry(),
/// training::task_registry(), ...), so it exists before the first registrar runs.
template <class Maker>
class Registry {
 public:
  /// `kind` words the messages: "a task needs a name", "variant 'x' registered twice".
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  /// Adds `make` as `name`. `position` orders names() (ascending; static initialisation order
  /// across files is unspecified, so it is explicit). Throws Error for an empty name or one
  /// registered already.
  void add(const std::string& name, Maker make, int position) {
    if (name.empty()) throw Error("register: a " + kind_ + " needs a name");
    if (find(name)) throw Error("register: " + kind_ + " '" + name + "' registered twice");
    const auto at = std::upper_bound(entries_.begin(), entries_.end(), position,
                                     [](int p, const Entry& e) { return p < e.position; });
    entries_.insert(at, Entry{name, std::move(make), position});
  }

  /// The maker registered as `name`, or nullptr.
  const Maker* find(std::string_view name) const {
    for (const Entry& e : entries_)
      if (e.name == name) return &e.make;
    return nullptr;
  }

  /// The registered names, in order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.name);
    return out;
  }

  /// The makers, in the order of names().
  std::vector<const Maker*> makers() const {
    std::vector<const Maker*> out;
    for (const Entry& e : entries_) out.push_back(&e.make);
    return out;
  }

  /// The maker registered as `name`; throws Error "<what>: unknown <kind> '<name>' (known: ...)".
  const Maker& at(std::string_view name, const std::string& what) const {
    if (const Maker* make = find(name)) return *make;
    throw Error(what + ": unknown " + kind_ + " '" + std::string(name) +
                "' (known: " + join_names(names()) + ")");
  }

 private:
  struct Entry {
    std::string name;
    Maker make;
    int position;
  };
  std::string kind_;
  std::vector<Entry> entries_;
};

/// Registers a plugin at static-initialisation time: one namespace-scope object in the plugin's
/// .cpp, e.g. `const Registrar<TaskMaker> kRegistrar(task_registry(), "mqar", {...}, 10);`.
/// In a static library, link it with --whole-archive: the linker drops object files nothing
/// references, and their registrars with them.
template <class Maker>
struct Registrar {
  /// Calls registry.add(name, make, position).
  Registrar(Registry<Maker>& registry, const std::string& name, Maker make, int position) {
    registry.add(name, std::move(make), position);
  }
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

/// The variants' registry (a function-local static, filled by their registrars).
Registry<AttentionMaker>& attention_registry();

/// Adds a variant to attention_registry(). `position` orders attention_names() and the --help
/// listing (ascending; static initialisation order across files is unspecified, so it is explicit).
/// Throws Error when the name is empty, the maker null, or the name already registered.
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
