// attnlab generate: text from a causal language model trained by `attnlab train --task text
// --causal` (or --arch llama), token by token through every layer's decoder
// (training/generation.hpp). The prompt and the new bytes go to stdout as they come; the last
// line, on stderr, gives the tokens per second and the bytes the decoders held. Writes no file.
//   attnlab generate --weights RUN/checkpoint --prompt TEXT --tokens N [--temperature 1]
//                    [--top-k 0] [--seed 1]
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "models/transformer.hpp"
#include "training/generation.hpp"

namespace attnlab::cli {
namespace {

struct GenerateFlags {
  std::string weights, prompt;
  std::int64_t tokens = 0, top_k = 0;  // signed, so that -2 is refused, not wrapped around
  training::SamplingConfig sampling;
};

void run(GenerateFlags f) {
  f.sampling.tokens = static_cast<std::size_t>(f.tokens);
  f.sampling.top_k = static_cast<std::size_t>(f.top_k);
  const training::Generator generator(f.weights);
  std::vector<std::int64_t> prompt;
  for (const char c : f.prompt) prompt.push_back(static_cast<unsigned char>(c));  // byte tokens
  bool started = false;
  // The prompt is echoed with the first new byte: a refused request prints nothing.
  const training::Generation g = generator.generate(prompt, f.sampling, [&](std::int64_t token) {
    if (!started) std::fputs(f.prompt.c_str(), stdout);
    started = true;
    std::fputc(static_cast<int>(token), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const training::TrainConfig& c = generator.config();
  std::fprintf(stderr,
               "attnlab generate: %zu tokens in %.3f s, %.1f tokens/s (prompt of %zu prefilled "
               "in %.1f ms); the decoders of %zu layers (%s) held %s\n",
               g.tokens.size(), g.prefill_seconds + g.decode_seconds, g.tokens_per_second(),
               prompt.size(), g.prefill_seconds * 1e3, c.layers, generator.model().spec().c_str(),
               models::format_bytes(double(g.decoder_bytes)).c_str());
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto f = std::make_shared<GenerateFlags>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "continue a text with a causal language model trained by attnlab train --task text "
      "--causal (docs/cli.md)");
  const CLI::Range counts(std::int64_t(0), std::int64_t(1) << 40, "an integer >= 0");
  cmd->add_option("--weights", f->weights, "the run's checkpoint folder (RUN/checkpoint or RUN)")
      ->required();
  cmd->add_option("--prompt", f->prompt, "the text to continue (bytes)")->required();
  cmd->add_option("--tokens", f->tokens, "new tokens (bytes) to generate")
      ->required()
      ->check(counts);
  cmd->add_option("--temperature", f->sampling.temperature,
                  "0: greedy; else sample softmax(logits / T)")
      ->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "sample among the k likeliest (0: all)")
      ->capture_default_str()
      ->check(counts);
  cmd->add_option("--seed", f->sampling.seed, "the sampler's seed")->capture_default_str();
  cmd->callback([f] { run(*f); });
}

}  // namespace attnlab::cli
