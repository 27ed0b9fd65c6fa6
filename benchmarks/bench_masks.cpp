// The softmax engine under each mask and score modifier (issue 43's speed section), in one binary
// so that every ratio comes from one run: B = 1, Hq = 8, D = 64, N = 16384 unless stated.
//   BM_mask        forward and backward of each mask against dense full: GFLOP/s over the
//                  visible pairs only (forward 4·D per pair, backward 10·D: five GEMMs for two);
//                  MoBA (block 512, top-3, causal) at N = 65536 (issue 46), its pairs those it
//                  attends (flops()), its selection timed with it.
//   BM_modifier    ALiBi, softcap, sinks and the forgetting gate (time; plain full and plain
//                  causal full are BM_mask's dense and causal).
//   BM_grouped     Hkv = 2 and 1 query-head groups (time; Hkv = 8 is BM_mask's dense).
//   BM_train       forward + backward at N = 4096 of 16 documents and window 512, the attnlab
//                  half of benchmarks/masks_vs_torch.py's comparison with PyTorch.
//   ab_*           the same cases for benchmarks/ab_masks.sh (two builds compared on one thread);
//                  tiny_* the same at N = 512, to check that everything runs.
// Each benchmark times the forward saving the log-sum-exp and the backward in turns, as
// bench_backward does. Arguments are indices into the tables below, so a filter names them.
// benchmarks/run_masks.sh runs every case several times with Google Benchmark's repetitions in
// random interleaving, so that each ratio compares medians of calls spread over the same
// stretch of the machine's load, not two single calls minutes apart.
#include <time.h>

#include <array>
#include <chrono>
#include <map>
#include <set>

#include "common.hpp"

using namespace attnlab;

