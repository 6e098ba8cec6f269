#include "pw/base/log_level.h"

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace pw {

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t.empty() || t == "warning" || t == "warn") return LogLevel::kWarning;
  if (t == "error") return LogLevel::kError;
  if (t == "info") return LogLevel::kInfo;
  if (t == "debug") return LogLevel::kDebug;
  return absl::InvalidArgumentError(absl::StrCat(
      "PW_LOG_LEVEL is '", text, "'; use one of error, warning (the default), info, debug"));
}

LogLevel RuntimeLogLevel() {
  const char* v = std::getenv("PW_LOG_LEVEL");
  absl::StatusOr<LogLevel> level = ParseLogLevel(v == nullptr ? "" : v);
  return level.ok() ? *level : LogLevel::kWarning;
}

int XlaMinLogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
    case LogLevel::kWarning: return 2;  // XLA's errors (and fatal messages) only.
    case LogLevel::kInfo: return 1;     // Its warnings too.
    case LogLevel::kDebug: return 0;    // Everything.
  }
  return 2;
}

void ApplyLogLevelToXla() {
  setenv("TF_CPP_MIN_LOG_LEVEL", std::to_string(XlaMinLogLevel(RuntimeLogLevel())).c_str(), 1);
}

}  // namespace pw
