// The `kdm.io/devices` annotation: what a node publishes about its devices
// for the scheduler (docs/publish.md, "The annotation"). One JSON document per
// node: per resource every allocatable (healthy) device with its NUMA node,
// the ones no container holds, and optionally the link matrix (the cells of
// docs/topology.md's JSON), the devices' attributes and the allocation policy
// of the node's device plugin; for the node, the fingerprints of the pods
// that hold devices (PodFingerprint).
//
// One writer and one reader, the only ones in kdm:
// - EncodeDevicesAnnotation writes it deterministically (fixed key order,
//   resources by name, no blanks), so equal values give equal bytes.
// - The reader (simdjson On-Demand) applies every check to every document:
//   types of the keys it knows, version 1, id and resource name lengths,
//   duplicate ids, NUMA nodes, `available` within `devices`, the cells and
//   shape of the link matrix, attribute values (k8s/attributes.h), the pod
//   fingerprints (16 lowercase hex digits, no duplicates, at most
//   kMaxAnnotationPods). Keys it does not know are ignored (the format
//   grows), and so is a policy name it does not know (a newer writer's
//   policy reads as none); above kMaxAnnotationBytes
//   it refuses. Two outputs share it: DecodeDevicesAnnotation (every field,
//   the topology with the node's own device ids) and DecodeNodeDevices (what
//   the extender scores on: free devices as positions, the topology shared
//   through a TopologyCache). Only the step from cells to a Topology is
//   memoised there, keyed by the cells' text and the NUMA nodes; a document
//   is accepted or refused the same way whatever was read before it.
//
// Thread-safety: values and pure functions; TopologyCache is thread-safe.
//
// Example:
//   ResourceInput in;
//   in.allocatable = {{"GPU-a", 0}, {"GPU-b", 1}};
//   in.in_use = {"GPU-a"};
//   DevicesAnnotation a{.node = "gpu-node-7", .updated = FormatRfc3339(now)};
//   a.resources["nvidia.com/gpu"] = BuildResourceDevices(in);
//   std::string value = EncodeDevicesAnnotation(a);
//   StatusOr<DevicesAnnotation> back = DecodeDevicesAnnotation(value);  // == a
//   TopologyCache cache;
//   StatusOr<NodeDevices> view = DecodeNodeDevices(value, &cache);
#ifndef KDM_K8S_DEVICES_ANNOTATION_H_
#define KDM_K8S_DEVICES_ANNOTATION_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/k8s/attributes.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/topology.h"