namespace {

constexpr std::size_t kBatch = 1, kHeads = 8, kDim = 64;

// The inputs at a shape and seed, drawn once per process: a normal draw of 8 Mi floats takes most
// of a second, which every repetition would otherwise pay again.
const Tensor& input(std::size_t b, std::size_t h, std::size_t n, std::size_t d,
                    std::uint64_t seed) {
  static std::map<std::array<std::size_t, 5>, Tensor> drawn;
  auto [at, fresh] = drawn.try_emplace({b, h, n, d, static_cast<std::size_t>(seed)});
  if (fresh) at->second = bench::random_tensor(b, h, n, d, seed);
  return at->second;
}

// The masks of BM_mask: a spec and a Mask at length n.
struct MaskCase {
  const char* name;
  std::string spec;
  Mask mask;
};

MaskCase mask_case(int index, std::size_t n) {
  const auto len = static_cast<std::int64_t>(n);
  MaskCase c{"", "full", {}};
  switch (index) {
    case 0:
      c.name = "dense";
      break;
    case 1:
      c.name = "causal";
      c.mask.causal = Causal::top_left;
      break;
    case 2:  // sliding window of 512 each side (FlashAttention's window_size = (512, 512))
      c.name = "window 512";
      c.mask.window = Window{512, 512};
      break;
    case 3:  // causal window of 512, as Mistral's
      c.name = "causal window 512";
      c.mask.causal = Causal::top_left;
      c.mask.window = Window{512, 0};
      break;
    case 4:
      c.name = "16 documents";
      c.mask.documents.push_back(0);
      for (int d = 1; d <= 16; ++d) c.mask.documents.push_back(len * d / 16);
      break;
    case 5:
      c.name = "16 documents causal";
      c.mask.causal = Causal::top_left;
      c.mask.documents.push_back(0);
      for (int d = 1; d <= 16; ++d) c.mask.documents.push_back(len * d / 16);
      break;
    case 6:
      c.name = "prefix-LM, quarter prefix";
      c.mask.causal = Causal::top_left;
      c.mask.prefix_lengths = {len / 4};
      break;
    case 7:
      c.name = "bigbird defaults";
      c.spec = "bigbird";
      break;
    case 8:
      c.name = "sliding 128/128";
      c.spec = "sliding:left=128,right=128";
      break;
    case 9:  // issue 46's MoBA case, at N = 65536: its selection is inside the timed call
      c.name = "MoBA block 512, top-3, causal";
      c.spec = "moba:block=512,topk=3";
      c.mask.causal = Causal::top_left;
      break;
    default:
      throw std::invalid_argument("no mask case " + std::to_string(index));
  }
  return c;
}

// The modifiers of BM_modifier.
struct Modifier {
  const char* name;
  Mask mask;
  bool alibi = false, sinks = false, fox = false;
};

Modifier modifier(int index) {
  Modifier m{"", {}};
  switch (index) {
    case 0:
      m.name = "plain";
      break;
    case 1:
      m.name = "ALiBi";
      m.alibi = true;
      break;
    case 2:
      m.name = "softcap 50";
      m.mask.softcap = 50.0;
      break;
    case 3:
      m.name = "sinks";
      m.sinks = true;
      break;
    case 4:
      m.name = "plain causal";
      m.mask.causal = Causal::top_left;
      break;
    case 5:
      m.name = "forgetting gate (causal)";
      m.mask.causal = Causal::top_left;
      m.fox = true;
      break;
    default:
      throw std::invalid_argument("no modifier " + std::to_string(index));
  }
  return m;
}

// Times the forward (saving the log-sum-exp) and the backward, in turns; per-iteration seconds.
struct Times {
  double forward_s = 0, backward_s = 0;
};

// Outputs and gradients by shape (N, Hq, Hkv), kept from call to call: fresh pages for them
// (128 MiB at N = 16384) would otherwise be timed in a repetition's first call.
struct Buffers {
  Tensor out;
  Saved saved;
  AllGradients g;
};

Buffers& buffers(const Tensor& q, const Tensor& k) {
  static std::map<std::array<std::size_t, 3>, Buffers> kept;
  return kept[{q.shape()[2], q.shape()[1], k.shape()[1]}];
}

// `key` names the case: only its first repetition in a process makes an untimed warm call (the
// engine's scratch allocated, its pages touched), since at N = 16384 a warm call per repetition
// would double the run.
Times forward_backward(benchmark::State& state, const std::string& key, const Attention& a,
                       const Tensor& q, const Tensor& k, const Tensor& v, const Mask& mask,
                       const TokenInputs& in, bool with_backward = true) {
  const Tensor& d_out = input(q.shape()[0], q.shape()[1], q.shape()[2], kDim, 4);
  auto& [out, saved, g] = buffers(q, k);
  static std::set<std::string> warmed;
  if (warmed.insert(key).second) {
    a.forward(q, k, v, mask, in, out, saved);
    if (with_backward) a.backward(q, k, v, mask, in, out, d_out, saved, g);
  }
  // Wall time, and the process's CPU time: with OMP_NUM_THREADS=1 (benchmarks/ab_masks.sh on a
  // loaded machine) the latter is a call's whole cost, which other processes do not stretch.
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  double cpu_forward_s = 0, cpu_backward_s = 0;
  const auto timed = [&](double& cpu_s, auto&& f) {
    const double cpu_start = cpu_now();
    const auto start = std::chrono::steady_clock::now();
    f();
    const auto wall = std::chrono::steady_clock::now() - start;
    cpu_s += cpu_now() - cpu_start;
    return std::chrono::duration<double>(wall).count();
  };
  Times t;
  for (auto _ : state) {
    t.forward_s += timed(cpu_forward_s, [&] { a.forward(q, k, v, mask, in, out, saved); });
    if (with_backward)
      t.backward_s +=
          timed(cpu_backward_s, [&] { a.backward(q, k, v, mask, in, out, d_out, saved, g); });
  }
  const double iterations = static_cast<double>(state.iterations());
  t.forward_s /= iterations;
  t.backward_s /= iterations;
  state.counters["forward_ms"] = 1e3 * t.forward_s;
  state.counters["forward_cpu_ms"] = 1e3 * cpu_forward_s / iterations;
  if (with_backward) {
    state.counters["backward_ms"] = 1e3 * t.backward_s;
    state.counters["backward_cpu_ms"] = 1e3 * cpu_backward_s / iterations;
  }
  return t;
}

// A case's name for forward_backward: the benchmark and its two arguments.
std::string case_key(const char* benchmark, const benchmark::State& state) {
  return std::string(benchmark) + "/" + std::to_string(state.range(0)) + "/" +
         std::to_string(state.range(1));
}

// Arguments: mask index, N.
void BM_mask(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(1));
  const MaskCase c = mask_case(static_cast<int>(state.range(0)), n);
  const auto a = make_attention(c.spec);
  const Tensor& q = input(kBatch, kHeads, n, kDim, 1);
  const Tensor& k = input(kBatch, kHeads, n, kDim, 2);
  const Tensor& v = input(kBatch, kHeads, n, kDim, 3);
  const Times t = forward_backward(state, case_key("mask", state), *a, q, k, v, c.mask, {});
  // The visible pairs: the variant's own FLOP count (2·(Dk + Dv) per pair) over 4·D.
  const double pairs = a->flops(Dims{kBatch, kHeads, n, n, kDim, kDim}, c.mask) / (4.0 * kDim);
  state.counters["forward_GFLOPS"] = 4.0 * kDim * pairs / t.forward_s * 1e-9;
  state.counters["backward_GFLOPS"] = 10.0 * kDim * pairs / t.backward_s * 1e-9;
  state.counters["visible_pairs"] = pairs;
  state.SetLabel(std::string(c.name) + " (" + a->spec() + ")");
}

