// text: byte-level language modelling of the King James Bible (training/tasks.hpp has the
// definition).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

#include "training/tasks/task_kit.hpp"

extern char** environ;

namespace attnlab::training {
namespace {

using detail::Random;

constexpr const char* kBible = "/usr/bin/bible";
constexpr const char* kEveryVerse = "Ge1:1-Re22:21";

// What `bible Ge1:1-Re22:21` prints: run once per process without a shell (a fixed argv, its
// stdin /dev/null), the text kept. Throws Error when the program is missing or fails.
std::string read_bible() {
  const std::string missing = std::string("task 'text': cannot run ") + kBible + " " + kEveryVerse +
                              " (the corpus is Debian's bible-kjv package: scripts/install-deps.sh "
                              "installs it)";
  int out[2];
  if (pipe(out) != 0) throw Error(missing + ": no pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  posix_spawn_file_actions_addclose(&actions, out[1]);
  std::string program = kBible, range = kEveryVerse;
  char* argv[] = {program.data(), range.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, kBible, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string text;
  char buffer[1 << 16];
  for (ssize_t got; (got = read(out[0], buffer, sizeof buffer)) != 0;) {
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
  }
  close(out[0]);
  if (spawned != 0) throw Error(missing);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(missing + ": it failed (exit status " + std::to_string(WEXITSTATUS(status)) + ")");
  if (text.size() < 4'000'000)
    throw Error(missing + ": it printed " + std::to_string(text.size()) +
                " bytes, expected the "
                "whole Bible (4.3 MB)");
  return text;
}

// The corpus, read on first use; a failed read is retried by the next call.
const std::string& bible() {
  static std::mutex mutex;
  static std::string text;
  const std::lock_guard lock(mutex);
  if (text.empty()) text = read_bible();
  return text;
}

class Text final : public Task {
 public:
  explicit Text(std::size_t n) : n_(n), corpus_(bible()), split_(text_split(corpus_.size())) {
    if (n + 1 > corpus_.size() - split_)
      throw Error("task 'text': N = " + std::to_string(n) + ": expected N < " +
                  std::to_string(corpus_.size() - split_) + ", the validation bytes");
  }
  std::string spec() const override { return "text"; }
  std::size_t vocab() const override { return 256; }
  std::size_t classes() const override { return 256; }
  Output output() const override { return Output::per_token; }
  std::size_t length() const override { return n_; }
  bool needs_causal() const override { return true; }

  Batch batch(std::size_t size, std::uint64_t seed) const override {
    return windows(size, seed, 0, split_);
  }
  Batch held_out(std::size_t size, std::uint64_t seed) const override {
    return windows(size, seed, split_, corpus_.size());
  }

 private:
  // `size` windows of n + 1 bytes inside [begin, end), each starting uniformly at random:
  // tokens the first n bytes, targets the next byte of each.
  Batch windows(std::size_t size, std::uint64_t seed, std::size_t begin, std::size_t end) const {
    Random rng(seed);
    Batch b = detail::empty_batch(size, n_, n_);
    const std::size_t starts = end - begin - n_;  // windows [s, s + n] with s + n < end
    for (std::size_t e = 0; e < size; ++e) {
      const auto* bytes =
          reinterpret_cast<const unsigned char*>(corpus_.data()) + begin + rng.below(starts);
      for (std::size_t i = 0; i < n_; ++i) {
        b.tokens(e, i) = bytes[i];
        b.targets(e, i) = bytes[i + 1];
      }
    }
    return b;
  }

  std::size_t n_;
  const std::string& corpus_;
  std::size_t split_;
};

std::unique_ptr<Task> make_text(Params&, std::size_t n) {
  return std::make_unique<Text>(n);
}

const Registrar<TaskMaker> kRegistrar(task_registry(), "text", {make_text, ""}, 40);

}  // namespace

const std::string& text_corpus() {
  return bible();
}

std::size_t text_split(std::size_t bytes) {
  return bytes - bytes / 20;
}

}  // namespace attnlab::training
