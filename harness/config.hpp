// What a sweep runs: the grid and how each point is measured, read from a TOML file (format in
// docs/sweep.md, examples in benchmarks/configs/) or the built-in default, then overridden by
// command-line flags. Every error is an attnlab::Error naming the file:line and the key (or the
// flag) and the bad value.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attnlab::harness {

struct MeasureOptions {
  int warmup = 1;     // untimed calls before the timed ones (the first gives memory and error)
  int min_reps = 3;   // timed calls at least...
  int max_reps = 10;  // ...and at most; in between, as many as fit target_seconds
  double target_seconds = 1.0;     // timing budget per point
  double long_call_seconds = 5.0;  // a warm-up call longer than this is the only timed call
  std::int64_t error_rows = 256;   // query rows sampled for the error when N is larger
  double memory_budget = 0.5;      // <= 1: fraction of MemAvailable at the start; > 1: bytes
};

struct SweepConfig {
  std::string name = "default";    // runs/<name>/ (harness/sweep.hpp)
  std::string origin;              // the file it came from, or "built-in default"
  std::string text;                // the TOML text (recorded in meta.json)
  std::vector<std::string> specs;  // canonical specs (make_attention(s)->spec()), no duplicates
  std::vector<std::int64_t> n, batch, heads, dim, seed;
  std::vector<std::string> causal;           // causal_name() forms: none, top-left, bottom-right
  std::vector<std::string> mask = {"none"};  // canonical mask specs (harness/mask_spec.hpp)
  std::vector<std::string> dtype = {"float32"};  // q, k, v's type: float32, bf16 (dtype_names())
  std::vector<std::string> input;                // distribution strings as given
  std::map<std::string, std::int64_t> max_n;  // per canonical spec: larger n left out of the grid
  bool peers = false;  // add peer:numpy and peer:torch rows (harness/peers.hpp)
  MeasureOptions measure;
};

/// Parses a TOML config; `origin` names it in error messages ("path" gives "path:line: ...").
SweepConfig parse_config(const std::string& text, const std::string& origin);
SweepConfig load_config(const std::string& path);

/// benchmarks/configs/default.toml as compiled into the program.
const std::string& default_config_text();
SweepConfig default_config();

/// "linformer:k=[64,128],share=[none,kv]" -> every combination, canonicalised by the factory;
/// "*" (or "all") -> every registered variant with its defaults. Throws Error quoting the spec.
std::vector<std::string> expand_spec(const std::string& pattern);

/// Setters for command-line flags: "--n", "256,1024,4096" etc. Throw Error naming the flag.
std::vector<std::int64_t> parse_int_list(const std::string& flag, const std::string& text);
std::vector<std::string> parse_causal_list(const std::string& flag, const std::string& text);
std::vector<std::string> parse_input_list(const std::string& flag, const std::string& text);
/// "--dtype", "float32,bf16" -> {"float32", "bf16"}: the names dtype_names() lists, each once.
std::vector<std::string> parse_dtype_list(const std::string& flag, const std::string& text);

/// The types a sweep feeds q, k, v in: "float32" (Attention's float32 forward) and "bf16" (the
/// float32 inputs rounded to bfloat16, Attention's bf16 forward: lib/attnlab/bf16.hpp).
const std::vector<std::string>& dtype_names();
// (parse_mask_list, for --mask: harness/mask_spec.hpp)

/// Checks lists are non-empty and values in range (Error naming `origin` and the key).
void validate(const SweepConfig& config);

}  // namespace attnlab::harness
