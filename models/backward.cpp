#include "models/backward.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "attnlab/error.hpp"

namespace attnlab::models {
namespace {

// The backward of y = x W^T + b over `rows` rows: dw (+)= dy^T x, db (+)= column sums of dy,
// and, when dx is given, dx = dy W. Leading dimensions as in affine().
void affine_backward(const float* x, std::size_t rows, std::size_t in, std::size_t ldx,
                     const float* w, std::size_t out, std::size_t ldw, const float* dy,
                     std::size_t lddy, float* dx, std::size_t lddx, float* dw, float* db,
                     bool accumulate) {
  if (rows == 0) return;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(out), int(in), int(rows), 1.0f, dy,
              int(lddy), x, int(ldx), accumulate ? 1.0f : 0.0f, dw, int(ldw));
  if (!accumulate) std::fill_n(db, out, 0.0f);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < out; ++c) db[c] += dy[r * lddy + c];
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(in), int(out), 1.0f, dy,
                int(lddy), w, int(ldw), 0.0f, dx, int(lddx));
}

// y += x, element-wise.
void add_into(Activations& y, const Activations& x) {
  add(y.data(), x.data(), y.data(), y.size());
}

void require_shape(const Activations& got, std::size_t batch, std::size_t n, std::size_t features,
                   const char* what) {
  if (got.shape()[0] != batch || got.shape()[1] != n || got.shape()[2] != features)
    throw Error(std::string(what) + ": gradient " + shape_text(got) + ", expected [" +
                std::to_string(batch) + ", " + std::to_string(n) + ", " + std::to_string(features) +
                "] (the output's shape)");
}

// One residual sublayer forward (x + f(LN(x)) pre-LN, LN(x + f(x)) post-LN, without what is
// switched off), keeping what its LayerNorm saw; f returns its output, a buffer of its own trace.
template <class F>
const Activations& sublayer(const LayerConfig& c, const Activations& x,
                            const std::optional<LayerNorm>& norm, SublayerTrace& t, F&& f) {
  const bool pre = c.pre_ln && norm, post = !c.pre_ln && norm;
  if (pre) {
    t.norm_input = x;  // a copy into the same storage each step
    norm->forward(x, t.normed);
  }
  const Activations& y = f(pre ? t.normed : x);
  if (!c.skip && !post) return y;
  Activations& sum = post ? t.norm_input : t.output;  // post-LN: the sum is what the norm sees
  if (c.skip) {
    shape_buffer(sum, y.shape());
    add(y.data(), x.data(), sum.data(), y.size());
  } else {
    sum = y;
  }
  if (!post) return sum;
  norm->forward(sum, t.output);
  return t.output;
}

// Its backward: back(d) is the gradient of f's input given d = the gradient of f's output, a
// buffer of f's trace that this may change.
template <class B>
Activations& sublayer_backward(const LayerConfig& c, const Activations& dy,
                               const std::optional<LayerNorm>& norm,
                               std::optional<LayerNorm>& norm_grad, SublayerTrace& t, B&& back) {
  const bool pre = c.pre_ln && norm, post = !c.pre_ln && norm;
  if (post) backward(*norm, t.norm_input, dy, *norm_grad, t.d_norm);
  const Activations& dz = post ? t.d_norm : dy;
  Activations& branch = back(dz);
  if (pre) backward(*norm, t.norm_input, branch, *norm_grad, t.d_input);
  Activations& dx = pre ? t.d_input : branch;
  if (c.skip) add_into(dx, dz);
  return dx;
}

}  // namespace

EncoderModel zero_like(const EncoderModel& model) {
  EncoderModel grad = model;
  for (const ParameterRef& p : grad.parameters()) fill_constant(p, 0.0f);
  return grad;
}

Activations backward(const Linear& layer, const Activations& x, const Activations& dy,
                     Linear& grad) {
  Activations dx;
  backward(layer, x, dy, grad, dx);
  return dx;
}

