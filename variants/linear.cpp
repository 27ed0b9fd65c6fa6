#include "variants/linear.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnlab/error.hpp"
#include "attnlab/kernels.hpp"

namespace attnlab {
namespace {

// Tokens per chunk of the causal sum rule: a multiple of gemm_tile's 6-row and 8-column blocks,
// small enough that the masked chunk x chunk product stays cheap next to the state products.
constexpr std::size_t kChunk = 48;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// favor, causal: exp(E_j - c_i) is computed as exp(E_j - c_end) · exp(c_end - c_i). When the
// stabiliser grows by more than this within one chunk the first factor could underflow, so the
// chunk's intra part is then computed directly (slow, exact).
constexpr float kMaxSpread = 60.0f;

// x[i] = exp(x[i] - c).
void exp_shifted(float* x, std::size_t n, float c) {
  for (std::size_t i = 0; i < n; ++i) x[i] = (x[i] - c) * kLog2e;
  kernels::exp2_inplace(x, n);
}

float row_max(const float* x, std::size_t n) { return *std::max_element(x, x + n); }

// Eight independent partial sums: a plain float reduction is one serial chain of dependent
// adds (GCC may not reorder it), which cost as much as the chunk's products.
float dot(const float* a, const float* b, std::size_t n) {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float x : acc) s += x;
  return s;
}

float sum(const float* a, std::size_t n) {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += a[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i];
  for (float x : acc) s += x;
  return s;
}

// phi for `rows` rows; favor stabilised by each row's own max (see the header).
void row_features(const FeatureMap& map, const float* x, std::size_t rows, float* out) {
  if (rows == 0) return;
  map.map(x, rows, out);
  if (!map.logarithmic()) return;
  const std::size_t p = map.dim();
  for (std::size_t i = 0; i < rows; ++i) exp_shifted(out + i * p, p, row_max(out + i * p, p));
}

// phi / sum(phi) per row (delta rule); a zero row stays zero.
void sum_normalise(float* f, std::size_t rows, std::size_t p) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* row = f + i * p;
    const float total = sum(row, p);
    if (total > 0.0f)
      for (std::size_t c = 0; c < p; ++c) row[c] /= total;
  }
}

// out_i /= den_i + eps, zeros where the denominator is zero.
void divide_rows(float* out, std::size_t rows, std::size_t dv, const float* den, float eps) {
  for (std::size_t i = 0; i < rows; ++i) {
    const float inv = den[i] > 0.0f ? 1.0f / (den[i] + eps) : 0.0f;
    for (std::size_t c = 0; c < dv; ++c) out[i * dv + c] *= inv;
  }
}

// out[dv] = f[p] · m[p x dv] (a one-row product on the dispatched kernels).
void vec_mat(const float* f, const float* m, std::size_t p, std::size_t dv, float* out) {
  kernels::gemm_tile(1, dv, p, f, p, m, dv, out, dv, false);
}

struct Workspace {
  std::size_t p, dv;
  std::vector<float> fq, fk, fkt, a, den, c, s, z, tmp;
  Workspace(std::size_t p_, std::size_t dv_)
      : p(p_), dv(dv_), fq(kChunk * p), fk(kChunk * p), fkt(p * kChunk), a(kChunk * kChunk),
        den(kChunk), c(kChunk), s(p * dv), z(p), tmp(std::max(p, dv)) {}

  void clear_state() {
    std::fill(s.begin(), s.end(), 0.0f);
    std::fill(z.begin(), z.end(), 0.0f);
  }
  // (S, z) re-expressed at a larger favor stabiliser: multiply by exp(from - to).
  void restabilise(float from, float to) {
    if (from == kNegInf || to <= from) return;  // an empty state stays zero
    const float f = std::exp(from - to);
    for (float& x : s) x *= f;
    for (float& x : z) x *= f;
  }
};

// Key features of one chunk of `rows` keys of which the first `valid` are real, transposed into
// w.fkt [P x kChunk] (padding columns zero). favor: w.fk keeps the log-features, w.c[i] is the
// running stabiliser after key i (starting from c_prev), and fkt is taken at the chunk's last
// one, which is returned.
float key_features(const FeatureMap& map, const float* k, std::size_t rows, std::size_t valid,
                   float c_prev, Workspace& w) {
  const std::size_t p = w.p;
  if (valid > 0) map.map(k, valid, w.fk.data());
  float c = c_prev;
  if (map.logarithmic())
    for (std::size_t i = 0; i < rows; ++i) {
      if (i < valid) c = std::max(c, row_max(&w.fk[i * p], p));
      w.c[i] = c;
    }
  for (std::size_t j = 0; j < kChunk; ++j) {
    const bool real = j < valid;
    const float* src = &w.fk[j * p];
    if (real && map.logarithmic()) {
      std::copy(src, src + p, w.tmp.data());
      exp_shifted(w.tmp.data(), p, c);
      src = w.tmp.data();
    }
    for (std::size_t r = 0; r < p; ++r) w.fkt[r * kChunk + j] = real ? src[r] : 0.0f;
  }
  return c;
}

void add_key_sums(Workspace& w, const float* v, std::size_t valid) {
  if (valid == 0) return;
  kernels::gemm_tile(w.p, w.dv, valid, w.fkt.data(), kChunk, v, w.dv, w.s.data(), w.dv, true);
  for (std::size_t r = 0; r < w.p; ++r) w.z[r] += sum(&w.fkt[r * kChunk], valid);
}

// One head of the sum rule, every query reading all `valid` keys.
void sum_all(const FeatureMap& map, const float* q, const float* k, const float* v,
             std::size_t nq, std::size_t valid, std::size_t dk, float eps, float* out,
             Workspace& w) {
  w.clear_state();
  float c = kNegInf;
  for (std::size_t j0 = 0; j0 < valid; j0 += kChunk) {
    const std::size_t rows = std::min(kChunk, valid - j0);
    const float c_new = key_features(map, k + j0 * dk, rows, rows, c, w);
    if (map.logarithmic()) w.restabilise(c, c_new);
    c = c_new;
    add_key_sums(w, v + j0 * w.dv, rows);
  }
  for (std::size_t i0 = 0; i0 < nq; i0 += kChunk) {
    const std::size_t rows = std::min(kChunk, nq - i0);
    row_features(map, q + i0 * dk, rows, w.fq.data());
    float* o = out + i0 * w.dv;
    kernels::gemm_tile(rows, w.dv, w.p, w.fq.data(), w.p, w.s.data(), w.dv, o, w.dv, false);
    for (std::size_t i = 0; i < rows; ++i) w.den[i] = dot(&w.fq[i * w.p], w.z.data(), w.p);
    divide_rows(o, rows, w.dv, w.den.data(), eps);
  }
}

