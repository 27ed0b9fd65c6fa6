// attnlab mask --spec SPEC --n N --out FILE [--head H] [--causal]: draws the block layout of a
// block-sparse variant (bigbird) like the figures of the BigBird paper: query blocks down, key
// blocks across, one colour per kind (window, global, random, masked by causality, not attended).
// The format follows the extension: .png (8-bit palette, written here: stored deflate blocks,
// no zlib needed), .pgm (binary greyscale) or .svg (with a legend).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnlab/attnlab.hpp"
#include "harness/meta.hpp"
#include "variants/bigbird.hpp"

namespace attnlab::cli {
namespace {

// What each cell shows; the order is the palette index.
enum Cell : std::uint8_t { kNone, kMasked, kWindow, kGlobal, kRandom, kGrid, kCells };

struct Colour {
  std::uint8_t r, g, b, grey;
  const char* name;
};
// Window blue, global orange, random green as in the paper's figure; greys for the rest.
constexpr std::array<Colour, kCells> kPalette = {{{255, 255, 255, 255, "not attended"},
                                                  {200, 200, 200, 200, "masked (causal)"},
                                                  {68, 114, 196, 110, "window"},
                                                  {237, 125, 49, 0, "global"},
                                                  {112, 173, 71, 160, "random"},
                                                  {235, 235, 235, 235, "grid"}}};

struct Picture {
  std::size_t blocks = 0, cell = 0, size = 0;  // size = blocks * cell pixels a side
  std::vector<std::uint8_t> pixels;            // palette indices, row-major
};

Cell cell_kind(const BigBirdLayout& l, std::size_t head, std::size_t i, std::size_t j) {
  switch (l.kind(head, i, j)) {
    case BlockKind::window:
      return kWindow;
    case BlockKind::global:
      return kGlobal;
    case BlockKind::random:
      return kRandom;
    default:
      return l.causal && j > i ? kMasked : kNone;
  }
}

// Cells of up to 16 pixels, the picture at most ~512 pixels a side (1 pixel per block beyond);
// cells of 4 pixels or more get a one-pixel grid line on their right and bottom edges.
Picture draw(const BigBirdLayout& l, std::size_t head) {
  Picture p;
  p.blocks = l.query_blocks;
  p.cell = std::clamp<std::size_t>(512 / p.blocks, 1, 16);
  p.size = p.blocks * p.cell;
  p.pixels.assign(p.size * p.size, kNone);
  for (std::size_t y = 0; y < p.size; ++y)
    for (std::size_t x = 0; x < p.size; ++x) {
      const bool edge = p.cell >= 4 && (x % p.cell == p.cell - 1 || y % p.cell == p.cell - 1);
      const Cell c = cell_kind(l, head, y / p.cell, x / p.cell);
      p.pixels[y * p.size + x] = edge && c == kNone ? kGrid : c;
    }
  return p;
}

std::uint32_t crc32(const std::uint8_t* data, std::size_t n, std::uint32_t crc = 0) {
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= data[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

void chunk(std::vector<std::uint8_t>& out, const char* type,
           const std::vector<std::uint8_t>& data) {
  put32(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put32(out, crc32(out.data() + start, out.size() - start));
}

// A zlib stream of stored (uncompressed) deflate blocks, RFC 1950/1951.
std::vector<std::uint8_t> zlib_stored(const std::vector<std::uint8_t>& raw) {
  std::vector<std::uint8_t> z = {0x78, 0x01};
  std::uint32_t a = 1, b = 0;  // Adler-32
  for (std::uint8_t byte : raw) {
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  }
  std::size_t pos = 0;
  do {
    const std::size_t len = std::min<std::size_t>(65535, raw.size() - pos);
    const bool last = pos + len == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<std::uint8_t>(len));
    z.push_back(static_cast<std::uint8_t>(len >> 8));
    z.push_back(static_cast<std::uint8_t>(~len));
    z.push_back(static_cast<std::uint8_t>(~len >> 8));
    z.insert(z.end(), raw.begin() + pos, raw.begin() + pos + len);
    pos += len;
  } while (pos < raw.size());
  put32(z, (b << 16) | a);
  return z;
}

std::vector<std::uint8_t> png(const Picture& p) {
  std::vector<std::uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<std::uint8_t> header;
  put32(header, static_cast<std::uint32_t>(p.size));
  put32(header, static_cast<std::uint32_t>(p.size));
  header.insert(header.end(), {8, 3, 0, 0, 0});  // 8-bit palette, no interlace
  chunk(out, "IHDR", header);
  std::vector<std::uint8_t> palette;
  for (const Colour& c : kPalette) palette.insert(palette.end(), {c.r, c.g, c.b});
  chunk(out, "PLTE", palette);
  std::vector<std::uint8_t> raw;
  raw.reserve(p.size * (p.size + 1));
  for (std::size_t y = 0; y < p.size; ++y) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), p.pixels.begin() + y * p.size, p.pixels.begin() + (y + 1) * p.size);
  }
  chunk(out, "IDAT", zlib_stored(raw));
  chunk(out, "IEND", {});
  return out;
}

std::vector<std::uint8_t> pgm(const Picture& p) {
  const std::string header =
      "P5\n" + std::to_string(p.size) + " " + std::to_string(p.size) + "\n255\n";
  std::vector<std::uint8_t> out(header.begin(), header.end());
  for (std::uint8_t c : p.pixels) out.push_back(kPalette[c].grey);
  return out;
}

std::string hex(const Colour& c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

// One rectangle per attended (or causally masked) block, then a legend below the grid.
std::vector<std::uint8_t> svg(const BigBirdLayout& l, std::size_t head, const std::string& title) {
  const std::size_t cell = std::clamp<std::size_t>(512 / l.query_blocks, 1, 16);
  const std::size_t size = l.query_blocks * cell, height = size + 90;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(size) +
                  "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " +
                  std::to_string(size) + " " + std::to_string(height) + "\">\n";
  s += "<title>" + title + "</title>\n<rect width=\"" + std::to_string(size) + "\" height=\"" +
       std::to_string(size) + "\" fill=\"" + hex(kPalette[kNone]) + "\" stroke=\"" +
       hex(kPalette[kGrid]) + "\"/>\n";
  for (std::size_t i = 0; i < l.query_blocks; ++i)
    for (std::size_t j = 0; j < l.key_blocks; ++j) {
      const Cell c = cell_kind(l, head, i, j);
      if (c == kNone) continue;
      s += "<rect x=\"" + std::to_string(j * cell) + "\" y=\"" + std::to_string(i * cell) +
           "\" width=\"" + std::to_string(cell) + "\" height=\"" + std::to_string(cell) +
           "\" fill=\"" + hex(kPalette[c]) + "\"/>\n";
    }
  std::size_t y = size + 16;
  for (Cell c : {kWindow, kGlobal, kRandom, kMasked}) {
    s += "<rect x=\"4\" y=\"" + std::to_string(y - 10) + "\" width=\"12\" height=\"12\" fill=\"" +
         hex(kPalette[c]) + "\"/><text x=\"22\" y=\"" + std::to_string(y) +
         "\" font-family=\"sans-serif\" font-size=\"12\">" + kPalette[c].name + "</text>\n";
    y += 18;
  }
  s += "</svg>\n";
  return {s.begin(), s.end()};
}

struct MaskOptions {
  std::string spec, out;
  std::int64_t n = 0, head = 0;  // signed, so that -1 is refused, not wrapped around
  bool causal = false;
};

void mask_command(const MaskOptions& o) {
  const auto attention = make_attention(o.spec);  // validates the spec
  const auto* bigbird = dynamic_cast<const BigBirdAttention*>(attention.get());
  if (bigbird == nullptr)
    throw Error("mask: --spec '" + o.spec + "': only bigbird has a block layout to draw");
  if (o.n < 1)
    throw Error("mask: --n " + std::to_string(o.n) + ": expected a sequence length >= 1");
  if (o.head < 0 || o.head >= 1024)
    throw Error("mask: --head " + std::to_string(o.head) + ": expected 0 <= head < 1024");
  const auto n = static_cast<std::size_t>(o.n), head = static_cast<std::size_t>(o.head);
  const std::string ext = std::filesystem::path(o.out).extension().string();
  if (ext != ".png" && ext != ".pgm" && ext != ".svg")
    throw Error("mask: --out '" + o.out + "': expected a .png, .pgm or .svg file name");
  const std::size_t blocks = (n + bigbird->config().block - 1) / bigbird->config().block;
  if (blocks > 4096)
    throw Error("mask: --n " + std::to_string(n) + " makes " + std::to_string(blocks) +
                " blocks a side; at most 4096 can be drawn (use a larger block)");
  const std::size_t heads = head + 1;  // the layout of head h depends on h, not on the others
  const BigBirdLayout layout = bigbird_layout(bigbird->config(), heads, n, n, o.causal);
  const std::string title = attention->spec() + " N=" + std::to_string(n) + " head " +
                            std::to_string(head) + (o.causal ? " causal" : "");
  const Picture picture = draw(layout, head);
  const std::vector<std::uint8_t> bytes = ext == ".png"   ? png(picture)
                                          : ext == ".pgm" ? pgm(picture)
                                                          : svg(layout, head, title);
  harness::write_atomically(o.out, std::string(bytes.begin(), bytes.end()));

  std::size_t counts[kCells] = {};
  for (std::size_t i = 0; i < layout.query_blocks; ++i)
    for (std::size_t j = 0; j < layout.key_blocks; ++j) ++counts[cell_kind(layout, head, i, j)];
  std::printf(
      "%s: %zu x %zu blocks of %zu; attended %zu (window %zu, global %zu, random %zu), "
      "masked %zu\n",
      title.c_str(), layout.query_blocks, layout.key_blocks, layout.block,
      counts[kWindow] + counts[kGlobal] + counts[kRandom], counts[kWindow], counts[kGlobal],
      counts[kRandom], counts[kMasked]);
  std::printf(
      "wrote %s (%zu x %zu pixels, %zu per block; colours: window blue, global orange, "
      "random green, masked grey)\n",
      o.out.c_str(), picture.size, picture.size, picture.cell);
}

}  // namespace

void add_mask_command(CLI::App& app) {
  auto o = std::make_shared<MaskOptions>();
  CLI::App* cmd = app.add_subcommand(
      "mask",
      "Draw the block layout of a block-sparse spec (bigbird) as .png, .pgm or .svg: "
      "query blocks down, key blocks across, coloured by kind.");
  cmd->add_option("--spec", o->spec, "factory string, e.g. bigbird:block=64,random=3")->required();
  cmd->add_option("--n", o->n, "sequence length (tokens)")->required();
  cmd->add_option("--out", o->out, "output image: .png, .pgm or .svg")->required();
  cmd->add_option("--head", o->head, "which head's random blocks to draw (default 0)");
  cmd->add_flag("--causal", o->causal, "the causal layout (blocks above the diagonal dropped)");
  cmd->callback([o] { mask_command(*o); });
}

}  // namespace attnlab::cli
