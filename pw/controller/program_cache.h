// ProgramCache: the programs clients registered, each with its plans by argument layout, the
// controller's program cache (issue 24's "controller as parts"). A program keeps the plans of
// its last `max_plans` layouts used; adding another evicts the least recently used one, which
// the caller then forgets on the workers. A client's programs go when it leaves; it may hold at
// most `max_programs_per_owner` at once.
//
// `Plan` is the caller's (the controller's lowered plan); the cache only holds it.
// Thread-safe: one lock of its own, never held while calling out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "pw/base/ids.h"
#include "pw/base/mutex.h"
#include "pw/program/program_ir.h"

namespace pw {

template <typename Plan>
class ProgramCache {
 public:
  using PlanPtr = std::shared_ptr<const Plan>;
  ProgramCache(size_t max_plans, size_t max_programs_per_owner)
      : max_plans_(std::max<size_t>(max_plans, 1)), max_per_owner_(max_programs_per_owner) {}

  // Whether `owner` holds its limit of programs (one more would be refused).
  bool Full(ClientId owner) const {
    pw::MutexLock lock(&mu_);
    return FullLocked(owner);
  }

  // Registers `ir` for `owner` with its first plan (for `layout`); ids are never reused.
  // ResourceExhausted if `owner` already holds its limit.
  absl::StatusOr<ProgramId> Add(ClientId owner, ProgramIr ir, const std::string& layout,
                                PlanPtr plan) {
    auto p = std::make_unique<Program>();
    p->owner = owner;
    p->ir = std::move(ir);
    p->plans.emplace(layout, Cached{std::move(plan), 0});
    pw::MutexLock lock(&mu_);
    if (FullLocked(owner)) return FullError(owner);
    ProgramId id(next_++);
    programs_.emplace(id, std::move(p));
    ++per_owner_[owner];
    return id;
  }

  absl::Status FullError(ClientId owner) const {
    return absl::ResourceExhaustedError(absl::StrCat(
        owner.ToString(), " has ", max_per_owner_, " programs registered, its limit"));
  }

  // What a run of program `id` by `client` with argument layout `layout` needs: the cached plan
  // (marked used), or, if none, the program to lower. Nullopt if `client` has no program `id`.
  struct Found {
    PlanPtr plan;  // Null: lower `ir`.
    ProgramIr ir;
  };
  std::optional<Found> Find(ClientId client, ProgramId id, const std::string& layout) {
    pw::MutexLock lock(&mu_);
    Program* p = FindLocked(client, id);
    if (p == nullptr) return std::nullopt;
    if (auto it = p->plans.find(layout); it != p->plans.end()) {
      it->second.used = ++p->uses;
      return Found{it->second.plan, {}};
    }
    return Found{nullptr, p->ir};
  }

  // Keeps `plan` for `layout` of program `id`. Returns the plan it evicted to make room (null if
  // none), or nullopt if `client` has no program `id` (it left meanwhile).
  std::optional<PlanPtr> Keep(ClientId client, ProgramId id, const std::string& layout,
                              PlanPtr plan) {
    pw::MutexLock lock(&mu_);
    Program* p = FindLocked(client, id);
    if (p == nullptr) return std::nullopt;
    PlanPtr evicted;
    if (p->plans.size() >= max_plans_ && !p->plans.contains(layout)) {
      auto lru = std::min_element(
          p->plans.begin(), p->plans.end(),
          [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
      evicted = std::move(lru->second.plan);
      p->plans.erase(lru);
    }
    p->plans.insert_or_assign(layout, Cached{std::move(plan), ++p->uses});
    return evicted;
  }

  // One of program `id`'s plans (for explaining it), or null.
  PlanPtr AnyPlan(ClientId client, ProgramId id) const {
    pw::MutexLock lock(&mu_);
    const Program* p = FindLocked(client, id);
    return p == nullptr || p->plans.empty() ? nullptr : p->plans.begin()->second.plan;
  }

  // Forgets `client`'s programs; returns their plans (for forgetting them on the workers).
  std::vector<PlanPtr> DropClient(ClientId client) {
    std::vector<PlanPtr> plans;
    pw::MutexLock lock(&mu_);
    per_owner_.erase(client);
    absl::erase_if(programs_, [&](const auto& kv) {
      if (kv.second->owner != client) return false;
      for (auto& [layout, cached] : kv.second->plans) plans.push_back(std::move(cached.plan));
      return true;
    });
    return plans;
  }

  size_t programs() const {
    pw::MutexLock lock(&mu_);
    return programs_.size();
  }
  size_t plans() const {
    pw::MutexLock lock(&mu_);
    size_t n = 0;
    for (const auto& [id, p] : programs_) n += p->plans.size();
    return n;
  }

 private:
  struct Cached {
    PlanPtr plan;
    uint64_t used = 0;  // Program::uses when last used.
  };
  struct Program {
    ClientId owner;
    ProgramIr ir;
    absl::flat_hash_map<std::string, Cached> plans;  // By argument layout.
    uint64_t uses = 0;
  };
  bool FullLocked(ClientId owner) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = per_owner_.find(owner);
    return static_cast<size_t>(it == per_owner_.end() ? 0 : it->second) >= max_per_owner_;
  }
  Program* FindLocked(ClientId client, ProgramId id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = programs_.find(id);
    return it == programs_.end() || it->second->owner != client ? nullptr : it->second.get();
  }

  const size_t max_plans_;
  const size_t max_per_owner_;
  mutable pw::Mutex mu_;
  absl::flat_hash_map<ProgramId, std::unique_ptr<Program>> programs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<ClientId, int64_t> per_owner_ ABSL_GUARDED_BY(mu_);  // Programs held.
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pw