// One head of the causal sum rule (Nq == Nk = n) in chunked form.
void sum_causal(const FeatureMap& map, const float* q, const float* k, const float* v,
                std::size_t n, std::size_t valid_keys, std::size_t dk, float eps, float* out,
                Workspace& w) {
  const std::size_t p = w.p, dv = w.dv;
  const bool log_form = map.logarithmic();
  w.clear_state();
  float c = kNegInf;
  for (std::size_t t0 = 0; t0 < n; t0 += kChunk) {
    const std::size_t rows = std::min(kChunk, n - t0);
    const std::size_t valid = std::min(rows, valid_keys > t0 ? valid_keys - t0 : 0);
    const float c_prev = c;
    const float c_end = key_features(map, k + t0 * dk, rows, valid, c_prev, w);
    row_features(map, q + t0 * dk, rows, w.fq.data());
    float* o = out + t0 * dv;
    // Earlier chunks, through the carried state (at stabiliser c_prev).
    kernels::gemm_tile(rows, dv, p, w.fq.data(), p, w.s.data(), dv, o, dv, false);
    for (std::size_t i = 0; i < rows; ++i) w.den[i] = dot(&w.fq[i * p], w.z.data(), p);
    // This chunk: the masked product phi(Q) phi(K)^T.
    kernels::gemm_tile(rows, rows, p, w.fq.data(), p, w.fkt.data(), kChunk, w.a.data(), kChunk,
                       false);
    if (log_form) {
      const bool direct = valid > 0 && c_end - w.c[0] > kMaxSpread;
      for (std::size_t i = 0; i < rows; ++i) {
        const float ci = w.c[i];
        const float alpha = (ci == kNegInf || c_prev == kNegInf) ? 0.0f : std::exp(c_prev - ci);
        const float gamma = ci == kNegInf ? 0.0f : std::exp(c_end - ci);
        for (std::size_t col = 0; col < dv; ++col) o[i * dv + col] *= alpha;
        w.den[i] *= alpha;
        float* arow = &w.a[i * kChunk];
        for (std::size_t j = 0; j < rows; ++j) arow[j] *= gamma;
        if (direct && ci != kNegInf)
          for (std::size_t j = 0; j <= i && j < valid; ++j) {
            float sum = 0.0f;
            for (std::size_t r = 0; r < p; ++r)
              sum += w.fq[i * p + r] * std::exp(w.fk[j * p + r] - ci);
            arow[j] = sum;
          }
      }
    }
    for (std::size_t i = 0; i < rows; ++i) {
      float* arow = &w.a[i * kChunk];
      for (std::size_t j = i + 1; j < rows; ++j) arow[j] = 0.0f;
      w.den[i] += sum(arow, std::min(i + 1, valid));
    }
    if (valid > 0)
      kernels::gemm_tile(rows, dv, valid, w.a.data(), kChunk, v + t0 * dv, dv, o, dv, true);
    divide_rows(o, rows, dv, w.den.data(), eps);
    if (log_form) w.restabilise(c_prev, c_end);
    add_key_sums(w, v + t0 * dv, valid);
    c = c_end;
  }
}

// W += beta (v - W phi_k) phi_k^T, with W stored transposed as wt [P x Dv]: a read, a rank-1
// update, and with fq given the read out = W phi_q of the updated memory, all on gemm_tile.
void delta_write(const float* fk, const float* v, float beta, std::size_t p, std::size_t dv,
                 float* wt, float* tmp, const float* fq = nullptr, float* out = nullptr) {
  vec_mat(fk, wt, p, dv, tmp);
  for (std::size_t c = 0; c < dv; ++c) tmp[c] = beta * (v[c] - tmp[c]);
  kernels::gemm_tile(p, dv, 1, fk, 1, tmp, dv, wt, dv, true);
  if (fq) vec_mat(fq, wt, p, dv, out);
}

void delta_features(const FeatureMap& map, const float* x, std::size_t rows, float* out) {
  row_features(map, x, rows, out);
  sum_normalise(out, rows, map.dim());
}

// One head of the delta rule. causal: out_i = W_i phi(q_i) (Nq == Nk); else all read W_valid.
void delta_head(const FeatureMap& map, const float* q, const float* k, const float* v,
                std::size_t nq, std::size_t nk, std::size_t valid_keys, std::size_t dk,
                float beta, bool causal, float* out, Workspace& w) {
  const std::size_t p = w.p, dv = w.dv;
  w.clear_state();  // w.s holds W^T
  const std::size_t writes = causal ? nk : valid_keys;
  for (std::size_t t0 = 0; t0 < writes; t0 += kChunk) {
    const std::size_t rows = std::min(kChunk, writes - t0);
    const std::size_t valid = std::min(rows, valid_keys > t0 ? valid_keys - t0 : 0);
    delta_features(map, k + t0 * dk, valid, w.fk.data());
    if (causal) delta_features(map, q + t0 * dk, rows, w.fq.data());
    for (std::size_t i = 0; i < rows; ++i) {
      const float* fq = causal ? &w.fq[i * p] : nullptr;
      float* o = causal ? out + (t0 + i) * dv : nullptr;
      if (i < valid)
        delta_write(&w.fk[i * p], v + (t0 + i) * dv, beta, p, dv, w.s.data(), w.tmp.data(), fq, o);
      else if (causal)
        vec_mat(fq, w.s.data(), p, dv, o);
    }
  }
  if (causal) return;
  for (std::size_t i0 = 0; i0 < nq; i0 += kChunk) {
    const std::size_t rows = std::min(kChunk, nq - i0);
    delta_features(map, q + i0 * dk, rows, w.fq.data());
    kernels::gemm_tile(rows, dv, p, w.fq.data(), p, w.s.data(), dv, out + i0 * dv, dv, false);
  }
}


// ---- Backward ----
// The gradients of what the forward computes, with favor's stabilisers held constant (they
// cancel between numerator and denominator up to eps, and exactly under the delta rule's
// normalisation). Padded keys and values get zero gradients.

