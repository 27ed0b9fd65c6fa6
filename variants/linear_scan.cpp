#include "variants/linear_scan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnlab/error.hpp"
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

// Per-thread scratch of one chunk.
struct Chunk {
  std::size_t dk, dv;
  std::vector<double> b, db;              // cumulative log-decay within the chunk, its gradient
  std::vector<float> eb, tail, e;         // e^{b_i}, e^{b_last - b_j}, E_ij = e^{b_i - b_j}
  std::vector<float> kt, kk, t, xk, xv, u, a, qd, kdt, vt, st, da, du, dr, pred, m;
  Chunk(std::size_t dk_, std::size_t dv_)
      : dk(dk_), dv(dv_), b(C), db(C), eb(C), tail(C), e(C * C), kt(dk * C), kk(C * C),
        t(C * C), xk(C * dk), xv(C * dv), u(C * dv), a(C * C), qd(C * dk), kdt(dk * C),
        vt(dv * C), st(dv * dk), da(C * C), du(C * dv), dr(C * dv), pred(C * dv), m(C * C) {}
};

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

// m[rows x kv] (row stride C) ∘ E when decaying (E is 0 above the diagonal), else its upper
// triangle zeroed: what token i of the chunk sees of token j.
void causal_weights(float* m, std::size_t rows, std::size_t kv, bool decays, const Chunk& w) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* row = m + i * C;
    if (decays) {
      const float* e = &w.e[i * C];
      for (std::size_t j = 0; j < kv; ++j) row[j] *= e[j];
    } else if (i + 1 < kv) {
      std::fill(row + i + 1, row + kv, 0.0f);
    }
  }
}

// rows of x [rows x dim], times f[i] each, into out.
void scale_rows(const float* x, const float* f, std::size_t rows, std::size_t dim, float* out) {
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < dim; ++c) out[i * dim + c] = f[i] * x[i * dim + c];
}

// The delta rule's pseudo-values U [kv x dv] of the chunk from t0 (into w.u), from the state
// s before it; leaves T = (I + L)^{-1} in w.t and K K^T in w.kk. Needs decay_factors (when
// decaying) and w.kt, the chunk's keys transposed.
const float* pseudo_values(const Head& h, std::size_t t0, std::size_t kv, const float* s,
                           Chunk& w) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* k = h.k + t0 * dk;
  const float* v = h.v + t0 * dv;
  const float* beta = h.beta + t0;
  const bool decays = h.g != nullptr;
  kernels::gemm_tile(kv, kv, dk, k, dk, w.kt.data(), C, w.kk.data(), C, false);
  // T = (I + L)^{-1}, row by row (T_i = e_i - sum_{j<i} L_ij T_j, rows zero right of the
  // diagonal), then X = T [diag(beta) V | diag(beta e^b) K] as two products, U = X_V - X_K S.
  std::fill(w.t.begin(), w.t.end(), 0.0f);
  for (std::size_t i = 0; i < kv; ++i) {
    float* ti = &w.t[i * C];
    for (std::size_t j = 0; j < i; ++j) {
      const float l = beta[i] * (decays ? w.e[i * C + j] : 1.0f) * w.kk[i * C + j];
      const float* tj = &w.t[j * C];
      for (std::size_t c = 0; c <= j; ++c) ti[c] -= l * tj[c];
    }
    ti[i] = 1.0f;
    const float eb = decays ? w.eb[i] : 1.0f;
    for (std::size_t c = 0; c < dv; ++c) w.u[i * dv + c] = beta[i] * v[i * dv + c];
    for (std::size_t r = 0; r < dk; ++r) w.qd[i * dk + r] = beta[i] * eb * k[i * dk + r];
  }
  kernels::gemm_tile(kv, dv, kv, w.t.data(), C, w.u.data(), dv, w.xv.data(), dv, false);
  kernels::gemm_tile(kv, dk, kv, w.t.data(), C, w.qd.data(), dk, w.xk.data(), dk, false);
  kernels::gemm_tile(kv, dv, dk, w.xk.data(), dk, s, dv, w.u.data(), dv, false);
  for (std::size_t i = 0; i < kv * dv; ++i) w.u[i] = w.xv[i] - w.u[i];
  return w.u.data();
}

