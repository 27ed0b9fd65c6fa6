// Variant-specific options of `attnlab run` (e.g. Linformer's learned --E/--F projections).
//
// To add some: write cli/run_<variant>.cpp exporting
//     attnlab::cli::RunHook add_<variant>_run_options(CLI::App& run);
// which registers its options on the run subcommand (capture their values in a shared_ptr) and
// returns the hook; add one line to run_extensions() in cmd_run.cpp and the file to
// cli/meson.build. `run` calls every hook after building the backend from --spec and before
// forward. A hook may configure the backend (dynamic_cast to its class) or replace it; when its
// options were given for a spec that cannot take them it throws attnlab::Error naming the option
// and the spec. A hook whose options were not given does nothing.
#pragma once

#include <functional>
#include <memory>

#include <CLI/CLI.hpp>

#include "attnlab/attention.hpp"

namespace attnlab::cli {

using RunHook = std::function<void(std::unique_ptr<Attention>& attention)>;
using RunExtension = RunHook (*)(CLI::App& run);

}  // namespace attnlab::cli
