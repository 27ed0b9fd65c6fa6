#include "variants/recurrence_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "attnlab/error.hpp"
#include "variants/delta_product.hpp"

namespace attnlab {
namespace {

double max_of(const std::vector<double>& x) {
  return *std::max_element(x.begin(), x.end());
}

// Where each query's output goes: slot[i] = its row in the output, or -1 when not asked for.
std::vector<std::ptrdiff_t> output_slots(std::size_t nq, const std::vector<std::size_t>& rows) {
  std::vector<std::ptrdiff_t> slot(nq, rows.empty() ? 0 : -1);
  if (rows.empty()) {
    for (std::size_t i = 0; i < nq; ++i) slot[i] = std::ptrdiff_t(i);
    return slot;
  }
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r] >= nq)
      throw Error("reference: row " + std::to_string(rows[r]) + " is outside the " +
                  std::to_string(nq) + " queries");
    slot[rows[r]] = std::ptrdiff_t(r);
  }
  return slot;
}

// Runs f(b, h) for every (item, head) slice, in parallel; the first exception is rethrown.
template <class F>
void per_slice(std::size_t batch, std::size_t heads, F&& f) {
  const auto slices = static_cast<std::ptrdiff_t>(batch * heads);
  std::string failure;
#pragma omp parallel for schedule(dynamic, 1)
  for (std::ptrdiff_t s = 0; s < slices; ++s) {
    try {
      f(static_cast<std::size_t>(s) / heads, static_cast<std::size_t>(s) % heads);
    } catch (const std::exception& e) {
#pragma omp critical
      if (failure.empty()) failure = e.what();
    }
  }
  if (!failure.empty()) throw Error(failure);
}

Tensor64 to64(TensorRef t) {
  Tensor64 out = Tensor64::from_shape(t.shape());
  std::copy_n(t.data(), out.size(), out.data());
  return out;
}

TokenTensor64 token64(const TokenRef& t) {
  TokenTensor64 out = TokenTensor64::from_shape(t.shape());
  std::copy_n(t.data(), out.size(), out.data());
  return out;
}

State64 state64(const StateRef& s) {
  State64 out;
  const auto& m = s.memory.shape();
  out.memory = xt::xarray<double>::from_shape({m[0], m[1], m[2], m[3]});
  std::copy_n(s.memory.data(), s.memory.size(), out.memory.begin());
  if (s.key_sum) out.key_sum = token64(*s.key_sum);
  return out;
}

}  // namespace

xt::xtensor<float, 2> feature_projection(const LinearConfig& c, std::size_t dk) {
  if (c.feature == Feature::favor) return favor_projection(c.m, dk, c.seed);
  if (c.feature == Feature::taylor && c.taylor_dim > 0 && std::size_t(c.taylor_dim) < dk)
    return taylor_projection(c.taylor_dim, dk, c.seed);
  return xt::xtensor<float, 2>();
}

std::vector<double> phi64(const LinearConfig& c, const xt::xtensor<float, 2>& w, const double* x,
                          std::size_t dk, double scale) {
  std::vector<double> out;
  switch (c.feature) {
    case Feature::elu1:
      for (std::size_t a = 0; a < dk; ++a) out.push_back(x[a] > 0 ? x[a] + 1.0 : std::exp(x[a]));
      break;
    case Feature::relu:
      for (std::size_t a = 0; a < dk; ++a) out.push_back(std::max(x[a], 0.0));
      break;
    case Feature::favor: {
      double sq = 0;
      for (std::size_t a = 0; a < dk; ++a) sq += x[a] * x[a] * scale;
      for (std::size_t r = 0; r < w.shape()[0]; ++r) {
        double proj = 0;
        for (std::size_t a = 0; a < dk; ++a) proj += double(w(r, a)) * x[a] * std::sqrt(scale);
        out.push_back(proj - sq / 2 - 0.5 * std::log(double(w.shape()[0])));
      }
      break;
    }
    case Feature::taylor: {  // w: the projection P [d' x Dk], or empty for none (d' = Dk)
      const std::size_t m = w.size() ? w.shape()[0] : dk;
      std::vector<double> xp(m);
      for (std::size_t a = 0; a < m; ++a) {
        double proj = 0;
        if (w.size())
          for (std::size_t c2 = 0; c2 < dk; ++c2) proj += double(w(a, c2)) * x[c2];
        else
          proj = x[a];
        xp[a] = proj / std::pow(double(m), 0.25);
      }
      out.push_back(1.0);
      for (std::size_t a = 0; a < m; ++a) out.push_back(xp[a]);
      for (std::size_t a = 0; a < m; ++a)
        for (std::size_t b = 0; b < m; ++b) out.push_back(xp[a] * xp[b] / std::sqrt(2.0));
      break;
    }
    case Feature::dpfp: {
      std::vector<double> xp(2 * dk);
      for (std::size_t a = 0; a < dk; ++a) {
        xp[a] = std::max(x[a], 0.0);
        xp[dk + a] = std::max(-x[a], 0.0);
      }
      for (std::size_t j = 1; j <= std::size_t(c.nu); ++j)
        for (std::size_t a = 0; a < 2 * dk; ++a)
          out.push_back(xp[a] * xp[(a + 2 * dk - j) % (2 * dk)]);
      break;
    }
  }
  return out;
}

