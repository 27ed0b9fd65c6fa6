#include "harness/grid.hpp"

#include <algorithm>
#include <charconv>

#include "attnlab/error.hpp"
#include "attnlab/npy.hpp"
#include "harness/mask_spec.hpp"
#include "harness/peers.hpp"
#include "harness/trained_inputs.hpp"

namespace attnlab::harness {
namespace {

struct Shape {
  std::int64_t n, batch, heads, dim;
};

std::vector<Shape> shapes_of(const SweepConfig& c, const std::string& input) {
  std::vector<Shape> shapes;
  if (is_trained_input(input)) {
    // The model's heads and head size; the grid's lengths up to the one it was trained at.
    const TrainedShape t = trained_shape(parse_trained_input(input));
    std::string longer;
    for (auto n : c.n) {
      if (n > t.max_n) {
        longer += (longer.empty() ? "" : ", ") + std::to_string(n);
        continue;
      }
      for (auto b : c.batch) shapes.push_back({n, b, t.heads, t.dim});
    }
    if (shapes.empty())
      throw Error("input '" + input + "': n: the model serves N <= " + std::to_string(t.max_n) +
                  " (the length it was trained at), and the grid's n (" + longer +
                  ") has none of them");
    return shapes;
  }
  if (input.rfind("npy:", 0) == 0) {
    const std::string path = input.substr(4) + "/q.npy";
    const Tensor q = to_bhnd(load_npy_float(path), path);
    shapes.push_back({static_cast<std::int64_t>(q.shape(2)), static_cast<std::int64_t>(q.shape(0)),
                      static_cast<std::int64_t>(q.shape(1)),
                      static_cast<std::int64_t>(q.shape(3))});
    return shapes;
  }
  for (auto n : c.n)
    for (auto b : c.batch)
      for (auto h : c.heads)
        for (auto d : c.dim) shapes.push_back({n, b, h, d});
  return shapes;
}

}  // namespace

std::string point_key(const Point& p) {
  const std::string text = p.spec + "|" + std::to_string(p.n) + "|" + std::to_string(p.batch) +
                           "|" + std::to_string(p.heads) + "|" + std::to_string(p.dim) + "|" +
                           p.causal + "|" + p.input + "|" + std::to_string(p.seed) +
                           (p.mask == "none" ? "" : "|" + p.mask) +
                           (p.dtype == "float32" ? "" : "|" + p.dtype);
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<Point> make_grid(const SweepConfig& c) {
  std::vector<Point> grid;
  std::vector<MaskSpec> masks;
  for (const auto& text : c.mask) {
    masks.push_back(parse_mask_spec(text));
    if (masks.back().needs_causal() &&
        std::find_if(c.causal.begin(), c.causal.end(),
                     [](const std::string& x) { return x != "none"; }) == c.causal.end())
      throw Error("mask '" + text +
                  "': prefix-LM relaxes a causal mask, and the grid's causal has none (add "
                  "top-left)");
  }
  for (const auto& input : c.input) {
    // A causal model's q, k, v are measured under causal masks only.
    const bool causal_only =
        is_trained_input(input) && trained_shape(parse_trained_input(input)).causal;
    if (causal_only && std::find_if(c.causal.begin(), c.causal.end(), [](const std::string& x) {
                         return x != "none";
                       }) == c.causal.end())
      throw Error("input '" + input +
                  "': causal: the model is causal, so its q, k, v are measured under causal masks "
                  "only, and the grid's causal has none (add top-left)");
    for (auto seed : c.seed)
      for (const Shape& s : shapes_of(c, input))
        for (const auto& causal : c.causal)
          for (const MaskSpec& mask : masks) {
            if (causal_only && causal == "none") continue;
            if (mask.needs_causal() && causal == "none") continue;
            // Documents the shape cannot take are refused before any point runs (an npy
            // input's batch included).
            if (mask.kind == MaskSpec::Kind::documents && s.batch != 1)
              throw Error("mask '" + mask.text() +
                          "': packed documents take a batch of one, and the grid's batch has " +
                          std::to_string(s.batch) +
                          " (batch 1, or a mask axis without documents: --mask none)");
            if (mask.kind == MaskSpec::Kind::documents && mask.count > s.n)
              throw Error("mask '" + mask.text() + "': count=" + std::to_string(mask.count) +
                          ": more documents than the N = " + std::to_string(s.n) +
                          " tokens of a point of the grid (a mask axis without documents: "
                          "--mask none)");
            auto add = [&](const std::string& spec, const std::string& variant, bool peer,
                           const std::string& dtype) {
              Point p;
              p.index = grid.size();
              p.spec = spec;
              p.variant = variant;
              p.peer = peer;
              p.n = s.n, p.batch = s.batch, p.heads = s.heads, p.dim = s.dim, p.seed = seed;
              p.causal = causal;
              p.mask = mask.text();
              p.dtype = dtype;
              p.input = input;
              p.key = point_key(p);
              grid.push_back(std::move(p));
            };
            for (const auto& dtype : c.dtype) {
              for (const auto& spec : c.specs) {
                const auto limit = c.max_n.find(spec);
                if (limit != c.max_n.end() && s.n > limit->second) continue;
                add(spec, spec.substr(0, spec.find(':')), false, dtype);
              }
              if (c.peers && mask.kind == MaskSpec::Kind::none && dtype == "float32")
                for (const auto& name : peer_names()) add("peer:" + name, name, true, dtype);
            }
          }
  }
  return grid;
}

Shard parse_shard(const std::string& text) {
  Shard s;
  const auto slash = text.find('/');
  auto parse = [&](std::string_view t, int& out) {
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
    return !t.empty() && ec == std::errc() && end == t.data() + t.size();
  };
  if (slash == std::string::npos || !parse(std::string_view(text).substr(0, slash), s.index) ||
      !parse(std::string_view(text).substr(slash + 1), s.count) || s.count < 1 || s.index < 1 ||
      s.index > s.count)
    throw Error("--shard '" + text + "': expected I/N with 1 <= I <= N (e.g. 2/4)");
  return s;
}

}  // namespace attnlab::harness
