#include "variants/kda.hpp"

namespace attnlab {

KdaAttention::KdaAttention(double beta) : ScanAttention(delta_rule("kda", beta, true)) {}

std::string KdaAttention::spec() const {
  return SpecWriter("kda").add("beta", rule().beta).str();
}

std::unique_ptr<Attention> make_kda(Params& params) {
  const double beta = params.number("beta", 1.0);
  if (!(beta >= 0.0 && beta <= 1.0)) params.fail("beta", "must be in [0, 1]");
  return std::make_unique<KdaAttention>(beta);
}

namespace {
// Position 95 in attention_names() and the --help listing: after gated-delta.
const AttentionRegistrar kRegistrar("kda", make_kda, 95);
}  // namespace

}  // namespace attnlab