std::vector<double> row_phi(const LinearConfig& c, std::vector<double> f, bool normalise) {
  if (c.feature == Feature::favor) {
    const double top = max_of(f);
    for (double& x : f) x = std::exp(x - top);
  }
  if (normalise) {
    double total = 0;
    for (double x : f) total += x;
    if (total > 0)
      for (double& x : f) x /= total;
  }
  return f;
}

Tensor64 linear_reference(const LinearConfig& c, const Tensor64& q, const Tensor64& k,
                          const Tensor64& v, const Mask& mask, const State64* initial,
                          State64* final, const std::vector<std::size_t>& rows) {
  const Dims d{q.shape()[0], q.shape()[1], q.shape()[2], k.shape()[2],
               q.shape()[3], v.shape()[3], k.shape()[1]};
  const double scale = mask.softmax_scale(d.dk);
  const xt::xtensor<float, 2> w = feature_projection(c, d.dk);
  const std::vector<std::ptrdiff_t> slot = output_slots(d.nq, rows);
  const std::size_t nrows = rows.empty() ? d.nq : rows.size();
  Tensor64 out = xt::zeros<double>({d.batch, d.heads, nrows, d.dv});
  const bool causal = mask.causal != Causal::none;
  const std::size_t p = phi64(c, w, std::vector<double>(d.dk).data(), d.dk, scale).size();
  if (final) {
    final->memory = xt::zeros<double>({d.batch, d.heads, p, d.dv});
    final->key_sum = c.rule == LinearRule::sum
                         ? xt::xarray<double>(xt::zeros<double>({d.batch, d.heads, p}))
                         : xt::xarray<double>();
  }
  per_slice(d.batch, d.heads, [&](std::size_t b, std::size_t h) {
    const std::size_t kvh = d.kv_head(h);  // the key and value head query head h reads
    std::vector<std::vector<double>> fk, fq;
    for (std::size_t j = 0; j < d.nk; ++j) fk.push_back(phi64(c, w, &k(b, kvh, j, 0), d.dk, scale));
    for (std::size_t i = 0; i < d.nq; ++i) fq.push_back(phi64(c, w, &q(b, h, i, 0), d.dk, scale));
    const std::size_t valid = mask.valid_keys(b, d.nk);
    if (c.rule == LinearRule::sum) {
      for (std::size_t i = 0; i < d.nq; ++i) {
        if (slot[i] < 0) continue;
        const std::size_t n = mask.visible_keys(b, i, d);
        const std::vector<double> phq = row_phi(c, fq[i], false);
        double ck = -std::numeric_limits<double>::infinity();  // favor: max over visible keys
        if (c.feature == Feature::favor)
          for (std::size_t j = 0; j < n; ++j) ck = std::max(ck, max_of(fk[j]));
        std::vector<double> num(d.dv, 0.0);
        double den = 0;
        for (std::size_t j = 0; j < n; ++j) {
          double kij = 0;
          for (std::size_t r = 0; r < p; ++r)
            kij += phq[r] * (c.feature == Feature::favor ? std::exp(fk[j][r] - ck) : fk[j][r]);
          for (std::size_t col = 0; col < d.dv; ++col) num[col] += kij * v(b, kvh, j, col);
          den += kij;
        }
        if (initial)
          for (std::size_t r = 0; r < p; ++r) {
            for (std::size_t col = 0; col < d.dv; ++col)
              num[col] += phq[r] * initial->memory(b, h, r, col);
            den += phq[r] * initial->key_sum(b, h, r);
          }
        for (std::size_t col = 0; col < d.dv; ++col)
          out(b, h, std::size_t(slot[i]), col) = den > 0 ? num[col] / (den + c.eps) : 0.0;
      }
      if (final)  // favor's is relative to its stabiliser: not compared
        for (std::size_t r = 0; r < p; ++r) {
          double z = initial ? initial->key_sum(b, h, r) : 0.0;
          for (std::size_t j = 0; j < valid; ++j) z += fk[j][r];
          final->key_sum(b, h, r) = z;
          for (std::size_t col = 0; col < d.dv; ++col) {
            double m = initial ? initial->memory(b, h, r, col) : 0.0;
            for (std::size_t j = 0; j < valid; ++j) m += fk[j][r] * v(b, kvh, j, col);
            final->memory(b, h, r, col) = m;
          }
        }
      return;
    }
    std::vector<double> mem(d.dv * p, 0.0);  // W [Dv x P]
    if (initial)
      for (std::size_t r = 0; r < p; ++r)
        for (std::size_t col = 0; col < d.dv; ++col)
          mem[col * p + r] = initial->memory(b, h, r, col);
    auto write = [&](std::size_t j) {
      const std::vector<double> phk = row_phi(c, fk[j], true);
      for (std::size_t col = 0; col < d.dv; ++col) {
        double vbar = 0;
        for (std::size_t r = 0; r < p; ++r) vbar += mem[col * p + r] * phk[r];
        const double delta = c.beta * (v(b, kvh, j, col) - vbar);
        for (std::size_t r = 0; r < p; ++r) mem[col * p + r] += delta * phk[r];
      }
    };
    auto read = [&](std::size_t i) {
      if (slot[i] < 0) return;
      const std::vector<double> phq = row_phi(c, fq[i], true);
      for (std::size_t col = 0; col < d.dv; ++col) {
        double y = 0;
        for (std::size_t r = 0; r < p; ++r) y += mem[col * p + r] * phq[r];
        out(b, h, std::size_t(slot[i]), col) = y;
      }
    };
    if (causal) {
      for (std::size_t i = 0; i < d.nq; ++i) {
        if (i < valid) write(i);
        read(i);
      }
    } else {
      for (std::size_t j = 0; j < valid; ++j) write(j);
      for (std::size_t i = 0; i < d.nq; ++i) read(i);
    }
    if (final)  // after the causal loop's padded tokens too: they do not write
      for (std::size_t r = 0; r < p; ++r)
        for (std::size_t col = 0; col < d.dv; ++col) final->memory(b, h, r, col) = mem[col * p + r];
  });
  return out;
}

