#include "harness/mask_spec.hpp"

#include <charconv>
#include <cmath>
#include <sstream>
#include <utility>

#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"

namespace attnlab::harness {
namespace {

constexpr SpecKind kMaskSpec{"mask", "mask"};

std::string number_text(double x) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, res.ptr);
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

std::string MaskSpec::text() const {
  switch (kind) {
    case Kind::documents:
      return "documents:count=" + std::to_string(count);
    case Kind::prefix:
      return "prefix:frac=" + number_text(frac);
    case Kind::window:
      return "window:left=" + std::to_string(left) + ",right=" + std::to_string(right);
    default:
      return "none";
  }
}

MaskSpec parse_mask_spec(const std::string& text) {
  Params p(trim(text), kMaskSpec);
  MaskSpec s;
  // Every key is read before any is judged, so that an unknown key is named first.
  if (p.name() == "documents") {
    s.kind = MaskSpec::Kind::documents;
    s.count = p.integer("count", 0);
  } else if (p.name() == "prefix") {
    s.kind = MaskSpec::Kind::prefix;
    s.frac = p.number("frac", -1);
  } else if (p.name() == "window") {
    s.kind = MaskSpec::Kind::window;
    s.left = p.integer("left", -2);
    s.right = p.integer("right", s.left);
  } else if (p.name() != "none") {
    throw Error("mask '" + text + "': unknown mask '" + p.name() +
                "' (known: none, documents, prefix, window)");
  }
  p.check_all_used();
  if (s.kind == MaskSpec::Kind::documents && s.count < 1)
    p.fail("count", "expected the number of documents, an integer >= 1");
  if (s.kind == MaskSpec::Kind::prefix && !(s.frac >= 0 && s.frac <= 1))
    p.fail("frac", "expected the prefix's fraction of the sequence, in [0, 1]");
  if (s.kind == MaskSpec::Kind::window)
    for (const auto& [key, value] : {std::pair{"left", s.left}, {"right", s.right}})
      if (value < -1) p.fail(key, "expected -1 (unbounded) or an integer >= 0");
  return s;
}

void add_mask_part(const MaskSpec& spec, std::size_t n, std::size_t batch, Mask& mask) {
  const auto fail = [&](const std::string& why) {
    throw Error("mask '" + spec.text() + "': " + why);
  };
  switch (spec.kind) {
    case MaskSpec::Kind::documents: {
      if (batch != 1)
        fail("packed documents take a batch of one, and the point has batch = " +
             std::to_string(batch));
      const auto count = static_cast<std::size_t>(spec.count);
      if (count > n)
        fail("count=" + std::to_string(count) +
             ": more documents than the N = " + std::to_string(n) + " tokens");
      mask.documents.clear();
      for (std::size_t d = 0; d <= count; ++d)
        mask.documents.push_back(static_cast<std::int64_t>(d * n / count));
      break;
    }
    case MaskSpec::Kind::prefix:
      if (mask.causal == Causal::none)
        fail("prefix-LM relaxes a causal mask, and the point has causal = none");
      mask.prefix_lengths.assign(
          batch, static_cast<std::int64_t>(std::floor(spec.frac * static_cast<double>(n))));
      break;
    case MaskSpec::Kind::window:
      mask.window = Window{spec.left, spec.right};
      break;
    default:
      break;
  }
}

std::vector<std::string> parse_mask_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ';');) {
    try {
      out.push_back(parse_mask_spec(item).text());
    } catch (const Error& e) {
      throw Error(flag + ": " + e.what());
    }
  }
  if (out.empty()) throw Error(flag + ": no mask given");
  return out;
}

}  // namespace attnlab::harness
