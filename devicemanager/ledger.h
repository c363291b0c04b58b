// kdm::devicemanager::Ledger: the device manager's whole allocation state as
// a plain value, and every admission rule of docs/kubelet-rules.md#allocation
// as a function of it.
//
// Per resource the Ledger knows each registered device (id, health, NUMA
// nodes); per (pod, container, resource) the devices recorded for it and
// the plugin's allocate response (opaque bytes: a serialized
// v1beta1.ContainerAllocateResponse); and the reservations of admissions in
// flight. It is pure: no threads, no I/O, no clocks, no gRPC, no protobuf.
// The Manager (the shell) holds one Ledger behind its mutex, calls Plan() and
// Reserve() under the lock, runs the plugin RPCs without it, then calls
// Commit() or ReleaseReservation() under the lock again, and persists the
// returned checkpoint::Change in one transaction.
//
// Device states, per resource: every registered device is healthy or
// unhealthy; a healthy device is exactly one of allocated (recorded for some
// container), reserved (chosen by an admission in flight) or free. The one
// sharing allowed is the init-container hand-over
// (docs/kubelet-rules.md#init-containers-and-sidecars): a device of a
// finished (non-restartable) init container may also be recorded for, or
// reserved by, a later container of the same pod. CheckInvariants() verifies
// all this.
//
// Decisions where the kubelet is silent or unsafe (documented in the methods):
// - duplicate ids in a device snapshot are de-duplicated, not rejected: the
//   first occurrence gives the topology, and the device is healthy only if
//   every occurrence says so; the duplicates are reported back;
// - devices handed over from init containers must be healthy;
// - a reserved device is never offered to anyone else, and a device removed
//   from a snapshot while reserved is still committed (the plugin already
//   allocated it), like the kubelet's allocated-but-unknown devices;
// - Restore() drops a checkpoint entry that would put a device in two pods.
//
// Thread-safety: none. A value type; the owner serialises every call. Copying
// a Ledger copies the whole state (a cheap way to make a multi-step change
// all-or-nothing).
//
// Example (one container, one resource, no plugin preference):
//   Ledger ledger;
//   (void)ledger.SetDevices("vendor.com/gpu",
//                           {{"gpu0", true, {0}}, {"gpu1", true, {1}}});
//   KDM_ASSIGN_OR_RETURN(
//       AllocationPlan plan,
//       ledger.Plan(pod, "main", "vendor.com/gpu", 1, std::nullopt));
//   if (!plan.reuse) {
//     KDM_RETURN_IF_ERROR(ledger.Reserve(plan, ledger.DefaultChoice(plan)));
//     // ... Allocate RPC; on failure: ledger.ReleaseReservation(plan.key)
//     KDM_ASSIGN_OR_RETURN(checkpoint::Change change,
//                          ledger.Commit(plan.key, response_bytes));
//     if (!store->Apply(change).ok()) {
//       (void)ledger.UndoCommit(plan.key);
//       ledger.ReleaseReservation(plan.key);
//     }
//   }
#ifndef KDM_DEVICEMANAGER_LEDGER_H_
#define KDM_DEVICEMANAGER_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/checkpoint/store.h"
#include "kdm/devicemanager/pod.h"

namespace kdm::devicemanager {

// One device as a plugin reported it in ListAndWatch.
struct LedgerDevice {
  std::string id;
  bool healthy = false;
  // NUMA node ids; empty = no topology. Negative ids are ignored.
  std::vector<int64_t> numa_nodes;

  friend bool operator==(const LedgerDevice&, const LedgerDevice&) = default;
};

struct ResourceCapacity {
  int64_t capacity = 0;     // healthy + unhealthy
  int64_t allocatable = 0;  // healthy

  friend bool operator==(const ResourceCapacity&, const ResourceCapacity&) = default;
};

struct Capacity {
  // Every registered (not removed) resource.
  std::map<std::string, ResourceCapacity> resources;
  // Resources removed with RemoveResource() and not registered since, sorted.
  std::vector<std::string> deleted;
};

// A topology hint (docs/kubelet-rules.md#topology-hints): a set of NUMA
// nodes, and whether it is one of the smallest sets able to hold the request.
struct NumaHint {
  std::vector<int64_t> nodes;  // sorted, unique
  bool preferred = false;

