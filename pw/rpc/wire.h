// Wire forms of the transport's messages: conversions between the plain structs of
// pw/transport (and the bottom layer) and the protobuf messages of proto/pathways.proto.
//
// Every FromProto validates what it reads: a message from the network may be malformed (ids out
// of range, enum values unknown, array bytes not matching their spec), and each such case is an
// InvalidArgument naming the field, never a crash. Thread-compatible pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "pw/rpc/proto/pathways.pb.h"
#include "pw/transport/controller_interface.h"
#include "pw/transport/messages.h"

namespace pw::rpc {

namespace v1 = ::pathways::v1;

// Bumped on every incompatible change to proto/pathways.proto.
inline constexpr int32_t kProtocolVersion = 11;  // 11: client sessions by mail on one machine.

// Status <-> gRPC status (the codes are numerically identical).
// A status message longer than this is cut in ToGrpc: it travels in a header, and a peer drops
// the whole connection over headers beyond 8 KiB (errors of a chain of runs nest each other's).
inline constexpr size_t kMaxGrpcMessageBytes = 4096;
// The middle of a longer message is left out, saying how many bytes.
grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

// A random, non-zero id that names a stub or a session in mail (PeerMail): only the two ends
// of its stream learn it.
uint64_t NewMailId();
void ToProto(const absl::Status& s, v1::StatusProto* out);
absl::Status FromProto(const v1::StatusProto& p);

void ToProto(const ArraySpec& s, v1::ArraySpec* out);
absl::StatusOr<ArraySpec> FromProto(const v1::ArraySpec& p);
// A checkpoint shard's file; FromProto checks ranks, extents and the region's bounds.
void ToProto(const ShardFile& f, v1::ShardFile* out);
absl::StatusOr<ShardFile> FromProto(const v1::ShardFile& p);
void ToProto(const Sharding& s, v1::Sharding* out);
absl::StatusOr<Sharding> FromProto(const v1::Sharding& p);
void ToProto(const HostArray& a, v1::HostArray* out);
// Moves the bytes out of `p` (which is left empty).
absl::StatusOr<HostArray> FromProto(v1::HostArray* p);

void ToProto(const FunctionDef& d, v1::FunctionDef* out);
absl::StatusOr<FunctionDef> FromProto(const v1::FunctionDef& p);
void ToProto(const ProgramIr& ir, v1::ProgramIr* out);
absl::StatusOr<ProgramIr> FromProto(const v1::ProgramIr& p);

void ToProto(const SliceRequest& r, v1::SliceRequest* out);
absl::StatusOr<SliceRequest> FromProto(const v1::SliceRequest& p);
void ToProto(const SliceInfo& s, v1::SliceInfo* out);
absl::StatusOr<SliceInfo> FromProto(const v1::SliceInfo& p);
void ToProto(const ArrayInfo& a, v1::ArrayInfo* out);
absl::StatusOr<ArrayInfo> FromProto(const v1::ArrayInfo& p);
void ToProto(const FunctionInfo& f, v1::FunctionInfo* out);
absl::StatusOr<FunctionInfo> FromProto(const v1::FunctionInfo& p);

void ToProto(const HostProgram& h, v1::HostProgram* out);
absl::StatusOr<HostProgram> FromProto(const v1::HostProgram& p);

void ToProto(const HostStatus& h, v1::HostStatus* out);
absl::StatusOr<HostStatus> FromProto(const v1::HostStatus& p);
void ToProto(const ClusterStatus& c, v1::ClusterStatus* out);
absl::StatusOr<ClusterStatus> FromProto(const v1::ClusterStatus& p);

absl::StatusOr<DispatchMode> DispatchModeFromProto(int32_t mode);
// A submit's RunOptions (mode, timeout, trace flow, output ids), checked.
void ToProto(const RunOptions& o, v1::SubmitRequest* out);
absl::StatusOr<RunOptions> RunOptionsFromProto(const v1::SubmitRequest& p);

void ToProto(const trace::Chunk& c, v1::TraceChunk* out);
absl::StatusOr<trace::Chunk> FromProto(const v1::TraceChunk& p);

}  // namespace pw::rpc
