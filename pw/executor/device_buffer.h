// DeviceBuffer: one shard of an array, resident in one device's memory.
//
// Backends own their buffers (the native backend: aligned host memory; a PJRT backend: a
// PJRT_Buffer). Thread-safe: a buffer is immutable once its producer has completed; until then
// only the producer writes it.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "pw/base/future.h"
#include "pw/base/mutex.h"
#include "pw/base/ids.h"
#include "pw/base/shape.h"

namespace pw {

class HostDeviceBuffer;

class DeviceBuffer {
 public:
  DeviceBuffer(ArraySpec spec, DeviceId device) : spec_(std::move(spec)), device_(device) {}
  virtual ~DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  const ArraySpec& spec() const { return spec_; }
  DeviceId device() const { return device_; }
  int64_t size_bytes() const { return spec_.size_bytes(); }
  // Copies the contents into `dst` (size_bytes() bytes); the future completes when done.
  virtual Future<> CopyToHost(void* dst) const = 0;
  // The native backend's buffer, or nullptr (a virtual call: cheaper than a dynamic_cast, which
  // compares type names across libraries, on every launch).
  virtual const HostDeviceBuffer* AsHost() const { return nullptr; }

  // A copy of this buffer that another backend made for its own use (e.g. staged into PJRT
  // memory), kept while this buffer lives: buffers are immutable, so it stays valid. `key` names
  // the backend, device and layout of the copy. One copy is kept (the last one set).
  std::shared_ptr<DeviceBuffer> Mirror(const void* key) const {
    pw::MutexLock lock(&mirror_mu_);
    return mirror_key_ == key ? mirror_ : nullptr;
  }
  void SetMirror(const void* key, std::shared_ptr<DeviceBuffer> copy) const {
    pw::MutexLock lock(&mirror_mu_);
    mirror_key_ = key;
    mirror_ = std::move(copy);
  }

 private:
  const ArraySpec spec_;
  const DeviceId device_;
  mutable pw::Mutex mirror_mu_;
  mutable const void* mirror_key_ ABSL_GUARDED_BY(mirror_mu_) = nullptr;
  mutable std::shared_ptr<DeviceBuffer> mirror_ ABSL_GUARDED_BY(mirror_mu_);
};

using DeviceBufferRef = std::shared_ptr<DeviceBuffer>;

// The native backend's buffer: host memory standing in for device memory (64-byte aligned,
// 16-byte aligned for shards of at most 64 bytes, which live inside the object).
class HostDeviceBuffer : public DeviceBuffer {
 public:
  // Uninitialised contents.
  static std::shared_ptr<HostDeviceBuffer> Create(const ArraySpec& spec, DeviceId device);
  static std::shared_ptr<HostDeviceBuffer> FromHost(const ArraySpec& spec, DeviceId device,
                                                    const void* data);
  // Contents already in `memory` (at least spec.size_bytes() bytes, which the buffer keeps until
  // it goes): a shard read from shared memory keeps its segment instead of being copied out.
  static std::shared_ptr<HostDeviceBuffer> Adopt(const ArraySpec& spec, DeviceId device,
                                                 std::shared_ptr<void> memory);
  ~HostDeviceBuffer() override;

  const void* data() const { return data_; }
  void* mutable_data() { return data_; }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }
  template <typename T>
  T* mutable_as() { return static_cast<T*>(data_); }
  Future<> CopyToHost(void* dst) const override;
  const HostDeviceBuffer* AsHost() const override { return this; }

 private:
  static constexpr size_t kInlineBytes = 64;  // Small shards live inside the object.
  static constexpr size_t kHugePageBytes = size_t{2} << 20;
  struct Enabler;
  HostDeviceBuffer(const ArraySpec& spec, DeviceId device);
  HostDeviceBuffer(const ArraySpec& spec, DeviceId device, std::shared_ptr<void> memory);
  void* data_ = nullptr;
  std::shared_ptr<void> adopted_;  // Set: data_ is its memory.
  size_t block_bytes_ = 0;  // > 0: a block of whole huge pages, freed into BlockCache.
  alignas(16) unsigned char inline_[kInlineBytes];  // 16: plain malloc, not memalign.
};

}  // namespace pw
