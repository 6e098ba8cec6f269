// libFuzzer target: the cluster-spec parser (pw up --config, pw controller --config) on
// arbitrary text. A spec it accepts must print and parse again to the same spec.
#include <cstddef>
#include <cstdint>
#include <string>

#include "pw/base/check.h"
#include "pw/cluster/cluster_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pw::ClusterSpec> spec = pw::ClusterSpec::FromJson(text);
  if (!spec.ok()) return 0;
  absl::StatusOr<pw::ClusterSpec> again = pw::ClusterSpec::FromJson(spec->ToJson());
  PW_CHECK(again.ok(), "a spec's own JSON did not parse");
  PW_CHECK(again->ToJson() == spec->ToJson(), "a spec did not round-trip through JSON");
  return 0;
}
