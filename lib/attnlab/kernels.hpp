// Small dense kernels shared by the fast variants: a register-blocked float32 GEMM for tiles
// (no BLAS threads inside our own OpenMP regions), a vectorised exp2 and the online softmax.
// The hot loops exist once per instruction set (scalar, AVX2, AVX-512), compiled separately and
// chosen at run time from the CPU, so one binary runs everywhere and uses AVX-512 where present.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnlab/mask.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab::kernels {

namespace detail {
struct ScoreMods;      // kernels_table.hpp (internal)
struct ScoreModsGrad;  // kernels_table.hpp (internal)
}  // namespace detail

/// An instruction-set path of the kernels. avx2 needs AVX2 + FMA (x86-64-v3); avx512 needs
/// AVX-512 F, BW, DQ and VL (x86-64-v4).
enum class Isa { scalar, avx2, avx512 };

/// "scalar", "avx2" or "avx512".
const char* isa_name(Isa isa);

/// Whether this build has the path and this CPU (and its operating system) can run it.
bool isa_supported(Isa isa);

/// The paths isa_supported accepts, slowest first.
std::vector<Isa> supported_isas();

/// The path the kernels take. Chosen on first use: the environment variable ATTNLAB_ISA
/// (scalar, avx2 or avx512) if set, else the fastest supported one (also when ATTNLAB_ISA names
/// a bf16 path, Bf16Path). Throws Error when ATTNLAB_ISA names an unknown path or one this CPU
/// (or build) cannot run.
Isa active_isa();

/// Makes every later kernel call take `isa` (tests and benchmarks compare paths in one process);
/// throws Error if it is not supported. Not to be called while a forward is running.
void use_isa(Isa isa);

/// Parses "scalar", "avx2" or "avx512"; throws Error naming `text` and the choices otherwise.
Isa parse_isa(const std::string& text);

/// How attention computes on bfloat16 inputs (bf16.hpp, Attention's bf16 overloads).
/// via_f32 ("bf16-via-f32"): widened to float32 (exact), the float32 kernels of active_isa(),
/// the results rounded to bf16: correct on any CPU. avx512bf16 (vdpbf16ps) and amx (tile
/// products) are named so that ATTNLAB_ISA can ask for them, but this build has no kernels for
/// them yet (issue 47): asking is an error, on a CPU that lacks them or not.
enum class Bf16Path { via_f32, avx512bf16, amx };

/// "bf16-via-f32", "avx512bf16" or "amx".
const char* bf16_path_name(Bf16Path path);

/// Whether this build has the path and this CPU can run it.
bool bf16_path_supported(Bf16Path path);

/// Whether the CPU has the instructions of `path` (AVX512_BF16; AMX-TILE and AMX-BF16), built
/// or not: what a test of that path checks before it runs, or reports as skipped.
bool cpu_has_bf16_path(Bf16Path path);

/// The bf16 path: the one ATTNLAB_ISA names (bf16-via-f32, avx512bf16 or amx; the float32
/// kernels then take the fastest path), else the fastest supported one. Throws Error, as
/// active_isa() does, when ATTNLAB_ISA names a path that is not supported, saying whether the
/// CPU or the build lacks it.
Bf16Path active_bf16_path();

/// Makes later bf16 calls take `path`; throws Error if it is not supported.
void use_bf16_path(Bf16Path path);

/// The bf16 path that ATTNLAB_ISA's `text` names, or false when it names none.
bool parse_bf16_path(const std::string& text, Bf16Path& path);

/// bf16.hpp's round_to_bf16 and widen_bf16 on bits (the kernel table's; bf16.cpp wraps them).
void round_to_bf16_bits(const float* src, std::uint16_t* dst, std::size_t n);
void widen_bf16_bits(const std::uint16_t* src, float* dst, std::size_t n);  ///< likewise

/// C[M x N] (+)= A[M x K] · B[K x N], all row-major with leading dimensions lda, ldb, ldc.
/// accumulate = false overwrites C.
void gemm_tile(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
               const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate);

/// C[M x N] (+)= A^T · B with A given as its transpose, element (i, p) of A at a[p * lda + i]
/// (A^T is [K x M] row-major); otherwise as gemm_tile. Reads a tile transposed in place.
void gemm_tile_at(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                  const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate);

/// x[i] = 2^x[i]; inputs below -126 (including -inf) give exactly 0.
void exp2_inplace(float* x, std::size_t n);

/// x[i] = 2^(x[i] - shift), returning the sum of the results (the softmax's inner loop).
float exp2_shifted_sum(float* x, std::size_t n, float shift);

/// The score modifiers (kernels_table.hpp's ScoreMods: soft-capping, additive row, column,
/// ALiBi and bias terms, row ranges) on `rows` x `cols` scores s[r * ld + c], in place: what
/// OnlineSoftmax::fold and SoftmaxBackward::gradient apply on the way, for callers that keep
/// their own softmax (the decoder's KV cache) and for tests.
void score_mods(const detail::ScoreMods& mods, float* scores, std::size_t ld, std::size_t rows,
                std::size_t cols);