// a[rows x cols] (leading dimension lda) -> at[cols x rows] (leading dimension ldt).
void transpose(const float* a, std::size_t rows, std::size_t cols, std::size_t lda, float* at,
               std::size_t ldt) {
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) at[j * ldt + i] = a[i * lda + j];
}

// exp(from - to) for stabilisers from <= to (favor), 0 when from is -inf; 1 without a
// stabiliser (elementwise feature maps).
float factor(bool log_form, float from, float to) {
  if (!log_form) return 1.0f;
  return from == kNegInf ? 0.0f : std::exp(from - to);
}

// Per-thread scratch of the backward: feature chunks, their gradients, the chunk products and
// the carried states with their gradients.
struct GradWorkspace {
  std::size_t p, dv;
  std::vector<float> fq, fk, fqt, fkt, dfq, dfk, a, at, gm, gt, vt, dnum, dden, den, c;
  std::vector<float> s, z, st, ds, dz, dst;
  GradWorkspace(std::size_t p_, std::size_t dv_)
      : p(p_), dv(dv_), fq(kChunk * p), fk(kChunk * p), fqt(p * kChunk), fkt(p * kChunk),
        dfq(kChunk * p), dfk(kChunk * p), a(kChunk * kChunk), at(kChunk * kChunk),
        gm(kChunk * kChunk), gt(kChunk * kChunk), vt(dv * kChunk), dnum(kChunk * dv),
        dden(kChunk), den(kChunk), c(kChunk), s(p * dv), z(p), st(dv * p), ds(p * dv), dz(p),
        dst(dv * p) {}
};

// The sum rule's output gradient split at the division out_i = num_i / (den_i + eps):
// dnum_i = g_i / (den_i + eps), dden_i = -(g_i · out_i) / (den_i + eps); zero where den_i = 0
// (the forward outputs a constant 0 there).
void split_division(const float* g, const float* out, std::size_t rows, std::size_t dv,
                    float eps, GradWorkspace& w) {
  for (std::size_t i = 0; i < rows; ++i) {
    const float inv = w.den[i] > 0.0f ? 1.0f / (w.den[i] + eps) : 0.0f;
    for (std::size_t c = 0; c < dv; ++c) w.dnum[i * dv + c] = g[i * dv + c] * inv;
    w.dden[i] = -inv * dot(g + i * dv, out + i * dv, dv);
  }
}

// One head of the non-causal sum rule: every query reads S = sum_j phi(k_j) v_j^T and z.
//   dphi(q_i) = S dnum_i + z dden_i;  dS = sum_i phi(q_i) dnum_i^T, dz = sum_i phi(q_i) dden_i;
//   dphi(k_j) = dS v_j + dz;          dv_j = dS^T phi(k_j).
void sum_all_backward(const FeatureMap& map, const float* q, const float* k, const float* v,
                      const float* out, const float* g, std::size_t nq, std::size_t nk,
                      std::size_t valid, std::size_t dk, float eps, float* dq, float* dkey,
                      float* dval, Workspace& fw, GradWorkspace& w) {
  const std::size_t p = w.p, dv = w.dv;
  fw.clear_state();  // S, z and favor's key stabiliser c exactly as the forward builds them
  float c = kNegInf;
  for (std::size_t j0 = 0; j0 < valid; j0 += kChunk) {
    const std::size_t rows = std::min(kChunk, valid - j0);
    const float c_new = key_features(map, k + j0 * dk, rows, rows, c, fw);
    if (map.logarithmic()) fw.restabilise(c, c_new);
    c = c_new;
    add_key_sums(fw, v + j0 * dv, rows);
  }
  transpose(fw.s.data(), p, dv, dv, w.st.data(), p);
  std::fill(w.ds.begin(), w.ds.end(), 0.0f);
  std::fill(w.dz.begin(), w.dz.end(), 0.0f);
  for (std::size_t i0 = 0; i0 < nq; i0 += kChunk) {
    const std::size_t rows = std::min(kChunk, nq - i0);
    row_features(map, q + i0 * dk, rows, w.fq.data());
    for (std::size_t i = 0; i < rows; ++i) w.den[i] = dot(&w.fq[i * p], fw.z.data(), p);
    split_division(g + i0 * dv, out + i0 * dv, rows, dv, eps, w);
    kernels::gemm_tile(rows, p, dv, w.dnum.data(), dv, w.st.data(), p, w.dfq.data(), p, false);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t r = 0; r < p; ++r) w.dfq[i * p + r] += w.dden[i] * fw.z[r];
    map.backward(q + i0 * dk, rows, w.fq.data(), w.dfq.data(), dq + i0 * dk);
    transpose(w.fq.data(), rows, p, p, w.fqt.data(), kChunk);
    kernels::gemm_tile(p, dv, rows, w.fqt.data(), kChunk, w.dnum.data(), dv, w.ds.data(), dv, true);
    for (std::size_t r = 0; r < p; ++r) w.dz[r] += dot(&w.fqt[r * kChunk], w.dden.data(), rows);
  }
  transpose(w.ds.data(), p, dv, dv, w.dst.data(), p);
  for (std::size_t j0 = 0; j0 < valid; j0 += kChunk) {
    const std::size_t rows = std::min(kChunk, valid - j0);
    map.map(k + j0 * dk, rows, w.fk.data());
    if (map.logarithmic())  // at the forward's final stabiliser
      for (std::size_t j = 0; j < rows; ++j) exp_shifted(&w.fk[j * p], p, c);
    kernels::gemm_tile(rows, p, dv, v + j0 * dv, dv, w.dst.data(), p, w.dfk.data(), p, false);
    for (std::size_t j = 0; j < rows; ++j)
      for (std::size_t r = 0; r < p; ++r) w.dfk[j * p + r] += w.dz[r];
    kernels::gemm_tile(rows, dv, p, w.fk.data(), p, w.ds.data(), dv, dval + j0 * dv, dv, false);
    map.backward(k + j0 * dk, rows, w.fk.data(), w.dfk.data(), dkey + j0 * dk);
  }
  std::fill(dkey + valid * dk, dkey + nk * dk, 0.0f);
  std::fill(dval + valid * dv, dval + nk * dv, 0.0f);
}

