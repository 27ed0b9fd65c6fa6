#include "harness/config.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <functional>
#include <sstream>

#include <toml++/toml.h>

#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/inputs.hpp"
#include "attnlab/mask.hpp"
#include "harness/mask_spec.hpp"
#include "harness/trained_inputs.hpp"

namespace attnlab::harness {
namespace {

constexpr std::size_t kMaxExpansion = 10000;  // specs one pattern may expand to

// "origin:line: key: why"
[[noreturn]] void fail_at(const std::string& origin, const toml::source_region& where,
                          const std::string& key, const std::string& why) {
  throw Error(origin + ":" + std::to_string(where.begin.line) + ": " + key + ": " + why);
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// Splits on commas that are not inside [...].
std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(trim(cur));
  return parts;
}

// A TOML scalar as factory text.
std::string scalar_text(const toml::node& v, const std::string& origin, const std::string& key) {
  if (auto s = v.value_exact<std::string>()) return *s;
  if (auto i = v.value_exact<std::int64_t>()) return std::to_string(*i);
  if (auto b = v.value_exact<bool>()) return *b ? "1" : "0";
  if (auto d = v.value_exact<double>()) {
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, *d);
    return std::string(buf, res.ptr);
  }
  fail_at(origin, v.source(), key, "expected a number or a string");
}

template <class T>
std::vector<T> list_of(const toml::node& v, const std::string& origin, const std::string& key,
                       const char* expected) {
  std::vector<T> out;
  auto one = [&](const toml::node& x) {
    auto value = x.value_exact<T>();
    if (!value) fail_at(origin, x.source(), key, std::string("expected ") + expected);
    out.push_back(*value);
  };
  if (const toml::array* a = v.as_array()) {
    for (const toml::node& x : *a) one(x);
    if (out.empty()) fail_at(origin, v.source(), key, "the list is empty");
  } else {
    one(v);
  }
  return out;
}

// n = [256, 1024] or n = 4096 or n = "256..65536" (the powers of two from 256 to 65536; both
// ends must be powers of two).
std::vector<std::int64_t> int_list(const toml::node& v, const std::string& origin,
                                   const std::string& key) {
  if (auto s = v.value_exact<std::string>()) {
    try {
      return parse_int_list(key, *s);
    } catch (const Error& e) {
      fail_at(origin, v.source(), key, e.what());
    }
  }
  const auto values =
      list_of<std::int64_t>(v, origin, key, "an integer, a list of integers or \"A..B\"");
  for (std::int64_t x : values)
    if (x < 1) fail_at(origin, v.source(), key, std::to_string(x) + " is not a positive integer");
  return values;
}

std::vector<std::string> string_list(const toml::node& v, const std::string& origin,
                                     const std::string& key) {
  return list_of<std::string>(v, origin, key, "a string or a list of strings");
}

std::int64_t integer(const toml::node& v, const std::string& origin, const std::string& key) {
  auto i = v.value_exact<std::int64_t>();
  if (!i) fail_at(origin, v.source(), key, "expected an integer");
  return *i;
}

double number(const toml::node& v, const std::string& origin, const std::string& key) {
  auto d = v.value<double>();  // integers are accepted as numbers
  if (!d) fail_at(origin, v.source(), key, "expected a number");
  return *d;
}

void add_specs(SweepConfig& c, const std::vector<std::string>& specs) {
  for (const auto& s : specs)
    if (std::find(c.specs.begin(), c.specs.end(), s) == c.specs.end()) c.specs.push_back(s);
}

// Runs f, turning an Error into "origin:line: key: message".
template <class F>
auto at(const std::string& origin, const toml::node& v, const std::string& key, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    fail_at(origin, v.source(), key, e.what());
  }
}

