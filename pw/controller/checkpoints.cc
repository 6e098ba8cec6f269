// Controller: checkpoints (SaveArray, LoadArray, CommitCheckpoint). The workers write and read
// the shards (WorkerInterface::SaveShard / LoadShard); here only paths, metadata and the commit.
#include <fcntl.h>
#include <stdio.h>

#include <cerrno>
#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "pw/base/status_macros.h"
#include "pw/checkpoint/zarr.h"
#include "pw/controller/controller.h"

namespace pw {
namespace {

namespace fs = std::filesystem;

// Limits on what CommitCheckpoint writes (Orbax's metadata files).
constexpr size_t kMaxCommitFiles = 16;
constexpr size_t kMaxCommitBytes = size_t{64} << 20;
constexpr size_t kMaxPathBytes = 4096;
// The files a commit may write: Orbax's metadata (the arrays' directories are SaveArray's).
constexpr absl::string_view kMetadataFiles[] = {"_METADATA", "_CHECKPOINT_METADATA", "_sharding",
                                                "commit_success.txt"};

absl::Status FsError(const std::error_code& ec, absl::string_view what, const std::string& path) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", ec.message()));
}

// The region of each distinct shard of `pl` (replicas repeat regions), with the first rank
// holding it.
std::vector<std::pair<int, Box>> DistinctShards(const Placement& pl) {
  std::vector<std::pair<int, Box>> out;
  for (size_t r = 0; r < pl.devices.size(); ++r) {
    Box b = pl.sharding.ShardBox(pl.global.shape, static_cast<int>(r));
    bool seen = false;
    for (const auto& [_, o] : out) seen = seen || o == b;
    if (!seen) out.emplace_back(static_cast<int>(r), std::move(b));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> Controller::CheckpointPath(const std::string& path) const {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint path \"", path, "\" ", why));
  };
  if (path.empty()) return absl::InvalidArgumentError("an empty checkpoint path");
  if (path.size() > kMaxPathBytes) return bad(absl::StrCat("is longer than ", kMaxPathBytes));
  if (path.find('\0') != std::string::npos) return bad("holds a NUL");
  const fs::path p(path);
  for (const fs::path& part : p)
    if (part == "..") return bad("has a \"..\"");
  const std::string& root = options_.checkpoint_root;
  if (root.empty() && !options_.hosts_share_process)
    return absl::FailedPreconditionError(
        "this cluster has no checkpoint root (pw controller --checkpoint-root DIR; pw up's is "
        "<state dir>/checkpoints unless --checkpoint-root says otherwise)");
  if (root.empty()) {
    if (!p.is_absolute()) return bad("is not absolute (this cluster has no checkpoint root)");
    return p.lexically_normal().string();
  }
  const fs::path r = fs::absolute(root).lexically_normal();  // The workers' paths are absolute.
  fs::path full = (p.is_absolute() ? p : r / p).lexically_normal();
  if (full.has_filename() == false) full = full.parent_path();  // A trailing "/".
  const fs::path rel = full.lexically_relative(r);
  if (rel.empty() || rel == "." || *rel.begin() == "..")
    return bad(absl::StrCat("is not within the cluster's checkpoint root ", r.string()));
  return full.string();
}

Future<> Controller::SaveArray(ClientId client, BufferId id, const std::string& path) {
  absl::StatusOr<ClientRegistry::Visit> visit = clients_.Enter(client);
  if (!visit.ok()) return Future<>::Ready(visit.status());
  absl::StatusOr<std::string> dir = CheckpointPath(path);
  if (!dir.ok()) return Future<>::Ready(dir.status());
  auto lb = buffers_.LookupAndPin(client, id);
  if (!lb.ok()) return Future<>::Ready(NotMade(client, id, lb.status()));
  std::shared_ptr<const Placement> pl = lb->placement;
  // One chunk per shard (at least 1 along a dimension of none: an empty array has no chunks).
  Shape shard = pl->sharding.ShardShape(pl->global.shape);
  std::vector<int64_t> chunks(shard.dims().begin(), shard.dims().end());
  for (int64_t& c : chunks) c = std::max<int64_t>(c, 1);
  const checkpoint::ZarrArray z{pl->global, Shape(std::move(chunks))};
  std::error_code ec;
  fs::create_directories(*dir, ec);
  absl::Status made = ec ? FsError(ec, "make", *dir) : checkpoint::WriteZarray(*dir, z);
  if (!made.ok()) {
    Free(buffers_.Unpin({id}));
    return Future<>::Ready(made);
  }
  Promise<> saved;
  Future<> result = saved.future();
  // Pinned until written: releasing the handle meanwhile cannot free the shards. Once made: a
  // run that failed before making a shard never makes it (its workers would wait for it).
  lb->ready.OnReady([this, id, pl, z, dir = *dir,
                     saved = std::move(saved)](const absl::Status& ready) mutable {
    auto done = [this, id, dir, saved = std::move(saved)](const absl::Status& s) mutable {
      Free(buffers_.Unpin({id}));
      saved.Set(s.ok() ? checkpoint::SyncDirectory(dir) : s);
    };
    if (!ready.ok()) return done(ready);
    // One worker per distinct region writes it (a replicated array: one chunk, one writer).
    std::vector<Future<>> written;
    if (pl->global.num_elements() > 0) {
      for (const auto& [rank, box] : DistinctShards(*pl)) {
        WorkerInterface* w = Worker(pl->hosts[rank]);
        const ShardFile file{dir, z.spec, z.chunks, box};
        written.push_back(w == nullptr ? Future<>::Ready(absl::UnavailableError(absl::StrCat(
                                             pl->hosts[rank].ToString(), " has no worker")))
                                       : w->SaveShard(id, pl->devices[rank], file));
      }
    }
    JoinFutures(written).OnReady(std::move(done));
  });
  return result;
}

