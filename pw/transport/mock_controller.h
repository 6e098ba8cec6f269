// MockController: a gmock ControllerInterface for tests of what sits on the interface (the
// client library, the RPC service). Test-only.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "pw/transport/controller_interface.h"

namespace pw {

class MockController : public ControllerInterface {
 public:
  MOCK_METHOD(absl::StatusOr<ClientId>, Connect, (const std::string&, const ConnectOptions&),
              (override));
  MOCK_METHOD(absl::Status, Disconnect, (ClientId), (override));
  MOCK_METHOD(absl::StatusOr<SliceInfo>, AllocateSlice, (ClientId, const SliceRequest&),
              (override));
  MOCK_METHOD(absl::Status, ReleaseSlice, (ClientId, SliceId), (override));
  MOCK_METHOD(absl::StatusOr<FunctionInfo>, RegisterFunction, (ClientId, const FunctionDef&),
              (override));
  MOCK_METHOD(absl::StatusOr<std::vector<ArraySpec>>, LoadFunction,
              (ClientId, FunctionId, SliceId), (override));
  MOCK_METHOD(absl::StatusOr<ProgramId>, RegisterProgram, (ClientId, const ProgramIr&),
              (override));
  MOCK_METHOD(absl::StatusOr<std::string>, ExplainProgram, (ClientId, ProgramId), (override));
  MOCK_METHOD(absl::StatusOr<BufferId>, ReserveBufferIds, (ClientId, int64_t), (override));
  MOCK_METHOD(Future<RunInfo>, Submit,
              (ClientId, ProgramId, const std::vector<BufferId>&, const RunOptions&), (override));
  MOCK_METHOD(absl::StatusOr<ArrayInfo>, PutArray,
              (ClientId, SliceId, const Sharding&, HostArray), (override));
  MOCK_METHOD(Future<HostArray>, FetchArray, (ClientId, BufferId), (override));
  MOCK_METHOD(Future<>, ArrayReady, (ClientId, BufferId), (override));
  MOCK_METHOD(Future<DirectPut>, BeginPut,
              (ClientId, SliceId, const Sharding&, const ArraySpec&), (override));
  MOCK_METHOD(Future<LocatedArray>, LocateArray, (ClientId, BufferId, bool), (override));
  MOCK_METHOD(absl::Status, ReleaseArray, (ClientId, BufferId), (override));
  MOCK_METHOD(Future<>, SaveArray, (ClientId, BufferId, const std::string&), (override));
  MOCK_METHOD(absl::StatusOr<ArrayInfo>, LoadArray,
              (ClientId, SliceId, const Sharding&, const ArraySpec&, const std::string&),
              (override));
  MOCK_METHOD(absl::StatusOr<std::string>, CommitCheckpoint,
              (ClientId, const std::string&,
               (const std::vector<std::pair<std::string, std::string>>&), const std::string&),
              (override));
  MOCK_METHOD(absl::StatusOr<std::string>, ShareArray, (ClientId, BufferId, const ShareOptions&),
              (override));
  MOCK_METHOD(absl::StatusOr<ArrayInfo>, ImportArray, (ClientId, const std::string&),
              (override));
  MOCK_METHOD(absl::Status, RevokeShare, (ClientId, const std::string&), (override));
  MOCK_METHOD(absl::StatusOr<ClusterStatus>, Status, (), (override));
  MOCK_METHOD(absl::Status, SetTenant, (const TenantSettings&), (override));
  MOCK_METHOD(absl::StatusOr<int64_t>, StartTrace, (ClientId), (override));
  MOCK_METHOD(Future<trace::Chunk>, StopTrace, (ClientId, bool), (override));
};

}  // namespace pw
