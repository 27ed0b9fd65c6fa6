#include "attnlab/npy.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include "attnlab/error.hpp"

namespace attnlab {
namespace {

// .npy data is little-endian here; reading it by memcpy needs a little-endian host.
static_assert(std::endian::native == std::endian::little, "npy I/O assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
// numpy writes headers of a few hundred bytes; a longer one is corrupt (numpy itself refuses
// headers over 10000 bytes unless told otherwise).
constexpr std::size_t kMaxHeader = 65536;

enum class Dtype { f32, f64, b1, u1, i4, i8 };

struct Header {
  Dtype dtype;
  std::vector<std::size_t> shape;
  std::size_t data_offset = 0;
};

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(path + ": " + why);
}

std::string read_all(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "no such file");
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, expected a .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open: ") + std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) fail(path, "read error");
  return std::move(bytes).str();
}

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string index_text(std::size_t flat, const std::vector<std::size_t>& shape) {
  std::vector<std::size_t> idx(shape.size());
  for (std::size_t a = shape.size(); a-- > 0;) {
    idx[a] = flat % shape[a];
    flat /= shape[a];
  }
  std::string s = "[";
  for (std::size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

// The value of `key` in the header dict: a quoted string, a word or a parenthesised tuple.
std::string dict_value(const std::string& path, const std::string& dict, const std::string& key) {
  auto pos = dict.find("'" + key + "'");
  if (pos == std::string::npos) pos = dict.find("\"" + key + "\"");
  if (pos == std::string::npos) fail(path, "bad .npy header: no '" + key + "' in " + dict);
  pos = dict.find(':', pos);
  if (pos == std::string::npos) fail(path, "bad .npy header: no value for '" + key + "'");
  pos = dict.find_first_not_of(" \t", pos + 1);
  if (pos == std::string::npos) fail(path, "bad .npy header: no value for '" + key + "'");
  const char open = dict[pos];
  std::size_t end = std::string::npos;
  if (open == '\'' || open == '"') {
    end = dict.find(open, pos + 1);
    if (end != std::string::npos) return dict.substr(pos + 1, end - pos - 1);
  } else if (open == '(') {
    end = dict.find(')', pos);
    if (end != std::string::npos) return dict.substr(pos + 1, end - pos - 1);
  } else {
    end = dict.find_first_of(",}", pos);
    if (end != std::string::npos) {
      const auto last = dict.find_last_not_of(" \t", end - 1);
      return dict.substr(pos, last + 1 - pos);
    }
  }
  fail(path, "bad .npy header: unterminated value for '" + key + "'");
}

Dtype parse_dtype(const std::string& path, const std::string& descr) {
  if (descr == "<f4") return Dtype::f32;
  if (descr == "<f8") return Dtype::f64;
  if (descr == "|b1" || descr == "<b1" || descr == ">b1") return Dtype::b1;
  if (descr == "|u1" || descr == "<u1" || descr == ">u1") return Dtype::u1;
  if (descr == "<i4") return Dtype::i4;
  if (descr == "<i8") return Dtype::i8;
  fail(path, "dtype '" + descr + "' is not accepted (expected float32 '<f4' or float64 '<f8'; " +
                 "bool '|b1' or uint8 '|u1' for masks; int32 '<i4' or int64 '<i8' for offsets " +
                 "and lengths)");
}

std::vector<std::size_t> parse_shape(const std::string& path, const std::string& text) {
  const auto bad = [&] {
    fail(path, "bad .npy header: shape '(" + text + ")' is not a tuple of non-negative integers");
  };
  std::vector<std::size_t> shape;
  std::size_t pos = 0;
  while (true) {
    pos = text.find_first_not_of(" \t", pos);
    if (pos == std::string::npos) break;
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(text.data() + pos, text.data() + text.size(), n);
    if (ec != std::errc()) bad();  // not digits ('-1', 'x'), or beyond 64 bits
    shape.push_back(static_cast<std::size_t>(n));
    pos = text.find_first_not_of(" \t", static_cast<std::size_t>(end - text.data()));
    if (pos == std::string::npos) break;
    if (text[pos] != ',') bad();
    ++pos;
  }
  return shape;
}

Header parse_header(const std::string& path, const std::string& bytes) {
  if (bytes.size() < kMagicLen + 4 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0)
    fail(path, "not a .npy file (bad magic: the file must start with \\x93NUMPY)");
  const auto major = static_cast<unsigned char>(bytes[6]);
  const auto byte = [&](std::size_t i) {
    return std::size_t(static_cast<unsigned char>(bytes[i]));
  };
  std::size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = byte(8) | byte(9) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(path, "truncated .npy header");
    header_len = byte(8) | byte(9) << 8 | byte(10) << 16 | byte(11) << 24;
    start = 12;
  } else {
    fail(path,
         "unsupported .npy format version " + std::to_string(major) + " (expected 1, 2 or 3)");
  }
  if (header_len > kMaxHeader)
    fail(path, "bad .npy header: " + std::to_string(header_len) + " bytes long, more than the " +
                   std::to_string(kMaxHeader) + " accepted");
  if (start + header_len > bytes.size()) fail(path, "truncated .npy header");
  const std::string dict = bytes.substr(start, header_len);
  if (dict.find('{') == std::string::npos || dict.find('}') == std::string::npos)
    fail(path, "bad .npy header: expected a dict, got '" + dict + "'");

  Header h;
  h.dtype = parse_dtype(path, dict_value(path, dict, "descr"));
  const std::string fortran = dict_value(path, dict, "fortran_order");
  if (fortran == "True")
    fail(path, "array is in Fortran order; save it in C order (numpy.ascontiguousarray)");
  if (fortran != "False") fail(path, "bad .npy header: fortran_order is '" + fortran + "'");
  h.shape = parse_shape(path, dict_value(path, dict, "shape"));
  h.data_offset = start + header_len;
  return h;
}

std::size_t item_size(Dtype d) {
  return d == Dtype::f64 || d == Dtype::i8 ? 8 : d == Dtype::f32 || d == Dtype::i4 ? 4 : 1;
}

// Parses the header and checks the rank and the data length; returns the element count.
std::size_t check_layout(const std::string& path, const std::string& bytes, const Header& h,
                         const std::vector<std::size_t>& ranks) {
  if (std::find(ranks.begin(), ranks.end(), h.shape.size()) == ranks.end()) {
    std::string expected;
    for (std::size_t r : ranks) expected += (expected.empty() ? "" : " or ") + std::to_string(r);
    fail(path, "array has rank " + std::to_string(h.shape.size()) + " (shape " +
                   shape_text(h.shape) + "), expected rank " + expected);
  }
  // The product of the non-zero dimensions must fit too: a zero dimension makes the element
  // count 0, but the tensor's strides are still products of the others (signed 64-bit).
  std::int64_t nonzero = 1, nonzero_bytes = 0;
  bool empty = false;
  for (std::size_t n : h.shape) {
    empty |= n == 0;
    if (n != 0 && __builtin_mul_overflow(nonzero, n, &nonzero))
      fail(path, "shape " + shape_text(h.shape) + " has more elements than fit in 64 bits");
  }
  if (__builtin_mul_overflow(nonzero, static_cast<std::int64_t>(item_size(h.dtype)),
                             &nonzero_bytes))
    fail(path, "shape " + shape_text(h.shape) + " needs more bytes than fit in 64 bits");
  const auto count = empty ? std::size_t{0} : static_cast<std::size_t>(nonzero);
  const auto need = empty ? std::size_t{0} : static_cast<std::size_t>(nonzero_bytes);
  const std::size_t have = bytes.size() - h.data_offset;
  if (have < need)
    fail(path, "truncated: shape " + shape_text(h.shape) + " needs " + std::to_string(need) +
                   " bytes of data, the file holds " + std::to_string(have));
  if (have > need)
    fail(path, std::to_string(have - need) + " unexpected bytes after the data of shape " +
                   shape_text(h.shape));
  return count;
}

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::f32:
      return "<f4";
    case Dtype::f64:
      return "<f8";
    case Dtype::b1:
      return "|b1";
    case Dtype::u1:
      return "|u1";
    case Dtype::i4:
      return "<i4";
    default:
      return "<i8";
  }
}

}  // namespace

