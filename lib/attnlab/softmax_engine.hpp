// The softmax engine: one tiled online-softmax forward and backward (FlashAttention-2, Dao 2023)
// behind every exact and block-sparse softmax variant. full, sliding and bigbird are thin
// clients: each says which keys its query tiles read (a Sparsity), the engine does the rest.
//
// Before it computes, the engine classifies each (query tile, key chunk) pair as empty, full or
// partial from bounds, never by evaluating every element: the mask's interval parts (causal
// with prefix, key padding, window, documents: Mask::key_span, one interval per query row) give
// per-row key intervals, so a chunk every row covers is full and one no row reaches is empty;
// the variant's sparsity gives key runs (BigBird's blocks, a window inside a dilation class);
// a custom mask declares its own class (MaskMod::classify); a boolean mask makes a chunk
// partial. Empty chunks are skipped, full ones run with no per-element mask work; in a partial
// one each row keeps its column range (a vector compare inside the kernels' pass over the
// scores) and only the boolean and custom masks are evaluated element by element. Chunks are at
// most kCols = 128 keys and never cross a tile of the key layout; query tiles have at most 48
// rows (forward) or 96 (backward).
//
// Score modifiers run on every computed chunk, in the kernels' one pass over its scores
// (kernels::detail::ScoreMods: the forward's search for each row's max, the backward's P and dS,
// which takes their gradients on the way): soft-capping, then ALiBi, the additive bias and the
// forgetting gate as additive terms (order and definitions in mask.hpp and attention.hpp); sinks
// start each row's online softmax (a running max of the sink and a sum of 1). Grouped heads:
// query head h reads KV head h / (H / Hkv).
//
// Backward: the same tiles, classes and modifiers, from the forward's saved row log-sum-exp;
// tasks are (item, KV head, group) with the query tiles of the KV head's query heads dealt
// round-robin to ceil(16 / (B·Hkv)) groups that add into private dK, dV (and forgetting-gate)
// sums, reduced in group order: every core is used even when B x Hkv = 1, and the split depends
// on the shape only, so the gradients are bitwise the same on every run and with any number of
// threads. The modifiers' gradients: d_bias (a dense [B, H, Nq, Nk] buffer, summed over the
// bias's broadcast axes in a fixed order), d_sinks and d_alibi_slopes (per row, then summed per
// head in order), d_log_decay (per row and per key, then a reverse cumulative sum).
//
// Memory: both lay out the keys (the backward also the values) once per KV head into scratch
// that the calling thread keeps from call to call, B·Hkv·(Dk + Dv)·Nk floats at most (64 MiB at
// B = 1, Hkv = 8, D = 64, N = 16384).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnlab/attention.hpp"
#include "attnlab/kernels.hpp"

namespace attnlab::engine {

/// Keys per chunk and per tile of the key layout.
inline constexpr std::size_t kCols = kernels::OnlineSoftmax::kCols;
/// Rows of a query tile, at most (the backward's; the forward's are kernels::OnlineSoftmax's).
inline constexpr std::size_t kMaxRows = kernels::SoftmaxBackward::kRows;

/// Where the keys of one head lie in its transposed key tiles ([Dk, kCols] each, zero-padded):
/// first a block of the `lead` first keys (global keys, read by every query of a dilated
/// window), then the keys in classes modulo `stride` (key j = rho + stride·t is number t of
/// class rho: a dilated window is a plain window inside one class). Each block starts a tile.
/// stride 1 and lead 0: the natural order.
class KeyLayout {
 public:
  /// The class index of the lead block.
  static constexpr std::size_t kLead = static_cast<std::size_t>(-1);

  /// The layout of `nk` keys in classes modulo `stride` after a lead block of `lead` keys.
  KeyLayout(std::size_t nk, std::size_t stride = 1, std::size_t lead = 0);

  /// The dilation.
  std::size_t stride() const { return stride_; }
  /// Keys of class `cls` (kLead: the lead block).
  std::size_t count(std::size_t cls) const { return cls == kLead ? lead_ : count_[cls]; }
  /// The column of key t of class `cls`: base(cls) + t.
  std::size_t base(std::size_t cls) const { return cls == kLead ? 0 : base_[cls]; }
  /// The first key of class `cls`: key t of it is first(cls) + step(cls)·t.
  std::size_t first(std::size_t cls) const { return cls == kLead ? 0 : cls; }
  /// The distance between two keys of class `cls`.
  std::size_t step(std::size_t cls) const { return cls == kLead ? 1 : stride_; }
  /// All columns, a multiple of kCols.
  std::size_t columns() const { return columns_; }
  /// One head's rows src[j * dim + c] (keys or values) into its tiles dst (columns() · dim floats;
  /// the padding columns are left as they are).
  void lay_out(const float* src, std::size_t dim, float* dst) const;

