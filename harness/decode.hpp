// The decode sweep (`attnlab decode`): token-by-token decoding of every causal variant as the
// context grows, in one harness, with the machine's streaming read bandwidth as the yardstick
// (decoding is bound by memory, not by sgemm). Raw rows first (<dir>/decode.csv, columns below),
// then whatever is rendered from them; meta.json beside it records each invocation's context as
// the sweep's does.
//
// Rows (one per point, `kind`):
//   bandwidth  the read bandwidth of this invocation: every thread sums its share of a buffer
//              of 1 GiB (far past the caches; --bandwidth-mib) in vectorised lanes, best of 5,
//              in GB/s (`read_gbps`); on every thread, then (when there are more) on one.
//   step       one variant, H, Hkv, D at one context: the decoder is made with max_tokens =
//              context + steps + 2 (a KV cache allocated once; none where it does not hold
//              every token), filled with `context` random tokens by extend (no attention
//              computed), then 2 untimed steps and bursts of `steps` timed steps: one for a KV
//              cache of every token (full, bigbird); for a constant-size decoder (a state or a
//              ring), its contexts' decoders are all filled first and get bursts in turns, 10
//              turns of 25 ms each (run_step_turns says why). time_* are seconds per step (B = 1
//              unless --batch): time_median_s the least burst median, min and max over every
//              timed step, reps the steps timed; bytes_held the decoder's bytes after them,
//              read_gbps = bytes_held / time_median_s (a KV cache reads all it holds at each
//              step; a recurrent state is read and written).
//   prefill    one variant, H, Hkv, D at a prompt of `context` tokens: chunked prefill of the
//              whole prompt into a fresh decoder against `context` steps into another, seconds
//              per token each (time_median_s, steps_s_per_token), best of `reps`.
//   threads    `full` at the sweep's largest context, per D and Hkv: a step row's steps
//              (time_*, on `threads` threads), then as many again with one OpenMP thread
//              (omp_set_num_threads(1), restored after), their median in time_1thread_s:
//              whether one sequence's step uses every core. Its own decoder, with room for
//              both, so that the step rows' bytes_held stay those of context + steps + 2.
// Every row records its shard (I/N, or empty) and the OpenMP threads it ran on (`threads`).
// A variant whose tokens bring several rows of k and v (delta-product's steps) gets that many
// random rows per token.
// A point the variant refuses (decoding on linformer, grouped heads on a variant without) is a
// row with status `unsupported` and the message; one it rejects (an Error) is `error` with the
// message; one whose decoder would hold more than the memory budget is `skipped`: no point
// stops the sweep. Resume: a point whose key is in decode.csv is not run again (a killed sweep
// loses at most its last point, or its last constant-size decoder's contexts timed in turns; a
// torn last line is cut away on opening). Shards: as the
// sweep's (harness/grid.hpp), point i of the grid (decode_point_keys' order) belongs to shard I/N
// when i mod N = I - 1; each shard resumes in its own folder and merge_decode_results joins
// them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/grid.hpp"

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
  std::int64_t steps = 32;                    ///< timed steps per burst of a step row
  std::int64_t reps = 3;                      ///< prefill rows: best of
  double memory_budget_bytes = 0;             ///< a decoder's most bytes; 0: half of MemAvailable
  std::size_t bandwidth_bytes = std::size_t(1) << 30;  ///< the bandwidth row's buffer
  std::string gnuplot = "gnuplot";  ///< the plots' program (none: .dat and .gp only, a note)
  Shard shard;                      ///< the slice of the points run (1/1: all)
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

/// The keys of the sweep's points in its shard (decode.csv's `key`), in the order it runs them.
std::vector<std::string> decode_point_keys(const DecodeSweep& sweep);