  friend bool operator==(const NumaHint&, const NumaHint&) = default;
};

// Hints for one resource. std::nullopt: no preference (no device of the
// resource has topology). An empty vector: no NUMA placement can satisfy the
// request (e.g. more requested than are available).
using ResourceHints = std::optional<std::vector<NumaHint>>;

// What Plan() decided for one (pod, container, resource).
struct AllocationPlan {
  checkpoint::ContainerKey key;
  ContainerKind kind = ContainerKind::kApp;
  // The container already has exactly `size` devices recorded (a restart):
  // nothing to allocate or reserve; `reuse_ids` are those devices.
  bool reuse = false;
  std::vector<std::string> reuse_ids;
  // Devices the allocation must contain: handed over from finished init
  // containers of the same pod
  // (docs/kubelet-rules.md#init-containers-and-sidecars), then, when a hint
  // is given and the hinted NUMA nodes cannot hold the whole request, every
  // aligned free device (so the alignment the topology manager asked for is
  // honoured).
  std::vector<std::string> must_include;
  // Free devices (healthy − allocated − reserved) to choose the rest from:
  // NUMA-aligned devices first when a hint is given (only those when they
  // suffice), each group in natural id order ("gpu2" before "gpu10").
  std::vector<std::string> candidates;
  // The full request.
  int64_t size = 0;
  // True when candidates ∪ must_include holds more than `size` devices: only
  // then is there a choice to make, and GetPreferredAllocation worth asking
  // (with available = candidates ∪ must_include, must_include, size).
  bool real_choice = false;
};

// What SetDevices() noticed about a snapshot that it accepted anyway.
struct SnapshotReport {
  std::vector<std::string> duplicate_ids;  // ids listed more than once
  int64_t empty_ids = 0;                   // devices with an empty id, skipped
  // The registered-devices change to persist (healthy ids of the resource).
  checkpoint::Change change;
  // Devices whose health changed: new ids and ids whose health flipped, in
  // natural order, with their new health; then ids that were healthy and
  // are gone, in plain order, as unhealthy.
  std::vector<LedgerDevice> health_changes;
};

// A checkpoint entry that Restore() left out, and why.
struct SkippedCheckpointEntry {
  std::string pod_uid;
  std::string container_name;
  std::string resource_name;
  // The entry's first device that an earlier entry of another pod holds,
  // and that pod's uid; both empty when the entry was skipped for an empty
  // pod uid, container or resource name.
  std::string device_id;
  std::string held_by_pod_uid;
  // "empty pod uid, container or resource name" or "device held by another
  // pod".
  std::string reason;

  friend bool operator==(const SkippedCheckpointEntry&, const SkippedCheckpointEntry&) = default;
};

// What Restore() left out of a checkpoint, in the checkpoint's entry order.
struct RestoreReport {
  std::vector<SkippedCheckpointEntry> skipped;
};

// All device ids of an entry, unique, in natural order (a device on two NUMA
// nodes is listed under both).
std::vector<std::string> FlattenDeviceIds(const checkpoint::DevicesPerNuma& ids);

// Natural order of device ids: digit runs compare as numbers ("gpu2" <
// "gpu10"), everything else byte-wise. Ties broken by plain comparison.
bool NaturalLess(const std::string& a, const std::string& b);

class Ledger {
 public:
  // ---- devices (from the shell's endpoints) ----

  // Replaces everything known about `resource` with `snapshot` (a complete
  // ListAndWatch message): ids missing from it are forgotten, the resource
  // is registered (and no longer reported as deleted). Allocations and
  // reservations are kept even for forgotten ids. Devices with an empty id
  // are skipped; duplicate ids are merged (first topology, healthy only if
  // every copy is healthy); both are counted in the report.
  // Errors: INVALID_ARGUMENT for an empty resource name (nothing changes).
  StatusOr<SnapshotReport> SetDevices(const std::string& resource,
                                      const std::vector<LedgerDevice>& snapshot);

  // The endpoint of `resource` stopped: every device becomes unhealthy
  // (capacity kept, allocatable 0). Unknown resource: no-op, empty change.
  // Returns the registered-devices change to persist (no healthy ids).
  checkpoint::Change MarkAllUnhealthy(const std::string& resource);

  // The grace period expired: the devices are forgotten and the resource is
  // reported in Capacity::deleted until it registers again. Allocations of
  // the resource stay recorded (their pods still hold them). Unknown
  // resource: no-op, empty change.
  checkpoint::Change RemoveResource(const std::string& resource);

