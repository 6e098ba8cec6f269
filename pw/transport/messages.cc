#include "pw/transport/messages.h"

namespace pw {
absl::string_view DispatchModeName(DispatchMode m) {
  return m == DispatchMode::kParallel ? "parallel" : "sequential";
}
}  // namespace pw
