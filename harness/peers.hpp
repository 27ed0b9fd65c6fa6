// Peers: exact attention as researchers would otherwise run it, NumPy and PyTorch on the CPU,
// timed on the same shapes in the same run as attnlab's own rows (`attnlab sweep --peers`).
//
// The C++ side writes q, k, v as .npy files into a scratch directory and runs
// `/usr/bin/python3 harness/peers.py` on them. The script computes softmax(q k^T / sqrt(Dk)) v
// in float32 (numpy: max-subtracted softmax; torch: scaled_dot_product_attention when the
// installed torch has it, else the explicit matmul form), causal (top-left) when asked, and
// reports per-call times, the peak extra memory of one call, and the output (for the error
// columns). A missing python, numpy or torch gives status "skipped" with a message, never an
// exception; so does a problem whose dense score matrix would not fit `max_score_bytes`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnlab/tensor.hpp"

namespace attnlab::harness {

struct PeerOptions {
  std::string python = "/usr/bin/python3";
  std::string script;  // empty: find_peers_script()
  int warmup = 1;      // untimed calls before the `reps` timed ones
  int threads = 0;     // 0: leave the libraries' defaults
  // Refuse (status skipped) B*H*Nq*Nk*4 bytes of scores above this: NumPy holds about three
  // times that at once, and the machine is shared.
  std::uint64_t max_score_bytes = 1ull << 30;
};

struct PeerResult {
  std::string status = "skipped";  // ok | skipped | error (the rows.csv status column)
  std::string message;             // one line; empty when ok
  std::string backend;             // what actually ran, e.g. "torch 1.13.0 matmul-softmax"
  std::vector<double> times_s;     // each timed call, seconds
  double time_median_s = 0, time_min_s = 0, time_max_s = 0, time_iqr_s = 0;
  std::int64_t peak_mem_bytes = 0;  // peak extra resident memory of one call
  Tensor output;                    // [B, H, Nq, Dv] when ok
};

/// "numpy", "torch": the peers --peers adds.
std::vector<std::string> peer_names();

/// Runs one peer on q, k, v (layout [B, H, N, D]). `which` is a peer_names() entry (throws
/// Error otherwise); every other failure is reported in the result's status.
PeerResult run_peer(const std::string& which, const Tensor& q, const Tensor& k, const Tensor& v,
                    bool causal, int reps, const PeerOptions& options = {});

/// harness/peers.py next to the source tree (ATTNLAB_PEERS_SCRIPT overrides); empty if absent.
std::string find_peers_script();

}  // namespace attnlab::harness