// Key features of one causal chunk of `rows` keys, the first `valid` real: w.fk rows
// exp(E_j - c_j), each key stabilised by its own running stabiliser c_j (favor: the max
// log-feature of the keys so far, from c_prev on; no overflow, and exp(E_j - c_i) =
// phi_j · exp(c_j - c_i) with both factors <= 1 for j <= i), w.c[j] = c_j; padding rows zero.
// Elementwise maps: the features, c = 0. Returns the stabiliser at the chunk's end.
float causal_key_features(const FeatureMap& map, const float* k, std::size_t rows,
                          std::size_t valid, float c_prev, GradWorkspace& w) {
  const std::size_t p = w.p;
  if (valid > 0) map.map(k, valid, w.fk.data());
  std::fill(w.fk.begin() + static_cast<std::ptrdiff_t>(valid * p), w.fk.end(), 0.0f);
  float c = map.logarithmic() ? c_prev : 0.0f;
  for (std::size_t j = 0; j < rows; ++j) {
    if (j < valid && map.logarithmic()) {
      c = std::max(c, row_max(&w.fk[j * p], p));
      exp_shifted(&w.fk[j * p], p, c);
    }
    w.c[j] = c;
  }
  return c;
}

// The chunk's pair weights: w.a[i][j] = phi(q_i)·phi(k_j) exp(c_j - c_i), what query i gives
// key j, for j <= i and j < valid; zero elsewhere.
void chunk_weights(std::size_t rows, std::size_t valid, bool log_form, GradWorkspace& w) {
  std::fill(w.a.begin(), w.a.end(), 0.0f);
  if (valid == 0) return;
  transpose(w.fk.data(), valid, w.p, w.p, w.fkt.data(), kChunk);
  kernels::gemm_tile(rows, valid, w.p, w.fq.data(), w.p, w.fkt.data(), kChunk, w.a.data(), kChunk,
                     false);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < valid; ++j)
      w.a[i * kChunk + j] = j <= i ? w.a[i * kChunk + j] * factor(log_form, w.c[j], w.c[i]) : 0.0f;
}

// Their gradients: w.gm[i][j] = exp(c_j - c_i) (dnum_i · v_j + dden_i) on the same pairs.
void chunk_weight_grads(const float* v, std::size_t rows, std::size_t valid, bool log_form,
                        GradWorkspace& w) {
  std::fill(w.gm.begin(), w.gm.end(), 0.0f);
  if (valid == 0) return;
  transpose(v, valid, w.dv, w.dv, w.vt.data(), kChunk);
  kernels::gemm_tile(rows, valid, w.dv, w.dnum.data(), w.dv, w.vt.data(), kChunk, w.gm.data(),
                     kChunk, false);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < valid; ++j)
      w.gm[i * kChunk + j] =
          j <= i ? (w.gm[i * kChunk + j] + w.dden[i]) * factor(log_form, w.c[j], w.c[i]) : 0.0f;
}

