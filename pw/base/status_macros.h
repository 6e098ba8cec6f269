// Status propagation helpers for absl::Status / absl::StatusOr boundaries.
#pragma once

#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PW_CONCAT_INNER_(a, b) a##b
#define PW_CONCAT_(a, b) PW_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define PW_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status pw_status_ = (expr);           \
    if (!pw_status_.ok()) return pw_status_;      \
  } while (0)

// `PW_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value of a StatusOr or returns its error.
#define PW_ASSIGN_OR_RETURN(lhs, expr) \
  PW_ASSIGN_OR_RETURN_IMPL_(PW_CONCAT_(pw_statusor_, __LINE__), lhs, expr)
#define PW_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()

namespace pw {
// Prefixes the message of a non-OK status with `context` ("context: message"), keeping its code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);
}  // namespace pw
