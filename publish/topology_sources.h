// The topologies the publish loop publishes, loaded from where `--topology
// RESOURCE=SOURCE` and `--ids RESOURCE=FILE` point (docs/publish.md): a
// preset, a file (nvidia-smi topo -m text or kdm's JSON) or NVML, and an
// ids file that renames the topology's rows to the node's device ids.
// Messages name the file or the step that failed, never a flag: the caller
// adds its own words.
//
// Thread-safety: free functions on their arguments only.
//
// Example:
//   bool usage = false;
//   auto t = publish::LoadTopology(publish::ParseTopologySource("preset:dgx-a100"), {}, &usage);
//   if (!t.ok()) return Fail(usage ? 2 : 1, t.status());
//   auto renamed = publish::ApplyIdsFile(t->topology, "/etc/kdm/gpu-ids.csv");
#ifndef KDM_PUBLISH_TOPOLOGY_SOURCES_H_
#define KDM_PUBLISH_TOPOLOGY_SOURCES_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/k8s/attributes.h"
#include "kdm/topology/topology.h"

namespace kdm::publish {

// Where a topology comes from.
struct TopologySource {
  enum class Kind { kPreset, kFile, kNvml };
  Kind kind = Kind::kFile;
  // kPreset: the preset's name; kFile: the path (as given); kNvml: empty.
  std::string name;
};

// "nvml", "preset:NAME", anything else a file path.
TopologySource ParseTopologySource(const std::string& source);

// For TopologySource::kNvml.
struct NvmlOptions {
  std::string library;     // empty: libnvidia-ml.so.1 from the loader's path
  std::string sysfs_root;  // empty: /sys (the GPUs' NUMA nodes)
};

struct LoadedTopology {
  topology::Topology topology;
  // Set for NVML only: the first GPU's attributes (a node's GPUs are one
  // model), already put through the attribute checks; empty without a GPU.
  std::optional<k8s::DeviceAttributes> nvml_attributes;
  // NVML only: what could not be published (ignored links, attributes).
  std::vector<std::string> warnings;
  // NVML only: each GPU's UUID -> its NVML index.
  std::map<std::string, int> nvml_indexes;
};

// Loads one topology. NVML's device ids are the GPUs' UUIDs, as NVIDIA's
// plugin and `kdm plugin --nvml` name them. On error `*usage` (REQUIRES:
// not null) says whether the source can not work as given on this machine
// (an unknown preset, no NVML library: the user's to fix) rather than a
// read that failed (a file that does not parse, NVML failing).
StatusOr<LoadedTopology> LoadTopology(const TopologySource& source, const NvmlOptions& nvml,
                                      bool* usage);

// Parses the CSV of `nvidia-smi --query-gpu=index,uuid --format=csv,noheader`
// ("0, GPU-8f6c..."): row index -> device id, for exactly `rows` rows.
// INVALID_ARGUMENT naming the line: no comma, an index that is not a number
// or past `rows`, a bad id (1 to 253 printable bytes, no blank), an index
// given twice; or the count of rows when it is not `rows`.
StatusOr<std::vector<std::string>> ParseIdsCsv(const std::string& text, int rows);

// `t` with its device ids replaced from the ids file at `path` (absolute),
// row by row. Errors: the file's read error as is; a parse or topology
// error prefixed "<path>: ".
StatusOr<topology::Topology> ApplyIdsFile(const topology::Topology& t, const std::string& path);

// Whether the annotation fits the API server's bound (k8s::kMaxAnnotationBytes)
// on the day every device of `topologies` is healthy and free: the largest
// value these topologies and attributes can make, for Node `node`. OK, or
// OUT_OF_RANGE from k8s::EncodeDevicesAnnotationWithin naming the size and
// the limit; memory stays bounded by the limit (a 1,024-GPU matrix is refused
// from its size alone).
Status CheckAnnotationFits(const std::string& node,
                           const std::map<std::string, topology::Topology>& topologies,
                           const std::map<std::string, k8s::DeviceAttributes>& attributes);

}  // namespace kdm::publish

#endif  // KDM_PUBLISH_TOPOLOGY_SOURCES_H_
