#include "pw/executor/device_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "pw/base/check.h"
#include "pw/executor/block_cache.h"

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
    // Whole huge pages, the last one's tail unused: a block freed by a shard of one shape fits
    // the next of that shape, from the cache (BlockCache: fresh memory costs more than the copy
    // into it). A fresh block gets huge pages where the kernel has them, so its first touch
    // faults per 2 MiB instead of per 4 KiB.
    block_bytes_ = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    data_ = BlockCache::ForHostBuffers().Take(block_bytes_);
    if (data_ != nullptr) return;
    PW_CHECK(posix_memalign(&data_, kHugePageBytes, block_bytes_) == 0, "out of host memory");
    madvise(data_, block_bytes_, MADV_HUGEPAGE);  // Advice: without THP, plain pages.
    return;
  }
  size_t rounded = ((bytes + 63) / 64) * 64;
  data_ = std::aligned_alloc(64, rounded);
  PW_CHECK(data_ != nullptr, "out of host memory");
}

HostDeviceBuffer::HostDeviceBuffer(const ArraySpec& spec, DeviceId device,
                                   std::shared_ptr<void> memory)
    : DeviceBuffer(spec, device), data_(memory.get()), adopted_(std::move(memory)) {}

HostDeviceBuffer::~HostDeviceBuffer() {
  if (adopted_ != nullptr) return;  // Let go with adopted_.
  if (block_bytes_ > 0) {
    BlockCache::ForHostBuffers().Keep(data_, block_bytes_);
  } else if (data_ != inline_) {
    std::free(data_);
  }
}

std::shared_ptr<HostDeviceBuffer> HostDeviceBuffer::Create(const ArraySpec& spec,
                                                           DeviceId device) {
  return std::make_shared<Enabler>(spec, device);  // One allocation for small shards.
}

std::shared_ptr<HostDeviceBuffer> HostDeviceBuffer::Adopt(const ArraySpec& spec, DeviceId device,
                                                          std::shared_ptr<void> memory) {
  PW_CHECK(memory != nullptr, "HostDeviceBuffer::Adopt: no memory");
  return std::shared_ptr<HostDeviceBuffer>(new HostDeviceBuffer(spec, device, std::move(memory)));
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
