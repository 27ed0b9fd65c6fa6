#include "harness/measure.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <sstream>

#include <cblas.h>

#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/metrics.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/reference.hpp"
#include "attnlab/stats.hpp"
#include "harness/heap.hpp"
#include "harness/mask_spec.hpp"
#include "harness/peers.hpp"
#include "harness/trained_inputs.hpp"
#include "variants/recurrence_reference.hpp"

namespace attnlab::harness {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

std::string num(double x) {
  return std::isnan(x) ? "" : format_number(x);
}

Row base_row(const Point& p, const std::string& shard) {
  Row r;
  r[Col::key] = p.key;
  r[Col::spec] = p.spec;
  r[Col::variant] = p.variant;
  r[Col::n] = std::to_string(p.n);
  r[Col::batch] = std::to_string(p.batch);
  r[Col::heads] = std::to_string(p.heads);
  r[Col::dim] = std::to_string(p.dim);
  r[Col::causal] = p.causal;
  r[Col::mask] = p.mask;
  r[Col::dtype] = p.dtype;
  r[Col::input] = p.input;
  r[Col::seed] = std::to_string(p.seed);
  r[Col::shard] = shard;
  return r;
}

// [B, H, rows, D] rows of `out` (all when `rows` is empty).
Tensor gather_rows(const Tensor& out, const std::vector<std::size_t>& rows) {
  if (rows.empty()) return out;
  Tensor g = Tensor::from_shape({out.shape(0), out.shape(1), rows.size(), out.shape(3)});
  for (std::size_t b = 0; b < out.shape(0); ++b)
    for (std::size_t h = 0; h < out.shape(1); ++h)
      for (std::size_t r = 0; r < rows.size(); ++r)
        std::copy_n(&out(b, h, rows[r], 0), out.shape(3), &g(b, h, r, 0));
  return g;
}

// The fp64 reference, one (item, head) slice per thread: the reference itself is serial.
Tensor64 parallel_reference(const QKV& t, const Mask& mask, const std::vector<std::size_t>& rows) {
  const std::size_t batch = t.q.shape(0), heads = t.q.shape(1), n = t.q.shape(2), d = t.q.shape(3),
                    dv = t.v.shape(3);
  const std::size_t nrows = rows.empty() ? n : rows.size();
  Tensor64 ref = Tensor64::from_shape({batch, heads, nrows, dv});
  const auto slices = static_cast<std::ptrdiff_t>(batch * heads);
  std::string failure;
#pragma omp parallel for schedule(dynamic, 1)
  for (std::ptrdiff_t s = 0; s < slices; ++s) {
    const std::size_t b = static_cast<std::size_t>(s) / heads,
                      h = static_cast<std::size_t>(s) % heads;
    auto slice = [&](const Tensor& x, std::size_t dim) {
      Tensor one = Tensor::from_shape({1, 1, n, dim});
      std::copy_n(&x(b, h, 0, 0), n * dim, one.data());
      return one;
    };
    try {
      // The slice is a batch of one: its item's entries of the per-item parts.
      Mask item = mask;
      if (!mask.prefix_lengths.empty() && !mask.has_documents())
        item.prefix_lengths = {mask.prefix_lengths[b]};
      if (mask.has_key_lengths()) item.key_lengths = {mask.key_lengths[b]};
      const Tensor64 part =
          reference_attention(slice(t.q, d), slice(t.k, d), slice(t.v, dv), item, rows);
      std::copy_n(part.data(), nrows * dv, &ref(b, h, 0, 0));
    } catch (const std::exception& e) {
#pragma omp critical
      failure = user_message(e);
    }
  }
  if (!failure.empty()) throw Error(failure);
  return ref;
}

// A point of a series differs from its neighbours only in n (and seed).
std::string series(const Point& p) {
  return p.spec + "|" + std::to_string(p.batch) + "|" + std::to_string(p.heads) + "|" +
         std::to_string(p.dim) + "|" + p.causal + "|" + p.mask + "|" + p.dtype + "|" + p.input;
}

// The point's mask: its causal setting and its mask spec, at its sizes.
Mask mask_of(const Point& p) {
  Mask mask;
  mask.causal = parse_causal(p.causal);
  add_mask_part(parse_mask_spec(p.mask), static_cast<std::size_t>(p.n),
                static_cast<std::size_t>(p.batch), mask);
  return mask;
}

std::string gib(double bytes) {
  std::ostringstream s;
  s.precision(3);
  s << bytes / double(1ull << 30) << " GiB";
  return s.str();
}

}  // namespace

