// GPU discovery through NVML: every GPU's identity, attributes and NUMA node,
// the system's driver and CUDA versions, and (QueryTopology) the raw link
// answers that topology_from_nvml.h turns into a topology.
//
// NUMA nodes are not NVML's: they come from sysfs,
// `<sysfs_root>/bus/pci/devices/<dddd:bb:dd.f>/numa_node` (-1, a missing file
// or an unreadable one: unknown), and each GPU's CPU affinity from
// `local_cpulist` beside it. The sysfs root is injectable for tests.
//
// Thread-safety: free functions; they only read the Library, so they may run
// on any thread, concurrently.
//
// Example:
//   auto lib = Library::Load();
//   kdm::StatusOr<NodeInfo> node = Discover(**lib, {});
//   kdm::StatusOr<NvmlTopology> t = DiscoverTopology(**lib, *node);
#ifndef KDM_NVML_DISCOVERY_H_
#define KDM_NVML_DISCOVERY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/k8s/attributes.h"
#include "kdm/nvml/library.h"
#include "kdm/nvml/nvml_api.h"
#include "kdm/nvml/topology_from_nvml.h"

namespace kdm::nvml {

struct GpuInfo {
  int index = 0;  // NVML's index
  DeviceHandle handle = nullptr;
  std::string uuid;          // "GPU-..."; kdm's device id
  unsigned minor = 0;        // /dev/nvidia<minor>
  std::string pci_bus_id;    // NVML's spelling, "00000000:1B:00.0"
  std::string sysfs_bus_id;  // sysfs's, "0000:1b:00.0"
  std::optional<int> numa;   // from sysfs; nullopt when unknown
  std::string cpu_affinity;  // sysfs local_cpulist ("0-63"), "" when unknown
  // What NVML says of the device, in the one attributes struct
  // (k8s/attributes.h; docs/nvml.md, "Device attributes"). A value that
  // fails the attribute checks (a model name with a control byte, say) is
  // left unset and `attribute_warnings` says which and why.
  k8s::DeviceAttributes attributes;
  std::vector<std::string> attribute_warnings;
};

struct NodeInfo {
  std::string driver_version;       // "550.54.15"
  int cuda_driver_version_raw = 0;  // 12040
  std::string cuda_driver_version;  // "12.4"
  std::vector<GpuInfo> gpus;        // in NVML's index order
};

struct DiscoveryOptions {
  std::string sysfs_root = "/sys";
};

// Every GPU NVML reports. On failure the Status names the call and the GPU
// (index, and UUID once known) with the library's error text.
StatusOr<NodeInfo> Discover(const Library& library, const DiscoveryOptions& options);

// The link answers for the discovered GPUs (links 0 .. kMaxNvLinks-1 of each
// GPU, until one answers kErrorInvalidArgument or kErrorNotSupported, and the
// common ancestor of every pair).
RawTopology QueryTopology(const Library& library, const NodeInfo& node);

// QueryTopology, then TopologyFromNvml.
StatusOr<NvmlTopology> DiscoverTopology(const Library& library, const NodeInfo& node);

// The lower-case name of an nvmlBrandType_t value ("tesla", "nvidia", ...);
// "unknown" for a value outside the list.
std::string_view BrandName(BrandType brand);
// The value for a name BrandName gives; nullopt otherwise.
std::optional<BrandType> BrandFromName(std::string_view name);

// The NUMA node of a PCI device from `<sysfs_root>/bus/pci/devices/<bus
// id>/numa_node`: nullopt for -1, a missing or unreadable file, or text that
// is not a number.
std::optional<int> ReadNumaNode(const std::string& sysfs_root, const std::string& sysfs_bus_id);

}  // namespace kdm::nvml

#endif  // KDM_NVML_DISCOVERY_H_
