#include "variants/linear_scan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "attnlab/decoder.hpp"
#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/kernels.hpp"

namespace attnlab {
namespace scan {
namespace {

constexpr std::size_t C = kChunk;

// out[n] = x[m] · M[m x n].
void vec_mat(const float* x, const float* m, std::size_t rows, std::size_t n, float* out) {
  kernels::gemm_tile(1, n, rows, x, rows, m, n, out, n, false);
}

// s[dk x dv] += x[dk] y[dv]^T.
void rank1(float* s, const float* x, const float* y, std::size_t dk, std::size_t dv) {
  kernels::gemm_tile(dk, dv, 1, x, 1, y, dv, s, dv, true);
}

// The triangular products of a chunk, in row blocks of kBand that skip the blocks above the
// diagonal (a quarter of each product at C = 64).
constexpr std::size_t kBand = 32;

// C[m x n] = A[m x k] · B[k x n] where only the lower triangle of C will be read (j <= i): row
// block [r0, r1) computes columns [0, r1) alone, the rest of it is left as it was.
void lower_result(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                  const float* b, std::size_t ldb, float* c, std::size_t ldc) {
  for (std::size_t r0 = 0; r0 < m; r0 += kBand) {
    const std::size_t r1 = std::min(m, r0 + kBand);
    kernels::gemm_tile(r1 - r0, std::min(n, r1), k, a + r0 * lda, lda, b, ldb, c + r0 * ldc, ldc,
                       false);
  }
}

// C[m x n] (+)= A[m x k] · B with A lower-triangular (A_ij = 0 for j > i): row block [r0, r1)
// reads A's first r1 columns.
void lower_times(std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                 const float* b, std::size_t ldb, float* c, std::size_t ldc, bool accumulate) {
  for (std::size_t r0 = 0; r0 < m; r0 += kBand) {
    const std::size_t r1 = std::min(m, r0 + kBand);
    kernels::gemm_tile(r1 - r0, n, std::min(k, r1), a + r0 * lda, lda, b, ldb, c + r0 * ldc, ldc,
                       accumulate);
  }
}

// C[m x n] (+)= X^T · B with X [k x m] lower-triangular (X_pi = 0 for i > p), given as X, and
// m <= k (a chunk's keys are never more than its rows): row block [r0, r1) of C reads X's rows
// from r0 on.
void lower_transposed_times(std::size_t m, std::size_t n, std::size_t k, const float* x,
                            std::size_t ldx, const float* b, std::size_t ldb, float* c,
                            std::size_t ldc, bool accumulate) {
  for (std::size_t r0 = 0; r0 < m; r0 += kBand) {
    const std::size_t r1 = std::min(m, r0 + kBand);
    kernels::gemm_tile_at(r1 - r0, n, k - r0, x + r0 * ldx + r0, ldx, b + r0 * ldb, ldb,
                          c + r0 * ldc, ldc, accumulate);
  }
}

// Per-thread scratch of one chunk.
struct Chunk {
  std::size_t dk, dv;
  std::vector<double> b, db;                // cumulative log-decay within the chunk, its gradient
  std::vector<float> eb, tail, e;           // e^{b_i}, e^{b_last - b_j}, E_ij = e^{b_i - b_j}
  std::vector<float> qp, kp, qnorm, knorm;  // the chunk's prepared q and k rows, their norms
  std::vector<float> kt, kk, t, r, x, u, a, qd, kdt, vt, st, da, du, dr, pred, m;
  Chunk(std::size_t dk_, std::size_t dv_)
      : dk(dk_),
        dv(dv_),
        b(C),
        db(C),
        eb(C),
        tail(C),
        e(C * C),
        qp(C * dk),
        kp(C * dk),
        qnorm(C),
        knorm(C),
        kt(dk * C),
        kk(C * C),
        t(C * C),
        r(C * (dv + dk)),
        x(C * (dv + dk)),
        u(C * dv),
        a(C * C),
        qd(C * dk),
        kdt(dk * C),
        vt(dv * C),
        st(dv * dk),
        da(C * C),
        du(C * dv),
        dr(C * dv),
        pred(C * dv),
        m(C * C) {}
};

constexpr float kNormEps = 1e-6f;

// rows of x [rows x dim] times `scale` into out, each first normalised to x / sqrt(|x|^2 + eps)
// when `normalise` (norms[i] = sqrt(|x_i|^2 + eps) then).
void prepare_rows(const float* x, std::size_t rows, std::size_t dim, bool normalise, float scale,
                  float* out, float* norms) {
  for (std::size_t i = 0; i < rows; ++i) {
    const float* row = x + i * dim;
    float f = scale;
    if (normalise) {  // float partial sums: a float64 chain cost 15 % of the delta forward
      norms[i] = std::sqrt(dot(row, row, dim) + kNormEps);
      f = scale / norms[i];
    }
    for (std::size_t c = 0; c < dim; ++c) out[i * dim + c] = f * row[c];
  }
}

// d, the gradient of prepare_rows' out, into that of x in place: scale · (d - xhat (xhat·d)) /
// norm with xhat = x / norm.
void prepare_rows_backward(const float* x, std::size_t rows, std::size_t dim, bool normalise,
                           float scale, const float* norms, float* d) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* di = d + i * dim;
    if (!normalise) {
      for (std::size_t c = 0; c < dim; ++c) di[c] *= scale;
      continue;
    }
    const float* row = x + i * dim;
    const float along = scale / norms[i];  // in float, vectorised: float64 cost 6 % of a backward
    const float across = along * dot(row, di, dim) / (norms[i] * norms[i]);
    for (std::size_t c = 0; c < dim; ++c) di[c] = along * di[c] - across * row[c];
  }
}

bool queries_as_given(const Head& h) {
  return !h.normalise && h.q_scale == 1.0f;
}

// The chunk's queries (`rows` from t0) as the engine reads them: the head's own rows, or
// prepared into w.qp (their norms in w.qnorm). Preparing chunk by chunk keeps them in cache.
const float* chunk_queries(const Head& h, std::size_t t0, std::size_t rows, Chunk& w) {
  const float* q = h.q + t0 * w.dk;
  if (queries_as_given(h)) return q;
  prepare_rows(q, rows, w.dk, h.normalise, h.q_scale, w.qp.data(), w.qnorm.data());
  return w.qp.data();
}

// The chunk's keys (`kv` from t0) as chunk_queries: normalised into w.kp when the head asks.
const float* chunk_keys(const Head& h, std::size_t t0, std::size_t kv, Chunk& w) {
  const float* k = h.k + t0 * w.dk;
  if (!h.normalise) return k;
  prepare_rows(k, kv, w.dk, true, 1.0f, w.kp.data(), w.knorm.data());
  return w.kp.data();
}

constexpr double kLog2e = 1.4426950408889634;

// The chunk's decay factors from g, every one exp of a difference <= 0 taken in float64 (so
// that the sum of large g does not swallow small ones) and exponentiated by the vectorised
// exp2 (exactly 0 below 2^-126).
void decay_factors(const float* g, std::size_t rows, std::size_t kv, Chunk& w) {
  double acc = 0.0;
  for (std::size_t i = 0; i < rows; ++i) {
    if (i < kv) acc += g[i];
    w.b[i] = acc;
  }
  const double last = kv > 0 ? w.b[kv - 1] : 0.0;
  for (std::size_t i = 0; i < rows; ++i) {
    w.eb[i] = static_cast<float>(w.b[i] * kLog2e);
    w.tail[i] = static_cast<float>((last - w.b[i]) * kLog2e);
    float* row = &w.e[i * C];
    for (std::size_t j = 0; j < kv; ++j)
      row[j] = j <= i ? static_cast<float>((w.b[i] - w.b[j]) * kLog2e)
                      : -std::numeric_limits<float>::infinity();
    kernels::exp2_inplace(row, kv);
  }
  kernels::exp2_inplace(w.eb.data(), rows);
  kernels::exp2_inplace(w.tail.data(), rows);
}

// m[rows x kv] (row stride C) ∘ E when decaying, its upper triangle zeroed (whatever it held:
// the products leave it unwritten): what token i of the chunk sees of token j.
void causal_weights(float* m, std::size_t rows, std::size_t kv, bool decays, const Chunk& w) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* row = m + i * C;
    const std::size_t seen = std::min(i + 1, kv);
    if (decays) {
      const float* e = &w.e[i * C];
      for (std::size_t j = 0; j < seen; ++j) row[j] *= e[j];
    }
    if (seen < kv) std::fill(row + seen, row + kv, 0.0f);
  }
}

// rows of x [rows x dim], times f[i] each, into out.
void scale_rows(const float* x, const float* f, std::size_t rows, std::size_t dim, float* out) {
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < dim; ++c) out[i * dim + c] = f[i] * x[i * dim + c];
}