void backward(const Linear& layer, const Activations& x, const Activations& dy, Linear& grad,
              Activations& dx) {
  const std::size_t in = layer.weight.shape()[1], out = layer.weight.shape()[0];
  if (x.shape()[2] != in) layer.forward(x);  // throws the forward's message
  require_shape(dy, x.shape()[0], x.shape()[1], out, "linear layer backward");
  shape_buffer(dx, x.shape());
  affine_backward(x.data(), x.shape()[0] * x.shape()[1], in, in, layer.weight.data(), out, in,
                  dy.data(), out, dx.data(), in, grad.weight.data(), grad.bias.data(), true);
}

Activations backward(const LayerNorm& layer, const Activations& x, const Activations& dy,
                     LayerNorm& grad) {
  Activations dx;
  backward(layer, x, dy, grad, dx);
  return dx;
}

void backward(const LayerNorm& layer, const Activations& x, const Activations& dy, LayerNorm& grad,
              Activations& dx) {
  const std::size_t d = layer.weight.size();
  if (x.shape()[2] != d) layer.forward(x);  // throws the forward's message
  require_shape(dy, x.shape()[0], x.shape()[1], d, "LayerNorm backward");
  shape_buffer(dx, x.shape());
  const std::size_t rows = x.shape()[0] * x.shape()[1];
  std::vector<double> row_mean(rows), row_inv(rows);
  const float* gamma = layer.weight.data();
  float* d_gamma = grad.weight.data();
  float* d_beta = grad.bias.data();
  constexpr std::size_t kChunk = 16;  // gradient columns per task
  const auto chunks = static_cast<std::ptrdiff_t>((d + kChunk - 1) / kChunk);
#pragma omp parallel if (rows * d > kParallelFloats)
  {
    // dx, rows in parallel. y = xhat·gamma + beta: dxhat = dy·gamma, and through
    // xhat = (x - mean)·inv, dx = inv · (dxhat - mean(dxhat) - xhat · mean(dxhat ∘ xhat)).
    std::vector<double> xhat(d), dxhat(d);
#pragma omp for schedule(static)
    for (std::size_t r = 0; r < rows; ++r) {
      const float* in = x.data() + r * d;
      const float* g = dy.data() + r * d;
      double mean = 0, var = 0;  // each sum in SIMD lanes: a fixed order, whatever the threads
#pragma omp simd reduction(+ : mean)
      for (std::size_t c = 0; c < d; ++c) mean += in[c];
      mean /= static_cast<double>(d);
#pragma omp simd reduction(+ : var)
      for (std::size_t c = 0; c < d; ++c) var += (in[c] - mean) * (in[c] - mean);
      const double inv = 1.0 / std::sqrt(var / static_cast<double>(d) + layer.eps);
      row_mean[r] = mean;
      row_inv[r] = inv;
      double sum = 0, dot = 0;
#pragma omp simd reduction(+ : sum, dot)
      for (std::size_t c = 0; c < d; ++c) {
        xhat[c] = (in[c] - mean) * inv;
        dxhat[c] = double(g[c]) * gamma[c];
        sum += dxhat[c];
        dot += dxhat[c] * xhat[c];
      }
      sum /= static_cast<double>(d);
      dot /= static_cast<double>(d);
      for (std::size_t c = 0; c < d; ++c)
        dx.data()[r * d + c] = static_cast<float>(inv * (dxhat[c] - sum - xhat[c] * dot));
    }
    // Then the gradients of gamma and beta, columns in parallel: each column summed over the
    // rows in order, as one thread sums it.
#pragma omp for schedule(static)
    for (std::ptrdiff_t chunk = 0; chunk < chunks; ++chunk) {
      const std::size_t c0 = std::size_t(chunk) * kChunk, c1 = std::min(d, c0 + kChunk);
      for (std::size_t r = 0; r < rows; ++r) {
        const float* in = x.data() + r * d;
        const float* g = dy.data() + r * d;
        const double mean = row_mean[r], inv = row_inv[r];
        for (std::size_t c = c0; c < c1; ++c) {
          const double xh = (in[c] - mean) * inv;
          d_gamma[c] += static_cast<float>(g[c] * xh);
          d_beta[c] += g[c];
        }
      }
    }
  }
}

