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

constexpr Bf16Path kAllBf16[] = {Bf16Path::via_f32, Bf16Path::avx512bf16, Bf16Path::amx};

// Kernels exist for the converted path only (issue 47 adds the others).
bool bf16_path_built(Bf16Path path) {
  return path == Bf16Path::via_f32;
}

std::string bf16_supported_list() {
  std::string names;
  for (Bf16Path path : kAllBf16)
    if (bf16_path_supported(path))
      names += (names.empty() ? "" : ", ") + std::string(bf16_path_name(path));
  return names;
}

// Why `path` cannot run here: "this CPU cannot run it (...)" or "this build does not have it".
std::string bf16_refusal(Bf16Path path) {
  if (!cpu_has_bf16_path(path))
    return std::string("this CPU cannot run it (it lacks ") +
           (path == Bf16Path::amx ? "AMX-TILE and AMX-BF16" : "AVX512_BF16") +
           "; bfloat16 paths here: " + bf16_supported_list() + ")";
  return "this build does not have it (its kernels are not written yet; bfloat16 paths here: " +
         bf16_supported_list() + ")";
}

// What ATTNLAB_ISA asks for: a float32 path, or a bf16 path over the fastest float32 one.
struct Choice {
  Isa isa;
  Bf16Path bf16;
};

// ATTNLAB_ISA if set, else the fastest paths this CPU runs.
Choice chosen_at_start() {
  const char* forced = std::getenv("ATTNLAB_ISA");
  if (!forced || !*forced) return {supported_isas().back(), Bf16Path::via_f32};
  if (Bf16Path path; parse_bf16_path(forced, path)) {
    if (!bf16_path_supported(path))
      throw Error(std::string("ATTNLAB_ISA=") + forced + ": " + bf16_refusal(path));
    return {supported_isas().back(), path};
  }
  const Isa isa = parse_isa(forced);
  if (!isa_supported(isa))
    throw Error(std::string("ATTNLAB_ISA=") + forced + ": this " +
                (table_of(isa) ? "CPU cannot run it" : "build does not have it") +
                " (supported here: " + supported_list() + ")");
  return {isa, Bf16Path::via_f32};
}

std::atomic<int> active{-1};       // an Isa; -1 until the first kernel call chooses one
std::atomic<int> active_bf16{-1};  // a Bf16Path, likewise

const Choice& first_choice() {
  static const Choice first = chosen_at_start();  // thread-safe; tried again if it threw
  return first;
}

Isa current() {
  if (const int isa = active.load(std::memory_order_relaxed); isa >= 0)
    return static_cast<Isa>(isa);
  const Choice& first = first_choice();
  int unset = -1;
  active.compare_exchange_strong(unset, static_cast<int>(first.isa));  // unless use_isa came first
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
  throw Error("kernel path '" + text +
              "': expected scalar, avx2 or avx512 (or a bfloat16 path: bf16-via-f32, "
              "avx512bf16, amx)");
}

const char* bf16_path_name(Bf16Path path) {
  switch (path) {
    case Bf16Path::via_f32:
      return "bf16-via-f32";
    case Bf16Path::avx512bf16:
      return "avx512bf16";
    case Bf16Path::amx:
      return "amx";
  }
  return "?";
}

bool parse_bf16_path(const std::string& text, Bf16Path& path) {
  for (Bf16Path p : kAllBf16)
    if (text == bf16_path_name(p)) {
      path = p;
      return true;
    }
  return false;
}

bool cpu_has_bf16_path(Bf16Path path) {
#ifdef ATTNLAB_X86_KERNELS
  unsigned a = 0, b = 0, c = 0, d = 0;
  switch (path) {
    case Bf16Path::via_f32:
      return true;
    case Bf16Path::avx512bf16:  // CPUID.(7, 1):EAX bit 5
      return cpu_runs(Isa::avx512) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
    case Bf16Path::amx:  // CPUID.(7, 0):EDX bits 22 (AMX-BF16) and 24 (AMX-TILE)
      return cpu_runs(Isa::avx512) && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) &&
             (d & (1u << 24));
  }
  return false;
#else
  return path == Bf16Path::via_f32;
#endif
}