  // Registered and not removed (possibly with no healthy device).
  bool HasResource(const std::string& resource) const;
  // OK when HasResource(resource); otherwise FAILED_PRECONDITION `cannot
  // allocate unregistered device <r>`, the one home of that rule and text
  // (Plan and Reserve answer with it too).
  Status CheckRegistered(const std::string& resource) const;
  // HasResource(), or some container has devices of it recorded: a limit on
  // such a resource is handled by the device manager.
  bool IsDeviceResource(const std::string& resource) const;
  // Registered resources, sorted.
  std::vector<std::string> Resources() const;

  Capacity GetCapacity() const;
  // Healthy device ids of `resource` in natural order; empty if unknown.
  std::vector<std::string> HealthyDevices(const std::string& resource) const;
  // Every registered device of `resource` in natural order; empty if unknown.
  std::vector<LedgerDevice> Devices(const std::string& resource) const;

  // ---- admission (docs/kubelet-rules.md#allocation) ----

  // k8s::ContainerDeviceRequests with IsDeviceResource: device resources
  // named in `container`'s limits with their counts; zero counts are left
  // out. Errors (INVALID_ARGUMENT, naming the container, resource and
  // value): request present and != limit, negative, fractional, too large.
  StatusOr<std::map<std::string, int64_t>> ContainerRequests(const Container& container) const;

  // k8s::EffectiveDeviceRequests with IsDeviceResource (for pod-scope
  // topology hints): per resource the larger of (sum over app containers and
  // sidecars) and, for each init container, (its own count + sidecars
  // started before it). The extender computes a pod's request with the same
  // function.
  StatusOr<std::map<std::string, int64_t>> PodRequests(const Pod& pod) const;

  // Decides how `count` devices of `resource` go to `container` of `pod`,
  // following docs/kubelet-rules.md#allocation in the kubelet's order:
  //   recorded with another count → FAILED_PRECONDITION
  //     `pod "<uid>" container "<c>" changed request for resource "<r>" from
  //     <a> to <b>`;
  //   not registered → FAILED_PRECONDITION `cannot allocate unregistered device
  //   <r>`; no healthy device → UNAVAILABLE
  //     `no healthy devices present; cannot allocate unhealthy devices <r>`;
  //   recorded devices not all healthy → UNAVAILABLE `previously allocated
  //     devices are no longer healthy; cannot allocate unhealthy devices <r>`;
  //   recorded with the same count → a plan with reuse = true;
  //   otherwise hand-over devices first, then free ones; too few free →
  //     RESOURCE_EXHAUSTED `requested number of devices unavailable for <r>.
  //     Requested: <n>, Available: <m>` where n is what is still needed after
  //     the hand-over and m the number of free devices (as the kubelet does).
  // `hint`, when given, puts devices on its NUMA nodes first.
  // Bad input: INVALID_ARGUMENT for an empty pod uid, empty resource name or
  // count < 1; NOT_FOUND for a container the pod does not have.
  StatusOr<AllocationPlan> Plan(const Pod& pod, const std::string& container,
                                const std::string& resource, int64_t count,
                                const std::optional<NumaHint>& hint) const;

  // Checks a GetPreferredAllocation answer against `plan`
  // (docs/promises.md#validated-preferred-answers):
  // exactly plan.size ids, no duplicates, each in candidates ∪ must_include,
  // every must_include id present. INVALID_ARGUMENT naming the first problem.
  Status ValidatePreferred(const AllocationPlan& plan,
                           const std::vector<std::string>& answer) const;

  // kdm's own choice: must_include, then the first candidates, `size` in all.
  std::vector<std::string> DefaultChoice(const AllocationPlan& plan) const;

  // Reserves `ids` for plan.key, replacing any reservation that key already
  // holds (so a default choice can be swapped for a validated preferred one).
  // Each id must be a registered healthy device of the resource, and either
  // free, or reserved by plan.key itself, or (only ids in plan.must_include)
  // recorded for finished init containers of the same pod and not reserved by
  // anyone else. Errors, with nothing changed: INVALID_ARGUMENT for a reuse
  // plan, a wrong number of ids or duplicates; FAILED_PRECONDITION when the
  // container already has devices recorded or an id is unknown, unhealthy or
  // taken (the message names the id).
  Status Reserve(const AllocationPlan& plan, const std::vector<std::string>& ids);