// One head of the causal sum rule (Nq == Nk = n) in two chunked passes, O(P·Dv) state each:
// forward, carrying (S, z) as the forward does, for dphi(q); backward in time, carrying
// R = sum_{i later} phi(q_i) dnum_i^T and r = sum_{i later} phi(q_i) dden_i, for dphi(k) and dv.
// States are kept at a reference stabiliser (forward: the last key's before the chunk; backward:
// the chunk's last), so every exponential factor is <= 1. den and stab hold n floats: each
// row's denominator and stabiliser, from the first pass for the second.
void sum_causal_backward(const FeatureMap& map, const float* q, const float* k, const float* v,
                         const float* out, const float* g, std::size_t n, std::size_t valid_keys,
                         std::size_t dk, float eps, float* dq, float* dkey, float* dval,
                         float* den, float* stab, GradWorkspace& w) {
  const std::size_t p = w.p, dv = w.dv;
  const bool log_form = map.logarithmic();
  const auto chunk_valid = [&](std::size_t t0, std::size_t rows) {
    return std::min(rows, valid_keys > t0 ? valid_keys - t0 : 0);
  };
  std::fill(w.s.begin(), w.s.end(), 0.0f);
  std::fill(w.z.begin(), w.z.end(), 0.0f);
  float c_prev = log_form ? kNegInf : 0.0f;
  for (std::size_t t0 = 0; t0 < n; t0 += kChunk) {
    const std::size_t rows = std::min(kChunk, n - t0), valid = chunk_valid(t0, rows);
    const float c_end = causal_key_features(map, k + t0 * dk, rows, valid, c_prev, w);
    std::copy_n(w.c.data(), rows, stab + t0);
    row_features(map, q + t0 * dk, rows, w.fq.data());
    for (std::size_t i = 0; i < rows; ++i) w.den[i] = dot(&w.fq[i * p], w.z.data(), p);
    // The carried part seen from row i: exp(c_prev - c_i) (S, z).
    for (std::size_t i = 0; i < rows; ++i) w.den[i] *= factor(log_form, c_prev, w.c[i]);
    chunk_weights(rows, valid, log_form, w);
    for (std::size_t i = 0; i < rows; ++i) den[t0 + i] = w.den[i] += sum(&w.a[i * kChunk], valid);
    split_division(g + t0 * dv, out + t0 * dv, rows, dv, eps, w);
    chunk_weight_grads(v + t0 * dv, rows, valid, log_form, w);
    // dphi(q_i) = exp(c_prev - c_i) (S dnum_i + z dden_i) + sum_j gm_ij phi(k_j).
    transpose(w.s.data(), p, dv, dv, w.st.data(), p);
    kernels::gemm_tile(rows, p, dv, w.dnum.data(), dv, w.st.data(), p, w.dfq.data(), p, false);
    for (std::size_t i = 0; i < rows; ++i) {
      const float f = factor(log_form, c_prev, w.c[i]);
      for (std::size_t r = 0; r < p; ++r)
        w.dfq[i * p + r] = (w.dfq[i * p + r] + w.dden[i] * w.z[r]) * f;
    }
    if (valid > 0)
      kernels::gemm_tile(rows, p, valid, w.gm.data(), kChunk, w.fk.data(), p, w.dfq.data(), p,
                         true);
    map.backward(q + t0 * dk, rows, w.fq.data(), w.dfq.data(), dq + t0 * dk);
    // (S, z) moved to the reference c_end, this chunk's keys added.
    const float keep = factor(log_form, c_prev, c_end);
    for (float& x : w.s) x *= keep;
    for (float& x : w.z) x *= keep;
    for (std::size_t j = 0; j < valid; ++j) {
      const float f = factor(log_form, w.c[j], c_end);
      for (std::size_t r = 0; r < p; ++r) w.fkt[r * kChunk + j] = w.fk[j * p + r] * f;
    }
    if (valid > 0) {
      kernels::gemm_tile(p, dv, valid, w.fkt.data(), kChunk, v + t0 * dv, dv, w.s.data(), dv, true);
      for (std::size_t r = 0; r < p; ++r) w.z[r] += sum(&w.fkt[r * kChunk], valid);
    }
    c_prev = c_end;
  }
  // Backward in time: R, r in w.ds, w.dz at the reference stabiliser of the chunk's last row.
  std::fill(w.ds.begin(), w.ds.end(), 0.0f);
  std::fill(w.dz.begin(), w.dz.end(), 0.0f);
  for (std::size_t chunk = (n + kChunk - 1) / kChunk; chunk-- > 0;) {
    const std::size_t t0 = chunk * kChunk;
    const std::size_t rows = std::min(kChunk, n - t0), valid = chunk_valid(t0, rows);
    const float c_before = t0 > 0 ? stab[t0 - 1] : (log_form ? kNegInf : 0.0f);
    const float c_end = causal_key_features(map, k + t0 * dk, rows, valid, c_before, w);
    row_features(map, q + t0 * dk, rows, w.fq.data());
    std::copy_n(den + t0, rows, w.den.data());
    split_division(g + t0 * dv, out + t0 * dv, rows, dv, eps, w);
    chunk_weights(rows, valid, log_form, w);
    chunk_weight_grads(v + t0 * dv, rows, valid, log_form, w);
    float* dk_rows = dkey + t0 * dk;
    float* dv_rows = dval + t0 * dv;
    if (valid > 0) {
      // dphi(k_j) = exp(c_j - c_end) (R v_j + r) + sum_i gm_ij phi(q_i);
      // dv_j = exp(c_j - c_end) R^T phi(k_j) + sum_i a_ij dnum_i.
      transpose(w.ds.data(), p, dv, dv, w.dst.data(), p);
      kernels::gemm_tile(valid, p, dv, v + t0 * dv, dv, w.dst.data(), p, w.dfk.data(), p, false);
      kernels::gemm_tile(valid, dv, p, w.fk.data(), p, w.ds.data(), dv, dv_rows, dv, false);
      for (std::size_t j = 0; j < valid; ++j) {
        const float f = factor(log_form, w.c[j], c_end);
        for (std::size_t r = 0; r < p; ++r) w.dfk[j * p + r] = (w.dfk[j * p + r] + w.dz[r]) * f;
        for (std::size_t col = 0; col < dv; ++col) dv_rows[j * dv + col] *= f;
      }
      transpose(w.gm.data(), rows, valid, kChunk, w.gt.data(), kChunk);
      kernels::gemm_tile(valid, p, rows, w.gt.data(), kChunk, w.fq.data(), p, w.dfk.data(), p,
                         true);
      transpose(w.a.data(), rows, valid, kChunk, w.at.data(), kChunk);
      kernels::gemm_tile(valid, dv, rows, w.at.data(), kChunk, w.dnum.data(), dv, dv_rows, dv,
                         true);
      map.backward(k + t0 * dk, valid, w.fk.data(), w.dfk.data(), dk_rows);
    }
    std::fill(dk_rows + valid * dk, dk_rows + rows * dk, 0.0f);
    std::fill(dv_rows + valid * dv, dv_rows + rows * dv, 0.0f);
    // (R, r) moved to the reference c_before, this chunk's queries added.
    const float keep = factor(log_form, c_before, c_end);
    for (float& x : w.ds) x *= keep;
    for (float& x : w.dz) x *= keep;
    for (std::size_t i = 0; i < rows; ++i) {
      const float f = factor(log_form, c_before, w.c[i]);
      for (std::size_t r = 0; r < p; ++r) w.fqt[r * kChunk + i] = w.fq[i * p + r] * f;
    }
    kernels::gemm_tile(p, dv, rows, w.fqt.data(), kChunk, w.dnum.data(), dv, w.ds.data(), dv, true);
    for (std::size_t r = 0; r < p; ++r) w.dz[r] += dot(&w.fqt[r * kChunk], w.dden.data(), rows);
  }
}

// Delta-rule features of `rows` rows: phi as the feature map's backward needs it (favor:
// stabilised by the row's max), hat = phi / sum(phi) (zero rows stay zero), and the sums.
void delta_rows(const FeatureMap& map, const float* x, std::size_t rows, float* phi, float* hat,
                float* sums) {
  const std::size_t p = map.dim();
  row_features(map, x, rows, phi);
  for (std::size_t i = 0; i < rows; ++i) {
    sums[i] = sum(phi + i * p, p);
    for (std::size_t r = 0; r < p; ++r)
      hat[i * p + r] = sums[i] > 0.0f ? phi[i * p + r] / sums[i] : 0.0f;
  }
}

// d/dphi of hat = phi / sum(phi), in place: (dhat - dhat·hat) / sum; zero where the sum is 0.
void hat_backward(const float* hat, const float* sums, std::size_t rows, std::size_t p,
                  float* d) {
  for (std::size_t i = 0; i < rows; ++i) {
    float* row = d + i * p;
    const float along = dot(row, hat + i * p, p);
    for (std::size_t r = 0; r < p; ++r)
      row[r] = sums[i] > 0.0f ? (row[r] - along) / sums[i] : 0.0f;
  }
}

// Per-thread scratch of the delta rule's backward (buffers grow to the longest head).
struct DeltaWorkspace {
  std::vector<float> phi, hat, sums, dhat, dx, checkpoints, states, gm, u, du, mt;
};

