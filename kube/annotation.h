// The `kdm.io/devices` annotation: what a node publishes about its devices
// for the scheduler (docs/publish.md, "The annotation"). One JSON document per
// node: per resource every allocatable (healthy) device with its NUMA node,
// the ones no container holds, and optionally the link matrix (the cells of
// docs/topology.md's JSON) and the devices' attributes.
//
// EncodeDevicesAnnotation writes it deterministically (fixed key order,
// resources by name, no blanks), so equal values give equal bytes.
// DecodeDevicesAnnotation is strict on the types of the keys it knows and
// ignores keys it does not (the format grows); it refuses a document above
// kMaxAnnotationBytes.
//
// Thread-safety: values and pure functions; safe from any thread.
//
// Example:
//   ResourceInput in;
//   in.allocatable = {{"GPU-a", 0}, {"GPU-b", 1}};
//   in.in_use = {"GPU-a"};
//   DevicesAnnotation a{.node = "gpu-node-7", .updated = FormatRfc3339(now)};
//   a.resources["nvidia.com/gpu"] = *BuildResourceDevices(in, nullptr);
//   std::string value = EncodeDevicesAnnotation(a);
//   StatusOr<DevicesAnnotation> back = DecodeDevicesAnnotation(value);  // == a
#ifndef KDM_KUBE_ANNOTATION_H_
#define KDM_KUBE_ANNOTATION_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/topology/topology.h"

namespace kdm::kube {

// The annotation's key on the Node object.
inline constexpr std::string_view kDevicesAnnotationKey = "kdm.io/devices";
// The format version written and the only one read.
inline constexpr int kDevicesAnnotationVersion = 1;
// The API server's bound on all annotations of an object together.
inline constexpr size_t kMaxAnnotationBytes = 256 * 1024;
// The longest attribute value (the model name) accepted.
inline constexpr size_t kMaxAttributeBytes = 256;
// The longest device id or resource name accepted when decoding.
inline constexpr size_t kMaxNameBytes = 253;

// What a node knows about a resource's devices (all of them alike). Every
// field is optional. cuda, driver and arch are versions (digits and dots).
struct DeviceAttributes {
  std::optional<std::string> model;  // e.g. "NVIDIA H100 80GB HBM3"
  std::optional<int64_t> memory_mib;
  std::optional<std::string> driver;  // e.g. "550.54.15"
  std::optional<std::string> cuda;    // e.g. "12.4"
  std::optional<std::string> arch;    // compute capability, e.g. "9.0"
  std::optional<std::string> brand;   // e.g. "tesla", "nvidia"

  bool empty() const { return !model && !memory_mib && !driver && !cuda && !arch && !brand; }
  // The keys requirement checks read (cuda, driver, arch, brand), set ones only.
  std::map<std::string, std::string> ForRequirements() const;
  friend bool operator==(const DeviceAttributes&, const DeviceAttributes&) = default;
};

// Parses "KEY=VALUE,KEY=VALUE,..." with KEY one of model, memory_mib, driver,
// cuda, arch, brand (each at most once). Values may hold spaces but no comma.
// On error: INVALID_ARGUMENT naming the key or item ("attribute 'cuda': not
// a version: 'twelve'", "unknown attribute 'cdua' (keys: ...)").
StatusOr<DeviceAttributes> ParseAttributes(std::string_view text);

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
  friend bool operator==(const ResourceDevices&, const ResourceDevices&) = default;
};

struct DevicesAnnotation {
  int version = kDevicesAnnotationVersion;
  std::string node;
  std::string updated;  // RFC 3339, UTC ("2026-11-24T23:00:00Z")
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

// Parses a value written by any version-1 writer. INVALID_ARGUMENT naming the
// field ("resources['nvidia.com/gpu'].devices[2].numa: must be a
// non-negative integer or null"), OUT_OF_RANGE above kMaxAnnotationBytes.
StatusOr<DevicesAnnotation> DecodeDevicesAnnotation(std::string_view text);

}  // namespace kdm::kube

#endif  // KDM_KUBE_ANNOTATION_H_