// The delta rule's pseudo-values U [kv x dv] of the chunk from t0 (into w.u), from its keys k
// (chunk_keys) and the state s before it; leaves T = (I + L)^{-1} in w.t and K K^T in w.kk.
// Needs decay_factors (when decaying) and w.kt, the chunk's keys transposed.
// Per-channel decay: `ke` = K ∘ e^b and w.kk already holding sum_c k_ic k_jc e^{b_ic - b_jc}
// below the diagonal (channel_scores), so that L_ij = beta_i w.kk_ij and R's key part is beta ke.
const float* pseudo_values(const Head& h, std::size_t t0, std::size_t kv, const float* k,
                           const float* s, Chunk& w, const float* ke = nullptr) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* v = h.v + t0 * dv;
  const float* beta = h.beta + t0;
  const bool decays = h.g != nullptr;
  if (!ke)
    lower_result(kv, kv, dk, k, dk, w.kt.data(), C, w.kk.data(), C);  // read below the diagonal
  // T = (I + L)^{-1} row by row: T_i = e_i - L_i T, one vector-matrix product per row (over
  // T's rows above i, zero right of their diagonal; a loop of row updates through memory was
  // bound by store-to-load latency). Then X = T [diag(beta) V | diag(beta e^b) K] as one
  // product, U = X_V - X_K S.
  const std::size_t wide = dv + dk;
  for (std::size_t i = 0; i < kv; ++i) {
    float* ti = &w.t[i * C];
    std::fill(ti + i + 1, ti + kv, 0.0f);
    if (i > 0) {
      float* minus_l = &w.m[i * C];
      for (std::size_t j = 0; j < i; ++j)
        minus_l[j] = ke ? -beta[i] * w.kk[i * C + j]
                        : -beta[i] * (decays ? w.e[i * C + j] : 1.0f) * w.kk[i * C + j];
      kernels::gemm_tile(1, i, i, minus_l, C, w.t.data(), C, ti, C, false);
    }
    ti[i] = 1.0f;
    const float eb = decays ? w.eb[i] : 1.0f;
    float* r = &w.r[i * wide];
    for (std::size_t c = 0; c < dv; ++c) r[c] = beta[i] * v[i * dv + c];
    if (ke)
      for (std::size_t c = 0; c < dk; ++c) r[dv + c] = beta[i] * ke[i * dk + c];
    else
      for (std::size_t c = 0; c < dk; ++c) r[dv + c] = beta[i] * eb * k[i * dk + c];
  }
  lower_times(kv, wide, kv, w.t.data(), C, w.r.data(), wide, w.x.data(), wide, false);
  // U = X_V - X_K S
  kernels::gemm_tile(kv, dv, dk, w.x.data() + dv, wide, s, dv, w.u.data(), dv, false);
  for (std::size_t i = 0; i < kv; ++i)
    for (std::size_t c = 0; c < dv; ++c) w.u[i * dv + c] = w.x[i * wide + c] - w.u[i * dv + c];
  return w.u.data();
}

// One chunk of `rows` tokens from t0, of which the first kv write: reads (causal, into out and,
// when z is carried, den) and then advances s (and z) to the chunk's end.
void chunk(const Head& h, std::size_t t0, std::size_t rows, std::size_t kv, float* s, float* z,
           float* out, float* den, Chunk& w) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* k = chunk_keys(h, t0, kv, w);
  const float* v = h.v + t0 * dv;
  const bool decays = h.g != nullptr;
  if (decays) decay_factors(h.g + t0, rows, kv, w);
  kernels::transpose(kv, dk, k, dk, w.kt.data(), C);
  const float* u = h.beta && kv > 0 ? pseudo_values(h, t0, kv, k, s, w) : v;
  if (out) {  // O = diag(e^b) Q S_0 + (Q K^T ∘ E) U; den = diag(e^b) Q z_0 + (Q K^T ∘ E) 1
    const float* q = chunk_queries(h, t0, rows, w);
    const float* qd = q;
    if (decays) {
      scale_rows(q, w.eb.data(), rows, dk, w.qd.data());
      qd = w.qd.data();
    }
    float* o = out + t0 * dv;
    kernels::gemm_tile(rows, dv, dk, qd, dk, s, dv, o, dv, false);
    if (den)
      for (std::size_t i = 0; i < rows; ++i) den[t0 + i] = dot(qd + i * dk, z, dk);
    if (kv > 0) {
      lower_result(rows, kv, dk, q, dk, w.kt.data(), C, w.a.data(), C);
      causal_weights(w.a.data(), rows, kv, decays, w);
      lower_times(rows, dv, kv, w.a.data(), C, u, dv, o, dv, true);
      if (den)
        for (std::size_t i = 0; i < rows; ++i) den[t0 + i] += sum(&w.a[i * C], kv);
    }
  }
  if (kv == 0) return;
  // S_C = e^{b_C} S_0 + (diag(e^{b_C - b}) K)^T U, z_C = e^{b_C} z_0 + K^T e^{b_C - b}
  const float* kdt = w.kt.data();
  if (decays) {
    const float decay = w.eb[kv - 1];
    if (decay != 1.0f) {
      for (std::size_t i = 0; i < dk * dv; ++i) s[i] *= decay;
      if (z)
        for (std::size_t r = 0; r < dk; ++r) z[r] *= decay;
    }
    for (std::size_t r = 0; r < dk; ++r)
      for (std::size_t j = 0; j < kv; ++j) w.kdt[r * C + j] = w.tail[j] * w.kt[r * C + j];
    kdt = w.kdt.data();
  }
  kernels::gemm_tile(dk, dv, kv, kdt, C, u, dv, s, dv, true);
  if (z)
    for (std::size_t r = 0; r < dk; ++r) z[r] += sum(kdt + r * C, kv);
}

// Walks the chunks: positions are the queries' (causal) or the writes (non-causal). s holds
// state_floats(dk, dv): S, then z (carried when key_sum).
void run_chunks(const Head& h, std::size_t dk, std::size_t dv, bool key_sum, float* s, float* out,
                float* den, float* checkpoints, Chunk& w) {
  const std::size_t state = state_floats(dk, dv);
  std::fill(s, s + state, 0.0f);
  if (h.initial) std::copy(h.initial, h.initial + dk * dv, s);
  float* z = key_sum ? s + dk * dv : nullptr;
  if (z && h.initial_key_sum) std::copy(h.initial_key_sum, h.initial_key_sum + dk, z);
  const std::size_t positions = h.causal ? h.nk : h.valid;
  for (std::size_t t0 = 0, c = 0; t0 < positions; t0 += C, ++c) {
    if (checkpoints) std::copy(s, s + state, checkpoints + c * state);
    const std::size_t rows = std::min(C, positions - t0);
    const std::size_t kv = std::min(rows, h.valid > t0 ? h.valid - t0 : 0);
    chunk(h, t0, rows, kv, s, z, h.causal ? out : nullptr, h.causal ? den : nullptr, w);
  }
}

// Where one head's gradients go (see backward()).
struct Grads {
  const float* d_out;
  const float* d_den;
  float *dq, *dk, *dv, *dg, *dbeta;
};

// ---- Per-channel decay: the chunked form with sub-chunks (see the header) ----

// Tokens per sub-chunk: pairs inside one are weighted elementwise (a product per pair and
// channel, advance_pairs), pairs across two by one matrix product of factored rows.
constexpr std::size_t kSub = 16;

// Per-thread scratch of one chunk under a per-channel decay (rows of dk unless said).
struct ChannelChunk {
  std::size_t dk;
  std::vector<double> b;           // [C] rows: cumulative log-decay per channel in the chunk
  std::vector<float> decay, tail;  // e^{b_i}, e^{b_last - b_j}
  std::vector<float> step;         // e^{g_i} (1 for padding): one token's decay
  std::vector<float> qf, qs;       // [kSub]: e^{b_i - ref}, q_i times it (ref: b at r0)
  std::vector<float> kf, ks, kst;  // [C]: e^{ref - b_j}, k_j times it, ks transposed [dk x C]
  std::vector<float> pair, grad;   // [kSub]: e^{b_i - b_j} of one row; [C]: a product's rows
  std::vector<float> db;           // [C]: the gradient of b
  std::vector<float> ke, dk_rows;  // [C] delta rule: K ∘ e^b; key gradients whose b_i grows
  explicit ChannelChunk(std::size_t dk_)
      : dk(dk_),
        b(C * dk_),
        decay(C * dk_),
        tail(C * dk_),
        step(C * dk_),
        qf(kSub * dk_),
        qs(kSub * dk_),
        kf(C * dk_),
        ks(C * dk_),
        kst(dk_ * C),
        pair(kSub * dk_),
        grad(C * dk_),
        db(C * dk_),
        ke(C * dk_),
        dk_rows(C * dk_) {}
};

