#include "models/backward.hpp"

#include <cblas.h>

#include <cmath>
#include <optional>
#include <utility>

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

void add_into(Activations& y, const Activations& x) {
  float* out = y.data();
  const float* in = x.data();
  for (std::size_t i = 0; i < y.size(); ++i) out[i] += in[i];
}

void require_shape(const Activations& got, std::size_t batch, std::size_t n, std::size_t features,
                   const char* what) {
  if (got.shape()[0] != batch || got.shape()[1] != n || got.shape()[2] != features)
    throw Error(std::string(what) + ": gradient " + shape_text(got) + ", expected [" +
                std::to_string(batch) + ", " + std::to_string(n) + ", " +
                std::to_string(features) + "] (the output's shape)");
}

// One residual sublayer forward (x + f(LN(x)) pre-LN, LN(x + f(x)) post-LN, without what is
// switched off), keeping what its LayerNorm saw.
template <class F>
Activations sublayer(const LayerConfig& c, const Activations& x,
                     const std::optional<LayerNorm>& norm, Activations& norm_input, F&& f) {
  Activations y;
  if (c.pre_ln && norm) {
    norm_input = x;
    y = f(norm->forward(x));
  } else {
    y = f(x);
  }
  if (c.skip) add_into(y, x);
  if (c.pre_ln || !norm) return y;
  norm_input = y;
  return norm->forward(y);
}

// Its backward: back(d) is the gradient of f's input given d = the gradient of f's output.
template <class B>
Activations sublayer_backward(const LayerConfig& c, const Activations& dy,
                              const std::optional<LayerNorm>& norm,
                              std::optional<LayerNorm>& norm_grad,
                              const Activations& norm_input, B&& back) {
  const Activations dz = !c.pre_ln && norm ? backward(*norm, norm_input, dy, *norm_grad) : dy;
  Activations dx = back(dz);
  if (c.pre_ln && norm) dx = backward(*norm, norm_input, dx, *norm_grad);
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
  const std::size_t in = layer.weight.shape()[1], out = layer.weight.shape()[0];
  if (x.shape()[2] != in) layer.forward(x);  // throws the forward's message
  require_shape(dy, x.shape()[0], x.shape()[1], out, "linear layer backward");
  Activations dx = Activations::from_shape(x.shape());
  affine_backward(x.data(), x.shape()[0] * x.shape()[1], in, in, layer.weight.data(), out, in,
                  dy.data(), out, dx.data(), in, grad.weight.data(), grad.bias.data(), true);
  return dx;
}

Activations backward(const LayerNorm& layer, const Activations& x, const Activations& dy,
                     LayerNorm& grad) {
  const std::size_t d = layer.weight.size();
  if (x.shape()[2] != d) layer.forward(x);  // throws the forward's message
  require_shape(dy, x.shape()[0], x.shape()[1], d, "LayerNorm backward");
  Activations dx = Activations::from_shape(x.shape());
  std::vector<double> xhat(d), dxhat(d);
  const std::size_t rows = x.shape()[0] * x.shape()[1];
  for (std::size_t r = 0; r < rows; ++r) {
    const float* in = x.data() + r * d;
    const float* g = dy.data() + r * d;
    double mean = 0, var = 0;
    for (std::size_t c = 0; c < d; ++c) mean += in[c];
    mean /= static_cast<double>(d);
    for (std::size_t c = 0; c < d; ++c) var += (in[c] - mean) * (in[c] - mean);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(d) + layer.eps);
    // y = xhat·gamma + beta: dxhat = dy·gamma, and through xhat = (x - mean)·inv,
    // dx = inv · (dxhat - mean(dxhat) - xhat · mean(dxhat ∘ xhat)).
    double sum = 0, dot = 0;
    for (std::size_t c = 0; c < d; ++c) {
      xhat[c] = (in[c] - mean) * inv;
      dxhat[c] = double(g[c]) * layer.weight[c];
      grad.weight[c] += static_cast<float>(g[c] * xhat[c]);
      grad.bias[c] += g[c];
      sum += dxhat[c];
      dot += dxhat[c] * xhat[c];
    }
    sum /= static_cast<double>(d);
    dot /= static_cast<double>(d);
    for (std::size_t c = 0; c < d; ++c)
      dx.data()[r * d + c] = static_cast<float>(inv * (dxhat[c] - sum - xhat[c] * dot));
  }
  return dx;
}

Activations forward(const FeedForward& ffn, const Activations& x, FeedForwardTrace& trace) {
  trace.x = x;
  trace.hidden = ffn.linear1.forward(x);
  for (float& v : trace.hidden) v = v > 0 ? v : 0;
  return ffn.linear2.forward(trace.hidden);
}

Activations backward(const FeedForward& ffn, const FeedForwardTrace& trace,
                     const Activations& dy, FeedForward& grad) {
  Activations dh = backward(ffn.linear2, trace.hidden, dy, grad.linear2);
  for (std::size_t i = 0; i < dh.size(); ++i)
    if (trace.hidden.data()[i] <= 0) dh.data()[i] = 0;  // ReLU
  return backward(ffn.linear1, trace.x, dh, grad.linear1);
}

