#include "variants/delta_product.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "attnlab/decoder.hpp"
#include "attnlab/error.hpp"

namespace attnlab {
namespace {

// What a causal forward saves: the rows' Saved, their output and queries, which their backward
// takes. A training loop's next forward writes into the same storage: no fresh pages per call
// (at N = 16384 they cost as much as a third of the forward).
struct RowsSaved {
  Saved rows;
  Tensor out;
  Tensor queries;  // q spread over the rows (spread_rows)
};

// The queries spread over the rows: q_t at row (t + 1)·steps - 1, zeros elsewhere; into `wide`,
// whose storage is kept when its shape fits.
void spread_rows(TensorRef x, const Dims& d, std::size_t steps, std::size_t dim, Tensor& wide) {
  const std::array<std::size_t, 4> shape{d.batch, d.heads, d.nk, dim};
  if (wide.shape() != shape) wide = Tensor::from_shape(shape);
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t t = 0; t < d.nq; ++t) {
        float* token = &wide(b, h, t * steps, 0);
        std::fill_n(token, (steps - 1) * dim, 0.0f);
        std::copy_n(&x(b, h, t, 0), dim, token + (steps - 1) * dim);
      }
}

Tensor spread_rows(TensorRef x, const Dims& d, std::size_t steps, std::size_t dim) {
  Tensor wide;
  spread_rows(x, d, steps, dim, wide);
  return wide;
}

// The inverse: row (t + 1)·steps - 1 of `wide` into row t of `narrow`.
void gather_rows(const Tensor& wide, const Dims& d, std::size_t steps, std::size_t dim,
                 Tensor& narrow) {
  for (std::size_t b = 0; b < d.batch; ++b)
    for (std::size_t h = 0; h < d.heads; ++h)
      for (std::size_t t = 0; t < d.nq; ++t)
        std::copy_n(&wide(b, h, (t + 1) * steps - 1, 0), dim, &narrow(b, h, t, 0));
}

// The rows' causal mask: row r sees rows r' <= r (the alignment the rows themselves have).
Mask rows_mask(const Mask& mask) {
  Mask m = mask;
  m.causal = Causal::top_left;
  return m;
}

// Rows [r0, r1) of every (item, head) of x.
Tensor row_range(TensorRef x, std::size_t r0, std::size_t r1) {
  const auto& s = x.shape();
  Tensor part = Tensor::from_shape({s[0], s[1], r1 - r0, s[3]});
  for (std::size_t b = 0; b < s[0]; ++b)
    for (std::size_t h = 0; h < s[1]; ++h)
      std::copy_n(&x(b, h, r0, 0), (r1 - r0) * s[3], &part(b, h, 0, 0));
  return part;
}

// in's g and beta at rows [r0, r1), held in `g` and `beta` (the decoder refuses its other
// inputs before they get here).
TokenInputs token_rows(const TokenInputs& in, std::size_t r0, std::size_t r1, TokenTensor& g,
                       TokenTensor& beta) {
  TokenInputs part;
  for (const auto& [from, into, held] :
       {std::tuple{&in.log_decay, &part.log_decay, &g}, std::tuple{&in.beta, &part.beta, &beta}}) {
    if (!*from) continue;
    const TokenRef& t = **from;
    *held = TokenTensor::from_shape({t.shape()[0], t.shape()[1], r1 - r0});
    for (std::size_t b = 0; b < t.shape()[0]; ++b)
      for (std::size_t h = 0; h < t.shape()[1]; ++h)
        for (std::size_t r = r0; r < r1; ++r) (*held)(b, h, r - r0) = t(b, h, r);
    *into = TokenRef(*held);
  }
  return part;
}

// The decoder: gated-delta's over the steps' rows, as the causal forward runs it. Token t's
// first steps - 1 rows update the state without outputs, q_t reads the state after its last.
class DeltaProductDecoder final : public TokenDecoder {
 public:
  DeltaProductDecoder(const DeltaProductAttention& variant, const DecodeConfig& config)
      : TokenDecoder(variant, config, static_cast<std::size_t>(variant.steps())),
        steps_(static_cast<std::size_t>(variant.steps())),
        rows_(variant.rows().start_decoding(rows_config(config_, steps_))) {}

