// Decoding a whole model token by token (models/decoding.hpp) against its causal forward, and
// text generation from a trained checkpoint (training/generation.hpp, `attnlab generate`):
// greedy decoding gives the tokens that re-running the whole forward at every step gives.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>
#include <xtensor/xview.hpp>

#include "attnlab/error.hpp"
#include "cli_helpers.hpp"
#include "helpers.hpp"
#include "models/decoding.hpp"
#include "models/llama.hpp"
#include "models/transformer.hpp"
#include "training/generation.hpp"
#include "training/trainer.hpp"

using namespace attnlab;
using namespace attnlab::models;

namespace {

ModelConfig tiny_model(Arch arch, const std::string& spec, const std::string& switches,
                       std::size_t kv_heads = 0) {
  ModelConfig m;
  m.arch = arch;
  m.layer.d_model = 16;
  m.layer.heads = 4;
  m.layer.ffn = 32;
  m.layer.spec = spec;
  apply_switches(m.layer, switches);
  m.layer.kv_heads = kv_heads;
  m.layers = 2;
  m.vocab = 32;
  m.seed = 7;
  return m;
}

Mask causal_mask() {
  Mask mask;
  mask.causal = Causal::top_left;
  return mask;
}

// The rows of `model`'s causal forward of `tokens` [B, N], against the decoder fed the first n0
// tokens at once and the rest one at a time (then, for n0 = 0, in pieces of 1, 3 and the rest:
// prefills after prefills). Float32 tolerance: the cores' chunked and recurrent forms and the
// forward sum in other orders; rows are O(1) after the final norm (measured max error ~1e-6).
template <class Model>
void check_decoder_equals_forward(const Model& model, std::size_t n0) {
  const std::size_t batch = 2, n = 11;
  const Tokens tokens = random_tokens(batch, n, model.config().vocab, 3);
  const Activations whole = model.forward(tokens, causal_mask());
  ModelDecoder decoder(model, batch, n);
  std::vector<std::size_t> pieces;
  if (n0 == 0)
    pieces = {1, 3, n - 4};
  else {
    pieces.push_back(n0);
    for (std::size_t i = n0; i < n; ++i) pieces.push_back(1);
  }
  std::size_t at = 0;
  for (std::size_t piece : pieces) {
    const Tokens part = xt::view(tokens, xt::all(), xt::range(at, at + piece));
    const Activations rows = decoder.feed(part);
    REQUIRE(rows.shape()[1] == piece);
    for (std::size_t b = 0; b < batch; ++b)
      for (std::size_t i = 0; i < piece; ++i)
        for (std::size_t c = 0; c < rows.shape()[2]; ++c) {
          INFO("item " << b << " position " << at + i << " channel " << c);
          REQUIRE(rows(b, i, c) == Approx(whole(b, at + i, c)).margin(2e-5).epsilon(1e-4));
        }
    at += piece;
  }
  CHECK(decoder.tokens() == n);
  CHECK(decoder.bytes() > 0);
}

}  // namespace

TEST_CASE("model decoder: the 2017 model's rows equal its causal forward", "[generation]") {
  const auto spec = GENERATE(as<std::string>{}, "full", "sliding:left=3,right=0", "linear",
                             "gated-delta", "retnet", "bigbird:block=2,window=3,global=1,random=0");
  const auto switches = GENERATE(as<std::string>{}, "pre-ln", "", "pre-ln,short-conv,head-norm");
  const auto n0 = GENERATE(std::size_t(0), std::size_t(1), std::size_t(5));
  INFO(spec << " switches '" << switches << "' n0 " << n0);
  check_decoder_equals_forward(EncoderModel(tiny_model(Arch::transformer, spec, switches)), n0);
}

TEST_CASE("model decoder: Llama's rows equal its causal forward, rotary at each position",
          "[generation]") {
  const auto spec =
      GENERATE(as<std::string>{}, "full", "sliding:left=3,right=0", "linear", "gated-delta");
  const auto switches = GENERATE(as<std::string>{}, "", "short-conv,head-norm");
  const std::size_t kv_heads = spec == "full" || spec.starts_with("sliding") ? 2 : 0;
  const auto n0 = GENERATE(std::size_t(0), std::size_t(1), std::size_t(5));
  INFO(spec << " switches '" << switches << "' kv_heads " << kv_heads << " n0 " << n0);
  check_decoder_equals_forward(LlamaModel(tiny_model(Arch::llama, spec, switches, kv_heads)), n0);
}

