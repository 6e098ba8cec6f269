#include "pw/worker/worker.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "pw/trace/trace.h"
#include "pw/base/status_macros.h"
#include "pw/checkpoint/zarr.h"
#include "pw/pjrt/shard_executable.h"

namespace pw {
namespace {

// Writes shard `b` as the chunk of `file` at its region (a device's buffer copied to host first).
absl::Status WriteShardChunk(const ShardFile& file, const DeviceBuffer& b) {
  const checkpoint::ZarrArray z{file.global, file.chunks};
  if (file.chunks.rank() != file.global.shape.rank() || b.spec().dtype != file.global.dtype ||
      file.box.start.size() != file.box.limit.size() ||
      b.spec().num_elements() != file.box.num_elements())
    return absl::InvalidArgumentError(absl::StrCat("a shard of ", b.spec().ToString(),
                                                   " is not the region's chunk of ",
                                                   file.global.ToString()));
  if (const HostDeviceBuffer* h = b.AsHost(); h != nullptr)
    return checkpoint::WriteChunk(file.dir, z, file.box, h->data());
  std::vector<char> host(static_cast<size_t>(b.spec().size_bytes()));
  PW_RETURN_IF_ERROR(b.CopyToHost(host.data()).Await());
  return checkpoint::WriteChunk(file.dir, z, file.box, host.data());
}

// Shard `spec` on `device`: region `file.box` of the array in `file.dir`, which must be
// `file.global`.
absl::StatusOr<DeviceBufferRef> ReadShardChunks(const ShardFile& file, const ArraySpec& spec,
                                                DeviceId device) {
  PW_ASSIGN_OR_RETURN(checkpoint::ZarrArray z, checkpoint::ReadZarray(file.dir));
  if (!(z.spec == file.global))
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint holds ", z.spec.ToString(),
                                                   ", not ", file.global.ToString()));
  if (file.box.start.size() != file.box.limit.size() ||
      file.box.num_elements() != spec.num_elements())
    return absl::InvalidArgumentError(
        absl::StrCat("the shard's region does not hold ", spec.ToString()));
  std::shared_ptr<HostDeviceBuffer> buffer = HostDeviceBuffer::Create(spec, device);
  PW_RETURN_IF_ERROR(checkpoint::ReadRegion(file.dir, z, file.box, buffer->mutable_data()));
  return DeviceBufferRef(std::move(buffer));
}

std::vector<DeviceId> IdsOf(const std::vector<DeviceSpec>& devices) {
  std::vector<DeviceId> ids;
  for (const DeviceSpec& d : devices) ids.push_back(d.id);
  return ids;
}

}  // namespace

std::string Worker::NodeWhere(const HostWork& work, const NodeWork& node, DeviceId device) {
  return absl::StrCat(work.run.ToString(), " program '", work.program->program, "' node '", node.name,
                      "' on ", device.ToString());
}

ObjectStore::Memory Worker::ReserveMemory(Device& device, int64_t bytes,
                                          Future<ReservationRef>* pending) {
  if (ReservationRef granted = device.memory().TryReserve(bytes)) return granted;
  Future<ReservationRef> f = device.memory().Reserve(bytes);
  if (pending != nullptr) *pending = f;
  return f;
}

Worker::Worker(HostId host, IslandId island, const std::vector<DeviceSpec>& devices,
               Collectives* collectives, PeerLookup peers,
               std::shared_ptr<pjrt::PjrtBackend> pjrt)
    : host_(host),
      island_(island),
      collectives_(collectives),
      peers_(std::move(peers)),
      pjrt_(std::move(pjrt)),
      io_(absl::StrCat("pw-io", host.value())),
      data_plane_(absl::StrCat("pw-data", host.value())),
      client_time_(IdsOf(devices)),
      compile_(absl::StrCat("pw-compile", host.value())),
      dispatch_(absl::StrCat("pw-disp", host.value())) {
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceSpec& d = devices[i];
    devices_.emplace(d.id, std::make_unique<Device>(d.id, d.host, d.island, d.memory_bytes));
  }
}

Worker::~Worker() { Fail(absl::CancelledError(absl::StrCat(host_.ToString(), " shut down"))); }

