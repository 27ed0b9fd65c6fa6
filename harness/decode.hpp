// The decode sweep (`attnlab decode`): token-by-token decoding of every causal variant as the
// context grows, in one harness, with the machine's streaming read bandwidth as the yardstick
// (decoding is bound by memory, not by sgemm). Raw rows first (<dir>/decode.csv, columns below),
// then whatever is rendered from them; meta.json beside it records each invocation's context as
// the sweep's does.
//
// Rows (one per point, `kind`):
//   bandwidth  the read bandwidth of this invocation: every thread sums its share of a buffer
//              of 1 GiB (far past the caches; --bandwidth-mib), best of 5, in GB/s (`read_gbps`).
//   step       one variant, H, Hkv, D at one context: the decoder is made with max_tokens =
//              context + steps + 2 (a KV cache allocated once), filled with `context` random
//              tokens by extend (no attention computed), then 2 untimed and `steps` timed
//              steps; time_* are seconds per step (B = 1 unless --batch), bytes_held the
//              decoder's bytes after them, read_gbps = bytes_held / median step time (a KV
//              cache reads all it holds at each step; a recurrent state is read and written).
//   prefill    one variant, H, Hkv, D at a prompt of `context` tokens: chunked prefill of the
//              whole prompt into a fresh decoder against `context` steps into another, seconds
//              per token each (time_median_s, steps_s_per_token), best of `reps`.
// A point the variant refuses (decoding on linformer, grouped heads on a variant without) is a
// row with status `unsupported` and the message; one whose decoder would hold more than the
// memory budget is `skipped`. Resume: a point whose key is in decode.csv is not run again
// (a killed sweep loses at most its last point; a torn last line is cut away on opening).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace attnlab::harness {

/// What a decode sweep runs.
struct DecodeSweep {
  std::vector<std::string> specs;             ///< variants
  std::vector<std::int64_t> contexts;         ///< step rows: contexts (tokens held)
  std::vector<std::int64_t> prefill_lengths;  ///< prefill rows: prompt lengths
  std::vector<std::int64_t> dims;             ///< D = Dk = Dv
  std::vector<std::int64_t> kv_heads;         ///< Hkv values (each a divisor of heads)
  std::int64_t heads = 8;                     ///< H
  std::int64_t batch = 1;                     ///< B
  std::int64_t steps = 32;                    ///< timed steps per step row
  std::int64_t reps = 3;                      ///< prefill rows: best of
  double memory_budget_bytes = 0;             ///< a decoder's most bytes; 0: half of MemAvailable
  std::size_t bandwidth_bytes = std::size_t(1) << 30;  ///< the bandwidth row's buffer
  std::string gnuplot = "gnuplot";  ///< the plots' program (none: .dat and .gp only, a note)
};

/// The columns of decode.csv, in file order.
const std::vector<std::string>& decode_columns();

/// Every thread sums its share of `bytes` of floats, best of `reps`: GB/s (1e9 bytes / s).
double measure_read_bandwidth(std::size_t bytes, int reps = 5);

/// Runs the sweep into <dir>/decode.csv and meta.json (creating dir), skipping points already
/// there, then renders the report; progress lines on `progress` (nullptr: silent). Returns the
/// rows it appended. Throws Error for a bad sweep (an unknown spec, Hkv not dividing H, a
/// context < 1).
std::size_t run_decode_sweep(const std::string& dir, const DecodeSweep& sweep, std::FILE* progress);

/// <dir>/report.md and plots/ from <dir>/decode.csv alone (rows, never re-running): per (D, Hkv)
/// the step time and bytes held against context, the context from which each variant's step is
/// cheaper than full's, full's read GB/s against the run's bandwidth, prefill chunked against
/// token by token; plots of step time and memory against context (gnuplot, when it runs).
void render_decode_report(const std::string& dir, const std::string& gnuplot = "gnuplot");

}  // namespace attnlab::harness
