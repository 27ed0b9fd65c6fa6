// attnlab mask draws one of two pictures; the format follows the extension of --out: .png (8-bit
// palette, written here: stored deflate blocks, no zlib needed), .pgm (binary greyscale) or .svg
// (with a legend).
//   attnlab mask --spec bigbird[:...] --n N --out FILE [--head H] [--causal]: BigBird's block
//       layout like the figures of the BigBird paper: query blocks down, key blocks across, one
//       colour per kind (window, global, random, masked by causality, not attended).
//   attnlab mask --n N [--nk NK] [--causal[=ALIGN]] [--mask SPEC] [--window L,R] [--cu-seqlens
//       o.npy] [--prefix-lengths p.npy] [--key-lengths L] [--item B] [--out FILE]: the softmax
//       engine's classification of each (query tile, key chunk) pair under the mask as empty
//       (skipped), partial (masked element by element) or full (no mask work), like
//       FlexAttention's BlockMask picture: engine::tile_classes, the forward's own code, never a
//       copy of it. Without --out it prints the grid as text (# full, + partial, . empty).
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
#include "attnlab/softmax_engine.hpp"
#include "cli/mask_flags.hpp"
#include "harness/mask_spec.hpp"
#include "harness/meta.hpp"
#include "variants/bigbird.hpp"

namespace attnlab::cli {
namespace {

// What each cell shows; the order is the palette index.
enum Cell : std::uint8_t {
  kNone,
  kMasked,
  kWindow,
  kGlobal,
  kRandom,
  kGrid,
  kFull,     // a tile the engine runs without mask work
  kPartial,  // a tile the engine masks element by element
  kCells
};

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
                                                  {235, 235, 235, 235, "grid"},
                                                  {68, 114, 196, 60, "full"},
                                                  {237, 125, 49, 170, "partial"}}};

struct Picture {
  std::size_t blocks = 0, cell = 0, size = 0;  // size = blocks * cell pixels a side
  std::size_t width = 0, height = 0;           // pixels
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
  p.size = p.width = p.height = p.blocks * p.cell;
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
  put32(header, static_cast<std::uint32_t>(p.width));
  put32(header, static_cast<std::uint32_t>(p.height));
  header.insert(header.end(), {8, 3, 0, 0, 0});  // 8-bit palette, no interlace
  chunk(out, "IHDR", header);
  std::vector<std::uint8_t> palette;
  for (const Colour& c : kPalette) palette.insert(palette.end(), {c.r, c.g, c.b});
  chunk(out, "PLTE", palette);
  std::vector<std::uint8_t> raw;
  raw.reserve(p.height * (p.width + 1));
  for (std::size_t y = 0; y < p.height; ++y) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), p.pixels.begin() + y * p.width, p.pixels.begin() + (y + 1) * p.width);
  }
  chunk(out, "IDAT", zlib_stored(raw));
  chunk(out, "IEND", {});
  return out;
}

std::vector<std::uint8_t> pgm(const Picture& p) {
  const std::string header =
      "P5\n" + std::to_string(p.width) + " " + std::to_string(p.height) + "\n255\n";
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
  std::string spec, out, causal = "none", mask = "none";
  std::int64_t n = 0, nk = 0, head = 0, item = 0;  // signed: -1 is refused, not wrapped around
  MaskFlags flags;
};

// Query tiles down, key chunks across (the engine's: at most 48 queries and 128 keys), one
// character each in text: '#' full, '+' partial, '.' empty (skipped, or never reached).
struct TileGrid {
  std::size_t rows = 0, cols = 0, tile_rows = 0, tile_cols = engine::kCols;
  std::vector<Cell> cells;  // kNone (empty), kPartial, kFull; row-major
  std::size_t counts[kCells] = {};
};

TileGrid tile_grid(const Mask& mask, const Dims& d, std::size_t item) {
  const std::vector<engine::TileVisit> visits =
      engine::tile_classes(mask, d, engine::Sparsity(), item, 0);
  TileGrid g;
  g.tile_rows = std::min(d.nq, kernels::OnlineSoftmax::kRows);  // the forward's query tiles
  g.rows = (d.nq + g.tile_rows - 1) / g.tile_rows;
  g.cols = (d.nk + g.tile_cols - 1) / g.tile_cols;
  g.cells.assign(g.rows * g.cols, kNone);
  // Full attention's sparsity: consecutive query tiles from 0, keys in natural order, and a
  // chunk never crosses a multiple of 128 keys: one visit per cell at most.
  for (const engine::TileVisit& v : visits)
    g.cells[v.tile.first / g.tile_rows * g.cols + static_cast<std::size_t>(v.j0) / g.tile_cols] =
        v.cls == TileClass::full      ? kFull
        : v.cls == TileClass::partial ? kPartial
                                      : kNone;
  for (Cell c : g.cells) ++g.counts[c];
  return g;
}

