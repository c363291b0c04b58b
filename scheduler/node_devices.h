// What the extender needs from one node's `kdm.io/devices` annotation
// (docs/extender.md, "Reading the annotation"), read fast: per resource the
// device count, the free devices as positions, the link topology (shared by
// every node with the same matrix) and the attributes requirement checks
// read.
//
// The annotation is read with simdjson's On-Demand API, touching only the
// keys above. Each distinct matrix is checked once by the strict decoder
// (kube::DecodeDevicesAnnotation) and its Topology kept in a TopologyCache;
// later nodes with the same matrix cells reuse it, whatever their device ids.
//
// Thread-safety: ReadNodeDevices is a pure function apart from the cache;
// TopologyCache is thread-safe. NodeDevices is an immutable value.
//
// Example:
//   TopologyCache topologies;
//   StatusOr<NodeDevices> d = ReadNodeDevices(annotation_text, &topologies);
//   if (d.ok()) int free = d->resources.at("nvidia.com/gpu").available.size();
#ifndef KDM_SCHEDULER_NODE_DEVICES_H_
#define KDM_SCHEDULER_NODE_DEVICES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/topology/topology.h"

namespace kdm::scheduler {

// A topology known by its cells, with an id for score memos (0: not cached,
// never memoised).
struct SharedTopology {
  uint64_t id = 0;
  topology::Topology topology;
};

// Keeps one Topology per distinct (matrix, pcie) text. At most `max_entries`;
// past that, new topologies are built per node and not memoised.
class TopologyCache {
 public:
  explicit TopologyCache(size_t max_entries = 4096) : max_entries_(max_entries) {}
  // The topology kept for these cells (the raw `matrix` and `pcie` texts).
  std::shared_ptr<const SharedTopology> Find(std::string_view matrix, std::string_view pcie) const;
  // Keeps `t` under the cells (when there is room) and returns what is kept.
  std::shared_ptr<const SharedTopology> Insert(std::string_view matrix, std::string_view pcie,
                                               topology::Topology t);
  size_t size() const;

 private:
  struct Entry {
    std::string matrix;
    std::string pcie;
    std::shared_ptr<const SharedTopology> topology;
  };
  static uint64_t Hash(std::string_view matrix, std::string_view pcie);

  const size_t max_entries_;
  mutable Mutex mu_;
  // By a hash of the cells; equal hashes are told apart by the texts.
  std::unordered_multimap<uint64_t, Entry> by_cells_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

struct ResourceView {
  int device_count = 0;
  // Positions in the annotation's `devices` of the free ones, ascending.
  std::vector<int> available;
  // Null when the resource publishes no matrix.
  std::shared_ptr<const SharedTopology> topology;
  // cuda, driver, arch, brand when published (DeviceAttributes::ForRequirements).
  std::map<std::string, std::string> attributes;
};

struct NodeDevices {
  std::map<std::string, ResourceView, std::less<>> resources;
};

// Reads an annotation value. When `annotation` is followed by at least
// `readable_padding` >= simdjson's padding bytes that may be read (a string
// with that much spare capacity), it is read in place; otherwise copied. INVALID_ARGUMENT naming
// the field for a document that is not a version-1 annotation (bad JSON, wrong types, an available
// id that is not a device, a matrix the strict decoder refuses), OUT_OF_RANGE above
// kube::kMaxAnnotationBytes.
StatusOr<NodeDevices> ReadNodeDevices(std::string_view annotation, TopologyCache* topologies,
                                      size_t readable_padding = 0);

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_NODE_DEVICES_H_
