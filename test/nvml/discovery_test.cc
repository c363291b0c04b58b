// Discovery through the fake NVML: identities, attributes, NUMA from sysfs.
#include "kdm/nvml/discovery.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fake_nvml/fake_sysfs.h"
#include "nvml_test_util.h"

namespace kdm::nvml {
namespace {

using test::kFakeLibrary;
using test::TempDir;
using test::TwoGpuNode;
using test::UseNode;

class DiscoveryTest : public ::testing::Test {
 protected:
  // Loads the fake on `node` with sysfs written from it.
  std::unique_ptr<Library> Load(const std::string& node) {
    std::string path = dir_.Write("node.json", node);
    EXPECT_EQ(test::WriteFakeSysfs(path, dir_.path() + "/sys"), "");
    UseNode(path);
    auto lib = Library::Load(kFakeLibrary);
    EXPECT_TRUE(lib.ok()) << lib.status();
    return lib.ok() ? std::move(*lib) : nullptr;
  }
  DiscoveryOptions Options() const { return {.sysfs_root = dir_.path() + "/sys"}; }

  TempDir dir_;
};

TEST_F(DiscoveryTest, EveryGpuWithItsAttributes) {
  auto lib = Load(TwoGpuNode());
  ASSERT_NE(lib, nullptr);
  auto node = Discover(*lib, Options());
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->driver_version, "550.54.15");
  EXPECT_EQ(node->cuda_driver_version_raw, 12040);
  EXPECT_EQ(node->cuda_driver_version, "12.4");
  ASSERT_EQ(node->gpus.size(), 2u);
  const GpuInfo& g0 = node->gpus[0];
  EXPECT_EQ(g0.index, 0);
  EXPECT_NE(g0.handle, nullptr);
  EXPECT_EQ(g0.uuid, "GPU-aaaa");
  EXPECT_EQ(g0.minor, 3u);  // minors need not equal indices
  EXPECT_EQ(g0.pci_bus_id, "00000000:1B:00.0");
  EXPECT_EQ(g0.sysfs_bus_id, "0000:1b:00.0");
  EXPECT_EQ(g0.numa, 1);
  EXPECT_EQ(g0.cpu_affinity, "8-15");
  EXPECT_EQ(g0.attributes, (k8s::DeviceAttributes{.model = "NVIDIA H100 80GB HBM3",
                                                  .memory_mib = 81559,
                                                  .driver = "550.54.15",
                                                  .cuda = "12.4",
                                                  .arch = "9.0",
                                                  .brand = "nvidia"}));
  EXPECT_TRUE(g0.attribute_warnings.empty());
  const GpuInfo& g1 = node->gpus[1];
  EXPECT_EQ(g1.uuid, "GPU-bbbb");
  EXPECT_EQ(g1.minor, 0u);
  EXPECT_EQ(g1.numa, std::nullopt);  // numa_node -1
  EXPECT_EQ(g1.cpu_affinity, "");
  auto t = DiscoverTopology(*lib, *node);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1), (topology::Link{2, topology::PcieLink::kPxb}));
  EXPECT_EQ(t->topology.Device(0).id, "GPU-aaaa");
}

TEST_F(DiscoveryTest, CudaFallbackReachesTheAttributes) {
  auto lib = Load(TwoGpuNode(R"( "fail": {"cuda_v2": 12},)"));
  ASSERT_NE(lib, nullptr);
  auto node = Discover(*lib, Options());
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->gpus[1].attributes.cuda, "12.4");
}

TEST_F(DiscoveryTest, FailureNamesTheCallAndTheGpu) {
  auto lib = Load(TwoGpuNode("", R"(, "fail": {"memory": 4})"));
  ASSERT_NE(lib, nullptr);
  auto node = Discover(*lib, Options());
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(node.status().message(),
            "nvmlDeviceGetMemoryInfo(GPU 0 \"GPU-aaaa\"): Insufficient Permissions (NVML error 4)");
}

TEST_F(DiscoveryTest, UuidFailureNamesTheIndex) {
  auto lib = Load(TwoGpuNode("", R"(, "fail": {"uuid": 999})"));
  ASSERT_NE(lib, nullptr);
  auto node = Discover(*lib, Options());
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().message(), "nvmlDeviceGetUUID(GPU 0): Unknown Error (NVML error 999)");
}

TEST_F(DiscoveryTest, BrandFailureIsUnknownNotAnError) {
  auto lib = Load(TwoGpuNode("", R"(, "fail": {"brand": 3})"));
  ASSERT_NE(lib, nullptr);
  auto node = Discover(*lib, Options());
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->gpus[0].attributes.brand, "unknown");
  EXPECT_EQ(node->gpus[1].attributes.brand, "nvidia");
}

TEST_F(DiscoveryTest, MissingSysfsMeansUnknownNuma) {
  auto lib = Load(TwoGpuNode());
  ASSERT_NE(lib, nullptr);
  auto node = Discover(*lib, {.sysfs_root = dir_.path() + "/nowhere"});
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->gpus[0].numa, std::nullopt);
  EXPECT_EQ(node->gpus[0].cpu_affinity, "");
}

TEST(ReadNumaNodeTest, GarbageNegativeAndMissingAreUnknown) {
  TempDir dir;
  std::string dev = dir.path() + "/bus/pci/devices/0000:1b:00.0";
  std::filesystem::create_directories(dev);
  const std::pair<std::string, std::optional<int>> cases[] = {{"0\n", 0},
                                                              {"3", 3},
                                                              {"-1\n", std::nullopt},
                                                              {"", std::nullopt},
                                                              {"x\n", std::nullopt},
                                                              {"1x\n", std::nullopt},
                                                              {"99999999999999\n", std::nullopt}};
  for (const auto& [text, want] : cases) {
    std::ofstream(dev + "/numa_node") << text;
    EXPECT_EQ(ReadNumaNode(dir.path(), "0000:1b:00.0"), want) << text;
  }
  EXPECT_EQ(ReadNumaNode(dir.path(), "0000:1c:00.0"), std::nullopt);
}

TEST(BrandTest, NamesRoundTrip) {
  EXPECT_EQ(BrandName(2), "tesla");
  EXPECT_EQ(BrandName(14), "nvidia");
  EXPECT_EQ(BrandName(16), "titanrtx");
  EXPECT_EQ(BrandName(17), "unknown");
  EXPECT_EQ(BrandName(-1), "unknown");
  for (int b = 0; b <= 16; ++b) EXPECT_EQ(BrandFromName(BrandName(b)), b);
  EXPECT_EQ(BrandFromName("Tesla"), std::nullopt);
}

}  // namespace
}  // namespace kdm::nvml