// One chunk of `rows` tokens from t0, of which the first kv write: reads (causal, into out and,
// when z is carried, den) and then advances s (and z) to the chunk's end.
void chunk(const Head& h, std::size_t t0, std::size_t rows, std::size_t kv, float* s, float* z,
           float* out, float* den, Chunk& w) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* k = h.k + t0 * dk;
  const float* v = h.v + t0 * dv;
  const bool decays = h.g != nullptr;
  if (decays) decay_factors(h.g + t0, rows, kv, w);
  kernels::transpose(kv, dk, k, dk, w.kt.data(), C);
  const float* u = h.beta && kv > 0 ? pseudo_values(h, t0, kv, s, w) : v;
  if (out) {  // O = diag(e^b) Q S_0 + (Q K^T ∘ E) U; den = diag(e^b) Q z_0 + (Q K^T ∘ E) 1
    const float* q = h.q + t0 * dk;
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
      kernels::gemm_tile(rows, kv, dk, q, dk, w.kt.data(), C, w.a.data(), C, false);
      causal_weights(w.a.data(), rows, kv, decays, w);
      kernels::gemm_tile(rows, dv, kv, w.a.data(), C, u, dv, o, dv, true);
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
void run_chunks(const Head& h, std::size_t dk, std::size_t dv, bool key_sum, float* s,
                float* out, float* den, float* checkpoints) {
  Chunk w(dk, dv);
  const std::size_t state = state_floats(dk, dv);
  std::fill(s, s + state, 0.0f);
  float* z = key_sum ? s + dk * dv : nullptr;
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

// The delta rule's part of a chunk's backward, after chunk_backward has the gradient dU of its
// pseudo-values in w.du (U = T R, R = diag(beta) (V - diag(e^b) K S_0), T = (I + L)^{-1}, L_ij =
// beta_i E_ij k_i·k_j for j < i; pseudo_values left T and K K^T in w.t, w.kk):
//   dR = T^T dU, dV = diag(beta) dR, dL = -(dR U^T) below the diagonal, M = dL ∘ diag(beta) E,
//   dK += (M + M^T) K - diag(beta e^b) dR S_0^T, dS_0 -= (diag(beta e^b) K)^T dR,
//   dbeta_i = dR_i·(v_i - e^{b_i} S_0^T k_i) + sum_j dL_ij E_ij k_i·k_j, db from E and e^b.
void delta_backward(const Head& h, std::size_t t0, std::size_t kv, const float* s0, float* ds,
                    const Grads& gr, Chunk& w) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* k = h.k + t0 * dk;
  const float* v = h.v + t0 * dv;
  const float* beta = h.beta + t0;
  const bool decays = h.g != nullptr;
  float* dkc = gr.dk + t0 * dk;
  float* dvc = gr.dv + t0 * dv;
  float* dr = w.dr.data();
  kernels::gemm_tile_at(kv, dv, kv, w.t.data(), C, w.du.data(), dv, dr, dv, false);
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
  kernels::gemm_tile(kv, dk, dv, dr, dv, w.st.data(), dk, w.xk.data(), dk, false);
  for (std::size_t i = 0; i < kv; ++i) {
    const float f = -beta[i] * (decays ? w.eb[i] : 1.0f);
    float* row = &w.xk[i * dk];
    for (std::size_t r = 0; r < dk; ++r) row[r] *= f;
    if (gr.dg && decays) w.db[i] += dot(k + i * dk, row, dk);
    for (std::size_t r = 0; r < dk; ++r) dkc[i * dk + r] += row[r];
  }
  // dL = -dR U^T below the diagonal, into M = dL ∘ diag(beta) E.
  kernels::transpose(kv, dv, w.u.data(), dv, w.vt.data(), C);
  kernels::gemm_tile(kv, kv, dv, dr, dv, w.vt.data(), C, w.m.data(), C, false);
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
  kernels::gemm_tile(kv, dk, kv, w.m.data(), C, k, dk, dkc, dk, true);
  kernels::gemm_tile_at(kv, dk, kv, w.m.data(), C, k, dk, dkc, dk, true);
}

// One chunk's gradients, the forward's products in reverse (matrix products per chunk). s0:
// the state before the chunk (S_0, then z_0). ds, dz: on entry the gradient of the state after
// the chunk, on return of the one before it. Writes the chunk's rows of dk, dv, dg, dbeta and
// (causal) dq. With U the values (sum rule) or pseudo-values (delta rule), A = (Q K^T) ∘ E and
// dA = (dO U^T + d_den 1^T) ∘ mask:
//   dU = A^T dO + diag(e^{b_C - b}) K dS,
//   dK = (dA ∘ E)^T Q + diag(e^{b_C - b}) (U dS^T + 1 dz^T),
//   dQ = diag(e^b) (dO S_0^T + d_den z_0^T) + (dA ∘ E) K, dS_0 = e^{b_C} dS + (diag(e^b) Q)^T dO,
//   dz_0 = e^{b_C} dz + Q^T (e^b ∘ d_den); db from every e^{...} factor, dg its suffix sums.
// The sum rule's dV is dU; the delta rule's comes from delta_backward.
void chunk_backward(const Head& h, std::size_t t0, std::size_t rows, std::size_t kv,
                    const float* s0, float* ds, float* dz, const Grads& gr, Chunk& w) {
  const std::size_t dk = w.dk, dv = w.dv;
  const float* k = h.k + t0 * dk;
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
  const float* u = delta ? pseudo_values(h, t0, kv, s0, w) : h.v + t0 * dv;
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
    const float* q = h.q + t0 * dk;
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
      kernels::gemm_tile(rows, kv, dk, q, dk, w.kt.data(), C, w.a.data(), C, false);
      causal_weights(w.a.data(), rows, kv, decays, w);
      kernels::transpose(kv, dv, u, dv, w.vt.data(), C);
      kernels::gemm_tile(rows, kv, dv, d_out, dv, w.vt.data(), C, w.da.data(), C, false);
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
      kernels::gemm_tile_at(kv, dv, rows, w.a.data(), C, d_out, dv, du, dv, true);
      kernels::gemm_tile(rows, dk, kv, w.da.data(), C, k, dk, dq, dk, true);
      kernels::gemm_tile_at(kv, dk, rows, w.da.data(), C, q, dk, dkc, dk, true);
    }
  }
  if (delta) delta_backward(h, t0, kv, s0, ds, gr, w);
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