namespace kdm::k8s {

// The annotation's key on the Node object.
inline constexpr std::string_view kDevicesAnnotationKey = "kdm.io/devices";
// The format version written and the only one read.
inline constexpr int kDevicesAnnotationVersion = 1;
// The API server's bound on all annotations of an object together.
inline constexpr size_t kMaxAnnotationBytes = 256 * 1024;
// The longest device id or resource name accepted when decoding.
inline constexpr size_t kMaxNameBytes = 253;
// The most pod fingerprints accepted when decoding.
inline constexpr size_t kMaxAnnotationPods = 65536;

// A pod's fingerprint in `pods`: FNV-1a 64-bit (offset basis
// 0xcbf29ce484222325, prime 0x100000001b3) over the bytes of
// `namespace_name + "/" + name`, so that a writer in any language can
// produce it. Equal pods give equal fingerprints; two pods may collide
// (about one pair in 2^64).
uint64_t PodFingerprint(std::string_view namespace_name, std::string_view name);
// The fingerprint as written: 16 lowercase hex digits ("00ab...").
std::string FormatPodFingerprint(uint64_t fingerprint);

struct PublishedDevice {
  std::string id;
  std::optional<int> numa;
  friend bool operator==(const PublishedDevice&, const PublishedDevice&) = default;
};

struct ResourceDevices {
  // Every allocatable device, in a fixed order (the topology's, else by id).
  std::vector<PublishedDevice> devices;
  // The devices no container holds, in the order of `devices`.
  std::vector<std::string> available;
  // The links between `devices`, row i = devices[i]; its device ids and NUMA
  // nodes equal `devices`. Written as `matrix` and `pcie` cells.
  std::optional<topology::Topology> topology;
  std::optional<DeviceAttributes> attributes;
  // The policy the node's device plugin answers GetPreferredAllocation with
  // (`policy`); nullopt: not said, or a name this reader does not know.
  std::optional<topology::Policy> policy;
  friend bool operator==(const ResourceDevices&, const ResourceDevices&) = default;
};

struct DevicesAnnotation {
  int version = kDevicesAnnotationVersion;
  std::string node;
  std::string updated;  // RFC 3339, UTC ("2026-11-24T23:00:00Z")
  // The fingerprints of the pods holding at least one device on the node
  // (`pods`), sorted ascending, no duplicates; nullopt: the key is absent
  // (a writer that does not say; kdm's publisher always writes it).
  // REQUIRES (encoding): sorted and unique.
  std::optional<std::vector<uint64_t>> pods;
  std::map<std::string, ResourceDevices> resources;
  friend bool operator==(const DevicesAnnotation&, const DevicesAnnotation&) = default;
};

// What one resource's annotation is built from.
struct ResourceInput {
  // GetAllocatableResources: id -> NUMA node (nullopt when not reported).
  std::map<std::string, std::optional<int>> allocatable;
  // Every device of the resource held by a container (pod-resources List).
  std::set<std::string> in_use;
  // The resource's topology, device ids already the allocatable ids (may
  // hold devices that are not allocatable now: unhealthy ones).
  const topology::Topology* topology = nullptr;
  std::optional<DeviceAttributes> attributes;
};

// Builds one resource's part. With a topology, `devices` follows its order
// and the matrix covers exactly the allocatable devices; a device's NUMA node
// is the one pod-resources reports, else the topology's. When an allocatable
// device is missing from the topology, the resource is published without a
// matrix and `warning` (when given) says which device. In-use ids that are not
// allocatable (unhealthy devices still held) are not available and not listed.
ResourceDevices BuildResourceDevices(const ResourceInput& input, std::string* warning = nullptr);

// "2026-11-24T23:00:00Z" (seconds, UTC).
std::string FormatRfc3339(std::chrono::system_clock::time_point t);

// One line of JSON, keys in a fixed order. REQUIRES: each resource's topology,
// when set, has the ids and NUMA nodes of its `devices` (as built above).
std::string EncodeDevicesAnnotation(const DevicesAnnotation& annotation);

// As EncodeDevicesAnnotation, for a value that is to be sent: never longer
// than `max_bytes`. Past it, OUT_OF_RANGE naming the size and the limit
// ("kdm.io/devices: the value would be at least 786944 bytes, over the limit
// of 262144 bytes (256 KiB) ..."). Memory stays bounded by the limit: a value
// whose lower bound (ids and matrix cells at their shortest) is already past
// it is refused before any cell is rendered, so a 1,024-GPU matrix costs no
// 13 MB string and no JSON tree of two million cells.
StatusOr<std::string> EncodeDevicesAnnotationWithin(const DevicesAnnotation& annotation,
                                                    size_t max_bytes = kMaxAnnotationBytes);

// Parses a value written by any version-1 writer. INVALID_ARGUMENT naming the
// field ("kdm.io/devices: resources['nvidia.com/gpu'].devices[2].numa: must
// be a non-negative integer or null", "kdm.io/devices: pods[3]: must be 16
// lowercase hex digits"), OUT_OF_RANGE above kMaxAnnotationBytes. `pods`
// may be in any order: it is sorted on read.
StatusOr<DevicesAnnotation> DecodeDevicesAnnotation(std::string_view text);

// A topology known by its cells and NUMA nodes, its device ids the positions
// "0", "1", ...; `id` names it for score memos (0: not cached, never
// memoised).
struct SharedTopology {
  uint64_t id = 0;
  topology::Topology topology;
};

// The default byte budget of a TopologyCache: 128 MiB (docs/extender.md,
// "Reading the annotation").
inline constexpr size_t kDefaultTopologyCacheBytes = size_t{128} << 20;

// Keeps one Topology per distinct (matrix text, pcie text, NUMA nodes),
// within a budget of bytes: each entry counts its key texts, its NUMA nodes
// and the Topology's vectors and index (EstimateTopologyBytes), about 1 MB for
// a 248-GPU matrix. Past the budget the least recently used entries are
// evicted (counted); an entry larger than the whole budget is built for its
// document and not kept. An evicted topology stays alive while a reader
// holds it; a later document with its key builds it again, under a new id.
class TopologyCache {
 public:
  struct Stats {
    size_t entries = 0;
    size_t bytes = 0;  // the entries' estimated bytes, <= max_bytes
    size_t max_bytes = 0;
    uint64_t evictions = 0;  // entries dropped to make room
    uint64_t not_kept = 0;   // topologies larger than the whole budget
  };