TEST_CASE("model decoder: refused input leaves it as it was", "[generation]") {
  const EncoderModel model(tiny_model(Arch::transformer, "full", "pre-ln"));
  ModelDecoder decoder(model, 1, 4);
  const Tokens three = random_tokens(1, 3, 32, 1), two = random_tokens(1, 2, 32, 2);
  decoder.feed(three);
  test::require_error([&] { decoder.feed(two); }, {"max_tokens=4", "after the 3 held"});
  test::require_error([&] { decoder.feed(random_tokens(2, 1, 32, 1)); }, {"tokens [2, 1]"});
  CHECK(decoder.tokens() == 3);
  CHECK_NOTHROW(decoder.feed(random_tokens(1, 1, 32, 4)));
  test::require_error<Unsupported>(
      [] {
        const EncoderModel linformer(tiny_model(Arch::transformer, "linformer:k=4", "pre-ln"));
        ModelDecoder(linformer, 1, 8);
      },
      {"linformer", "decoding"});
}

TEST_CASE("self-attention decode: refused input names what was wrong", "[generation][bad-input]") {
  const MultiHeadAttention mha(8, 2, "full");
  AttentionDecoding never_started;
  Activations y;
  const Activations x = xt::zeros<float>({std::size_t(1), std::size_t(3), std::size_t(8)});
  test::require_error([&] { mha.decode(x, never_started, y); }, {"before start_decoding"});
  AttentionDecoding state = mha.start_decoding(2, 4);
  test::require_error([&] { mha.decode(x, state, y); }, {"1 sequences", "batch=2"});
  const Activations two = xt::zeros<float>({std::size_t(2), std::size_t(5), std::size_t(8)});
  test::require_error([&] { mha.decode(two, state, y); }, {"5 tokens", "max_tokens=4"});
  CHECK(state.position == 0);
  const Activations wide = xt::zeros<float>({std::size_t(2), std::size_t(1), std::size_t(6)});
  test::require_error([&] { mha.decode(wide, state, y); }, {"new tokens", "d_model 8"});
}

// ------------------------------------------------------------------------------ generation

