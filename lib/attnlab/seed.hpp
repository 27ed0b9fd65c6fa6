// SplitMix64 (Steele, Lea & Flood 2014), the one seeded generator of the library: the hash that
// turns a seed and a stream's coordinates into the seed of a std::mt19937_64 (the inputs, the
// model weights, the training tasks and the trainer's batches), and the stateful stream bigbird
// draws its random blocks from. Both are portable: a seed gives the same numbers with every
// compiler and standard library. Internal (not installed).
#pragma once

#include <cstdint>
#include <initializer_list>

namespace attnlab {

/// SplitMix64's output for state `x` (a bijective 64-bit hash): its stream is
/// splitmix64(s), splitmix64(s + gamma), splitmix64(s + 2 gamma), ...
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;  // gamma, the stream's increment
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// The next number of the SplitMix64 stream whose state is `state`, which it advances.
constexpr std::uint64_t splitmix64_next(std::uint64_t& state) {
  const std::uint64_t out = splitmix64(state);
  state += 0x9e3779b97f4a7c15ull;
  return out;
}

/// The seed of one independent stream: x = splitmix64(seed), then x = splitmix64(x ^ c) for each
/// coordinate c in turn (a purpose, an item, a head, a name's hash...).
constexpr std::uint64_t stream_seed(std::uint64_t seed,
                                    std::initializer_list<std::uint64_t> coordinates = {}) {
  std::uint64_t x = splitmix64(seed);
  for (const std::uint64_t c : coordinates) x = splitmix64(x ^ c);
  return x;
}

}  // namespace attnlab