 private:
  std::size_t stride_, lead_, columns_ = 0;
  std::vector<std::size_t> count_, base_;
};

/// A query tile: rows first + step·r for r < rows (rows <= kMaxRows).
struct QueryTile {
  std::size_t first = 0;  ///< the first query
  std::size_t step = 1;   ///< the distance between two of its queries
  std::size_t rows = 0;   ///< its queries
};

/// Keys t in [t0, t1) of one class of the layout; when `limited`, row r of the tile reads only
/// t in [lo[r], hi[r]) of them (a window).
struct KeyRun {
  std::size_t cls = 0;             ///< the class (KeyLayout::kLead: the lead block)
  std::int64_t t0 = 0;             ///< its first key read
  std::int64_t t1 = 0;             ///< one past its last key read
  bool limited = false;            ///< whether lo and hi limit each row
  std::int64_t lo[kMaxRows] = {};  ///< row r's first key, when limited
  std::int64_t hi[kMaxRows] = {};  ///< one past row r's last key, when limited
};

/// What a variant adds to the Mask: its sparsity, as the engine's clients state it. The default
/// is full attention: keys in natural order, consecutive query tiles, every key.
class Sparsity {
 public:
  virtual ~Sparsity() = default;
  /// The key layout at these sizes.
  virtual KeyLayout layout(const Dims& d, const Mask& mask) const;
  /// Query tiles of at most `max_rows` rows covering every query once, the same for every head,
  /// heaviest first (the order the dynamic schedule hands them out in).
  virtual std::vector<QueryTile> tiles(const Dims& d, const Mask& mask, std::size_t max_rows) const;
  /// The key runs `tile` reads in batch item b, query head h (appended to `runs`); b lets a
  /// data-dependent sparsity (MoBA's selected blocks) differ from item to item.
  virtual void runs(const KeyLayout& layout, std::size_t b, std::size_t h, const QueryTile& tile,
                    std::vector<KeyRun>& runs) const;
};

/// Throws Error for what the engine cannot take whatever the variant: the forgetting gate
/// (TokenInputs::log_decay) without a causal mask (Attention::forward refuses it first, as
/// Unsupported).
void check(const Mask& mask, const TokenInputs& in, const Dims& d);

/// out [B, H, Nq, Dv] and, when lse is not null, each row's log-sum-exp (natural log, the sink
/// included; -infinity for a row that sees nothing) at lse[(b·H + h)·Nq + i].
void forward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
             const Dims& d, const Sparsity& sparsity, Tensor& out, float* lse);

/// Every gradient of `g` (shaped by Attention::backward) from the forward's row log-sum-exp.
void backward(TensorRef q, TensorRef k, TensorRef v, const Mask& mask, const TokenInputs& in,
              const Dims& d, const Sparsity& sparsity, TensorRef out, TensorRef d_out,
              const RowLogSumExp& lse, AllGradients& g);

/// A (query tile, key chunk) pair as the forward visits it, and its class.
struct TileVisit {
  QueryTile tile;                    ///< the queries
  std::int64_t j0 = 0;               ///< the first key
  std::int64_t step = 1;             ///< the distance between two of its keys
  std::int64_t cols = 0;             ///< its keys: j0 + step·c for c < cols
  TileClass cls = TileClass::empty;  ///< empty: skipped; full: no mask work; partial: masked
};

/// Every (query tile, key chunk) pair that the forward visits for item b and query head h, in
/// its order, with the class the forward's own code gives it (empty ones included: the forward
/// skips them; chunks that no row of a tile reaches are not visited at all). The same
/// classification as the forward's and the backward's (whose query tiles are larger), for
/// pictures (`attnlab mask`) and tests. Validates the mask against d.
std::vector<TileVisit> tile_classes(const Mask& mask, const Dims& d, const Sparsity& sparsity,
                                    std::size_t b, std::size_t h);

/// The (query, key) pairs the interval parts of the mask leave visible, summed over items and
/// query heads (Mask::key_span: neither the boolean nor the custom mask is subtracted).
double visible_pairs(const Mask& mask, const Dims& d);

}  // namespace attnlab::engine
