// .npy I/O: round trips for every accepted dtype and rank, every error path with its message, and
// a cross-check against numpy itself (skipped, with a warning, when /usr/bin/python3 lacks numpy).
#include <cmath>
#include <cstdlib>
#include <limits>

#include "attnlab/npy.hpp"
#include "helpers.hpp"
#include "npy_helpers.hpp"

using namespace attnlab;
using attnlab::test::raw_bytes;
using attnlab::test::require_error;
using attnlab::test::TempDir;
using attnlab::test::write_npy_raw;

namespace {

// Runs `f`, expects an Error whose message contains every fragment.
xt::xarray<float> counting(std::vector<std::size_t> shape) {
  xt::xarray<float> a = xt::xarray<float>::from_shape(shape);
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = 0.25f * static_cast<float>(i) - 3.0f;
  return a;
}

// xtensor's == returns bool for whole arrays, but Catch's expression capture cannot wrap it.
bool same(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  return a == b;
}

bool have_numpy() {
  return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

}  // namespace

TEST_CASE("float32 arrays of rank 2, 3 and 4 round-trip bitwise", "[npy]") {
  TempDir dir("npy");
  for (const auto& shape :
       std::vector<std::vector<std::size_t>>{{3, 5}, {2, 3, 5}, {2, 1, 3, 5}, {1, 1}}) {
    const auto a = counting(shape);
    const std::string path = dir.file("a.npy");
    save_npy(path, a);
    const auto b = load_npy_float(path);
    REQUIRE(b.shape() == a.shape());
    CHECK(same(b, a));  // float32 written and read back: no conversion at all
  }
}

TEST_CASE("float64 is read and rounded to float32; format 2.0 is read", "[npy]") {
  TempDir dir("npy");
  const std::vector<double> values = {0.1, -2.5, 1e-3, 3.0, 1.0 / 3.0, -7.0};
  write_npy_raw(dir.file("d.npy"), "<f8", "2, 3", raw_bytes(values));
  const auto a = load_npy_float(dir.file("d.npy"));
  REQUIRE(a.shape() == std::vector<std::size_t>{2, 3});
  for (std::size_t i = 0; i < values.size(); ++i)
    CHECK(a.data()[i] == static_cast<float>(values[i]));

  const std::vector<float> f = {1, 2, 3, 4, 5, 6, 7, 8};
  write_npy_raw(dir.file("v2.npy"), "<f4", "1, 2, 2, 2", raw_bytes(f), false, 2);
  const auto b = load_npy_float(dir.file("v2.npy"));
  REQUIRE(b.dimension() == 4);
  CHECK(b(0, 1, 1, 1) == 8.0f);
}

TEST_CASE("bool and uint8 masks are read, and lifted to [B,H,Nq,Nk]", "[npy]") {
  TempDir dir("npy");
  write_npy_raw(dir.file("b.npy"), "|b1", "2, 3", std::string("\1\0\1\0\0\1", 6));
  write_npy_raw(dir.file("u.npy"), "|u1", "2, 2, 3", std::string("\1\1\1\0\0\0\1\0\1\0\1\0", 12));
  const auto b = load_npy_mask(dir.file("b.npy"));
  REQUIRE(b.shape() == std::vector<std::size_t>{2, 3});
  CHECK(b(0, 0));
  CHECK_FALSE(b(0, 1));
  CHECK(b(1, 2));
  const auto m = mask_to_bhnd(b, "b.npy");
  CHECK(m.shape() == std::array<std::size_t, 4>{1, 1, 2, 3});
  CHECK(m(0, 0, 1, 2));

  const auto u = mask_to_bhnd(load_npy_mask(dir.file("u.npy")), "u.npy");
  CHECK(u.shape() == std::array<std::size_t, 4>{1, 2, 2, 3});
  CHECK(u(0, 0, 0, 2));
  CHECK_FALSE(u(0, 1, 0, 1));
  CHECK(u(0, 1, 0, 0));
}

TEST_CASE("to_bhnd and from_bhnd lift and restore ranks 2, 3, 4", "[npy]") {
  const auto a2 = counting({4, 3}), a3 = counting({2, 4, 3}), a4 = counting({2, 2, 4, 3});
  const Tensor t2 = to_bhnd(a2, "a2"), t3 = to_bhnd(a3, "a3"), t4 = to_bhnd(a4, "a4");
  CHECK(shape_string(t2) == "[1, 1, 4, 3]");
  CHECK(shape_string(t3) == "[1, 2, 4, 3]");
  CHECK(shape_string(t4) == "[2, 2, 4, 3]");
  CHECK(t3(0, 1, 2, 0) == a3(1, 2, 0));
  CHECK(same(from_bhnd(t2, 2), a2));
  CHECK(same(from_bhnd(t3, 3), a3));
  CHECK(same(from_bhnd(t4, 4), a4));
  require_error([&] { from_bhnd(t4, 3); }, {"[2, 2, 4, 3]", "rank 3", "axis 0"});
  require_error([&] { to_bhnd(counting({5}), "x.npy"); }, {"x.npy", "rank 1", "[N, D]"});
}

TEST_CASE("bad files give errors naming the file and the problem", "[npy]") {
  TempDir dir("npy");
  const std::vector<float> six = {1, 2, 3, 4, 5, 6};
  const auto p = [&](const std::string& name) { return dir.file(name); };

  require_error([&] { load_npy_float(p("missing.npy")); }, {"missing.npy", "no such file"});
  require_error([&] { load_npy_float(dir.path().string()); }, {"is a directory"});

  std::ofstream(p("magic.npy")) << "this is not numpy at all";
  require_error([&] { load_npy_float(p("magic.npy")); }, {"magic.npy", "bad magic"});

  write_npy_raw(p("trunc.npy"), "<f4", "2, 3", raw_bytes(six).substr(0, 20));
  require_error([&] { load_npy_float(p("trunc.npy")); },
                {"trunc.npy", "truncated", "(2, 3)", "needs 24 bytes", "holds 20"});

  write_npy_raw(p("long.npy"), "<f4", "2, 3", raw_bytes(six) + "xx");
  require_error([&] { load_npy_float(p("long.npy")); }, {"long.npy", "2 unexpected bytes"});

  const std::string whole = test::read_text(p("long.npy"));
  std::ofstream(p("header.npy"), std::ios::binary) << whole.substr(0, 30);
  require_error([&] { load_npy_float(p("header.npy")); }, {"header.npy", "truncated .npy header"});

  write_npy_raw(p("i4.npy"), "<i4", "2, 3", raw_bytes(std::vector<std::int32_t>(6, 1)));
  require_error([&] { load_npy_float(p("i4.npy")); },
                {"i4.npy", "dtype '<i4'", "float32 '<f4'", "float64 '<f8'"});

  write_npy_raw(p("be.npy"), ">f4", "2, 3", raw_bytes(six));
  require_error([&] { load_npy_float(p("be.npy")); }, {"be.npy", "dtype '>f4'"});

  write_npy_raw(p("bool.npy"), "|b1", "2, 3", std::string(6, '\1'));
  require_error([&] { load_npy_float(p("bool.npy")); }, {"bool.npy", "dtype '|b1'", "float32"});

  write_npy_raw(p("f4.npy"), "<f4", "2, 3", raw_bytes(six));
  require_error([&] { load_npy_mask(p("f4.npy")); },
                {"f4.npy", "dtype '<f4'", "for a mask", "bool"});

  write_npy_raw(p("fortran.npy"), "<f4", "2, 3", raw_bytes(six), true);
  require_error([&] { load_npy_float(p("fortran.npy")); }, {"fortran.npy", "Fortran order"});

  write_npy_raw(p("rank1.npy"), "<f4", "6,", raw_bytes(six));
  require_error([&] { load_npy_float(p("rank1.npy")); },
                {"rank1.npy", "rank 1", "(6,)", "expected rank 2 or 3 or 4"});
  write_npy_raw(p("rank5.npy"), "<f4", "1, 1, 1, 2, 3", raw_bytes(six));
  require_error([&] { load_npy_float(p("rank5.npy")); }, {"rank 5"});

  write_npy_raw(p("shape.npy"), "<f4", "2, x", raw_bytes(six));
  require_error([&] { load_npy_float(p("shape.npy")); }, {"shape.npy", "bad .npy header", "shape"});

  write_npy_raw(p("v9.npy"), "<f4", "2, 3", raw_bytes(six), false, 9);
  require_error([&] { load_npy_float(p("v9.npy")); }, {"v9.npy", "format version 9"});

  write_npy_raw(p("u8.npy"), "|u1", "2, 2", std::string("\1\0\2\1", 4));
  require_error([&] { load_npy_mask(p("u8.npy")); },
                {"u8.npy", "mask value 2", "[1, 0]", "0 or 1"});
}

TEST_CASE("NaN and Inf in the input are refused, saying where", "[npy]") {
  TempDir dir("npy");
  std::vector<float> f(2 * 3 * 4, 1.0f);
  f[1 * 12 + 2 * 4 + 3] = std::numeric_limits<float>::quiet_NaN();
  write_npy_raw(dir.file("nan.npy"), "<f4", "2, 3, 4", raw_bytes(f));
  require_error([&] { load_npy_float(dir.file("nan.npy")); },
                {"nan.npy", "NaN at index [1, 2, 3]", "(2, 3, 4)"});

  std::vector<double> d(4, 0.5);
  d[2] = -std::numeric_limits<double>::infinity();
  write_npy_raw(dir.file("inf.npy"), "<f8", "2, 2", raw_bytes(d));
  require_error([&] { load_npy_float(dir.file("inf.npy")); }, {"inf.npy", "Inf at index [1, 0]"});
}

TEST_CASE("a failed write leaves no file behind", "[npy]") {
  TempDir dir("npy");
  const std::string path = dir.file("no-such-dir/o.npy");
  require_error([&] { save_npy(path, counting({2, 2})); }, {"no-such-dir/o.npy", "cannot write"});
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 0);
}