xt::xarray<float> load_npy_float(const std::string& path, const std::vector<std::size_t>& ranks) {
  const std::string bytes = read_all(path);
  const Header h = parse_header(path, bytes);
  if (h.dtype != Dtype::f32 && h.dtype != Dtype::f64)
    fail(path, std::string("dtype '") + dtype_name(h.dtype) +
                   "' is not accepted (expected float32 '<f4' or float64 '<f8')");
  const std::size_t count = check_layout(path, bytes, h, ranks);
  xt::xarray<float> a = xt::xarray<float>::from_shape(h.shape);
  const char* data = bytes.data() + h.data_offset;
  for (std::size_t i = 0; i < count; ++i) {
    double x = 0;
    if (h.dtype == Dtype::f32) {
      float f = 0;
      std::memcpy(&f, data + 4 * i, 4);
      x = f;
    } else {
      std::memcpy(&x, data + 8 * i, 8);
    }
    if (!std::isfinite(x))
      fail(path, std::string(std::isnan(x) ? "NaN" : "Inf") + " at index " +
                     index_text(i, h.shape) + " of shape " + shape_text(h.shape));
    a.data()[i] = static_cast<float>(x);
  }
  return a;
}

xt::xarray<bool> load_npy_mask(const std::string& path, const std::vector<std::size_t>& ranks) {
  const std::string bytes = read_all(path);
  const Header h = parse_header(path, bytes);
  if (h.dtype != Dtype::b1 && h.dtype != Dtype::u1)
    fail(path, std::string("dtype '") + dtype_name(h.dtype) +
                   "' is not accepted for a mask (expected bool '|b1' or uint8 '|u1')");
  const std::size_t count = check_layout(path, bytes, h, ranks);
  xt::xarray<bool> a = xt::xarray<bool>::from_shape(h.shape);
  for (std::size_t i = 0; i < count; ++i) {
    const auto v = static_cast<unsigned char>(bytes[h.data_offset + i]);
    if (v > 1)
      fail(path, "mask value " + std::to_string(v) + " at index " + index_text(i, h.shape) +
                     ": expected 0 or 1");
    a.data()[i] = v == 1;
  }
  return a;
}