// Arguments: modifier index, N.
void BM_modifier(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(1));
  const Modifier m = modifier(static_cast<int>(state.range(0)));
  const auto full = make_attention("full");
  const Tensor& q = input(kBatch, kHeads, n, kDim, 1);
  const Tensor& k = input(kBatch, kHeads, n, kDim, 2);
  const Tensor& v = input(kBatch, kHeads, n, kDim, 3);
  const std::vector<float> slopes = alibi_slopes(kHeads), sinks(kHeads, 0.5f);
  TokenTensor gates = TokenTensor::from_shape({kBatch, kHeads, n});
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (float& x : gates) x = -0.05f * unit(rng);
  TokenInputs in;
  if (m.alibi) in.alibi_slopes = std::span<const float>(slopes);
  if (m.sinks) in.sinks = std::span<const float>(sinks);
  if (m.fox) in.log_decay = TokenRef(gates);
  forward_backward(state, case_key("modifier", state), *full, q, k, v, m.mask, in);
  state.SetLabel(m.name);
}

// Arguments: KV heads, N.
void BM_grouped(benchmark::State& state) {
  const auto kv = static_cast<std::size_t>(state.range(0));
  const auto n = static_cast<std::size_t>(state.range(1));
  const auto full = make_attention("full");
  const Tensor& q = input(kBatch, kHeads, n, kDim, 1);
  const Tensor& k = input(kBatch, kv, n, kDim, 2);
  const Tensor& v = input(kBatch, kv, n, kDim, 3);
  forward_backward(state, case_key("grouped", state), *full, q, k, v, {}, {});
  state.SetLabel("Hkv = " + std::to_string(kv));
}

// Arguments: mask index (4: 16 documents, 2: window 512), N: forward + backward per iteration.
void BM_train(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(1));
  const MaskCase c = mask_case(static_cast<int>(state.range(0)), n);
  const auto a = make_attention(c.spec);
  const Tensor& q = input(kBatch, kHeads, n, kDim, 1);
  const Tensor& k = input(kBatch, kHeads, n, kDim, 2);
  const Tensor& v = input(kBatch, kHeads, n, kDim, 3);
  const Times t = forward_backward(state, case_key("train", state), *a, q, k, v, c.mask, {});
  state.counters["train_ms"] = 1e3 * (t.forward_s + t.backward_s);
  state.SetLabel(c.name);
}

}  // namespace

BENCHMARK(BM_mask)
    ->ArgNames({"mask", "N"})
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8}, {16384}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_mask)
    ->ArgNames({"mask", "N"})
    ->ArgsProduct({{9}, {65536}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_modifier)
    ->ArgNames({"modifier", "N"})
    ->ArgsProduct({{1, 2, 3, 5}, {16384}})  // 0 and 4 would repeat BM_mask's dense and causal
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_grouped)
    ->ArgNames({"kv", "N"})
    ->ArgsProduct({{2, 1}, {16384}})  // 8 would repeat BM_mask's dense
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_train)
    ->ArgNames({"mask", "N"})
    ->ArgsProduct({{4, 2}, {4096}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// For benchmarks/ab_masks.sh, which compares two builds on one thread: the sparse masks at
// N = 16384 (a second or two a call), the rest at N = 4096.
BENCHMARK(BM_mask)->Name("ab_mask")->ArgsProduct({{2, 3, 4, 5, 7, 8}, {16384}});
BENCHMARK(BM_mask)->Name("ab_mask")->ArgsProduct({{0, 1}, {4096}});
BENCHMARK(BM_modifier)->Name("ab_modifier")->ArgsProduct({{0, 1, 2, 3, 4, 5}, {4096}});
BENCHMARK(BM_grouped)->Name("ab_grouped")->ArgsProduct({{8, 2, 1}, {4096}});
// The same at a tiny size, to check that everything runs (--benchmark_filter=tiny).
BENCHMARK(BM_mask)->Name("tiny_mask")->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {512}});
BENCHMARK(BM_modifier)->Name("tiny_modifier")->ArgsProduct({{0, 1, 2, 3, 4, 5}, {512}});
BENCHMARK(BM_grouped)->Name("tiny_grouped")->ArgsProduct({{8, 2, 1}, {512}});
BENCHMARK(BM_train)->Name("tiny_train")->ArgsProduct({{4, 2}, {512}});

ATTNLAB_BENCHMARK_MAIN();