Activations forward(const MultiHeadAttention& mha, const Activations& query,
                    const Activations& memory, const Mask& mask, AttentionTrace& trace) {
  trace.query = query;
  trace.memory = memory;
  trace.mask = mask;
  trace.in = mha.project(query, memory);
  trace.gates = mha.gates(memory);
  mha.attention().forward(trace.in.q, trace.in.k, trace.in.v, mask, trace.gates.inputs(),
                          trace.heads, trace.saved);
  trace.merged = merge_heads(trace.heads);
  return mha.out_proj.forward(trace.merged);
}

AttentionInputGrads backward(const MultiHeadAttention& mha, const AttentionTrace& trace,
                             const Activations& dy, MultiHeadAttention& grad) {
  const std::size_t d = mha.d_model(), batch = trace.query.shape()[0];
  const std::size_t nq = trace.query.shape()[1];
  require_shape(dy, batch, nq, d, "multi-head attention backward");
  const Activations d_merged = backward(mha.out_proj, trace.merged, dy, grad.out_proj);
  const Tensor d_heads = split_heads(d_merged.data(), batch, nq, mha.heads(), mha.head_dim());
  AllGradients all;
  mha.attention().backward(trace.in.q, trace.in.k, trace.in.v, trace.mask, trace.gates.inputs(),
                           trace.heads, d_heads, trace.saved, all);
  const Gradients& g = all.qkv;
  // q = query W_Q^T + b_Q, k = memory W_K^T + b_K, v = memory W_V^T + b_V: this call's block
  // gradients first (a tie adds them before they join the accumulator).
  const Activations dq = merge_heads(g.dq), dk = merge_heads(g.dk), dv = merge_heads(g.dv);
  Matrix dw = Matrix::from_shape({3 * d, d});
  Vector db = Vector::from_shape({3 * d});
  AttentionInputGrads out{Activations::from_shape(trace.query.shape()),
                          Activations::from_shape(trace.memory.shape())};
  Activations dmemory_v = Activations::from_shape(trace.memory.shape());
  const float* w = mha.in_proj_weight.data();
  const std::pair<const Activations*, std::size_t> blocks[] = {{&dq, 0}, {&dk, 1}, {&dv, 2}};
  for (const auto& [grad_out, which] : blocks) {
    const Activations& x = which == 0 ? trace.query : trace.memory;
    float* dx = which == 0 ? out.query.data() : which == 1 ? out.memory.data() : dmemory_v.data();
    affine_backward(x.data(), batch * x.shape()[1], d, d, w + which * d * d, d, d,
                    grad_out->data(), d, dx, d, dw.data() + which * d * d, db.data() + which * d,
                    false);
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
              d_token(b, h, j) * (log_decay ? (1.0 - s) / MultiHeadAttention::kGateTau
                                            : s * (1.0 - s)));
        }
    add_into(out.memory, backward(*proj, trace.memory, d_pre, *proj_grad));
  };
  gate_backward(all.d_log_decay, trace.gates.g_pre, mha.gate_proj, grad.gate_proj, true);
  gate_backward(all.d_beta, trace.gates.beta_pre, mha.beta_proj, grad.beta_proj, false);
  if (mha.tied_qk()) {  // one matrix in two places: both blocks get the sum
    for (std::size_t i = 0; i < d * d; ++i) dw.data()[i] = dw.data()[d * d + i] += dw.data()[i];
    for (std::size_t i = 0; i < d; ++i) db.data()[i] = db.data()[d + i] += db.data()[i];
  }
  for (std::size_t i = 0; i < dw.size(); ++i) grad.in_proj_weight.data()[i] += dw.data()[i];
  for (std::size_t i = 0; i < db.size(); ++i) grad.in_proj_bias.data()[i] += db.data()[i];
  return out;
}

Activations forward(const EncoderLayer& layer, const Activations& x, const Mask& mask,
                    EncoderLayerTrace& trace) {
  const LayerConfig& c = layer.config();
  Activations h = sublayer(c, x, layer.norm1, trace.norm1_input, [&](const Activations& a) {
    return forward(layer.self_attn, a, a, mask, trace.attention);
  });
  if (!layer.ffn) return h;
  return sublayer(c, h, layer.norm2, trace.norm2_input,
                  [&](const Activations& a) { return forward(*layer.ffn, a, trace.ffn); });
}

Activations backward(const EncoderLayer& layer, const EncoderLayerTrace& trace,
                     const Activations& dy, EncoderLayer& grad) {
  const LayerConfig& c = layer.config();
  Activations dh = dy;
  if (layer.ffn)
    dh = sublayer_backward(c, dy, layer.norm2, grad.norm2, trace.norm2_input,
                           [&](const Activations& d) {
                             return backward(*layer.ffn, trace.ffn, d, *grad.ffn);
                           });
  return sublayer_backward(c, dh, layer.norm1, grad.norm1, trace.norm1_input,
                           [&](const Activations& d) {
                             AttentionInputGrads g =
                                 backward(layer.self_attn, trace.attention, d, grad.self_attn);
                             add_into(g.query, g.memory);  // self-attention: one input
                             return g.query;
                           });
}

