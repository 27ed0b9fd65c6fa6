#include "variants/gated_delta.hpp"

namespace attnlab {

GatedDeltaAttention::GatedDeltaAttention(double beta)
    : ScanAttention(delta_rule("gated-delta", beta, true)) {}

std::string GatedDeltaAttention::spec() const {
  return SpecWriter("gated-delta").add("beta", rule().beta).str();
}

std::unique_ptr<Attention> make_gated_delta(Params& params) {
  const double beta = params.number("beta", 1.0);
  if (!(beta >= 0.0 && beta <= 1.0)) params.fail("beta", "must be in [0, 1]");
  return std::make_unique<GatedDeltaAttention>(beta);
}

namespace {
// Position 90 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("gated-delta", make_gated_delta, 90);
}  // namespace

}  // namespace attnlab