// b, decay and tail of the chunk from g [rows x dk]: b summed in float64 (a g of -1e4 does not
// swallow the small ones after it), every exponent a difference <= 0, exponentiated by the
// vectorised exp2 (exactly 0 below 2^-126). Rows from kv on hold b at kv - 1 (padding).
void channel_decays(const float* g, std::size_t rows, std::size_t kv, ChannelChunk& cc) {
  const std::size_t dk = cc.dk;
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < dk; ++c) {
      const double before = i > 0 ? cc.b[(i - 1) * dk + c] : 0.0;
      cc.b[i * dk + c] = before + (i < kv ? g[i * dk + c] : 0.0f);
      cc.decay[i * dk + c] = static_cast<float>(cc.b[i * dk + c] * kLog2e);
      cc.step[i * dk + c] = i < kv ? g[i * dk + c] * static_cast<float>(kLog2e) : 0.0f;
    }
  kernels::exp2_inplace(cc.decay.data(), rows * dk);
  kernels::exp2_inplace(cc.step.data(), rows * dk);
  if (kv == 0) return;
  const double* last = &cc.b[(kv - 1) * dk];
  for (std::size_t j = 0; j < kv; ++j)
    for (std::size_t c = 0; c < dk; ++c)
      cc.tail[j * dk + c] = static_cast<float>((last[c] - cc.b[j * dk + c]) * kLog2e);
  kernels::exp2_inplace(cc.tail.data(), kv * dk);
}

// The factored rows of query sub-chunk [r0, r1) against the `before` keys of earlier
// sub-chunks, with ref = b_{r0}: qs_i = q_i ∘ e^{b_i - ref}, ks_j = k_j ∘ e^{ref - b_j}. b never
// grows, so both exponents are <= 0 and qs_i · ks_j = sum_c q_ic k_jc e^{b_ic - b_jc}; a factor
// that underflows to 0 stands for a product below it.
void sub_chunk_factors(const float* q, const float* k, std::size_t r0, std::size_t r1,
                       std::size_t before, ChannelChunk& cc) {
  const std::size_t dk = cc.dk;
  const double* ref = &cc.b[r0 * dk];
  for (std::size_t i = r0; i < r1; ++i)
    for (std::size_t c = 0; c < dk; ++c)
      cc.qf[(i - r0) * dk + c] = static_cast<float>((cc.b[i * dk + c] - ref[c]) * kLog2e);
  for (std::size_t j = 0; j < before; ++j)
    for (std::size_t c = 0; c < dk; ++c)
      cc.kf[j * dk + c] = static_cast<float>((ref[c] - cc.b[j * dk + c]) * kLog2e);
  kernels::exp2_inplace(cc.qf.data(), (r1 - r0) * dk);
  kernels::exp2_inplace(cc.kf.data(), before * dk);
  for (std::size_t x = 0; x < (r1 - r0) * dk; ++x) cc.qs[x] = q[r0 * dk + x] * cc.qf[x];
  for (std::size_t x = 0; x < before * dk; ++x) cc.ks[x] = k[x] * cc.kf[x];
}

// The weights of row i's pairs inside its sub-chunk from r0, e^{b_i - b_j} per channel for the
// keys j in [r0, min(i + 1, kv)), in cc.pair row j - r0: row i - 1's times e^{g_i}, and 1 for
// j = i. Products of one-step decays (each <= 1, a relative error of one rounding per step):
// no exponential per pair, and -1e4 gives exact zeros as the direct exp(b_i - b_j) would.
void advance_pairs(std::size_t i, std::size_t r0, std::size_t kv, ChannelChunk& cc) {
  const std::size_t dk = cc.dk;
  const float* a = &cc.step[i * dk];
  for (std::size_t j = r0; j < std::min(i, kv); ++j) {
    float* e = &cc.pair[(j - r0) * dk];
    for (std::size_t c = 0; c < dk; ++c) e[c] *= a[c];
  }
  if (i < kv) std::fill_n(&cc.pair[(i - r0) * dk], dk, 1.0f);
}

// A [rows x kv] (row stride C), A_ij = sum_c q_ic k_jc e^{b_ic - b_jc} for j <= i, 0 above:
// across sub-chunks one product of factored rows per query sub-chunk, within one elementwise.
void channel_scores(const float* q, const float* k, std::size_t rows, std::size_t kv,
                    ChannelChunk& cc, float* a) {
  const std::size_t dk = cc.dk;
  for (std::size_t r0 = 0; r0 < rows; r0 += kSub) {
    const std::size_t r1 = std::min(rows, r0 + kSub), before = std::min(r0, kv);
    if (before > 0) {
      sub_chunk_factors(q, k, r0, r1, before, cc);
      kernels::transpose(before, dk, cc.ks.data(), dk, cc.kst.data(), C);
      kernels::gemm_tile(r1 - r0, before, dk, cc.qs.data(), dk, cc.kst.data(), C, a + r0 * C, C,
                         false);
    }
    for (std::size_t i = r0; i < r1; ++i) {
      float* row = a + i * C;
      const std::size_t seen = std::min(i + 1, kv);
      if (seen > r0) {
        advance_pairs(i, r0, kv, cc);
        for (std::size_t j = r0; j < seen; ++j) {
          const float* e = &cc.pair[(j - r0) * dk];
          for (std::size_t c = 0; c < dk; ++c) cc.grad[c] = e[c] * k[j * dk + c];
          row[j] = dot(q + i * dk, cc.grad.data(), dk);
        }
      }
      std::fill(row + std::max(seen, before), row + kv, 0.0f);
    }
  }
}

// channel_scores' gradients: given dA (lower, row stride C), adds sum_j dA_ij k_j ∘ e^{b_i - b_j}
// into dq_i and sum_i dA_ij q_i ∘ e^{b_i - b_j} into dk_j, in the same factored and elementwise
// parts.
void channel_scores_backward(const float* q, const float* k, std::size_t rows, std::size_t kv,
                             const float* da, ChannelChunk& cc, float* dq, float* dk_out) {
  const std::size_t dk = cc.dk;
  for (std::size_t r0 = 0; r0 < rows; r0 += kSub) {
    const std::size_t r1 = std::min(rows, r0 + kSub), before = std::min(r0, kv);
    if (before > 0) {
      sub_chunk_factors(q, k, r0, r1, before, cc);
      kernels::gemm_tile(r1 - r0, dk, before, da + r0 * C, C, cc.ks.data(), dk, cc.grad.data(), dk,
                         false);
      for (std::size_t x = 0; x < (r1 - r0) * dk; ++x) dq[r0 * dk + x] += cc.grad[x] * cc.qf[x];
      kernels::gemm_tile_at(before, dk, r1 - r0, da + r0 * C, C, cc.qs.data(), dk, cc.grad.data(),
                            dk, false);
      for (std::size_t x = 0; x < before * dk; ++x) dk_out[x] += cc.grad[x] * cc.kf[x];
    }
    for (std::size_t i = r0; i < r1; ++i) {
      const std::size_t seen = std::min(i + 1, kv);
      if (seen <= r0) continue;
      advance_pairs(i, r0, kv, cc);
      const float* qi = q + i * dk;
      float* dqi = dq + i * dk;
      for (std::size_t j = r0; j < seen; ++j) {
        const float x = da[i * C + j];
        const float* e = &cc.pair[(j - r0) * dk];  // e^{b_i - b_j}
        const float* kj = k + j * dk;
        float* dkj = dk_out + j * dk;
        for (std::size_t c = 0; c < dk; ++c) {
          dqi[c] += x * kj[c] * e[c];
          dkj[c] += x * qi[c] * e[c];
        }
      }
    }
  }
}

// The delta rule's pseudo-values U of the chunk under a per-channel decay (into w.u): the WY
// form of the header with L_ij = beta_i sum_c k_ic k_jc e^{b_ic - b_jc} (channel_scores, into
// w.kk) and R = diag(beta) (V - (K ∘ e^b) S_0) (K ∘ e^b into cc.ke); T left in w.t.
const float* channel_pseudo_values(const Head& h, std::size_t t0, std::size_t kv, const float* k,
                                   const float* s, Chunk& w, ChannelChunk& cc) {
  channel_scores(k, k, kv, kv, cc, w.kk.data());  // its diagonal is not read
  for (std::size_t x = 0; x < kv * w.dk; ++x) cc.ke[x] = k[x] * cc.decay[x];
  return pseudo_values(h, t0, kv, k, s, w, cc.ke.data());
}

// One chunk under a per-channel decay, as chunk(): with Qd = Q ∘ e^b, Kt = K ∘ e^{b_last - b}
// and U = V (sum rule) or the pseudo-values (delta rule),
//   O = Qd S_0 + A U,  S_C = Diag(e^{b_last}) S_0 + Kt^T U.
void channel_chunk(const Head& h, std::size_t t0, std::size_t rows, std::size_t kv, float* s,
                   float* out, Chunk& w, ChannelChunk& cc) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* k = chunk_keys(h, t0, kv, w);
  channel_decays(h.gc + t0 * dk, rows, kv, cc);
  const float* v = h.beta && kv > 0 ? channel_pseudo_values(h, t0, kv, k, s, w, cc) : h.v + t0 * dv;
  if (out) {
    const float* q = chunk_queries(h, t0, rows, w);
    for (std::size_t x = 0; x < rows * dk; ++x) w.qd[x] = q[x] * cc.decay[x];
    float* o = out + t0 * dv;
    kernels::gemm_tile(rows, dv, dk, w.qd.data(), dk, s, dv, o, dv, false);
    if (kv > 0) {
      channel_scores(q, k, rows, kv, cc, w.a.data());
      lower_times(rows, dv, kv, w.a.data(), C, v, dv, o, dv, true);
    }
  }
  if (kv == 0) return;
  const float* last = &cc.decay[(kv - 1) * dk];
  for (std::size_t r = 0; r < dk; ++r)
    for (std::size_t c = 0; c < dv; ++c) s[r * dv + c] *= last[r];
  for (std::size_t x = 0; x < kv * dk; ++x) w.qd[x] = k[x] * cc.tail[x];
  kernels::gemm_tile_at(dk, dv, kv, w.qd.data(), dk, v, dv, s, dv, true);
}

