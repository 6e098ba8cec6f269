// PW_LOG_LEVEL: how much the runtime and the XLA inside its PJRT plugins print. Pure.
//
//   error | warning (the default) | info | debug
//
// XLA's own log (the plugin's; TF_CPP_MIN_LOG_LEVEL) shows only errors unless the level is info
// (its warnings too) or debug (everything): its warnings at the default level are about how a
// module was exported or compiled, which a user of this runtime cannot act on. PW_LOG_LEVEL is
// the one knob: the process's TF_CPP_MIN_LOG_LEVEL is set from it when a plugin loads (JAX sets
// that variable to its own default as it is imported, so a value found there says nothing of
// what the user wants).
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pw {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// `text` as a level ("" is the default, warning); InvalidArgument naming the accepted ones.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text);
// $PW_LOG_LEVEL as a level; an unknown value reads as the default.
LogLevel RuntimeLogLevel();
// TF_CPP_MIN_LOG_LEVEL's value for `level` (3: errors only... 0: everything).
int XlaMinLogLevel(LogLevel level);
// Sets TF_CPP_MIN_LOG_LEVEL from $PW_LOG_LEVEL; call before loading a plugin.
// Not thread-safe against concurrent getenv/setenv (call it where plugins are loaded, once).
void ApplyLogLevelToXla();

}  // namespace pw