const Activations& forward(const FeedForward& ffn, const Activations& x, FeedForwardTrace& trace) {
  trace.x = x;  // a copy into the same storage each step
  ffn.linear1.forward(x, trace.hidden);
  float* h = trace.hidden.data();
  for (std::size_t i = 0; i < trace.hidden.size(); ++i) h[i] = h[i] > 0 ? h[i] : 0;
  ffn.linear2.forward(trace.hidden, trace.output);
  return trace.output;
}

Activations& backward(const FeedForward& ffn, FeedForwardTrace& trace, const Activations& dy,
                      FeedForward& grad) {
  backward(ffn.linear2, trace.hidden, dy, grad.linear2, trace.d_hidden);
  float* dh = trace.d_hidden.data();
  const float* h = trace.hidden.data();
  for (std::size_t i = 0; i < trace.d_hidden.size(); ++i)
    if (h[i] <= 0) dh[i] = 0;  // ReLU
  backward(ffn.linear1, trace.x, trace.d_hidden, grad.linear1, trace.dx);
  return trace.dx;
}

const Activations& forward(const MultiHeadAttention& mha, const Activations& query,
                           const Activations& memory, const Mask& mask, AttentionTrace& trace) {
  trace.query = query;
  trace.memory = memory;
  trace.mask = mask;
  mha.project(query, memory, trace.in, trace.projected);
  trace.gates = mha.gates(memory);
  mha.attention().forward(trace.in.q, trace.in.k, trace.in.v, mask, trace.gates.inputs(),
                          trace.heads, trace.saved);
  // trace.heads stays the core's own output, which its backward needs
  const Tensor* heads = &trace.heads;
  if (mha.head_norm_weight) {
    mha.normalise_heads(trace.heads, trace.normed_heads);
    heads = &trace.normed_heads;
  }
  if (mha.head_mask.empty()) {
    merge_heads(*heads, trace.merged);
  } else {
    Tensor masked = *heads;
    mha.apply_head_mask(masked);
    merge_heads(masked, trace.merged);
  }
  mha.out_proj.forward(trace.merged, trace.output);
  return trace.output;
}