// run_chunks' walk for a per-channel decay (no key sum).
void channel_run_chunks(const Head& h, std::size_t dk, std::size_t dv, float* s, float* out,
                        float* checkpoints, Chunk& w) {
  const std::size_t state = state_floats(dk, dv);
  std::fill(s, s + state, 0.0f);
  if (h.initial) std::copy(h.initial, h.initial + dk * dv, s);
  ChannelChunk cc(dk);
  const std::size_t positions = h.causal ? h.nk : h.valid;
  for (std::size_t t0 = 0, c = 0; t0 < positions; t0 += C, ++c) {
    if (checkpoints) std::copy(s, s + state, checkpoints + c * state);
    const std::size_t rows = std::min(C, positions - t0);
    const std::size_t kv = std::min(rows, h.valid > t0 ? h.valid - t0 : 0);
    channel_chunk(h, t0, rows, kv, s, h.causal ? out : nullptr, w, cc);
  }
}

// The delta rule's part of channel_chunk_backward_chunked, after it has dU in w.du (as
// delta_backward, per channel; channel_pseudo_values left T, U, the L's weights and Ke = K ∘ e^b):
//   dR = T^T dU, dV = diag(beta) dR, dS_0 -= (diag(beta) Ke)^T dR,
//   dK += -diag(beta) dR S_0^T ∘ e^b  (b_i grows with it: db_i += k_i ∘ that),
//   dL = -(dR U^T) below the diagonal, dbeta_i = dR_i·(v_i - (Ke S_0)_i) + sum_j dL_ij L_ij /
//   beta_i, and dL through L_ij = beta_i sum_c k_ic k_jc e^{b_ic - b_jc} as
//   channel_scores_backward: its row side (k_i, whose b_i grows) into cc.dk_rows, its column side
//   straight into dK.
// The caller's db -= k ∘ dK counts every key gradient as the column side's: the row side's is
// added twice here to turn its sign.
void channel_delta_backward(const Head& h, std::size_t t0, std::size_t kv, const float* k,
                            const float* s0, float* ds, const Grads& gr, Chunk& w,
                            ChannelChunk& cc) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* v = h.v + t0 * dv;
  const float* beta = h.beta + t0;
  float* dkc = gr.dk + t0 * dk;
  float* dvc = gr.dv + t0 * dv;
  float* dr = w.dr.data();
  lower_transposed_times(kv, dv, kv, w.t.data(), C, w.du.data(), dv, dr, dv, false);
  kernels::gemm_tile(kv, dv, dk, cc.ke.data(), dk, s0, dv, w.pred.data(), dv, false);
  for (std::size_t i = 0; i < kv; ++i) {
    const float* dri = dr + i * dv;
    if (gr.dbeta) gr.dbeta[t0 + i] = dot(dri, v + i * dv, dv) - dot(dri, &w.pred[i * dv], dv);
    for (std::size_t c = 0; c < dv; ++c) dvc[i * dv + c] = beta[i] * dri[c];
    for (std::size_t r = 0; r < dk; ++r) w.qd[i * dk + r] = -beta[i] * cc.ke[i * dk + r];
  }
  kernels::gemm_tile_at(dk, dv, kv, w.qd.data(), dk, dr, dv, ds, dv, true);
  kernels::transpose(dk, dv, s0, dv, w.st.data(), dk);
  kernels::gemm_tile(kv, dk, dv, dr, dv, w.st.data(), dk, cc.dk_rows.data(), dk, false);
  for (std::size_t i = 0; i < kv; ++i)
    for (std::size_t r = 0; r < dk; ++r) cc.dk_rows[i * dk + r] *= -beta[i] * cc.decay[i * dk + r];
  kernels::transpose(kv, dv, w.u.data(), dv, w.vt.data(), C);
  lower_result(kv, kv, dv, dr, dv, w.vt.data(), C, w.m.data(), C);
  for (std::size_t i = 0; i < kv; ++i) {  // w.m: the gradient of L's weights, beta_i dL_ij
    float* row = &w.m[i * C];
    double along = 0.0;
    for (std::size_t j = 0; j < i; ++j) {
      const float dl = -row[j];
      along += double(dl) * w.kk[i * C + j];
      row[j] = dl * beta[i];
    }
    std::fill(row + i, row + kv, 0.0f);
    if (gr.dbeta) gr.dbeta[t0 + i] += static_cast<float>(along);
  }
  channel_scores_backward(k, k, kv, kv, w.m.data(), cc, cc.dk_rows.data(), dkc);
  for (std::size_t x = 0; x < kv * dk; ++x) {
    cc.db[x] += 2.0f * k[x] * cc.dk_rows[x];
    dkc[x] += cc.dk_rows[x];
  }
}

// channel_chunk's gradients, from s0, the state before it; ds on entry the gradient of the
// state after the chunk, on return of the one before. U = V (sum rule; dV = dU) or the
// pseudo-values (delta rule: channel_delta_backward takes dU on). With dA = (dO U^T) below the
// diagonal:
//   dU = A^T dO + Kt dS,  dQ = (dO S_0^T) ∘ e^b + d(A)/dQ,  dK = d(A)/dK + (U dS^T) ∘ e^{b_L - b},
//   dS_0 = Diag(e^{b_L}) dS + Qd^T dO.
// Every factor is e^{x b_i - y b_j} with its q_i or k_j beside it, so the gradient of b is
//   db_i = q_i ∘ dq_i - k_i ∘ dk_i  (+ at the last key L: sum_j k_j ∘ dk_j^state
//          + e^{b_L} ∘ rowsum(S_0 ∘ dS), what b_L does through Kt and Diag(e^{b_L}) S_0),
// dq and dk those of the prepared rows (the delta rule adds its own terms), and
// dg_t = sum_{i >= t} db_i per channel.
void channel_chunk_backward_chunked(const Head& h, std::size_t t0, std::size_t rows, std::size_t kv,
                                    const float* s0, float* ds, const Grads& gr, Chunk& w,
                                    ChannelChunk& cc) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* k = chunk_keys(h, t0, kv, w);
  channel_decays(h.gc + t0 * dk, rows, kv, cc);
  const bool delta = h.beta && kv > 0;
  const float* v = delta ? channel_pseudo_values(h, t0, kv, k, s0, w, cc) : h.v + t0 * dv;
  std::fill(cc.db.begin(), cc.db.begin() + rows * dk, 0.0f);
  float* dkc = gr.dk + t0 * dk;
  float* dvc = gr.dv + t0 * dv;
  float* du = delta ? w.du.data() : dvc;            // the gradient of U (V under the sum rule)
  std::fill(dkc + kv * dk, dkc + rows * dk, 0.0f);  // padding writes nothing
  std::fill(dvc + kv * dv, dvc + rows * dv, 0.0f);
  if (gr.dbeta) std::fill(gr.dbeta + t0 + kv, gr.dbeta + t0 + rows, 0.0f);
  if (kv > 0) {  // the writes into S_C
    for (std::size_t x = 0; x < kv * dk; ++x) w.qd[x] = k[x] * cc.tail[x];
    kernels::gemm_tile(kv, dv, dk, w.qd.data(), dk, ds, dv, du, dv, false);
    kernels::transpose(dk, dv, ds, dv, w.st.data(), dk);
    kernels::gemm_tile(kv, dk, dv, v, dv, w.st.data(), dk, dkc, dk, false);
    float* db_last = &cc.db[(kv - 1) * dk];
    for (std::size_t j = 0; j < kv; ++j)
      for (std::size_t c = 0; c < dk; ++c) {
        dkc[j * dk + c] *= cc.tail[j * dk + c];
        db_last[c] += k[j * dk + c] * dkc[j * dk + c];
      }
    const float* last = &cc.decay[(kv - 1) * dk];
    for (std::size_t r = 0; r < dk; ++r) {
      db_last[r] += last[r] * dot(s0 + r * dv, ds + r * dv, dv);
      for (std::size_t c = 0; c < dv; ++c) ds[r * dv + c] *= last[r];
    }
  }
  if (h.causal) {  // the reads
    const float* q = chunk_queries(h, t0, rows, w);
    const float* d_out = gr.d_out + t0 * dv;
    float* dq = gr.dq + t0 * dk;
    kernels::transpose(dk, dv, s0, dv, w.st.data(), dk);
    kernels::gemm_tile(rows, dk, dv, d_out, dv, w.st.data(), dk, dq, dk, false);
    for (std::size_t x = 0; x < rows * dk; ++x) {
      dq[x] *= cc.decay[x];
      w.qd[x] = q[x] * cc.decay[x];
    }
    kernels::gemm_tile_at(dk, dv, rows, w.qd.data(), dk, d_out, dv, ds, dv, true);
    if (kv > 0) {
      channel_scores(q, k, rows, kv, cc, w.a.data());
      kernels::transpose(kv, dv, v, dv, w.vt.data(), C);
      lower_result(rows, kv, dv, d_out, dv, w.vt.data(), C, w.da.data(), C);
      causal_weights(w.da.data(), rows, kv, false, w);  // zero above the diagonal
      lower_transposed_times(kv, dv, rows, w.a.data(), C, d_out, dv, du, dv, true);
      channel_scores_backward(q, k, rows, kv, w.da.data(), cc, dq, dkc);
    }
    for (std::size_t x = 0; x < rows * dk; ++x) cc.db[x] += q[x] * dq[x];
  }
  if (delta) channel_delta_backward(h, t0, kv, k, s0, ds, gr, w, cc);
  for (std::size_t x = 0; x < kv * dk; ++x) cc.db[x] -= k[x] * dkc[x];
  if (h.causal && !queries_as_given(h))
    prepare_rows_backward(h.q + t0 * dk, rows, dk, h.normalise, h.q_scale, w.qnorm.data(),
                          gr.dq + t0 * dk);
  if (h.normalise) prepare_rows_backward(h.k + t0 * dk, kv, dk, true, 1.0f, w.knorm.data(), dkc);
  if (gr.dg) {  // b_i = g_1 + ... + g_min(i, kv) per channel: dg_t sums db from t on
    std::vector<double>& acc = cc.b;  // b is read no more
    std::fill(acc.begin(), acc.begin() + dk, 0.0);
    for (std::size_t i = rows; i-- > 0;)
      for (std::size_t c = 0; c < dk; ++c) {
        acc[c] += cc.db[i * dk + c];
        gr.dg[(t0 + i) * dk + c] = i < kv ? static_cast<float>(acc[c]) : 0.0f;
      }
  }
}

