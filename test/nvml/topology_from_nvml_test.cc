// The NVML -> topology translation on hand-made raw answers.
#include "kdm/nvml/topology_from_nvml.h"

#include <gtest/gtest.h>

namespace kdm::nvml {
namespace {

using topology::PcieLink;

std::string Bus(int i) {
  char b[32];
  std::snprintf(b, sizeof b, "00000000:%02X:00.0", 0x10 + i);
  return b;
}

RawLink ToGpu(int i) {
  RawLink l;
  l.enabled = true;
  l.remote_type = kNvLinkDeviceTypeGpu;
  l.remote_bus_id = Bus(i);
  return l;
}

RawLink ToSwitch() {
  RawLink l;
  l.enabled = true;
  l.remote_type = kNvLinkDeviceTypeSwitch;
  l.pci_ret = kErrorNotSupported;  // never asked for a switch
  return l;
}

RawLink End(Return ret) {
  RawLink l;
  l.state_ret = ret;
  return l;
}

RawTopology Node(int n, int level = kTopologySystem) {
  RawTopology raw;
  for (int i = 0; i < n; ++i) {
    raw.gpus.push_back({"GPU-" + std::to_string(i), Bus(i), i < n / 2 ? 0 : 1, {}});
  }
  raw.ancestors.assign(n, std::vector<RawAncestor>(n, RawAncestor{kSuccess, level}));
  return raw;
}

void Add(RawTopology& raw, int gpu, RawLink link, int times = 1) {
  for (int k = 0; k < times; ++k) raw.gpus[gpu].links.push_back(link);
}

TEST(TopologyFromNvmlTest, DirectLinksCountedPerRemoteGpu) {
  RawTopology raw = Node(3);
  Add(raw, 0, ToGpu(1), 2);
  Add(raw, 0, ToGpu(2), 1);
  Add(raw, 0, End(kErrorInvalidArgument));
  Add(raw, 1, ToGpu(0), 2);
  Add(raw, 1, End(kErrorInvalidArgument));
  Add(raw, 2, ToGpu(0), 1);
  Add(raw, 2, End(kErrorInvalidArgument));
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1).nvlinks, 2);
  EXPECT_EQ(t->topology.LinkBetween(1, 0).nvlinks, 2);
  EXPECT_EQ(t->topology.LinkBetween(0, 2).nvlinks, 1);
  EXPECT_EQ(t->topology.LinkBetween(1, 2).nvlinks, 0);
  EXPECT_EQ(t->topology.LinkBetween(1, 2).pcie, PcieLink::kSys);
  EXPECT_EQ(t->topology.Device(2).id, "GPU-2");
  EXPECT_EQ(t->topology.Device(2).numa, 1);
  EXPECT_TRUE(t->ignored.empty());
}

TEST(TopologyFromNvmlTest, OneSidedLinkIsNotInvented) {
  RawTopology raw = Node(2);
  Add(raw, 0, ToGpu(1), 3);
  Add(raw, 1, ToGpu(0), 1);
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1).nvlinks, 1);
}

TEST(TopologyFromNvmlTest, BehindSwitchesTheSmallerSwitchLinkCount) {
  RawTopology raw = Node(3);
  Add(raw, 0, ToSwitch(), 12);
  Add(raw, 1, ToSwitch(), 18);
  Add(raw, 2, ToSwitch(), 18);
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1).nvlinks, 12);
  EXPECT_EQ(t->topology.LinkBetween(1, 2).nvlinks, 18);
  EXPECT_EQ(t->topology.LinkBetween(2, 0).nvlinks, 12);
}

TEST(TopologyFromNvmlTest, SwitchAndDirectLinksAdd) {
  RawTopology raw = Node(3);
  Add(raw, 0, ToSwitch(), 6);
  Add(raw, 0, ToGpu(1), 2);
  Add(raw, 1, ToGpu(0), 2);
  Add(raw, 1, ToSwitch(), 6);
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1).nvlinks, 8);
  // GPU 2 reaches no switch: nothing through them.
  EXPECT_EQ(t->topology.LinkBetween(0, 2).nvlinks, 0);
}