double measure_sgemm_gflops() {
  const int m = 1024;
  std::vector<float> a(std::size_t(m) * m, 0.5f), b(std::size_t(m) * m, 0.25f),
      c(std::size_t(m) * m);
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.0f, a.data(), m, b.data(), m,
                0.0f, c.data(), m);
    if (rep > 0) best = std::min(best, seconds_since(t0));  // rep 0 warms up
  }
  return 2.0 * m * m * m / best / 1e9;
}

TimeStats time_stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {quantile(v, 0.5), v.front(), v.back(), quantile(v, 0.75) - quantile(v, 0.25)};
}

std::vector<std::size_t> error_rows(std::int64_t n, std::int64_t sample, std::int64_t seed) {
  if (n <= sample) return {};
  std::vector<std::size_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 0x9e3779b97f4a7c15ull +
                      static_cast<std::uint64_t>(n));
  for (std::size_t i = 0; i < static_cast<std::size_t>(sample); ++i) {  // partial Fisher-Yates
    std::uniform_int_distribution<std::size_t> pick(i, all.size() - 1);
    std::swap(all[i], all[pick(rng)]);
  }
  all.resize(static_cast<std::size_t>(sample));
  std::sort(all.begin(), all.end());
  return all;
}

std::int64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

Row status_row(const Point& p, const std::string& status, const std::string& message,
               const std::string& shard) {
  Row r = base_row(p, shard);
  r[Col::status] = status;
  r[Col::message] = one_line(message);
  return r;
}

PointRunner::PointRunner(const MeasureOptions& options, double sgemm_gflops,
                         std::int64_t memory_budget_bytes, std::string shard)
    : options_(options),
      sgemm_gflops_(sgemm_gflops),
      budget_(memory_budget_bytes),
      shard_(std::move(shard)) {}

const QKV& PointRunner::inputs(const Point& p) {
  const std::string key = p.input + "|" + std::to_string(p.seed) + "|" + std::to_string(p.n) + "|" +
                          std::to_string(p.batch) + "|" + std::to_string(p.heads) + "|" +
                          std::to_string(p.dim);
  if (key == inputs_key_) return inputs_;
  inputs_ = QKV{};  // free the previous shape first
  tokens_ = TokenValues{};
  have_tokens_ = false;
  inputs_bf16_ = QKVBf16{};
  have_bf16_ = false;
  inputs_key_.clear();
  reference_key_.clear();
  reference_ = Tensor64{};
  if (p.input.rfind("npy:", 0) == 0) {
    const std::string dir = p.input.substr(4);
    auto load = [&](const char* name) {
      const std::string path = dir + "/" + name;
      return to_bhnd(load_npy_float(path), path);
    };
    inputs_ = QKV{load("q.npy"), load("k.npy"), load("v.npy")};
  } else if (is_trained_input(p.input)) {
    inputs_ = trained_inputs(parse_trained_input(p.input), static_cast<std::size_t>(p.n),
                             static_cast<std::size_t>(p.batch), static_cast<std::uint64_t>(p.seed));
  } else {
    inputs_ = make_inputs(p.input, static_cast<std::size_t>(p.batch),
                          static_cast<std::size_t>(p.heads), static_cast<std::size_t>(p.n),
                          static_cast<std::size_t>(p.dim), static_cast<std::uint64_t>(p.seed));
  }
  inputs_key_ = key;
  return inputs_;
}

const TokenValues& PointRunner::tokens(const Point& p) {
  if (!have_tokens_) {
    tokens_ = make_token_inputs(inputs_.q.shape(0), inputs_.q.shape(1), inputs_.k.shape(2),
                                static_cast<std::uint64_t>(p.seed));
    have_tokens_ = true;
  }
  return tokens_;
}