// The delta rule's part of a chunk's backward, after chunk_backward has the gradient dU of its
// pseudo-values in w.du (U = T R, R = diag(beta) (V - diag(e^b) K S_0), T = (I + L)^{-1}, L_ij =
// beta_i E_ij k_i·k_j for j < i; pseudo_values left T and K K^T in w.t, w.kk):
//   dR = T^T dU, dV = diag(beta) dR, dL = -(dR U^T) below the diagonal, M = dL ∘ diag(beta) E,
//   dK += (M + M^T) K - diag(beta e^b) dR S_0^T, dS_0 -= (diag(beta e^b) K)^T dR,
//   dbeta_i = dR_i·(v_i - e^{b_i} S_0^T k_i) + sum_j dL_ij E_ij k_i·k_j, db from E and e^b.
void delta_backward(const Head& h, std::size_t t0, std::size_t kv, const float* k, const float* s0,
                    float* ds, const Grads& gr, Chunk& w) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* v = h.v + t0 * dv;
  const float* beta = h.beta + t0;
  const bool decays = h.g != nullptr;
  float* dkc = gr.dk + t0 * dk;
  float* dvc = gr.dv + t0 * dv;
  float* dr = w.dr.data();
  lower_transposed_times(kv, dv, kv, w.t.data(), C, w.du.data(), dv, dr, dv, false);
  // pred = diag(e^b) K S_0, what each key's write subtracts; then w.qd = -diag(beta e^b) K.
  const float* ke = k;
  if (decays) {
    scale_rows(k, w.eb.data(), kv, dk, w.qd.data());
    ke = w.qd.data();
  }
  kernels::gemm_tile(kv, dv, dk, ke, dk, s0, dv, w.pred.data(), dv, false);
  for (std::size_t i = 0; i < kv; ++i) {
    const float* dri = dr + i * dv;
    if (gr.dbeta) gr.dbeta[t0 + i] = dot(dri, v + i * dv, dv) - dot(dri, &w.pred[i * dv], dv);
    for (std::size_t c = 0; c < dv; ++c) dvc[i * dv + c] = beta[i] * dri[c];
    const float f = -beta[i] * (decays ? w.eb[i] : 1.0f);
    for (std::size_t r = 0; r < dk; ++r) w.qd[i * dk + r] = f * k[i * dk + r];
  }
  kernels::gemm_tile_at(dk, dv, kv, w.qd.data(), dk, dr, dv, ds, dv, true);
  // dK through R: -diag(beta e^b) dR S_0^T; b_i enters R_i through e^{b_i}.
  kernels::transpose(dk, dv, s0, dv, w.st.data(), dk);
  kernels::gemm_tile(kv, dk, dv, dr, dv, w.st.data(), dk, w.x.data(), dk, false);
  for (std::size_t i = 0; i < kv; ++i) {
    const float f = -beta[i] * (decays ? w.eb[i] : 1.0f);
    float* row = &w.x[i * dk];
    for (std::size_t r = 0; r < dk; ++r) row[r] *= f;
    if (gr.dg && decays) w.db[i] += dot(k + i * dk, row, dk);
    for (std::size_t r = 0; r < dk; ++r) dkc[i * dk + r] += row[r];
  }
  // dL = -dR U^T below the diagonal, into M = dL ∘ diag(beta) E.
  kernels::transpose(kv, dv, w.u.data(), dv, w.vt.data(), C);
  lower_result(kv, kv, dv, dr, dv, w.vt.data(), C, w.m.data(), C);
  for (std::size_t i = 0; i < kv; ++i) {
    float* row = &w.m[i * C];
    double along = 0.0;
    for (std::size_t j = 0; j < i; ++j) {
      const float dl = -row[j];
      const float e = decays ? w.e[i * C + j] : 1.0f;
      const double x = double(dl) * e * w.kk[i * C + j];  // dL_ij · L_ij / beta_i
      along += x;
      if (gr.dg && decays) {
        w.db[i] += beta[i] * x;
        w.db[j] -= beta[i] * x;
      }
      row[j] = dl * beta[i] * e;
    }
    std::fill(row + i, row + kv, 0.0f);
    if (gr.dbeta) gr.dbeta[t0 + i] += static_cast<float>(along);
  }
  lower_times(kv, dk, kv, w.m.data(), C, k, dk, dkc, dk, true);
  lower_transposed_times(kv, dk, kv, w.m.data(), C, k, dk, dkc, dk, true);
}

