// `attnlab train` end to end: plain progress lines off a terminal, the output folder, a run
// SIGKILLed and resumed that ends bitwise equal to an uninterrupted one, and bad options.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "attnlab/npy.hpp"
#include "cli_helpers.hpp"

using namespace attnlab::test;
using attnlab::load_npy_float;
namespace fs = std::filesystem;

namespace {

const std::string kRun =
    "train --task copy --spec full --n 16 --d-model 16 --heads 2 --ffn 32 "
    "--batch 8 --eval-size 16 --eval-every 10 --checkpoint-every 3 --steps 30";

// The step in DIR/checkpoint/state.txt, 0 when there is none yet.
std::size_t checkpoint_step(const std::string& dir) {
  std::ifstream in(dir + "/checkpoint/state.txt");
  std::string key;
  std::size_t step = 0;
  in >> key >> step;
  return key == "step" ? step : 0;
}

// Column `c` of every row of a CSV (the header skipped).
std::string column(const std::string& path, int c) {
  std::ifstream in(path);
  std::string line, out;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::size_t start = 0;
    for (int i = 0; i < c; ++i) start = line.find(',', start) + 1;
    out += line.substr(start, line.find(',', start) - start) + "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("attnlab train writes its logs, checkpoint and summary, with plain progress lines",
          "[cli][training]") {
  TempDir dir("train-cmd");
  const CliResult r = attnlab_cli(dir, kRun + " --out a --profile 2");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("step 30/30") != std::string::npos);
  CHECK(r.err.find("ETA") != std::string::npos);
  CHECK(r.err.find('\r') == std::string::npos);  // not a terminal: no redrawn line
  CHECK(r.out.find("time split of a step") != std::string::npos);
  const std::string summary = read_text(dir.file("a/summary.json"));
  for (const char* key : {"\"git_commit\"", "\"seconds_per_step\"", "\"peak_heap_bytes\"",
                          "\"attention_seconds\"", "\"loadavg_before\""})
    CHECK(summary.find(key) != std::string::npos);
  const std::string steps = column(dir.file("a/train.csv"), 0);
  CHECK(std::count(steps.begin(), steps.end(), '\n') == 30);  // every step once
  CHECK(checkpoint_step(dir.file("a")) == 30);
}

TEST_CASE("attnlab train SIGKILLed and rerun ends bitwise equal to an uninterrupted run",
          "[cli][training]") {
  TempDir dir("train-kill");
  REQUIRE(attnlab_cli(dir, kRun + " --quiet --out straight").code == 0);

  const char* exe = std::getenv("ATTNLAB_CLI");
  REQUIRE(exe != nullptr);
  const std::string out = dir.file("killed");
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const std::string cmd =
        "exec '" + std::string(exe) + "' " + kRun + " --quiet --out '" + out + "' >/dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  bool exited = false;
  while (!exited && checkpoint_step(out) < 6) {
    exited = waitpid(child, &status, WNOHANG) == child;
    ::usleep(1000);
  }
  if (!exited) {
    ::kill(child, SIGKILL);
    REQUIRE(waitpid(child, &status, 0) == child);
  }
  const std::size_t at = checkpoint_step(out);
  INFO("killed with the checkpoint at step " << at);
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
    WARN("the run finished before the kill: this machine is too fast for the test's size");

  const CliResult r = attnlab_cli(dir, kRun + " --out killed");
  INFO(r.err);
  REQUIRE(r.code == 0);
  if (at < 30) CHECK(r.err.find("resuming from") != std::string::npos);
  for (const auto& entry : fs::recursive_directory_iterator(dir.file("straight/checkpoint"))) {
    if (!entry.is_regular_file()) continue;
    const fs::path rel = fs::relative(entry.path(), dir.file("straight/checkpoint"));
    INFO(rel.string());
    if (rel == "state.txt") continue;  // its training seconds differ
    REQUIRE(read_text(entry.path().string()) ==
            read_text(dir.file("killed/checkpoint/" + rel.string())));
  }
  // The logs: every step once, the same losses and accuracies.
  CHECK(column(dir.file("killed/train.csv"), 1) == column(dir.file("straight/train.csv"), 1));
  CHECK(column(dir.file("killed/eval.csv"), 2) == column(dir.file("straight/eval.csv"), 2));
}

