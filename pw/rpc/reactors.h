// Small helpers for gRPC callback handlers.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {

// Finishes a unary call with `s` at once.
inline grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

}  // namespace pw::rpc
