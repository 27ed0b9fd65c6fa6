#include "variants/gated_delta.hpp"

#include "attnlab/error.hpp"

namespace attnlab {
namespace {

ScanRule gated_delta_rule(double beta) {
  if (!(beta >= 0.0 && beta <= 1.0))  // also refuses NaN
    throw Error("gated-delta: beta=" + std::to_string(beta) + ": must be in [0, 1]");
  ScanRule r;
  r.delta = true;
  r.normalise = true;
  r.decay = ScanRule::Decay::input;
  r.beta_input = true;
  r.beta = beta;
  return r;
}

}  // namespace

GatedDeltaAttention::GatedDeltaAttention(double beta) : ScanAttention(gated_delta_rule(beta)) {}

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