AttentionInputGrads& backward(const MultiHeadAttention& mha, AttentionTrace& trace,
                              const Activations& dy, MultiHeadAttention& grad) {
  const std::size_t d = mha.d_model(), batch = trace.query.shape()[0];
  const std::size_t nq = trace.query.shape()[1];
  require_shape(dy, batch, nq, d, "multi-head attention backward");
  backward(mha.out_proj, trace.merged, dy, grad.out_proj, trace.d_merged);
  split_heads(trace.d_merged.data(), batch, nq, mha.heads(), mha.head_dim(), trace.d_heads);
  mha.apply_head_mask(trace.d_heads);  // d(heads · m) / d(heads) = m
  if (mha.head_norm_weight)
    mha.normalise_heads_backward(trace.heads, trace.d_heads, *grad.head_norm_weight);
  AllGradients& all = trace.core_grads;
  mha.attention().backward(trace.in.q, trace.in.k, trace.in.v, trace.mask, trace.gates.inputs(),
                           trace.heads, trace.d_heads, trace.saved, all);
  const Gradients& g = all.qkv;
  // q = query W_Q^T + b_Q, k = memory W_K^T + b_K, v = memory W_V^T + b_V: this call's block
  // gradients first (a tie adds them before they join the accumulator).
  merge_heads(g.dq, trace.dq);
  merge_heads(g.dk, trace.dk);
  merge_heads(g.dv, trace.dv);
  Matrix& dw = shape_buffer(trace.d_in_proj_weight, {3 * d, d});
  Vector& db = shape_buffer(trace.d_in_proj_bias, {3 * d});
  AttentionInputGrads& out = trace.grads;
  shape_buffer(out.query, trace.query.shape());
  shape_buffer(out.memory, trace.memory.shape());
  Activations& dmemory_v = shape_buffer(trace.d_memory_v, trace.memory.shape());
  const float* w = mha.in_proj_weight.data();
  Activations* blocks[] = {&trace.dq, &trace.dk, &trace.dv};
  const std::size_t rows = trace.projected.shape()[0] / (mha.short_conv() ? 3 : 1);
  for (std::size_t which = 0; which < 3; ++which) {
    const Activations& x = which == 0 ? trace.query : trace.memory;
    const std::size_t n = x.shape()[1];
    float* dx = which == 0 ? out.query.data() : which == 1 ? out.memory.data() : dmemory_v.data();
    const float* d_projection = blocks[which]->data();
    if (mha.short_conv()) {  // back through SiLU and the convolution to the projection
      shape_buffer(trace.d_projection, {batch, n, d});
      mha.short_conv_backward(which, batch, n, trace.projected.data() + which * rows * d,
                              blocks[which]->data(), trace.d_projection.data(), *grad.conv_weight);
      d_projection = trace.d_projection.data();
    }
    affine_backward(x.data(), batch * n, d, d, w + which * d * d, d, d, d_projection, d, dx, d,
                    dw.data() + which * d * d, db.data() + which * d, false);
  }
  add_into(out.memory, dmemory_v);
  // g = logsigmoid(pre) / tau: dpre = dg sigmoid(-pre) / tau; beta = sigmoid(pre): dpre =
  // dbeta beta (1 - beta). Then the projections' own backward adds to dmemory.
  const auto gate_backward = [&](const TokenTensor& d_token, const Activations& pre,
                                 const std::optional<Linear>& proj,
                                 std::optional<Linear>& proj_grad, bool log_decay) {
    if (!proj || d_token.size() == 0) return;
    Activations d_pre = Activations::from_shape(pre.shape());
    for (std::size_t b = 0; b < pre.shape()[0]; ++b)
      for (std::size_t j = 0; j < pre.shape()[1]; ++j)
        for (std::size_t h = 0; h < pre.shape()[2]; ++h) {
          const double x = pre(b, j, h), s = 1.0 / (1.0 + std::exp(-x));
          d_pre(b, j, h) = static_cast<float>(
              d_token(b, h, j) *
              (log_decay ? (1.0 - s) / MultiHeadAttention::kGateTau : s * (1.0 - s)));
        }
    add_into(out.memory, backward(*proj, trace.memory, d_pre, *proj_grad));
  };
  gate_backward(all.d_log_decay, trace.gates.g_pre, mha.gate_proj, grad.gate_proj, true);
  gate_backward(all.d_beta, trace.gates.beta_pre, mha.beta_proj, grad.beta_proj, false);
  // The core's learned tensors: its gradients, named and shaped as attention_parameters.
  for (const ParameterTensor& d_core : all.parameters) {
    const auto into =
        std::find_if(grad.attention_parameters.begin(), grad.attention_parameters.end(),
                     [&](const ParameterTensor& p) { return p.name == d_core.name; });
    if (into == grad.attention_parameters.end() || into->values.size() != d_core.values.size())
      throw Error("multi-head attention backward: the core's gradient of " + d_core.name +
                  " has no parameter of its size in the gradients");
    add(into->values.data(), d_core.values.data(), into->values.data(), into->values.size());
  }
  if (mha.tied_qk()) {  // one matrix in two places: both blocks get the sum
    for (std::size_t i = 0; i < d * d; ++i) dw.data()[i] = dw.data()[d * d + i] += dw.data()[i];
    for (std::size_t i = 0; i < d; ++i) db.data()[i] = db.data()[d + i] += db.data()[i];
  }
  for (std::size_t i = 0; i < dw.size(); ++i) grad.in_proj_weight.data()[i] += dw.data()[i];
  for (std::size_t i = 0; i < db.size(); ++i) grad.in_proj_bias.data()[i] += db.data()[i];
  return out;
}

const Activations& forward(const EncoderLayer& layer, const Activations& x, const Mask& mask,
                           EncoderLayerTrace& trace) {
  const LayerConfig& c = layer.config();
  const Activations& h =
      sublayer(c, x, layer.norm1, trace.sublayer1, [&](const Activations& a) -> const Activations& {
        return forward(layer.self_attn, a, a, mask, trace.attention);
      });
  if (!layer.ffn) return h;
  return sublayer(c, h, layer.norm2, trace.sublayer2,
                  [&](const Activations& a) -> const Activations& {
                    return forward(*layer.ffn, a, trace.ffn);
                  });
}

