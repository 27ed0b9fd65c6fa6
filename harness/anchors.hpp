// Published numbers that our tables stand beside, copied from the papers (via
// ../shared/anchors/papers.md) so that the report works without the shared tree.
// They were measured on TPU v3 (LRA) and a V100 (Linformer), on training or full-model runs;
// ratios transfer between machines better than absolute times.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace attnlab::harness::anchors {

/// One model row of the Long Range Arena efficiency table (Tay et al. 2020, arXiv 2011.04006,
/// Table 3): training steps/s on 4x4 TPU v3 and peak memory per device in GB, at N = 1K..4K.
struct LraRow {
  std::string model;                 // as printed in the paper
  std::string variant;               // our factory name; "full" for the Transformer
  std::vector<std::string> setting;  // spec tokens we prefer as "the paper's setting"
  double steps_per_s[4];
  double memory_gb[4];
};

inline constexpr int kLraLengths[4] = {1024, 2048, 3072, 4096};
inline constexpr const char* kLraCitation =
    "Tay et al. 2020, Long Range Arena (arXiv 2011.04006), Table 3: byte-level text "
    "classification, batch 32, 8 heads, d_model 512, training steps/s on 4x4 TPU v3, "
    "peak memory per device";

const std::vector<LraRow>& lra_rows();

/// Linformer inference speed-up over the Transformer (Wang et al. 2020, arXiv 2006.04768,
/// Table 3), one V100; nullopt where the paper has "-" (k >= n).
inline constexpr int kLinformerN[8] = {512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
inline constexpr int kLinformerK[5] = {128, 256, 512, 1024, 2048};
inline constexpr const char* kLinformerCitation =
    "Wang et al. 2020, Linformer (arXiv 2006.04768), Table 3: inference speed-up over the "
    "Transformer, one 16 GB V100, full forward pass, largest batch that fits";
std::optional<double> linformer_speedup(int n, int k);

}  // namespace attnlab::harness::anchors
