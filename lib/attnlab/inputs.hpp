// Seeded input distributions for benchmarks and sweeps. Approximation error depends on the input
// more than on anything else, so the harness names its inputs with these strings and records
// them beside every result:
//
//   gaussian:temp=T      q, k, v entries i.i.d. normal; q and k scaled so the logits
//                        q·k / sqrt(D) have standard deviation 1/T: T small gives sharp attention
//                        (few keys matter), T large flat attention (close to a mean of v, which
//                        flatters low-rank and kernel approximations). Default T = 1.
//   lowrank:r=R,temp=T   q and k rows lie in one random R-dimensional subspace per (item, head),
//                        so the logit matrix has rank <= R (R <= D); logits scaled as above.
//   local:width=W,gap=G  positional structure: q_i = a·f(i) + c_i, k_j = a·f(j) + c'_j, where
//                        f are random Fourier features of a Gaussian kernel of width W positions
//                        (f(i)·f(j) ≈ exp(-(i-j)² / 2W²)) and c, c' Gaussian content of std 0.5.
//                        a is chosen so a key at distance 0 has a logit about G above a far key
//                        (default G = 6): attention concentrates within a few W of the diagonal.
// v is standard normal in every case. Each (item, head) slice has its own random stream derived
// from the seed, so the tensors do not depend on the number of threads.
//
// The per-token inputs of the variants whose support() takes them (make_token_inputs), the same
// for every distribution, from streams of their own (q, k, v do not change):
//   g    = log sigmoid(z) / 16, z ~ N(0, 1): GLA's gate (logsigmoid over its normaliser 16), decays
//          a = exp(g) of about 0.95 per token, between 0.8 and 1
//   beta = sigmoid(z'), z' ~ N(0, 1): DeltaNet's write strength
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnlab/attention.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

/// Queries, keys and values of one problem.
struct QKV {
  Tensor q;  ///< [B, H, N, D]
  Tensor k;  ///< [B, H, N, D]
  Tensor v;  ///< [B, H, N, D]
};

/// A parsed distribution string; parse_inputs throws Error quoting the text and the bad token.
struct InputDistribution {
  /// The distribution family.
  enum class Kind { gaussian, lowrank, local };
  Kind kind = Kind::gaussian;  ///< which family
  double temp = 1.0;           ///< gaussian, lowrank
  std::size_t rank = 0;        ///< lowrank: r
  double width = 32;           ///< local
  double gap = 6;              ///< local
};
/// Parses "gaussian:temp=T", "lowrank:r=R,temp=T" or "local:width=W,gap=G".
InputDistribution parse_inputs(const std::string& text);

/// Self-attention inputs q, k, v of shape [batch, heads, n, dim]. Throws Error when the
/// distribution does not fit the shape (lowrank r > dim).
QKV make_inputs(const std::string& distribution, std::size_t batch, std::size_t heads,
                std::size_t n, std::size_t dim, std::uint64_t seed);

/// The per-token inputs g and beta of one problem (see the header comment).
struct TokenValues {
  TokenTensor log_decay;  ///< g [B, H, N], < 0
  TokenTensor beta;       ///< beta [B, H, N], in (0, 1)
};

/// g and beta of shape [batch, heads, n] from `seed` (see the header comment).
TokenValues make_token_inputs(std::size_t batch, std::size_t heads, std::size_t n,
                              std::uint64_t seed);

/// How make_token_inputs draws g and beta, in words: what a sweep records in its meta.json.
extern const char* const kTokenInputsRecipe;

}  // namespace attnlab