/// max of x[0..n); -infinity when n = 0.
float row_max(const float* x, std::size_t n);

/// scores[r * ld + j] = q_r · key_j for r < rows, j < cols: a group of query rows q[r * dk + p]
/// against keys stored row by row, keys[j * dk + p] (the decoder's KV cache), each key read once
/// for the whole group.
void row_dots(std::size_t rows, std::size_t cols, std::size_t dk, const float* q, const float* keys,
              float* scores, std::size_t ld);

/// dst[c * ldd + j] = src[j * lds + c] for j < rows, c < cols (the two must not overlap).
void transpose(std::size_t rows, std::size_t cols, const float* src, std::size_t lds, float* dst,
               std::size_t ldd);

/// k [B, H, Nk, Dk] transposed so that score tiles are plain GEMMs, parallel over heads (OpenMP;
/// call it outside your own parallel region). block = 0: each head is one [Dk, Nk] matrix (key j
/// of head bh at kt[bh * Dk * Nk + c * Nk + j]). block > 0: each head is ceil(Nk / block) tiles
/// of [Dk, block], zero-padded, contiguous (key j at kt[bh * per_head + (j / block) * Dk * block
/// + c * block + j % block]): short unit strides, no cache-set aliasing at power-of-two Nk.
std::vector<float> transpose_keys(TensorRef k, const Dims& d, std::size_t block = 0);

/// Marks [data, data + bytes) for transparent huge pages (Linux madvise MADV_HUGEPAGE on the
/// 2 MiB-aligned part, a hint; nothing elsewhere or below 2 MiB). Call it before the first write:
/// on our VM the 4 KiB page faults of a fresh 64 MiB buffer cost 0.3 to 0.9 s, with huge pages
/// 0.02 s. The one place the library asks for huge pages (scratch_floats, the model layers).
void prefer_huge_pages(void* data, std::size_t bytes);

/// An uninitialised container of `shape` (xtensor's from_shape) marked by prefer_huge_pages.
template <class Container>
Container uninitialized(const typename Container::shape_type& shape) {
  Container c = Container::from_shape(shape);
  prefer_huge_pages(c.data(), c.size() * sizeof(typename Container::value_type));
  return c;
}

/// Gives `buffer` the shape `shape`, allocating (uninitialized) only when its shape differs, so
/// a caller's storage is kept from one call to the next: the outputs of forward and backward,
/// the traces and workspaces of a training step (a fresh buffer costs its page faults, about as
/// much as the GEMM that fills it at the models' sizes).
template <class Container>
Container& shape_buffer(Container& buffer, const typename Container::shape_type& shape) {
  if (buffer.shape() != shape) buffer = uninitialized<Container>(shape);
  return buffer;
}

/// An uninitialised buffer of n floats for a forward's scratch (key layouts). From 2 MiB up it is
/// 2 MiB-aligned and marked by prefer_huge_pages: a fresh buffer
/// of that size is mapped anew on every call, and 4 KiB page faults cost several microseconds
/// each on a VM (bigbird's layouts at N = 65536: ~8,500 faults, 11% of a forward).
std::unique_ptr<float[], void (*)(void*)> scratch_floats(std::size_t n);

/// Keys [j0, j1) of one head, k[j * dk + c], into that head's transpose_keys(.., block) tiles kt;
/// j0 is a multiple of block and padding columns are left as they are. The piece a variant that
/// lays out one head at a time (so that it stays in cache) shares among its threads.
void transpose_key_tiles(const float* k, std::size_t dk, std::size_t block, std::size_t j0,
                         std::size_t j1, float* kt);

/// The online softmax of FlashAttention (Dao et al. 2022) for one tile of at most kRows queries:
/// scores against any sequence of key blocks (contiguous, strided or gathered) are folded into a
/// running max, sum and output, so no full row of scores is ever formed. One object per thread.
/// Typical use: start(q); for each key block { s = scores(kt, ldk, cols); mask s with -inf;
/// fold(v, ldv, cols); } finish(out, ldo).
class OnlineSoftmax {
 public:
  static constexpr std::size_t kRows = 48;   ///< a multiple of the 6-row GEMM block
  static constexpr std::size_t kCols = 128;  ///< a 48 x 128 score tile stays in L1/L2

  /// Scratch for queries of head dim `dk` and values of dim `dv`.
  OnlineSoftmax(std::size_t dk, std::size_t dv);

  /// Starts `rows` <= kRows queries q[r * dk + c] with softmax scale `scale`.
  void start(const float* q, std::size_t rows, float scale) { start(q, dk_, rows, scale); }

  /// Starts `rows` <= kRows queries q[r * ldq + c]; `sink` (natural log, -infinity: none) is a
  /// logit that joins every row's denominator and adds nothing to its output (attention sinks).
  void start(const float* q, std::size_t ldq, std::size_t rows, float scale,
             float sink = -std::numeric_limits<float>::infinity());