Tensor64 ScanRecurrence::operator()(const Tensor64& q, const Tensor64& k, const Tensor64& v,
                                    const TokenTensor64* g, const TokenTensor64* beta,
                                    const std::vector<std::size_t>& rows,
                                    const xt::xarray<double>* initial, xt::xarray<double>* final,
                                    const Tensor64* channel_g) const {
  const std::size_t B = q.shape()[0], H = q.shape()[1], nq = q.shape()[2], nk = k.shape()[2];
  const std::size_t dk = q.shape()[3], dv = v.shape()[3];
  const std::size_t group = H / k.shape()[1];  // query heads per key and value head
  const std::vector<std::ptrdiff_t> slot = output_slots(nq, rows);
  const std::size_t nrows = rows.empty() ? nq : rows.size();
  Tensor64 out = xt::zeros<double>({B, H, nrows, dv});
  if (final) *final = xt::zeros<double>({B, H, dk, dv});
  // Row i of x [.., .., N, dk] times s, divided by its norm when normalising.
  auto row = [&](const Tensor64& x, std::size_t b, std::size_t h, std::size_t i, double s,
                 std::vector<double>& r) {
    const double* xi = &x(b, h, i, 0);
    double sq = 0;
    for (std::size_t c = 0; c < dk; ++c) sq += xi[c] * xi[c];
    const double f = s / (normalise ? std::sqrt(sq + 1e-6) : 1.0);
    for (std::size_t c = 0; c < dk; ++c) r[c] = f * xi[c];
  };
  per_slice(B, H, [&](std::size_t b, std::size_t h) {
    std::vector<double> s(dk * dv, 0.0), kt(dk), qi(dk), u(dv);  // S [Dk x Dv], row-major
    if (initial)
      for (std::size_t r = 0; r < dk; ++r)
        for (std::size_t c = 0; c < dv; ++c) s[r * dv + c] = (*initial)(b, h, r, c);
    // out_i = S^T q_i; the loops run along S's rows, so the inner one vectorises.
    auto read = [&](std::size_t i) {
      if (slot[i] < 0) return;
      row(q, b, h, i, scale, qi);
      double* o = &out(b, h, std::size_t(slot[i]), 0);
      for (std::size_t r = 0; r < dk; ++r)
        for (std::size_t c = 0; c < dv; ++c) o[c] += s[r * dv + c] * qi[r];
    };
    const std::size_t len = lengths.empty() ? nk : std::size_t(lengths[b]);
    for (std::size_t t = 0; t < nk; ++t) {
      if (t < len) {
        if (channel_g) {  // row r of S decays by its key channel's exp(g)
          for (std::size_t r = 0; r < dk; ++r) {
            const double a = std::exp((*channel_g)(b, h, t, r));
            for (std::size_t c = 0; c < dv; ++c) s[r * dv + c] *= a;
          }
        } else {
          const double a = std::exp(g ? (*g)(b, h, t) : head_g.empty() ? 0.0 : head_g[h]);
          if (a != 1.0)
            for (double& e : s) e *= a;
        }
        row(k, b, h / group, t, 1.0, kt);
        const double* vt = &v(b, h / group, t, 0);
        std::copy_n(vt, dv, u.begin());
        if (delta) {  // u = beta (v - S^T k), with S already decayed
          for (std::size_t r = 0; r < dk; ++r)
            for (std::size_t c = 0; c < dv; ++c) u[c] -= s[r * dv + c] * kt[r];
          const double bt = beta ? (*beta)(b, h, t) : beta_value;
          for (double& x : u) x *= bt;
        }
        for (std::size_t r = 0; r < dk; ++r)
          for (std::size_t c = 0; c < dv; ++c) s[r * dv + c] += kt[r] * u[c];
      }
      if (causal) read(t);
    }
    if (!causal)
      for (std::size_t i = 0; i < nq; ++i) read(i);
    if (final)
      for (std::size_t r = 0; r < dk; ++r)
        for (std::size_t c = 0; c < dv; ++c) (*final)(b, h, r, c) = s[r * dv + c];
  });
  return out;
}