bool bf16_path_supported(Bf16Path path) {
  return bf16_path_built(path) && cpu_has_bf16_path(path);
}

Bf16Path active_bf16_path() {
  if (const int path = active_bf16.load(std::memory_order_relaxed); path >= 0)
    return static_cast<Bf16Path>(path);
  const Choice& first = first_choice();
  int unset = -1;
  active_bf16.compare_exchange_strong(unset, static_cast<int>(first.bf16));
  return static_cast<Bf16Path>(active_bf16.load());
}

void use_bf16_path(Bf16Path path) {
  if (!bf16_path_supported(path))
    throw Error(std::string("bfloat16 path ") + bf16_path_name(path) + ": " + bf16_refusal(path));
  active_bf16.store(static_cast<int>(path));
}

void round_to_bf16_bits(const float* src, std::uint16_t* dst, std::size_t n) {
  table().round_to_bf16(src, dst, n);
}

void widen_bf16_bits(const std::uint16_t* src, float* dst, std::size_t n) {
  table().widen_bf16(src, dst, n);
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

void score_mods(const detail::ScoreMods& mods, float* scores, std::size_t ld, std::size_t rows,
                std::size_t cols) {
  table().score_mods(mods, scores, ld, rows, cols);
}

float exp2_shifted_sum(float* x, std::size_t n, float shift) {
  return table().exp2_shifted_sum(x, n, shift);
}

float row_max(const float* x, std::size_t n) {
  return table().row_max(x, n);
}

void row_dots(std::size_t rows, std::size_t cols, std::size_t dk, const float* q, const float* keys,
              float* scores, std::size_t ld) {
  table().row_dots(rows, cols, dk, q, keys, scores, ld);
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

void OnlineSoftmax::start(const float* q, std::size_t ldq, std::size_t rows, float scale,
                          float sink) {
  rows_ = rows;
  const float log2_scale = scale * kLog2e;  // softmax in base 2: exp(x) = 2^(x log2 e)
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < dk_; ++c) q_[r * dk_ + c] = q[r * ldq + c] * log2_scale;
  // A sink is the running max and sum of a row that has seen only it: 2^(sink - sink) = 1.
  const bool has_sink = sink > kNegInf;
  std::fill_n(max_.begin(), rows, has_sink ? sink * kLog2e : kNegInf);
  std::fill_n(sum_.begin(), rows, has_sink ? 1.0f : 0.0f);
  std::fill_n(acc_.begin(), rows * dv_, 0.0f);
}

float* OnlineSoftmax::scores(const float* kt, std::size_t ldk, std::size_t cols) {
  gemm_tile(rows_, cols, dk_, q_.data(), dk_, kt, ldk, scores_.data(), kCols, false);
  return scores_.data();
}

void OnlineSoftmax::fold(const float* v, std::size_t ldv, std::size_t cols,
                         const detail::ScoreMods* mods) {
  const detail::SoftmaxTile tile{scores_.data(), kCols, acc_.data(), max_.data(),
                                 sum_.data(),    rows_, dv_};
  table().fold(tile, mods, v, ldv, cols);
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

float* SoftmaxBackward::gradient(const float* vt, std::size_t ldvt, std::size_t cols,
                                 const detail::ScoreMods* mods,
                                 const detail::ScoreModsGrad* grads) {
  const detail::Table& kernels = table();
  float* ds = dp_.data();
  kernels.gemm_tile(rows_, cols, dv_, do_.data(), dv_, vt, ldvt, ds, kCols, false);  // dO V^T
  // P = 2^(S - lse) and dS, the latter times ln 2: q_ holds q · scale · log2(e), so
  // dS^T q_ · ln 2 is dK; dQ = dS K · scale is finished in finish().
  kernels.softmax_grad(
      {scores_.data(), ds, kCols, lse2_.data(), delta_.data(), kLn2, rows_, mods, grads}, cols);
  return ds;
}

void SoftmaxBackward::accumulate(const float* k, std::size_t ldk, float* dk, std::size_t lddk,
                                 float* dv, std::size_t lddv, std::size_t cols) {
  const detail::Table& kernels = table();
  const float* p = scores_.data();
  const float* ds = dp_.data();
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

}  // namespace attnlab::kernels
