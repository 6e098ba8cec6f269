#include "pw/transport/controller_interface.h"

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"

namespace pw {

absl::StatusOr<ClusterStatus> StatusOfEveryHost(ControllerInterface& controller) {
  PW_ASSIGN_OR_RETURN(ClusterStatus s, controller.Status());
  for (const HostStatus& h : s.hosts) {
    if (!h.error.empty())
      return absl::UnavailableError(
          absl::StrCat("no status from ", h.host.ToString(), ": ", h.error));
  }
  return s;
}

}  // namespace pw
