#include "absl/strings/string_view.h"
#include "pw/base/status_macros.h"

#include "absl/strings/str_cat.h"

namespace pw {
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}
}  // namespace pw