  /// Scores (in log2 units) of the current queries against `cols` <= kCols keys given transposed,
  /// kt[c * ldk + j]. Returns the tile, row stride kCols: set entries to -infinity to mask them.
  float* scores(const float* kt, std::size_t ldk, std::size_t cols);

  /// Folds the masked score tile and the matching values v[j * ldv + c] into the running state.
  /// With `mods`, the tile is first modified by them (score_mods, row ranges included) in the
  /// pass that finds each row's max: no sweep of their own.
  void fold(const float* v, std::size_t ldv, std::size_t cols,
            const detail::ScoreMods* mods = nullptr);

  /// Writes the normalised rows, out[r * ldo + c]; a row that saw no key at all is zeros. With
  /// lse, also each row's log-sum-exp (natural log, -infinity for no key) at lse[r * ld_lse].
  void finish(float* out, std::size_t ldo, float* lse = nullptr, std::size_t ld_lse = 1) const;

  /// The number of queries started.
  std::size_t rows() const { return rows_; }

 private:
  std::size_t dk_, dv_, rows_ = 0;
  std::vector<float> q_, scores_, acc_, max_, sum_;
};

/// The backward of OnlineSoftmax, FlashAttention-2's (Dao 2023): for one tile of at most kRows
/// queries whose row log-sum-exp the forward saved, every masked score tile is turned back into
/// probabilities P = exp(S - lse), and dS = P ∘ (dO V^T - rowsum(dO ∘ O)) is pushed into dQ
/// (kept here), dK and dV (the caller's accumulators): no row of P outlives its tile. One object
/// per thread. Typical use: start(...); for each key block { s = scores(kt, ldk, cols); mask s
/// with -inf exactly as the forward did; backprop(...) (or gradient(...), then whatever the
/// caller takes from dS, then accumulate(...)); } finish(dq, lddq).
class SoftmaxBackward {
 public:
  /// Queries per tile, at most: twice the forward's, so that each key block's K, V and the dK,
  /// dV it adds into (streamed from L3 at long N: 20 MB a head at N = 16384) serve twice the
  /// queries.
  static constexpr std::size_t kRows = 2 * OnlineSoftmax::kRows;
  static constexpr std::size_t kCols = OnlineSoftmax::kCols;  ///< keys per score tile, at most

  /// Scratch for tiles of head size dk (queries, keys) and dv (values).
  SoftmaxBackward(std::size_t dk, std::size_t dv);

  /// Starts `rows` <= kRows queries: q[r * ldq + c], their forward output and its gradient
  /// out[r * ldo + c], d_out[r * ldo + c], their log-sum-exp lse[r * ld_lse] (natural log).
  void start(const float* q, std::size_t ldq, const float* out, const float* d_out, std::size_t ldo,
             const float* lse, std::size_t ld_lse, std::size_t rows, float scale);

  /// As OnlineSoftmax::scores: the current queries against `cols` <= kCols keys given
  /// transposed, kt[c * ldk + j]; the returned tile (row stride kCols) is to be masked with -inf.
  float* scores(const float* kt, std::size_t ldk, std::size_t cols);

  /// The keys of the masked tile: their rows k[j * ldk + c], their values transposed
  /// vt[c * ldvt + j]; adds their gradients into dk[j * lddk + c] and dv[j * lddv + c].
  void backprop(const float* k, std::size_t ldk, const float* vt, std::size_t ldvt, float* dk,
                std::size_t lddk, float* dv, std::size_t lddv, std::size_t cols) {
    gradient(vt, ldvt, cols);
    accumulate(k, ldk, dk, lddk, dv, lddv, cols);
  }

  /// backprop's first half: turns the masked tile into P and returns dS · ln 2 (row stride kCols)
  /// for the caller to read or change before accumulate() uses it. With `mods`, the tile is
  /// first modified by them exactly as the forward's fold did, `grads` (when not null) takes the
  /// modifiers' gradients from dS, and the returned dS is the raw scores' (the soft-cap's chain
  /// rule applied): all in the one pass that computes P and dS.
  float* gradient(const float* vt, std::size_t ldvt, std::size_t cols,
                  const detail::ScoreMods* mods = nullptr,
                  const detail::ScoreModsGrad* grads = nullptr);

  /// backprop's second half: dV += P^T dO, dK += dS^T Q and the queries' dQ += dS K.
  void accumulate(const float* k, std::size_t ldk, float* dk, std::size_t lddk, float* dv,
                  std::size_t lddv, std::size_t cols);

  /// Row r's rowsum(dO ∘ O) (the softmax Jacobian's rank-one part).
  float delta(std::size_t r) const { return delta_[r]; }

  /// Writes the queries' gradients, dq[r * lddq + c].
  void finish(float* dq, std::size_t lddq) const;

  /// The rows of the current tile.
  std::size_t rows() const { return rows_; }

 private:
  std::size_t dk_, dv_, rows_ = 0;
  float scale_ = 1.0f;
  std::vector<float> q_, do_, delta_, lse2_, scores_, dp_, dq_;
};

}  // namespace attnlab::kernels