const PointRunner::QKVBf16& PointRunner::bf16_inputs() {
  if (!have_bf16_) {
    inputs_bf16_ = QKVBf16{to_bf16(inputs_.q), to_bf16(inputs_.k), to_bf16(inputs_.v)};
    have_bf16_ = true;
  }
  return inputs_bf16_;
}

// The float32 and bf16 points of a shape share it: a bf16 point's error is against float64
// attention of the float32 inputs.
const Tensor64& PointRunner::reference(const Point& p, const std::vector<std::size_t>& rows) {
  const std::string key = inputs_key_ + "|" + p.causal + "|" + p.mask;
  if (key == reference_key_) return reference_;
  reference_ = parallel_reference(inputs_, mask_of(p), rows);
  reference_key_ = key;
  return reference_;
}

std::int64_t PointRunner::estimate_bytes(const Point& p) const {
  // The inputs and an output, then what the same series needed at a smaller n scaled by
  // (n / n_prev)^2: an upper bound for any method whose memory grows at most quadratically.
  const double tensor = 4.0 * double(p.batch) * double(p.heads) * double(p.n) * double(p.dim);
  double extra = tensor;
  const auto it = history_.find(series(p));
  if (it != history_.end() && it->second.first < p.n) {
    const double ratio = double(p.n) / double(it->second.first);
    extra = std::max(extra, double(it->second.second) * ratio * ratio);
  }
  const bool have_inputs = !inputs_key_.empty() && inputs_.q.shape(2) == std::size_t(p.n) &&
                           inputs_.q.shape(0) == std::size_t(p.batch) &&
                           inputs_.q.shape(1) == std::size_t(p.heads) &&
                           inputs_.q.shape(3) == std::size_t(p.dim);
  const double total = (have_inputs ? 0.0 : 3.0 * tensor) + extra;
  return total >= 9e18 ? std::numeric_limits<std::int64_t>::max()
                       : static_cast<std::int64_t>(total);
}

void PointRunner::remember(const Row& row) {
  if (row[Col::status] != "ok" || row[Col::peak_mem_bytes].empty()) return;
  Point p;
  p.spec = row[Col::spec];
  p.batch = std::stoll(row[Col::batch]);
  p.heads = std::stoll(row[Col::heads]);
  p.dim = std::stoll(row[Col::dim]);
  p.causal = row[Col::causal];
  p.mask = row[Col::mask];
  p.dtype = row[Col::dtype];
  p.input = row[Col::input];
  const std::int64_t n = std::stoll(row[Col::n]);
  const auto peak = static_cast<std::int64_t>(std::stod(row[Col::peak_mem_bytes]));
  auto& h = history_[series(p)];
  if (n >= h.first) h = {n, peak};
}

