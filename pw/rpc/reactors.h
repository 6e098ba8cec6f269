// Small helpers for gRPC callback handlers.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "pw/base/future.h"
#include "pw/rpc/wire.h"

namespace pw::rpc {

// Finishes a unary call with `s` at once.
inline grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

// Finishes a unary call with `f`'s status once it is ready (on the thread that readies it).
inline grpc::ServerUnaryReactor* ReplyWhen(grpc::CallbackServerContext* ctx, const Future<>& f) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  f.OnReady([r](const absl::Status& s) { r->Finish(ToGrpc(s)); });
  return r;
}

// Options for a stream's write when `more` messages are queued behind it: gRPC may hold it back
// and send it with the next (one system call for a burst of small messages, not one each).
inline grpc::WriteOptions Coalesced(bool more) {
  grpc::WriteOptions o;
  if (more) o.set_buffer_hint();
  return o;
}

}  // namespace pw::rpc
