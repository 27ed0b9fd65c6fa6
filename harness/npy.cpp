#include "harness/npy.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <vector>

#include "attnlab/error.hpp"

namespace attnlab::harness {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

std::string header_value(const std::string& header, const std::string& key) {
  const auto at = header.find("'" + key + "'");
  if (at == std::string::npos) return "";
  auto colon = header.find(':', at);
  auto start = header.find_first_not_of(' ', colon + 1);
  if (header[start] == '(') return header.substr(start, header.find(')', start) - start + 1);
  const auto end = header.find_first_of(",}", start);
  return header.substr(start, end - start);
}

}  // namespace

void save_npy(const std::string& path, const Tensor& t) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (std::size_t s : t.shape()) header += std::to_string(s) + ", ";
  header += "), }";
  // Magic (6) + version (2) + length (2) + header + '\n' padded to a multiple of 64.
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error("npy: cannot write '" + path + "'");
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const std::uint16_t len = static_cast<std::uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(t.data()),
            static_cast<std::streamsize>(t.size() * sizeof(float)));
  if (!out) throw Error("npy: writing '" + path + "' failed");
}

Tensor load_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("npy: cannot open '" + path + "'");
  char magic[8] = {};
  in.read(magic, 8);
  if (!in || std::memcmp(magic, kMagic, 6) != 0)
    throw Error("npy: '" + path + "' is not a .npy file");
  std::uint32_t len = 0;
  unsigned char b[4] = {};
  const int major = magic[6];
  in.read(reinterpret_cast<char*>(b), major == 1 ? 2 : 4);
  len = b[0] | (b[1] << 8) | (major == 1 ? 0u : (std::uint32_t(b[2]) << 16 | std::uint32_t(b[3]) << 24));
  std::string header(len, '\0');
  in.read(header.data(), len);
  if (!in) throw Error("npy: '" + path + "': truncated header");

  const std::string descr = header_value(header, "descr");
  const bool f32 = descr == "'<f4'", f64 = descr == "'<f8'";
  if (!f32 && !f64)
    throw Error("npy: '" + path + "': dtype " + descr + " (expected float32 '<f4' or float64 '<f8')");
  if (header_value(header, "fortran_order") != "False")
    throw Error("npy: '" + path + "': fortran_order arrays are not supported (use C order)");
  std::vector<std::size_t> shape;
  const std::string dims = header_value(header, "shape");
  for (std::size_t i = 1; i < dims.size();) {
    const auto end = dims.find_first_of(",)", i);
    const std::string token = dims.substr(i, end - i);
    if (token.find_first_not_of(' ') != std::string::npos) shape.push_back(std::stoull(token));
    i = end + 1;
  }
  if (shape.size() != 4)
    throw Error("npy: '" + path + "': shape " + dims + " has rank " +
                std::to_string(shape.size()) + " (expected 4: [batch, heads, seq, dim])");

  Tensor t = Tensor::from_shape({shape[0], shape[1], shape[2], shape[3]});
  if (f32) {
    in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.size() * 4));
  } else {
    std::vector<double> buf(t.size());
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size() * 8));
    for (std::size_t i = 0; i < buf.size(); ++i) t.data()[i] = static_cast<float>(buf[i]);
  }
  if (!in) throw Error("npy: '" + path + "': file shorter than its shape " + dims);
  return t;
}

}  // namespace attnlab::harness