ScanRecurrence scan_recurrence(const ScanAttention& a, const Mask& mask, std::size_t dk,
                               std::size_t heads) {
  ScanRecurrence r;
  r.delta = a.rule().delta;
  r.normalise = a.rule().normalise;
  r.beta_value = a.rule().beta;
  r.causal = mask.causal != Causal::none;
  r.scale = mask.softmax_scale(dk);
  r.lengths = mask.key_lengths;
  for (std::size_t h = 0; h < heads; ++h) r.head_g.push_back(a.head_log_decay(h, heads));
  return r;
}

namespace {

// Rows [first, last) of axis 2 of x [1, H, N, D] (a document's tokens).
Tensor token_rows(TensorRef x, std::size_t first, std::size_t last) {
  Tensor out = Tensor::from_shape({1, x.shape(1), last - first, x.shape(3)});
  for (std::size_t h = 0; h < x.shape(1); ++h)
    std::copy_n(&x(0, h, first, 0), (last - first) * x.shape(3), &out(0, h, 0, 0));
  return out;
}

TokenTensor token_slice(const TokenRef& t, std::size_t first, std::size_t last) {
  TokenTensor out = TokenTensor::from_shape({1, t.shape()[1], last - first});
  for (std::size_t h = 0; h < t.shape()[1]; ++h)
    for (std::size_t j = first; j < last; ++j) out(0, h, j - first) = t(0, h, j);
  return out;
}

}  // namespace