Future<> Worker::LoadFunction(FunctionId id, const FunctionDef& def) {
  // A per-shard XLA module is compiled here, when first bound to a slice on this host (on the
  // compile thread, under no lock dispatch takes): its first run then finds it compiled, and a
  // module XLA rejects fails its binding, naming the function. SPMD modules depend on their
  // slice's devices and compile on the compile thread when first dispatched.
  const auto* hlo = std::get_if<StableHloFunctionDef>(&def);
  if (hlo == nullptr || hlo->num_partitions != 1 || pjrt_ == nullptr) {
    pw::MutexLock lock(&fn_mu_);
    functions_[id] = def;
    return Future<>::Ready(absl::OkStatus());
  }
  Promise<> loaded;
  Future<> f = loaded.future();
  compile_.Post([this, id, def = *hlo, loaded = std::move(loaded)]() mutable {
    trace::Span span(trace::CompileTrack(host_), "compile", def.name);
    span.Arg("function", def.name).Arg("partitions", 1);
    const int64_t t0 = trace::Now();
    auto exe = pjrt::PjrtShardExecutable::Precompile(pjrt_, def);
    compiles_.fetch_add(1, std::memory_order_relaxed);
    compile_ns_.fetch_add(trace::Now() - t0, std::memory_order_relaxed);
    if (!exe.ok()) return loaded.Set(Annotate(exe.status(), host_.ToString()));
    {
      pw::MutexLock lock(&fn_mu_);
      functions_[id] = std::move(def);
      precompiled_[id] = *std::move(exe);
    }
    loaded.Set();
  });
  return f;
}

