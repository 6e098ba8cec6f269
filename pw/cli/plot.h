// Plots: `pw bench ... --plot` and `pw trace --plot` draw with matplotlib, through
// python/pathways/plots.py run by the repository's .venv (or $PW_PYTHON).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pw::cli {

// $PW_PYTHON, else the repository's .venv (PW_VENV_PYTHON, set at build time).
std::string Python();

// Runs `python -m pathways.plots <args...>`; its exit status (nonzero, with a message on
// stderr, when it cannot run).
int RunPlotter(const std::vector<std::string>& args);

// Runs `python -m <module> <args...>` and returns its stdout (its stderr passes through); an
// error naming the module if it cannot run or exits nonzero.
absl::StatusOr<std::string> RunPythonModule(const std::string& module,
                                            const std::vector<std::string>& args);

}  // namespace pw::cli
