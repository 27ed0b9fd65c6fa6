// Inputs from a trained model, for `attnlab sweep`: the q, k and v that one attention layer of
// a checkpoint of `attnlab train` computes on held-out data, so that every approximation is also
// measured where attention has learned structure, not only on random logits.
//
//   trained:DIR[,layer=L]
//     DIR    the checkpoint folder of `attnlab train` (its weights and state.txt, which gives the
//            model and its task), or its run folder holding checkpoint/. A relative DIR is found
//            from the current directory, else from the source tree attnlab was built from (the
//            built-in default sweep names benchmarks/checkpoints/kjv).
//     layer  the attention layer, 1 (the first, default) to the model's layer count.
//
// A point (n, batch, seed) of the grid gets `batch` held-out sequences of n tokens of the
// model's task (Task::held_out at length n, from a stream of the seed: for the text task,
// windows of the Bible's validation split), run through the model's layers before L, then
// layer L's input projections: q, k, v [batch, H, n, d_k] as its attention core sees them
// (models::MultiHeadAttention::project). The heads and head size are the model's, not the
// grid's. The model serves the lengths it was trained at and below (its attention has seen no
// longer context): the grid's n above that are left out; a causal model's q, k, v are measured
// under causal masks only (causal = none is left out for this input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnlab/inputs.hpp"

namespace attnlab::harness {

/// A parsed "trained:DIR[,layer=L]".
struct TrainedInput {
  std::string text;       ///< as given
  std::string dir;        ///< DIR as given
  std::size_t layer = 1;  ///< 1-based
};

/// Whether `text` names a trained input ("trained:...").
bool is_trained_input(const std::string& text);

/// Parses `text`; throws Error quoting it and naming the field that is wrong (dir, layer, an
/// unknown key) and what was expected. Reads nothing from disk.
TrainedInput parse_trained_input(const std::string& text);

/// "kjv, layer 1": the checkpoint folder's name and the layer, for narrow table headings.
std::string trained_input_label(const std::string& text);

/// What a trained input serves.
struct TrainedShape {
  std::int64_t max_n = 0;  ///< the length the model was trained at
  std::int64_t heads = 0;  ///< attention heads
  std::int64_t dim = 0;    ///< head size d_k = d_model / heads
  bool causal = false;     ///< a causal model (measured under causal masks only)
};

/// Reads DIR's state.txt; throws Error naming the input and the field (dir: no checkpoint
/// there; layer: beyond the model's layers).
TrainedShape trained_shape(const TrainedInput& in);

/// q, k, v [batch, H, n, d_k] of the input's layer on `batch` held-out sequences of n tokens
/// drawn from `seed` (see the header comment). Throws Error naming the input when n exceeds
/// what the model serves or the task pads its sequences (the sweep's masks have no padding).
QKV trained_inputs(const TrainedInput& in, std::size_t n, std::size_t batch, std::uint64_t seed);

}  // namespace attnlab::harness
