#include "models/weights.hpp"

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include <xtensor/xadapt.hpp>

#include "attnlab/error.hpp"
#include "attnlab/npy.hpp"
#include "attnlab/seed.hpp"

namespace attnlab::models {
namespace fs = std::filesystem;
namespace {

// FNV-1a: a name's hash that does not depend on the standard library's std::hash.
std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::mt19937_64 stream(std::uint64_t seed, const std::string& name) {
  return std::mt19937_64(stream_seed(seed, {name_hash(name)}));
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string file_of(const std::string& dir, const ParameterRef& p) {
  return (fs::path(dir) / (p.name + ".npy")).string();
}

}  // namespace

std::size_t ParameterRef::size() const {
  std::size_t n = 1;
  for (std::size_t s : shape) n *= s;
  return n;
}

ParameterRef parameter(const std::string& name, Matrix& m) {
  return {name, {m.shape()[0], m.shape()[1]}, m.data()};
}

ParameterRef parameter(const std::string& name, Vector& v) {
  return {name, {v.shape()[0]}, v.data()};
}

void save_weights(const std::string& dir, const Parameters& params) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("weights folder " + dir + ": cannot create it: " + ec.message());
  for (const ParameterRef& p : params)
    save_npy(file_of(dir, p), xt::adapt(p.data, p.size(), xt::no_ownership(), p.shape));
}

std::vector<std::string> load_weights(const std::string& dir, const Parameters& params) {
  if (!fs::is_directory(dir)) throw Error("weights folder " + dir + ": not a directory");
  std::vector<xt::xarray<float>> loaded;
  for (const ParameterRef& p : params) {
    const std::string path = file_of(dir, p);
    if (!fs::exists(path))
      throw Error(path + ": missing (expected parameter " + p.name + " of shape " +
                  shape_text(p.shape) + ")");
    xt::xarray<float> a = load_npy_float(path, {p.shape.size()});
    const std::vector<std::size_t> found(a.shape().begin(), a.shape().end());
    if (found != p.shape)
      throw Error(path + ": shape " + shape_text(found) + ", expected " + shape_text(p.shape) +
                  " for parameter " + p.name);
    loaded.push_back(std::move(a));
  }
  for (std::size_t i = 0; i < params.size(); ++i)
    std::copy(loaded[i].begin(), loaded[i].end(), params[i].data);

  std::set<std::string> used;
  for (const ParameterRef& p : params) used.insert(p.name + ".npy");
  std::vector<std::string> unused;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".npy" && !used.count(name)) unused.push_back(name);
  }
  std::sort(unused.begin(), unused.end());
  return unused;
}

void fill_uniform(const ParameterRef& p, double bound, std::uint64_t seed) {
  auto rng = stream(seed, p.name);
  std::uniform_real_distribution<double> uniform(-bound, bound);
  for (std::size_t i = 0; i < p.size(); ++i) p.data[i] = static_cast<float>(uniform(rng));
}

void fill_normal(const ParameterRef& p, double stddev, std::uint64_t seed) {
  auto rng = stream(seed, p.name);
  std::normal_distribution<double> normal(0.0, stddev);
  for (std::size_t i = 0; i < p.size(); ++i) p.data[i] = static_cast<float>(normal(rng));
}

void fill_constant(const ParameterRef& p, float value) {
  std::fill(p.data, p.data + p.size(), value);
}

}  // namespace attnlab::models