void parse_measure(const toml::table& t, const std::string& origin, MeasureOptions& m) {
  for (auto&& [k, v] : t) {
    const std::string key = "measure." + std::string(k.str());
    const std::string_view name = k.str();
    if (name == "warmup")
      m.warmup = static_cast<int>(integer(v, origin, key));
    else if (name == "min_reps")
      m.min_reps = static_cast<int>(integer(v, origin, key));
    else if (name == "max_reps")
      m.max_reps = static_cast<int>(integer(v, origin, key));
    else if (name == "target_seconds")
      m.target_seconds = number(v, origin, key);
    else if (name == "long_call_seconds")
      m.long_call_seconds = number(v, origin, key);
    else if (name == "error_rows")
      m.error_rows = integer(v, origin, key);
    else if (name == "memory_budget")
      m.memory_budget = number(v, origin, key);
    else
      fail_at(origin, k.source(), key,
              "unknown key (known: warmup, min_reps, max_reps, "
              "target_seconds, long_call_seconds, error_rows, memory_budget)");
  }
  const auto& src = t.source();
  if (m.warmup < 0) fail_at(origin, src, "measure.warmup", "must be >= 0");
  if (m.min_reps < 1) fail_at(origin, src, "measure.min_reps", "must be >= 1");
  if (m.max_reps < m.min_reps) fail_at(origin, src, "measure.max_reps", "must be >= min_reps");
  if (!(m.target_seconds > 0)) fail_at(origin, src, "measure.target_seconds", "must be > 0");
  if (!(m.long_call_seconds > 0)) fail_at(origin, src, "measure.long_call_seconds", "must be > 0");
  if (m.error_rows < 1) fail_at(origin, src, "measure.error_rows", "must be >= 1");
  if (!(m.memory_budget > 0)) fail_at(origin, src, "measure.memory_budget", "must be > 0");
}

// [[variant]] spec = "linformer", k = [64, 128], max_n = 16384
void parse_variant_table(const toml::table& t, const std::string& origin, SweepConfig& c) {
  const toml::node* spec = t.get("spec");
  if (!spec || !spec->is_string())
    fail_at(origin, t.source(), "variant.spec", "missing (a string)");
  std::string pattern = *spec->value<std::string>();
  bool first = pattern.find(':') == std::string::npos;
  std::int64_t max_n = 0;
  for (auto&& [k, v] : t) {
    const std::string key(k.str());
    if (key == "spec") continue;
    if (key == "max_n") {
      max_n = integer(v, origin, "variant.max_n");
      continue;
    }
    const std::string where = std::string("variant.").append(key);
    std::string value;
    if (const toml::array* a = v.as_array()) {
      if (a->empty()) fail_at(origin, v.source(), where, "the list is empty");
      for (const toml::node& x : *a)
        value.append(value.empty() ? "[" : ",").append(scalar_text(x, origin, where));
      value += "]";
    } else {
      value = scalar_text(v, origin, where);
    }
    pattern += (first ? ":" : ",") + key + "=" + value;
    first = false;
  }
  const auto specs = at(origin, *spec, "variant.spec", [&] { return expand_spec(pattern); });
  add_specs(c, specs);
  if (max_n > 0)
    for (const auto& s : specs) c.max_n[s] = max_n;
}

}  // namespace

std::vector<std::string> expand_spec(const std::string& pattern) {
  const std::string text = trim(pattern);
  if (text == "*" || text == "all") {
    std::vector<std::string> out;
    for (const auto& name : attention_names()) out.push_back(make_attention(name)->spec());
    return out;
  }
  const auto colon = text.find(':');
  std::vector<std::string> prefixes = {text.substr(0, colon)};
  if (colon != std::string::npos) {
    for (const std::string& token : split_top_level(text.substr(colon + 1))) {
      const auto eq = token.find('=');
      if (eq == std::string::npos)
        throw Error("attention spec '" + text + "': token '" + token + "' is not key=value");
      const std::string key = trim(token.substr(0, eq)), value = trim(token.substr(eq + 1));
      std::vector<std::string> values = {value};
      if (!value.empty() && value.front() == '[') {
        if (value.back() != ']')
          throw Error("attention spec '" + text + "': " + key + "=" + value + ": missing ']'");
        values = split_top_level(value.substr(1, value.size() - 2));
        for (const auto& v : values)
          if (v.empty())
            throw Error("attention spec '" + text + "': " + key + "=" + value + ": empty value");
      }
      if (prefixes.size() * values.size() > kMaxExpansion)
        throw Error("attention spec '" + text + "': the lists expand to more than " +
                    std::to_string(kMaxExpansion) + " specs");
      std::vector<std::string> next;
      for (const auto& p : prefixes)
        for (const auto& v : values)
          next.push_back(p + (p.find(':') == std::string::npos ? ":" : ",") + key + "=" + v);
      prefixes = std::move(next);
    }
  }
  std::vector<std::string> out;
  for (const auto& p : prefixes) {
    const std::string canonical = make_attention(p)->spec();
    if (std::find(out.begin(), out.end(), canonical) == out.end()) out.push_back(canonical);
  }
  return out;
}