Activations forward(const Encoder& encoder, const Activations& x, const Mask& mask,
                    EncoderTrace& trace) {
  trace.layers.resize(encoder.layers.size());
  Activations h = x;
  for (std::size_t i = 0; i < encoder.layers.size(); ++i)
    h = forward(encoder.layers[i], h, mask, trace.layers[i]);
  if (!encoder.norm) return h;
  trace.norm_input = h;
  return encoder.norm->forward(h);
}

Activations backward(const Encoder& encoder, const EncoderTrace& trace, const Activations& dy,
                     Encoder& grad) {
  Activations d = encoder.norm ? backward(*encoder.norm, trace.norm_input, dy, *grad.norm) : dy;
  for (std::size_t i = encoder.layers.size(); i-- > 0;)
    d = backward(encoder.layers[i], trace.layers[i], d, grad.layers[i]);
  return d;
}

Activations forward(const DecoderLayer& layer, const Activations& x, const Activations& memory,
                    const Mask& self_mask, const Mask& memory_mask, DecoderLayerTrace& trace) {
  const LayerConfig& c = layer.config();
  Mask causal = self_mask;  // as DecoderLayer::forward
  if (causal.causal == Causal::none) causal.causal = Causal::top_left;
  Activations h = sublayer(c, x, layer.norm1, trace.norm1_input, [&](const Activations& a) {
    return forward(layer.self_attn, a, a, causal, trace.self_attention);
  });
  h = sublayer(c, h, layer.norm2, trace.norm2_input, [&](const Activations& a) {
    return forward(layer.multihead_attn, a, memory, memory_mask, trace.cross_attention);
  });
  if (!layer.ffn) return h;
  return sublayer(c, h, layer.norm3, trace.norm3_input,
                  [&](const Activations& a) { return forward(*layer.ffn, a, trace.ffn); });
}

DecoderInputGrads backward(const DecoderLayer& layer, const DecoderLayerTrace& trace,
                           const Activations& dy, DecoderLayer& grad) {
  const LayerConfig& c = layer.config();
  Activations dh = dy;
  if (layer.ffn)
    dh = sublayer_backward(c, dy, layer.norm3, grad.norm3, trace.norm3_input,
                           [&](const Activations& d) {
                             return backward(*layer.ffn, trace.ffn, d, *grad.ffn);
                           });
  Activations dmemory;
  dh = sublayer_backward(c, dh, layer.norm2, grad.norm2, trace.norm2_input,
                         [&](const Activations& d) {
                           AttentionInputGrads g = backward(layer.multihead_attn,
                                                            trace.cross_attention, d,
                                                            grad.multihead_attn);
                           dmemory = std::move(g.memory);
                           return g.query;
                         });
  Activations dx = sublayer_backward(c, dh, layer.norm1, grad.norm1, trace.norm1_input,
                                     [&](const Activations& d) {
                                       AttentionInputGrads g = backward(
                                           layer.self_attn, trace.self_attention, d,
                                           grad.self_attn);
                                       add_into(g.query, g.memory);
                                       return g.query;
                                     });
  return {std::move(dx), std::move(dmemory)};
}

Activations forward(const Decoder& decoder, const Activations& x, const Activations& memory,
                    const Mask& self_mask, const Mask& memory_mask, DecoderTrace& trace) {
  trace.layers.resize(decoder.layers.size());
  Activations h = x;
  for (std::size_t i = 0; i < decoder.layers.size(); ++i)
    h = forward(decoder.layers[i], h, memory, self_mask, memory_mask, trace.layers[i]);
  if (!decoder.norm) return h;
  trace.norm_input = h;
  return decoder.norm->forward(h);
}

DecoderInputGrads backward(const Decoder& decoder, const DecoderTrace& trace,
                           const Activations& dy, Decoder& grad) {
  DecoderInputGrads out{
      decoder.norm ? backward(*decoder.norm, trace.norm_input, dy, *grad.norm) : dy, {}};
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

Activations forward(const EncoderModel& model, const Tokens& tokens, const Mask& mask,
                    ModelTrace& trace) {
  trace.tokens = tokens;
  return forward(model.encoder, model.embed(tokens), mask, trace.encoder);
}

void backward(const EncoderModel& model, const ModelTrace& trace, const Activations& dy,
              EncoderModel& grad) {
  const Activations dx = backward(model.encoder, trace.encoder, dy, grad.encoder);
  const std::size_t dim = model.embedding.weight.shape()[1];
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(dim)));
  for (std::size_t i = 0; i < trace.tokens.size(); ++i) {  // the positions add no parameter
    float* row = grad.embedding.weight.data() + static_cast<std::size_t>(trace.tokens.data()[i]) * dim;
    for (std::size_t c = 0; c < dim; ++c) row[c] += scale * dx.data()[i * dim + c];
  }
}

}  // namespace attnlab::models