// One head of the delta rule by recomputation. M = W^T [P x Dv]; a write is
// M_j = M_{j-1} + hat(k_j) u_j^T, u_j = beta (v_j - M_{j-1}^T hat(k_j)). Going back in time,
// with G = dL/dM_j: du = G^T hat(k_j), dv_j = beta du, dhat(k_j) = G u_j - beta M_{j-1} du, and
// G <- G - beta hat(k_j) du^T. The states M_{j-1} are recomputed from checkpoints kept every
// C = ceil(sqrt(writes)) writes: O((writes / C + C)·P·Dv) memory, three passes of writes.
void delta_backward(const FeatureMap& map, const float* q, const float* k, const float* v,
                    const float* g, std::size_t nq, std::size_t nk, std::size_t valid_keys,
                    std::size_t dk, std::size_t dv, float beta, bool causal, float* dq,
                    float* dkey, float* dval, DeltaWorkspace& w) {
  const std::size_t p = map.dim(), pv = p * dv, writes = std::min(valid_keys, nk);
  const std::size_t every = std::max<std::size_t>(
      1, static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(writes)))));
  const std::size_t rows_max = std::max(kChunk, every);
  w.phi.resize(rows_max * p);
  w.hat.resize(rows_max * p);
  w.sums.resize(rows_max);
  w.dhat.resize(rows_max * p);
  w.checkpoints.assign((writes + every - 1) / every * pv, 0.0f);
  w.states.resize(every * pv);
  w.gm.assign(pv, 0.0f);
  w.u.resize(dv);
  w.du.resize(dv);
  w.mt.resize(pv);
  std::vector<float> m(pv, 0.0f);
  // dq rows [i0, i0 + rows) from dhat(q_i) = M g_i with M = mt^T (already in w.mt, [Dv x P]).
  const auto query_grads = [&](std::size_t i0, std::size_t rows) {
    delta_rows(map, q + i0 * dk, rows, w.phi.data(), w.hat.data(), w.sums.data());
    kernels::gemm_tile(rows, p, dv, g + i0 * dv, dv, w.mt.data(), p, w.dhat.data(), p, false);
    hat_backward(w.hat.data(), w.sums.data(), rows, p, w.dhat.data());
    map.backward(q + i0 * dk, rows, w.phi.data(), w.dhat.data(), dq + i0 * dk);
    // G += sum_i hat(q_i) g_i^T: what the reads add to the gradient of the memory they read.
    transpose(w.hat.data(), rows, p, p, w.phi.data(), rows);  // phi is free again
    kernels::gemm_tile(p, dv, rows, w.phi.data(), rows, g + i0 * dv, dv, w.gm.data(), dv, true);
  };
  // Pass 1: the writes, checkpoints; causal reads take their gradients as they come.
  const std::size_t positions = causal ? nk : writes;
  for (std::size_t t0 = 0; t0 < positions; t0 += kChunk) {
    const std::size_t rows = std::min(kChunk, positions - t0);
    const std::size_t kv = std::min(rows, writes > t0 ? writes - t0 : 0);
    delta_rows(map, k + t0 * dk, kv, w.phi.data(), w.hat.data(), w.sums.data());
    for (std::size_t i = 0; i < rows; ++i) {
      const std::size_t j = t0 + i;
      if (j < writes) {
        if (j % every == 0) std::copy(m.begin(), m.end(), w.checkpoints.begin() + (j / every) * pv);
        delta_write(&w.hat[i * p], v + j * dv, beta, p, dv, m.data(), w.u.data());
      }
      if (causal)  // dhat(q_j) = M_j g_j, M_j the memory read at position j
        for (std::size_t r = 0; r < p; ++r) w.dhat[i * p + r] = dot(&m[r * dv], g + j * dv, dv);
    }
    if (causal) {
      delta_rows(map, q + t0 * dk, rows, w.phi.data(), w.hat.data(), w.sums.data());
      hat_backward(w.hat.data(), w.sums.data(), rows, p, w.dhat.data());
      map.backward(q + t0 * dk, rows, w.phi.data(), w.dhat.data(), dq + t0 * dk);
    }
  }
  if (!causal) {  // every query reads the final memory
    transpose(m.data(), p, dv, dv, w.mt.data(), p);
    for (std::size_t i0 = 0; i0 < nq; i0 += kChunk) query_grads(i0, std::min(kChunk, nq - i0));
  } else {
    // Reads after the last write (padded positions) read the final memory, later than every
    // write: their share of G comes first.
    for (std::size_t i0 = writes; i0 < nk; i0 += kChunk) {
      const std::size_t rows = std::min(kChunk, nk - i0);
      delta_rows(map, q + i0 * dk, rows, w.phi.data(), w.hat.data(), w.sums.data());
      transpose(w.hat.data(), rows, p, p, w.phi.data(), rows);
      kernels::gemm_tile(p, dv, rows, w.phi.data(), rows, g + i0 * dv, dv, w.gm.data(), dv, true);
    }
  }
  std::fill(dkey + writes * dk, dkey + nk * dk, 0.0f);
  std::fill(dval + writes * dv, dval + nk * dv, 0.0f);
  // Pass 2 and 3, one checkpoint interval at a time from the last: recompute the states before
  // each write, then go back through the writes.
  std::vector<float> qhat(causal ? every * p : 0), qphi(qhat.size()), qsums(causal ? every : 0);
  for (std::size_t interval = (writes + every - 1) / every; interval-- > 0;) {
    const std::size_t j0 = interval * every;
    const std::size_t rows = std::min(every, writes - j0);
    delta_rows(map, k + j0 * dk, rows, w.phi.data(), w.hat.data(), w.sums.data());
    std::copy_n(w.checkpoints.begin() + (j0 / every) * pv, pv, m.begin());
    for (std::size_t i = 0; i < rows; ++i) {
      std::copy(m.begin(), m.end(), w.states.begin() + i * pv);
      if (i + 1 < rows) delta_write(&w.hat[i * p], v + (j0 + i) * dv, beta, p, dv, m.data(), w.u.data());
    }
    if (causal)  // hat(q) of the interval, for the reads' share of G
      delta_rows(map, q + j0 * dk, rows, qphi.data(), qhat.data(), qsums.data());
    for (std::size_t i = rows; i-- > 0;) {
      const std::size_t j = j0 + i;
      const float* khat = &w.hat[i * p];
      const float* prev = &w.states[i * pv];  // M_{j-1}
      if (causal)  // the read at j follows the write at j
        for (std::size_t r = 0; r < p; ++r)
          for (std::size_t c = 0; c < dv; ++c) w.gm[r * dv + c] += qhat[i * p + r] * g[j * dv + c];
      vec_mat(khat, prev, p, dv, w.u.data());  // M_{j-1}^T hat(k_j)
      for (std::size_t c = 0; c < dv; ++c) w.u[c] = beta * (v[j * dv + c] - w.u[c]);
      vec_mat(khat, w.gm.data(), p, dv, w.du.data());  // G^T hat(k_j)
      float* dh = &w.dhat[i * p];
      for (std::size_t r = 0; r < p; ++r)
        dh[r] = dot(&w.gm[r * dv], w.u.data(), dv) - beta * dot(&prev[r * dv], w.du.data(), dv);
      for (std::size_t c = 0; c < dv; ++c) dval[j * dv + c] = beta * w.du[c];
      for (std::size_t r = 0; r < p; ++r)
        if (khat[r] != 0.0f)
          for (std::size_t c = 0; c < dv; ++c) w.gm[r * dv + c] -= beta * khat[r] * w.du[c];
    }
    hat_backward(w.hat.data(), w.sums.data(), rows, p, w.dhat.data());
    map.backward(k + j0 * dk, rows, w.phi.data(), w.dhat.data(), dkey + j0 * dk);
  }
}

}  // namespace

