#include "attnlab/inputs.hpp"

#include <charconv>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "attnlab/error.hpp"
#include "attnlab/seed.hpp"

namespace attnlab {
namespace {

// One independent stream per (seed, purpose, item, head).
std::mt19937_64 stream(std::uint64_t seed, std::uint64_t purpose, std::size_t b, std::size_t h) {
  return std::mt19937_64(stream_seed(seed, {purpose, b << 20 | h}));
}

[[noreturn]] void fail(const std::string& text, const std::string& why) {
  throw Error("input distribution '" + text + "': " + why +
              " (expected gaussian:temp=T, lowrank:r=R[,temp=T], local:width=W[,gap=G], "
              "npy:<dir> or trained:DIR[,layer=L])");
}

double positive(const std::string& text, const std::string& key, const std::string& value) {
  double x = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || !(x > 0) ||
      !std::isfinite(x))
    fail(text, key + "=" + value + ": expected a positive number");
  return x;
}

// Fills [b, h, :, :] of every tensor, one (item, head) slice per task.
template <class F>
void per_slice(std::size_t batch, std::size_t heads, F&& fill) {
  const auto slices = static_cast<std::ptrdiff_t>(batch * heads);
#pragma omp parallel for schedule(dynamic, 1)
  for (std::ptrdiff_t s = 0; s < slices; ++s)
    fill(static_cast<std::size_t>(s) / heads, static_cast<std::size_t>(s) % heads);
}

}  // namespace

InputDistribution parse_inputs(const std::string& text) {
  InputDistribution dist;
  const auto colon = text.find(':');
  const std::string name = text.substr(0, colon);
  if (name == "gaussian")
    dist.kind = InputDistribution::Kind::gaussian;
  else if (name == "lowrank")
    dist.kind = InputDistribution::Kind::lowrank;
  else if (name == "local")
    dist.kind = InputDistribution::Kind::local;
  else
    fail(text, "unknown distribution '" + name + "'");

  bool has_rank = false;
  std::string rest = colon == std::string::npos ? "" : text.substr(colon + 1);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string token = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    const auto eq = token.find('=');
    if (eq == std::string::npos) fail(text, "token '" + token + "' is not key=value");
    const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
    const bool gaussian_like = dist.kind != InputDistribution::Kind::local;
    if (key == "temp" && gaussian_like) {
      dist.temp = positive(text, key, value);
    } else if (key == "r" && dist.kind == InputDistribution::Kind::lowrank) {
      const double r = positive(text, key, value);
      // The bound keeps the cast below defined; a rank that large exceeds any dim anyway.
      if (r != std::floor(r) || r > 4294967295.0)
        fail(text, "r=" + value + ": expected a positive integer below 2^32");
      dist.rank = static_cast<std::size_t>(r);
      has_rank = true;
    } else if (key == "width" && !gaussian_like) {
      dist.width = positive(text, key, value);
    } else if (key == "gap" && !gaussian_like) {
      dist.gap = positive(text, key, value);
    } else {
      fail(text, "unknown key '" + key + "' for " + name);
    }
  }
  if (dist.kind == InputDistribution::Kind::lowrank && !has_rank) fail(text, "lowrank needs r=R");
  return dist;
}

