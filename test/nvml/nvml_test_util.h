// Shared by the nvml tests: a private temporary directory, and the fake NVML
// loaded on a node description.
#ifndef KDM_TEST_NVML_NVML_TEST_UTIL_H_
#define KDM_TEST_NVML_NVML_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "kdm/nvml/library.h"

namespace kdm::nvml::test {

inline constexpr const char* kFakeLibrary = KDM_FAKE_NVML_LIBRARY;
inline constexpr const char* kNodesDir = KDM_FAKE_NVML_NODES;

// A fresh directory under /tmp, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kdm-nvml-XXXXXX";
    char* made = mkdtemp(tmpl);
    EXPECT_NE(made, nullptr);
    path_ = made != nullptr ? made : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::string path_;
};

// Points the fake at `node_path` (and at `events_path`, when given) for the
// rest of the test process.
inline void UseNode(const std::string& node_path, const std::string& events_path = "") {
  setenv("KDM_FAKE_NVML_NODE", node_path.c_str(), 1);
  if (events_path.empty()) {
    unsetenv("KDM_FAKE_NVML_EVENTS");
  } else {
    setenv("KDM_FAKE_NVML_EVENTS", events_path.c_str(), 1);
  }
}

// A two-GPU node with one double NVLink between them.
inline std::string TwoGpuNode(const std::string& extra_top = "",
                              const std::string& extra_gpu0 = "") {
  return R"({"driver_version": "550.54.15", "cuda_driver_version": 12040,)" + extra_top +
         R"( "gpus": [
    {"uuid": "GPU-aaaa", "name": "NVIDIA H100 80GB HBM3", "minor": 3, "memory_mib": 81559,
     "pci_bus_id": "00000000:1B:00.0", "numa": 1, "cpus": "8-15", "compute_capability": "9.0",
     "brand": "nvidia", "nvlinks": [{"gpu": 1, "count": 2}])" +
         extra_gpu0 + R"(},
    {"uuid": "GPU-bbbb", "name": "NVIDIA H100 80GB HBM3", "minor": 0, "memory_mib": 81559,
     "pci_bus_id": "00000000:2C:00.0", "compute_capability": "9.0",
     "nvlinks": [{"gpu": "GPU-aaaa", "count": 2}]}],
  "pcie": [["X", "PXB"], ["PXB", "X"]]})";
}

}  // namespace kdm::nvml::test

#endif  // KDM_TEST_NVML_NVML_TEST_UTIL_H_
