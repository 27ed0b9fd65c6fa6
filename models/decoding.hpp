// Decoding a whole causal model token by token, as it generates text (`attnlab generate`,
// training/generation.hpp): per layer the decoding state of its self-attention
// (MultiHeadAttention::start_decoding: its core's TokenDecoder, a KV cache, a window's ring or a
// recurrent state, lib/attnlab/decoder.hpp; the short convolution's last rows), and the layers'
// own forward on the new tokens alone (EncoderLayer::decode, LlamaBlock::decode: the same code
// as their forward with the self-attention decoding), since projections, norms and FFN act on
// each token by itself. Positions continue after the tokens held: the 2017 model adds the
// sinusoidal encoding of those positions, Llama rotates q and k at them.
// Feeding a prompt of N0 tokens and then one token at a time gives the rows that the causal
// forward of all the tokens gives (to float32 tolerance: the cores' chunked and recurrent forms
// sum in other orders), for both models, grouped heads, every switch and every core that decodes
// (tests/test_generation.cpp). A core that does not decode (linformer, non-causal variants) is
// refused when the decoder is made (Unsupported naming it and decoding).
#pragma once

#include <cstddef>
#include <variant>
#include <vector>

#include "models/layers.hpp"
#include "models/llama.hpp"
#include "models/multi_head_attention.hpp"
#include "models/transformer.hpp"

namespace attnlab::models {

/// See the header comment. The model must outlive it and not change while it decodes.
class ModelDecoder {
 public:
  /// The 2017 encoder as a causal model (trained with every attention call causal: `attnlab
  /// train --causal`) for `batch` sequences of at most `max_tokens` tokens each (0: no limit,
  /// but a core that needs one: bigbird).
  ModelDecoder(const EncoderModel& model, std::size_t batch, std::size_t max_tokens = 0);
  /// Llama's model (always causal), likewise.
  ModelDecoder(const LlamaModel& model, std::size_t batch, std::size_t max_tokens = 0);

  /// tokens [B, n >= 1] after those held -> the model's outputs for them [B, n, d_model] (after
  /// its final norm): the rows the model's causal forward of all the tokens gives. Throws Error
  /// for another batch, n = 0, tokens past max_tokens or a token outside the vocabulary, before
  /// anything changes.
  Activations feed(const Tokens& tokens);

  /// Tokens held per sequence.
  std::size_t tokens() const { return held_; }
  /// Tokens it may hold per sequence (0: no limit).
  std::size_t max_tokens() const { return max_tokens_; }
  /// Bytes its layers' decoding states hold (AttentionDecoding::bytes).
  std::size_t bytes() const;

 private:
  std::variant<const EncoderModel*, const LlamaModel*> model_;
  std::vector<AttentionDecoding> layers_;
  std::size_t batch_, max_tokens_, held_ = 0;
};

}  // namespace attnlab::models