std::vector<std::int64_t> load_npy_ints(const std::string& path) {
  const std::string bytes = read_all(path);
  const Header h = parse_header(path, bytes);
  if (h.dtype != Dtype::i4 && h.dtype != Dtype::i8)
    fail(path, std::string("dtype '") + dtype_name(h.dtype) +
                   "' is not accepted for integers (expected int32 '<i4' or int64 '<i8')");
  const std::size_t count = check_layout(path, bytes, h, {1});
  std::vector<std::int64_t> out(count);
  const char* data = bytes.data() + h.data_offset;
  for (std::size_t i = 0; i < count; ++i) {
    if (h.dtype == Dtype::i4) {
      std::int32_t x = 0;
      std::memcpy(&x, data + 4 * i, 4);
      out[i] = x;
    } else {
      std::memcpy(&out[i], data + 8 * i, 8);
    }
  }
  return out;
}

void save_npy(const std::string& path, const xt::xarray<float>& a) {
  std::vector<std::size_t> shape(a.shape().begin(), a.shape().end());
  std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  // numpy pads the header with spaces so the data starts on a 64-byte boundary.
  const std::size_t unpadded = kMagicLen + 4 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::string header(kMagic, kMagicLen);
  header += '\x01';
  header += '\x00';
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>(dict.size() >> 8);
  header += dict;

  // POSIX calls so that a failure says why (ENOSPC, EFBIG, EACCES); the temporary file goes.
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, std::string("cannot write: ") + std::strerror(errno));
  const auto give_up = [&](const char* what) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(path, std::string("cannot write: ") + what + ": " + why);
  };
  const auto put = [&](const char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) give_up("write");
      p += w, n -= static_cast<std::size_t>(w);
    }
  };
  put(header.data(), header.size());
  put(reinterpret_cast<const char*>(a.data()), a.size() * sizeof(float));
  if (::fsync(fd) != 0) give_up("fsync");
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    fail(path, "cannot write: " + why);
  }
}

Tensor to_bhnd(const xt::xarray<float>& a, const std::string& what) {
  const auto& s = a.shape();
  Tensor t;
  if (s.size() == 2)
    t = Tensor::from_shape({1, 1, s[0], s[1]});
  else if (s.size() == 3)
    t = Tensor::from_shape({1, s[0], s[1], s[2]});
  else if (s.size() == 4)
    t = Tensor::from_shape({s[0], s[1], s[2], s[3]});
  else
    throw Error(what + ": rank " + std::to_string(s.size()) +
                ", expected [N, D], [H, N, D] or [B, H, N, D]");
  std::copy(a.begin(), a.end(), t.begin());
  return t;
}

xt::xtensor<bool, 4> mask_to_bhnd(const xt::xarray<bool>& a, const std::string& what) {
  const auto& s = a.shape();
  xt::xtensor<bool, 4> t;
  if (s.size() == 2)
    t = xt::xtensor<bool, 4>::from_shape({1, 1, s[0], s[1]});
  else if (s.size() == 3)
    t = xt::xtensor<bool, 4>::from_shape({1, s[0], s[1], s[2]});
  else if (s.size() == 4)
    t = xt::xtensor<bool, 4>::from_shape({s[0], s[1], s[2], s[3]});
  else
    throw Error(what + ": rank " + std::to_string(s.size()) +
                ", expected [Nq, Nk], [H, Nq, Nk] or [B, H, Nq, Nk]");
  std::copy(a.begin(), a.end(), t.begin());
  return t;
}

xt::xarray<float> from_bhnd(const Tensor& t, std::size_t rank) {
  if (rank < 2 || rank > 4)
    throw Error("output rank " + std::to_string(rank) + ": expected 2, 3 or 4");
  const auto& s = t.shape();
  for (std::size_t a = 0; a < 4 - rank; ++a)
    if (s[a] != 1)
      throw Error("cannot write a " + shape_string(t) + " tensor with rank " +
                  std::to_string(rank) + ": axis " + std::to_string(a) + " is not 1");
  std::vector<std::size_t> shape(s.begin() + static_cast<std::ptrdiff_t>(4 - rank), s.end());
  xt::xarray<float> a = xt::xarray<float>::from_shape(shape);
  std::copy(t.begin(), t.end(), a.begin());
  return a;
}

}  // namespace attnlab