  std::size_t bytes() const override { return rows_->bytes(); }

 protected:
  void do_prefill(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in,
                  const std::vector<std::size_t>& lengths, Tensor& out) override {
    std::vector<std::int64_t> row_lengths;
    for (const std::size_t n : lengths) row_lengths.push_back(std::int64_t(steps_ * n));
    if (steps_ == 1) {  // gated-delta's decoder as it is
      out = rows_->prefill(q, k, v, in, row_lengths);
      return;
    }
    const DecodeConfig& c = config_;
    const std::size_t n = q.shape()[2];
    const Dims d{c.batch, c.heads, n, steps_ * n, c.dk, c.dv, c.kv()};
    const Tensor wide = rows_->prefill(spread_rows(q, d, steps_, c.dk), k, v, in, row_lengths);
    gather_rows(wide, d, steps_, c.dv, out);
  }

  void do_extend(TensorRef, TensorRef k, TensorRef v, const TokenInputs& in) override {
    rows_->extend(k, v, in);
  }

  void do_step(TensorRef q, TensorRef k, TensorRef v, const TokenInputs& in, Tensor& out) override {
    if (steps_ == 1) {
      out = rows_->step(q, k, v, in);
      return;
    }
    const std::size_t last = steps_ - 1;
    TokenTensor g, beta;
    rows_->extend(row_range(k, 0, last), row_range(v, 0, last), token_rows(in, 0, last, g, beta));
    out = rows_->step(q, row_range(k, last, steps_), row_range(v, last, steps_),
                      token_rows(in, last, steps_, g, beta));
  }

 private:
  // The rows' decoder holds steps rows per token: its cap, if any, in rows.
  static DecodeConfig rows_config(const DecodeConfig& config, std::size_t steps) {
    DecodeConfig c = config;
    c.max_tokens *= steps;
    return c;
  }

  std::size_t steps_;
  std::unique_ptr<TokenDecoder> rows_;  // gated-delta's, over the rows
};

}  // namespace

DeltaProductAttention::DeltaProductAttention(std::int64_t steps, double beta)
    : steps_(steps), rows_(beta) {
  if (steps < 1)
    throw Error("delta-product: steps=" + std::to_string(steps) + ": expected an integer >= 1");
}

std::string DeltaProductAttention::spec() const {
  return SpecWriter("delta-product").add("steps", steps_).add("beta", rows_.rule().beta).str();
}

Support DeltaProductAttention::support() const {
  Support s = rows_.support();
  if (steps_ == 1) return s;  // gated-delta itself
  s.causal_cross = true;      // Nk = steps · Nq: query t reads the state after its own rows
  s.documents = false;
  s.rows_per_token = std::size_t(steps_);
  return s;
}

std::string DeltaProductAttention::why_unsupported(const std::string& feature) const {
  if (feature == "packed documents")
    return "each document's rows would need their own spreading of the queries (not "
           "implemented)";
  if (feature == "boolean masks") return "a recurrent memory has no per-pair weights to mask";
  return {};
}

double DeltaProductAttention::flops(const Dims& d, const Mask& mask) const {
  return rows_.flops(d, mask);
}

std::unique_ptr<TokenDecoder> DeltaProductAttention::start_decoding(
    const DecodeConfig& config) const {
  return std::make_unique<DeltaProductDecoder>(*this, config);
}

void DeltaProductAttention::check_rows(const Dims& d, bool causal) const {
  if (steps_ == 1) return;  // gated-delta's rows: its own checks
  const auto steps = static_cast<std::size_t>(steps_);
  if (causal && d.nk != steps * d.nq)
    throw Error(spec() + ": k and v have Nk = " + std::to_string(d.nk) +
                " rows, expected steps · Nq = " + std::to_string(steps) + " · " +
                std::to_string(d.nq) + " = " + std::to_string(steps * d.nq) +
                " (each token writes `steps` rows)");
  if (d.nk % steps != 0)
    throw Error(spec() + ": k and v have Nk = " + std::to_string(d.nk) +
                " rows, expected a multiple of steps = " + std::to_string(steps) +
                " (each token writes `steps` rows)");
}