absl::StatusOr<ArrayInfo> Controller::LoadArray(ClientId client, SliceId slice,
                                                const Sharding& sharding, const ArraySpec& spec,
                                                const std::string& path) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  PW_ASSIGN_OR_RETURN(const std::string dir, CheckpointPath(path));
  // Checked here too (the workers check again), so a wrong path or shape fails the call.
  PW_ASSIGN_OR_RETURN(const checkpoint::ZarrArray z, checkpoint::ReadZarray(dir));
  if (!(z.spec == spec))
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint array at ", dir, " is ",
                                                   z.spec.ToString(), ", not ", spec.ToString()));
  Promise<> ready;
  PW_ASSIGN_OR_RETURN(ArrayInfo info, NewPutArray(client, slice, sharding, spec, ready.future()));
  const ArraySpec shard_spec{spec.dtype, sharding.ShardShape(spec.shape)};
  std::vector<Future<>> loaded;
  for (size_t r = 0; r < info.devices.size(); ++r) {
    WorkerInterface* w = Worker(info.hosts[r]);
    const ShardFile file{dir, spec, {}, sharding.ShardBox(spec.shape, static_cast<int>(r))};
    loaded.push_back(w == nullptr ? Future<>::Ready(absl::UnavailableError(absl::StrCat(
                                        info.hosts[r].ToString(), " has no worker")))
                                  : w->LoadShard(info.id, info.devices[r], shard_spec, file));
  }
  JoinFutures(loaded).OnReady(
      [ready = std::move(ready)](const absl::Status& s) mutable { ready.Set(s); });
  return info;
}

absl::StatusOr<std::string> Controller::CommitCheckpoint(
    ClientId client, const std::string& path,
    const std::vector<std::pair<std::string, std::string>>& files, const std::string& final_path) {
  PW_ASSIGN_OR_RETURN(const ClientRegistry::Visit visit, clients_.Enter(client));
  PW_ASSIGN_OR_RETURN(const std::string dir, CheckpointPath(path));
  PW_ASSIGN_OR_RETURN(const std::string final_dir, CheckpointPath(final_path));
  if (files.size() > kMaxCommitFiles)
    return absl::InvalidArgumentError(absl::StrCat("a checkpoint commit of ", files.size(),
                                                   " files (at most ", kMaxCommitFiles, ")"));
  size_t bytes = 0;
  for (const auto& [name, contents] : files) {
    if (std::find(std::begin(kMetadataFiles), std::end(kMetadataFiles), name) ==
        std::end(kMetadataFiles))
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint file name \"", name, "\" (the metadata files are _METADATA, "
          "_CHECKPOINT_METADATA, _sharding and commit_success.txt)"));
    bytes += contents.size();
  }
  if (bytes > kMaxCommitBytes)
    return absl::InvalidArgumentError(absl::StrCat("checkpoint metadata of ", bytes,
                                                   " bytes (at most ", kMaxCommitBytes, ")"));
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return absl::NotFoundError(absl::StrCat("no checkpoint being written at ", dir));
  // Each file new (never over one there: a committed checkpoint's own are left alone), synced.
  for (const auto& [name, contents] : files)
    PW_RETURN_IF_ERROR(checkpoint::WriteFileDurably(absl::StrCat(dir, "/", name),
                                                    contents.data(), contents.size(),
                                                    /*replace=*/false));
  PW_RETURN_IF_ERROR(checkpoint::SyncDirectory(dir));
  const fs::path parent = fs::path(final_dir).parent_path();
  fs::create_directories(parent, ec);
  if (ec) return FsError(ec, "make", parent.string());
  // At once, and never over a checkpoint already there.
  if (renameat2(AT_FDCWD, dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno == EEXIST)
      return absl::AlreadyExistsError(absl::StrCat("a checkpoint exists at ", final_dir));
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename ", dir, " to ", final_dir));
  }
  PW_RETURN_IF_ERROR(checkpoint::SyncDirectory(parent.string()));
  return final_dir;
}

}  // namespace pw
