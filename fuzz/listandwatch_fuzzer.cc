// Fuzz target: ListAndWatch snapshot ingestion, the path every plugin message
// takes into the device manager's state: the input is a serialized
// v1beta1.ListAndWatchResponse, turned into Ledger devices by the Manager's
// own ToLedgerDevices (devicemanager/device_snapshot.h) after the Endpoint's
// ValidateSnapshot (messages over the limits are dropped) and applied with
// Ledger::SetDevices, on a Ledger that already holds allocations (an init
// container's devices handed over to an app container) and an admission in
// flight (a reservation). Ledger::CheckInvariants() runs after every step; a
// violated invariant is a finding.
//
// Properties besides the invariants:
// - SetDevices accepts every snapshot; the resource's devices are then the
//   unique non-empty ids of the message, healthy exactly when every copy says
//   "Healthy", with the first copy's NUMA nodes (sorted, unique, negative ids
//   dropped); capacity and allocatable count them; empty ids and duplicates
//   are reported;
// - records and the reservation survive any snapshot, and the reservation
//   still commits;
// - a new admission planned on the new devices reserves and commits (with
//   and without a topology hint);
// - applying the same snapshot twice changes nothing;
// - the state survives a checkpoint round trip (ToCheckpointData -> Restore);
// - MarkAllUnhealthy and RemoveResource keep the invariants.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"
#include "fuzz_check.h"
#include "google/protobuf/stubs/logging.h"
#include "kdm/devicemanager/device_snapshot.h"
#include "kdm/devicemanager/endpoint.h"
#include "kdm/devicemanager/ledger.h"