  // Drops plan.key's reservation, if any (every failure path calls this).
  void ReleaseReservation(const checkpoint::ContainerKey& key);

  // The ids reserved for `key`, or nullopt when it holds no reservation.
  std::optional<std::vector<std::string>> Reservation(const checkpoint::ContainerKey& key) const;

  // Turns key's reservation into its record (device ids grouped by NUMA
  // node, kNoNumaNode for devices without topology) with `alloc_response`,
  // and returns the change to persist (one upsert). FAILED_PRECONDITION if
  // `key` holds no reservation (e.g. the pod was removed meanwhile).
  StatusOr<checkpoint::Change> Commit(const checkpoint::ContainerKey& key,
                                      const std::string& alloc_response);

  // Reverts the latest Commit(), which must be of `key`, when its change
  // could not be persisted: the record goes back to being a reservation
  // (release it or commit again). FAILED_PRECONDITION if the latest commit
  // was of another key or has already been reverted or removed.
  Status UndoCommit(const checkpoint::ContainerKey& key);

  // Forgets every record and reservation of the pod. Returns the change to
  // persist (removed_pods = {uid} when it had records, else empty).
  checkpoint::Change RemovePod(const std::string& pod_uid);

  // Garbage collection: forgets the records of every pod not in
  // `active_pod_uids`. Reservations are left alone (an admission in flight
  // ends in Commit or ReleaseReservation). Returns the change to persist.
  checkpoint::Change RetainOnlyPods(const std::set<std::string>& active_pod_uids);

  // ---- queries ----

  std::optional<checkpoint::PodDevicesEntry> Entry(const checkpoint::ContainerKey& key) const;
  // Records of one container, by resource name.
  std::vector<checkpoint::PodDevicesEntry> ContainerEntries(const std::string& pod_uid,
                                                            const std::string& container) const;
  // Records of one pod, by (container, resource).
  std::vector<checkpoint::PodDevicesEntry> PodEntries(const std::string& pod_uid) const;
  // Every record, by (pod, container, resource).
  std::vector<checkpoint::PodDevicesEntry> AllEntries() const;

  // Topology hints for `count` devices of `resource` for `container`
  // (docs/kubelet-rules.md#topology-hints; the kubelet's
  // generateDeviceTopologyHints):
  // the NUMA nodes considered are those holding any device of the resource;
  // every subset of them that holds enough free devices (plus the hand-over
  // devices, which must all lie inside it) is a hint, preferred when its
  // size equals the fewest nodes that hold `count` devices of the resource.
  // Already recorded with the same count: hints are regenerated from the
  // recorded devices; with another count: empty. nullopt when no device of
  // the resource has topology (or the resource is unknown, or its devices
  // span more than 16 NUMA nodes, too many subsets to enumerate).
  ResourceHints TopologyHints(const Pod& pod, const std::string& container,
                              const std::string& resource, int64_t count) const;
  // TopologyHints() for every device resource of the container's limits.
  // Errors as ContainerRequests(), plus NOT_FOUND for an unknown container.
  StatusOr<std::map<std::string, ResourceHints>> ContainerTopologyHints(
      const Pod& pod, const std::string& container) const;
  // Pod scope: PodRequests() per resource, hints from the devices recorded
  // for the pod, or from the free devices when none are.
  StatusOr<std::map<std::string, ResourceHints>> PodTopologyHints(const Pod& pod) const;

  // ---- restart ----

  // Replaces the whole state with `data` (after a restart): every entry is
  // recorded again; every resource of data.registered_devices is registered
  // with no devices (capacity 0, "no healthy devices present") until its
  // plugin registers and sends a snapshot
  // (docs/kubelet-rules.md#kubelet-restart). Reservations and deleted
  // resources are cleared. Skipped, and each reported with its
  // reason: entries with an empty pod uid, container or resource name, and
  // entries naming a device that an earlier entry of another pod holds (a
  // corrupt or hand-edited checkpoint must not put a device in two pods).
  RestoreReport Restore(const checkpoint::CheckpointData& data);

  // The state in checkpoint form: every record, and the healthy ids of every
  // registered resource (boot_id left empty).
  checkpoint::CheckpointData ToCheckpointData() const;

