// Every preset has a node description under test/nvml/nodes/ that describes
// the same machine in NVML's terms (links to GPUs or NVSwitches, common
// ancestors, sysfs NUMA nodes); the fake NVML answers from it, and the
// topology kdm derives must equal the preset's, every cell and NUMA node.
#include <gtest/gtest.h>

#include "fake_nvml/fake_sysfs.h"
#include "kdm/nvml/discovery.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"
#include "nvml_test_util.h"

namespace kdm::nvml {
namespace {

class PresetsNvmlTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetsNvmlTest, NvmlTopologyEqualsThePreset) {
  const std::string name = GetParam();
  auto preset = topology::Preset(name);
  ASSERT_TRUE(preset.ok()) << preset.status();
  test::TempDir dir;
  const std::string node_path = std::string(test::kNodesDir) + "/" + name + ".json";
  ASSERT_EQ(test::WriteFakeSysfs(node_path, dir.path()), "");
  test::UseNode(node_path);
  auto lib = Library::Load(test::kFakeLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  auto node = Discover(**lib, {.sysfs_root = dir.path()});
  ASSERT_TRUE(node.ok()) << node.status();
  auto t = DiscoverTopology(**lib, *node);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->ignored.empty());

  // The preset's ids are GPU0..; NVML's are the UUIDs, in index order.
  ASSERT_EQ(static_cast<int>(node->gpus.size()), preset->size());
  std::vector<topology::DeviceInfo> devices = preset->devices();
  std::vector<std::vector<topology::Link>> links;
  for (int i = 0; i < preset->size(); ++i) {
    devices[i].id = node->gpus[i].uuid;
    links.emplace_back();
    for (int j = 0; j < preset->size(); ++j) links.back().push_back(preset->LinkBetween(i, j));
  }
  auto want = topology::Topology::Create(devices, links);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_TRUE(t->topology == *want) << "NVML:\n"
                                    << topology::RenderTopologyJson(t->topology) << "preset:\n"
                                    << topology::RenderTopologyJson(*want);
  for (int i = 0; i < preset->size(); ++i) {
    EXPECT_EQ(t->topology.Device(i).numa, preset->Device(i).numa) << i;
    EXPECT_TRUE(t->topology.Device(i).numa.has_value()) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryPreset, PresetsNvmlTest, ::testing::ValuesIn(topology::PresetNames()),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

}  // namespace
}  // namespace kdm::nvml