namespace {

using training::Generator;
using training::SamplingConfig;
using training::TrainConfig;

// A byte-level language model of the KJV, N = 24, trained 3 steps (seconds): weights past their
// initialisation, as generate meets them.
TrainConfig lm_config(models::Arch arch, const std::string& spec, std::size_t kv_heads = 0) {
  TrainConfig c;
  c.task = "text";
  c.causal = true;
  c.arch = arch;
  c.spec = spec;
  c.kv_heads = kv_heads;
  c.n = 24;
  c.layers = 2;
  c.d_model = 16;
  c.heads = 4;
  c.ffn = 32;
  c.batch = 4;
  c.eval_size = 4;
  c.adam.warmup = 2;
  return c;
}

// Trains `config` 3 steps and saves its checkpoint into dir/checkpoint; returns that folder.
std::string trained_checkpoint(const test::TempDir& dir, const TrainConfig& config) {
  training::Trainer trainer(config);
  for (int i = 0; i < 3; ++i) trainer.step();
  trainer.save(dir.file("checkpoint"));
  return dir.file("checkpoint");
}

std::vector<std::int64_t> bytes_of(const std::string& text) {
  std::vector<std::int64_t> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// Greedy decoding by the whole causal forward, re-run over every token so far at each step.
std::vector<std::int64_t> greedy_by_forward(const training::TaskModel& model,
                                            std::vector<std::int64_t> sequence,
                                            std::size_t tokens) {
  std::vector<std::int64_t> out;
  Activations last, logits;
  for (std::size_t step = 0; step < tokens; ++step) {
    Tokens t = Tokens::from_shape({1, sequence.size()});
    std::copy(sequence.begin(), sequence.end(), t.begin());
    const Activations features = model.features(t, causal_mask());
    const std::size_t d = features.shape()[2];
    last = Activations::from_shape({1, 1, d});
    std::copy_n(features.data() + (sequence.size() - 1) * d, d, last.data());
    model.head_forward(last, logits);
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    out.push_back(best);
    sequence.push_back(best);
  }
  return out;
}

}  // namespace

TEST_CASE("generate: greedy gives the tokens of the whole forward re-run at every step",
          "[generation]") {
  const auto [arch, spec, kv_heads] =
      GENERATE(std::tuple{Arch::transformer, std::string("full"), std::size_t(0)},
               std::tuple{Arch::transformer, std::string("sliding:left=4,right=0"), std::size_t(0)},
               std::tuple{Arch::transformer, std::string("gated-delta"), std::size_t(0)},
               std::tuple{Arch::llama, std::string("full"), std::size_t(2)},
               std::tuple{Arch::llama, std::string("linear"), std::size_t(0)},
               std::tuple{Arch::llama, std::string("sliding:left=4,right=0"), std::size_t(2)});
  INFO(arch_name(arch) << " " << spec << " kv_heads " << kv_heads);
  const test::TempDir dir("generate");
  const Generator generator(trained_checkpoint(dir, lm_config(arch, spec, kv_heads)));
  const std::vector<std::int64_t> prompt = bytes_of("In the beginning");
  SamplingConfig greedy;
  greedy.temperature = 0;
  greedy.tokens = 24 + 1 - prompt.size();  // the model reads all of its N = 24
  std::vector<std::int64_t> streamed;
  const training::Generation g =
      generator.generate(prompt, greedy, [&](std::int64_t t) { streamed.push_back(t); });
  CHECK(g.tokens == greedy_by_forward(generator.model(), prompt, greedy.tokens));
  CHECK(streamed == g.tokens);
  CHECK(g.decoder_bytes > 0);
  CHECK(g.tokens_per_second() > 0);
}

TEST_CASE("generate: a checkpoint of weights only (no optimizer state) generates the same",
          "[generation]") {
  // As benchmarks/checkpoints/kjv is committed: the optimizer's moments are not needed to read.
  const test::TempDir dir("generate-weights");
  const std::string checkpoint = trained_checkpoint(dir, lm_config(Arch::transformer, "full"));
  SamplingConfig greedy;
  greedy.temperature = 0;
  greedy.tokens = 8;
  const auto prompt = bytes_of("In the");
  const auto want = Generator(checkpoint).generate(prompt, greedy).tokens;
  std::filesystem::remove_all(std::filesystem::path(checkpoint) / "optimizer");
  CHECK(Generator(checkpoint).generate(prompt, greedy).tokens == want);
}

TEST_CASE("generate: the committed Llama-style KJV model continues as its whole forward does",
          "[generation]") {
  // benchmarks/checkpoints/kjv-llama: the README's example (scripts/kjv-sample.py).
  const Generator generator(std::string(ATTNLAB_SOURCE_DIR) + "/benchmarks/checkpoints/kjv-llama");
  CHECK(generator.config().arch == Arch::llama);
  const auto prompt = bytes_of("And God said");
  SamplingConfig greedy;
  greedy.temperature = 0;
  greedy.tokens = 16;
  CHECK(generator.generate(prompt, greedy).tokens ==
        greedy_by_forward(generator.model(), prompt, greedy.tokens));
}

TEST_CASE("generate: sampling by temperature and top-k, reproducible from the seed",
          "[generation]") {
  std::mt19937_64 rng(1);
  SamplingConfig c;
  c.temperature = 0;
  const float tied[] = {1, 3, 3, 0};
  CHECK(training::next_token(tied, 4, c, rng) == 1);  // the first largest
  c.temperature = 1;
  c.top_k = 2;
  const float logits[] = {0, 2, 1.5f, -1, 1.9f};
  std::size_t counts[5] = {};
  for (int i = 0; i < 4000; ++i) ++counts[training::next_token(logits, 5, c, rng)];
  CHECK(counts[0] + counts[2] + counts[3] == 0);  // only the two largest logits
  // p(1) = e^2 / (e^2 + e^1.9) = 0.525; 4000 draws: standard deviation 0.008.
  CHECK(double(counts[1]) / 4000 == Approx(0.525).margin(0.04));
  c.top_k = 0;
  c.temperature = 0.5;  // logits / 0.5: p(4) / p(1) = e^-0.2
  for (auto& n : counts) n = 0;
  for (int i = 0; i < 4000; ++i) ++counts[training::next_token(logits, 5, c, rng)];
  CHECK(double(counts[4]) / double(counts[1]) == Approx(std::exp(-0.2)).margin(0.1));

  const test::TempDir dir("generate-seed");
  const Generator generator(trained_checkpoint(dir, lm_config(Arch::llama, "gated-delta")));
  SamplingConfig s;
  s.tokens = 8;
  s.seed = 5;
  const auto first = generator.generate(bytes_of("And God"), s).tokens;
  CHECK(generator.generate(bytes_of("And God"), s).tokens == first);
  s.seed = 6;  // 8 draws from nearly 256 bytes each: another seed gives another text
  CHECK(generator.generate(bytes_of("And God"), s).tokens != first);
}

TEST_CASE("generate: bad input names the parameter", "[generation][bad-input]") {
  const test::TempDir dir("generate-bad");
  const Generator generator(trained_checkpoint(dir, lm_config(Arch::transformer, "full")));
  const std::vector<std::int64_t> prompt = bytes_of("In the beginning");  // 16 of N = 24
  const auto refused = [&](SamplingConfig c, std::initializer_list<std::string> words,
                           std::vector<std::int64_t> p) {
    bool called = false;
    test::require_error([&] { generator.generate(p, c, [&](std::int64_t) { called = true; }); },
                        words);
    CHECK_FALSE(called);  // refused before anything is generated
  };
  SamplingConfig c;
  c.tokens = 0;
  refused(c, {"tokens=0"}, prompt);
  c.tokens = 4;
  for (double t : {-1.0, double(NAN), double(INFINITY)}) {
    c.temperature = t;
    refused(c, {"temperature="}, prompt);
  }
  c.temperature = 1;
  c.top_k = 257;
  refused(c, {"top_k=257", "256"}, prompt);
  c.top_k = 5;
  c.temperature = 0;
  refused(c, {"top_k=5", "temperature=0"}, prompt);
  c = SamplingConfig{};
  c.tokens = 4;
  refused(c, {"prompt", "empty"}, {});
  refused(c, {"prompt token 300"}, {65, 300});
  refused(c, {"prompt's 25 tokens", "maximum length 24"}, bytes_of("In the beginning God crea"));
  c.tokens = 10;  // 16 + 10 - 1 = 25 > 24
  refused(c, {"tokens=10", "maximum length 24", "at most 9"}, prompt);

  TrainConfig mqar = lm_config(Arch::transformer, "full");
  mqar.task = "mqar";
  mqar.n = 32;
  const test::TempDir other("generate-mqar");
  test::require_error([&] { Generator g(trained_checkpoint(other, mqar)); },
                      {"checkpoint", "task mqar", "not a language model"});
  test::require_error([&] { Generator g(other.file("nothing-here")); }, {"nothing-here"});
}

// ------------------------------------------------------------------------------ attnlab generate

namespace {

// The names in `dir`, sorted: what a refused command must leave as it found it.
std::vector<std::string> listing(const test::TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    if (e.path().filename() != "stdout.txt" && e.path().filename() != "stderr.txt")
      names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("attnlab generate: streams the text, then tokens/s and the bytes held", "[cli]") {
  const test::TempDir dir("generate-cli");
  trained_checkpoint(dir, lm_config(Arch::llama, "full", 2));
  const auto r = test::attnlab_cli(dir,
                                   "generate --weights checkpoint --prompt 'In the' --tokens 12 "
                                   "--temperature 0");
  INFO(r.err);
  REQUIRE(r.code == 0);
  const Generator generator(dir.file("checkpoint"));
  std::string expected = "In the";
  for (std::int64_t t : greedy_by_forward(generator.model(), bytes_of("In the"), 12))
    expected += static_cast<char>(t);
  CHECK(r.out == expected + "\n");
  CHECK(r.err.find("12 tokens in") != std::string::npos);
  CHECK(r.err.find("tokens/s") != std::string::npos);
  CHECK(r.err.find("held") != std::string::npos);
  // The run folder works as well as its checkpoint folder; sampling is reproducible.
  const std::string sample = "generate --weights . --prompt 'And' --tokens 6 --seed 3";
  const auto a = test::attnlab_cli(dir, sample), b = test::attnlab_cli(dir, sample);
  CHECK(a.code == 0);
  CHECK(a.out == b.out);
  CHECK(a.out.size() == 3 + 6 + 1);
}

TEST_CASE("attnlab generate: bad input exits 2 with one line, nothing written",
          "[cli][bad-input]") {
  const test::TempDir dir("generate-cli-bad");
  trained_checkpoint(dir, lm_config(Arch::transformer, "linear"));
  TrainConfig mqar = lm_config(Arch::transformer, "full");
  mqar.task = "mqar";
  mqar.n = 32;
  {
    training::Trainer trainer(mqar);
    trainer.save(dir.file("mqar"));
  }
  const auto before = listing(dir);
  const std::string ok = " --prompt 'In the beginning' --tokens 4";
  for (const auto& [args, word] : std::vector<std::pair<std::string, std::string>>{
           {"--weights checkpoint" + ok + " --temperature -1", "temperature=-1"},
           {"--weights checkpoint" + ok + " --temperature nan", "temperature="},
           {"--weights checkpoint" + ok + " --top-k 300", "top_k=300"},
           {"--weights checkpoint" + ok + " --top-k 3 --temperature 0", "top_k=3"},
           {"--weights checkpoint --prompt x --tokens 0", "tokens=0"},
           {"--weights checkpoint --prompt x --tokens -2", "--tokens"},
           {"--weights checkpoint --prompt '' --tokens 2", "prompt"},
           {"--weights checkpoint --prompt 'In the beginning God crea' --tokens 1",
            "maximum length 24"},
           {"--weights checkpoint --prompt 'In the beginning' --tokens 10", "tokens=10"},
           {"--weights mqar" + ok, "not a language model"},
           {"--weights missing" + ok, "missing"},
           {"--prompt x --tokens 2", "--weights"},
       }) {
    INFO("generate " << args);
    const auto r = test::attnlab_cli(dir, "generate " + args);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(word) != std::string::npos);
    CHECK(listing(dir) == before);
  }
}
