// The grid of a sweep: every (input, seed, n, batch, heads, dim, causal, mask, dtype, spec)
// combination of a SweepConfig, in a fixed order, each point with a stable key. The index of a
// point in that order decides its shard (index % count == I - 1), so shards are disjoint and cover
// the grid, and round-robin keeps the lengths balanced between them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/config.hpp"

namespace attnlab::harness {

struct Point {
  std::size_t index = 0;
  std::string spec;     // canonical factory spec, or "peer:numpy" / "peer:torch"
  std::string variant;  // factory name, or the peer's name
  bool peer = false;
  std::int64_t n = 0, batch = 0, heads = 0, dim = 0, seed = 0;
  std::string causal, input;
  std::string mask = "none";      // a canonical mask spec (harness/mask_spec.hpp)
  std::string dtype = "float32";  // q, k, v's type (SweepConfig::dtype)
  std::string key;
};

/// 16 hex digits of FNV-1a 64 over "spec|n|batch|heads|dim|causal|input|seed", then "|mask" for
/// a mask other than none and "|bf16" for a dtype other than float32 (so the keys of
/// points without them stay those of older runs).
std::string point_key(const Point& p);

/// The shape of npy:<dir> inputs is read from <dir>/q.npy (n, batch, heads, dim of the grid do
/// not apply to them: one shape per such input). A trained:DIR input has the model's heads and
/// head size, the grid's n up to the length the model was trained at (Error when none is), and
/// under a causal model only the causal settings (harness/trained_inputs.hpp). A prefix mask is
/// combined with the causal settings only (prefix-LM relaxes a causal mask), a documents mask
/// needs batch = 1 and N >= its count (Error naming the mask otherwise), and the peers (NumPy,
/// PyTorch) are measured without a mask and in float32 only: they take no such mask, and
/// harness/peers.py hands them float32 arrays.
std::vector<Point> make_grid(const SweepConfig& config);

struct Shard {
  int index = 1, count = 1;  // I/N, 1-based
  bool active() const { return count > 1; }
  bool contains(std::size_t point_index) const {
    return static_cast<int>(point_index % static_cast<std::size_t>(count)) == index - 1;
  }
  std::string str() const { return std::to_string(index) + "/" + std::to_string(count); }
};

/// "I/N" with 1 <= I <= N; throws Error quoting the text.
Shard parse_shard(const std::string& text);

}  // namespace attnlab::harness
