// `attnlab mask` end to end (binary in $ATTNLAB_CLI, set by meson test): the picture's header and
// size, every block's colour against bigbird_layout, the three formats and the error policy.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
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

namespace {

// The rows of the text grid `attnlab mask` prints without --out (every line before the summary).
std::vector<std::string> grid_lines(const std::string& out) {
  std::vector<std::string> lines;
  std::size_t at = 0;
  while (at < out.size()) {
    const std::size_t end = out.find('\n', at);
    const std::string line = out.substr(at, end - at);
    if (line.find(' ') != std::string::npos) break;  // the summary
    lines.push_back(line);
    at = end + 1;
  }
  return lines;
}

// The class of the tile of queries [i0, i1) and keys [j0, j1) read off the mask key by key,
// independently of the engine: empty when no pair is visible; full when every query sees every
// key that any query of the tile sees there; else partial. ('.', '#', '+' as the command prints.)
char brute_class(const Mask& m, const Dims& d, std::size_t i0, std::size_t i1, std::size_t j0,
                 std::size_t j1) {
  std::vector<bool> any(j1 - j0, false);
  for (std::size_t i = i0; i < i1; ++i)
    for (std::size_t j = j0; j < j1; ++j)
      if (m.may_attend(0, 0, i, j, d)) any[j - j0] = true;
  if (std::find(any.begin(), any.end(), true) == any.end()) return '.';
  for (std::size_t i = i0; i < i1; ++i)
    for (std::size_t j = j0; j < j1; ++j)
      if (any[j - j0] && !m.may_attend(0, 0, i, j, d)) return '+';
  return '#';
}

void save_offsets(const TempDir& s, const std::string& name, std::vector<std::int64_t> values) {
  attnlab::test::write_npy_raw(s.file(name), "<i8", std::to_string(values.size()) + ",",
                               attnlab::test::raw_bytes(values));
}

}  // namespace

TEST_CASE("attnlab mask prints the engine's tile classes, which the mask's keys confirm", "[cli]") {
  TempDir s("tiles");
  save_offsets(s, "cu.npy", {0, 70, 71, 300});
  save_offsets(s, "prefix.npy", {100});
  struct Case {
    std::string args;
    std::function<void(Mask&)> make;
  };
  const std::vector<Case> cases = {
      {"", [](Mask&) {}},
      {"--causal", [](Mask& m) { m.causal = Causal::top_left; }},
      {"--causal --cu-seqlens cu.npy",
       [](Mask& m) {
         m.causal = Causal::top_left;
         m.documents = {0, 70, 71, 300};
       }},
      {"--window 60,0",
       [](Mask& m) {
         m.window = Window{60, 0};
       }},
      {"--causal --prefix-lengths prefix.npy",
       [](Mask& m) {
         m.causal = Causal::top_left;
         m.prefix_lengths = {100};
       }},
      {"--key-lengths 200", [](Mask& m) { m.key_lengths = {200}; }},
      {"--causal=bottom-right --nk 400", [](Mask& m) { m.causal = Causal::bottom_right; }},
      {"--mask documents:count=3",
       [](Mask& m) {
         m.documents = {0, 100, 200, 300};
       }},
      {"--causal --mask window:left=50",
       [](Mask& m) {
         m.causal = Causal::top_left;
         m.window = Window{50, 50};
       }},
  };
  for (const Case& c : cases) {
    const CliResult r = mask_cli(s, "--n 300 " + c.args);
    INFO("attnlab mask --n 300 " << c.args << "\nstdout:\n" << r.out << "stderr: " << r.err);
    REQUIRE(r.code == 0);
    const std::size_t nk = c.args.find("--nk 400") != std::string::npos ? 400 : 300;
    Mask m;
    c.make(m);
    const Dims d{1, 1, 300, nk, 1, 1};
    const std::vector<std::string> lines = grid_lines(r.out);
    REQUIRE(lines.size() == (300 + 47) / 48);  // query tiles of 48
    std::size_t skipped = 0;
    for (std::size_t t = 0; t < lines.size(); ++t) {
      REQUIRE(lines[t].size() == (nk + 127) / 128);  // key chunks of 128
      for (std::size_t c2 = 0; c2 < lines[t].size(); ++c2) {
        INFO("tile " << t << ", chunk " << c2);
        CHECK(lines[t][c2] == brute_class(m, d, 48 * t, std::min<std::size_t>(48 * t + 48, 300),
                                          128 * c2, std::min<std::size_t>(128 * c2 + 128, nk)));
        skipped += lines[t][c2] == '.';
      }
    }
    CHECK(r.out.find("empty " + std::to_string(skipped) + " ") != std::string::npos);
  }
}

