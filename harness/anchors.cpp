#include "harness/anchors.hpp"

namespace attnlab::harness::anchors {

const std::vector<LraRow>& lra_rows() {
  // Settings: LRA's local attention used non-overlapping blocks (we have sliding windows: the
  // defaults are shown); Linformer shared the projection between K and V; BigBird ITC defaults.
  static const std::vector<LraRow> rows = {
      {"Transformer", "full", {}, {8.1, 4.9, 2.3, 1.4}, {0.85, 2.65, 5.51, 9.48}},
      {"Local Attention",
       "sliding",
       {"left=128", "right=128", "dilation=1", "global=0"},
       {9.2, 8.4, 7.4, 7.4},
       {0.42, 0.76, 1.06, 1.37}},
      {"Linformer",
       "linformer",
       {"k=256", "share=kv", "init=gaussian"},
       {9.3, 9.1, 8.5, 7.7},
       {0.37, 0.55, 0.99, 0.99}},
      {"BigBird",
       "bigbird",
       {"block=64", "window=3", "global=2", "random=3"},
       {7.4, 3.9, 2.7, 1.5},
       {0.77, 1.49, 2.18, 2.88}},
      {"Linear Transformer",
       "linear",
       {"feature=elu1", "rule=sum"},
       {9.1, 9.3, 8.6, 7.8},
       {0.37, 0.57, 0.80, 1.03}},
      {"Performer",
       "linear",
       {"feature=favor", "rule=sum"},
       {9.5, 9.4, 8.7, 8.0},
       {0.37, 0.59, 0.82, 1.06}},
  };
  return rows;
}

std::optional<double> linformer_speedup(int n, int k) {
  // Rows n = 512 ... 65536, columns k = 128 ... 2048; 0 marks the paper's "-".
  static constexpr double table[8][5] = {
      {1.5, 1.3, 0, 0, 0},       {1.7, 1.6, 1.3, 0, 0},     {2.6, 2.4, 2.1, 1.3, 0},
      {3.4, 3.2, 2.8, 2.2, 1.3}, {5.5, 5.0, 4.4, 3.5, 2.1}, {8.6, 7.8, 7.0, 5.6, 3.3},
      {13, 12, 11, 8.8, 5.0},    {20, 18, 16, 14, 7.9},
  };
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 5; ++j)
      if (kLinformerN[i] == n && kLinformerK[j] == k && table[i][j] > 0) return table[i][j];
  return std::nullopt;
}

}  // namespace attnlab::harness::anchors