std::size_t state_floats(std::size_t dk, std::size_t dv) { return dk * dv + dk; }

std::size_t checkpoint_floats(std::size_t nk, std::size_t dk, std::size_t dv) {
  return (nk + C - 1) / C * state_floats(dk, dv);
}

void forward(const Head& h, std::size_t dk, std::size_t dv, float* out, float* den,
             float* checkpoints) {
  std::vector<float> s(state_floats(dk, dv));
  run_chunks(h, dk, dv, den != nullptr, s.data(), out, den, checkpoints);
  if (h.causal) return;  // every query reads the last state
  kernels::gemm_tile(h.nq, dv, dk, h.q, dk, s.data(), dv, out, dv, false);
  if (den)
    for (std::size_t i = 0; i < h.nq; ++i) den[i] = dot(h.q + i * dk, s.data() + dk * dv, dk);
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

void backward(const Head& h, std::size_t dk, std::size_t dv, const float* d_out,
              const float* d_den, const float* checkpoints, float* dq, float* dk_out,
              float* dv_out, float* dg, float* dbeta) {
  const std::size_t pv = dk * dv, state = state_floats(dk, dv);
  const bool key_sum = d_den != nullptr;
  const std::size_t positions = h.causal ? h.nk : h.valid;
  const std::size_t chunks = (positions + C - 1) / C;
  std::vector<float> saved, s(state);
  if (!checkpoints || !h.causal) {  // non-causal: also the last state
    saved.resize(chunks * state);
    run_chunks(h, dk, dv, key_sum, s.data(), nullptr, nullptr, saved.data());
    checkpoints = saved.data();
  }
  std::vector<float> ds(state, 0.0f);  // the gradient of S, then of z
  float* dz = key_sum ? ds.data() + pv : nullptr;
  if (!h.causal) {  // dS = Q^T dO, dz = Q^T d_den, dq = dO S^T + d_den z^T
    kernels::gemm_tile_at(dk, dv, h.nq, h.q, dk, d_out, dv, ds.data(), dv, false);
    std::vector<float> st(dv * dk);
    kernels::transpose(dk, dv, s.data(), dv, st.data(), dk);
    kernels::gemm_tile(h.nq, dk, dv, d_out, dv, st.data(), dk, dq, dk, false);
    if (key_sum)
      for (std::size_t i = 0; i < h.nq; ++i)
        for (std::size_t r = 0; r < dk; ++r) {
          dz[r] += d_den[i] * h.q[i * dk + r];
          dq[i * dk + r] += d_den[i] * s[pv + r];
        }
  }
  std::fill(dk_out + positions * dk, dk_out + h.nk * dk, 0.0f);
  std::fill(dv_out + positions * dv, dv_out + h.nk * dv, 0.0f);
  if (dg) std::fill(dg + positions, dg + h.nk, 0.0f);
  if (dbeta) std::fill(dbeta + positions, dbeta + h.nk, 0.0f);
  const Grads gr{d_out, d_den, dq, dk_out, dv_out, dg, dbeta};
  Chunk w(dk, dv);
  for (std::size_t c = chunks; c-- > 0;) {
    const std::size_t t0 = c * C, rows = std::min(C, positions - t0);
    const std::size_t kv = std::min(rows, h.valid > t0 ? h.valid - t0 : 0);
    chunk_backward(h, t0, rows, kv, checkpoints + c * state, ds.data(), dz, gr, w);
  }
}

}  // namespace scan