Row PointRunner::run(const Point& p) {
  try {
    const std::int64_t need = estimate_bytes(p);
    if (need > budget_)
      return status_row(p, "oom",
                        "estimated " + gib(double(need)) + " exceeds the memory budget of " +
                            gib(double(budget_)) + "; not run",
                        shard_);
    const bool bf16 = p.dtype == "bf16";
    if (!bf16 && p.dtype != "float32")
      throw Error("dtype '" + p.dtype + "': expected float32 or bf16");
    if (bf16 && p.peer)
      throw Error("dtype 'bf16': the peers (" + p.spec + ") are handed float32 arrays only");
    const QKV& t = inputs(p);
    const Mask mask = mask_of(p);
    const Dims d = check_qkv(t.q, t.k, t.v);
    const std::vector<std::size_t> rows = error_rows(p.n, options_.error_rows, p.seed);

    Row r = base_row(p, shard_);
    r[Col::status] = "ok";
    std::vector<double> times;
    Tensor out;
    double flops = std::nan("");
    std::unique_ptr<Attention> attention;  // null for a peer
    TokenInputs in;
    if (p.peer) {
      PeerOptions po;
      po.warmup = options_.warmup;
      po.max_score_bytes = static_cast<std::uint64_t>(budget_);
      PeerResult pr =
          run_peer(p.variant, t.q, t.k, t.v, mask.causal != Causal::none, options_.min_reps, po);
      if (pr.status != "ok") return status_row(p, pr.status, pr.message, shard_);
      times = pr.times_s;
      r[Col::peak_mem_bytes] = std::to_string(pr.peak_mem_bytes);
      out = std::move(pr.output);
      flops = make_attention("full")->flops(d, mask);  // the same exact computation
    } else {
      attention = make_attention(p.spec);
      flops = attention->flops(d, mask);
      const Support support = attention->support();
      if (support.log_decay || support.beta) {
        const TokenValues& values = tokens(p);
        in = TokenInputs::of(support.log_decay ? &values.log_decay : nullptr,
                             support.beta ? &values.beta : nullptr);
        r[Col::token_inputs] = std::string(support.log_decay ? "g" : "") +
                               (support.log_decay && support.beta ? "," : "") +
                               (support.beta ? "beta" : "");
      }
      // One call into `out` (bf16: into `out16`), with the token inputs the variant takes (none
      // for most).
      const QKVBf16* t16 = bf16 ? &bf16_inputs() : nullptr;
      TensorBf16 out16;
      const auto call = [&] {
        if (t16)
          attention->forward(t16->q, t16->k, t16->v, mask, in, out16);
        else
          attention->forward(t.q, t.k, t.v, mask, in, out);
      };
      heap::reset_peak();
      const std::int64_t base = heap::live_bytes();
      const auto t0 = Clock::now();
      call();  // into an empty `out`: the allocation of the output is part of the first call
      const double first = seconds_since(t0);
      r[Col::peak_mem_bytes] = std::to_string(heap::peak_bytes() - base);
      if (options_.warmup == 0 || first > options_.long_call_seconds) times.push_back(first);
      if (first <= options_.long_call_seconds) {
        // The later calls write into the first call's output: a fresh one above glibc's mmap
        // threshold (N = 16384 here) would be page-faulted in on every call, which at 32 MiB
        // cost several times the O(N) variants' own work (docs/sweep.md).
        for (int w = 1; w < options_.warmup; ++w) call();
        const double want = std::ceil(options_.target_seconds / std::max(first, 1e-9));
        const int reps = std::clamp(static_cast<int>(std::min(want, double(options_.max_reps))),
                                    options_.min_reps, options_.max_reps);
        while (static_cast<int>(times.size()) < reps) {
          const auto t1 = Clock::now();
          call();
          times.push_back(seconds_since(t1));
        }
      }
      if (t16) to_float32(out16, out);  // exact: the error is the bf16 output's
    }
    const TimeStats s = time_stats(times);
    r[Col::reps] = std::to_string(times.size());
    r[Col::time_median_s] = format_number(s.median);
    r[Col::time_min_s] = format_number(s.min);
    r[Col::time_max_s] = format_number(s.max);
    r[Col::time_iqr_s] = format_number(s.iqr);
    r[Col::flops] = num(flops);
    const double gflops = flops / s.median / 1e9;
    r[Col::gflops] = num(gflops);
    r[Col::sgemm_gflops] = format_number(sgemm_gflops_);
    r[Col::sgemm_fraction] = num(gflops / sgemm_gflops_);

    // A variant that computes something else than softmax attention is measured against its
    // own float64 definition: its numerical error, not its distance from softmax.
    const bool own = attention && !attention->support().approximates_softmax;
    r[Col::error_vs] = own ? "own" : "softmax";
    const ErrorMetrics e = own ? compare(gather_rows(out, rows),
                                         own_reference(*attention, t.q, t.k, t.v, mask, in, rows))
                               : compare(gather_rows(out, rows), reference(p, rows));
    r[Col::err_rows] = std::to_string(rows.empty() ? p.n : static_cast<std::int64_t>(rows.size()));
    r[Col::rel_fro] = format_number(e.rel_fro);
    r[Col::max_abs] = format_number(e.max_abs);
    r[Col::mean_cos] = format_number(e.mean_cos);
    r[Col::p99_row] = format_number(e.p99_row);
    return r;
  } catch (const Unsupported& e) {
    return status_row(p, "unsupported", e.what(), shard_);
  } catch (const std::bad_alloc&) {
    return status_row(p, "oom", "out of memory: an allocation failed", shard_);
  } catch (const std::exception& e) {
    return status_row(p, "error", user_message(e), shard_);
  }
}

}  // namespace attnlab::harness
