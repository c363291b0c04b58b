#include "kdm/topology/topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kdm::topology {
namespace {

using ::testing::HasSubstr;

std::vector<DeviceInfo> Devices(int n) {
  std::vector<DeviceInfo> d;
  for (int i = 0; i < n; ++i) d.push_back({"GPU" + std::to_string(i), i, i % 2});
  return d;
}

std::vector<std::vector<Link>> NoLinks(int n) {
  return std::vector<std::vector<Link>>(n, std::vector<Link>(n));
}

TEST(LinkTest, ScoresFollowTheStandardScale) {
  EXPECT_EQ(PcieScore(PcieLink::kNone), 0);
  EXPECT_EQ(PcieScore(PcieLink::kSys), 10);
  EXPECT_EQ(PcieScore(PcieLink::kNode), 20);
  EXPECT_EQ(PcieScore(PcieLink::kPhb), 30);
  EXPECT_EQ(PcieScore(PcieLink::kPxb), 40);
  EXPECT_EQ(PcieScore(PcieLink::kPix), 50);
  EXPECT_EQ(PcieScore(PcieLink::kPsb), 60);
  EXPECT_EQ(LinkScore({2, PcieLink::kPhb}), 230);
  EXPECT_EQ(LinkScore({18, PcieLink::kNone}), 1800);
}

TEST(LinkTest, NamesRoundTripAndSocIsSys) {
  for (PcieLink p : {PcieLink::kSys, PcieLink::kNode, PcieLink::kPhb, PcieLink::kPxb,
                     PcieLink::kPix, PcieLink::kPsb}) {
    EXPECT_EQ(ParsePcieLink(PcieLinkName(p)), p);
  }
  EXPECT_EQ(ParsePcieLink("SOC"), PcieLink::kSys);
  EXPECT_EQ(ParsePcieLink("sys"), std::nullopt);
  EXPECT_EQ(ParsePcieLink("NV1"), std::nullopt);
}

TEST(TopologyTest, ScoresAndLookups) {
  auto links = NoLinks(3);
  links[0][1] = links[1][0] = {2, PcieLink::kPix};
  links[1][2] = links[2][1] = {0, PcieLink::kSys};
  auto t = Topology::Create(Devices(3), links);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 3);
  EXPECT_EQ(t->PairScore(0, 1), 250);
  EXPECT_EQ(t->PairScore(1, 0), 250);
  EXPECT_EQ(t->PairScore(0, 2), 0);  // a missing link scores 0
  EXPECT_EQ(t->PairScore(1, 1), 0);
  EXPECT_EQ(t->SetScore({0, 1, 2}), 260);
  EXPECT_EQ(t->SetScore({2}), 0);
  EXPECT_EQ(t->IndexOf("GPU2"), 2);
  EXPECT_EQ(t->IndexOf("GPU9"), std::nullopt);
  EXPECT_EQ(t->Device(1).numa, 1);
  EXPECT_EQ(t->LinkBetween(1, 0), (Link{2, PcieLink::kPix}));
}

TEST(TopologyTest, CreateRejectsBadInputNamingIt) {
  auto expect_error = [](std::vector<DeviceInfo> d, std::vector<std::vector<Link>> l,
                         const std::string& says) {
    auto t = Topology::Create(std::move(d), std::move(l));
    ASSERT_FALSE(t.ok()) << says;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(says));
  };
  expect_error({}, {}, "no devices");
  auto dup = Devices(3);
  dup[2].id = "GPU0";
  expect_error(dup, NoLinks(3), "duplicate device id 'GPU0' at positions 0 and 2");
  auto empty_id = Devices(2);
  empty_id[1].id = "";
  expect_error(empty_id, NoLinks(2), "position 1 has an empty id");
  auto bad_index = Devices(2);
  bad_index[1].index = 5;
  expect_error(bad_index, NoLinks(2), "'GPU1' at position 1 has index 5");
  expect_error(Devices(3), NoLinks(2), "2 rows for 3 devices");
  auto short_row = NoLinks(3);
  short_row[1].pop_back();
  expect_error(Devices(3), short_row, "row 1 ('GPU1') has 2 columns, expected 3");
  auto asym = NoLinks(3);
  asym[0][2] = {1, PcieLink::kNone};
  expect_error(Devices(3), asym, "link (0, 2) ('GPU0', 'GPU2') is NV1 but link (2, 0)");
  auto diag = NoLinks(2);
  diag[1][1] = {0, PcieLink::kPix};
  expect_error(Devices(2), diag, "link (1, 1) ('GPU1', 'GPU1') is on the diagonal");
  auto many = NoLinks(2);
  many[0][1] = many[1][0] = {65, PcieLink::kNone};
  expect_error(Devices(2), many, "65 NVLinks, outside [0, 64]");
  auto negative = NoLinks(2);
  negative[0][1] = negative[1][0] = {-1, PcieLink::kNone};
  expect_error(Devices(2), negative, "-1 NVLinks");
  std::vector<DeviceInfo> huge;
  for (int i = 0; i <= kMaxDevices; ++i) huge.push_back({std::to_string(i), i, {}});
  expect_error(huge, {}, "above the limit of 1024");
}

}  // namespace
}  // namespace kdm::topology