TEST(TopologyFromNvmlTest, NoNvlinkAndPastTheLastLinkAreNotErrors) {
  RawTopology raw = Node(2, kTopologySingle);
  Add(raw, 0, End(kErrorNotSupported));
  Add(raw, 1, End(kErrorInvalidArgument));
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1), (topology::Link{0, PcieLink::kPix}));
}

TEST(TopologyFromNvmlTest, OtherLinkStateFailureIsAnError) {
  RawTopology raw = Node(2);
  Add(raw, 0, ToGpu(1));
  Add(raw, 0, End(kErrorGpuIsLost));
  auto t = TopologyFromNvml(raw);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "GPU \"GPU-0\" link 1: nvmlDeviceGetNvLinkState answered 15");
}

TEST(TopologyFromNvmlTest, RemoteTypeAndPciFailuresAreErrors) {
  RawTopology raw = Node(2);
  RawLink bad_type = ToGpu(1);
  bad_type.type_ret = kErrorUnknown;
  Add(raw, 0, bad_type);
  auto t = TopologyFromNvml(raw);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("nvmlDeviceGetNvLinkRemoteDeviceType answered 999"),
            std::string::npos);
  raw = Node(2);
  RawLink bad_pci = ToGpu(1);
  bad_pci.pci_ret = kErrorNoPermission;
  Add(raw, 1, bad_pci);
  t = TopologyFromNvml(raw);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(),
            "GPU \"GPU-1\" link 0: nvmlDeviceGetNvLinkRemotePciInfo_v2 answered 4");
}

TEST(TopologyFromNvmlTest, DisabledLinksAndOtherFarEndsCountNothing) {
  RawTopology raw = Node(2);
  RawLink off = ToGpu(1);
  off.enabled = false;
  Add(raw, 0, off, 4);
  RawLink npu = ToGpu(1);
  npu.remote_type = kNvLinkDeviceTypeIbmNpu;
  Add(raw, 0, npu);
  RawLink unknown = ToGpu(1);
  unknown.remote_type = kNvLinkDeviceTypeUnknown;
  Add(raw, 0, unknown);
  Add(raw, 0, ToGpu(1));
  Add(raw, 1, ToGpu(0), 2);
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1).nvlinks, 1);
}

TEST(TopologyFromNvmlTest, RemoteBusIdMatchingNoGpuIsIgnoredAndNamed) {
  RawTopology raw = Node(2);
  RawLink hidden = ToGpu(1);
  hidden.remote_bus_id = "00000000:99:00.0";
  Add(raw, 0, hidden, 2);
  RawLink garbage = ToGpu(1);
  garbage.remote_bus_id = "not a bus id";
  Add(raw, 1, garbage);
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1).nvlinks, 0);
  ASSERT_EQ(t->ignored.size(), 3u);
  EXPECT_EQ(t->ignored[0],
            "GPU \"GPU-0\" link 0: remote bus id \"00000000:99:00.0\" matches no GPU");
  EXPECT_EQ(t->ignored[2], "GPU \"GPU-1\" link 0: remote bus id \"not a bus id\" matches no GPU");
}

TEST(TopologyFromNvmlTest, RemoteBusIdMatchesWhateverItsSpelling) {
  RawTopology raw = Node(2);
  RawLink a = ToGpu(1);
  a.remote_bus_id = "0000:11:00.0";  // sysfs spelling, lower case
  Add(raw, 0, a);
  RawLink b = ToGpu(0);
  b.remote_bus_id = "10:00.0";  // no domain
  Add(raw, 1, b);
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1).nvlinks, 1);
}

