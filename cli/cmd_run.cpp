// attnlab run: one forward pass on .npy inputs, written to a .npy output.
//   attnlab run --spec SPEC --q q.npy --k k.npy --v v.npy [--causal top-left|bottom-right]
//               [--key-lengths 5,7] [--mask m.npy] [--scale X]
//               [--log-decay g.npy] [--beta beta.npy] --out o.npy
// Inputs are float32 or float64 of shape [B,H,N,D], [H,N,D] or [N,D], all three of the same rank;
// the output is float32 with that rank. The mask file is bool or uint8, [Nq,Nk], [H,Nq,Nk] or
// [B,H,Nq,Nk], true = may attend. The per-token inputs of the linear family (TokenInputs: the
// log-decay g and the delta rule's beta) are float32 or float64 of q's rank minus one, [B,H,N],
// [H,N] or [N], lowered as q is. Nothing is written unless the whole run succeeds.
#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnlab/attnlab.hpp"
#include "attnlab/npy.hpp"
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
  std::string spec, q, k, v, out, causal = "none", key_lengths, mask, log_decay, beta;
  std::optional<double> scale;
  std::vector<RunHook> hooks;
};

std::vector<std::int64_t> parse_key_lengths(const std::string& text) {
  std::vector<std::int64_t> lengths;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    const std::string token = text.substr(start, comma - start);
    std::int64_t n = -1;
    const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), n);
    if (token.empty() || ec != std::errc() || end != token.data() + token.size() || n < 0)
      throw Error("--key-lengths '" + text + "': '" + token +
                  "' is not a non-negative integer (expected e.g. 5,7: one length per batch item)");
    lengths.push_back(n);
    if (comma == std::string::npos) return lengths;
    start = comma + 1;
  }
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

  const auto q = load_npy_float(o.q), k = load_npy_float(o.k), v = load_npy_float(o.v);
  if (q.dimension() != k.dimension() || q.dimension() != v.dimension())
    throw Error("q " + o.q + " has shape " + shape_of(q) + ", k " + o.k + " has shape " +
                shape_of(k) + ", v " + o.v + " has shape " + shape_of(v) +
                ": q, k and v must have the same rank");

  Mask mask;
  mask.causal = parse_causal(o.causal);
  if (!o.key_lengths.empty()) mask.key_lengths = parse_key_lengths(o.key_lengths);
  if (!o.mask.empty()) mask.allowed = mask_to_bhnd(load_npy_mask(o.mask), o.mask);
  mask.scale = o.scale;

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

  for (const RunHook& hook : o.hooks) hook(attention);
  // Every allocation from here to the written file (the [B,H,N,D] copies, the forward, the
  // output's copy and its bytes) is covered: an out-of-memory names the spec and the shapes.
  try {
    Tensor out;
    attention->forward(to_bhnd(q, o.q), to_bhnd(k, o.k), to_bhnd(v, o.v), mask, tokens, out);
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

// The registered variants whose default spec takes the per-token input `input`, for the help
// text: read from their support(), so a new variant is listed without an edit here.
std::string variants_taking(bool Support::*input) {
  std::vector<std::string> names;
  for (const std::string& name : attention_names())
    if (make_attention(name)->support().*input) names.push_back(name);
  return names.empty() ? "none registered" : join_names(names);
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
  cmd->add_option("--key-lengths", o->key_lengths, "Valid keys per batch item, e.g. 5,7");
  cmd->add_option("--mask", o->mask, "Boolean mask .npy (bool or uint8), true = may attend");
  cmd->add_option("--scale", o->scale, "Softmax scale (default 1/sqrt(Dk))");
  cmd->add_option("--log-decay", o->log_decay,
                  "Log-decay g .npy, <= 0, one per token: [B,H,N], [H,N] or [N] (" +
                      variants_taking(&Support::log_decay) + ")");
  cmd->add_option("--beta", o->beta,
                  "Delta-rule write strength .npy in [0, 1], shaped as --log-decay (" +
                      variants_taking(&Support::beta) + ")");
  for (RunExtension extend : run_extensions()) o->hooks.push_back(extend(*cmd));
  cmd->callback([o] { run(*o); });
}

}  // namespace attnlab::cli
