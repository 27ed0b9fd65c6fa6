#include "variants/gla.hpp"

namespace attnlab {
namespace {

ScanRule gla_rule() {
  ScanRule r;
  r.decay = ScanRule::Decay::input;
  return r;
}

}  // namespace

GlaAttention::GlaAttention() : ScanAttention(gla_rule()) {}

std::unique_ptr<Attention> make_gla(Params&) {
  return std::make_unique<GlaAttention>();
}

namespace {
// Position 80 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("gla", make_gla, 80);
}  // namespace

}  // namespace attnlab