std::pair<std::string, std::string> linear_config_problem(const LinearConfig& c) {
  auto text = [](double x) { return std::to_string(x); };
  if (c.m < 1) return {"m=" + std::to_string(c.m), "favor needs at least 1 random feature"};
  if (c.nu < 1) return {"nu=" + std::to_string(c.nu), "dpfp needs nu >= 1"};
  if (!(c.beta > 0.0 && c.beta <= 1.0))  // also refuses NaN
    return {"beta=" + text(c.beta), "the delta rule needs 0 < beta <= 1"};
  if (!(c.eps >= 0.0 && std::isfinite(c.eps)))
    return {"eps=" + text(c.eps), "must be finite and >= 0"};
  if (c.seed < 0) return {"seed=" + std::to_string(c.seed), "must be >= 0"};
  return {"", ""};
}

LinearAttention::LinearAttention(const LinearConfig& config) : config_(config) {
  const auto [setting, why] = linear_config_problem(config);
  if (!setting.empty()) throw Error("linear: " + setting + ": " + why);
}

std::string LinearAttention::spec() const {
  return SpecWriter("linear")
      .add("feature", std::string(feature_name(config_.feature)))
      .add("m", config_.m)
      .add("nu", config_.nu)
      .add("rule", std::string(config_.rule == LinearRule::sum ? "sum" : "delta"))
      .add("beta", config_.beta)
      .add("eps", config_.eps)
      .add("seed", config_.seed)
      .str();
}

Support LinearAttention::support() const {
  Support s;
  s.backward = true;
  s.causal_cross = false;  // the causal forms pair query i with key i
  s.allowed = false;       // no per-pair weights exist to mask
  return s;
}

double LinearAttention::flops(const Dims& d, const Mask& mask) const {
  const double dphi = config_.feature == Feature::favor  ? double(config_.m)
                      : config_.feature == Feature::dpfp ? 2.0 * double(d.dk * config_.nu)
                                                         : double(d.dk);
  double keys = 0;  // keys that write into the memory, over the batch
  for (std::size_t b = 0; b < d.batch; ++b)
    keys += double(mask.valid_keys(b, d.nk));
  const double queries = double(d.batch * d.nq);
  const double dv = double(d.dv);
  const double write = config_.rule == LinearRule::sum ? 2 * dphi * (dv + 1) : 4 * dphi * dv;
  const double read = config_.rule == LinearRule::sum ? 2 * dphi * (dv + 1) : 2 * dphi * dv;
  const double favor = config_.feature == Feature::favor ? 2.0 * double(d.dk) * dphi : 0.0;
  return double(d.heads) * (keys * (write + favor) + queries * (read + favor));
}

FeatureMap LinearAttention::feature_map(std::size_t dk, double scale) const {
  if (config_.feature == Feature::dpfp && static_cast<std::size_t>(config_.nu) >= 2 * dk)
    throw Error(spec() + ": nu=" + std::to_string(config_.nu) + ": dpfp needs nu < 2·Dk = " +
                std::to_string(2 * dk) + " (Dk = " + std::to_string(dk) + ")");
  return FeatureMap(config_.feature, dk, static_cast<std::size_t>(config_.m),
                    static_cast<std::size_t>(config_.nu), static_cast<std::uint64_t>(config_.seed),
                    scale);
}

void LinearAttention::compute(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Mask& mask, const Dims& d, Tensor& out) const {
  const FeatureMap map = feature_map(d.dk, mask.softmax_scale(d.dk));
  const bool causal = mask.causal != Causal::none;
  const float eps = static_cast<float>(config_.eps), beta = static_cast<float>(config_.beta);
  const std::ptrdiff_t heads = static_cast<std::ptrdiff_t>(d.batch * d.heads);
#pragma omp parallel
  {
    Workspace w(map.dim(), d.dv);
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < heads; ++t) {
      const std::size_t bh = static_cast<std::size_t>(t), b = bh / d.heads;
      const std::size_t valid = mask.valid_keys(b, d.nk);
      const float* qh = q.data() + bh * d.nq * d.dk;
      const float* kh = k.data() + bh * d.nk * d.dk;
      const float* vh = v.data() + bh * d.nk * d.dv;
      float* oh = out.data() + bh * d.nq * d.dv;
      if (config_.rule == LinearRule::delta)
        delta_head(map, qh, kh, vh, d.nq, d.nk, valid, d.dk, beta, causal, oh, w);
      else if (causal)
        sum_causal(map, qh, kh, vh, d.nq, valid, d.dk, eps, oh, w);
      else
        sum_all(map, qh, kh, vh, d.nq, valid, d.dk, eps, oh, w);
    }
  }
}