  explicit TopologyCache(size_t max_bytes = kDefaultTopologyCacheBytes) : max_bytes_(max_bytes) {}
  // The topology kept under the key (and marks it recently used), or null.
  std::shared_ptr<const SharedTopology> Find(std::string_view matrix, std::string_view pcie,
                                             const std::vector<std::optional<int>>& numa);
  // Keeps `t` under the key (evicting the least recently used entries to
  // make room) and returns what is kept; when `t` alone is above the budget,
  // returns it unkept (id 0).
  std::shared_ptr<const SharedTopology> Insert(std::string_view matrix, std::string_view pcie,
                                               const std::vector<std::optional<int>>& numa,
                                               topology::Topology t);
  size_t size() const;
  Stats stats() const;

 private:
  struct Entry {
    uint64_t hash = 0;
    std::string matrix;
    std::string pcie;
    std::vector<std::optional<int>> numa;
    std::shared_ptr<const SharedTopology> topology;
    size_t bytes = 0;
  };
  using List = std::list<Entry>;
  static uint64_t Hash(std::string_view matrix, std::string_view pcie,
                       const std::vector<std::optional<int>>& numa);
  List::iterator FindLocked(uint64_t hash, std::string_view matrix, std::string_view pcie,
                            const std::vector<std::optional<int>>& numa)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictOldestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_bytes_;
  mutable Mutex mu_;
  List lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  std::unordered_multimap<uint64_t, List::iterator> by_hash_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t not_kept_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// The heap bytes a Topology holds (its device list and ids, link and score
// matrices, id index), estimated from the standard containers' layout.
size_t EstimateTopologyBytes(const topology::Topology& t);

// One resource as the extender scores it.
struct ResourceView {
  int device_count = 0;
  // Positions in the annotation's `devices` of the free ones, ascending.
  std::vector<int> available;
  // Null when the resource publishes no matrix.
  std::shared_ptr<const SharedTopology> topology;
  DeviceAttributes attributes;
  // The node's plugin's allocation policy; nullopt: not said or unknown.
  std::optional<topology::Policy> policy;
};

struct NodeDevices {
  std::map<std::string, ResourceView, std::less<>> resources;
  // The pods holding devices on the node (fingerprints, ascending, unique);
  // nullopt: the annotation does not say.
  std::optional<std::vector<uint64_t>> pods;
};

// The same reader and checks as DecodeDevicesAnnotation, keeping what the
// extender needs. When `text` is followed by at least `readable_padding` >=
// DecodePadding() bytes that may be read (a string with that much spare
// capacity), it is read in place; otherwise copied. Errors as
// DecodeDevicesAnnotation's.
StatusOr<NodeDevices> DecodeNodeDevices(std::string_view text, TopologyCache* topologies,
                                        size_t readable_padding = 0);

// Bytes past a text's end that DecodeNodeDevices reads in place.
size_t DecodePadding();

}  // namespace kdm::k8s

#endif  // KDM_K8S_DEVICES_ANNOTATION_H_