TEST_CASE("attnlab train: bad options exit 2 with one line naming the problem", "[cli][training]") {
  TempDir dir("train-bad");
  const auto one_line = [&](const std::string& args, const std::string& fragment) {
    const CliResult r = attnlab_cli(dir, args);
    INFO(args << "\n" << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(fragment) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  };
  one_line("train --spec full --task sorting --n 16 --out o", "sorting");
  one_line("train --spec full --d-model 64 --heads 3 --n 16 --out o", "heads");
  one_line("train --spec nope --task copy --n 16 --out o", "nope");
  one_line("train --spec full --task copy --n 16 --steps many --out o", "--steps");
  one_line("train --spec full --task copy --n 16 --eval-every 0 --out o", "--eval-every");
  one_line("train --task copy --n 16", "--spec");
  // A checkpoint of another run is not resumed into this one.
  REQUIRE(attnlab_cli(dir,
                      "train --spec full --task copy --n 16 --d-model 16 --heads 2 --ffn 32 "
                      "--steps 2 --quiet --out o")
              .code == 0);
  one_line(
      "train --spec full --task copy --n 16 --d-model 16 --heads 2 --ffn 32 --steps 4 "
      "--lr 0.01 --quiet --out o",
      "another run");
}

TEST_CASE(
    "attnlab train --causal, --init and --dump-batches: runs, and bad uses exit 2 with one "
    "line",
    "[cli][training]") {
  TempDir dir("train-causal");
  const std::string tiny =
      "train --task copy --n 16 --d-model 16 --heads 2 --ffn 32 --batch 4 "
      "--eval-size 4 --steps 2 --quiet ";
  REQUIRE(attnlab_cli(dir, tiny + "--spec linear --causal --dump-batches b --out a").code == 0);
  CHECK(read_text(dir.file("a/summary.json")).find("causal 1") != std::string::npos);
  CHECK(fs::exists(dir.file("b/step-2.targets.npy")));
  REQUIRE(attnlab_cli(dir, tiny + "--spec full --init a/checkpoint --out c").code == 0);
  const auto one_line = [&](const std::string& args, const std::string& fragment) {
    const CliResult r = attnlab_cli(dir, tiny + args);
    INFO(args << "\n" << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(fragment) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  };
  one_line("--spec linformer:k=4 --causal --out d", "linformer does not support causal masks");
  one_line("--spec full --init nowhere --out d", "nowhere: not a directory");
  one_line("--spec full --init a/checkpoint --switches pre-ln,no-final-norm --out d",
           "no parameter");
  one_line("--spec full --switches no-final-norm --out d", "no-final-norm without pre-ln");
  one_line("--spec linear --out a", "another run");  // a's checkpoint is causal
}

TEST_CASE("attnlab train --task text reports validation bits per byte, and needs --causal",
          "[cli][training]") {
  TempDir dir("train-text");
  const std::string tiny =
      "train --task text --spec full --n 32 --d-model 16 --heads 2 --ffn 32 "
      "--batch 4 --eval-size 8 --steps 2 --quiet ";
  const CliResult refused = attnlab_cli(dir, tiny + "--out u");
  CHECK(refused.code == 2);
  CHECK(refused.err ==
        "attnlab: error: task 'text' is a language model: it needs train --causal "
        "(a bidirectional model would see the byte it is asked to predict)\n");
  const CliResult r = attnlab_cli(dir, tiny + "--causal --out t");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("bits per target") != std::string::npos);
  CHECK(read_text(dir.file("t/eval.csv")).rfind("step,loss,accuracy,seconds,bits\n", 0) == 0);
  CHECK(read_text(dir.file("t/summary.json")).find("\"bits\"") != std::string::npos);
}

TEST_CASE(
    "attnlab train --arch llama: Hugging Face's names, tied or not; bad uses exit 2 with "
    "one line naming the field and write nothing",
    "[cli][training]") {
  TempDir dir("train-llama");
  const std::string tiny =
      "train --arch llama --n 16 --d-model 16 --heads 2 --ffn 32 --batch 4 --eval-size 4 "
      "--steps 2 --quiet ";
  // A language model with its head tied to the embedding: no lm_head of its own; causal
  // without --causal (a Llama model is).
  REQUIRE(attnlab_cli(dir, tiny + "--task text --spec full --tied-embeddings --out t").code == 0);
  const std::string summary = read_text(dir.file("t/summary.json"));
  CHECK(summary.find("arch llama") != std::string::npos);
  CHECK(summary.find("tied_embeddings 1") != std::string::npos);
  CHECK(fs::exists(dir.file("t/checkpoint/model.layers.1.self_attn.q_proj.weight.npy")));
  CHECK(fs::exists(dir.file("t/checkpoint/model.embed_tokens.weight.npy")));
  CHECK_FALSE(fs::exists(dir.file("t/checkpoint/lm_head.weight.npy")));
  // Untied, on MQAR with gated-delta: an lm_head; a rerun with more steps resumes it.
  REQUIRE(attnlab_cli(dir, tiny + "--task mqar:pairs=2,vocab=16 --spec gated-delta --out m").code ==
          0);
  CHECK(fs::exists(dir.file("m/checkpoint/lm_head.weight.npy")));
  CHECK(fs::exists(dir.file("m/checkpoint/model.layers.0.self_attn.gate_proj.weight.npy")));
  // The per-channel gate (KDA's form with kda) and DeltaProduct's two keys per token are
  // checkpointed under their names and shapes.
  REQUIRE(attnlab_cli(dir, tiny + "--task mqar:pairs=2,vocab=16 --spec kda --switches "
                                  "pre-ln,short-conv,head-norm,channel-gate --out kda")
              .code == 0);
  const std::string gate = "kda/checkpoint/model.layers.0.self_attn.channel_gate.";
  CHECK(load_npy_float(dir.file(gate + "down.weight.npy")).shape()[0] == 8);  // rank dk
  CHECK(load_npy_float(dir.file(gate + "up.bias.npy"), {1}).shape()[0] == 16);
  CHECK(load_npy_float(dir.file(gate + "a_log.npy"), {1}).shape()[0] == 2);
  CHECK_FALSE(fs::exists(dir.file("kda/checkpoint/model.layers.0.self_attn.gate_proj.weight.npy")));
  REQUIRE(attnlab_cli(dir, tiny + "--task mqar:pairs=2,vocab=16 --spec delta-product:steps=2 "
                                  "--switches pre-ln,short-conv --out dp")
              .code == 0);
  CHECK(load_npy_float(dir.file("dp/checkpoint/model.layers.0.self_attn.k_proj.weight.npy"))
            .shape()[0] == 32);
  CHECK(load_npy_float(dir.file("dp/checkpoint/model.layers.0.self_attn.beta_proj.weight.npy"))
            .shape()[0] == 4);
  // Based's layers: a Taylor-map linear attention, then a causal window, alternating.
  REQUIRE(attnlab_cli(dir, tiny + "--task mqar:pairs=2,vocab=16 --spec "
                                  "'linear:feature=taylor;sliding:left=3,right=0' --out based")
              .code == 0);
  CHECK(read_text(dir.file("based/summary.json")).find("sliding:left=3") != std::string::npos);
  // Grouped heads (MQA): k_proj and v_proj have d_k rows; kv_heads is part of the run's identity.
  REQUIRE(attnlab_cli(dir, tiny + "--task mqar:pairs=2,vocab=16 --spec full --kv-heads 1 --out g")
              .code == 0);
  CHECK(read_text(dir.file("g/summary.json")).find("kv_heads 1") != std::string::npos);
  for (const char* block : {"k_proj", "v_proj"})
    CHECK(load_npy_float(dir.file("g/checkpoint/model.layers.1.self_attn." + std::string(block) +
                                  ".weight.npy"))
              .shape()[0] == 8);
  // A linear core takes grouped heads too: its state per query head, its gates per query head.
  REQUIRE(attnlab_cli(dir, tiny + "--task mqar:pairs=2,vocab=16 --spec gated-delta --kv-heads 1 "
                                  "--out gq")
              .code == 0);
  CHECK(load_npy_float(dir.file("gq/checkpoint/model.layers.0.self_attn.gate_proj.weight.npy"))
            .shape()[0] == 2);

  const auto one_line = [&](const std::string& args, const std::string& fragment,
                            const std::string& out = "bad") {
    const CliResult r = attnlab_cli(dir, args + " --out " + out);
    INFO(args << "\n" << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find(fragment) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(dir.file("bad")));
  };
  const std::string mqar = tiny + "--task mqar:pairs=2,vocab=16 --spec full ";
  one_line("train --arch gpt --task copy --spec full --n 16", "arch 'gpt'");
  one_line(mqar + "--kv-heads 3", "kv_heads=3");
  one_line(mqar + "--kv-heads 1 --switches tied-qk", "tied-qk");
  one_line(mqar + "--switches channel-gate", "channel-gate");
  one_line(tiny + "--task mqar:pairs=2,vocab=16 --spec 'full;'", "empty layer spec");
  one_line(tiny +
               "--task mqar:pairs=2,vocab=16 --spec delta-product:steps=2 --switches "
               "channel-gate",
           "channel-gate");
  one_line(mqar + "--rope-base 0", "rope_base");
  one_line(mqar + "--rope-base -5", "rope_base");
  one_line("train --arch llama --task copy --spec full --n 16 --d-model 18 --heads 2",
           "head dimension");
  one_line(tiny + "--task listops:max_len=16,min_len=4 --spec full --tied-embeddings",
           "tied_embeddings");
  one_line("train --task copy --spec full --n 16 --d-model 16 --heads 2 --tied-embeddings",
           "tied_embeddings");
  one_line("train --task copy --spec full --n 16 --d-model 16 --heads 2 --rope-base 500",
           "rope_base=500");
  one_line("train --task copy --spec full --n 16 --d-model 16 --heads 2 --kv-heads 1",
           "kv_heads=1");
  // Another run's checkpoint, and weights folders of another model, are named.
  one_line(tiny + "--task text --spec full", "another run", "t");  // t's head is tied
  one_line(mqar, "another run", "g");                              // g has grouped heads
  REQUIRE(attnlab_cli(dir, mqar + "--tied-embeddings --out tied").code == 0);
  one_line(mqar + "--init tied/checkpoint", "lm_head.weight.npy: missing");
  fs::copy(dir.file("m/checkpoint"), dir.file("extra"), fs::copy_options::recursive);
  fs::copy_file(dir.file("extra/lm_head.weight.npy"), dir.file("extra/head.weight.npy"));
  one_line(tiny + "--task mqar:pairs=2,vocab=16 --spec gated-delta --init extra",
           "head.weight.npy belong to no parameter");
}