// ---- ScanAttention: preparing a client's inputs for the engine ----
namespace {

constexpr float kNormEps = 1e-6f;

// Per-thread copies of one head's prepared rows and gates.
struct Prepared {
  std::vector<float> q, k, g, beta, qnorm, knorm;
};

// x / sqrt(|x|^2 + eps) per row when `normalise`, times `scale`; norms[i] = sqrt(|x|^2 + eps).
void prepare_rows(const float* x, std::size_t rows, std::size_t dim, bool normalise,
                  float scale, std::vector<float>& out, std::vector<float>& norms) {
  out.resize(rows * dim);
  norms.resize(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    const float* row = x + i * dim;
    float f = scale;
    if (normalise) {  // float partial sums: a float64 chain cost 15 % of the delta forward
      norms[i] = std::sqrt(scan::dot(row, row, dim) + kNormEps);
      f = scale / norms[i];
    }
    for (std::size_t c = 0; c < dim; ++c) out[i * dim + c] = f * row[c];
  }
}

// dx from d(prepared) in place: scale · (d - xhat (xhat·d)) / norm with xhat = x / norm.
void prepare_rows_backward(const float* x, std::size_t rows, std::size_t dim, bool normalise,
                           float scale, const std::vector<float>& norms, float* d) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* di = d + i * dim;
    if (!normalise) {
      for (std::size_t c = 0; c < dim; ++c) di[c] *= scale;
      continue;
    }
    const float* row = x + i * dim;
    const double n = norms[i];
    double proj = 0.0;
    for (std::size_t c = 0; c < dim; ++c) proj += double(row[c]) * di[c];
    for (std::size_t c = 0; c < dim; ++c)
      di[c] = static_cast<float>(scale * (di[c] / n - row[c] * proj / (n * n * n)));
  }
}

// One head of a call prepared for the engine: q scaled (and normalised), k (normalised), g
// from the input or the head's fixed value, beta from the input or the rule's constant.
scan::Head prepare_head(const ScanRule& rule, double head_g, TensorRef q, TensorRef k,
                        TensorRef v, const Mask& mask, const TokenInputs& in, const Dims& d,
                        std::size_t bh, Prepared& w) {
  scan::Head h;
  h.nq = d.nq;
  h.nk = d.nk;
  h.valid = mask.valid_keys(bh / d.heads, d.nk);
  h.causal = mask.causal != Causal::none;
  const auto scale = static_cast<float>(mask.softmax_scale(d.dk));
  prepare_rows(q.data() + bh * d.nq * d.dk, d.nq, d.dk, rule.normalise, scale, w.q, w.qnorm);
  prepare_rows(k.data() + bh * d.nk * d.dk, d.nk, d.dk, rule.normalise, 1.0f, w.k, w.knorm);
  h.q = w.q.data();
  h.k = w.k.data();
  h.v = v.data() + bh * d.nk * d.dv;
  if (in.log_decay) {
    h.g = in.log_decay->data() + bh * d.nk;
  } else if (rule.decay == ScanRule::Decay::per_head) {
    w.g.assign(d.nk, static_cast<float>(head_g));
    h.g = w.g.data();
  }
  if (in.beta) {
    h.beta = in.beta->data() + bh * d.nk;
  } else if (rule.delta) {
    w.beta.assign(d.nk, static_cast<float>(rule.beta));
    h.beta = w.beta.data();
  }
  return h;
}