QKV make_inputs(const std::string& distribution, std::size_t batch, std::size_t heads,
                std::size_t n, std::size_t dim, std::uint64_t seed) {
  const InputDistribution dist = parse_inputs(distribution);
  if (dist.kind == InputDistribution::Kind::lowrank && dist.rank > dim)
    fail(distribution, "r=" + std::to_string(dist.rank) + " exceeds dim " + std::to_string(dim));
  QKV t{Tensor::from_shape({batch, heads, n, dim}), Tensor::from_shape({batch, heads, n, dim}),
        Tensor::from_shape({batch, heads, n, dim})};
  const double d = static_cast<double>(dim);

  per_slice(batch, heads, [&](std::size_t b, std::size_t h) {
    std::normal_distribution<double> normal(0.0, 1.0);
    auto rng_v = stream(seed, 3, b, h);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t c = 0; c < dim; ++c) t.v(b, h, i, c) = static_cast<float>(normal(rng_v));

    auto rng = stream(seed, static_cast<std::uint64_t>(dist.kind), b, h);
    switch (dist.kind) {
      case InputDistribution::Kind::gaussian: {
        // q·k / sqrt(D) with entries of std s has std s²: s = 1 / sqrt(T).
        const double s = 1.0 / std::sqrt(dist.temp);
        for (Tensor* x : {&t.q, &t.k})
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t c = 0; c < dim; ++c)
              (*x)(b, h, i, c) = static_cast<float>(s * normal(rng));
        break;
      }
      case InputDistribution::Kind::lowrank: {
        // Orthonormal basis U [R x D] (Gram-Schmidt); rows g·U·s have logits of std s²·sqrt(R/D).
        const std::size_t r = dist.rank;
        std::vector<double> u(r * dim);
        for (std::size_t a = 0; a < r; ++a) {
          double* row = &u[a * dim];
          for (std::size_t c = 0; c < dim; ++c) row[c] = normal(rng);
          for (int pass = 0; pass < 2; ++pass)  // twice is enough for float-level orthogonality
            for (std::size_t p = 0; p < a; ++p) {
              double dot = 0;
              for (std::size_t c = 0; c < dim; ++c) dot += row[c] * u[p * dim + c];
              for (std::size_t c = 0; c < dim; ++c) row[c] -= dot * u[p * dim + c];
            }
          double norm = 0;
          for (std::size_t c = 0; c < dim; ++c) norm += row[c] * row[c];
          for (std::size_t c = 0; c < dim; ++c) row[c] /= std::sqrt(norm);
        }
        const double s = std::sqrt(std::sqrt(d / static_cast<double>(r)) / dist.temp);
        std::vector<double> g(r);
        for (Tensor* x : {&t.q, &t.k})
          for (std::size_t i = 0; i < n; ++i) {
            for (double& z : g) z = normal(rng);
            for (std::size_t c = 0; c < dim; ++c) {
              double sum = 0;
              for (std::size_t a = 0; a < r; ++a) sum += g[a] * u[a * dim + c];
              (*x)(b, h, i, c) = static_cast<float>(s * sum);
            }
          }
        break;
      }
      case InputDistribution::Kind::local: {
        // Random Fourier features: f(i)_c = sqrt(2/D) cos(w_c i + phi_c), w ~ N(0, 1/W²), so
        // E f(i)·f(j) = exp(-(i-j)² / 2W²) and f(i)·f(i) ≈ 1. The logit of a·f(i) against a·f(j)
        // is a² f(i)·f(j) / sqrt(D): a² = G sqrt(D) puts the diagonal G above far keys.
        std::vector<double> w(dim), phi(dim);
        std::uniform_real_distribution<double> angle(0.0, 2.0 * std::numbers::pi);
        for (std::size_t c = 0; c < dim; ++c) {
          w[c] = normal(rng) / dist.width;
          phi[c] = angle(rng);
        }
        const double a = std::sqrt(dist.gap * std::sqrt(d)), norm = std::sqrt(2.0 / d);
        for (Tensor* x : {&t.q, &t.k})
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t c = 0; c < dim; ++c) {
              const double f = norm * std::cos(w[c] * static_cast<double>(i) + phi[c]);
              (*x)(b, h, i, c) = static_cast<float>(a * f + 0.5 * normal(rng));
            }
        break;
      }
    }
  });
  return t;
}

const char* const kTokenInputsRecipe =
    "g = log sigmoid(z) / 16 and beta = sigmoid(z'), z and z' ~ N(0, 1) per (item, head, "
    "token), each from its own stream of (seed, item, head) (lib/attnlab/inputs.hpp)";

TokenValues make_token_inputs(std::size_t batch, std::size_t heads, std::size_t n,
                              std::uint64_t seed) {
  TokenValues t{TokenTensor::from_shape({batch, heads, n}),
                TokenTensor::from_shape({batch, heads, n})};
  per_slice(batch, heads, [&](std::size_t b, std::size_t h) {
    std::normal_distribution<double> normal(0.0, 1.0);
    auto rng_g = stream(seed, 4, b, h), rng_beta = stream(seed, 5, b, h);
    for (std::size_t i = 0; i < n; ++i) {
      // log sigmoid(z) = -log(1 + e^-z), in the form that does not overflow for z < 0.
      const double z = normal(rng_g);
      const double log_sigmoid = z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z));
      t.log_decay(b, h, i) = static_cast<float>(log_sigmoid / 16.0);
      t.beta(b, h, i) = static_cast<float>(1.0 / (1.0 + std::exp(-normal(rng_beta))));
    }
  });
  return t;
}

}  // namespace attnlab