std::vector<std::int64_t> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<std::int64_t> out;
  auto parse = [&](const std::string& token) {
    std::int64_t v = 0;
    const std::string t = trim(token);
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || ec != std::errc() || end != t.data() + t.size() || v < 1)
      throw Error(flag + ": '" + token + "' is not a positive integer (in '" + text + "')");
    return v;
  };
  for (const std::string& token : split_top_level(text)) {
    const auto dots = token.find("..");
    if (dots == std::string::npos) {
      out.push_back(parse(token));
      continue;
    }
    const std::int64_t lo = parse(token.substr(0, dots)), hi = parse(token.substr(dots + 2));
    if (hi < lo) throw Error(flag + ": range '" + token + "' is empty");
    for (const std::int64_t end : {lo, hi})  // 100..400 would silently mean 100, 200, 400
      if ((end & (end - 1)) != 0)
        throw Error(flag + ": range '" + token +
                    "': A..B means the powers of two from A to B, "
                    "and " +
                    std::to_string(end) + " is not one (write a list, e.g. 100,200,400)");
    for (std::int64_t v = lo;; v *= 2) {  // never past INT64_MAX
      out.push_back(v);
      if (v > hi / 2) break;
    }
  }
  return out;
}

std::vector<std::string> parse_causal_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& token : split_top_level(text)) {
    try {
      out.push_back(causal_name(parse_causal(token)));
    } catch (const Error& e) {
      throw Error(flag + ": " + e.what());
    }
  }
  return out;
}

std::vector<std::string> parse_input_list(const std::string& flag, const std::string& text) {
  // Distributions contain commas (lowrank:r=8,temp=2): entries are separated by ';'.
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ';');) {
    item = trim(item);
    try {
      if (item.rfind("npy:", 0) == 0) {
        if (item.size() == 4) throw Error("npy:<dir> needs a directory");
      } else if (is_trained_input(item)) {
        parse_trained_input(item);
      } else {
        parse_inputs(item);
      }
    } catch (const Error& e) {
      throw Error(flag + ": " + e.what());
    }
    out.push_back(item);
  }
  if (out.empty()) throw Error(flag + ": no input distribution given");
  return out;
}

const std::vector<std::string>& dtype_names() {
  static const std::vector<std::string> names = {"float32", "bf16"};
  return names;
}

std::vector<std::string> parse_dtype_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& token : split_top_level(text)) {
    const auto& names = dtype_names();
    if (std::find(names.begin(), names.end(), token) == names.end())
      throw Error(flag + ": '" + token + "' is not a dtype the sweep runs (expected float32 or " +
                  "bf16, in '" + text + "')");
    if (std::find(out.begin(), out.end(), token) == out.end()) out.push_back(token);
  }
  return out;
}

void validate(const SweepConfig& c) {
  auto need = [&](bool ok, const char* key) {
    if (!ok) throw Error(c.origin + ": " + key + ": no values (give at least one)");
  };
  need(!c.specs.empty(), "variants");
  need(!c.n.empty(), "n");
  need(!c.batch.empty(), "batch");
  need(!c.heads.empty(), "heads");
  need(!c.dim.empty(), "dim");
  need(!c.causal.empty(), "causal");
  need(!c.mask.empty(), "mask");
  need(!c.dtype.empty(), "dtype");
  need(!c.input.empty(), "input");
  need(!c.seed.empty(), "seed");
  for (const auto& dtype : c.dtype)
    if (std::find(dtype_names().begin(), dtype_names().end(), dtype) == dtype_names().end())
      throw Error(c.origin + ": dtype: '" + dtype + "' is not a dtype the sweep runs (expected " +
                  "float32 or bf16)");
  for (const auto& [values, key] : {std::pair{&c.n, "n"}, std::pair{&c.batch, "batch"},
                                    std::pair{&c.heads, "heads"}, std::pair{&c.dim, "dim"}})
    for (std::int64_t x : *values)
      if (x < 1)
        throw Error(c.origin + ": " + key + ": " + std::to_string(x) +
                    " is not a positive integer");
  if (c.name.empty() || c.name.find('/') != std::string::npos || c.name == "." || c.name == "..")
    throw Error(c.origin + ": name: '" + c.name + "' is not a plain directory name");
}