// One chunk's gradients, the forward's products in reverse (matrix products per chunk). s0:
// the state before the chunk (S_0, then z_0). ds, dz: on entry the gradient of the state after
// the chunk, on return of the one before it. Writes the chunk's rows of dk, dv, dg, dbeta and
// (causal) dq, those of q and k as given (back through their preparation). With U the values
// (sum rule) or pseudo-values (delta rule), A = (Q K^T) ∘ E and dA = (dO U^T + d_den 1^T) ∘ mask:
//   dU = A^T dO + diag(e^{b_C - b}) K dS,
//   dK = (dA ∘ E)^T Q + diag(e^{b_C - b}) (U dS^T + 1 dz^T),
//   dQ = diag(e^b) (dO S_0^T + d_den z_0^T) + (dA ∘ E) K, dS_0 = e^{b_C} dS + (diag(e^b) Q)^T dO,
//   dz_0 = e^{b_C} dz + Q^T (e^b ∘ d_den); db from every e^{...} factor, dg its suffix sums.
// The sum rule's dV is dU; the delta rule's comes from delta_backward.
void chunk_backward(const Head& h, std::size_t t0, std::size_t rows, std::size_t kv,
                    const float* s0, float* ds, float* dz, const Grads& gr, Chunk& w) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* k = chunk_keys(h, t0, kv, w);
  const float* z0 = s0 + dk * dv;
  const bool decays = h.g != nullptr;
  if (decays) decay_factors(h.g + t0, rows, kv, w);
  std::fill(w.db.begin(), w.db.end(), 0.0);
  float* dkc = gr.dk + t0 * dk;
  float* dvc = gr.dv + t0 * dv;
  std::fill(dkc + kv * dk, dkc + rows * dk, 0.0f);  // padding writes nothing
  std::fill(dvc + kv * dv, dvc + rows * dv, 0.0f);
  if (gr.dbeta) std::fill(gr.dbeta + t0 + kv, gr.dbeta + t0 + rows, 0.0f);
  kernels::transpose(kv, dk, k, dk, w.kt.data(), C);
  const bool delta = h.beta && kv > 0;
  const float* u = delta ? pseudo_values(h, t0, kv, k, s0, w) : h.v + t0 * dv;
  float* du = delta ? w.du.data() : dvc;
  if (kv > 0) {  // the writes into S_C and z_C
    const float* kd = k;
    if (decays) {
      scale_rows(k, w.tail.data(), kv, dk, w.qd.data());
      kd = w.qd.data();
    }
    kernels::gemm_tile(kv, dv, dk, kd, dk, ds, dv, du, dv, false);
    kernels::transpose(dk, dv, ds, dv, w.st.data(), dk);
    kernels::gemm_tile(kv, dk, dv, u, dv, w.st.data(), dk, dkc, dk, false);
    for (std::size_t j = 0; j < kv; ++j) {
      float* row = dkc + j * dk;
      if (dz)
        for (std::size_t r = 0; r < dk; ++r) row[r] += dz[r];
      if (decays)
        for (std::size_t r = 0; r < dk; ++r) row[r] *= w.tail[j];
    }
    if (gr.dg && decays) {  // b_C scales all of S_C; b_j divides key j's write
      double through_keys = 0.0;
      for (std::size_t j = 0; j < kv; ++j) {
        const double x = dot(k + j * dk, dkc + j * dk, dk);
        w.db[j] -= x;
        through_keys += x;
      }
      double through_start = dot(ds, s0, dk * dv);
      if (dz) through_start += dot(dz, z0, dk);
      w.db[kv - 1] += through_keys + w.eb[kv - 1] * through_start;
    }
    if (decays && w.eb[kv - 1] != 1.0f) {
      const float decay = w.eb[kv - 1];
      for (std::size_t i = 0; i < dk * dv; ++i) ds[i] *= decay;
      if (dz)
        for (std::size_t r = 0; r < dk; ++r) dz[r] *= decay;
    }
  }
  if (h.causal) {  // the reads
    const float* q = chunk_queries(h, t0, rows, w);
    const float* d_out = gr.d_out + t0 * dv;
    const float* d_den = gr.d_den ? gr.d_den + t0 : nullptr;
    float* dq = gr.dq + t0 * dk;
    kernels::transpose(dk, dv, s0, dv, w.st.data(), dk);
    kernels::gemm_tile(rows, dk, dv, d_out, dv, w.st.data(), dk, dq, dk, false);
    for (std::size_t i = 0; i < rows; ++i) {
      float* row = dq + i * dk;
      if (d_den)
        for (std::size_t r = 0; r < dk; ++r) row[r] += d_den[i] * z0[r];
      if (decays) {
        for (std::size_t r = 0; r < dk; ++r) row[r] *= w.eb[i];
        if (gr.dg) w.db[i] += dot(q + i * dk, row, dk);
      }
    }
    const float* qd = q;
    if (decays) {
      scale_rows(q, w.eb.data(), rows, dk, w.qd.data());
      qd = w.qd.data();
    }
    kernels::gemm_tile_at(dk, dv, rows, qd, dk, d_out, dv, ds, dv, true);
    if (d_den)
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t r = 0; r < dk; ++r) dz[r] += d_den[i] * qd[i * dk + r];
    if (kv > 0) {
      lower_result(rows, kv, dk, q, dk, w.kt.data(), C, w.a.data(), C);
      causal_weights(w.a.data(), rows, kv, decays, w);
      kernels::transpose(kv, dv, u, dv, w.vt.data(), C);
      lower_result(rows, kv, dv, d_out, dv, w.vt.data(), C, w.da.data(), C);
      if (d_den)
        for (std::size_t i = 0; i < rows; ++i)
          for (std::size_t j = 0; j < kv; ++j) w.da[i * C + j] += d_den[i];
      if (gr.dg && decays)  // A_ij grows with b_i and shrinks with b_j
        for (std::size_t i = 0; i < rows; ++i)
          for (std::size_t j = 0; j < kv && j <= i; ++j) {
            const double x = double(w.da[i * C + j]) * w.a[i * C + j];
            w.db[i] += x;
            w.db[j] -= x;
          }
      causal_weights(w.da.data(), rows, kv, decays, w);
      lower_transposed_times(kv, dv, rows, w.a.data(), C, d_out, dv, du, dv, true);
      lower_times(rows, dk, kv, w.da.data(), C, k, dk, dq, dk, true);
      lower_transposed_times(kv, dk, rows, w.da.data(), C, q, dk, dkc, dk, true);
    }
  }
  if (delta) delta_backward(h, t0, kv, k, s0, ds, gr, w);
  // back through the preparation of the chunk's q and k rows (complete now)
  if (h.causal && !queries_as_given(h))
    prepare_rows_backward(h.q + t0 * dk, rows, dk, h.normalise, h.q_scale, w.qnorm.data(),
                          gr.dq + t0 * dk);
  if (h.normalise) prepare_rows_backward(h.k + t0 * dk, kv, dk, true, 1.0f, w.knorm.data(), dkc);
  if (gr.dg) {  // b_i = g_1 + ... + g_min(i, kv): dg_t is the suffix sum of db from t
    double acc = 0.0;
    for (std::size_t i = rows; i-- > 0;) {
      acc += w.db[i];
      gr.dg[t0 + i] = i < kv ? static_cast<float>(acc) : 0.0f;
    }
  }
}

}  // namespace

float dot(const float* a, const float* b, std::size_t n) {
  float acc[8] = {};  // independent partial sums: a single chain of adds is latency-bound
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float x : acc) s += x;
  return s;
}

float sum(const float* a, std::size_t n) {
  float acc[8] = {};  // as dot
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += a[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i];
  for (float x : acc) s += x;
  return s;
}

std::size_t state_floats(std::size_t dk, std::size_t dv) {
  return dk * dv + dk;
}

std::vector<Sequence> sequences(const Mask& mask, const Dims& d, const std::string& name) {
  std::vector<Sequence> out;
  if (!mask.has_documents()) {
    for (std::size_t b = 0; b < d.batch; ++b)
      for (std::size_t h = 0; h < d.heads; ++h)
        out.push_back({b * d.heads + h, h, 0, d.nq, 0, d.nk, mask.valid_keys(b, d.nk), out.size(),
                       b * d.kv() + d.kv_head(h)});
    return out;
  }
  if (mask.causal != Causal::none && !mask.key_documents.empty() &&
      mask.key_documents != mask.documents)
    throw Unsupported(name,
                      "causal masks with key_documents unlike documents: the causal form "
                      "pairs query t with key t");
  const auto valid = static_cast<std::int64_t>(mask.valid_keys(0, d.nk));  // key padding
  for (std::size_t doc = 0; doc + 1 < mask.documents.size(); ++doc) {
    const auto [q0, q1] = mask.document_queries(doc);
    const auto [k0, k1] = mask.document_keys(doc);
    const auto keys = static_cast<std::size_t>(
        std::clamp<std::int64_t>(valid - std::int64_t(k0), 0, std::int64_t(k1 - k0)));
    for (std::size_t h = 0; h < d.heads; ++h)
      out.push_back({h, h, q0, q1 - q0, k0, k1 - k0, keys, out.size(), d.kv_head(h)});
  }
  return out;
}

KeyGradients::KeyGradients(const Dims& d, Tensor& dk, Tensor& dv) : d_(d), dk_(dk), dv_(dv) {
  if (!d.grouped()) return;
  head_dk_.resize(d.batch * d.heads * d.nk * d.dk);
  head_dv_.resize(d.batch * d.heads * d.nk * d.dv);
}

float* KeyGradients::dk(const Sequence& s) {
  if (!d_.grouped()) return dk_.data() + s.kv_row(d_) * d_.dk;
  return head_dk_.data() + s.key_row(d_) * d_.dk;
}

float* KeyGradients::dv(const Sequence& s) {
  if (!d_.grouped()) return dv_.data() + s.kv_row(d_) * d_.dv;
  return head_dv_.data() + s.key_row(d_) * d_.dv;
}

void KeyGradients::sum() {
  if (!d_.grouped()) return;
  const std::size_t group = d_.heads / d_.kv();
  const auto rows = static_cast<std::ptrdiff_t>(d_.batch * d_.kv() * d_.nk);  // of dk and dv
#pragma omp parallel for schedule(static) if (rows * group > 4096)
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>(r);
    const std::size_t j = row % d_.nk, bk = row / d_.nk;  // key j of slice b·Hkv + kvh
    const std::size_t first = (bk / d_.kv() * d_.heads + bk % d_.kv() * group) * d_.nk + j;
    for (const auto& [to, from, width] : {std::tuple{dk_.data(), head_dk_.data(), d_.dk},
                                          std::tuple{dv_.data(), head_dv_.data(), d_.dv}}) {
      float* out = to + row * width;
      std::copy_n(from + first * width, width, out);
      for (std::size_t u = 1; u < group; ++u) {  // the group's next query heads, in order
        const float* add = from + (first + u * d_.nk) * width;
        for (std::size_t c = 0; c < width; ++c) out[c] += add[c];
      }
    }
  }
}

std::size_t checkpoint_floats(std::size_t nk, std::size_t dk, std::size_t dv) {
  return (nk + C - 1) / C * state_floats(dk, dv);
}

// Copies a state (S, then z where carried) out where asked.
void write_state(const float* s, std::size_t dk, std::size_t dv, bool key_sum, StateOut to) {
  if (to.memory) std::copy(s, s + dk * dv, to.memory);
  if (key_sum && to.key_sum) std::copy(s + dk * dv, s + dk * dv + dk, to.key_sum);
}