void Worker::Unload(const std::vector<FunctionId>& functions,
                    const std::vector<uint64_t>& host_programs) {
  // Destroyed after fn_mu_ is released (an executable's destructor may take time in the
  // plugin); work in flight keeps what it holds.
  std::vector<Loaded> executables;
  std::vector<std::shared_ptr<const pjrt::PjrtExecutable>> precompiled;
  const absl::flat_hash_set<FunctionId> gone(functions.begin(), functions.end());
  {
    pw::MutexLock lock(&fn_mu_);
    for (FunctionId id : functions) {
      functions_.erase(id);
      if (auto it = precompiled_.find(id); it != precompiled_.end()) {
        precompiled.push_back(std::move(it->second));
        precompiled_.erase(it);
      }
    }
    for (auto it = executables_.begin(); it != executables_.end();) {
      if (gone.contains(std::get<0>(it->first))) {
        executables.push_back(std::move(it->second));
        executables_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  // Plans (which hold executables) are the dispatch thread's: dropped there, after the work
  // queued before this, with those of programs that have gone.
  dispatch_.Post([this, programs = absl::flat_hash_set<uint64_t>(host_programs.begin(),
                                                                  host_programs.end())] {
    DropPlans(programs);
  });
}

absl::StatusOr<Worker::Loaded> Worker::LoadExecutable(FunctionId id,
                                                      absl::Span<const DeviceId> slice_devices) {
  const int num_shards = static_cast<int>(slice_devices.size());
  ExecutableKey key(id, num_shards, {});
  pw::MutexLock lock(&fn_mu_);
  auto fit = functions_.find(id);
  if (fit == functions_.end())
    return absl::NotFoundError(absl::StrCat(id.ToString(), " was never loaded on ",
                                            host_.ToString()));
  const auto* hlo = std::get_if<StableHloFunctionDef>(&fit->second);
  if (hlo != nullptr && hlo->num_partitions > 1)
    std::get<2>(key).assign(slice_devices.begin(), slice_devices.end());
  if (auto it = executables_.find(key); it != executables_.end()) {
    executable_hits_.fetch_add(1, std::memory_order_relaxed);
    return it->second;
  }
  if (hlo == nullptr) {  // Native kernels: checked and bound in microseconds, here.
    PW_ASSIGN_OR_RETURN(ExecutableRef exe,
                        CompileNative(std::get<NativeFunctionDef>(fit->second), num_shards));
    std::vector<ArraySpec> outputs = exe->output_specs();
    const int64_t temp_bytes = exe->temp_bytes();
    return executables_
        .emplace(std::move(key), Loaded{Future<ExecutableRef>::Ready(std::move(exe)),
                                        std::move(outputs), temp_bytes})
        .first->second;
  }
  if (pjrt_ == nullptr)
    return absl::FailedPreconditionError(absl::StrCat(
        host_.ToString(), " has no PJRT plugin configured for StableHLO functions"));
  Promise<ExecutableRef> compiled;
  Loaded loaded{compiled.future(), hlo->outputs};
  executables_.emplace(std::move(key), loaded);
  compile_.Post([this, backend = pjrt_, def = *hlo, host = host_,
                 devices = std::vector<DeviceId>(slice_devices.begin(), slice_devices.end()),
                 compiled = std::move(compiled)]() mutable {
    trace::Span span(trace::CompileTrack(host), "compile", def.name);
    span.Arg("function", def.name).Arg("partitions", def.num_partitions);
    const int64_t t0 = trace::Now();
    auto done = [this, t0] {
      compiles_.fetch_add(1, std::memory_order_relaxed);
      compile_ns_.fetch_add(trace::Now() - t0, std::memory_order_relaxed);
    };
    absl::Cleanup count = done;
    compiled.Set(pjrt::PjrtShardExecutable::Compile(std::move(backend), def, devices));
  });
  return loaded;
}

Device* Worker::FindDevice(DeviceId id) const {
  auto it = devices_.find(id);
  return it == devices_.end() ? nullptr : it->second.get();
}

DispatchAck Worker::Dispatch(HostWork work) {
  Promise<absl::Time> enqueued;
  Promise<int64_t> done;
  DispatchAck ack{enqueued.future(), done.future()};
  dispatch_.Post([this, work = std::make_shared<const HostWork>(std::move(work)),
                  enqueued = std::move(enqueued), done = std::move(done)]() mutable {
    DispatchSegments(std::move(work), std::move(enqueued), std::move(done));
  });
  return ack;
}

namespace {
// A shard that will never be produced: consumers see `error`.
ObjectStore::Shard FailedShard(const absl::Status& error) {
  return {Future<DeviceBufferRef>::Ready(error), Future<ReservationRef>::Ready(error), 0};
}
}  // namespace

void Worker::PutFailed(BufferId id, DeviceId device, const absl::Status& error) {
  store_.Put(id, device, FailedShard(error)).IgnoreError();
}

void Worker::DispatchTransfer(const HostWork& work, const NodeWork& node, const TransferWork& t,
                              const std::shared_ptr<Countdown>& done, bool traced) {
  // What its trace spans say (only when traced: no copies otherwise).
  struct Traced {
    int64_t client, dispatched, node;
    std::string name, program;
  };
  std::shared_ptr<const Traced> tr;
  if (traced)
    tr = std::make_shared<const Traced>(Traced{work.client.value(), trace::Now(), node.node,
                                               node.name, work.program->program});
  const ArraySpec shard_spec{t.global.dtype, t.dst_sharding.ShardShape(t.global.shape)};
  const size_t esize = DTypeSize(t.global.dtype);
  // One source per distinct source region overlapping a local shard: same device, then same host.
  struct Source {
    Box box;
    int rank;
    int score;
  };
  struct LocalShard {
    DeviceId device_id;
    Device* device;
    Box box;
    std::vector<Source> sources;
  };
  std::vector<LocalShard> shards;
  for (int rank : t.local_ranks) {
    const DeviceId device_id = t.dst_devices[rank];
    Device* device = FindDevice(device_id);
    if (device == nullptr) {
      absl::Status error = absl::InternalError(absl::StrCat(
          NodeWhere(work, node, device_id), ": ", device_id.ToString(), " is not on ",
          host_.ToString()));
      PutFailed(work.buffer(t.dst), device_id, error);
      done->Add();
      done->Done(error);
      continue;
    }
    LocalShard& shard = shards.emplace_back();
    shard.device_id = device_id;
    shard.device = device;
    shard.box = t.dst_sharding.ShardBox(t.global.shape, rank);
    for (int s = 0; s < static_cast<int>(t.src_devices.size()); ++s) {
      Box box = t.src_sharding.ShardBox(t.global.shape, s);
      Box overlap;
      for (size_t d = 0; d < box.start.size(); ++d) {
        overlap.start.push_back(std::max(box.start[d], shard.box.start[d]));
        overlap.limit.push_back(std::min(box.limit[d], shard.box.limit[d]));
      }
      if (overlap.num_elements() == 0) continue;
      int score = t.src_devices[s] == device_id ? 0 : t.src_hosts[s] == host_ ? 1 : 2;
      auto it = std::find_if(shard.sources.begin(), shard.sources.end(),
                             [&](const Source& x) { return x.box == box; });
      if (it == shard.sources.end()) {
        shard.sources.push_back({box, s, score});
      } else if (score < it->score) {
        *it = {box, s, score};
      }
    }
  }
  // Each source shard is fetched once, a host's together.
  std::vector<int> src_ranks;
  for (const LocalShard& shard : shards)
    for (const Source& s : shard.sources)
      if (std::find(src_ranks.begin(), src_ranks.end(), s.rank) == src_ranks.end())
        src_ranks.push_back(s.rank);
  absl::flat_hash_map<int, Fetched> fetched_by_rank = FetchSources(t, work.buffer(t.src), src_ranks);
  for (const LocalShard& shard : shards) {
    const DeviceId device_id = shard.device_id;
    Device* device = shard.device;
    const Box dst_box = shard.box;
    const std::string where = NodeWhere(work, node, device_id);
    const std::vector<Source>& sources = shard.sources;
    std::vector<Future<DeviceBufferRef>> fetched;
    std::vector<Future<>> deps;
    std::vector<bool> crossed;  // Per source: its bytes come from another process.
    for (const Source& s : sources) {
      Fetched& from = fetched_by_rank.at(s.rank);
      crossed.push_back(from.remote);
      from.remote = false;  // Its bytes crossed once, counted with the first shard using them.
      Future<DeviceBufferRef> f = from.shard;
      deps.push_back(AsStatusFuture(f));
      fetched.push_back(std::move(f));
    }
    const int64_t bytes = shard_spec.size_bytes();
    auto mem = device->memory().Reserve(bytes);
    deps.push_back(AsStatusFuture(mem));
    Promise<DeviceBufferRef> out;
    done->Add();
    std::shared_ptr<Countdown> shard_done = done;
    absl::Status put = store_.Put(work.buffer(t.dst), device_id, {out.future(), mem, bytes});
    if (!put.ok()) {
      out.Set(Annotate(put, where));
      shard_done->Done(Annotate(put, where));
      continue;
    }
    std::vector<int> src_ranks;
    for (const Source& s : sources) src_ranks.push_back(s.rank);
    JoinFutures(deps).OnReady([this, run = work.run, t, src_ranks, fetched = std::move(fetched),
                               crossed = std::move(crossed), dst_box, shard_spec, device_id, esize,
                               where, out = std::move(out), shard_done,
                               tr](const absl::Status& s) mutable {
      if (!s.ok()) {
        out.Set(Annotate(s, where));
        shard_done->Done(Annotate(s, where));
        return;
      }
      data_plane_.Post([this, run, t = std::move(t), src_ranks = std::move(src_ranks),
                        fetched = std::move(fetched), crossed = std::move(crossed), dst_box,
                        shard_spec, device_id, esize, where, out = std::move(out), shard_done,
                        tr]() mutable {
        std::optional<trace::Span> span;
        if (tr != nullptr) {
          span.emplace(trace::TransfersTrack(host_), "transfer", tr->name, tr->client);
          span->Arg("run", run.value()).Arg("program", tr->program).Arg("node", tr->name);
          span->Arg("device", device_id.value()).Arg("link", t.link == LinkClass::kDcn ? "dcn" : "ici");
          // From dispatch to the sources' data and the memory being there.
          span->Arg("waited_us", (trace::Now() - tr->dispatched) / 1000);
          span->FlowIn(trace::FlowId(run.value(), trace::Stage::kTransfer, tr->node,
                                     device_id.value()));
        }
        if (absl::Status c = Cancelled(run); !c.ok()) {
          out.Set(Annotate(c, where));
          shard_done->Done(Annotate(c, where));
          return;
        }
        auto dst = HostDeviceBuffer::Create(shard_spec, device_id);
        int64_t copied = 0, wire = 0;
        for (size_t i = 0; i < fetched.size(); ++i) {
          const DeviceBufferRef& src = *fetched[i].Await();
          if (crossed[i]) wire += src->size_bytes();
          const Box src_box = t.src_sharding.ShardBox(t.global.shape, src_ranks[i]);
          const HostDeviceBuffer* host_src = src->AsHost();
          std::vector<uint8_t> staged;
          const void* data = host_src ? host_src->data() : nullptr;
          if (data == nullptr) {
            staged.resize(src->size_bytes());
            absl::Status c = src->CopyToHost(staged.data()).status();
            if (!c.ok()) {
              out.Set(Annotate(c, where));
              shard_done->Done(Annotate(c, where));
              return;
            }
            data = staged.data();
          }
          copied += CopyBoxIntersection(data, src_box, dst->mutable_data(), dst_box, esize) *
                    static_cast<int64_t>(esize);
        }
        CountReceived(t.link, copied, wire);
        if (span.has_value()) span->Arg("bytes", copied);
        span.reset();  // Before the run can finish (a trace read then holds it).
        out.Set(DeviceBufferRef(std::move(dst)));
        shard_done->Done();
      });
    });
  }
}

absl::flat_hash_map<int, Worker::Fetched> Worker::FetchSources(const TransferWork& t, BufferId src,
                                                                const std::vector<int>& ranks) {
  std::vector<std::pair<HostId, std::vector<int>>> by_host;  // In first-use order.
  for (int r : ranks) {
    auto it = std::find_if(by_host.begin(), by_host.end(),
                           [&](const auto& h) { return h.first == t.src_hosts[r]; });
    if (it == by_host.end()) it = by_host.insert(by_host.end(), {t.src_hosts[r], {}});
    it->second.push_back(r);
  }
  absl::flat_hash_map<int, Fetched> fetched;
  for (const auto& [host, host_ranks] : by_host) {
    WorkerInterface* peer = host == host_ ? this : peers_(host);
    std::vector<DeviceId> devices;
    for (int r : host_ranks) devices.push_back(t.src_devices[r]);
    std::vector<Future<DeviceBufferRef>> shards =
        peer != nullptr ? peer->FetchShards(src, devices)
                        : std::vector<Future<DeviceBufferRef>>(
                              devices.size(), Future<DeviceBufferRef>::Ready(absl::UnavailableError(
                                                  absl::StrCat(host.ToString(), " is unreachable"))));
    for (size_t i = 0; i < host_ranks.size(); ++i)
      fetched.emplace(host_ranks[i], Fetched{shards[i], peer != nullptr && peer->remote()});
  }
  return fetched;
}

absl::StatusOr<Worker::NewShard> Worker::StoreNewShard(BufferId id, DeviceId device_id,
                                                      int64_t bytes) {
  Device* device = FindDevice(device_id);
  if (device == nullptr)
    return absl::NotFoundError(absl::StrCat(device_id.ToString(), " is not on ", host_.ToString()));
  PW_RETURN_IF_ERROR(device->health());
  NewShard n{Promise<DeviceBufferRef>(), device->memory().Reserve(bytes)};
  // A shard that can never fit fails now, before anything is stored or made for it.
  if (n.memory.AwaitFor(absl::ZeroDuration()) && !n.memory.status().ok()) return n.memory.status();
  PW_RETURN_IF_ERROR(store_.Put(id, device_id, {n.made.future(), n.memory, bytes}));
  return n;
}

Future<> Worker::PutShard(BufferId id, DeviceId device_id, HostArray shard) {
  absl::StatusOr<NewShard> n = StoreNewShard(id, device_id, shard.spec.size_bytes());
  if (!n.ok()) return Future<>::Ready(n.status());
  Future<DeviceBufferRef> f = n->made.future();
  n->memory.OnReady([p = std::move(n->made), shard = std::move(shard),
                     device_id](const absl::StatusOr<ReservationRef>& r) mutable {
    if (!r.ok()) return p.Set(r.status());
    p.Set(DeviceBufferRef(HostDeviceBuffer::FromHost(shard.spec, device_id, shard.bytes.data())));
  });
  return AsStatusFuture(f);
}

Future<> Worker::PutShardLater(BufferId id, DeviceId device_id, const ArraySpec& spec,
                               Future<DeviceBufferRef> buffer) {
  absl::StatusOr<NewShard> n = StoreNewShard(id, device_id, spec.size_bytes());
  if (!n.ok()) return Future<>::Ready(n.status());
  Future<DeviceBufferRef> f = n->made.future();
  buffer.OnReady([p = std::move(n->made), mem = std::move(n->memory), spec,
                  device_id](const absl::StatusOr<DeviceBufferRef>& b) mutable {
    if (!b.ok()) return p.Set(b.status());
    if (!((*b)->spec() == spec) || (*b)->device() != device_id)
      return p.Set(absl::InvalidArgumentError(absl::StrCat(
          "a shard of ", (*b)->spec().ToString(), " on ", (*b)->device().ToString(), " for ",
          spec.ToString(), " on ", device_id.ToString())));
    mem.OnReady([p = std::move(p), b = *b](const absl::StatusOr<ReservationRef>& r) mutable {
      if (!r.ok()) return p.Set(r.status());
      p.Set(std::move(b));
    });
  });
  return AsStatusFuture(f);
}

UploadAck Worker::ExpectUpload(BufferId, DeviceId, const ArraySpec&) {
  const absl::Status no = absl::UnimplementedError(absl::StrCat(
      host_.ToString(), " runs in process: its clients put arrays through the controller"));
  return {Future<ShardTransfer>::Ready(no), Future<>::Ready(no)};
}

Future<ShardTransfer> Worker::OfferShard(BufferId, DeviceId) {
  return Future<ShardTransfer>::Ready(absl::UnimplementedError(absl::StrCat(
      host_.ToString(), " runs in process: its clients fetch arrays through the controller")));
}

Future<> Worker::SaveShard(BufferId id, DeviceId device, const ShardFile& file) {
  const std::string where = absl::StrCat("saving ", id.ToString(), " on ", device.ToString(),
                                         " of ", host_.ToString(), " to ", file.dir);
  Promise<> saved;
  Future<> result = saved.future();
  FetchShard(id, device)
      .OnReady([this, file, where, saved = std::move(saved)](
                   const absl::StatusOr<DeviceBufferRef>& b) mutable {
        if (!b.ok()) return saved.Set(Annotate(b.status(), where));
        io_.Post([this, file, where, b = *b, saved = std::move(saved)]() mutable {
          absl::Status written = WriteShardChunk(file, *b);
          if (written.ok()) checkpoint_saved_ += b->spec().size_bytes();
          saved.Set(Annotate(written, where));
        });
      });
  return result;
}

Future<> Worker::LoadShard(BufferId id, DeviceId device, const ArraySpec& spec,
                           const ShardFile& file) {
  Promise<DeviceBufferRef> loaded;
  Future<> stored = PutShardLater(id, device, spec, loaded.future());
  if (stored.IsReady()) return stored;  // Refused (no such device, an id in use, too large).
  const std::string where = absl::StrCat("loading ", id.ToString(), " on ", device.ToString(),
                                         " of ", host_.ToString(), " from ", file.dir);
  io_.Post([this, file, spec, device, where, loaded = std::move(loaded)]() mutable {
    absl::StatusOr<DeviceBufferRef> b = ReadShardChunks(file, spec, device);
    if (b.ok()) checkpoint_loaded_ += spec.size_bytes();
    loaded.Set(b.ok() ? std::move(b) : Annotate(b.status(), where));
  });
  return stored;
}

Future<DeviceBufferRef> Worker::FetchShard(BufferId id, DeviceId device) {
  if (FindDevice(device) == nullptr)
    return Future<DeviceBufferRef>::Ready(absl::NotFoundError(
        absl::StrCat(device.ToString(), " is not on ", host_.ToString())));
  return store_.GetWhenCreated(id, device);
}

void Worker::DeleteBuffers(const std::vector<BufferId>& ids) {
  store_.DeleteMany(ids);
}

void Worker::CancelRuns(const std::vector<RunId>& runs, const absl::Status& reason) {
  {
    const absl::Time now = absl::Now();
    pw::MutexLock lock(&cancel_mu_);
    for (RunId r : runs) cancelled_.try_emplace(r, CancelledRun{reason, now});
    num_cancelled_.store(cancelled_.size(), std::memory_order_release);
  }
  // Shards of the runs waiting in collectives (for peers that will not come) fail now.
  for (RunId r : runs) collectives_->CancelRun(r.value(), reason);
}

std::vector<Worker::Overrun> Worker::Overrunning(absl::Time now, absl::Duration grace) const {
  std::vector<Overrun> out;
  if (num_cancelled_.load(std::memory_order_acquire) == 0) return out;
  pw::MutexLock lock(&cancel_mu_);
  for (const auto& [id, device] : devices_) {
    const int64_t run = device->current_run();
    if (run < 0) continue;
    auto it = cancelled_.find(RunId(run));
    if (it == cancelled_.end() || now - it->second.at <= grace) continue;
    out.push_back({id, RunId(run), now - it->second.at, it->second.why});
  }
  std::sort(out.begin(), out.end(),
            [](const Overrun& a, const Overrun& b) { return a.device < b.device; });
  return out;
}

void Worker::ForgetRuns(const std::vector<RunId>& runs) {
  for (RunId r : runs) collectives_->ForgetRun(r.value());
  pw::MutexLock lock(&cancel_mu_);
  for (RunId r : runs) cancelled_.erase(r);
  num_cancelled_.store(cancelled_.size(), std::memory_order_release);
}

absl::Status Worker::Cancelled(RunId run) {
  if (num_cancelled_.load(std::memory_order_acquire) == 0) return absl::OkStatus();
  pw::MutexLock lock(&cancel_mu_);
  auto it = cancelled_.find(run);
  if (it == cancelled_.end()) return absl::OkStatus();
  cancelled_shards_.fetch_add(1, std::memory_order_relaxed);
  return it->second.why;
}

Future<> Worker::RemoveDevice(DeviceId device_id, const absl::Status& reason) {
  // Another host's device: only this host's collectives that include it are aborted.
  if (Device* device = FindDevice(device_id); device != nullptr) device->Remove(reason);
  collectives_->AbortDevice(device_id, reason);
  return Future<>::Ready(absl::OkStatus());
}

void Worker::Fail(const absl::Status& why) {
  for (auto& [id, dev] : devices_) {
    dev->Remove(why);
    collectives_->AbortDevice(id, why);
  }
  store_.Close(why);
}

Future<> Worker::RestoreDevice(DeviceId device_id) {
  if (FindDevice(device_id) != nullptr)
    return Future<>::Ready(absl::FailedPreconditionError(
        absl::StrCat(device_id.ToString(), " of ", host_.ToString(), " cannot come back in this "
                     "process; restart the worker")));
  collectives_->RestoreDevice(device_id);
  return Future<>::Ready(absl::OkStatus());
}

Future<HostStatus> Worker::Status() const {
  HostStatus s;
  s.host = host_;
  s.island = island_;
  for (const auto& [id, d] : devices_) {
    s.devices.push_back({id, host_, island_, d->health().ok(), d->memory().capacity(),
                         d->memory().in_use(), d->memory().waiting(), d->queue_depth(),
                         d->executed(), d->busy_ns()});
  }
  std::sort(s.devices.begin(), s.devices.end(),
            [](const DeviceStatus& a, const DeviceStatus& b) { return a.id < b.id; });
  s.buffers = store_.num_buffers();
  s.buffer_bytes = store_.bytes();
  s.ici_bytes_received = ici_bytes_.load();
  s.dcn_bytes_received = dcn_bytes_.load();
  s.ici_wire_bytes_received = ici_wire_bytes_.load();
  s.dcn_wire_bytes_received = dcn_wire_bytes_.load();
  s.checkpoint_bytes_saved = checkpoint_saved_.load();
  s.checkpoint_bytes_loaded = checkpoint_loaded_.load();
  s.dispatch_queue_depth = dispatch_.depth();
  s.cancelled_shards = static_cast<size_t>(cancelled_shards_.load());
  pw::MutexLock lock(&fn_mu_);
  s.functions = functions_.size();
  s.executables = executables_.size();
  s.plans = num_plans_.load(std::memory_order_relaxed);
  s.compiles = compiles_.load(std::memory_order_relaxed);
  s.compile_ns = compile_ns_.load(std::memory_order_relaxed);
  s.executable_hits = executable_hits_.load(std::memory_order_relaxed);
  s.collectives = collectives_->count();
  s.collective_ns = collectives_->total_ns();
  s.client_device_ns = client_time_.Snapshot(clock_());
  return Future<HostStatus>::Ready(std::move(s));
}

}  // namespace pw
