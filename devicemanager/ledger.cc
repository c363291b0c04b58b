#include "kdm/devicemanager/ledger.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace kdm::devicemanager {
namespace {

using checkpoint::Change;
using checkpoint::ContainerKey;
using checkpoint::PodDevicesEntry;

// Topology hints enumerate every subset of the NUMA nodes holding devices of
// a resource; beyond this many nodes that is too many subsets.
constexpr size_t kMaxHintNumaNodes = 16;

std::string Quote(const std::string& s) { return "\"" + s + "\""; }

std::string KeyText(const ContainerKey& key) {
  return "pod " + Quote(key.pod_uid) + " container " + Quote(key.container_name) + " resource " +
         Quote(key.resource_name);
}

void SortNatural(std::vector<std::string>* ids) {
  std::sort(ids->begin(), ids->end(), NaturalLess);
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool AnyNodeIn(const std::vector<int64_t>& device_nodes, const std::vector<int64_t>& nodes) {
  for (int64_t n : device_nodes) {
    if (std::binary_search(nodes.begin(), nodes.end(), n)) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> FlattenDeviceIds(const checkpoint::DevicesPerNuma& ids) {
  std::set<std::string> all;
  for (const auto& [node, list] : ids) all.insert(list.begin(), list.end());
  std::vector<std::string> out(all.begin(), all.end());
  SortNatural(&out);
  return out;
}

bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (IsDigit(a[i]) && IsDigit(b[j])) {
      size_t ie = i;
      size_t je = j;
      while (ie < a.size() && IsDigit(a[ie])) ++ie;
      while (je < b.size() && IsDigit(b[je])) ++je;
      size_t is = i;
      size_t js = j;
      while (is + 1 < ie && a[is] == '0') ++is;  // skip leading zeros
      while (js + 1 < je && b[js] == '0') ++js;
      size_t ilen = ie - is;
      size_t jlen = je - js;
      if (ilen != jlen) return ilen < jlen;
      int c = a.compare(is, ilen, b, js, jlen);
      if (c != 0) return c < 0;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  if ((i < a.size()) != (j < b.size())) return i >= a.size();  // prefix first
  return a < b;  // equal naturally ("01" vs "1"): plain order decides
}

// ---------------------------------------------------------------- devices

StatusOr<SnapshotReport> Ledger::SetDevices(const std::string& resource,
                                            const std::vector<LedgerDevice>& snapshot) {
  if (resource.empty()) return InvalidArgumentError("device snapshot for an empty resource name");
  SnapshotReport report;
  std::map<std::string, DeviceInfo> devices;
  std::set<std::string> duplicates;
  for (const LedgerDevice& d : snapshot) {
    if (d.id.empty()) {
      ++report.empty_ids;
      continue;
    }
    auto [it, inserted] = devices.try_emplace(d.id);
    if (!inserted) {
      duplicates.insert(d.id);
      it->second.healthy = it->second.healthy && d.healthy;
      continue;
    }
    it->second.healthy = d.healthy;
    for (int64_t n : d.numa_nodes) {
      if (n >= 0) it->second.numa_nodes.push_back(n);
    }
    std::sort(it->second.numa_nodes.begin(), it->second.numa_nodes.end());
    it->second.numa_nodes.erase(
        std::unique(it->second.numa_nodes.begin(), it->second.numa_nodes.end()),
        it->second.numa_nodes.end());
  }
  ResourceState& state = resources_[resource];
  // Most snapshots only change health: with the same ids (both maps iterate
  // in the same plain order) the natural order and the ranks are kept, which
  // spares a natural sort of every id (the bulk of a 10,000-device
  // snapshot's cost).
  const bool same_ids = state.devices.size() == devices.size() &&
                        std::equal(state.devices.begin(), state.devices.end(), devices.begin(),
                                   [](const auto& a, const auto& b) { return a.first == b.first; });
  // Health changes, by one walk over both maps (plain order). Each changed
  // or new device is noted with the DeviceInfo that will carry its rank:
  // the kept entry when the ids are the same, else the new entry (map nodes
  // keep their address when the map is moved into `state`).
  struct Changed {
    const std::string* id;
    const DeviceInfo* ranked;
    bool healthy;
  };
  std::vector<Changed> changed;
  std::vector<LedgerDevice> gone;
  {
    auto old_it = state.devices.begin();
    for (auto& [id, info] : devices) {
      while (old_it != state.devices.end() && old_it->first < id) {
        if (old_it->second.healthy) gone.push_back({old_it->first, false, {}});
        ++old_it;
      }
      const bool known = old_it != state.devices.end() && old_it->first == id;
      if (!known || old_it->second.healthy != info.healthy) {
        changed.push_back({&id, same_ids ? &old_it->second : &info, info.healthy});
      }
      if (same_ids) {
        old_it->second.healthy = info.healthy;
        old_it->second.numa_nodes.swap(info.numa_nodes);
      }
      if (known) ++old_it;
    }
    for (; old_it != state.devices.end(); ++old_it) {
      if (old_it->second.healthy) gone.push_back({old_it->first, false, {}});
    }
  }
  if (!same_ids) {
    state.devices = std::move(devices);
    state.order.clear();
    for (const auto& [id, info] : state.devices) state.order.push_back(id);
    SortNatural(&state.order);
    for (size_t i = 0; i < state.order.size(); ++i) state.devices.at(state.order[i]).rank = i;
  }
  std::sort(changed.begin(), changed.end(),
            [](const Changed& a, const Changed& b) { return a.ranked->rank < b.ranked->rank; });
  report.health_changes.reserve(changed.size() + gone.size());
  for (const Changed& c : changed) report.health_changes.push_back({*c.id, c.healthy, {}});
  for (LedgerDevice& d : gone) report.health_changes.push_back(std::move(d));
  deleted_.erase(resource);
  report.duplicate_ids.assign(duplicates.begin(), duplicates.end());
  SortNatural(&report.duplicate_ids);
  report.change = RegisteredChange(resource);
  return report;
}

Change Ledger::MarkAllUnhealthy(const std::string& resource) {
  auto it = resources_.find(resource);
  if (it == resources_.end()) return {};
  for (auto& [id, info] : it->second.devices) info.healthy = false;
  return RegisteredChange(resource);
}

Change Ledger::RemoveResource(const std::string& resource) {
  auto it = resources_.find(resource);
  if (it == resources_.end()) return {};
  resources_.erase(it);
  deleted_.insert(resource);
  Change change;
  change.removed_resources.push_back(resource);
  return change;
}

bool Ledger::HasResource(const std::string& resource) const {
  return resources_.count(resource) > 0;
}

Status Ledger::CheckRegistered(const std::string& resource) const {
  if (HasResource(resource)) return OkStatus();
  return FailedPreconditionError("cannot allocate unregistered device " + resource);
}

bool Ledger::IsDeviceResource(const std::string& resource) const {
  if (resource.empty()) return false;
  return HasResource(resource) || records_per_resource_.count(resource) > 0;
}

std::vector<std::string> Ledger::Resources() const {
  std::vector<std::string> out;
  for (const auto& [name, state] : resources_) out.push_back(name);
  return out;
}

Capacity Ledger::GetCapacity() const {
  Capacity cap;
  for (const auto& [name, state] : resources_) {
    ResourceCapacity& rc = cap.resources[name];
    rc.capacity = static_cast<int64_t>(state.devices.size());
    for (const auto& [id, info] : state.devices) rc.allocatable += info.healthy ? 1 : 0;
  }
  cap.deleted.assign(deleted_.begin(), deleted_.end());
  return cap;
}

std::vector<std::string> Ledger::HealthyDevices(const std::string& resource) const {
  std::vector<std::string> out;
  auto it = resources_.find(resource);
  if (it == resources_.end()) return out;
  for (const std::string& id : it->second.order) {
    if (it->second.devices.at(id).healthy) out.push_back(id);
  }
  return out;
}

std::vector<LedgerDevice> Ledger::Devices(const std::string& resource) const {
  std::vector<LedgerDevice> out;
  auto it = resources_.find(resource);
  if (it == resources_.end()) return out;
  for (const std::string& id : it->second.order) {
    const DeviceInfo& info = it->second.devices.at(id);
    out.push_back({id, info.healthy, info.numa_nodes});
  }
  return out;
}

Change Ledger::RegisteredChange(const std::string& resource) const {
  Change change;
  change.registered_devices[resource] = HealthyDevices(resource);
  return change;
}

// ---------------------------------------------------------------- helpers

void Ledger::InsertRecord(const ContainerKey& key, Record record) {
  auto [it, inserted] = records_.insert_or_assign(key, std::move(record));
  (void)inserted;
  std::map<std::string, int>& held = holders_[key.resource_name];
  for (const std::string& id : it->second.ids) ++held[id];
  ++records_per_resource_[key.resource_name];
}

Ledger::RecordMap::iterator Ledger::EraseRecord(RecordMap::iterator it) {
  const std::string& resource = it->first.resource_name;
  auto held = holders_.find(resource);
  for (const std::string& id : it->second.ids) {
    auto h = held->second.find(id);
    if (--h->second == 0) held->second.erase(h);
  }
  if (held->second.empty()) holders_.erase(held);
  if (--records_per_resource_[resource] == 0) records_per_resource_.erase(resource);
  return records_.erase(it);
}

void Ledger::InsertReservation(const ContainerKey& key, ReservationState state) {
  if (auto old = reservations_.find(key); old != reservations_.end()) EraseReservation(old);
  auto [it, inserted] = reservations_.emplace(key, std::move(state));
  (void)inserted;
  std::map<std::string, ContainerKey>& by_id = reserved_[key.resource_name];
  for (const std::string& id : it->second.ids) by_id.insert_or_assign(id, key);
}

Ledger::ReservationMap::iterator Ledger::EraseReservation(ReservationMap::iterator it) {
  auto by_id = reserved_.find(it->first.resource_name);
  for (const std::string& id : it->second.ids) by_id->second.erase(id);
  if (by_id->second.empty()) reserved_.erase(by_id);
  return reservations_.erase(it);
}

std::pair<Ledger::RecordMap::const_iterator, Ledger::RecordMap::const_iterator> Ledger::PodRecords(
    const std::string& pod_uid) const {
  auto first = records_.lower_bound(ContainerKey{pod_uid, "", ""});
  auto last = first;
  while (last != records_.end() && last->first.pod_uid == pod_uid) ++last;
  return {first, last};
}

std::pair<Ledger::ReservationMap::const_iterator, Ledger::ReservationMap::const_iterator>
Ledger::PodReservations(const std::string& pod_uid) const {
  auto first = reservations_.lower_bound(ContainerKey{pod_uid, "", ""});
  auto last = first;
  while (last != reservations_.end() && last->first.pod_uid == pod_uid) ++last;
  return {first, last};
}

int Ledger::HolderCount(const std::string& resource, const std::string& id) const {
  auto held = holders_.find(resource);
  if (held == holders_.end()) return 0;
  auto h = held->second.find(id);
  return h == held->second.end() ? 0 : h->second;
}

const ContainerKey* Ledger::ReservedBy(const std::string& resource, const std::string& id) const {
  auto by_id = reserved_.find(resource);
  if (by_id == reserved_.end()) return nullptr;
  auto r = by_id->second.find(id);
  return r == by_id->second.end() ? nullptr : &r->second;
}

const ContainerKey* Ledger::SomeHolder(const std::string& resource, const std::string& id,
                                       const std::string& pod_uid) const {
  const ContainerKey* found = nullptr;
  for (const auto& [key, record] : records_) {
    if (key.resource_name != resource ||
        std::find(record.ids.begin(), record.ids.end(), id) == record.ids.end()) {
      continue;
    }
    if (key.pod_uid != pod_uid) return &key;
    if (found == nullptr) found = &key;
  }
  return found;
}

std::vector<std::string> Ledger::FreeIds(const std::string& resource) const {
  std::vector<std::string> out;
  auto it = resources_.find(resource);
  if (it == resources_.end()) return out;
  static const std::map<std::string, int> kNoHolders;
  static const std::map<std::string, ContainerKey> kNoReservations;
  auto h = holders_.find(resource);
  auto r = reserved_.find(resource);
  const auto& held = h == holders_.end() ? kNoHolders : h->second;
  const auto& reserved = r == reserved_.end() ? kNoReservations : r->second;
  // All three maps are sorted by id: walk them together, no lookups.
  std::vector<std::pair<size_t, const std::string*>> free;
  auto hi = held.begin();
  auto ri = reserved.begin();
  for (const auto& [id, info] : it->second.devices) {
    while (hi != held.end() && hi->first < id) ++hi;
    while (ri != reserved.end() && ri->first < id) ++ri;
    const bool taken =
        (hi != held.end() && hi->first == id) || (ri != reserved.end() && ri->first == id);
    if (info.healthy && !taken) free.emplace_back(info.rank, &id);
  }
  std::sort(free.begin(), free.end());
  out.reserve(free.size());
  for (const auto& [rank, id] : free) out.push_back(*id);
  return out;
}

std::vector<std::string> Ledger::HandOverPool(const Pod& pod, const std::string& container,
                                              const std::string& resource) const {
  std::vector<std::string> out;
  auto res = resources_.find(resource);
  if (res == resources_.end()) return out;
  std::optional<ContainerKind> kind = pod.KindOf(container);
  if (!kind) return out;
  // Finished init containers that start before `container`.
  std::set<std::string> givers;
  for (const Container& c : pod.init_containers) {
    if (c.name == container) break;
    if (!c.restartable) givers.insert(c.name);
  }
  std::set<std::string> pool;
  // Held by running containers of the pod (or by ones the spec lacks).
  std::set<std::string> taken;
  auto [first, last] = PodRecords(pod.uid);
  for (auto it = first; it != last; ++it) {
    const auto& [key, record] = *it;
    if (key.resource_name != resource || key.container_name == container) {
      continue;
    }
    if (givers.count(key.container_name)) {
      pool.insert(record.ids.begin(), record.ids.end());
      continue;
    }
    std::optional<ContainerKind> holder = pod.KindOf(key.container_name);
    if (!holder || *holder != ContainerKind::kInit)
      taken.insert(record.ids.begin(), record.ids.end());
  }
  for (const std::string& id : pool) {
    if (taken.count(id)) continue;
    const ContainerKey* reserver = ReservedBy(resource, id);
    if (reserver != nullptr &&
        !(reserver->pod_uid == pod.uid && reserver->container_name == container)) {
      continue;
    }
    auto dev = res->second.devices.find(id);
    if (dev == res->second.devices.end() || !dev->second.healthy) continue;
    out.push_back(id);
  }
  SortNatural(&out);
  return out;
}

// ---------------------------------------------------------------- admission

StatusOr<std::map<std::string, int64_t>> Ledger::ContainerRequests(
    const Container& container) const {
  return k8s::ContainerDeviceRequests(container,
                                      [this](const std::string& r) { return IsDeviceResource(r); });
}

StatusOr<std::map<std::string, int64_t>> Ledger::PodRequests(const Pod& pod) const {
  return k8s::EffectiveDeviceRequests(pod,
                                      [this](const std::string& r) { return IsDeviceResource(r); });
}

StatusOr<AllocationPlan> Ledger::Plan(const Pod& pod, const std::string& container,
                                      const std::string& resource, int64_t count,
                                      const std::optional<NumaHint>& hint) const {
  if (pod.uid.empty()) return InvalidArgumentError("pod has an empty uid");
  if (resource.empty()) return InvalidArgumentError("empty resource name");
  if (count < 1 || count > Quantity::kMaxDeviceCount) {
    return InvalidArgumentError("invalid device count " + std::to_string(count) + " for resource " +
                                Quote(resource) + " (must be 1.." +
                                std::to_string(Quantity::kMaxDeviceCount) + ")");
  }
  std::optional<ContainerKind> kind = pod.KindOf(container);
  if (!kind) {
    return NotFoundError("pod " + Quote(pod.uid) + " has no container " + Quote(container));
  }
  AllocationPlan plan;
  plan.key = {pod.uid, container, resource};
  plan.kind = *kind;
  plan.size = count;

  // 1. Already recorded (a restart): same count or fail loudly.
  auto rec = records_.find(plan.key);
  if (rec != records_.end() && static_cast<int64_t>(rec->second.ids.size()) != count) {
    return FailedPreconditionError("pod " + Quote(pod.uid) + " container " + Quote(container) +
                                   " changed request for resource " + Quote(resource) + " from " +
                                   std::to_string(rec->second.ids.size()) + " to " +
                                   std::to_string(count));
  }
  // 2. Registration and health, checked before counting (kubelet #109595).
  KDM_RETURN_IF_ERROR(CheckRegistered(resource));
  auto res = resources_.find(resource);
  const auto& devices = res->second.devices;
  bool any_healthy =
      std::any_of(devices.begin(), devices.end(), [](const auto& d) { return d.second.healthy; });
  if (!any_healthy) {
    return UnavailableError("no healthy devices present; cannot allocate unhealthy devices " +
                            resource);
  }
  if (rec != records_.end()) {
    for (const std::string& id : rec->second.ids) {
      auto d = devices.find(id);
      if (d == devices.end() || !d->second.healthy) {
        return UnavailableError(
            "previously allocated devices are no longer healthy; cannot "
            "allocate unhealthy "
            "devices " +
            resource);
      }
    }
    plan.reuse = true;
    plan.reuse_ids = rec->second.ids;
    return plan;
  }
  if (reservations_.count(plan.key)) {
    return AbortedError("an allocation for " + KeyText(plan.key) + " is already in progress");
  }

  const bool use_hint = hint.has_value() && !hint->nodes.empty();
  std::vector<int64_t> hint_nodes;
  if (use_hint) {
    hint_nodes = hint->nodes;
    std::sort(hint_nodes.begin(), hint_nodes.end());
  }
  auto aligned = [&](const std::string& id) {
    auto d = devices.find(id);
    return d != devices.end() && AnyNodeIn(d->second.numa_nodes, hint_nodes);
  };

  // 3. Hand-over from finished init containers of the pod, aligned first.
  std::vector<std::string> pool = HandOverPool(pod, container, resource);
  if (use_hint) std::stable_partition(pool.begin(), pool.end(), aligned);
  for (const std::string& id : pool) {
    if (static_cast<int64_t>(plan.must_include.size()) == count) break;
    plan.must_include.push_back(id);
  }
  const int64_t needed = count - static_cast<int64_t>(plan.must_include.size());
  if (needed == 0) return plan;

  // 4. Free devices.
  std::vector<std::string> free = FreeIds(resource);
  if (static_cast<int64_t>(free.size()) < needed) {
    return ResourceExhaustedError("requested number of devices unavailable for " + resource +
                                  ". Requested: " + std::to_string(needed) +
                                  ", Available: " + std::to_string(free.size()));
  }

  // 5. NUMA alignment.
  if (!use_hint) {
    plan.candidates = std::move(free);
  } else {
    std::vector<std::string> in_hint;
    std::vector<std::string> outside;
    std::vector<std::string> no_topology;
    for (const std::string& id : free) {
      const DeviceInfo& info = devices.at(id);
      if (info.numa_nodes.empty()) {
        no_topology.push_back(id);
      } else if (AnyNodeIn(info.numa_nodes, hint_nodes)) {
        in_hint.push_back(id);
      } else {
        outside.push_back(id);
      }
    }
    if (needed <= static_cast<int64_t>(in_hint.size())) {
      plan.candidates = std::move(in_hint);
    } else {
      // The hinted nodes cannot hold it all: take every aligned device, then
      // choose the rest from the others (devices with topology first).
      plan.must_include.insert(plan.must_include.end(), in_hint.begin(), in_hint.end());
      plan.candidates = std::move(outside);
      plan.candidates.insert(plan.candidates.end(), no_topology.begin(), no_topology.end());
    }
  }
  const int64_t to_choose = count - static_cast<int64_t>(plan.must_include.size());
  plan.real_choice = static_cast<int64_t>(plan.candidates.size()) > to_choose;
  return plan;
}

Status Ledger::ValidatePreferred(const AllocationPlan& plan,
                                 const std::vector<std::string>& answer) const {
  if (plan.reuse) {
    return InvalidArgumentError("no preferred allocation applies: " + KeyText(plan.key) +
                                " reuses its recorded devices");
  }
  if (static_cast<int64_t>(answer.size()) != plan.size) {
    return InvalidArgumentError("preferred allocation for " + KeyText(plan.key) + " has " +
                                std::to_string(answer.size()) + " devices, want " +
                                std::to_string(plan.size));
  }
  std::set<std::string> offered(plan.candidates.begin(), plan.candidates.end());
  offered.insert(plan.must_include.begin(), plan.must_include.end());
  std::set<std::string> seen;
  for (const std::string& id : answer) {
    if (!seen.insert(id).second) {
      return InvalidArgumentError("preferred allocation for " + KeyText(plan.key) +
                                  " lists device " + Quote(id) + " more than once");
    }
    if (!offered.count(id)) {
      return InvalidArgumentError("preferred allocation for " + KeyText(plan.key) +
                                  " names device " + Quote(id) + ", which was not offered");
    }
  }
  for (const std::string& id : plan.must_include) {
    if (!seen.count(id)) {
      return InvalidArgumentError("preferred allocation for " + KeyText(plan.key) +
                                  " leaves out must-include device " + Quote(id));
    }
  }
  return OkStatus();
}

std::vector<std::string> Ledger::DefaultChoice(const AllocationPlan& plan) const {
  if (plan.reuse) return plan.reuse_ids;
  std::vector<std::string> out;
  for (const std::string& id : plan.must_include) {
    if (static_cast<int64_t>(out.size()) == plan.size) return out;
    out.push_back(id);
  }
  for (const std::string& id : plan.candidates) {
    if (static_cast<int64_t>(out.size()) == plan.size) break;
    out.push_back(id);
  }
  return out;
}

Status Ledger::Reserve(const AllocationPlan& plan, const std::vector<std::string>& ids) {
  const ContainerKey& key = plan.key;
  const std::string& resource = key.resource_name;
  if (plan.reuse) {
    return InvalidArgumentError("nothing to reserve: " + KeyText(key) +
                                " reuses its recorded devices");
  }
  if (static_cast<int64_t>(ids.size()) != plan.size || ids.empty()) {
    return InvalidArgumentError("reservation for " + KeyText(key) + " has " +
                                std::to_string(ids.size()) + " devices, want " +
                                std::to_string(plan.size));
  }
  std::set<std::string> unique(ids.begin(), ids.end());
  if (unique.size() != ids.size()) {
    return InvalidArgumentError("reservation for " + KeyText(key) + " lists a device twice");
  }
  if (records_.count(key)) {
    return FailedPreconditionError(KeyText(key) + " already has devices recorded");
  }
  KDM_RETURN_IF_ERROR(CheckRegistered(resource));
  auto res = resources_.find(resource);
  std::set<std::string> must(plan.must_include.begin(), plan.must_include.end());
  std::set<std::string> handed_over;
  auto [pod_first, pod_last] = PodRecords(key.pod_uid);
  for (const std::string& id : ids) {
    auto d = res->second.devices.find(id);
    if (d == res->second.devices.end()) {
      return FailedPreconditionError("device " + Quote(id) + " of resource " + Quote(resource) +
                                     " is not registered");
    }
    if (!d->second.healthy) {
      return FailedPreconditionError("device " + Quote(id) + " of resource " + Quote(resource) +
                                     " is unhealthy");
    }
    if (const ContainerKey* other = ReservedBy(resource, id); other != nullptr && *other != key) {
      return FailedPreconditionError("device " + Quote(id) + " of resource " + Quote(resource) +
                                     " is reserved by another allocation");
    }
    const int holders = HolderCount(resource, id);
    if (holders == 0) continue;
    // Held: only a hand-over from finished init containers of this pod.
    const ContainerKey* refused = nullptr;
    int init_holders = 0;
    for (auto it = pod_first; it != pod_last && must.count(id); ++it) {
      const auto& [holder, record] = *it;
      if (holder.resource_name != resource ||
          std::find(record.ids.begin(), record.ids.end(), id) == record.ids.end()) {
        continue;
      }
      if (record.kind && *record.kind != ContainerKind::kInit) {
        refused = &holder;
        break;
      }
      ++init_holders;
    }
    if (refused == nullptr && init_holders != holders) {
      refused = SomeHolder(resource, id, key.pod_uid);
    }
    if (refused != nullptr) {
      return FailedPreconditionError("device " + Quote(id) + " of resource " + Quote(resource) +
                                     " is allocated to pod " + Quote(refused->pod_uid) +
                                     " container " + Quote(refused->container_name));
    }
    handed_over.insert(id);
  }
  ReservationState state;
  state.kind = plan.kind;
  state.ids = ids;
  state.handed_over = std::move(handed_over);
  InsertReservation(key, std::move(state));
  return OkStatus();
}

void Ledger::ReleaseReservation(const ContainerKey& key) {
  if (auto it = reservations_.find(key); it != reservations_.end()) EraseReservation(it);
}

std::optional<std::vector<std::string>> Ledger::Reservation(const ContainerKey& key) const {
  auto it = reservations_.find(key);
  if (it == reservations_.end()) return std::nullopt;
  return it->second.ids;
}

StatusOr<Change> Ledger::Commit(const ContainerKey& key, const std::string& alloc_response) {
  auto it = reservations_.find(key);
  if (it == reservations_.end()) {
    return FailedPreconditionError("no reservation to commit for " + KeyText(key));
  }
  if (records_.count(key)) {
    return FailedPreconditionError(KeyText(key) + " already has devices recorded");
  }
  Record record;
  record.ids = it->second.ids;
  SortNatural(&record.ids);
  record.alloc_response = alloc_response;
  record.kind = it->second.kind;
  record.handed_over = it->second.handed_over;
  const ResourceState* res = nullptr;
  if (auto r = resources_.find(key.resource_name); r != resources_.end()) res = &r->second;
  for (const std::string& id : record.ids) {
    const DeviceInfo* info = nullptr;
    if (res != nullptr) {
      if (auto d = res->devices.find(id); d != res->devices.end()) info = &d->second;
    }
    if (info == nullptr || info->numa_nodes.empty()) {
      record.by_numa[checkpoint::kNoNumaNode].push_back(id);
    } else {
      for (int64_t n : info->numa_nodes) record.by_numa[n].push_back(id);
    }
  }
  EraseReservation(it);
  Change change;
  change.upserts.push_back(
      {key.pod_uid, key.container_name, key.resource_name, record.by_numa, record.alloc_response});
  InsertRecord(key, std::move(record));
  last_commit_ = key;
  return change;
}

Status Ledger::UndoCommit(const ContainerKey& key) {
  auto it = records_.find(key);
  if (!last_commit_ || *last_commit_ != key || it == records_.end() || reservations_.count(key)) {
    return FailedPreconditionError("no commit to revert for " + KeyText(key));
  }
  ReservationState state;
  state.kind = it->second.kind.value_or(ContainerKind::kApp);
  state.ids = it->second.ids;
  state.handed_over = it->second.handed_over;
  EraseRecord(it);
  InsertReservation(key, std::move(state));
  last_commit_.reset();
  return OkStatus();
}

Change Ledger::RemovePod(const std::string& pod_uid) {
  Change change;
  bool had_records = false;
  for (auto it = records_.lower_bound(ContainerKey{pod_uid, "", ""});
       it != records_.end() && it->first.pod_uid == pod_uid;) {
    had_records = true;
    it = EraseRecord(it);
  }
  for (auto it = reservations_.lower_bound(ContainerKey{pod_uid, "", ""});
       it != reservations_.end() && it->first.pod_uid == pod_uid;) {
    it = EraseReservation(it);
  }
  if (last_commit_ && last_commit_->pod_uid == pod_uid) last_commit_.reset();
  if (had_records) change.removed_pods.push_back(pod_uid);
  return change;
}

Change Ledger::RetainOnlyPods(const std::set<std::string>& active_pod_uids) {
  std::set<std::string> gone;
  for (auto it = records_.begin(); it != records_.end();) {
    if (!active_pod_uids.count(it->first.pod_uid)) {
      gone.insert(it->first.pod_uid);
      it = EraseRecord(it);
    } else {
      ++it;
    }
  }
  if (last_commit_ && gone.count(last_commit_->pod_uid)) last_commit_.reset();
  Change change;
  change.removed_pods.assign(gone.begin(), gone.end());
  return change;
}

// ---------------------------------------------------------------- queries

std::optional<PodDevicesEntry> Ledger::Entry(const ContainerKey& key) const {
  auto it = records_.find(key);
  if (it == records_.end()) return std::nullopt;
  return PodDevicesEntry{key.pod_uid, key.container_name, key.resource_name, it->second.by_numa,
                         it->second.alloc_response};
}

std::vector<PodDevicesEntry> Ledger::ContainerEntries(const std::string& pod_uid,
                                                      const std::string& container) const {
  std::vector<PodDevicesEntry> out;
  auto [first, last] = PodRecords(pod_uid);
  for (auto it = first; it != last; ++it) {
    const auto& [key, record] = *it;
    if (key.container_name == container) {
      out.push_back({key.pod_uid, key.container_name, key.resource_name, record.by_numa,
                     record.alloc_response});
    }
  }
  return out;
}

std::vector<PodDevicesEntry> Ledger::PodEntries(const std::string& pod_uid) const {
  std::vector<PodDevicesEntry> out;
  auto [first, last] = PodRecords(pod_uid);
  for (auto it = first; it != last; ++it) {
    const auto& [key, record] = *it;
    out.push_back({key.pod_uid, key.container_name, key.resource_name, record.by_numa,
                   record.alloc_response});
  }
  return out;
}

std::vector<PodDevicesEntry> Ledger::AllEntries() const {
  std::vector<PodDevicesEntry> out;
  out.reserve(records_.size());
  for (const auto& [key, record] : records_) {
    out.push_back({key.pod_uid, key.container_name, key.resource_name, record.by_numa,
                   record.alloc_response});
  }
  return out;
}

// ---------------------------------------------------------------- topology
// hints

ResourceHints Ledger::GenerateHints(const std::string& resource,
                                    const std::vector<std::string>& available,
                                    const std::vector<std::string>& reusable, int64_t count) const {
  auto res = resources_.find(resource);
  if (res == resources_.end()) return std::nullopt;
  const auto& devices = res->second.devices;
  std::vector<int64_t> nodes;
  for (const auto& [id, info] : devices) {
    nodes.insert(nodes.end(), info.numa_nodes.begin(), info.numa_nodes.end());
  }
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  if (nodes.empty() || nodes.size() > kMaxHintNumaNodes) return std::nullopt;

  // Each device as a bit mask over `nodes` (0 = no topology).
  auto mask_of = [&](const DeviceInfo& info) {
    uint32_t m = 0;
    for (int64_t n : info.numa_nodes) {
      m |= 1u << (std::lower_bound(nodes.begin(), nodes.end(), n) - nodes.begin());
    }
    return m;
  };
  std::vector<uint32_t> all_masks;
  for (const auto& [id, info] : devices) all_masks.push_back(mask_of(info));
  auto masks_for = [&](const std::vector<std::string>& ids) {
    std::vector<uint32_t> out;
    for (const std::string& id : ids) {
      auto d = devices.find(id);
      out.push_back(d == devices.end() ? 0u : mask_of(d->second));
    }
    return out;
  };
  const std::vector<uint32_t> available_masks = masks_for(available);
  const std::vector<uint32_t> reusable_masks = masks_for(reusable);

  const size_t n = nodes.size();
  auto node_list = [&](uint32_t m) {
    std::vector<int64_t> out;
    for (size_t i = 0; i < n; ++i) {
      if (m & (1u << i)) out.push_back(nodes[i]);
    }
    return out;
  };
  // Subsets ordered by size, then lexicographically by node list.
  std::vector<std::pair<std::vector<int64_t>, uint32_t>> subsets;
  subsets.reserve((size_t{1} << n) - 1);
  for (uint32_t m = 1; m < (1u << n); ++m) subsets.emplace_back(node_list(m), m);
  std::sort(subsets.begin(), subsets.end(), [](const auto& a, const auto& b) {
    if (a.first.size() != b.first.size()) return a.first.size() < b.first.size();
    return a.first < b.first;
  });

  int min_size = static_cast<int>(n);
  std::vector<NumaHint> hints;
  for (const auto& [subset_nodes, subset] : subsets) {
    const int size = static_cast<int>(subset_nodes.size());
    int64_t in_subset = 0;
    for (uint32_t m : all_masks) in_subset += (m & subset) ? 1 : 0;
    if (in_subset >= count && size < min_size) min_size = size;

    int64_t matching = 0;
    bool reusable_outside = false;
    for (uint32_t m : reusable_masks) {
      if (m == 0) continue;  // no topology: does not constrain the subset
      if (!(m & subset)) {
        reusable_outside = true;
        break;
      }
      ++matching;
    }
    if (reusable_outside) continue;
    for (uint32_t m : available_masks) matching += (m & subset) ? 1 : 0;
    if (matching < count) continue;
    hints.push_back({subset_nodes, false});
  }
  for (NumaHint& h : hints) h.preferred = static_cast<int>(h.nodes.size()) == min_size;
  return hints;
}

ResourceHints Ledger::TopologyHints(const Pod& pod, const std::string& container,
                                    const std::string& resource, int64_t count) const {
  if (count < 1) return std::nullopt;
  auto res = resources_.find(resource);
  if (res == resources_.end()) return std::nullopt;
  bool has_topology = std::any_of(res->second.devices.begin(), res->second.devices.end(),
                                  [](const auto& d) { return !d.second.numa_nodes.empty(); });
  if (!has_topology) return std::nullopt;
  auto rec = records_.find({pod.uid, container, resource});
  if (rec != records_.end()) {
    if (static_cast<int64_t>(rec->second.ids.size()) != count) return std::vector<NumaHint>{};
    return GenerateHints(resource, rec->second.ids, {}, count);
  }
  std::vector<std::string> available = FreeIds(resource);
  std::vector<std::string> reusable = HandOverPool(pod, container, resource);
  if (static_cast<int64_t>(available.size() + reusable.size()) < count) {
    return std::vector<NumaHint>{};
  }
  return GenerateHints(resource, available, reusable, count);
}

StatusOr<std::map<std::string, ResourceHints>> Ledger::ContainerTopologyHints(
    const Pod& pod, const std::string& container) const {
  const Container* c = pod.FindContainer(container);
  if (c == nullptr) {
    return NotFoundError("pod " + Quote(pod.uid) + " has no container " + Quote(container));
  }
  KDM_ASSIGN_OR_RETURN(auto requests, ContainerRequests(*c));
  std::map<std::string, ResourceHints> out;
  for (const auto& [resource, count] : requests) {
    out[resource] = TopologyHints(pod, container, resource, count);
  }
  return out;
}

StatusOr<std::map<std::string, ResourceHints>> Ledger::PodTopologyHints(const Pod& pod) const {
  KDM_ASSIGN_OR_RETURN(auto requests, PodRequests(pod));
  std::map<std::string, ResourceHints> out;
  for (const auto& [resource, count] : requests) {
    auto res = resources_.find(resource);
    bool has_topology = res != resources_.end() &&
                        std::any_of(res->second.devices.begin(), res->second.devices.end(),
                                    [](const auto& d) { return !d.second.numa_nodes.empty(); });
    if (!has_topology) {
      out[resource] = std::nullopt;
      continue;
    }
    std::set<std::string> held;
    auto [first, last] = PodRecords(pod.uid);
    for (auto it = first; it != last; ++it) {
      if (it->first.resource_name == resource) {
        held.insert(it->second.ids.begin(), it->second.ids.end());
      }
    }
    if (!held.empty()) {
      if (static_cast<int64_t>(held.size()) != count) {
        out[resource] = std::vector<NumaHint>{};
      } else {
        out[resource] = GenerateHints(resource, {held.begin(), held.end()}, {}, count);
      }
      continue;
    }
    std::vector<std::string> available = FreeIds(resource);
    if (static_cast<int64_t>(available.size()) < count) {
      out[resource] = std::vector<NumaHint>{};
      continue;
    }
    out[resource] = GenerateHints(resource, available, {}, count);
  }
  return out;
}

// ---------------------------------------------------------------- restart

RestoreReport Ledger::Restore(const checkpoint::CheckpointData& data) {
  resources_.clear();
  deleted_.clear();
  records_.clear();
  reservations_.clear();
  holders_.clear();
  reserved_.clear();
  records_per_resource_.clear();
  last_commit_.reset();
  RestoreReport report;
  // resource -> device id -> pod holding it, to refuse cross-pod sharing.
  std::map<std::string, std::map<std::string, std::string>> owner;
  for (const PodDevicesEntry& e : data.entries) {
    if (e.pod_uid.empty() || e.container_name.empty() || e.resource_name.empty()) {
      report.skipped.push_back({e.pod_uid, e.container_name, e.resource_name, "", "",
                                "empty pod uid, container or resource name"});
      continue;
    }
    std::vector<std::string> ids = FlattenDeviceIds(e.device_ids);
    auto& owners = owner[e.resource_name];
    auto conflict = std::find_if(ids.begin(), ids.end(), [&](const std::string& id) {
      auto it = owners.find(id);
      return it != owners.end() && it->second != e.pod_uid;
    });
    if (conflict != ids.end()) {
      report.skipped.push_back({e.pod_uid, e.container_name, e.resource_name, *conflict,
                                owners.at(*conflict), "device held by another pod"});
      continue;
    }
    for (const std::string& id : ids) owners[id] = e.pod_uid;
    Record record;
    record.ids = std::move(ids);
    record.by_numa = e.device_ids;
    record.alloc_response = e.alloc_response;
    if (auto old = records_.find(e.key()); old != records_.end())
      EraseRecord(old);  // a repeated key: the last entry wins
    InsertRecord(e.key(), std::move(record));
  }
  for (const auto& [resource, ids] : data.registered_devices) {
    if (!resource.empty()) resources_[resource];
  }
  return report;
}

checkpoint::CheckpointData Ledger::ToCheckpointData() const {
  checkpoint::CheckpointData data;
  data.entries = AllEntries();
  for (const auto& [resource, state] : resources_) {
    data.registered_devices[resource] = HealthyDevices(resource);
  }
  return data;
}

// ---------------------------------------------------------------- invariants

Status Ledger::CheckInvariants() const {
  auto fail = [](const std::string& what) { return InternalError("ledger invariant: " + what); };
  for (const std::string& r : deleted_) {
    if (resources_.count(r))
      return fail("resource " + Quote(r) + " is both registered and deleted");
  }
  for (const auto& [r, state] : resources_) {
    std::vector<std::string> ids;
    for (const auto& [id, info] : state.devices) ids.push_back(id);
    SortNatural(&ids);
    if (ids != state.order) return fail("device order of " + Quote(r) + " is out of date");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (state.devices.at(ids[i]).rank != i)
        return fail("device rank of " + Quote(ids[i]) + " is out of date");
    }
  }
  {
    // The indexes match a recomputation from records_ and reservations_.
    std::map<std::string, std::map<std::string, int>> holders;
    std::map<std::string, std::map<std::string, ContainerKey>> reserved;
    std::map<std::string, int> per_resource;
    for (const auto& [key, record] : records_) {
      for (const std::string& id : record.ids) ++holders[key.resource_name][id];
      ++per_resource[key.resource_name];
    }
    for (const auto& [key, reservation] : reservations_) {
      for (const std::string& id : reservation.ids)
        reserved[key.resource_name].insert_or_assign(id, key);
    }
    if (holders != holders_) return fail("holder index is out of date");
    if (reserved != reserved_) return fail("reservation index is out of date");
    if (per_resource != records_per_resource_)
      return fail("per-resource record count is out of date");
  }
  // resource -> device id -> records holding it
  std::map<std::string, std::map<std::string, std::vector<const ContainerKey*>>> holders;
  for (const auto& [key, record] : records_) {
    std::set<std::string> unique(record.ids.begin(), record.ids.end());
    if (unique.size() != record.ids.size()) return fail(KeyText(key) + " lists a device twice");
    std::vector<std::string> flat = FlattenDeviceIds(record.by_numa);
    if (std::set<std::string>(flat.begin(), flat.end()) != unique) {
      return fail(KeyText(key) + " has NUMA groups that differ from its device list");
    }
    if (reservations_.count(key)) return fail(KeyText(key) + " is both recorded and reserved");
    for (const std::string& id : record.ids) holders[key.resource_name][id].push_back(&key);
  }
  auto kind_of = [&](const ContainerKey& key) { return records_.at(key).kind; };
  for (const auto& [resource, by_id] : holders) {
    for (const auto& [id, keys] : by_id) {
      int running = 0;
      for (const ContainerKey* k : keys) {
        if (k->pod_uid != keys.front()->pod_uid) {
          return fail("device " + Quote(id) + " of " + Quote(resource) + " is held by pods " +
                      Quote(keys.front()->pod_uid) + " and " + Quote(k->pod_uid));
        }
        std::optional<ContainerKind> kind = kind_of(*k);
        if (kind && *kind != ContainerKind::kInit) ++running;
      }
      if (running > 1) {
        return fail("device " + Quote(id) + " of " + Quote(resource) +
                    " is held by two running containers of pod " + Quote(keys.front()->pod_uid));
      }
    }
  }
  std::map<std::string, std::map<std::string, const ContainerKey*>> reserved;
  for (const auto& [key, reservation] : reservations_) {
    for (const std::string& id : reservation.handed_over) {
      if (std::find(reservation.ids.begin(), reservation.ids.end(), id) == reservation.ids.end()) {
        return fail(KeyText(key) + " hands over device " + Quote(id) + " it does not reserve");
      }
    }
    for (const std::string& id : reservation.ids) {
      auto [it, inserted] = reserved[key.resource_name].try_emplace(id, &key);
      if (!inserted) {
        return fail("device " + Quote(id) + " is reserved by " + KeyText(*it->second) + " and " +
                    KeyText(key));
      }
      auto h = holders[key.resource_name].find(id);
      if (h == holders[key.resource_name].end()) continue;
      if (!reservation.handed_over.count(id)) {
        return fail("device " + Quote(id) + " reserved by " + KeyText(key) + " is also allocated");
      }
      for (const ContainerKey* k : h->second) {
        std::optional<ContainerKind> kind = kind_of(*k);
        if (k->pod_uid != key.pod_uid || (kind && *kind != ContainerKind::kInit)) {
          return fail("device " + Quote(id) + " handed to " + KeyText(key) +
                      " is held by running container " + KeyText(*k));
        }
      }
    }
  }
  for (const auto& [resource, state] : resources_) {
    std::vector<std::string> free = FreeIds(resource);
    std::set<std::string> free_set(free.begin(), free.end());
    int64_t healthy = 0;
    int64_t allocated = 0;
    int64_t reserved_only = 0;
    for (const auto& [id, info] : state.devices) {
      if (!info.healthy) {
        if (free_set.count(id)) return fail("unhealthy device " + Quote(id) + " counted as free");
        continue;
      }
      ++healthy;
      const bool is_allocated = holders[resource].count(id) > 0;
      const bool is_reserved = reserved[resource].count(id) > 0;
      if ((is_allocated || is_reserved) && free_set.count(id)) {
        return fail("device " + Quote(id) + " of " + Quote(resource) + " is free and taken");
      }
      if (is_allocated) {
        ++allocated;
      } else if (is_reserved) {
        ++reserved_only;
      }
    }
    if (allocated + reserved_only + static_cast<int64_t>(free.size()) != healthy) {
      return fail("resource " + Quote(resource) + ": allocated " + std::to_string(allocated) +
                  " + reserved " + std::to_string(reserved_only) + " + free " +
                  std::to_string(free.size()) + " != healthy " + std::to_string(healthy));
    }
  }
  return OkStatus();
}

void Ledger::ForceRecordForTest(const PodDevicesEntry& entry, ContainerKind kind) {
  Record record;
  record.ids = FlattenDeviceIds(entry.device_ids);
  record.by_numa = entry.device_ids;
  record.alloc_response = entry.alloc_response;
  record.kind = kind;
  if (auto old = records_.find(entry.key()); old != records_.end()) EraseRecord(old);
  InsertRecord(entry.key(), std::move(record));
}

}  // namespace kdm::devicemanager
