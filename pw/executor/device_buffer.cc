#include "pw/executor/device_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "pw/base/check.h"

namespace pw {

struct HostDeviceBuffer::Enabler : HostDeviceBuffer {
  Enabler(const ArraySpec& spec, DeviceId device) : HostDeviceBuffer(spec, device) {}
};

HostDeviceBuffer::HostDeviceBuffer(const ArraySpec& spec, DeviceId device)
    : DeviceBuffer(spec, device) {
  size_t bytes = static_cast<size_t>(size_bytes());
  if (bytes <= kInlineBytes) {
    data_ = inline_;
    return;
  }
  if (bytes >= kHugePageBytes) {
    // Huge pages where the kernel has them: a large shard's first touch (most are written once,
    // by a copy or a transfer) faults per 2 MiB instead of per 4 KiB. From the allocator, not a
    // mapping of its own: tcmalloc keeps freed pages for the next shard, which then does not
    // fault at all (measured: 64 MiB transfers ~20% slower with a fresh mapping each).
    PW_CHECK(posix_memalign(&data_, kHugePageBytes, bytes) == 0, "out of host memory");
    madvise(data_, bytes, MADV_HUGEPAGE);  // Advice: without THP, plain pages.
    return;
  }
  size_t rounded = ((bytes + 63) / 64) * 64;
  data_ = std::aligned_alloc(64, rounded);
  PW_CHECK(data_ != nullptr, "out of host memory");
}

HostDeviceBuffer::~HostDeviceBuffer() {
  if (data_ != inline_) std::free(data_);
}

std::shared_ptr<HostDeviceBuffer> HostDeviceBuffer::Create(const ArraySpec& spec,
                                                           DeviceId device) {
  return std::make_shared<Enabler>(spec, device);  // One allocation for small shards.
}

std::shared_ptr<HostDeviceBuffer> HostDeviceBuffer::FromHost(const ArraySpec& spec,
                                                             DeviceId device, const void* data) {
  auto b = Create(spec, device);
  if (b->size_bytes() > 0) std::memcpy(b->data_, data, static_cast<size_t>(b->size_bytes()));
  return b;
}

Future<> HostDeviceBuffer::CopyToHost(void* dst) const {
  // An empty shard's destination may be null (an empty vector's data()).
  if (size_bytes() > 0) std::memcpy(dst, data_, static_cast<size_t>(size_bytes()));
  return Future<>::Ready(absl::OkStatus());
}

}  // namespace pw
