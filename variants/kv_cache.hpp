// The softmax variants' decoding engine: a KV cache per item and KV head, read through a key
// pattern. full, sliding and bigbird are thin clients of it (their start_decoding); the linear
// family decodes with its recurrent state instead (variants/linear_scan.hpp).
//
// What it holds: the keys and values of every item and KV head (Hkv of them: grouped query heads
// share one, never repeated) in slots [slots x Dk], [slots x Dv]. All positions (full, bigbird;
// the cache doubles as it fills unless max_tokens sizes it once), or the first `fixed` positions
// and a ring of the last `ring` (sliding, or any client under DecodeConfig::window: O(window)
// memory whatever the context). With the forgetting gate, also F_j = g_0 + ... + g_j per item,
// query head and held position (float64, as the engine's forward keeps it).
// A step appends each item's key and value at its next position, then the queries of each KV
// head's group at that position attend the positions the pattern names (ascending ranges, all
// at or before it, clipped to the window): the online softmax of FlashAttention over them, in
// pieces of up to 512 keys read once for the whole group, float32, scores in log2 units
// (scale·log2(e)) with the engine's score modifiers (kernels::score_mods: softcap, ALiBi, the
// forgetting gate F_p - F_j) and sinks joining each row's denominator. Flash-decoding (Dao et
// al. 2023): when the units of work (item x KV head, or item x query head where the pattern
// differs per head) are fewer than twice the threads, each unit's keys are split into parts
// computed on different cores, each part's (max, sum, weighted values) merged afterwards, so one
// sequence (B = 1) uses every core.
// Prefill: a prompt into an empty cache runs a causal forward (the engine: chunked, every
// modifier), the variant's own or the client's (bigbird's: its pattern laid out for max_tokens,
// which its own forward of the prompt would lay out for fewer), and then stores the keys; a
// continuation (tokens already held) appends and attends token by token as steps do.
// Cost per step: O(visible keys · (Dk + Dv)) per query head, the keys and values of a KV head
// read once per group; memory: slots · (Dk + Dv) floats per KV head (+ slots doubles per query
// head with the forgetting gate).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "attnlab/decoder.hpp"

namespace attnlab {

/// Half-open position ranges [first, second).
using PositionRanges = std::vector<std::pair<std::size_t, std::size_t>>;

/// Which held positions the query of head h at position p attends: appends ascending, disjoint
/// ranges, all within [0, p], to `out` (given empty).
using KeyPattern = std::function<void(std::size_t h, std::size_t p, PositionRanges& out)>;

/// The causal forward of a prompt of N tokens into an empty cache: q, k, v as prefill takes
/// them (validated), the decoder's mask (causal, scale, key lengths, window, softcap) and inputs
/// (its sinks and ALiBi slopes included) -> out [B, H, N, Dv], the rows its pattern gives.
using PromptForward = std::function<void(TensorRef q, TensorRef k, TensorRef v, const Mask& mask,
                                         const TokenInputs& in, Tensor& out)>;

/// How a KV cache decoder keeps and reads its keys (see above).
struct KvCacheLayout {
  KeyPattern pattern;     ///< the keys each query attends
  bool per_head = false;  ///< the pattern depends on the query head (bigbird's random blocks)
  std::size_t fixed = 0;  ///< with ring > 0: leading positions always kept
  std::size_t ring = 0;   ///< > 0: only the last `ring` positions after `fixed` are kept
  /// A prompt into an empty cache runs this, the same pattern chunked; empty: the variant's own
  /// causal forward (whose pattern at the prompt's length must then be `pattern`).
  PromptForward prompt_forward;
};

/// Makes the KV cache decoder of `variant` (whose causal forward prefills, see above): its
/// start_decoding. Throws Error (Unsupported) for a config the variant rejects (refuses).
std::unique_ptr<TokenDecoder> make_kv_cache_decoder(const Attention& variant,
                                                    const DecodeConfig& config,
                                                    KvCacheLayout layout);

}  // namespace attnlab