namespace {

// Self-attention's input gradient: the query's and the memory's summed (one input), in the
// query's buffer.
Activations& self_attention_backward(const MultiHeadAttention& mha, AttentionTrace& trace,
                                     const Activations& dy, MultiHeadAttention& grad) {
  AttentionInputGrads& g = backward(mha, trace, dy, grad);
  add_into(g.query, g.memory);
  return g.query;
}

}  // namespace

Activations& backward(const EncoderLayer& layer, EncoderLayerTrace& trace, const Activations& dy,
                      EncoderLayer& grad) {
  const LayerConfig& c = layer.config();
  const Activations* dh = &dy;
  if (layer.ffn)
    dh = &sublayer_backward(c, dy, layer.norm2, grad.norm2, trace.sublayer2,
                            [&](const Activations& d) -> Activations& {
                              return backward(*layer.ffn, trace.ffn, d, *grad.ffn);
                            });
  return sublayer_backward(
      c, *dh, layer.norm1, grad.norm1, trace.sublayer1, [&](const Activations& d) -> Activations& {
        return self_attention_backward(layer.self_attn, trace.attention, d, grad.self_attn);
      });
}

const Activations& forward(const Encoder& encoder, const Activations& x, const Mask& mask,
                           EncoderTrace& trace) {
  trace.layers.resize(encoder.layers.size());
  const Activations* h = &x;
  for (std::size_t i = 0; i < encoder.layers.size(); ++i)
    h = &forward(encoder.layers[i], *h, mask, trace.layers[i]);
  if (!encoder.norm) return *h;
  trace.norm_input = *h;
  encoder.norm->forward(trace.norm_input, trace.output);
  return trace.output;
}

namespace {

// Swaps the buffers that a layer's backward uses only while it runs (all but its result), so
// that one set serves every layer of a stack in turn instead of one set per layer (the FFN's
// d_hidden alone is B·N·ffn floats).
void swap_backward_scratch(EncoderLayerTrace& a, EncoderLayerTrace& b) {
  std::swap(a.ffn.d_hidden, b.ffn.d_hidden);
  std::swap(a.ffn.dx, b.ffn.dx);
  AttentionTrace &s = a.attention, &t = b.attention;
  std::swap(s.d_merged, t.d_merged);
  std::swap(s.d_heads, t.d_heads);
  std::swap(s.core_grads, t.core_grads);
  std::swap(s.dq, t.dq);
  std::swap(s.dk, t.dk);
  std::swap(s.dv, t.dv);
  std::swap(s.d_memory_v, t.d_memory_v);
  std::swap(s.grads.memory, t.grads.memory);
}

}  // namespace

const Activations& backward(const Encoder& encoder, EncoderTrace& trace, const Activations& dy,
                            Encoder& grad) {
  if (encoder.norm) backward(*encoder.norm, trace.norm_input, dy, *grad.norm, trace.d_norm);
  const Activations* d = encoder.norm ? &trace.d_norm : &dy;
  // The scratch set moves down with the layers: layer 0 holds it after a backward, so the
  // top layer takes it from there.
  for (std::size_t i = encoder.layers.size(); i-- > 0;) {
    swap_backward_scratch(trace.layers[i], trace.layers[i + 1 < encoder.layers.size() ? i + 1 : 0]);
    d = &backward(encoder.layers[i], trace.layers[i], *d, grad.layers[i]);
  }
  return *d;
}

