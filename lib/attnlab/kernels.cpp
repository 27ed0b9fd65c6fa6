#include "attnlab/kernels.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>

#include "attnlab/error.hpp"
#include "attnlab/kernels_table.hpp"

#ifdef ATTNLAB_X86_KERNELS
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attnlab::kernels {
namespace {

const detail::Table* table_of(Isa isa) {
  switch (isa) {
#ifdef ATTNLAB_X86_KERNELS
    case Isa::avx512:
      return &detail::avx512_table;
    case Isa::avx2:
      return &detail::avx2_table;
#endif
    case Isa::scalar:
      return &detail::scalar_table;
    default:
      return nullptr;  // not built on this architecture
  }
}

#ifdef ATTNLAB_X86_KERNELS
// A feature bit of CPUID leaf 1, ECX: clang 14's __builtin_cpu_supports knows no "f16c" or
// "movbe" (the TSan and fuzzing builds use clang), so these two are read directly.
bool cpuid1_ecx(unsigned bit) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit) != 0;
}
#endif

// The CPU and the operating system (saved register state) can run the path.
bool cpu_runs(Isa isa) {
#ifdef ATTNLAB_X86_KERNELS
  switch (isa) {
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             cpu_runs(Isa::avx2);
    case Isa::avx2:  // what x86-64-v3 code uses here (its F16C, MOVBE, LZCNT come with these)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
             cpuid1_ecx(bit_F16C) && cpuid1_ecx(bit_MOVBE);
    case Isa::scalar:
      return true;
  }
  return false;
#else
  return isa == Isa::scalar;
#endif
}

constexpr Isa kAll[] = {Isa::scalar, Isa::avx2, Isa::avx512};

std::string supported_list() {
  std::string names;
  for (Isa isa : supported_isas())
    names += (names.empty() ? "" : ", ") + std::string(isa_name(isa));
  return names;
}

// ATTNLAB_ISA if set, else the fastest path this CPU runs.
Isa chosen_at_start() {
  const char* forced = std::getenv("ATTNLAB_ISA");
  if (!forced || !*forced) return supported_isas().back();
  const Isa isa = parse_isa(forced);
  if (!isa_supported(isa))
    throw Error(std::string("ATTNLAB_ISA=") + forced + ": this " +
                (table_of(isa) ? "CPU cannot run it" : "build does not have it") +
                " (supported here: " + supported_list() + ")");
  return isa;
}

std::atomic<int> active{-1};  // an Isa; -1 until the first kernel call chooses one

Isa current() {
  if (const int isa = active.load(std::memory_order_relaxed); isa >= 0)
    return static_cast<Isa>(isa);
  static const Isa first = chosen_at_start();  // thread-safe; tried again if it threw
  int unset = -1;
  active.compare_exchange_strong(unset, static_cast<int>(first));  // unless use_isa came first
  return static_cast<Isa>(active.load());
}

const detail::Table& table() {
  return *table_of(current());
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "?";
}

Isa parse_isa(const std::string& text) {
  for (Isa isa : kAll)
    if (text == isa_name(isa)) return isa;
  throw Error("kernel path '" + text + "': expected scalar, avx2 or avx512");
}

bool isa_supported(Isa isa) {
  return table_of(isa) != nullptr && cpu_runs(isa);
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : kAll)
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

Isa active_isa() {
  return current();
}

void use_isa(Isa isa) {
  if (!isa_supported(isa))
    throw Error(std::string("kernel path ") + isa_name(isa) + ": this " +
                (table_of(isa) ? "CPU cannot run it" : "build does not have it") +
                " (supported here: " + supported_list() + ")");
  active.store(static_cast<int>(isa));
}

