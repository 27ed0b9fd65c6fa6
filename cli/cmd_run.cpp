// attnlab run: one forward pass on .npy inputs, written to a .npy output.
//   attnlab run --spec SPEC --q q.npy --k k.npy --v v.npy [--causal top-left|bottom-right]
//               [--key-lengths 5,7] [--mask m.npy] [--scale X]
//               [--cu-seqlens o.npy [--cu-seqlens-k ok.npy]] [--window LEFT,RIGHT]
//               [--prefix-lengths p.npy] [--softcap CAP] [--bias b.npy]
//               [--alibi-slopes s.npy|paper] [--sinks s.npy]
//               [--log-decay g.npy] [--beta beta.npy] [--dtype float32|bf16] --out o.npy
// Inputs are float32 or float64 of shape [B,H,N,D], [H,N,D] or [N,D], all three of the same rank
// (k and v may have fewer heads than q: grouped KV heads); the output is float32 with q's rank.
// The mask file is bool or uint8, [Nq,Nk], [H,Nq,Nk] or [B,H,Nq,Nk], true = may attend; the bias
// is float, of the same ranks, broadcastable to [B,H,Nq,Nk]. Offsets (cu_seqlens) and prefix
// lengths are int32 or int64 vectors; sinks and ALiBi slopes float vectors [H] ("paper": ALiBi's
// geometric slopes). The per-token inputs (TokenInputs: the log-decay g, for softmax variants the
// forgetting gate, and the delta rule's beta) are float32 or float64 of q's rank minus one,
// [B,H,N], [H,N] or [N], lowered as q is. Mask::validate and Attention::forward check the values
// and name the parameter. --dtype bf16 rounds q, k, v to bfloat16 and runs Attention's bf16
// forward (.npy has no bfloat16: the output file is float32 holding the bf16 result). Nothing is
// written unless the whole run succeeds.
#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnlab/attnlab.hpp"
#include "attnlab/npy.hpp"
#include "cli/mask_flags.hpp"
#include "cli/run.hpp"

