#include "cli/mask_flags.hpp"

#include <charconv>

#include "attnlab/factory.hpp"
#include "attnlab/npy.hpp"

namespace attnlab::cli {
namespace {

std::vector<std::int64_t> parse_key_lengths(const std::string& text) {
  std::vector<std::int64_t> lengths;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    const std::string token = text.substr(start, comma - start);
    std::int64_t n = -1;
    const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), n);
    if (token.empty() || ec != std::errc() || end != token.data() + token.size() || n < 0)
      throw Error("--key-lengths '" + text + "': '" + token +
                  "' is not a non-negative integer (expected e.g. 5,7: one length per batch item)");
    lengths.push_back(n);
    if (comma == std::string::npos) return lengths;
    start = comma + 1;
  }
}

// "LEFT,RIGHT" (FlashAttention's window_size; -1 leaves a side unbounded) as a Window; errors
// name `flag`, the option as the user typed it.
Window parse_window(const char* flag, const std::string& text) {
  const auto comma = text.find(',');
  std::int64_t sides[2] = {0, 0};
  bool ok = comma != std::string::npos && text.find(',', comma + 1) == std::string::npos;
  const std::string parts[2] = {text.substr(0, comma), ok ? text.substr(comma + 1) : ""};
  for (int s = 0; ok && s < 2; ++s) {
    const auto [end, ec] =
        std::from_chars(parts[s].data(), parts[s].data() + parts[s].size(), sides[s]);
    ok = !parts[s].empty() && ec == std::errc() && end == parts[s].data() + parts[s].size();
  }
  if (!ok)
    throw Error(std::string(flag) + " '" + text +
                "': expected LEFT,RIGHT, two integers (-1 leaves a side unbounded), e.g. 128,0");
  Mask alone;  // the sides' range: Mask::validate's rule, its message led by the flag
  alone.window = Window{sides[0], sides[1]};
  try {
    alone.validate(Dims{1, 1, 1, 1, 1, 1});
  } catch (const Error& e) {
    throw Error(std::string(flag) + " '" + text + "': " + e.what());
  }
  return *alone.window;
}

}  // namespace

std::string variants_taking(bool Support::*feature) {
  std::vector<std::string> names;
  for (const std::string& name : attention_names())
    if (make_attention(name)->support().*feature) names.push_back(name);
  return names.empty() ? "none registered" : join_names(names);
}

void add_mask_flags(CLI::App& cmd, MaskFlags& f) {
  cmd.add_option("--key-lengths", f.key_lengths, "Valid keys per batch item, e.g. 5,7");
  cmd.add_option("--cu-seqlens", f.cu_seqlens,
                 "Packed documents: .npy of int offsets 0 = o_0 <= ... <= o_D = N of q's rows, "
                 "batch of one (FlashAttention's cu_seqlens; " +
                     variants_taking(&Support::documents) + ")");
  cmd.add_option("--cu-seqlens-k", f.cu_seqlens_k,
                 "Key offsets for cross-attention, ending at Nk (default: --cu-seqlens)");
  // Two options, not one with two names, so that errors name the one the user typed.
  CLI::Option* window =
      cmd.add_option("--window", f.window,
                     "Sliding window LEFT,RIGHT around each query (FlashAttention's "
                     "window_size; -1: unbounded; " +
                         variants_taking(&Support::window) + ")");
  cmd.add_option("--window-size", f.window_size, "--window under FlashAttention's name")
      ->excludes(window);
  cmd.add_option("--prefix-lengths", f.prefix_lengths,
                 "Prefix-LM with --causal: .npy of int prefix lengths, one per batch item (per "
                 "document with --cu-seqlens; " +
                     variants_taking(&Support::prefix) + ")");
}

void apply_mask_flags(const MaskFlags& f, Mask& mask) {
  if (!f.key_lengths.empty()) mask.key_lengths = parse_key_lengths(f.key_lengths);
  if (!f.cu_seqlens.empty())
    mask.documents = read_for("--cu-seqlens", [&] { return load_npy_ints(f.cu_seqlens); });
  if (!f.cu_seqlens_k.empty()) {
    if (f.cu_seqlens.empty())
      throw Error("--cu-seqlens-k " + f.cu_seqlens_k +
                  ": the key offsets of cross-attention need --cu-seqlens (the query offsets)");
    mask.key_documents = read_for("--cu-seqlens-k", [&] { return load_npy_ints(f.cu_seqlens_k); });
  }
  if (!f.window_text().empty()) mask.window = parse_window(f.window_flag(), f.window_text());
  if (!f.prefix_lengths.empty())
    mask.prefix_lengths =
        read_for("--prefix-lengths", [&] { return load_npy_ints(f.prefix_lengths); });
}

}  // namespace attnlab::cli