// The chunk states a causal forward saved through Saved, for its backward; with the call's
// sizes and key lengths, so that a backward of another call recomputes instead.
struct ScanSaved {
  Dims d;
  std::vector<std::size_t> valid;
  std::vector<float> checkpoints;
};

std::vector<std::size_t> valid_keys(const Mask& mask, const Dims& d) {
  std::vector<std::size_t> valid;
  for (std::size_t b = 0; b < d.batch; ++b) valid.push_back(mask.valid_keys(b, d.nk));
  return valid;
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
  s.beta = rule_.delta && rule_.beta_input;
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

double ScanAttention::head_log_decay(std::size_t, std::size_t) const { return 0.0; }

void ScanAttention::run_forward(TensorRef q, TensorRef k, TensorRef v,
                                const Mask& mask, const TokenInputs& in, const Dims& d,
                                Tensor& out, std::vector<float>* checkpoints) const {
  const std::size_t per_head = scan::checkpoint_floats(d.nk, d.dk, d.dv);
  if (checkpoints) checkpoints->resize(d.batch * d.heads * per_head);
  const auto heads = static_cast<std::ptrdiff_t>(d.batch * d.heads);
#pragma omp parallel
  {
    static thread_local Prepared w;  // kept across calls: no page faults per call
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < heads; ++t) {
      const auto bh = static_cast<std::size_t>(t);
      const scan::Head h = prepare_head(rule_, head_log_decay(bh % d.heads, d.heads), q, k, v,
                                        mask, in, d, bh, w);
      scan::forward(h, d.dk, d.dv, out.data() + bh * d.nq * d.dv, nullptr,
                    checkpoints ? checkpoints->data() + bh * per_head : nullptr);
    }
  }
}

void ScanAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                            const Dims& d, Tensor& out) const {
  run_forward(q, k, v, mask, {}, d, out, nullptr);
}

void ScanAttention::compute_with(TensorRef q, TensorRef k, TensorRef v,
                                 const Mask& mask, const TokenInputs& in, const Dims& d,
                                 Tensor& out, Saved* saved) const {
  // Non-causal: the backward recomputes the last state anyway, so nothing is kept.
  if (!saved || mask.causal == Causal::none) {
    if (saved) *saved = Saved();
    run_forward(q, k, v, mask, in, d, out, nullptr);
    return;
  }
  ScanSaved state{d, valid_keys(mask, d), {}};
  run_forward(q, k, v, mask, in, d, out, &state.checkpoints);
  saved->lse = RowLogSumExp();
  saved->state = std::move(state);
}

void ScanAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v,
                                     const Mask& mask, const Dims& d, TensorRef out,
                                     TensorRef d_out, const RowLogSumExp*,
                                     Gradients& g) const {
  AllGradients all;
  all.qkv = std::move(g);
  compute_backward_with(q, k, v, mask, {}, d, out, d_out, Saved(), all);
  g = std::move(all.qkv);
}

void ScanAttention::compute_backward_with(TensorRef q, TensorRef k, TensorRef v,
                                          const Mask& mask, const TokenInputs& in,
                                          const Dims& d, TensorRef, TensorRef d_out,
                                          const Saved& saved, AllGradients& grads) const {
  const auto* state = std::any_cast<ScanSaved>(&saved.state);
  if (state && !(state->d == d && state->valid == valid_keys(mask, d) &&
                 mask.causal != Causal::none))
    state = nullptr;  // another call's: recompute
  const auto scale = static_cast<float>(mask.softmax_scale(d.dk));
  const std::size_t per_head = scan::checkpoint_floats(d.nk, d.dk, d.dv);
  const auto heads = static_cast<std::ptrdiff_t>(d.batch * d.heads);
#pragma omp parallel
  {
    static thread_local Prepared w;  // kept across calls: no page faults per call
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < heads; ++t) {
      const auto bh = static_cast<std::size_t>(t);
      const scan::Head h = prepare_head(rule_, head_log_decay(bh % d.heads, d.heads), q, k, v,
                                        mask, in, d, bh, w);
      float* dg = in.log_decay ? grads.d_log_decay.data() + bh * d.nk : nullptr;
      float* dbeta = in.beta ? grads.d_beta.data() + bh * d.nk : nullptr;
      float* dq = grads.qkv.dq.data() + bh * d.nq * d.dk;
      float* dk = grads.qkv.dk.data() + bh * d.nk * d.dk;
      scan::backward(h, d.dk, d.dv, d_out.data() + bh * d.nq * d.dv, nullptr,
                     state ? state->checkpoints.data() + bh * per_head : nullptr, dq, dk,
                     grads.qkv.dv.data() + bh * d.nk * d.dv, dg, dbeta);
      prepare_rows_backward(q.data() + bh * d.nq * d.dk, d.nq, d.dk, rule_.normalise, scale,
                            w.qnorm, dq);
      prepare_rows_backward(k.data() + bh * d.nk * d.dk, d.nk, d.dk, rule_.normalise, 1.0f,
                            w.knorm, dk);
    }
  }
}