TEST_CASE("attnlab mask draws the tile classes as png, pgm and svg", "[cli]") {
  TempDir s("tiles");
  REQUIRE(mask_cli(s, "--n 1000 --causal --window 200,0 --out t.png").code == 0);
  std::uint32_t w = 0, h = 0;
  const auto pixels = decode_png(read_text(s.file("t.png")), w, h);
  const std::size_t rows = (1000 + 47) / 48, cols = (1000 + 127) / 128;
  REQUIRE(w == cols * 8);
  REQUIRE(h == rows * 3);
  const CliResult text = mask_cli(s, "--n 1000 --causal --window 200,0");
  const std::vector<std::string> lines = grid_lines(text.out);
  REQUIRE(lines.size() == rows);
  for (std::size_t t = 0; t < rows; ++t)
    for (std::size_t c = 0; c < cols; ++c) {
      // Palette: 0 empty (white), 6 full (blue), 7 partial (orange); the tile's first pixel.
      const int want = lines[t][c] == '#' ? 6 : lines[t][c] == '+' ? 7 : 0;
      CHECK(int(pixels[(t * 3) * w + c * 8]) == want);
    }
  REQUIRE(mask_cli(s, "--n 1000 --causal --out t.pgm").code == 0);
  CHECK(read_text(s.file("t.pgm")).rfind("P5\n64 63\n255\n", 0) == 0);
  REQUIRE(mask_cli(s, "--n 1000 --causal --out t.svg").code == 0);
  const std::string svg = read_text(s.file("t.svg"));
  CHECK(svg.find("partial</text>") != std::string::npos);
  CHECK(svg.find("</svg>") != std::string::npos);
}

TEST_CASE("attnlab mask: bad tile input is one line, exit 2, nothing written", "[cli]") {
  TempDir s("tiles");
  save_offsets(s, "cu.npy", {0, 70, 200});
  const std::pair<std::string, std::string> cases[] = {
      {"--n 100 --mask bogus --out t.png", "unknown mask 'bogus'"},
      {"--n 100 --mask documents:count=0 --out t.png", "count=0"},
      {"--n 100 --mask prefix:frac=0.5 --out t.png", "causal = none"},
      {"--n 100 --window 5 --out t.png", "--window '5'"},
      {"--n 100 --window -3,0 --out t.png", "window.left = -3"},
      {"--n 100 --cu-seqlens cu.npy --out t.png", "ends at 200"},
      {"--n 100 --cu-seqlens nope.npy --out t.png", "--cu-seqlens nope.npy"},
      {"--n 100 --causal=sideways --out t.png", "causal mode 'sideways'"},
      {"--n 100 --item 2 --out t.png", "--item 2"},
      {"--n 100 --nk 50 --mask documents:count=2 --out t.png", "--nk"},
      {"--n 100 --out t.jpg", ".png, .pgm or .svg"},
      {"--spec bigbird --n 100 --window 4,4 --out t.png", "--window"},
  };
  for (const auto& [args, fragment] : cases) {
    const CliResult r = mask_cli(s, args);
    INFO("attnlab mask " << args << "\nstderr: " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("attnlab: error: ", 0) == 0);
    CHECK(r.err.find(fragment) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  CHECK_FALSE(std::filesystem::exists(s.file("t.png")));
}

TEST_CASE("docs/cli.md's tile picture is what attnlab mask prints", "[cli]") {
  const std::string doc = read_text(std::string(ATTNLAB_SOURCE_DIR) + "/docs/cli.md");
  const std::string command = "attnlab mask --n 1024 --causal --mask documents:count=4";
  REQUIRE(doc.find(command + "\n") != std::string::npos);  // in the ci: block above the picture
  const std::string opening = "The first prints\n\n```text\n";
  const auto at = doc.find(opening);
  REQUIRE(at != std::string::npos);
  const auto begin = at + opening.size();
  TempDir s("doc-tiles");
  const CliResult r = mask_cli(s, command.substr(std::string("attnlab mask ").size()));
  REQUIRE(r.code == 0);
  CHECK(doc.substr(begin, doc.find("```", begin) - begin) == r.out);
}