void forward(const Head& h, std::size_t dk, std::size_t dv, float* out, float* den,
             float* checkpoints, StateOut final_state) {
  std::vector<float> s(state_floats(dk, dv));
  Chunk w(dk, dv);
  if (h.gc)  // no key sum under a per-channel decay: the scan clients only
    channel_run_chunks(h, dk, dv, s.data(), out, checkpoints, w);
  else
    run_chunks(h, dk, dv, den != nullptr, s.data(), out, den, checkpoints, w);
  write_state(s.data(), dk, dv, den != nullptr, final_state);
  if (h.causal) return;
  for (std::size_t i0 = 0; i0 < h.nq; i0 += C) {  // every query reads the last state
    const std::size_t rows = std::min(C, h.nq - i0);
    const float* q = chunk_queries(h, i0, rows, w);
    kernels::gemm_tile(rows, dv, dk, q, dk, s.data(), dv, out + i0 * dv, dv, false);
    if (den)
      for (std::size_t i = 0; i < rows; ++i) den[i0 + i] = dot(q + i * dk, s.data() + dk * dv, dk);
  }
}

void step(float* s, float* z, const float* q, const float* k, const float* v, float g,
          const float* beta, std::size_t dk, std::size_t dv, float* out, float* den, float* tmp) {
  if (g != 0.0f) {
    const float a = std::exp(g);
    for (std::size_t i = 0; i < dk * dv; ++i) s[i] *= a;
    if (z)
      for (std::size_t r = 0; r < dk; ++r) z[r] *= a;
  }
  const float* u = v;
  if (beta) {
    vec_mat(k, s, dk, dv, tmp);
    for (std::size_t c = 0; c < dv; ++c) tmp[c] = *beta * (v[c] - tmp[c]);
    u = tmp;
  }
  rank1(s, k, u, dk, dv);
  if (z)
    for (std::size_t r = 0; r < dk; ++r) z[r] += k[r];
  if (out) vec_mat(q, s, dk, dv, out);
  if (den && q) *den = dot(q, z, dk);
}

void backward(const Head& h, std::size_t dk, std::size_t dv, const float* d_out, const float* d_den,
              const float* checkpoints, float* dq, float* dk_out, float* dv_out, float* dg,
              float* dbeta, StateIn d_final, StateOut d_initial) {
  const std::size_t pv = dk * dv, state = state_floats(dk, dv);
  const bool key_sum = d_den != nullptr;
  const std::size_t positions = h.causal ? h.nk : h.valid;
  const std::size_t chunks = (positions + C - 1) / C;
  std::vector<float> saved, s(state);
  Chunk w(dk, dv);
  if (!checkpoints || !h.causal) {  // non-causal: also the last state
    saved.resize(chunks * state);
    if (h.gc)
      channel_run_chunks(h, dk, dv, s.data(), nullptr, saved.data(), w);
    else
      run_chunks(h, dk, dv, key_sum, s.data(), nullptr, nullptr, saved.data(), w);
    checkpoints = saved.data();
  }
  std::vector<float> ds(state, 0.0f);  // the gradient of S, then of z: the final state's first
  float* dz = key_sum ? ds.data() + pv : nullptr;
  if (d_final.memory) std::copy(d_final.memory, d_final.memory + pv, ds.data());
  if (dz && d_final.key_sum) std::copy(d_final.key_sum, d_final.key_sum + dk, dz);
  if (!h.causal) {  // dS = Q^T dO, dz = Q^T d_den, dq = dO S^T + d_den z^T, C queries at a time
    kernels::transpose(dk, dv, s.data(), dv, w.st.data(), dk);
    for (std::size_t i0 = 0; i0 < h.nq; i0 += C) {
      const std::size_t rows = std::min(C, h.nq - i0);
      const float* q = chunk_queries(h, i0, rows, w);
      float* dqc = dq + i0 * dk;
      kernels::gemm_tile_at(dk, dv, rows, q, dk, d_out + i0 * dv, dv, ds.data(), dv, true);
      kernels::gemm_tile(rows, dk, dv, d_out + i0 * dv, dv, w.st.data(), dk, dqc, dk, false);
      if (key_sum)
        for (std::size_t i = 0; i < rows; ++i)
          for (std::size_t r = 0; r < dk; ++r) {
            dz[r] += d_den[i0 + i] * q[i * dk + r];
            dqc[i * dk + r] += d_den[i0 + i] * s[pv + r];
          }
      if (!queries_as_given(h))
        prepare_rows_backward(h.q + i0 * dk, rows, dk, h.normalise, h.q_scale, w.qnorm.data(), dqc);
    }
  }
  std::fill(dk_out + positions * dk, dk_out + h.nk * dk, 0.0f);
  std::fill(dv_out + positions * dv, dv_out + h.nk * dv, 0.0f);
  const std::size_t g_width = h.gc ? dk : 1;  // dg [nk x dk] for a per-channel decay
  if (dg) std::fill(dg + positions * g_width, dg + h.nk * g_width, 0.0f);
  if (dbeta) std::fill(dbeta + positions, dbeta + h.nk, 0.0f);
  const Grads gr{d_out, d_den, dq, dk_out, dv_out, dg, dbeta};
  std::unique_ptr<ChannelChunk> cc;
  if (h.gc) cc = std::make_unique<ChannelChunk>(dk);
  for (std::size_t c = chunks; c-- > 0;) {
    const std::size_t t0 = c * C, rows = std::min(C, positions - t0);
    const std::size_t kv = std::min(rows, h.valid > t0 ? h.valid - t0 : 0);
    if (h.gc)
      channel_chunk_backward_chunked(h, t0, rows, kv, checkpoints + c * state, ds.data(), gr, w,
                                     *cc);
    else
      chunk_backward(h, t0, rows, kv, checkpoints + c * state, ds.data(), dz, gr, w);
  }
  write_state(ds.data(), dk, dv, key_sum, d_initial);
}

}  // namespace scan

// ---- ScanAttention: preparing a client's inputs for the engine ----
namespace {

// Per-thread copies of one head's gates where the call gives none.
struct Prepared {
  std::vector<float> g, beta;
};

// One (sequence, head) of a call for the engine: q and k to be scaled (and normalised) by it,
// g from the input or the head's fixed value, beta from the input or the rule's constant.
scan::Head prepare_head(const ScanRule& rule, double head_g, TensorRef q, TensorRef k, TensorRef v,
                        const Mask& mask, const TokenInputs& in, const Dims& d,
                        const scan::Sequence& seq, Prepared& w) {
  scan::Head h;
  h.nq = seq.nq;
  h.nk = seq.nk;
  h.valid = seq.valid;
  h.causal = mask.causal != Causal::none;
  h.q = q.data() + seq.query_row(d) * d.dk;
  h.k = k.data() + seq.kv_row(d) * d.dk;
  h.q_scale = static_cast<float>(mask.softmax_scale(d.dk));
  h.normalise = rule.normalise;
  h.v = v.data() + seq.kv_row(d) * d.dv;
  if (in.log_decay) {
    h.g = in.log_decay->data() + seq.key_row(d);
  } else if (in.channel_log_decay) {
    h.gc = in.channel_log_decay->data() + seq.key_row(d) * d.dk;
  } else if (rule.decay == ScanRule::Decay::per_head) {
    w.g.assign(seq.nk, static_cast<float>(head_g));
    h.g = w.g.data();
  }
  if (in.beta) {
    h.beta = in.beta->data() + seq.key_row(d);
  } else if (rule.delta) {
    w.beta.assign(seq.nk, static_cast<float>(rule.beta));
    h.beta = w.beta.data();
  }
  if (in.initial_state) h.initial = in.initial_state->memory.data() + seq.state * d.dk * d.dv;
  return h;
}

// Sequence `state`'s slice of a state the call hands back (nothing where it is empty).
scan::StateOut state_out(RecurrentState* state, std::size_t index, std::size_t floats) {
  if (!state || state->empty()) return {};
  return {state->memory.data() + index * floats, nullptr};
}

// The chunk states a causal forward saved through Saved, for its backward; with the call's
// sizes, key lengths and documents, so that a backward of another call recomputes instead.
struct ScanSaved {
  Dims d;
  std::vector<std::size_t> valid;
  std::vector<std::int64_t> documents;
  std::vector<float> checkpoints;
  bool fits(const Dims& other, const Mask& mask) const;
};

std::vector<std::size_t> valid_keys(const Mask& mask, const Dims& d) {
  std::vector<std::size_t> valid;
  for (std::size_t b = 0; b < d.batch; ++b) valid.push_back(mask.valid_keys(b, d.nk));
  return valid;
}

bool ScanSaved::fits(const Dims& other, const Mask& mask) const {
  return d == other && valid == valid_keys(mask, other) && documents == mask.documents &&
         mask.causal != Causal::none;
}

// Where each sequence's chunk states start in a call's checkpoints, and their total (last).
std::vector<std::size_t> checkpoint_offsets(const std::vector<scan::Sequence>& seqs,
                                            const Dims& d) {
  std::vector<std::size_t> at = {0};
  for (const scan::Sequence& s : seqs)
    at.push_back(at.back() + scan::checkpoint_floats(s.nk, d.dk, d.dv));
  return at;
}

}  // namespace