void LinearAttention::compute_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Mask& mask, const Dims& d, const Tensor& out,
                                      const Tensor& d_out, const RowLogSumExp*,
                                      Gradients& grads) const {
  const FeatureMap map = feature_map(d.dk, mask.softmax_scale(d.dk));
  const bool causal = mask.causal != Causal::none;
  const float eps = static_cast<float>(config_.eps), beta = static_cast<float>(config_.beta);
  const std::ptrdiff_t heads = static_cast<std::ptrdiff_t>(d.batch * d.heads);
#pragma omp parallel
  {
    Workspace forward(map.dim(), d.dv);
    GradWorkspace w(map.dim(), d.dv);
    DeltaWorkspace delta;
    std::vector<float> den(causal ? d.nq : 0), stab(den.size());
#pragma omp for schedule(dynamic, 1)
    for (std::ptrdiff_t t = 0; t < heads; ++t) {
      const std::size_t bh = static_cast<std::size_t>(t), b = bh / d.heads;
      const std::size_t valid = mask.valid_keys(b, d.nk);
      const float* qh = q.data() + bh * d.nq * d.dk;
      const float* kh = k.data() + bh * d.nk * d.dk;
      const float* vh = v.data() + bh * d.nk * d.dv;
      const float* oh = out.data() + bh * d.nq * d.dv;
      const float* gh = d_out.data() + bh * d.nq * d.dv;
      float* dq = grads.dq.data() + bh * d.nq * d.dk;
      float* dk = grads.dk.data() + bh * d.nk * d.dk;
      float* dv = grads.dv.data() + bh * d.nk * d.dv;
      if (config_.rule == LinearRule::delta)
        delta_backward(map, qh, kh, vh, gh, d.nq, d.nk, valid, d.dk, d.dv, beta, causal, dq, dk,
                       dv, delta);
      else if (causal)
        sum_causal_backward(map, qh, kh, vh, oh, gh, d.nq, valid, d.dk, eps, dq, dk, dv,
                            den.data(), stab.data(), w);
      else
        sum_all_backward(map, qh, kh, vh, oh, gh, d.nq, d.nk, valid, d.dk, eps, dq, dk, dv,
                         forward, w);
    }
  }
}

LinearState LinearAttention::start(std::size_t batch, std::size_t heads, std::size_t dk,
                                   std::size_t dv, std::optional<double> scale) const {
  if (batch == 0 || heads == 0 || dk == 0 || dv == 0)
    throw Error(spec() + ": a recurrent state needs batch, heads, Dk and Dv >= 1");
  if (scale && !(*scale > 0.0 && std::isfinite(*scale)))
    throw Error(spec() + ": scale=" + std::to_string(*scale) + ": must be finite and > 0");
  return LinearState(config_, feature_map(dk, scale.value_or(1.0 / std::sqrt(double(dk)))), batch,
                     heads, dv);
}

LinearState::LinearState(const LinearConfig& config, FeatureMap map, std::size_t batch,
                         std::size_t heads, std::size_t dv)
    : config_(config), map_(std::move(map)), batch_(batch), heads_(heads), dv_(dv),
      memory_(batch * heads * map_.dim() * dv, 0.0f), z_(batch * heads * map_.dim(), 0.0f),
      c_(batch * heads, kNegInf), fq_(map_.dim()), fk_(map_.dim()) {}

Tensor LinearState::step(const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::size_t p = map_.dim(), dk = map_.dk();
  auto expect = [&](const Tensor& t, std::size_t dim, const char* what) {
    const auto& s = t.shape();
    if (s[0] != batch_ || s[1] != heads_ || s[2] != 1 || s[3] != dim)
      throw Error(std::string("LinearState::step: ") + what + " has shape " + shape_string(t) +
                  ", expected [" + std::to_string(batch_) + ", " + std::to_string(heads_) +
                  ", 1, " + std::to_string(dim) + "]");
  };
  expect(q, dk, "q");
  expect(k, dk, "k");
  expect(v, dv_, "v");
  Tensor out = Tensor::from_shape({batch_, heads_, 1, dv_});
  std::vector<float> tmp(dv_);
  for (std::size_t bh = 0; bh < batch_ * heads_; ++bh) {
    const float* qh = q.data() + bh * dk;
    const float* kh = k.data() + bh * dk;
    const float* vh = v.data() + bh * dv_;
    float* oh = out.data() + bh * dv_;
    float* mem = memory_.data() + bh * p * dv_;
    if (config_.rule == LinearRule::delta) {
      delta_features(map_, kh, 1, fk_.data());
      delta_write(fk_.data(), vh, static_cast<float>(config_.beta), p, dv_, mem, tmp.data());
      delta_features(map_, qh, 1, fq_.data());
      vec_mat(fq_.data(), mem, p, dv_, oh);
      continue;
    }
    float* z = z_.data() + bh * p;
    map_.map(kh, 1, fk_.data());
    if (map_.logarithmic()) {  // running key stabiliser, as in the causal batch form
      const float c_old = c_[bh], c_new = std::max(c_old, row_max(fk_.data(), p));
      if (c_old != kNegInf && c_new > c_old) {
        const float f = std::exp(c_old - c_new);
        for (std::size_t i = 0; i < p * dv_; ++i) mem[i] *= f;
        for (std::size_t i = 0; i < p; ++i) z[i] *= f;
      }
      exp_shifted(fk_.data(), p, c_new);
      c_[bh] = c_new;
    }
    for (std::size_t r = 0; r < p; ++r) z[r] += fk_[r];
    kernels::gemm_tile(p, dv_, 1, fk_.data(), 1, vh, dv_, mem, dv_, true);  // mem += phi_k v^T
    row_features(map_, qh, 1, fq_.data());
    vec_mat(fq_.data(), mem, p, dv_, oh);
    const float den = dot(fq_.data(), z, p);
    divide_rows(oh, 1, dv_, &den, static_cast<float>(config_.eps));
  }
  ++position_;
  return out;
}

std::unique_ptr<Attention> make_linear(Params& params) {
  LinearConfig c;
  const std::string feature = params.choice("feature", "elu1", {"elu1", "relu", "favor", "dpfp"});
  c.feature = feature == "relu"    ? Feature::relu
              : feature == "favor" ? Feature::favor
              : feature == "dpfp"  ? Feature::dpfp
                                   : Feature::elu1;
  c.m = params.integer("m", c.m);
  c.nu = params.integer("nu", c.nu);
  c.rule = params.choice("rule", "sum", {"sum", "delta"}) == "delta" ? LinearRule::delta
                                                                     : LinearRule::sum;
  c.beta = params.number("beta", c.beta);
  c.eps = params.number("eps", c.eps);
  c.seed = params.integer("seed", c.seed);
  const auto [setting, why] = linear_config_problem(c);  // fail() quotes the key=value itself
  if (!setting.empty()) params.fail(setting.substr(0, setting.find('=')), why);
  return std::make_unique<LinearAttention>(c);
}

namespace {
// Position 50 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("linear", make_linear, 50);
}  // namespace

}  // namespace attnlab