Tensor64 own_reference(const Attention& attention, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Mask& mask, const TokenInputs& in,
                       const std::vector<std::size_t>& rows) {
  if (mask.has_documents()) {
    // Each document is a sequence of its own (a batch of one): its definition on its tokens,
    // from a zero state, its query rows placed where `rows` asks for them.
    if (mask.has_key_lengths() || in.initial_state)
      throw Unsupported(attention.name(),
                        "key padding or an initial state with packed documents in its float64 "
                        "reference");
    Mask one = mask;
    one.documents.clear();
    one.key_documents.clear();
    const std::size_t heads = q.shape(1), dv = v.shape(3);
    const std::size_t count = rows.empty() ? q.shape(2) : rows.size();
    Tensor64 out = Tensor64::from_shape({1, heads, count, dv});
    for (std::size_t doc = 0; doc + 1 < mask.documents.size(); ++doc) {
      const auto [q0, q1] = mask.document_queries(doc);
      const auto [k0, k1] = mask.document_keys(doc);
      std::vector<std::size_t> local, slots;  // rows of this document, and where they go
      for (std::size_t r = 0; r < count; ++r) {
        const std::size_t i = rows.empty() ? r : rows[r];
        if (i >= q0 && i < q1) local.push_back(i - q0), slots.push_back(r);
      }
      if (local.empty()) continue;
      TokenTensor g, beta;
      if (in.log_decay) g = token_slice(*in.log_decay, k0, k1);
      if (in.beta) beta = token_slice(*in.beta, k0, k1);
      TokenInputs part_in = TokenInputs::of(in.log_decay ? &g : nullptr, in.beta ? &beta : nullptr);
      Tensor channel_g;
      if (in.channel_log_decay) {
        channel_g = token_rows(*in.channel_log_decay, k0, k1);
        part_in.channel_log_decay = channel_g;
      }
      const Tensor64 part = own_reference(attention, token_rows(q, q0, q1), token_rows(k, k0, k1),
                                          token_rows(v, k0, k1), one, part_in, local);
      for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t r = 0; r < local.size(); ++r)
          std::copy_n(&part(0, h, r, 0), dv, &out(0, h, slots[r], 0));
    }
    return out;
  }
  // The softmax engine's modifiers are not in these definitions: refused, never ignored.
  if (mask.has_modifiers() || in.bias || in.sinks || in.alibi_slopes)
    throw Unsupported(attention.name(),
                      "a window, prefix, custom mask, softcap, bias, sinks or ALiBi in its "
                      "float64 reference (the softmax engine's modifiers)");
  const State64 initial = in.initial_state ? state64(*in.initial_state) : State64();
  const State64* from = in.initial_state ? &initial : nullptr;
  if (const auto* linear = dynamic_cast<const LinearAttention*>(&attention))
    return linear_reference(linear->config(), to64(q), to64(k), to64(v), mask, from, nullptr, rows);
  const TokenTensor64 g = in.log_decay ? token64(*in.log_decay) : TokenTensor64();
  const TokenTensor64 beta = in.beta ? token64(*in.beta) : TokenTensor64();
  const Tensor64 channel_g = in.channel_log_decay ? to64(*in.channel_log_decay) : Tensor64();
  const auto scan_run = [&](const ScanRecurrence& r, const Tensor64& queries,
                            const std::vector<std::size_t>& at) {
    return r(queries, to64(k), to64(v), in.log_decay ? &g : nullptr, in.beta ? &beta : nullptr, at,
             from ? &from->memory : nullptr, nullptr, in.channel_log_decay ? &channel_g : nullptr);
  };
  if (const auto* scan = dynamic_cast<const ScanAttention*>(&attention))
    return scan_run(scan_recurrence(*scan, mask, q.shape()[3], q.shape()[1]), to64(q), rows);
  if (const auto* product = dynamic_cast<const DeltaProductAttention*>(&attention)) {
    // The delta rule over the steps' rows (k, v, g, beta: `steps` rows per token); causal:
    // query t reads the state after its token's last row, (t + 1)·steps - 1.
    const auto steps = static_cast<std::size_t>(product->steps());
    const bool causal = mask.causal != Causal::none;
    Mask over_rows = mask;
    if (causal) over_rows.causal = Causal::top_left;
    const ScanRecurrence r =
        scan_recurrence(product->rows(), over_rows, q.shape()[3], q.shape()[1]);
    if (steps == 1 || !causal) return scan_run(r, to64(q), rows);
    Tensor64 spread = xt::zeros<double>({q.shape(0), q.shape(1), k.shape(2), q.shape(3)});
    for (std::size_t b = 0; b < q.shape(0); ++b)
      for (std::size_t h = 0; h < q.shape(1); ++h)
        for (std::size_t i = 0; i < q.shape(2); ++i)
          for (std::size_t c = 0; c < q.shape(3); ++c)
            spread(b, h, (i + 1) * steps - 1, c) = q(b, h, i, c);
    std::vector<std::size_t> last_rows;
    for (std::size_t n = 0; n < (rows.empty() ? q.shape(2) : rows.size()); ++n)
      last_rows.push_back(((rows.empty() ? n : rows[n]) + 1) * steps - 1);
    return scan_run(r, spread, last_rows);
  }
  throw Unsupported(attention.name(),
                    "a float64 reference of its own (variants/recurrence_reference.hpp has "
                    "linear attention, the scan engine's clients and delta-product)");
}

}  // namespace attnlab