ScanRule delta_rule(const std::string& name, double beta, bool gated) {
  if (!(beta >= 0.0 && beta <= 1.0))  // also refuses NaN
    throw Error(name + ": beta=" + std::to_string(beta) + ": must be in [0, 1]");
  ScanRule r;
  r.delta = true;
  r.normalise = true;
  r.decay = gated ? ScanRule::Decay::input : ScanRule::Decay::none;
  r.beta_input = true;
  r.beta = beta;
  return r;
}

Support ScanAttention::support() const {
  Support s;
  s.backward = true;
  s.causal_cross = false;  // the causal form pairs query t with key t
  s.allowed = false;       // no per-pair weights exist to mask
  s.log_decay = rule_.decay == ScanRule::Decay::input;
  s.channel_decay = rule_.decay == ScanRule::Decay::input;
  s.beta = rule_.delta && rule_.beta_input;
  s.state = true;
  s.documents = true;
  s.grouped_heads = true;          // a state per query head, k and v read from its KV head
  s.approximates_softmax = false;  // a decaying or delta-rule memory, not a softmax kernel
  return s;
}

std::string ScanAttention::why_unsupported(const std::string& feature) const {
  if (feature == "boolean masks") return "a recurrent memory has no per-pair weights to mask";
  if (feature == "causal masks with Nq != Nk") return "the causal form pairs query t with key t";
  return {};
}

double ScanAttention::flops(const Dims& d, const Mask& mask) const {
  double keys = 0;
  for (std::size_t b = 0; b < d.batch; ++b) keys += double(mask.valid_keys(b, d.nk));
  const double state = double(d.dk * d.dv);
  const double write = (rule_.delta ? 4.0 : 2.0) * state;
  return double(d.heads) * (keys * write + double(d.batch * d.nq) * 2.0 * state);
}

double ScanAttention::head_log_decay(std::size_t, std::size_t) const {
  return 0.0;
}

void ScanAttention::run_forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                const TokenInputs& in, const Dims& d, Tensor& out,
                                std::vector<float>* checkpoints,
                                RecurrentState* final_state) const {
  const std::vector<scan::Sequence> seqs = scan::sequences(mask, d, name());
  const std::vector<std::size_t> at = checkpoint_offsets(seqs, d);
  if (checkpoints) checkpoints->resize(at.back());
  const auto count = static_cast<std::ptrdiff_t>(seqs.size());
#pragma omp parallel
  {
    static thread_local Prepared w;  // kept across calls: no page faults per call
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < count; ++t) {
      const scan::Sequence& seq = seqs[static_cast<std::size_t>(t)];
      const scan::Head h =
          prepare_head(rule_, head_log_decay(seq.head, d.heads), q, k, v, mask, in, d, seq, w);
      scan::forward(h, d.dk, d.dv, out.data() + seq.query_row(d) * d.dv, nullptr,
                    checkpoints ? checkpoints->data() + at[seq.state] : nullptr,
                    state_out(final_state, seq.state, d.dk * d.dv));
    }
  }
}

void ScanAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                            const TokenInputs& in, const Dims& d, Tensor& out, Saved* saved) const {
  if (!saved) return run_forward(q, k, v, mask, in, d, out, nullptr, nullptr);
  saved->lse = RowLogSumExp();
  // Non-causal: the backward recomputes the last state anyway, so nothing is kept.
  if (mask.causal == Causal::none) {
    saved->state.reset();
    run_forward(q, k, v, mask, in, d, out, nullptr, &saved->final_state);
    return;
  }
  ScanSaved state{d, valid_keys(mask, d), mask.documents, {}};
  if (auto* kept = std::any_cast<ScanSaved>(&saved->state))  // a training loop's last step's:
    state.checkpoints = std::move(kept->checkpoints);        // no fresh pages per call
  run_forward(q, k, v, mask, in, d, out, &state.checkpoints, &saved->final_state);
  saved->state = std::move(state);
}

void ScanAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                     const TokenInputs& in, const Dims& d, TensorRef,
                                     TensorRef d_out, const Saved& saved,
                                     AllGradients& grads) const {
  const auto* state = std::any_cast<ScanSaved>(&saved.state);
  if (state && !state->fits(d, mask)) state = nullptr;  // another call's: recompute
  const std::vector<scan::Sequence> seqs = scan::sequences(mask, d, name());
  const std::vector<std::size_t> at = checkpoint_offsets(seqs, d);
  const auto count = static_cast<std::ptrdiff_t>(seqs.size());
  const std::size_t floats = d.dk * d.dv;
  scan::KeyGradients key_grads(d, grads.qkv.dk, grads.qkv.dv);
#pragma omp parallel
  {
    static thread_local Prepared w;  // kept across calls: no page faults per call
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < count; ++t) {
      const scan::Sequence& seq = seqs[static_cast<std::size_t>(t)];
      const scan::Head h =
          prepare_head(rule_, head_log_decay(seq.head, d.heads), q, k, v, mask, in, d, seq, w);
      const std::size_t qr = seq.query_row(d), kr = seq.key_row(d);
      scan::StateIn d_final;
      if (in.d_final_state) d_final.memory = in.d_final_state->memory.data() + seq.state * floats;
      scan::backward(h, d.dk, d.dv, d_out.data() + qr * d.dv, nullptr,
                     state ? state->checkpoints.data() + at[seq.state] : nullptr,
                     grads.qkv.dq.data() + qr * d.dk, key_grads.dk(seq), key_grads.dv(seq),
                     in.log_decay           ? grads.d_log_decay.data() + kr
                     : in.channel_log_decay ? grads.d_channel_log_decay.data() + kr * d.dk
                                            : nullptr,
                     in.beta ? grads.d_beta.data() + kr : nullptr, d_final,
                     state_out(&grads.d_initial_state, seq.state, floats));
    }
  }
  key_grads.sum();
}

Mask recurrent_prefill_mask(const DecodeConfig& config, const std::vector<std::size_t>& lengths) {
  Mask mask;
  mask.causal = Causal::top_left;
  mask.scale = config.scale;
  mask.key_lengths.assign(lengths.begin(), lengths.end());
  return mask;
}

// The recurrent decoder: the state S of every item and head, prefill through the chunked
// forward from it (its final state written back in place: each head reads its initial state
// before it writes its final one), steps through scan::step.
class ScanDecoder final : public TokenDecoder {
 public:
  ScanDecoder(std::unique_ptr<Attention> own, const DecodeConfig& config)
      : TokenDecoder(*own, config),
        own_(std::move(own)),
        scan_(dynamic_cast<const ScanAttention&>(*own_)) {
    for (std::size_t h = 0; h < config.heads; ++h)
      head_g_.push_back(scan_.head_log_decay(h, config.heads));
    state_.memory = xt::zeros<float>({config.batch, config.heads, config.dk, config.dv});
  }

  std::size_t bytes() const override { return state_.memory.size() * sizeof(float); }

 protected:
  void do_prefill(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in,
                  const std::vector<std::size_t>& lengths, Tensor& out) override {
    const DecodeConfig& c = config_;
    const std::size_t n = q.shape()[2];
    const Mask mask = recurrent_prefill_mask(c, lengths);
    TokenInputs from = in;
    from.initial_state = state_.ref();
    scan_.run_forward(q, k, v, mask, from, Dims{c.batch, c.heads, n, n, c.dk, c.dv, c.kv()}, out,
                      nullptr, &state_);
  }

  void do_step(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in, Tensor& out) override {
    const DecodeConfig& c = config_;
    const ScanRule& rule = scan_.rule();
    std::vector<float> qp(c.dk), kp(c.dk), tmp(c.dv);
    float norm = 0.0f;
    for (std::size_t bh = 0; bh < c.batch * c.heads; ++bh) {
      scan::prepare_rows(q.data() + bh * c.dk, 1, c.dk, rule.normalise,
                         static_cast<float>(*c.scale), qp.data(), &norm);
      const std::size_t kv = c.kv_slice(bh);
      scan::prepare_rows(k.data() + kv * c.dk, 1, c.dk, rule.normalise, 1.0f, kp.data(), &norm);
      float g = static_cast<float>(head_g_[bh % c.heads]);
      if (in.log_decay) g = in.log_decay->data()[bh];
      float beta = static_cast<float>(rule.beta);
      if (in.beta) beta = in.beta->data()[bh];
      scan::step(state_.memory.data() + bh * c.dk * c.dv, nullptr, qp.data(), kp.data(),
                 v.data() + kv * c.dv, g, rule.delta ? &beta : nullptr, c.dk, c.dv,
                 out.data() + bh * c.dv, nullptr, tmp.data());
    }
  }

 private:
  std::unique_ptr<Attention> own_;  // made from the spec: the decoder outlives its maker
  const ScanAttention& scan_;
  std::vector<double> head_g_;
  RecurrentState state_;
};

std::unique_ptr<TokenDecoder> ScanAttention::start_decoding(const DecodeConfig& config) const {
  return std::make_unique<ScanDecoder>(make_attention(spec()), config);
}

}  // namespace attnlab