const Activations& forward(const DecoderLayer& layer, const Activations& x,
                           const Activations& memory, const Mask& self_mask,
                           const Mask& memory_mask, DecoderLayerTrace& trace) {
  const LayerConfig& c = layer.config();
  Mask causal = self_mask;  // as DecoderLayer::forward
  if (causal.causal == Causal::none) causal.causal = Causal::top_left;
  const Activations& h1 =
      sublayer(c, x, layer.norm1, trace.sublayer1, [&](const Activations& a) -> const Activations& {
        return forward(layer.self_attn, a, a, causal, trace.self_attention);
      });
  const Activations& h2 = sublayer(
      c, h1, layer.norm2, trace.sublayer2, [&](const Activations& a) -> const Activations& {
        return forward(layer.multihead_attn, a, memory, memory_mask, trace.cross_attention);
      });
  if (!layer.ffn) return h2;
  return sublayer(c, h2, layer.norm3, trace.sublayer3,
                  [&](const Activations& a) -> const Activations& {
                    return forward(*layer.ffn, a, trace.ffn);
                  });
}

DecoderInputGrads backward(const DecoderLayer& layer, DecoderLayerTrace& trace,
                           const Activations& dy, DecoderLayer& grad) {
  const LayerConfig& c = layer.config();
  const Activations* dh = &dy;
  if (layer.ffn)
    dh = &sublayer_backward(c, dy, layer.norm3, grad.norm3, trace.sublayer3,
                            [&](const Activations& d) -> Activations& {
                              return backward(*layer.ffn, trace.ffn, d, *grad.ffn);
                            });
  Activations* dmemory = nullptr;
  dh = &sublayer_backward(
      c, *dh, layer.norm2, grad.norm2, trace.sublayer2, [&](const Activations& d) -> Activations& {
        AttentionInputGrads& g =
            backward(layer.multihead_attn, trace.cross_attention, d, grad.multihead_attn);
        dmemory = &g.memory;
        return g.query;
      });
  const Activations& dx = sublayer_backward(
      c, *dh, layer.norm1, grad.norm1, trace.sublayer1, [&](const Activations& d) -> Activations& {
        return self_attention_backward(layer.self_attn, trace.self_attention, d, grad.self_attn);
      });
  return {dx, *dmemory};
}

Activations forward(const Decoder& decoder, const Activations& x, const Activations& memory,
                    const Mask& self_mask, const Mask& memory_mask, DecoderTrace& trace) {
  trace.layers.resize(decoder.layers.size());
  const Activations* h = &x;
  for (std::size_t i = 0; i < decoder.layers.size(); ++i)
    h = &forward(decoder.layers[i], *h, memory, self_mask, memory_mask, trace.layers[i]);
  if (!decoder.norm) return *h;
  trace.norm_input = *h;
  return decoder.norm->forward(*h);
}

DecoderInputGrads backward(const Decoder& decoder, DecoderTrace& trace, const Activations& dy,
                           Decoder& grad) {
  if (decoder.norm) backward(*decoder.norm, trace.norm_input, dy, *grad.norm, trace.d_norm);
  DecoderInputGrads out{decoder.norm ? trace.d_norm : dy, {}};
  for (std::size_t i = decoder.layers.size(); i-- > 0;) {
    DecoderInputGrads g = backward(decoder.layers[i], trace.layers[i], out.x, grad.layers[i]);
    out.x = std::move(g.x);
    if (out.memory.size() == 0)
      out.memory = std::move(g.memory);
    else
      add_into(out.memory, g.memory);
  }
  return out;
}

const Activations& forward(const EncoderModel& model, const Tokens& tokens, const Mask& mask,
                           ModelTrace& trace) {
  trace.tokens = tokens;
  model.embed(tokens, trace.embedded, trace.positions);
  return forward(model.encoder, trace.embedded, mask, trace.encoder);
}

void backward(const EncoderModel& model, ModelTrace& trace, const Activations& dy,
              EncoderModel& grad) {
  const Activations& dx = backward(model.encoder, trace.encoder, dy, grad.encoder);
  const std::size_t dim = model.embedding.weight.shape()[1];
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(dim)));
  for (std::size_t i = 0; i < trace.tokens.size(); ++i) {  // the positions add no parameter
    float* row =
        grad.embedding.weight.data() + static_cast<std::size_t>(trace.tokens.data()[i]) * dim;
    for (std::size_t c = 0; c < dim; ++c) row[c] += scale * dx.data()[i * dim + c];
  }
}

}  // namespace attnlab::models
