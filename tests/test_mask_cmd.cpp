// `attnlab mask` end to end (binary in $ATTNLAB_CLI, set by meson test): the picture's header and
// size, every block's colour against bigbird_layout, the three formats and the error policy.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_helpers.hpp"
#include "helpers.hpp"
#include "variants/bigbird.hpp"

using namespace attnlab;
using attnlab::test::attnlab_cli;
using attnlab::test::CliResult;
using attnlab::test::read_text;
using attnlab::test::TempDir;

namespace {

// `attnlab mask <args>` in the scratch directory `s`.
CliResult mask_cli(const TempDir& s, const std::string& args) {
  return attnlab_cli(s, "mask " + args);
}

std::uint32_t be32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<std::uint8_t>(s[at + i]);
  return v;
}

// The PNG written by the command is palette-indexed with stored deflate blocks: decode exactly
// that (the test fails on anything else), returning the palette indices row by row.
std::vector<std::uint8_t> decode_png(const std::string& png, std::uint32_t& width,
                                     std::uint32_t& height) {
  REQUIRE(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
  REQUIRE(png.compare(12, 4, "IHDR") == 0);
  width = be32(png, 16);
  height = be32(png, 20);
  REQUIRE(png[24] == 8);  // bit depth
  REQUIRE(png[25] == 3);  // palette
  std::string idat;
  for (std::size_t at = 8; at < png.size();) {
    const std::uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    if (type == "IDAT") idat += png.substr(at + 8, len);
    at += 12 + len;
  }
  std::string raw;
  for (std::size_t at = 2; at + 4 < idat.size();) {  // skip the zlib header, stop at Adler-32
    const bool last = idat[at] & 1;
    REQUIRE((idat[at] & 6) == 0);  // stored block
    const std::size_t len = std::uint8_t(idat[at + 1]) | std::uint8_t(idat[at + 2]) << 8;
    raw += idat.substr(at + 5, len);
    at += 5 + len;
    if (last) break;
  }
  REQUIRE(raw.size() == std::size_t(height) * (width + 1));
  std::vector<std::uint8_t> pixels;
  for (std::size_t y = 0; y < height; ++y) {
    REQUIRE(raw[y * (width + 1)] == 0);  // filter type none
    pixels.insert(pixels.end(), raw.begin() + y * (width + 1) + 1,
                  raw.begin() + (y + 1) * (width + 1));
  }
  return pixels;
}

// Palette indices of the command: none, masked, window, global, random, grid.
int expected_index(const BigBirdLayout& l, std::size_t head, std::size_t i, std::size_t j) {
  switch (l.kind(head, i, j)) {
    case BlockKind::window:
      return 2;
    case BlockKind::global:
      return 3;
    case BlockKind::random:
      return 4;
    default:
      return l.causal && j > i ? 1 : 0;
  }
}

}  // namespace

TEST_CASE("attnlab mask draws every block of the layout in its colour (png)", "[bigbird]") {
  TempDir s("mask");
  for (bool causal : {false, true}) {
    const std::string spec = "bigbird:block=64,window=3,global=2,random=3,seed=5";
    const CliResult r = mask_cli(
        s, "--spec '" + spec + "' --n 4000 --head 1 --out l.png" + (causal ? " --causal" : ""));
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("63 x 63 blocks") != std::string::npos);
    std::uint32_t w = 0, h = 0;
    const auto pixels = decode_png(read_text(s.file("l.png")), w, h);
    const std::size_t cell = 512 / 63;  // 8 pixels a block
    CHECK(w == 63 * cell);
    CHECK(h == 63 * cell);
    const BigBirdLayout l = bigbird_layout(BigBirdConfig{64, 3, 2, 3, 5}, 2, 4000, 4000, causal);
    std::size_t seen[5] = {};
    for (std::size_t i = 0; i < 63; ++i)
      for (std::size_t j = 0; j < 63; ++j) {
        const int want = expected_index(l, 1, i, j);
        ++seen[want];
        // The centre pixel of the cell (its last row and column are grid lines).
        REQUIRE(int(pixels[(i * cell + cell / 2) * w + j * cell + cell / 2]) == want);
      }
    if (!causal) CHECK(seen[4] == 61 * 3);      // 61 non-global query blocks, 3 random each
    if (causal) CHECK(seen[1] == 63 * 62 / 2);  // everything above the diagonal
  }
}

TEST_CASE("attnlab mask writes pgm and svg by extension", "[bigbird]") {
  TempDir s("mask");
  REQUIRE(mask_cli(s, "--spec bigbird:block=16 --n 100 --out l.pgm").code == 0);
  const std::string pgm = read_text(s.file("l.pgm"));
  const std::size_t side = 7 * 16;  // 7 blocks, 16 pixels each
  const std::string header = "P5\n" + std::to_string(side) + " " + std::to_string(side) + "\n255\n";
  REQUIRE(pgm.compare(0, header.size(), header) == 0);
  CHECK(pgm.size() == header.size() + side * side);
  CHECK(std::uint8_t(pgm[header.size()]) == 0);  // block (0, 0) is global: black

  REQUIRE(mask_cli(s, "--spec bigbird:block=16 --n 100 --out l.svg").code == 0);
  const std::string svg = read_text(s.file("l.svg"));
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"112\"", 0) == 0);
  CHECK(svg.find("window</text>") != std::string::npos);
  CHECK(svg.find("</svg>") != std::string::npos);
}

TEST_CASE("attnlab mask: bad input is one line and exit 2", "[bigbird]") {
  TempDir s("mask");
  const std::pair<std::string, std::string> cases[] = {
      {"--spec full --n 100 --out l.png", "only bigbird"},
      {"--spec bigbird:window=2 --n 100 --out l.png", "window=2"},
      {"--spec bigbird --n 100 --out l.jpg", ".png, .pgm or .svg"},
      {"--spec bigbird --n 0 --out l.png", "--n 0"},
      {"--spec bigbird:block=1 --n 5000 --out l.png", "at most 4096"},
      {"--spec bigbird --n 100 --head 5000 --out l.png", "--head 5000"},
      {"--spec bigbird --out l.png", "--n"},
  };
  for (const auto& [args, fragment] : cases) {
    const CliResult r = mask_cli(s, args);
    INFO("attnlab mask " << args << "\nstderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("attnlab: error: ", 0) == 0);
    CHECK(r.err.find(fragment) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  CHECK_FALSE(std::filesystem::exists(s.file("l.png")));
}
