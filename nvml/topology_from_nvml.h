// The translation of NVML's raw link answers into kdm's topology model, as a
// pure function, so that every rule is unit-tested on hand-made answers
// without a library: discovery.h's QueryTopology collects the answers from
// NVML and hands them here.
//
// The rules (docs/nvml.md, "Topology from NVML"):
//  - NVLinks: a GPU's links are scanned from 0 up; an answer of
//    kErrorInvalidArgument (past the GPU's own links) or kErrorNotSupported
//    (no NVLink) ends the scan and is not an error; any other failure is.
//    Disabled links count nothing. A link whose far end is a GPU counts for
//    the pair (the two GPUs' views are combined by taking the smaller, so a
//    one-sided answer never invents a link); a link to an NVSwitch counts for
//    the GPU's switch links, and a pair of GPUs that both reach switches gets
//    the smaller of their two switch-link counts on top. A far end of another
//    type (an IBM NPU, unknown) counts nothing, and a remote bus id that
//    matches no GPU of the node (a GPU hidden from this process) is ignored
//    and named in `ignored`.
//  - PCIe: the common-ancestor level of the pair: 0 internal (one board) PSB,
//    10 PIX, 20 PXB, 30 PHB, 40 NODE, 50 SYS; a pair whose query answered
//    kErrorNotSupported has no known PCIe relation (PcieLink::kNone); any other
//    level or failure is an error naming the pair.
//
// Thread-safety: a pure function.
//
// Example:
//   RawTopology raw = ...;  // from QueryTopology, or built by hand in a test
//   kdm::StatusOr<NvmlTopology> t = TopologyFromNvml(raw);
//   if (t.ok()) std::cout << kdm::topology::RenderNvidiaSmi(t->topology);
#ifndef KDM_NVML_TOPOLOGY_FROM_NVML_H_
#define KDM_NVML_TOPOLOGY_FROM_NVML_H_

#include <optional>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/nvml/nvml_api.h"
#include "kdm/topology/topology.h"

namespace kdm::nvml {

// One link's answers: nvmlDeviceGetNvLinkState, then (for an enabled link)
// nvmlDeviceGetNvLinkRemoteDeviceType and nvmlDeviceGetNvLinkRemotePciInfo_v2.
struct RawLink {
  Return state_ret = kSuccess;
  bool enabled = false;
  Return type_ret = kSuccess;
  int remote_type = kNvLinkDeviceTypeUnknown;
  Return pci_ret = kSuccess;
  std::string remote_bus_id;  // PciInfo::bus_id
};

struct RawGpu {
  std::string id;           // the device id kdm uses (the UUID)
  std::string bus_id;       // PciInfo::bus_id, "00000000:1B:00.0"
  std::optional<int> numa;  // from sysfs
  // Links 0, 1, ... as asked; the scan of the collector stops after the first
  // answer that ends it, which is kept here.
  std::vector<RawLink> links;
};

struct RawAncestor {
  Return ret = kSuccess;
  int level = kTopologySystem;
};

struct RawTopology {
  std::vector<RawGpu> gpus;
  // ancestors[i][j] for i != j: nvmlDeviceGetTopologyCommonAncestor(i, j).
  // The diagonal is not read.
  std::vector<std::vector<RawAncestor>> ancestors;
};

struct NvmlTopology {
  topology::Topology topology;
  // One line per link that was ignored: "GPU <id> link <n>: remote bus id
  // <bus id> matches no GPU".
  std::vector<std::string> ignored;
};

// FAILED_PRECONDITION "NVML reports no GPUs" for a node without GPUs;
// INVALID_ARGUMENT naming the GPU and link, or the pair, on a failed answer
// (other than those the rules accept) or a level outside the list; the
// errors of topology::Topology::Create otherwise (duplicate ids).
StatusOr<NvmlTopology> TopologyFromNvml(const RawTopology& raw);

// The PCIe relation for a common-ancestor level; nullopt for any other value.
std::optional<topology::PcieLink> PcieFromAncestorLevel(int level);

// A bus id in NVML's or sysfs's spelling ("00000000:1B:00.0", "0000:1b:00.0",
// "1b:00.0") as "dddd:bb:dd.f" lower-case hex, sysfs's device name; nullopt
// when it is not one.
std::optional<std::string> CanonicalBusId(std::string_view bus_id);

}  // namespace kdm::nvml

#endif  // KDM_NVML_TOPOLOGY_FROM_NVML_H_