ScanState ScanAttention::start(std::size_t batch, std::size_t heads, std::size_t dk,
                               std::size_t dv, double scale) const {
  if (batch == 0 || heads == 0 || dk == 0 || dv == 0)
    throw Error(spec() + ": a recurrent state needs batch, heads, Dk and Dv >= 1");
  if (scale == 0.0) scale = 1.0 / std::sqrt(double(dk));
  if (!(scale > 0.0 && std::isfinite(scale)))
    throw Error(spec() + ": scale=" + std::to_string(scale) + ": must be finite and > 0");
  return ScanState(*this, batch, heads, dk, dv, scale);
}

ScanState::ScanState(const ScanAttention& owner, std::size_t batch, std::size_t heads,
                     std::size_t dk, std::size_t dv, double scale)
    : rule_(owner.rule()), name_(owner.name()), batch_(batch), heads_(heads), dk_(dk), dv_(dv),
      scale_(scale), memory_(batch * heads * dk * dv, 0.0f) {
  for (std::size_t h = 0; h < heads; ++h) head_g_.push_back(owner.head_log_decay(h, heads));
}

Tensor ScanState::step(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in) {
  const std::string who = name_ + " state step";
  auto expect = [&](TensorRef t, std::size_t dim, const char* what) {
    const auto& s = t.shape();
    if (s[0] != batch_ || s[1] != heads_ || s[2] != 1 || s[3] != dim)
      throw Error(who + ": " + what + " has shape " + shape_string(t) + ", expected [" +
                  std::to_string(batch_) + ", " + std::to_string(heads_) + ", 1, " +
                  std::to_string(dim) + "]");
  };
  expect(q, dk_, "q");
  expect(k, dk_, "k");
  expect(v, dv_, "v");
  for (const auto& [t, label, taken] :
       {std::tuple{in.log_decay, "log-decay g", rule_.decay == ScanRule::Decay::input},
        std::tuple{in.beta, "beta", rule_.delta && rule_.beta_input}}) {
    if (!t) continue;
    if (!taken) throw Unsupported(name_, std::string("a per-token ") + label + " input");
    if (t->shape()[0] != batch_ || t->shape()[1] != heads_ || t->shape()[2] != 1)
      throw Error(who + ": " + label + " must have shape [" + std::to_string(batch_) + ", " +
                  std::to_string(heads_) + ", 1]");
  }
  Tensor out = Tensor::from_shape({batch_, heads_, 1, dv_});
  Prepared w;
  std::vector<float> tmp(dv_);
  for (std::size_t bh = 0; bh < batch_ * heads_; ++bh) {
    prepare_rows(q.data() + bh * dk_, 1, dk_, rule_.normalise, static_cast<float>(scale_), w.q,
                 w.qnorm);
    prepare_rows(k.data() + bh * dk_, 1, dk_, rule_.normalise, 1.0f, w.k, w.knorm);
    float g = static_cast<float>(head_g_[bh % heads_]);
    if (in.log_decay) g = in.log_decay->data()[bh];
    float beta = static_cast<float>(rule_.beta);
    if (in.beta) beta = in.beta->data()[bh];
    if (!(g <= 0.0f) || !(beta >= 0.0f && beta <= 1.0f))
      throw Error(who + ": g must be <= 0 and beta in [0, 1]");
    scan::step(memory_.data() + bh * dk_ * dv_, nullptr, w.q.data(), w.k.data(),
               v.data() + bh * dv_, g, rule_.delta ? &beta : nullptr, dk_, dv_,
               out.data() + bh * dv_, nullptr, tmp.data());
  }
  ++position_;
  return out;
}

}  // namespace attnlab
