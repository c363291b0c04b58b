// kdm::checkpoint::Store: where the device manager's allocation state lives
// across restarts.
//
// The data model is the kubelet's own (docs/kubelet-rules.md#checkpoint): one
// entry per (pod uid, container, resource) with the device ids by NUMA node
// and the plugin's ContainerAllocateResponse as opaque protobuf bytes, plus
// the healthy device ids of every registered resource, plus the boot id the
// state was written under (docs/promises.md#restart-is-not-reboot).
// checkpoint/ knows nothing of gRPC or protobuf.
//
// Every Apply() is one atomic change: after a crash at any moment, a reopened
// store holds every Apply() that returned OK and nothing of one that did not.
//
// Thread-safety: a Store is not thread-safe; its owner (the Manager) serialises
// calls.
//
// Example:
//   std::unique_ptr<Store> store = NewMemoryStore();
//   Change c;
//   c.upserts.push_back({"uid-1", "main", "vendor.com/gpu", {{0, {"gpu0"}}}, bytes});
//   if (Status s = store->Apply(c); !s.ok()) { ... nothing was changed ... }
#ifndef KDM_CHECKPOINT_STORE_H_
#define KDM_CHECKPOINT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::checkpoint {

// NUMA node key used for devices without topology.
inline constexpr int64_t kNoNumaNode = -1;

// Device ids by NUMA node id (kNoNumaNode for devices without topology).
using DevicesPerNuma = std::map<int64_t, std::vector<std::string>>;

struct ContainerKey {
  std::string pod_uid;
  std::string container_name;
  std::string resource_name;

  friend auto operator<=>(const ContainerKey&, const ContainerKey&) = default;
};

struct PodDevicesEntry {
  std::string pod_uid;
  std::string container_name;
  std::string resource_name;
  DevicesPerNuma device_ids;
  // Serialized v1beta1.ContainerAllocateResponse, stored as opaque bytes.
  std::string alloc_response;

  ContainerKey key() const { return {pod_uid, container_name, resource_name}; }
  friend bool operator==(const PodDevicesEntry&, const PodDevicesEntry&) = default;
};

struct CheckpointData {
  // Sorted by (pod_uid, container_name, resource_name) when loaded.
  std::vector<PodDevicesEntry> entries;
  // Resource name -> healthy device ids of that resource.
  std::map<std::string, std::vector<std::string>> registered_devices;
  // Boot id of the machine when the state was last written; empty if unknown.
  std::string boot_id;

  friend bool operator==(const CheckpointData&, const CheckpointData&) = default;
};

// One atomic change. Applied in this order: removed_pods, removals, upserts,
// removed_resources, registered_devices.
struct Change {
  std::vector<std::string> removed_pods;                               // every entry of these pods
  std::vector<ContainerKey> removals;                                  // single entries
  std::vector<PodDevicesEntry> upserts;                                // insert or replace by key
  std::vector<std::string> removed_resources;                          // from registered_devices
  std::map<std::string, std::vector<std::string>> registered_devices;  // set per resource

  bool empty() const {
    return removed_pods.empty() && removals.empty() && upserts.empty() &&
           removed_resources.empty() && registered_devices.empty();
  }
};

class Store {
 public:
  virtual ~Store() = default;

  // The whole state. Fails only on an I/O error of an already opened store.
  virtual StatusOr<CheckpointData> Load() = 0;

  // Applies `change` atomically. On error nothing of it is applied.
  virtual Status Apply(const Change& change) = 0;

  // Replaces the whole state (used by import) atomically.
  virtual Status Replace(const CheckpointData& data) = 0;

  // Records the boot id the state is now valid for.
  virtual Status SetBootId(const std::string& boot_id) = 0;

  // A short human description, e.g. "sqlite:/var/lib/kdm/state/checkpoint.db".
  virtual std::string Describe() const = 0;
};

// What opening a persistent store found. A corrupt file never stops the
// agent: it is moved aside (never deleted) and a fresh, empty store is
// returned, with what was wrong in `recovered`.
struct OpenResult {
  std::unique_ptr<Store> store;
  // OK, or what was wrong with the old file (it was quarantined).
  Status recovered;
  // Where the bad file was moved to; empty when nothing was moved.
  std::string quarantined_path;
  // Temporary files of a writer that died mid-write (kill -9 between
  // creating and renaming one), removed when the store was opened; the
  // opener logs them. Kubelet JSON store only (SQLite keeps no such files).
  std::vector<std::string> removed_temp_files;
};

// A store that lives in memory only (tests, and embedders that want no
// persistence). Never fails.
std::unique_ptr<Store> NewMemoryStore();

}  // namespace kdm::checkpoint

#endif  // KDM_CHECKPOINT_STORE_H_