TEST_CASE("numpy reads what we write and we read what numpy writes", "[npy][numpy]") {
  if (!have_numpy()) {
    WARN("SKIPPED: /usr/bin/python3 has no numpy (Debian: python3-numpy); cross-check not run");
    return;
  }
  TempDir dir("npy");
  save_npy(dir.file("ours.npy"), counting({2, 3, 4}));
  // numpy checks our file, then writes float32, float64 (rank 4), bool and uint8 files for us.
  const std::string script =
      "import numpy as np, sys\n"
      "d = sys.argv[1]\n"
      "a = np.load(d + '/ours.npy')\n"
      "assert a.dtype == np.float32 and a.shape == (2, 3, 4), (a.dtype, a.shape)\n"
      "assert (a.ravel() == np.arange(24, dtype=np.float32) * 0.25 - 3).all()\n"
      "x = np.arange(2 * 2 * 3 * 5).reshape(2, 2, 3, 5) / 7.0\n"
      "np.save(d + '/f64.npy', x)\n"
      "np.save(d + '/f32.npy', x.astype(np.float32))\n"
      "np.save(d + '/b.npy', np.tril(np.ones((3, 4), dtype=bool)))\n"
      "np.save(d + '/u.npy', np.eye(3, dtype=np.uint8))\n"
      "np.save(d + '/fortran.npy', np.asfortranarray(x[0, 0]))\n";
  std::ofstream(dir.file("check.py")) << script;
  const std::string cmd = "/usr/bin/python3 " + dir.file("check.py") + " " + dir.path().string();
  REQUIRE(std::system(cmd.c_str()) == 0);

  const auto f64 = load_npy_float(dir.file("f64.npy"));
  const auto f32 = load_npy_float(dir.file("f32.npy"));
  REQUIRE(f64.shape() == std::vector<std::size_t>{2, 2, 3, 5});
  CHECK(same(f64, f32));  // numpy's float64 -> float32 and ours both round to nearest
  CHECK(f64(1, 1, 2, 4) == static_cast<float>(59 / 7.0));
  const auto b = load_npy_mask(dir.file("b.npy"));
  CHECK(b(1, 1));
  CHECK_FALSE(b(1, 2));
  const auto u = load_npy_mask(dir.file("u.npy"));
  CHECK(u(2, 2));
  CHECK_FALSE(u(2, 1));
  require_error([&] { load_npy_float(dir.file("fortran.npy")); }, {"Fortran order"});
}
