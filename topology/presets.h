// Built-in machine topologies, so that `kdm topo`, the fake GPU plugin and
// tests can use real shapes without a GPU. Each preset has a one-line
// description and the public source its link matrix follows (docs/topology.md
// lists them).
//
// Thread-safety: free functions without shared state; safe from any thread.
//
// Example:
//   kdm::StatusOr<Topology> t = Preset("dgx1-v100");
//   for (const std::string& name : PresetNames()) std::cout << name << "\n";
#ifndef KDM_TOPOLOGY_PRESETS_H_
#define KDM_TOPOLOGY_PRESETS_H_

#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/topology/topology.h"

namespace kdm::topology {

struct PresetInfo {
  std::string name;         // e.g. "dgx1-v100"
  int devices = 0;          // number of GPUs
  std::string description;  // one line
  std::string source;       // where the link matrix comes from
};

// dgx1-p100, dgx1-v100, dgx-a100, hgx-h100, pcie-8gpu, rtx-4x-bridged,
// dgx2-16, in that order.
std::vector<std::string> PresetNames();
// Name, size, description and source of every preset, in PresetNames order.
std::vector<PresetInfo> PresetInfos();
// The named preset; NOT_FOUND naming the known presets otherwise.
StatusOr<Topology> Preset(std::string_view name);

}  // namespace kdm::topology

#endif  // KDM_TOPOLOGY_PRESETS_H_
