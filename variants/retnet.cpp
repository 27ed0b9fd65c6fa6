#include "variants/retnet.hpp"

#include <cmath>

#include "attnlab/error.hpp"

namespace attnlab {
namespace {

ScanRule retnet_rule() {
  ScanRule r;
  r.decay = ScanRule::Decay::per_head;
  return r;
}

}  // namespace

RetNetAttention::RetNetAttention(double gamma) : ScanAttention(retnet_rule()), gamma_(gamma) {
  if (!(gamma <= 1.0)) throw Error("retnet: gamma=" + std::to_string(gamma) + ": must be <= 1");
}

std::string RetNetAttention::spec() const {
  if (gamma_ <= 0.0) return SpecWriter("retnet").add("schedule", std::string("retnet")).str();
  return SpecWriter("retnet").add("schedule", std::string("fixed")).add("gamma", gamma_).str();
}

double RetNetAttention::head_log_decay(std::size_t h, std::size_t) const {
  if (gamma_ > 0.0) return std::log(gamma_);
  return std::log1p(-std::exp2(-5.0 - double(h)));
}

std::unique_ptr<Attention> make_retnet(Params& params) {
  const bool fixed = params.choice("schedule", "retnet", {"retnet", "fixed"}) == "fixed";
  const double gamma = params.number("gamma", 1.0);
  if (!(gamma > 0.0 && gamma <= 1.0)) params.fail("gamma", "must be in (0, 1]");
  return std::make_unique<RetNetAttention>(fixed ? gamma : 0.0);
}

namespace {
// Position 70 in attention_names() and the --help listing.
const AttentionRegistrar kRegistrar("retnet", make_retnet, 70);
}  // namespace

}  // namespace attnlab