void gemm_tile(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
               const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate) {
  table().gemm_tile(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void gemm_tile_at(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                  const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate) {
  table().gemm_tile_at(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void exp2_inplace(float* x, std::size_t n) {
  table().exp2_inplace(x, n);
}

float exp2_shifted_sum(float* x, std::size_t n, float shift) {
  return table().exp2_shifted_sum(x, n, shift);
}

float row_max(const float* x, std::size_t n) {
  return table().row_max(x, n);
}

void transpose(std::size_t rows, std::size_t cols, const float* src, std::size_t lds, float* dst,
               std::size_t ldd) {
  table().transpose(rows, cols, src, lds, dst, ldd);
}

namespace {
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;  // x86-64's transparent huge page
}  // namespace

void prefer_huge_pages(void* data, std::size_t bytes) {
#ifdef MADV_HUGEPAGE
  const auto begin = (reinterpret_cast<std::uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint
#else
  (void)data, (void)bytes;
#endif
}

std::unique_ptr<float[], void (*)(void*)> scratch_floats(std::size_t n) {
  const std::size_t bytes = std::max<std::size_t>(n, 1) * sizeof(float);
  const bool huge = bytes >= kHugePage;
  const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = huge ? std::aligned_alloc(kHugePage, rounded) : std::malloc(bytes);
  if (!p) throw std::bad_alloc();
  if (huge) prefer_huge_pages(p, rounded);
  return {static_cast<float*>(p), std::free};
}

void transpose_key_tiles(const float* k, std::size_t dk, std::size_t block, std::size_t j0,
                         std::size_t j1, float* kt) {
  for (std::size_t j = j0; j < j1; j += block)  // tile j / block starts at kt + j * dk
    transpose(std::min(block, j1 - j), dk, k + j * dk, dk, kt + j * dk, block);
}

std::vector<float> transpose_keys(TensorRef k, const Dims& d, std::size_t block) {
  if (block == 0) block = d.nk;
  const std::size_t blocks = (d.nk + block - 1) / block, per_head = blocks * d.dk * block;
  std::vector<float> kt(d.batch * d.heads * per_head, 0.0f);
  const std::ptrdiff_t heads = static_cast<std::ptrdiff_t>(d.batch * d.heads);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t bh = 0; bh < heads; ++bh) {
    const float* src = k.data() + bh * d.nk * d.dk;
    float* dst = kt.data() + bh * per_head;
    transpose_key_tiles(src, d.dk, block, 0, d.nk, dst);
  }
  return kt;
}

OnlineSoftmax::OnlineSoftmax(std::size_t dk, std::size_t dv)
    : dk_(dk),
      dv_(dv),
      q_(kRows * dk),
      scores_(kRows * kCols),
      acc_(kRows * dv),
      max_(kRows),
      sum_(kRows) {}

void OnlineSoftmax::start(const float* q, std::size_t rows, float scale) {
  rows_ = rows;
  const float log2_scale = scale * kLog2e;  // softmax in base 2: exp(x) = 2^(x log2 e)
  for (std::size_t i = 0; i < rows * dk_; ++i) q_[i] = q[i] * log2_scale;
  std::fill_n(max_.begin(), rows, kNegInf);
  std::fill_n(sum_.begin(), rows, 0.0f);
  std::fill_n(acc_.begin(), rows * dv_, 0.0f);
}

float* OnlineSoftmax::scores(const float* kt, std::size_t ldk, std::size_t cols) {
  gemm_tile(rows_, cols, dk_, q_.data(), dk_, kt, ldk, scores_.data(), kCols, false);
  return scores_.data();
}

void OnlineSoftmax::fold(const float* v, std::size_t ldv, std::size_t cols) {
  const detail::SoftmaxTile tile{scores_.data(), kCols, acc_.data(), max_.data(),
                                 sum_.data(),    rows_, dv_};
  table().fold(tile, v, ldv, cols);
}

void OnlineSoftmax::finish(float* out, std::size_t ldo, float* lse, std::size_t ld_lse) const {
  for (std::size_t r = 0; r < rows_; ++r) {
    const float inv = sum_[r] > 0 ? 1.0f / sum_[r] : 0.0f;  // no visible key: zeros
    for (std::size_t c = 0; c < dv_; ++c) out[r * ldo + c] = acc_[r * dv_ + c] * inv;
    if (lse) lse[r * ld_lse] = sum_[r] > 0 ? (max_[r] + std::log2(sum_[r])) * kLn2 : kNegInf;
  }
}

SoftmaxBackward::SoftmaxBackward(std::size_t dk, std::size_t dv)
    : dk_(dk),
      dv_(dv),
      q_(kRows * dk),
      do_(kRows * dv),
      delta_(kRows),
      lse2_(kRows),
      scores_(kRows * kCols),
      dp_(kRows * kCols),
      dq_(kRows * dk) {}

void SoftmaxBackward::start(const float* q, std::size_t ldq, const float* out, const float* d_out,
                            std::size_t ldo, const float* lse, std::size_t ld_lse, std::size_t rows,
                            float scale) {
  rows_ = rows;
  scale_ = scale;
  const float log2_scale = scale * kLog2e;  // scores in base 2, as in the forward
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < dk_; ++c) q_[r * dk_ + c] = q[r * ldq + c] * log2_scale;
    float delta = 0.0f;  // rowsum(dO ∘ O): the softmax Jacobian's rank-one part
    for (std::size_t c = 0; c < dv_; ++c) {
      do_[r * dv_ + c] = d_out[r * ldo + c];
      delta += d_out[r * ldo + c] * out[r * ldo + c];
    }
    delta_[r] = delta;
    lse2_[r] = lse[r * ld_lse] * kLog2e;
  }
  std::fill(dq_.begin(), dq_.end(), 0.0f);
}

float* SoftmaxBackward::scores(const float* kt, std::size_t ldk, std::size_t cols) {
  gemm_tile(rows_, cols, dk_, q_.data(), dk_, kt, ldk, scores_.data(), kCols, false);
  return scores_.data();
}

void SoftmaxBackward::backprop(const float* k, std::size_t ldk, const float* vt, std::size_t ldvt,
                               float* dk, std::size_t lddk, float* dv, std::size_t lddv,
                               std::size_t cols) {
  const detail::Table& kernels = table();
  float* p = scores_.data();
  float* ds = dp_.data();
  kernels.gemm_tile(rows_, cols, dv_, do_.data(), dv_, vt, ldvt, ds, kCols, false);  // dO V^T
  // P = 2^(S - lse) and dS, the latter times ln 2: q_ holds q · scale · log2(e), so
  // dS^T q_ · ln 2 is dK; dQ = dS K · scale is finished in finish().
  kernels.softmax_grad({p, ds, kCols, lse2_.data(), delta_.data(), kLn2, rows_}, cols);
  // P and dS read transposed in place (no copies): dV += P^T dO, dK += dS^T Q, dQ += dS K.
  kernels.gemm_tile_at(cols, dv_, rows_, p, kCols, do_.data(), dv_, dv, lddv, true);
  kernels.gemm_tile_at(cols, dk_, rows_, ds, kCols, q_.data(), dk_, dk, lddk, true);
  kernels.gemm_tile(rows_, dk_, cols, ds, kCols, k, ldk, dq_.data(), dk_, true);
}

void SoftmaxBackward::finish(float* dq, std::size_t lddq) const {
  const float factor = scale_ * kLog2e;  // dS carries ln 2 (see backprop)
  for (std::size_t r = 0; r < rows_; ++r)
    for (std::size_t c = 0; c < dk_; ++c) dq[r * lddq + c] = dq_[r * dk_ + c] * factor;
}

void run_backward_tiles(const Dims& d, std::size_t tiles, const TensorRef* k, const TensorRef* v,
                        const BackwardTile& tile, Tensor& dk, Tensor& dv) {
  const std::size_t heads = d.batch * d.heads, kd = d.nk * d.dk, vd = d.nk * d.dv;
  // The split depends on the shape alone, never on the thread count, and the partial sums are
  // added in group order: the gradients are bitwise the same with any number of threads.
  constexpr std::size_t kTasks = 16;  // enough tasks to keep 16 threads busy
  const std::size_t groups =
      heads >= kTasks ? 1 : std::clamp<std::size_t>((kTasks + heads - 1) / heads, 1, tiles);
  std::fill(dk.begin(), dk.end(), 0.0f);
  std::fill(dv.begin(), dv.end(), 0.0f);
  // Scratch kept from call to call (assign reuses the storage): fresh pages for the partial sums
  // (64 MiB at B = 1, H = 8, N = 16384) cost a sliding window's backward a fifth of its time.
  // The partial sums are the calling thread's, which the team reaches through `partial`.
  static thread_local std::vector<float> partial_sums;
  partial_sums.assign((groups - 1) * heads * (kd + vd), 0.0f);
  float* const partial = partial_sums.data();
  const auto tasks = static_cast<std::ptrdiff_t>(heads * groups);
#pragma omp parallel
  {
    SoftmaxBackward grad(d.dk, d.dv);
    constexpr std::size_t kCols = SoftmaxBackward::kCols;
    const std::size_t padded = (d.nk + kCols - 1) / kCols * kCols;
    static thread_local std::vector<float> kt, vt;
    kt.assign(k ? padded * d.dk : 0, 0.0f);
    vt.assign(v ? padded * d.dv : 0, 0.0f);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t task = 0; task < tasks; ++task) {
      const std::size_t bh = static_cast<std::size_t>(task) / groups;
      const std::size_t group = static_cast<std::size_t>(task) % groups;
      if (k) transpose_key_tiles(k->data() + bh * kd, d.dk, kCols, 0, d.nk, kt.data());
      if (v) transpose_key_tiles(v->data() + bh * vd, d.dv, kCols, 0, d.nk, vt.data());
      float* dkh =
          group == 0 ? dk.data() + bh * kd : partial + ((group - 1) * heads + bh) * (kd + vd);
      float* dvh = group == 0 ? dv.data() + bh * vd : dkh + kd;
      for (std::size_t t = group; t < tiles; t += groups)
        tile(bh, t, k ? kt.data() : nullptr, v ? vt.data() : nullptr, dkh, dvh, grad);
    }
    if (groups > 1) {
#pragma omp for schedule(static)
      for (std::ptrdiff_t bh = 0; bh < static_cast<std::ptrdiff_t>(heads); ++bh)
        for (std::size_t group = 1; group < groups; ++group) {
          const float* src = partial + ((group - 1) * heads + bh) * (kd + vd);
          float* dkh = dk.data() + bh * kd;
          float* dvh = dv.data() + bh * vd;
          for (std::size_t i = 0; i < kd; ++i) dkh[i] += src[i];
          for (std::size_t i = 0; i < vd; ++i) dvh[i] += src[kd + i];
        }
    }
  }
}

namespace {

// The masked tiles of rows [i0, i0 + rows) of one head over the given key ranges, shared by the
// forward and the backward so that both see exactly the same masks: engine.scores for each chunk
// of at most kCols keys (chunks never cross a transpose_keys tile), every part of the mask
// applied with -inf, then consume(c0, cols). Keys past what any row can see are skipped.
template <class Engine, class Consume>
void for_each_masked_tile(const float* kt, const Mask& mask, const Dims& d, std::size_t b,
                          std::size_t h, std::size_t i0, std::size_t rows,
                          const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                          Engine& engine, Consume consume) {
  std::size_t visible[Engine::kRows];        // per row: keys [0, visible) may be seen
  const bool* allowed[Engine::kRows];        // per row: its boolean mask row, or null
  std::size_t all_see = d.nk, any_sees = 0;  // keys visible to every / to some row
  for (std::size_t r = 0; r < rows; ++r) {
    visible[r] = mask.visible_keys(b, i0 + r, d);
    allowed[r] = mask.allowed_row(b, h, i0 + r);
    all_see = std::min(all_see, visible[r]);
    any_sees = std::max(any_sees, visible[r]);
  }
  for (const auto& [lo, hi] : ranges) {
    constexpr std::size_t tile = OnlineSoftmax::kCols;
    for (std::size_t c0 = lo, cols = 0; c0 < std::min(hi, any_sees); c0 += cols) {
      cols = std::min({tile - c0 % tile, hi - c0, any_sees - c0});
      float* s = engine.scores(kt + (c0 / tile) * d.dk * tile + c0 % tile, tile, cols);
      for (std::size_t r = 0; r < rows; ++r) {
        float* row = s + r * OnlineSoftmax::kCols;
        if (c0 + cols > all_see)
          for (std::size_t j = std::max(c0, visible[r]); j < c0 + cols; ++j) row[j - c0] = kNegInf;
        if (allowed[r])
          for (std::size_t j = 0; j < cols; ++j)
            if (!allowed[r][c0 + j]) row[j] = kNegInf;
      }
      consume(c0, cols);
    }
  }
}

}  // namespace

void attend_key_ranges(TensorRef q, const float* kt, TensorRef v, const Mask& mask, const Dims& d,
                       std::size_t b, std::size_t h, std::size_t i0, std::size_t rows,
                       const std::vector<std::pair<std::size_t, std::size_t>>& ranges, float scale,
                       OnlineSoftmax& softmax, Tensor& out, float* lse) {
  softmax.start(&q(b, h, i0, 0), rows, scale);
  for_each_masked_tile(
      kt, mask, d, b, h, i0, rows, ranges, softmax,
      [&](std::size_t c0, std::size_t cols) { softmax.fold(&v(b, h, c0, 0), d.dv, cols); });
  softmax.finish(&out(b, h, i0, 0), d.dv, lse);
}

void backprop_key_ranges(TensorRef q, const float* kt, TensorRef k, const float* vt, TensorRef out,
                         TensorRef d_out, const float* lse, const Mask& mask, const Dims& d,
                         std::size_t b, std::size_t h, std::size_t i0, std::size_t rows,
                         const std::vector<std::pair<std::size_t, std::size_t>>& ranges,
                         float scale, SoftmaxBackward& grad, Tensor& dq, float* dk, float* dv) {
  grad.start(&q(b, h, i0, 0), d.dk, &out(b, h, i0, 0), &d_out(b, h, i0, 0), d.dv, lse, 1, rows,
             scale);
  constexpr std::size_t tile = OnlineSoftmax::kCols;
  for_each_masked_tile(
      kt, mask, d, b, h, i0, rows, ranges, grad, [&](std::size_t c0, std::size_t cols) {
        grad.backprop(&k(b, h, c0, 0), d.dk, vt + (c0 / tile) * d.dv * tile + c0 % tile, tile,
                      dk + c0 * d.dk, d.dk, dv + c0 * d.dv, d.dv, cols);
      });
  grad.finish(&dq(b, h, i0, 0), d.dk);
}

}  // namespace attnlab::kernels
