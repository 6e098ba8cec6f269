// Tenant: the clients that share one proportional share of every island's device time (paper
// §5.2). A client connects as a tenant (its own, named after it, unless it names one); an
// island's SharePolicy gives each tenant with work queued device time in proportion to its share.
//
// Thread-safe: the share may change (an admin's `pw tenant set`) while schedulers read it; it
// takes effect for each tenant's next request.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace pw {

class Tenant {
 public:
  // The shares a tenant may have (a client's or an admin's request outside them is refused).
  static constexpr double kMinShare = 1e-3;
  static constexpr double kMaxShare = 1e6;

  Tenant(int64_t id, std::string name, double share)
      : id_(id), name_(std::move(name)), share_(share) {}
  Tenant(const Tenant&) = delete;
  Tenant& operator=(const Tenant&) = delete;

  // Unique among the controller's tenants; orders ties between tenants deterministically.
  int64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  double share() const { return share_.load(std::memory_order_relaxed); }
  void set_share(double share) { share_.store(share, std::memory_order_relaxed); }

 private:
  const int64_t id_;
  const std::string name_;
  std::atomic<double> share_;
};

}  // namespace pw
