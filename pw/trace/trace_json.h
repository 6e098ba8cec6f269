// Chrome trace-event JSON (the format chrome://tracing and the Perfetto UI both open) of a
// trace's events. Chosen over Perfetto's protobuf format because it needs no schema at either
// end, is read by every trace viewer and by a test in a few lines of Python, and merges by
// concatenation; its cost (size: ~150 bytes an event) matters little at these event rates.
//
// Layout: one Chrome "process" per group (the controller, the clients, each host) and one
// "thread" per track (the controller, each island's scheduler, each client, each host's
// dispatch, each device), named by metadata events; timestamps in microseconds on the
// controller's clock. Flows are v1 flow events ('s'/'f', bound to the enclosing span).
#pragma once

#include <map>
#include <string>

#include "pw/trace/trace.h"

namespace pw::trace {

// Client id -> tenant name, from the spans that carry one (the controller's submit spans).
std::map<int64_t, std::string> TenantNames(const Chunk& chunk);

// The Chrome trace-event JSON object of `chunk` ({"traceEvents": [...], ...}).
std::string ToChromeJson(const Chunk& chunk);

// Other clients' events of `chunk`, as `viewer` may see them: named "another tenant's
// <category>", without arguments (their names and sizes are their own).
void Anonymize(Chunk& chunk, int64_t viewer);

}  // namespace pw::trace
