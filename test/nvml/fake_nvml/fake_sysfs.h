// Test helper: the sysfs half of a fake node. NVML does not know NUMA nodes or
// CPU affinities; kdm reads them from sysfs. This writes, for every GPU of a
// fake NVML node description (docs/nvml.md, "The fake NVML"),
// <root>/bus/pci/devices/<dddd:bb:dd.0>/numa_node (its "numa", -1 when absent
// or null) and local_cpulist (its "cpus", when given), so that a test hands
// `root` to discovery (`--sysfs-root`) and the fake library the description.
#ifndef KDM_TEST_NVML_FAKE_NVML_FAKE_SYSFS_H_
#define KDM_TEST_NVML_FAKE_NVML_FAKE_SYSFS_H_

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kdm/nvml/topology_from_nvml.h"

namespace kdm::nvml::test {

// "" on success, else what went wrong.
inline std::string WriteFakeSysfs(const std::string& node_path, const std::string& root) {
  std::ifstream in(node_path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.contains("gpus") || !doc["gpus"].is_array()) {
    return node_path + ": not a node description";
  }
  for (const auto& gpu : doc["gpus"]) {
    if (!gpu.is_object() || !gpu.contains("pci_bus_id") || !gpu["pci_bus_id"].is_string()) {
      return node_path + ": a GPU without pci_bus_id";
    }
    auto bus = CanonicalBusId(gpu["pci_bus_id"].get<std::string>());
    if (!bus) return node_path + ": bad pci_bus_id";
    std::string dir = root + "/bus/pci/devices/" + bus->substr(0, bus->size() - 1) + "0";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return dir + ": " + ec.message();
    int numa =
        gpu.contains("numa") && gpu["numa"].is_number_integer() ? gpu["numa"].get<int>() : -1;
    std::ofstream(dir + "/numa_node") << numa << "\n";
    if (gpu.contains("cpus") && gpu["cpus"].is_string()) {
      std::ofstream(dir + "/local_cpulist") << gpu["cpus"].get<std::string>() << "\n";
    }
  }
  return "";
}

}  // namespace kdm::nvml::test

#endif  // KDM_TEST_NVML_FAKE_NVML_FAKE_SYSFS_H_
