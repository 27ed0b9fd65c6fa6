#include "variants/delta.hpp"

namespace attnlab {

DeltaAttention::DeltaAttention(double beta) : ScanAttention(delta_rule("delta", beta, false)) {}

std::string DeltaAttention::spec() const {
  return SpecWriter("delta").add("beta", rule().beta).str();
}

std::unique_ptr<Attention> make_delta(Params& params) {
  const double beta = params.number("beta", 1.0);
  if (!(beta >= 0.0 && beta <= 1.0)) params.fail("beta", "must be in [0, 1]");
  return std::make_unique<DeltaAttention>(beta);
}

namespace {
// Position 60 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("delta", make_delta, 60);
}  // namespace

}  // namespace attnlab