SweepConfig parse_config(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw Error(origin + ":" + std::to_string(e.source().begin.line) + ": " +
                std::string(e.description()));
  }
  SweepConfig c;
  c.origin = origin;
  c.text = text;
  c.n.clear();
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    if (key == "name") {
      auto s = v.value_exact<std::string>();
      if (!s) fail_at(origin, v.source(), key, "expected a string");
      c.name = *s;
    } else if (key == "variants" || key == "variant" || key == "max_n") {
      continue;  // below, in this order, whatever the file order
    } else if (key == "n")
      c.n = int_list(v, origin, key);
    else if (key == "batch")
      c.batch = int_list(v, origin, key);
    else if (key == "heads")
      c.heads = int_list(v, origin, key);
    else if (key == "dim")
      c.dim = int_list(v, origin, key);
    else if (key == "seed")
      c.seed = list_of<std::int64_t>(v, origin, key, "integers");
    else if (key == "causal") {
      for (const auto& s : string_list(v, origin, key))
        for (const auto& x : at(origin, v, key, [&] { return parse_causal_list(key, s); }))
          c.causal.push_back(x);
    } else if (key == "mask") {
      c.mask.clear();
      for (const auto& s : string_list(v, origin, key)) {
        const std::string text = at(origin, v, key, [&] { return parse_mask_spec(s).text(); });
        if (std::find(c.mask.begin(), c.mask.end(), text) == c.mask.end()) c.mask.push_back(text);
      }
    } else if (key == "dtype") {
      c.dtype.clear();
      for (const auto& s : string_list(v, origin, key))
        for (const auto& x : at(origin, v, key, [&] { return parse_dtype_list(key, s); }))
          if (std::find(c.dtype.begin(), c.dtype.end(), x) == c.dtype.end()) c.dtype.push_back(x);
    } else if (key == "input") {
      for (const auto& s : string_list(v, origin, key))
        for (const auto& x : at(origin, v, key, [&] { return parse_input_list(key, s); }))
          c.input.push_back(x);
    } else if (key == "peers") {
      auto b = v.value_exact<bool>();
      if (!b) fail_at(origin, v.source(), key, "expected true or false");
      c.peers = *b;
    } else if (key == "measure") {
      if (!v.is_table()) fail_at(origin, v.source(), key, "expected a [measure] table");
      parse_measure(*v.as_table(), origin, c.measure);
    } else {
      fail_at(origin, k.source(), key,
              "unknown key (known: name, variants, [[variant]], n, "
              "batch, heads, dim, causal, mask, dtype, input, seed, peers, [measure], "
              "[max_n])");
    }
  }
  if (const toml::node* v = root.get("variants"))
    for (const auto& pattern : string_list(*v, origin, "variants"))
      add_specs(c, at(origin, *v, "variants", [&] { return expand_spec(pattern); }));
  if (const toml::node* v = root.get("variant")) {
    const toml::array* a = v->as_array();
    if (!a) fail_at(origin, v->source(), "variant", "expected [[variant]] tables");
    for (const toml::node& t : *a) {
      if (!t.is_table()) fail_at(origin, t.source(), "variant", "expected [[variant]] tables");
      parse_variant_table(*t.as_table(), origin, c);
    }
  }
  if (const toml::node* v = root.get("max_n")) {
    // [max_n] full = 16384: by factory name, for every spec of that variant
    if (!v->is_table()) fail_at(origin, v->source(), "max_n", "expected a [max_n] table");
    for (auto&& [name, limit] : *v->as_table()) {
      const std::string key = "max_n." + std::string(name.str());
      const std::int64_t value = integer(limit, origin, key);
      bool any = false;
      for (const auto& s : c.specs)
        if (s.substr(0, s.find(':')) == name.str()) c.max_n.emplace(s, value), any = true;
      if (!any) fail_at(origin, name.source(), key, "no variant of that name in the grid");
    }
  }
  if (c.batch.empty()) c.batch = {1};
  if (c.heads.empty()) c.heads = {8};
  if (c.dim.empty()) c.dim = {64};
  if (c.causal.empty()) c.causal = {"none"};
  if (c.seed.empty()) c.seed = {1};
  validate(c);
  return c;
}

SweepConfig load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("config file '" + path + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path);
}

SweepConfig default_config() {
  return parse_config(default_config_text(), "built-in default.toml");
}

}  // namespace attnlab::harness