  // For tests, after every step: no device recorded for or reserved by two
  // containers except the init-container hand-over within one pod, no two
  // running containers (sidecar or app) share a device, reservations are
  // disjoint from allocations (hand-over aside) and from each other, and for
  // every resource allocated + reserved + free = healthy over its healthy
  // devices. INTERNAL naming the first violation.
  Status CheckInvariants() const;

  // Test only: records `entry` for a container of `kind` without any check,
  // so tests can show that CheckInvariants() catches a broken state.
  void ForceRecordForTest(const checkpoint::PodDevicesEntry& entry, ContainerKind kind);

 private:
  struct DeviceInfo {
    bool healthy = false;
    std::vector<int64_t> numa_nodes;  // sorted, unique, non-negative
    size_t rank = 0;                  // position in ResourceState::order
  };
  struct ResourceState {
    std::map<std::string, DeviceInfo> devices;
    std::vector<std::string> order;  // the ids of `devices`, natural order
  };
  struct Record {
    std::vector<std::string> ids;  // natural order, unique
    checkpoint::DevicesPerNuma by_numa;
    std::string alloc_response;
    // Known when committed by this Ledger; nullopt after Restore().
    std::optional<ContainerKind> kind;
    std::set<std::string> handed_over;  // ids taken from init containers
  };
  struct ReservationState {
    ContainerKind kind = ContainerKind::kApp;
    std::vector<std::string> ids;       // everything reserved, in chosen order
    std::set<std::string> handed_over;  // subset of ids taken from init containers
  };

  using RecordMap = std::map<checkpoint::ContainerKey, Record>;
  using ReservationMap = std::map<checkpoint::ContainerKey, ReservationState>;

  // Every change to records_ and reservations_ goes through these, which
  // keep the indexes below in step.
  void InsertRecord(const checkpoint::ContainerKey& key, Record record);
  RecordMap::iterator EraseRecord(RecordMap::iterator it);
  void InsertReservation(const checkpoint::ContainerKey& key, ReservationState state);
  ReservationMap::iterator EraseReservation(ReservationMap::iterator it);
  // The range of records_ / reservations_ of one pod.
  std::pair<RecordMap::const_iterator, RecordMap::const_iterator> PodRecords(
      const std::string& pod_uid) const;
  std::pair<ReservationMap::const_iterator, ReservationMap::const_iterator> PodReservations(
      const std::string& pod_uid) const;

  // How many records hold device `id` of `resource`.
  int HolderCount(const std::string& resource, const std::string& id) const;
  // The reservation holding device `id` of `resource`, or nullptr.
  const checkpoint::ContainerKey* ReservedBy(const std::string& resource,
                                             const std::string& id) const;
  // Some record holding `id` of `resource`, preferring other pods than
  // `pod_uid` (for error messages), or nullptr.
  const checkpoint::ContainerKey* SomeHolder(const std::string& resource, const std::string& id,
                                             const std::string& pod_uid) const;
  // Free devices of `resource` (healthy − allocated − reserved), natural order.
  std::vector<std::string> FreeIds(const std::string& resource) const;
  // Hand-over pool for `container` of `pod`
  // (docs/kubelet-rules.md#init-containers-and-sidecars), healthy only,
  // natural order.
  std::vector<std::string> HandOverPool(const Pod& pod, const std::string& container,
                                        const std::string& resource) const;
  ResourceHints GenerateHints(const std::string& resource,
                              const std::vector<std::string>& available,
                              const std::vector<std::string>& reusable, int64_t count) const;
  checkpoint::Change RegisteredChange(const std::string& resource) const;

  std::map<std::string, ResourceState> resources_;
  std::set<std::string> deleted_;
  RecordMap records_;
  ReservationMap reservations_;
  // Indexes (CheckInvariants() recomputes and compares them):
  // resource -> device id -> number of records holding it;
  std::map<std::string, std::map<std::string, int>> holders_;
  // resource -> device id -> the reservation holding it;
  std::map<std::string, std::map<std::string, checkpoint::ContainerKey>> reserved_;
  // resource -> number of records of it.
  std::map<std::string, int> records_per_resource_;
  // The key of the latest Commit(), the only one UndoCommit() may revert.
  std::optional<checkpoint::ContainerKey> last_commit_;
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_LEDGER_H_