/// One ok step, prefill or threads row of decode.csv, parsed: what the report and the summary
/// read.
struct DecodeRow {
  std::string kind, spec, variant;
  std::int64_t batch = 0, heads = 0, kv = 0, dim = 0, context = 0;
  double time = 0;             ///< time_median_s: seconds per step, or per prefilled token
  double steps_per_token = 0;  ///< prefill rows: seconds per token, token by token
  double bytes = 0;            ///< bytes_held
  double gbps = 0;             ///< read_gbps
  std::int64_t threads = 0;    ///< the OpenMP threads of time; 0 when the file has no column
  double one_thread_time = 0;  ///< time_1thread_s (threads rows): full's step on one thread
};

/// The ok rows of a decode.csv and the run's yardstick.
struct DecodeResults {
  std::vector<DecodeRow> rows;  ///< step, prefill and threads rows with status ok, in file order
  double bandwidth_gbps = 0;    ///< the median of the bandwidth rows on the most threads, or NaN
  /// The median of the bandwidth rows on one thread, when the run also had more; else NaN.
  double one_thread_bandwidth_gbps = 0;
};

/// Reads <csv>'s ok rows, by the names of its header (a file of an older attnlab, without the
/// shard, threads and time_1thread_s columns, reads as rows without them); with `keys`, only the
/// step, prefill and threads rows whose key is among them (every bandwidth row is kept: the
/// yardstick of whichever invocation ran them).
DecodeResults read_decode_results(const std::string& csv,
                                  const std::vector<std::string>* keys = nullptr);

/// The first measured context from which `spec`'s step is cheaper than full's at (dim, kv) and
/// stays so at every larger context where both were measured; nullopt when there is none.
std::optional<std::int64_t> cheaper_than_full_from(const DecodeResults& results,
                                                   const std::string& spec, std::int64_t dim,
                                                   std::int64_t kv);

/// One of the speed ratios (docs/decoding.md), computed from the rows.
struct DecodeCheck {
  std::string verdict;  ///< "pass", "FAIL", or "n/a" (the rows cannot say)
  std::string text;     ///< what was checked, the measured ratio and where
};

/// The ratios of the decode sweep's speed claims, each from the rows alone: full's step reads
/// its cache at >= 0.7x the run's bandwidth at contexts >= 64K (the worst point); each
/// constant-memory variant's step time is flat, max / min <= 1.2 over the measured contexts
/// (sliding's beyond its window); a recurrent step at D = 128 takes <= 1.5x one read and one
/// write of its state at the run's bandwidth; chunked prefill is no slower than token by token
/// (ratio <= 1) for N >= 256 and D >= 64, per variant and D; full's step at B = 1 uses every
/// core: its time on one thread / on the row's T threads >= 0.8 x min(T, the run's bandwidth on
/// T threads / on one), at the worst threads row at contexts >= 64K (n/a where the memory
/// scales by 1.25 or less: a step on one core would pass). One line per check and variant (the
/// worst over the shapes); "n/a" where the rows hold nothing to judge.
std::vector<DecodeCheck> decode_speed_checks(const DecodeResults& results);

/// Joins the decode.csv of several shards' folders into <out_dir> (and its own decode.csv when
/// it has one), one row per key, then renders its report: identical duplicates are dropped
/// (their timing, shard and thread columns may differ), a key whose other columns differ is an
/// Error naming both folders, as merge_results does for a sweep; meta.json records every input.
/// Returns (rows, duplicates dropped).
std::pair<std::size_t, std::size_t> merge_decode_results(const std::string& out_dir,
                                                         const std::vector<std::string>& in_dirs,
                                                         const std::string& gnuplot = "gnuplot");

/// "1K", "64K", "1M", else the number.
std::string tokens_text(std::int64_t n);

/// <dir>/report.md and plots/ from <dir>/decode.csv alone (rows, never re-running): the speed
/// checks (decode_speed_checks), then per (D, Hkv) the step time and bytes held against context,
/// the context from which each variant's step is cheaper than full's, full's read GB/s against
/// the run's bandwidth, prefill chunked against token by token; plots of step time and memory
/// against context (gnuplot, when it runs).
void render_decode_report(const std::string& dir, const std::string& gnuplot = "gnuplot");

}  // namespace attnlab::harness
