// Measuring one grid point: the inputs, the timed forward calls, the memory of a call and the
// error against the fp64 reference, turned into one rows.csv row.
//
// Timing: `warmup` untimed calls (the first one is also the one whose peak memory and output
// are recorded), then R timed calls, R = clamp(target_seconds / warm-up time, min_reps,
// max_reps). A warm-up call longer than long_call_seconds is itself the only timed call (R = 1)
// so a 60 s point does not cost minutes. Time columns: median, min, max and interquartile range
// (linear-interpolated quartiles) of the timed calls, in seconds per forward call.
// Memory: extra heap bytes at the peak of the first call (harness/heap.hpp), output included.
// Error: attnlab::compare of the output against a float64 reference on all query rows when
// N <= error_rows, else on error_rows rows sampled without replacement by a seeded generator
// (the same rows for every variant of the same point). The reference is reference_attention
// (softmax attention under the same mask) for a variant whose support() approximates softmax,
// and the variant's own float64 definition (own_reference, variants/recurrence_reference.hpp)
// for one that computes something else: its numerical error (column error_vs: softmax | own).
// dtype bf16: q, k, v rounded to bfloat16 once per shape (to_bf16, outside the timed calls: a
// caller's tensors are bf16 already) and each call Attention's bf16 forward into a bf16 output,
// as a model trained in bf16 calls it; time and memory are those calls'. The error is that
// output's against the same float64 reference as the float32 point's (of the float32 inputs),
// so the rounding of the inputs and of the output is part of a bf16 point's error.
// Token inputs: a variant whose support() takes g or beta gets make_token_inputs' (seeded from
// the point's seed, the same for every variant of a point); column token_inputs names them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attnlab/bf16.hpp"
#include "attnlab/inputs.hpp"
#include "harness/config.hpp"
#include "harness/grid.hpp"
#include "harness/rows.hpp"

namespace attnlab::harness {

/// OpenBLAS sgemm rate (GFLOP/s) on 1024^3, best of 5 after a warm-up, with OpenBLAS's own threads.
double measure_sgemm_gflops();

/// median / min / max / IQR of samples (not empty).
struct TimeStats {
  double median = 0, min = 0, max = 0, iqr = 0;
};
TimeStats time_stats(std::vector<double> samples);

/// The query rows the error is measured on (empty = all rows).
std::vector<std::size_t> error_rows(std::int64_t n, std::int64_t sample, std::int64_t seed);

/// MemAvailable from /proc/meminfo in bytes (0 when unknown).
std::int64_t mem_available_bytes();

/// Runs the points of a sweep one after another, keeping the inputs and the reference of the
/// current shape between points that share them.
class PointRunner {
 public:
  PointRunner(const MeasureOptions& options, double sgemm_gflops, std::int64_t memory_budget_bytes,
              std::string shard);

  /// Never throws for a problem of the point: it becomes the row's status and message.
  Row run(const Point& p);

  /// Records a finished row's peak memory for the estimate of larger points of the same series.
  void remember(const Row& row);

 private:
  const QKV& inputs(const Point& p);
  struct QKVBf16 {
    TensorBf16 q, k, v;
  };
  const QKVBf16& bf16_inputs();  // the current inputs rounded to bf16, made on first use
  const TokenValues& tokens(const Point& p);
  const Tensor64& reference(const Point& p, const std::vector<std::size_t>& rows);
  std::int64_t estimate_bytes(const Point& p) const;

  MeasureOptions options_;
  double sgemm_gflops_;
  std::int64_t budget_;
  std::string shard_;
  std::string inputs_key_, reference_key_;
  QKV inputs_;
  TokenValues tokens_;  // made on first use for the current inputs
  bool have_tokens_ = false;
  QKVBf16 inputs_bf16_;  // made on first use for the current inputs
  bool have_bf16_ = false;
  Tensor64 reference_;
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> history_;  // series -> (n, peak)
};

/// The row of a point that was not run ("skipped", "oom", "error") with its message.
Row status_row(const Point& p, const std::string& status, const std::string& message,
               const std::string& shard);

}  // namespace attnlab::harness
