// The publish library's topology sources: presets and their errors, and ids
// files renaming a topology's rows.
#include "kdm/publish/topology_sources.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace kdm::publish {
namespace {

using ::testing::HasSubstr;

TEST(TopologySourcesTest, ParsesTheThreeKinds) {
  EXPECT_EQ(ParseTopologySource("nvml").kind, TopologySource::Kind::kNvml);
  TopologySource p = ParseTopologySource("preset:dgx-a100");
  EXPECT_EQ(p.kind, TopologySource::Kind::kPreset);
  EXPECT_EQ(p.name, "dgx-a100");
  TopologySource f = ParseTopologySource("/etc/topo.txt");
  EXPECT_EQ(f.kind, TopologySource::Kind::kFile);
  EXPECT_EQ(f.name, "/etc/topo.txt");
}

TEST(TopologySourcesTest, UnknownPresetIsTheUsersToFix) {
  bool usage = false;
  auto t = LoadTopology({TopologySource::Kind::kPreset, "no-such"}, {}, &usage);
  EXPECT_FALSE(t.ok());
  EXPECT_TRUE(usage);
  auto missing = LoadTopology({TopologySource::Kind::kFile, "/nonexistent/topo"}, {}, &usage);
  EXPECT_FALSE(missing.ok());
  EXPECT_FALSE(usage);
}

TEST(TopologySourcesTest, IdsFileRenamesRowsAndNamesTheFileOnError) {
  bool usage = false;
  auto t = LoadTopology({TopologySource::Kind::kPreset, "dgx1-v100"}, {}, &usage);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_FALSE(t->nvml_attributes.has_value());
  char tmpl[] = "/tmp/kdm-ids-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::string csv;
  for (int i = 0; i < t->topology.size(); ++i) {
    csv += std::to_string(i) + ", GPU-" + std::to_string(100 + i) + "\n";
  }
  std::ofstream(dir + "/ids.csv") << csv;
  auto renamed = ApplyIdsFile(t->topology, dir + "/ids.csv");
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_EQ(renamed->devices()[3].id, "GPU-103");

  std::ofstream(dir + "/short.csv") << "0, GPU-1\n";
  auto short_file = ApplyIdsFile(t->topology, dir + "/short.csv");
  ASSERT_FALSE(short_file.ok());
  EXPECT_THAT(short_file.status().message(), HasSubstr(dir + "/short.csv: 1 rows"));
  EXPECT_FALSE(ApplyIdsFile(t->topology, dir + "/none.csv").ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kdm::publish
