#include "kdm/topology/presets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixtures.h"

namespace kdm::topology {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PresetsTest, EveryPresetLoadsWithItsDocumentedSize) {
  EXPECT_THAT(PresetNames(), ElementsAre("dgx1-p100", "dgx1-v100", "dgx-a100", "hgx-h100",
                                         "pcie-8gpu", "rtx-4x-bridged", "dgx2-16"));
  for (const PresetInfo& info : PresetInfos()) {
    auto t = Preset(info.name);
    ASSERT_TRUE(t.ok()) << info.name << ": " << t.status();
    EXPECT_EQ(t->size(), info.devices) << info.name;
    EXPECT_FALSE(info.description.empty());
    EXPECT_FALSE(info.source.empty());
    for (int i = 0; i < t->size(); ++i) EXPECT_TRUE(t->Device(i).numa.has_value());
  }
}

TEST(PresetsTest, UnknownPresetNamesTheKnownOnes) {
  auto t = Preset("dgx-9000");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(), HasSubstr("unknown preset 'dgx-9000'"));
  EXPECT_THAT(t.status().message(), HasSubstr("dgx1-v100"));
}

// The DGX-1 presets are the public fixtures plus NUMA nodes.
TEST(PresetsTest, Dgx1MatchesTheFixtures) {
  for (auto [name, fixture] :
       {std::pair{"dgx1-p100", testing::Dgx1Pascal()}, std::pair{"dgx1-v100", testing::Dgx1Volta()},
        std::pair{"rtx-4x-bridged", testing::Rtx8000x4()}}) {
    Topology t = *Preset(name);
    ASSERT_EQ(t.size(), fixture.size());
    for (int i = 0; i < t.size(); ++i) {
      for (int j = 0; j < t.size(); ++j) {
        EXPECT_EQ(t.LinkBetween(i, j), fixture.LinkBetween(i, j)) << name << " " << i << "," << j;
      }
      EXPECT_EQ(t.Device(i).numa, i < t.size() / 2 ? 0 : 1);
    }
  }
}

TEST(PresetsTest, NvSwitchPresetsLinkEveryPair) {
  for (auto [name, nv] :
       {std::pair{"dgx-a100", 12}, std::pair{"hgx-h100", 18}, std::pair{"dgx2-16", 6}}) {
    Topology t = *Preset(name);
    for (int i = 0; i < t.size(); ++i) {
      for (int j = 0; j < t.size(); ++j) {
        if (i != j) {
          EXPECT_EQ(t.LinkBetween(i, j).nvlinks, nv) << name;
        }
      }
    }
  }
  Topology pcie = *Preset("pcie-8gpu");
  EXPECT_EQ(pcie.LinkBetween(0, 1), (Link{0, PcieLink::kPix}));
  EXPECT_EQ(pcie.LinkBetween(0, 2), (Link{0, PcieLink::kNode}));
  EXPECT_EQ(pcie.LinkBetween(3, 4), (Link{0, PcieLink::kSys}));
}

}  // namespace
}  // namespace kdm::topology