// Each tile 3 x 8 pixels (48 queries by 128 keys), a grid line on its right and bottom edges.
Picture draw_tiles(const TileGrid& g) {
  Picture p;
  const std::size_t ch = 3, cw = 8;
  p.width = g.cols * cw;
  p.height = g.rows * ch;
  p.pixels.assign(p.width * p.height, kNone);
  for (std::size_t y = 0; y < p.height; ++y)
    for (std::size_t x = 0; x < p.width; ++x) {
      const Cell c = g.cells[y / ch * g.cols + x / cw];
      const bool edge = x % cw == cw - 1 || y % ch == ch - 1;
      p.pixels[y * p.width + x] = edge && c == kNone ? kGrid : c;
    }
  return p;
}

std::vector<std::uint8_t> svg_tiles(const TileGrid& g, const std::string& title) {
  const std::size_t ch = 3, cw = 8, width = std::max<std::size_t>(g.cols * cw, 120);
  const std::size_t height = g.rows * ch + 56;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) +
                  "\" height=\"" + std::to_string(height) + "\">\n<title>" + title +
                  "</title>\n<rect width=\"" + std::to_string(g.cols * cw) + "\" height=\"" +
                  std::to_string(g.rows * ch) + "\" fill=\"" + hex(kPalette[kNone]) +
                  "\" stroke=\"" + hex(kPalette[kGrid]) + "\"/>\n";
  for (std::size_t i = 0; i < g.rows; ++i)
    for (std::size_t j = 0; j < g.cols; ++j) {
      const Cell c = g.cells[i * g.cols + j];
      if (c == kNone) continue;
      s += "<rect x=\"" + std::to_string(j * cw) + "\" y=\"" + std::to_string(i * ch) +
           "\" width=\"" + std::to_string(cw) + "\" height=\"" + std::to_string(ch) + "\" fill=\"" +
           hex(kPalette[c]) + "\"/>\n";
    }
  std::size_t y = g.rows * ch + 16;
  for (Cell c : {kFull, kPartial}) {
    s += "<rect x=\"4\" y=\"" + std::to_string(y - 10) + "\" width=\"12\" height=\"12\" fill=\"" +
         hex(kPalette[c]) + "\"/><text x=\"22\" y=\"" + std::to_string(y) +
         "\" font-family=\"sans-serif\" font-size=\"12\">" + kPalette[c].name + "</text>\n";
    y += 18;
  }
  s += "</svg>\n";
  return {s.begin(), s.end()};
}

void tile_command(const MaskOptions& o) {
  if (o.n < 1)
    throw Error("mask: --n " + std::to_string(o.n) + ": expected a sequence length >= 1");
  if (o.nk < 0) throw Error("mask: --nk " + std::to_string(o.nk) + ": expected a length >= 1");
  if (o.item < 0)
    throw Error("mask: --item " + std::to_string(o.item) + ": expected a batch item >= 0");
  const auto nq = static_cast<std::size_t>(o.n);
  const std::size_t nk = o.nk > 0 ? static_cast<std::size_t>(o.nk) : nq;
  Mask mask;
  mask.causal = parse_causal(o.causal);
  apply_mask_flags(o.flags, mask);
  // One item unless per-item parts say more: key padding or prefix lengths without documents.
  std::size_t batch = 1;
  if (!mask.has_documents())
    batch = std::max({batch, mask.key_lengths.size(), mask.prefix_lengths.size()});
  const harness::MaskSpec spec = harness::parse_mask_spec(o.mask);
  if (spec.kind != harness::MaskSpec::Kind::none) {
    if (nq != nk) throw Error("mask: --mask " + spec.text() + " needs --nk equal to --n");
    harness::add_mask_part(spec, nq, batch, mask);
  }
  if (static_cast<std::size_t>(o.item) >= batch)
    throw Error("mask: --item " + std::to_string(o.item) + ": the mask has " +
                std::to_string(batch) + " batch item(s)");
  const Dims d{batch, 1, nq, nk, 1, 1};
  if (nq > 1 << 20 || nk > 1 << 20)
    throw Error("mask: --n " + std::to_string(nq) + ", --nk " + std::to_string(nk) +
                ": at most 1048576 tokens can be drawn");
  const TileGrid g = tile_grid(mask, d, static_cast<std::size_t>(o.item));
  std::string title = "Nq=" + std::to_string(nq) + " Nk=" + std::to_string(nk) + " causal " +
                      o.causal +
                      (spec.kind == harness::MaskSpec::Kind::none ? "" : ", " + spec.text());
  if (mask.window)
    title +=
        ", window " + std::to_string(mask.window->left) + "," + std::to_string(mask.window->right);
  if (mask.has_documents())
    title += ", " + std::to_string(mask.documents.size() - 1) + " documents";
  if (!mask.prefix_lengths.empty()) title += ", prefix-LM";
  if (!o.out.empty()) {
    const std::string ext = std::filesystem::path(o.out).extension().string();
    if (ext != ".png" && ext != ".pgm" && ext != ".svg")
      throw Error("mask: --out '" + o.out + "': expected a .png, .pgm or .svg file name");
    if (g.cols * 8 > 16384 || g.rows * 3 > 16384)
      throw Error("mask: --n " + std::to_string(nq) + " makes " + std::to_string(g.rows) + " x " +
                  std::to_string(g.cols) +
                  " tiles; at most 2048 key chunks and 5461 query tiles "
                  "can be drawn (print them as text without --out)");
    const Picture picture = draw_tiles(g);
    const std::vector<std::uint8_t> bytes = ext == ".png"   ? png(picture)
                                            : ext == ".pgm" ? pgm(picture)
                                                            : svg_tiles(g, title);
    harness::write_atomically(o.out, std::string(bytes.begin(), bytes.end()));
  } else {
    std::string text;
    for (std::size_t i = 0; i < g.rows; ++i) {
      for (std::size_t j = 0; j < g.cols; ++j) {
        const Cell c = g.cells[i * g.cols + j];
        text += c == kFull ? '#' : c == kPartial ? '+' : '.';
      }
      text += '\n';
    }
    std::fputs(text.c_str(), stdout);
  }
  const std::size_t total = g.rows * g.cols;
  std::printf(
      "%s: %zu x %zu tiles of %zu queries x %zu keys: full %zu, partial %zu, empty %zu "
      "(%.1f%% skipped)\n",
      title.c_str(), g.rows, g.cols, g.tile_rows, g.tile_cols, g.counts[kFull], g.counts[kPartial],
      g.counts[kNone], 100.0 * double(g.counts[kNone]) / double(total));
  if (!o.out.empty())
    std::printf(
        "wrote %s (%zu pixels a tile across, 3 down; colours: full blue, partial orange, "
        "empty white)\n",
        o.out.c_str(), std::size_t{8});
}

