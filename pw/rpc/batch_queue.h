// The outgoing side of a stream whose messages are batches (a proto with `repeated Item items`).
//
// The first item queued on an idle stream is written at once, alone (no added latency); items
// queued while a batch is being written wait together and go as the next message. So a burst of
// commands, events or runs costs the reader one message (one read, one callback, one parse), not
// one per item. A batch holds at most kMaxItems items and, unless its first item alone is
// larger, kMaxBytes bytes (framing counted), so a batch of items each within a stream's message
// limit stays within it too for any limit of at least 1 MiB (the smallest one used).
//
// Not thread-safe: the stream's lock guards it. Pointers it returns stay valid until WriteDone
// (the batch being written) or the next Push (a waiting item).
#pragma once

#include <cstddef>
#include <deque>
#include <type_traits>
#include <utility>

namespace pw::rpc {

template <typename Batch>
class BatchQueue {
 public:
  using Item = std::remove_pointer_t<decltype(std::declval<Batch&>().add_items())>;
  static constexpr int kMaxItems = 256;
  static constexpr size_t kMaxBytes = size_t{512} << 10;

  // Queues `item` behind everything queued before it.
  void Push(Item item) {
    const size_t bytes = item.ByteSizeLong() + kFramingBytes;
    if (!HasWaiting() || batches_.back().items_size() >= kMaxItems ||
        batch_bytes_.back() + bytes > kMaxBytes) {
      batches_.emplace_back();
      batch_bytes_.push_back(0);
    }
    *batches_.back().add_items() = std::move(item);
    Grew(bytes);
  }

  // The last item queued and not yet being written, or null. A caller that adds to it says by
  // how many bytes (Grew).
  Item* LastWaiting() {
    if (!HasWaiting()) return nullptr;
    Batch& b = batches_.back();
    return b.items_size() == 0 ? nullptr : b.mutable_items(b.items_size() - 1);
  }

  void Grew(size_t bytes) {
    batch_bytes_.back() += bytes;
    bytes_ += bytes;
  }

  // The batch to write next, now marked as being written; null if one is being written or
  // nothing waits.
  Batch* StartNext() {
    if (writing_ || batches_.empty()) return nullptr;
    writing_ = true;
    return &batches_.front();
  }
  // The batch being written has been (or could not be) written.
  void WriteDone() {
    if (!writing_) return;
    writing_ = false;
    batches_.pop_front();
    bytes_ -= batch_bytes_.front();
    batch_bytes_.pop_front();
  }

  bool writing() const { return writing_; }
  bool empty() const { return batches_.empty(); }
  // Whether another batch waits behind the one about to be written (a write hint).
  bool more() const { return batches_.size() > 1; }
  // The bytes of every item queued and not yet written (framing counted), the batch being
  // written included: what a reader that does not read makes its writer hold.
  size_t bytes() const { return bytes_; }
  // Drops what waits; the batch being written (gRPC still reads it) stays.
  void DropWaiting() {
    batches_.resize(writing_ ? 1 : 0);
    batch_bytes_.resize(batches_.size());
    bytes_ = batch_bytes_.empty() ? 0 : batch_bytes_.front();
  }

 private:
  // Whether the last batch waits (is not being written).
  bool HasWaiting() const { return !batches_.empty() && !(writing_ && batches_.size() == 1); }

  static constexpr size_t kFramingBytes = 6;  // An item's tag and length in its batch.
  std::deque<Batch> batches_;  // Front: being written while writing_.
  std::deque<size_t> batch_bytes_;  // Each batch's bytes, as Push and Grew counted them.
  bool writing_ = false;
  size_t bytes_ = 0;  // Their sum.
};

}  // namespace pw::rpc
