#include "models/decoding.hpp"

#include <string>

#include "attnlab/error.hpp"
#include "models/residual.hpp"

namespace attnlab::models {
namespace {

template <class Layer>
std::vector<AttentionDecoding> start_layers(const std::vector<Layer>& layers, std::size_t batch,
                                            std::size_t max_tokens) {
  std::vector<AttentionDecoding> states;
  for (const Layer& layer : layers)
    states.push_back(layer.self_attn.start_decoding(batch, max_tokens));
  return states;
}

// The stack's forward (stack_forward, the final norm included) with each layer decoding.
template <class LayerTrace, class StackTrace, class Layer, class Norm>
void decode_stack(const std::vector<Layer>& layers, const std::optional<Norm>& norm,
                  std::vector<AttentionDecoding>& states, const Activations& x, Activations& y) {
  stack_forward<LayerTrace>(
      layers, norm, x, y, static_cast<StackTrace*>(nullptr), {},
      [&](const Layer& layer, const Activations& h, Activations& out, LayerTrace*) {
        layer.decode(h, states[std::size_t(&layer - layers.data())], out);
      });
}

}  // namespace

ModelDecoder::ModelDecoder(const EncoderModel& model, std::size_t batch, std::size_t max_tokens)
    : model_(&model),
      layers_(start_layers(model.encoder.layers, batch, max_tokens)),
      batch_(batch),
      max_tokens_(max_tokens) {}

ModelDecoder::ModelDecoder(const LlamaModel& model, std::size_t batch, std::size_t max_tokens)
    : model_(&model),
      layers_(start_layers(model.layers, batch, max_tokens)),
      batch_(batch),
      max_tokens_(max_tokens) {}

Activations ModelDecoder::feed(const Tokens& tokens) {
  const std::size_t n = tokens.shape()[1];
  if (tokens.shape()[0] != batch_ || n == 0)
    throw Error("model decoder: tokens [" + std::to_string(tokens.shape()[0]) + ", " +
                std::to_string(n) + "], expected [" + std::to_string(batch_) + ", n >= 1]");
  if (max_tokens_ && held_ + n > max_tokens_)
    throw Error("model decoder: " + std::to_string(n) + " tokens after the " +
                std::to_string(held_) +
                " held would pass max_tokens=" + std::to_string(max_tokens_));
  Activations x, y;
  if (const auto* encoder = std::get_if<const EncoderModel*>(&model_)) {
    (*encoder)->embed(tokens, held_, x);  // throws for a token outside the vocabulary
    decode_stack<EncoderLayerTrace, EncoderTrace>((*encoder)->encoder.layers,
                                                  (*encoder)->encoder.norm, layers_, x, y);
  } else {
    const LlamaModel& llama = *std::get<const LlamaModel*>(model_);
    llama.embed_tokens.forward(tokens, x);
    decode_stack<LlamaBlockTrace, LlamaTrace>(llama.layers, llama.norm, layers_, x, y);
  }
  held_ += n;
  return y;
}

std::size_t ModelDecoder::bytes() const {
  std::size_t total = 0;
  for (const AttentionDecoding& layer : layers_) total += layer.bytes();
  return total;
}

}  // namespace attnlab::models