TEST(TopologyFromNvmlTest, PcieFromEveryAncestorLevel) {
  const std::pair<int, PcieLink> cases[] = {
      {kTopologyInternal, PcieLink::kPsb}, {kTopologySingle, PcieLink::kPix},
      {kTopologyMultiple, PcieLink::kPxb}, {kTopologyHostBridge, PcieLink::kPhb},
      {kTopologyNode, PcieLink::kNode},    {kTopologySystem, PcieLink::kSys}};
  for (auto [level, want] : cases) {
    auto t = TopologyFromNvml(Node(2, level));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->topology.LinkBetween(0, 1).pcie, want) << level;
    EXPECT_EQ(PcieFromAncestorLevel(level), want);
  }
  EXPECT_EQ(PcieFromAncestorLevel(35), std::nullopt);
}

TEST(TopologyFromNvmlTest, UnknownLevelAndFailedAncestorAreErrors) {
  auto t = TopologyFromNvml(Node(2, 60));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "GPUs \"GPU-0\" and \"GPU-1\": unknown common-ancestor level 60");
  RawTopology raw = Node(2);
  raw.ancestors[0][1].ret = kErrorNoPermission;
  t = TopologyFromNvml(raw);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(),
            "GPUs \"GPU-0\" and \"GPU-1\": nvmlDeviceGetTopologyCommonAncestor answered 4");
}

TEST(TopologyFromNvmlTest, NotSupportedAncestorIsNoKnownRelation) {
  RawTopology raw = Node(2);
  raw.ancestors[0][1].ret = kErrorNotSupported;
  raw.ancestors[1][0].ret = kErrorNotSupported;
  Add(raw, 0, ToGpu(1), 2);
  Add(raw, 1, ToGpu(0), 2);
  auto t = TopologyFromNvml(raw);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->topology.LinkBetween(0, 1), (topology::Link{2, PcieLink::kNone}));
}

TEST(TopologyFromNvmlTest, BadShapesAndIdsAreErrors) {
  RawTopology raw = Node(2);
  raw.ancestors.pop_back();
  EXPECT_EQ(TopologyFromNvml(raw).status().code(), StatusCode::kInvalidArgument);
  raw = Node(2);
  raw.ancestors[1].pop_back();
  EXPECT_EQ(TopologyFromNvml(raw).status().code(), StatusCode::kInvalidArgument);
  raw = Node(2);
  raw.gpus[1].bus_id = raw.gpus[0].bus_id;
  EXPECT_NE(TopologyFromNvml(raw).status().message().find("share PCI bus id 0000:10:00.0"),
            std::string::npos);
  raw = Node(2);
  raw.gpus[1].bus_id = "zz";
  EXPECT_NE(TopologyFromNvml(raw).status().message().find("\"zz\""), std::string::npos);
  raw = Node(2);
  raw.gpus[1].id = raw.gpus[0].id;
  EXPECT_EQ(TopologyFromNvml(raw).status().code(), StatusCode::kInvalidArgument);
}

TEST(TopologyFromNvmlTest, NoGpusIsAnError) {
  auto t = TopologyFromNvml(RawTopology{});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.status().message(), "NVML reports no GPUs");
}

TEST(TopologyFromNvmlTest, CanonicalBusId) {
  EXPECT_EQ(CanonicalBusId("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(CanonicalBusId("0000:1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(CanonicalBusId("1B:00.1"), "0000:1b:00.1");
  EXPECT_EQ(CanonicalBusId("00010000:1B:00.0"), std::nullopt);
  EXPECT_EQ(CanonicalBusId(""), std::nullopt);
  EXPECT_EQ(CanonicalBusId("1B:00"), std::nullopt);
  EXPECT_EQ(CanonicalBusId("1B:20.0"), std::nullopt);
  EXPECT_EQ(CanonicalBusId("1B:00.8"), std::nullopt);
  EXPECT_EQ(CanonicalBusId("x:1B:00.0"), std::nullopt);
  EXPECT_EQ(CanonicalBusId("123:00.0"), std::nullopt);
}

}  // namespace
}  // namespace kdm::nvml