void mask_command(const MaskOptions& o) {
  if (o.spec.empty()) return tile_command(o);
  const auto attention = make_attention(o.spec);  // validates the spec
  const auto* bigbird = dynamic_cast<const BigBirdAttention*>(attention.get());
  if (bigbird == nullptr)
    throw Error("mask: --spec '" + o.spec +
                "': only bigbird has a block layout to draw (without --spec: the tile classes "
                "of a mask)");
  const bool causal = parse_causal(o.causal) != Causal::none;
  if (o.n < 1)
    throw Error("mask: --n " + std::to_string(o.n) + ": expected a sequence length >= 1");
  if (o.out.empty()) throw Error("mask: --spec " + o.spec + ": --out FILE is required");
  const MaskFlags& f = o.flags;
  for (const auto& [given, option] : {std::pair{o.mask != "none", "--mask"},
                                      {o.nk != 0, "--nk"},
                                      {o.item != 0, "--item"},
                                      {!f.key_lengths.empty(), "--key-lengths"},
                                      {!f.cu_seqlens.empty(), "--cu-seqlens"},
                                      {!f.cu_seqlens_k.empty(), "--cu-seqlens-k"},
                                      {!f.window_text().empty(), f.window_flag()},
                                      {!f.prefix_lengths.empty(), "--prefix-lengths"}})
    if (given)
      throw Error("mask: " + std::string(option) + " draws the tile classes of a mask, without " +
                  "--spec; bigbird's layout (--spec " + o.spec + ") does not take it");
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
  const BigBirdLayout layout = bigbird_layout(bigbird->config(), heads, n, n, causal);
  const std::string title = attention->spec() + " N=" + std::to_string(n) + " head " +
                            std::to_string(head) + (causal ? " causal" : "");
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
      "Draw the softmax engine's tile classes of a mask (empty, partial, full per query tile and "
      "key chunk, like FlexAttention's BlockMask), or with --spec bigbird its block layout, as "
      "text or .png, .pgm or .svg.");
  cmd->add_option("--spec", o->spec,
                  "bigbird[:...]: draw its block layout, e.g. bigbird:block=64,random=3");
  cmd->add_option("--n", o->n, "sequence length (tokens; the queries')")->required();
  cmd->add_option("--nk", o->nk, "key length (default --n)");
  cmd->add_option("--out", o->out,
                  "output image: .png, .pgm or .svg (tile classes without it: text on stdout)");
  cmd->add_option("--head", o->head, "which head's random blocks to draw (bigbird; default 0)");
  cmd->add_flag("--causal{top-left}", o->causal,
                "causal (top-left; --causal=bottom-right aligns the last query with the last key)");
  cmd->add_option("--mask", o->mask,
                  "a sweep's mask spec: none, documents:count=D, prefix:frac=F (with --causal), "
                  "window:left=L[,right=R]");
  add_mask_flags(*cmd, o->flags);
  cmd->add_option("--item", o->item, "which batch item to draw (default 0)");
  cmd->callback([o] { mask_command(*o); });
}

}  // namespace attnlab::cli
