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

absl::StatusOr<LinkBytes> ReceivedBytes(ControllerInterface& controller) {
  PW_ASSIGN_OR_RETURN(const ClusterStatus s, StatusOfEveryHost(controller));
  LinkBytes b;
  for (const HostStatus& h : s.hosts) {
    b.ici += h.ici_bytes_received;
    b.dcn += h.dcn_bytes_received;
    b.ici_wire += h.ici_wire_bytes_received;
    b.dcn_wire += h.dcn_wire_bytes_received;
  }
  return b;
}

}  // namespace pw