namespace attnlab::cli {

RunHook add_linformer_run_options(CLI::App& run);  // cli/run_linformer.cpp

namespace {

// Variant-specific option groups (see cli/run.hpp): one line each.
std::vector<RunExtension> run_extensions() {
  return {
      add_linformer_run_options,
  };
}

struct RunOptions {
  std::string spec, q, k, v, out, causal = "none", mask, log_decay, beta;
  std::string bias, alibi_slopes, sinks, dtype = "float32";
  MaskFlags mask_flags;
  std::optional<double> scale, softcap;
  std::vector<RunHook> hooks;
};

// A float vector of one value per query head ([H]), for --sinks and --alibi-slopes: its length
// against the heads and its values are checked by Attention::forward, which names the input.
std::vector<float> load_per_head(const std::string& path) {
  const auto a = load_npy_float(path, {1});
  return std::vector<float>(a.begin(), a.end());
}

std::string shape_of(const xt::xarray<float>& a) {
  std::string s = "(";
  for (std::size_t i = 0; i < a.dimension(); ++i)
    s += (i ? ", " : "") + std::to_string(a.shape()[i]);
  return s + ")";
}

// A per-token input of q's rank minus one ([N], [H, N] or [B, H, N]) as [B, H, N], q's leading
// axes lifted the same way; the shape against q's is checked by Attention::forward.
TokenTensor load_tokens(const std::string& path, const char* option, std::size_t q_rank) {
  const auto a = load_npy_float(path, {1, 2, 3});
  if (a.dimension() + 1 != q_rank)
    throw Error(std::string(option) + " " + path + " has shape " + shape_of(a) + ": expected " +
                (q_rank == 4   ? "[B, H, N]"
                 : q_rank == 3 ? "[H, N]"
                               : "[N]") +
                ", one value per token of rank-" + std::to_string(q_rank) + " q, k and v");
  std::array<std::size_t, 3> shape = {1, 1, 1};
  std::copy(a.shape().begin(), a.shape().end(), shape.end() - a.dimension());
  TokenTensor t = TokenTensor::from_shape(shape);
  std::copy(a.begin(), a.end(), t.begin());
  return t;
}

void run(RunOptions& o) {
  auto attention = make_attention(o.spec);
  if (o.dtype != "float32" && o.dtype != "bf16")
    throw Error("--dtype '" + o.dtype + "': expected float32 or bf16");

  const auto q = load_npy_float(o.q), k = load_npy_float(o.k), v = load_npy_float(o.v);
  if (q.dimension() != k.dimension() || q.dimension() != v.dimension())
    throw Error("q " + o.q + " has shape " + shape_of(q) + ", k " + o.k + " has shape " +
                shape_of(k) + ", v " + o.v + " has shape " + shape_of(v) +
                ": q, k and v must have the same rank");

  Mask mask;
  mask.causal = parse_causal(o.causal);
  if (!o.mask.empty()) mask.allowed = mask_to_bhnd(load_npy_mask(o.mask), o.mask);
  mask.scale = o.scale;
  apply_mask_flags(o.mask_flags, mask);
  mask.softcap = o.softcap;

  TokenTensor log_decay, beta;
  TokenInputs tokens;
  if (!o.log_decay.empty()) {
    log_decay = load_tokens(o.log_decay, "--log-decay", q.dimension());
    tokens.log_decay = log_decay;
  }
  if (!o.beta.empty()) {
    beta = load_tokens(o.beta, "--beta", q.dimension());
    tokens.beta = beta;
  }
  Tensor bias;
  if (!o.bias.empty()) {
    bias = read_for("--bias", [&] { return to_bhnd(load_npy_float(o.bias), o.bias); });
    tokens.bias = bias;
  }
  std::vector<float> sinks, slopes;
  if (!o.sinks.empty()) {
    sinks = read_for("--sinks", [&] { return load_per_head(o.sinks); });
    tokens.sinks = std::span<const float>(sinks);
  }
  if (!o.alibi_slopes.empty()) {
    // The paper's slopes need the query heads: the rank of q decides which axis holds them.
    slopes = o.alibi_slopes == "paper"
                 ? alibi_slopes(q.dimension() == 4   ? q.shape()[1]
                                : q.dimension() == 3 ? q.shape()[0]
                                                     : 1)
                 : read_for("--alibi-slopes", [&] { return load_per_head(o.alibi_slopes); });
    tokens.alibi_slopes = std::span<const float>(slopes);
  }

  for (const RunHook& hook : o.hooks) hook(attention);
  // Every allocation from here to the written file (the [B,H,N,D] copies, the forward, the
  // output's copy and its bytes) is covered: an out-of-memory names the spec and the shapes.
  try {
    Tensor out;
    if (o.dtype == "bf16") {
      TensorBf16 out16;
      attention->forward(to_bf16(to_bhnd(q, o.q)), to_bf16(to_bhnd(k, o.k)),
                         to_bf16(to_bhnd(v, o.v)), mask, tokens, out16);
      to_float32(out16, out);  // exact: every value a bf16 one
    } else {
      attention->forward(to_bhnd(q, o.q), to_bhnd(k, o.k), to_bhnd(v, o.v), mask, tokens, out);
    }
    const auto result = from_bhnd(out, q.dimension());
    save_npy(o.out, result);
    std::printf("%s -> %s, shape %s\n", attention->spec().c_str(), o.out.c_str(),
                shape_of(result).c_str());
  } catch (const std::bad_alloc&) {
    throw Error("out of memory running " + attention->spec() + " on q " + shape_of(q) + ", k " +
                shape_of(k) + ", v " + shape_of(v) +
                ": smaller inputs or parameters (k, m, block...) need less");
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd =
      app.add_subcommand("run", "One forward pass on .npy inputs, written to a .npy file");
  cmd->footer(
      "Inputs: float32 or float64 .npy of shape [B,H,N,D], [H,N,D] or [N,D] (all the same rank); "
      "the output is float32 with the same rank.\nExample: attnlab run --spec full --q q.npy "
      "--k k.npy --v v.npy --causal top-left --out o.npy");
  cmd->add_option("--spec", o->spec, "Factory string, e.g. full or bigbird:block=64")->required();
  cmd->add_option("--q", o->q, "Queries .npy")->required();
  cmd->add_option("--k", o->k, "Keys .npy")->required();
  cmd->add_option("--v", o->v, "Values .npy")->required();
  cmd->add_option("--out", o->out, "Output .npy (float32, written only on success)")->required();
  cmd->add_option("--causal", o->causal,
                  "none, top-left or bottom-right (FlashAttention alignment)");
  cmd->add_option("--mask", o->mask, "Boolean mask .npy (bool or uint8), true = may attend");
  cmd->add_option("--scale", o->scale, "Softmax scale (default 1/sqrt(Dk))");
  add_mask_flags(*cmd, o->mask_flags);
  cmd->add_option(
      "--softcap", o->softcap,
      "Tanh soft-capping of the scores, cap > 0 (" + variants_taking(&Support::softcap) + ")");
  cmd->add_option("--bias", o->bias,
                  "Additive float bias .npy broadcastable to [B,H,Nq,Nk] (" +
                      variants_taking(&Support::bias) + ")");
  cmd->add_option("--alibi-slopes", o->alibi_slopes,
                  "ALiBi slopes: .npy float [H] >= 0, or 'paper' for the paper's geometric ones (" +
                      variants_taking(&Support::alibi) + ")");
  cmd->add_option("--sinks", o->sinks,
                  "Attention sinks: .npy float [H], one logit per head (" +
                      variants_taking(&Support::sinks) + ")");
  cmd->add_option("--log-decay", o->log_decay,
                  "Log-decay g .npy, <= 0, one per token: [B,H,N], [H,N] or [N] (a memory's "
                  "decay: " +
                      variants_taking(&Support::log_decay) +
                      "; softmax's forgetting gate, with --causal: " +
                      variants_taking(&Support::forgetting_gate) + ")");
  cmd->add_option("--beta", o->beta,
                  "Delta-rule write strength .npy in [0, 1], shaped as --log-decay (" +
                      variants_taking(&Support::beta) + ")");
  cmd->add_option("--dtype", o->dtype,
                  "float32 (default) or bf16: q, k, v rounded to bfloat16 (to nearest, ties to "
                  "even) and computed on the bf16 path (attnlab --version names it); the output "
                  "file is float32 holding the bf16 result");
  for (RunExtension extend : run_extensions()) o->hooks.push_back(extend(*cmd));
  cmd->callback([o] { run(*o); });
}

}  // namespace attnlab::cli
