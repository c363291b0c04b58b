// Topology hints of the Ledger (docs/kubelet-rules.md#topology-hints; the
// kubelet's generateDeviceTopologyHints): every subset of the NUMA nodes holding
// devices of the resource that can satisfy the request, preferred when
// minimal; no topology → no preference; too many requested → no hint.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kdm/devicemanager/ledger.h"

namespace kdm::devicemanager {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr char kHintGpu[] = "vendor.com/gpu";
constexpr char kHintNic[] = "vendor.com/nic";

Container HintGpus(const std::string& name, int64_t n, bool restartable = false) {
  Container c;
  c.name = name;
  c.restartable = restartable;
  c.limits[kHintGpu] = Quantity::FromInt(n);
  return c;
}

Pod MakeHintPod(const std::string& uid, std::vector<Container> inits, std::vector<Container> apps) {
  Pod pod;
  pod.uid = uid;
  pod.name = uid;
  pod.namespace_name = "default";
  pod.init_containers = std::move(inits);
  pod.containers = std::move(apps);
  return pod;
}

// gpu0, gpu1 on node 0; gpu2, gpu3 on node 1.
std::vector<LedgerDevice> TwoNodes() {
  return {{"gpu0", true, {0}}, {"gpu1", true, {0}}, {"gpu2", true, {1}}, {"gpu3", true, {1}}};
}

class TopologyHintsTest : public ::testing::Test {
 protected:
  void SetDevices(const std::vector<LedgerDevice>& devices,
                  const std::string& resource = kHintGpu) {
    ASSERT_TRUE(ledger_.SetDevices(resource, devices).ok());
  }
  void AdmitIds(const Pod& pod, const std::string& container, const std::vector<std::string>& ids) {
    StatusOr<AllocationPlan> plan =
        ledger_.Plan(pod, container, kHintGpu, static_cast<int64_t>(ids.size()), std::nullopt);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(ledger_.Reserve(*plan, ids).ok());
    ASSERT_TRUE(ledger_.Commit(plan->key, "r").ok());
  }
  ResourceHints Hints(int64_t count, const std::string& container = "main") {
    return ledger_.TopologyHints(pod_, container, kHintGpu, count);
  }
  Ledger ledger_;
  Pod pod_ = MakeHintPod("p", {}, {HintGpus("main", 1)});
};

TEST_F(TopologyHintsTest, NoTopologyOnAnyDeviceMeansNoPreference) {
  SetDevices({{"gpu0", true, {}}, {"gpu1", true, {}}});
  EXPECT_EQ(Hints(1), std::nullopt);
}

TEST_F(TopologyHintsTest, UnknownResourceOrZeroCountMeansNoPreference) {
  EXPECT_EQ(Hints(1), std::nullopt);
  SetDevices(TwoNodes());
  EXPECT_EQ(Hints(0), std::nullopt);
}

TEST_F(TopologyHintsTest, SingleNodeHintsArePreferred) {
  SetDevices(TwoNodes());
  EXPECT_THAT(*Hints(1),
              ElementsAre(NumaHint{{0}, true}, NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
  EXPECT_THAT(*Hints(2),
              ElementsAre(NumaHint{{0}, true}, NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
}

TEST_F(TopologyHintsTest, RequestSpanningNodesPrefersTheSmallestSpan) {
  SetDevices(TwoNodes());
  EXPECT_THAT(*Hints(3), ElementsAre(NumaHint{{0, 1}, true}));
  EXPECT_THAT(*Hints(4), ElementsAre(NumaHint{{0, 1}, true}));
}

TEST_F(TopologyHintsTest, NodesAreThoseHoldingDevices) {
  SetDevices({{"gpu0", true, {3}}, {"gpu1", true, {7}}});
  EXPECT_THAT(*Hints(1),
              ElementsAre(NumaHint{{3}, true}, NumaHint{{7}, true}, NumaHint{{3, 7}, false}));
}

TEST_F(TopologyHintsTest, MoreRequestedThanExistSatisfiesNoHint) {
  SetDevices(TwoNodes());
  ResourceHints h = Hints(5);
  ASSERT_TRUE(h.has_value());
  EXPECT_THAT(*h, IsEmpty());
}

TEST_F(TopologyHintsTest, AllocatedAndReservedDevicesAreNotAvailable) {
  SetDevices(TwoNodes());
  AdmitIds(MakeHintPod("other", {}, {HintGpus("main", 1)}), "main", {"gpu0"});
  Pod reserving = MakeHintPod("r", {}, {HintGpus("main", 1)});
  StatusOr<AllocationPlan> plan = ledger_.Plan(reserving, "main", kHintGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(ledger_.Reserve(*plan, {"gpu1"}).ok());
  // Node 0 has no free device left, but still counts for the minimum size.
  EXPECT_THAT(*Hints(2), ElementsAre(NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
  EXPECT_THAT(*Hints(3), IsEmpty());
}

TEST_F(TopologyHintsTest, UnhealthyDevicesCountForTheMinimumOnly) {
  SetDevices(
      {{"gpu0", false, {0}}, {"gpu1", false, {0}}, {"gpu2", true, {1}}, {"gpu3", true, {1}}});
  EXPECT_THAT(*Hints(2), ElementsAre(NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
}

TEST_F(TopologyHintsTest, DeviceOnTwoNodesCountsForBoth) {
  SetDevices({{"gpu0", true, {0, 1}}, {"gpu1", true, {1}}});
  EXPECT_THAT(*Hints(2), ElementsAre(NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
}

TEST_F(TopologyHintsTest, DevicesWithoutTopologyDoNotCount) {
  SetDevices({{"gpu0", true, {0}}, {"gpu1", true, {}}});
  EXPECT_THAT(*Hints(1), ElementsAre(NumaHint{{0}, true}));
  EXPECT_THAT(*Hints(2), IsEmpty());
}

TEST_F(TopologyHintsTest, RecordedContainerRegeneratesFromItsDevices) {
  SetDevices(TwoNodes());
  AdmitIds(pod_, "main", {"gpu2"});
  EXPECT_THAT(*Hints(1), ElementsAre(NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
  // Recorded with another count: nothing fits.
  EXPECT_THAT(*Hints(2), IsEmpty());
}

TEST_F(TopologyHintsTest, HandOverDevicesMustLieInsideTheHint) {
  SetDevices(TwoNodes());
  Pod pod = MakeHintPod("p", {HintGpus("init", 1)}, {HintGpus("app", 1)});
  AdmitIds(pod, "init", {"gpu2"});
  ResourceHints h = ledger_.TopologyHints(pod, "app", kHintGpu, 1);
  ASSERT_TRUE(h.has_value());
  EXPECT_THAT(*h, ElementsAre(NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
  // A sidecar's devices are not handed over: they neither constrain the
  // hint nor count as available (node 1 has nothing left for this pod).
  Pod with_sidecar = MakeHintPod("s", {HintGpus("side", 1, true)}, {HintGpus("app", 1)});
  AdmitIds(with_sidecar, "side", {"gpu3"});
  EXPECT_THAT(*ledger_.TopologyHints(with_sidecar, "app", kHintGpu, 1),
              ElementsAre(NumaHint{{0}, true}, NumaHint{{0, 1}, false}));
}

TEST_F(TopologyHintsTest, TooManyNumaNodesMeansNoPreference) {
  std::vector<LedgerDevice> devices;
  for (int i = 0; i < 17; ++i) devices.push_back({"gpu" + std::to_string(i), true, {i}});
  SetDevices(devices);
  EXPECT_EQ(Hints(1), std::nullopt);
  devices.pop_back();
  SetDevices(devices);
  ResourceHints h = Hints(16);
  ASSERT_TRUE(h.has_value());
  EXPECT_THAT(*h,
              ElementsAre(NumaHint{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, true}));
}

TEST_F(TopologyHintsTest, ContainerHintsPerResource) {
  SetDevices(TwoNodes());
  SetDevices({{"nic0", true, {}}}, kHintNic);
  Container c = HintGpus("main", 1);
  c.limits[kHintNic] = Quantity::FromInt(1);
  c.limits["cpu"] = *Quantity::Parse("2");
  Pod pod = MakeHintPod("p", {}, {c});
  StatusOr<std::map<std::string, ResourceHints>> hints =
      ledger_.ContainerTopologyHints(pod, "main");
  ASSERT_TRUE(hints.ok()) << hints.status();
  ASSERT_EQ(hints->size(), 2u);
  EXPECT_THAT(*hints->at(kHintGpu),
              ElementsAre(NumaHint{{0}, true}, NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
  EXPECT_EQ(hints->at(kHintNic), std::nullopt);
  // Bad limits are reported, not guessed around.
  pod.containers[0].limits[kHintGpu] = *Quantity::Parse("1500m");
  EXPECT_EQ(ledger_.ContainerTopologyHints(pod, "main").status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(TopologyHintsTest, PodHintsUseThePodsEffectiveRequest) {
  SetDevices(TwoNodes());
  Pod pod = MakeHintPod("p", {HintGpus("init", 1)}, {HintGpus("a", 1), HintGpus("b", 1)});
  StatusOr<std::map<std::string, ResourceHints>> hints = ledger_.PodTopologyHints(pod);
  ASSERT_TRUE(hints.ok());
  EXPECT_THAT(*hints->at(kHintGpu),
              ElementsAre(NumaHint{{0}, true}, NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
  // Once the pod holds its devices, hints come from them.
  AdmitIds(pod, "a", {"gpu2"});
  AdmitIds(pod, "b", {"gpu3"});
  hints = ledger_.PodTopologyHints(pod);
  ASSERT_TRUE(hints.ok());
  EXPECT_THAT(*hints->at(kHintGpu), ElementsAre(NumaHint{{1}, true}, NumaHint{{0, 1}, false}));
  // Holding a different number than the pod asks for: nothing fits.
  pod.containers.push_back(HintGpus("c", 1));
  hints = ledger_.PodTopologyHints(pod);
  ASSERT_TRUE(hints.ok());
  EXPECT_THAT(*hints->at(kHintGpu), IsEmpty());
}

TEST_F(TopologyHintsTest, PodHintsWithoutTopologyOrEnoughDevices) {
  SetDevices({{"nic0", true, {}}}, kHintNic);
  SetDevices(TwoNodes());
  Container c = HintGpus("main", 5);
  c.limits[kHintNic] = Quantity::FromInt(1);
  Pod pod = MakeHintPod("p", {}, {c});
  StatusOr<std::map<std::string, ResourceHints>> hints = ledger_.PodTopologyHints(pod);
  ASSERT_TRUE(hints.ok());
  EXPECT_EQ(hints->at(kHintNic), std::nullopt);
  EXPECT_THAT(*hints->at(kHintGpu), IsEmpty());
}

}  // namespace
}  // namespace kdm::devicemanager
