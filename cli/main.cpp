// attnlab: the command-line tool. Each subcommand lives in its own cli/cmd_<name>.cpp, which
// exports `void add_<name>_command(CLI::App&)`; adding one is that file, one line in kCommands
// below (with its declaration) and one line in cli/meson.build.
//
// The one error policy: bad input of any kind (attnlab::Error, a command-line mistake, any other
// std::exception, worded by attnlab::user_message so that no std:: text reaches the user) prints
// ONE line "attnlab: error: ..." on stderr and exits 2; success exits 0.
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "attnlab/attnlab.hpp"
#include "attnlab/blas.hpp"
#include "attnlab/kernels.hpp"

#ifndef ATTNLAB_VERSION
#define ATTNLAB_VERSION "unknown"
#endif

namespace attnlab::cli {
void add_run_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_mask_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
void add_merge_command(CLI::App& app);
void add_model_command(CLI::App& app);
void add_study_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_decode_command(CLI::App& app);
void add_generate_command(CLI::App& app);
}  // namespace attnlab::cli

namespace {

using AddCommand = void (*)(CLI::App&);

// The subcommands, in the order --help lists them.
constexpr AddCommand kCommands[] = {
    attnlab::cli::add_run_command,      attnlab::cli::add_demo_command,
    attnlab::cli::add_mask_command,     attnlab::cli::add_report_command,
    attnlab::cli::add_sweep_command,    attnlab::cli::add_merge_command,
    attnlab::cli::add_model_command,    attnlab::cli::add_study_command,
    attnlab::cli::add_train_command,    attnlab::cli::add_decode_command,
    attnlab::cli::add_generate_command,
};

int fail(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';  // one line, whatever the message
  std::fprintf(stderr, "attnlab: error: %s\n", message.c_str());
  return 2;
}

std::string variant_list() {
  return attnlab::join_names(attnlab::attention_names());
}

bool is_command(const CLI::App& app, const std::string& name) {
  for (const CLI::App* sub : app.get_subcommands({}))
    if (sub->get_name() == name) return true;
  return false;
}

std::string command_list(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands({}))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  attnlab::blas::use_fitting_core(argv);  // may re-execute us once, with OPENBLAS_CORETYPE set
  CLI::App app("attnlab " ATTNLAB_VERSION
               ": efficient attention variants behind one interface.\n"
               "Variants (factory names): " +
                   variant_list() +
                   "\n"
                   "ATTNLAB_ISA=scalar|avx2|avx512 forces a kernel path, "
                   "bf16-via-f32|avx512bf16|amx a bfloat16 one (default: the fastest).",
               "attnlab");
  // A file over `ulimit -f` must fail the write (EFBIG, reported as an error), not kill us.
  std::signal(SIGXFSZ, SIG_IGN);
  std::string kernels;
  try {
    namespace k = attnlab::kernels;
    kernels = std::string(k::isa_name(k::active_isa())) +
              ", bf16: " + k::bf16_path_name(k::active_bf16_path());
  } catch (const std::exception& e) {  // a bad ATTNLAB_ISA
    return fail(attnlab::user_message(e));
  }
  app.set_version_flag("--version",
                       std::string("attnlab ") + ATTNLAB_VERSION + " (kernels: " + kernels +
                           ")\nBLAS: " + attnlab::blas::describe(attnlab::blas::info()));
  app.require_subcommand(1);
  for (AddCommand add : kCommands) add(app);
  // CLI11 would answer a mistyped command with "a subcommand is required": name it instead.
  if (argc > 1 && argv[1][0] != '-' && !is_command(app, argv[1]))
    return fail(std::string("unknown command '") + argv[1] + "' (commands: " + command_list(app) +
                ")");
  try {
    app.parse(argc, argv);  // the chosen subcommand runs inside parse, as its callback
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version: printed on stdout, exit 0
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see attnlab --help)");
  } catch (const std::exception& e) {
    return fail(attnlab::user_message(e));
  }
  return 0;
}
