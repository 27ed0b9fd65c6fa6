// The mask options `attnlab run` and `attnlab mask` share: key padding, packed documents,
// a window and prefix-LM (Mask, lib/attnlab/mask.hpp), read from the command line and .npy files.
//   --key-lengths 5,7              valid keys per batch item
//   --cu-seqlens o.npy             packed documents: int32/int64 offsets 0 = o_0 <= ... <= o_D = Nq
//   --cu-seqlens-k ok.npy          the key offsets of cross-attention (default: --cu-seqlens)
//   --window LEFT,RIGHT            FlashAttention's window_size (-1: unbounded); --window-size is
//                                  the same under FlashAttention's name (one of the two)
//   --prefix-lengths p.npy         prefix-LM under a causal mask: int lengths per item (document)
// A file that cannot be read is an Error naming the option and the file; the values are checked
// by Mask::validate, whose messages name the part (documents (cu_seqlens), window.left, ...);
// the window's own errors also name the flag it was given by, as typed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnlab/attention.hpp"
#include "attnlab/error.hpp"
#include "attnlab/mask.hpp"

namespace attnlab::cli {

struct MaskFlags {
  std::string key_lengths, cu_seqlens, cu_seqlens_k, window, window_size, prefix_lengths;

  /// The flag that gave the window, as typed: --window-size or --window.
  const char* window_flag() const { return window_size.empty() ? "--window" : "--window-size"; }
  /// The window's text, from whichever flag gave it; empty: no window.
  const std::string& window_text() const { return window_size.empty() ? window : window_size; }
};

/// Registers the options above on `cmd`, their values kept in `flags`.
void add_mask_flags(CLI::App& cmd, MaskFlags& flags);

/// Sets the parts of `mask` the flags give; throws Error naming the option when one cannot be
/// read or parsed.
void apply_mask_flags(const MaskFlags& flags, Mask& mask);

/// The registered variants whose default spec declares `feature` (a Support flag), for help
/// texts: read from their support(), so a new variant is listed without an edit.
std::string variants_taking(bool Support::*feature);

/// Runs load(); an Error from it (no file, wrong dtype or rank, NaN) is rethrown naming
/// `option` before the file's own message.
template <class Load>
auto read_for(const char* option, Load load) {
  try {
    return load();
  } catch (const Error& e) {
    throw Error(std::string(option) + " " + e.what());
  }
}

}  // namespace attnlab::cli