namespace {

namespace dm = kdm::devicemanager;
using kdm::checkpoint::ContainerKey;

constexpr char kResource[] = "vendor.com/gpu";

void Invariants(const dm::Ledger& ledger, const char* step) {
  kdm::Status s = ledger.CheckInvariants();
  FUZZ_CHECK(s.ok(), "after " << step << ": " << s);
}

dm::Container WithDevices(const std::string& name, int64_t count, bool restartable = false) {
  dm::Container c;
  c.name = name;
  c.limits[kResource] = dm::Quantity::FromInt(count);
  c.requests[kResource] = dm::Quantity::FromInt(count);
  c.restartable = restartable;
  return c;
}

dm::Pod MakePod(const std::string& uid, const std::string& name) {
  dm::Pod pod;
  pod.uid = uid;
  pod.namespace_name = "default";
  pod.name = name;
  return pod;
}

// Plans, reserves the default choice and (when `commit`) commits.
kdm::Status Admit(dm::Ledger& ledger, const dm::Pod& pod, const std::string& container,
                  int64_t count, const std::optional<dm::NumaHint>& hint, bool commit) {
  KDM_ASSIGN_OR_RETURN(dm::AllocationPlan plan,
                       ledger.Plan(pod, container, kResource, count, hint));
  if (plan.reuse) return kdm::OkStatus();
  KDM_RETURN_IF_ERROR(ledger.Reserve(plan, ledger.DefaultChoice(plan)));
  if (!commit) return kdm::OkStatus();
  return ledger.Commit(plan.key, "response-" + container).status();
}

std::vector<int64_t> CleanNuma(std::vector<int64_t> nodes) {
  std::erase_if(nodes, [](int64_t n) { return n < 0; });
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  return nodes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Invalid UTF-8 in a string field fails the parse, as it should; protobuf
  // also logs each one, which would drown the fuzzer's own output.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  v1beta1::ListAndWatchResponse response;
  if (!response.ParseFromArray(data, static_cast<int>(size))) return 0;
  // The Endpoint drops a message over the snapshot limits before the Manager
  // sees it; the fuzzer follows the same path.
  if (kdm::Status s = dm::ValidateSnapshot(kResource, response, dm::SnapshotLimits{}); !s.ok()) {
    FUZZ_CHECK(!s.message().empty(), "a refusal without a message");
    return 0;
  }

  // The state the snapshot lands on.
  dm::Ledger ledger;
  FUZZ_CHECK(ledger
                 .SetDevices(kResource, {{"gpu0", true, {0}},
                                         {"gpu1", true, {0}},
                                         {"gpu2", true, {1}},
                                         {"gpu3", true, {1}},
                                         {"gpu4", true, {}}})
                 .ok(),
             "baseline snapshot");
  dm::Pod pod_a = MakePod("pod-a", "a");
  pod_a.init_containers.push_back(WithDevices("init", 1));
  pod_a.containers.push_back(WithDevices("main", 2));
  dm::Pod pod_b = MakePod("pod-b", "b");
  pod_b.containers.push_back(WithDevices("main", 1));
  FUZZ_CHECK(Admit(ledger, pod_a, "init", 1, std::nullopt, true).ok(), "baseline init");
  FUZZ_CHECK(Admit(ledger, pod_a, "main", 2, std::nullopt, true).ok(), "baseline main");
  FUZZ_CHECK(Admit(ledger, pod_b, "main", 1, std::nullopt, false).ok(), "baseline reserve");
  const ContainerKey key_b{"pod-b", "main", kResource};
  const std::optional<std::vector<std::string>> reserved_b = ledger.Reservation(key_b);
  FUZZ_CHECK(reserved_b.has_value(), "baseline reservation");
  const std::vector<kdm::checkpoint::PodDevicesEntry> records_a = ledger.PodEntries("pod-a");
  Invariants(ledger, "baseline");

  // The snapshot, as the Manager applies it.
  std::vector<dm::LedgerDevice> devices = dm::ToLedgerDevices(response);
  FUZZ_CHECK(devices.size() == static_cast<size_t>(response.devices_size()), "device count");
  kdm::StatusOr<dm::SnapshotReport> report = ledger.SetDevices(kResource, devices);
  FUZZ_CHECK(report.ok(), "snapshot refused: " << report.status());
  Invariants(ledger, "SetDevices");

  // What the Ledger should now know, computed independently.
  std::map<std::string, dm::LedgerDevice> expected;
  std::set<std::string> duplicates;
  int64_t empty_ids = 0;
  for (const dm::LedgerDevice& d : devices) {
    if (d.id.empty()) {
      ++empty_ids;
      continue;
    }
    auto [it, inserted] = expected.emplace(d.id, d);
    if (inserted) {
      it->second.numa_nodes = CleanNuma(d.numa_nodes);
    } else {
      duplicates.insert(d.id);
      it->second.healthy = it->second.healthy && d.healthy;
    }
  }
  FUZZ_CHECK(report->empty_ids == empty_ids,
             "empty ids " << report->empty_ids << " vs " << empty_ids);
  FUZZ_CHECK(std::set<std::string>(report->duplicate_ids.begin(), report->duplicate_ids.end()) ==
                 duplicates,
             "duplicate ids reported wrongly");
  std::vector<dm::LedgerDevice> known = ledger.Devices(kResource);
  FUZZ_CHECK(known.size() == expected.size(), known.size()
                                                  << " devices, expected " << expected.size());
  int64_t healthy = 0;
  for (const dm::LedgerDevice& d : known) {
    auto it = expected.find(d.id);
    FUZZ_CHECK(it != expected.end(), "unexpected device " << d.id);
    FUZZ_CHECK(d.healthy == it->second.healthy, "health of " << d.id);
    FUZZ_CHECK(d.numa_nodes == it->second.numa_nodes, "NUMA nodes of " << d.id);
    healthy += d.healthy ? 1 : 0;
  }
  FUZZ_CHECK(static_cast<int64_t>(ledger.HealthyDevices(kResource).size()) == healthy,
             "HealthyDevices");
  dm::Capacity capacity = ledger.GetCapacity();
  FUZZ_CHECK(capacity.resources[kResource].capacity == static_cast<int64_t>(expected.size()) &&
                 capacity.resources[kResource].allocatable == healthy,
             "capacity");
  FUZZ_CHECK(ledger.PodEntries("pod-a") == records_a, "records changed by a snapshot");
  FUZZ_CHECK(ledger.Reservation(key_b) == reserved_b, "reservation changed by a snapshot");

  // The same snapshot again is a no-op.
  FUZZ_CHECK(ledger.SetDevices(kResource, devices).ok(), "second snapshot refused");
  FUZZ_CHECK(ledger.Devices(kResource) == known, "the same snapshot twice changed the devices");
  Invariants(ledger, "SetDevices again");

  // The admission in flight completes.
  kdm::StatusOr<kdm::checkpoint::Change> committed = ledger.Commit(key_b, "response-b");
  FUZZ_CHECK(committed.ok(), "the reservation does not commit: " << committed.status());
  Invariants(ledger, "Commit of the reservation");

  // New admissions on the new devices.
  dm::Pod pod_c = MakePod("pod-c", "c");
  pod_c.containers.push_back(WithDevices("main", 1));
  pod_c.containers.push_back(WithDevices("side", 2));
  kdm::StatusOr<dm::AllocationPlan> plan = ledger.Plan(pod_c, "main", kResource, 1, std::nullopt);
  if (plan.ok() && !plan->reuse) {
    kdm::Status s = Admit(ledger, pod_c, "main", 1, std::nullopt, true);
    FUZZ_CHECK(s.ok(), "a successful plan did not commit: " << s);
    Invariants(ledger, "admission");
  }
  dm::ResourceHints hints = ledger.TopologyHints(pod_c, "side", kResource, 2);
  if (hints && !hints->empty()) {
    kdm::StatusOr<dm::AllocationPlan> hinted =
        ledger.Plan(pod_c, "side", kResource, 2, hints->front());
    if (hinted.ok() && !hinted->reuse) {
      kdm::Status s = Admit(ledger, pod_c, "side", 2, hints->front(), true);
      FUZZ_CHECK(s.ok(), "a successful hinted plan did not commit: " << s);
      Invariants(ledger, "hinted admission");
    }
  }

  // A restart: the checkpoint restores the same records.
  kdm::checkpoint::CheckpointData saved = ledger.ToCheckpointData();
  dm::Ledger restored;
  FUZZ_CHECK(restored.Restore(saved).skipped.empty(),
             "Restore skipped entries of a consistent state");
  Invariants(restored, "Restore");
  FUZZ_CHECK(restored.AllEntries() == ledger.AllEntries(), "Restore changed the records");
  FUZZ_CHECK(restored.SetDevices(kResource, devices).ok(), "snapshot after Restore refused");
  Invariants(restored, "SetDevices after Restore");

  // The plugin goes away.
  (void)ledger.MarkAllUnhealthy(kResource);
  Invariants(ledger, "MarkAllUnhealthy");
  FUZZ_CHECK(ledger.GetCapacity().resources[kResource].allocatable == 0, "allocatable after stop");
  (void)ledger.RetainOnlyPods({"pod-a"});
  Invariants(ledger, "RetainOnlyPods");
  (void)ledger.RemoveResource(kResource);
  Invariants(ledger, "RemoveResource");
  FUZZ_CHECK(!ledger.HasResource(kResource), "resource still registered after removal");
  return 0;
}