void DeltaProductAttention::compute(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                    const TokenInputs& in, const Dims& d, Tensor& out,
                                    Saved* saved) const {
  check_rows(d, mask.causal != Causal::none);
  // One step per token is gated-delta (either causal alignment); without a causal mask every
  // query reads the last state: the rows as they are.
  if (steps_ == 1 || mask.causal == Causal::none) {
    if (saved)
      rows_.forward(q, k, v, mask, in, out, *saved);
    else
      rows_.forward(q, k, v, mask, in, out);
    return;
  }
  const auto steps = static_cast<std::size_t>(steps_);
  RowsSaved kept;
  if (auto* last = saved ? std::any_cast<RowsSaved>(&saved->state) : nullptr)
    kept = std::move(*last);
  spread_rows(q, d, steps, d.dk, kept.queries);
  rows_.forward(kept.queries, k, v, rows_mask(mask), in, kept.out, kept.rows);
  gather_rows(kept.out, d, steps, d.dv, out);
  if (!saved) return;
  saved->lse = RowLogSumExp();
  saved->final_state = std::move(kept.rows.final_state);
  kept.rows.final_state = RecurrentState();
  saved->state = std::move(kept);
}

void DeltaProductAttention::compute_backward(TensorRef q, TensorRef k, TensorRef v,
                                             const Mask& mask, const TokenInputs& in, const Dims& d,
                                             TensorRef out, TensorRef d_out, const Saved& saved,
                                             AllGradients& g) const {
  check_rows(d, mask.causal != Causal::none);
  if (steps_ == 1 || mask.causal == Causal::none) {
    rows_.backward(q, k, v, mask, in, out, d_out, saved, g);
    return;
  }
  const auto steps = static_cast<std::size_t>(steps_);
  const Mask m = rows_mask(mask);
  RowsSaved fresh;
  const auto* kept = std::any_cast<RowsSaved>(&saved.state);
  if (!kept || kept->out.shape() != std::array<std::size_t, 4>{d.batch, d.heads, d.nk, d.dv} ||
      kept->queries.shape() != std::array<std::size_t, 4>{d.batch, d.heads, d.nk, d.dk}) {
    spread_rows(q, d, steps, d.dk, fresh.queries);
    rows_.forward(fresh.queries, k, v, m, in, fresh.out, fresh.rows);  // recomputed
    kept = &fresh;
  }
  AllGradients rows;
  rows_.backward(kept->queries, k, v, m, in, kept->out, spread_rows(d_out, d, steps, d.dv),
                 kept->rows, rows);
  gather_rows(rows.qkv.dq, d, steps, d.dk, g.qkv.dq);
  g.qkv.dk = std::move(rows.qkv.dk);
  g.qkv.dv = std::move(rows.qkv.dv);
  g.d_log_decay = std::move(rows.d_log_decay);
  g.d_channel_log_decay = std::move(rows.d_channel_log_decay);
  g.d_beta = std::move(rows.d_beta);
  g.d_initial_state = std::move(rows.d_initial_state);
}

std::unique_ptr<Attention> make_delta_product(Params& params) {
  const std::int64_t steps = params.integer("steps", 1);
  const double beta = params.number("beta", 1.0);
  if (steps < 1) params.fail("steps", "expected an integer >= 1");
  if (!(beta >= 0.0 && beta <= 1.0)) params.fail("beta", "must be in [0, 1]");
  return std::make_unique<DeltaProductAttention>(steps, beta);
}

namespace {
// Position 97 in attention_names() and the --help listing: after kda.
const AttentionRegistrar kRegistrar("delta-product", make_delta_product, 97);
}  // namespace

}  // namespace attnlab
