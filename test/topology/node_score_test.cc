#include "kdm/topology/node_score.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kdm/topology/presets.h"

namespace kdm::topology {
namespace {

using ::testing::DoubleEq;
using ::testing::HasSubstr;

std::vector<int> ScoreRange(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(NodeScoreTest, NormalisesTheBestSetScore) {
  Topology v100 = *Preset("dgx1-v100");
  // Best pair on a DGX-1 V100: NV2 + PIX = 250.
  EXPECT_THAT(*NodeScore(v100, ScoreRange(8), 2), DoubleEq(250.0 * 100 / 1800));
  // Best four: {0,1,2,3} = 1+1+2 + 2+1+2 NVLinks and PIX, PHB x4, PIX.
  EXPECT_THAT(*NodeScore(v100, ScoreRange(8), 4),
              DoubleEq(static_cast<double>(v100.SetScore({0, 1, 2, 3})) * 100 / (6 * 1800)));
  // An H100 NV18 pair (PCIe beneath) is at the cap.
  EXPECT_THAT(*NodeScore(*Preset("hgx-h100"), ScoreRange(8), 8), DoubleEq(100.0));
  // A PCIe-only node scores low, and a node that lost its NVLink pairs lower.
  double pcie = *NodeScore(*Preset("pcie-8gpu"), ScoreRange(8), 2);
  EXPECT_THAT(pcie, DoubleEq(50.0 * 100 / 1800));
  EXPECT_LT(*NodeScore(v100, {0, 5}, 2), *NodeScore(v100, {0, 3}, 2));
  EXPECT_THAT(*NodeScore(v100, {6}, 1), DoubleEq(100.0));
}

TEST(NodeScoreTest, BadInput) {
  Topology t = *Preset("dgx1-v100");
  auto zero = NodeScore(t, ScoreRange(8), 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.status().message(), HasSubstr("size must be at least 1"));
  auto big = NodeScore(t, {0, 1}, 3);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  auto outside = NodeScore(t, {0, 8}, 1);
  ASSERT_FALSE(outside.ok());
  EXPECT_THAT(outside.status().message(), HasSubstr("index 8"));
}

}  // namespace
}  // namespace kdm::topology
