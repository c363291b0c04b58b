// Assumptions: which devices a node's assumed pods take (the plugin's
// policy, the order of the binds), when an assumption ends (reflected,
// deleted, expired, node deleted, relisted away), the memo of node views,
// and the wait for binds in flight.
#include "kdm/scheduler/assumptions.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "kdm/base/clock.h"
#include "kdm/scheduler/extender.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/presets.h"
#include "scheduler_test_util.h"

namespace kdm::scheduler {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

constexpr char kGpu[] = "nvidia.com/gpu";

// A node's view as the extender reads it: `free` of the preset's devices
// free, `policy` published for the resource, `pods` fingerprints listed.
k8s::NodeDevices NodeView(const std::string& preset, const std::vector<int>& free,
                          std::optional<topology::Policy> policy = std::nullopt,
                          std::optional<std::vector<uint64_t>> pods = std::vector<uint64_t>{},
                          k8s::TopologyCache* topologies = nullptr) {
  static k8s::TopologyCache shared;
  const topology::Topology t = *topology::Preset(preset);
  k8s::ResourceInput in;
  for (const auto& d : t.devices()) in.allocatable[d.id] = d.numa;
  for (const auto& d : t.devices()) in.in_use.insert(d.id);
  for (int i : free) in.in_use.erase(t.Device(i).id);
  in.topology = &t;
  k8s::DevicesAnnotation a{.node = "n", .updated = "2026-11-27T23:00:00Z"};
  a.resources[kGpu] = k8s::BuildResourceDevices(in);
  a.resources[kGpu].policy = policy;
  a.pods = pods;
  StatusOr<k8s::NodeDevices> d =
      k8s::DecodeNodeDevices(k8s::EncodeDevicesAnnotation(a), topologies ? topologies : &shared);
  EXPECT_TRUE(d.ok()) << d.status().message();
  return *d;
}

BoundPod Pod(const std::string& uid, const std::string& node, int64_t gpus,
             const std::string& ns = "ml") {
  return BoundPod{.uid = uid,
                  .namespace_name = ns,
                  .name = "pod-" + uid,
                  .node = node,
                  .requests = {{kGpu, gpus}}};
}

std::vector<int> Free(const k8s::NodeDevices& v) { return v.resources.at(kGpu).available; }

std::vector<int> Minus(std::vector<int> a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

class AssumptionsTest : public ::testing::Test {
 protected:
  Assumptions::Options Opts(milliseconds timeout = milliseconds(30'000)) {
    return {.timeout = timeout, .bind_wait = milliseconds(0), .clock = &clock_};
  }
  FakeClock clock_;
};

TEST_F(AssumptionsTest, AnAssumedPodTakesTheDevicesThePluginsPolicyWouldChoose) {
  const topology::Topology t = *topology::Preset("dgx1-v100");
  for (topology::Policy policy :
       {topology::Policy::kPacked, topology::Policy::kBestSet, topology::Policy::kFirstFit}) {
    SCOPED_TRACE(std::string(topology::PolicyName(policy)));
    Assumptions a(Opts());
    const std::vector<int> free = {0, 2, 3, 5, 6, 7};
    k8s::NodeDevices base = NodeView("dgx1-v100", free, policy);
    a.Bound(Pod("u1", "n1", 3), Assumptions::Source::kWatch);
    std::shared_ptr<const k8s::NodeDevices> v = a.View("n1", base, nullptr);
    ASSERT_NE(v, nullptr);
    StatusOr<topology::Allocation> plugin = topology::Allocate(t, free, {}, 3, policy);
    ASSERT_TRUE(plugin.ok());
    EXPECT_EQ(Free(*v), Minus(free, plugin->chosen));
    // The node's other view fields are the base's.
    EXPECT_EQ(v->resources.at(kGpu).device_count, 8);
    EXPECT_EQ(v->resources.at(kGpu).topology, base.resources.at(kGpu).topology);
  }
}

TEST_F(AssumptionsTest, WithoutAPublishedPolicyTheKdmPluginsDefaultPackedIsAssumed) {
  // The one default every kdm command takes (issue 30): kdm plugin's too.
  static_assert(topology::kDefaultPolicy == topology::Policy::kPacked);
  const topology::Topology t = *topology::Preset("dgx1-v100");
  const std::vector<int> free = {0, 1, 2, 3, 4, 5, 6, 7};
  Assumptions a(Opts());
  a.Bound(Pod("u1", "n1", 1), Assumptions::Source::kWatch);
  k8s::NodeDevices base = NodeView("dgx1-v100", {0, 1, 2, 3, 4, 5, 6, 7}, std::nullopt);
  std::shared_ptr<const k8s::NodeDevices> v = a.View("n1", base, nullptr);
  ASSERT_NE(v, nullptr);
  StatusOr<topology::Allocation> packed =
      topology::Allocate(t, free, {}, 1, topology::Policy::kPacked);
  ASSERT_TRUE(packed.ok());
  EXPECT_EQ(Free(*v), Minus(free, packed->chosen));
}

TEST_F(AssumptionsTest, PodsTakeDevicesInTheOrderTheirBindsWereSeen) {
  const topology::Topology t = *topology::Preset("dgx1-v100");
  std::vector<int> free = {0, 1, 2, 3, 4, 5, 6, 7};
  Assumptions a(Opts());
  a.Bound(Pod("first", "n1", 2), Assumptions::Source::kWatch);
  a.Bound(Pod("second", "n1", 4), Assumptions::Source::kBind);
  std::shared_ptr<const k8s::NodeDevices> v = a.View("n1", NodeView("dgx1-v100", free), nullptr);
  ASSERT_NE(v, nullptr);
  // As the kubelet admits them: the first on all eight, the second on the rest.
  auto first = topology::Allocate(t, free, {}, 2, topology::Policy::kPacked);
  ASSERT_TRUE(first.ok());
  free = Minus(free, first->chosen);
  auto second = topology::Allocate(t, free, {}, 4, topology::Policy::kPacked);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(Free(*v), Minus(free, second->chosen));
  EXPECT_EQ(Free(*v).size(), 2u);
}

TEST_F(AssumptionsTest, BindsThatOverlapTakeDevicesInTheWatchsOrder) {
  const topology::Topology t = *topology::Preset("dgx1-v100");
  std::vector<int> free = {0, 1, 2, 3, 4, 5, 6, 7};
  Assumptions a(Opts());
  // /bind calls of two pods overlap: the 4-GPU pod's came first, but the
  // API server recorded the 1-GPU pod's Binding first (the watch says so).
  a.Bound(Pod("four", "n1", 4), Assumptions::Source::kBind);
  a.Bound(Pod("one", "n1", 1), Assumptions::Source::kBind);
  a.Bound(Pod("one", "n1", 1), Assumptions::Source::kWatch);
  a.Bound(Pod("four", "n1", 4), Assumptions::Source::kWatch);
  std::shared_ptr<const k8s::NodeDevices> v = a.View("n1", NodeView("dgx1-v100", free), nullptr);
  ASSERT_NE(v, nullptr);
  auto one = topology::Allocate(t, free, {}, 1, topology::Policy::kPacked);
  ASSERT_TRUE(one.ok());
  free = Minus(free, one->chosen);
  auto four = topology::Allocate(t, free, {}, 4, topology::Policy::kPacked);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(Free(*v), Minus(free, four->chosen));
  EXPECT_EQ(a.stats().assumed, 2u);
}

TEST_F(AssumptionsTest, MoreAssumedThanFreeLeavesNothingFree) {
  Assumptions a(Opts());
  a.Bound(Pod("u1", "n1", 3), Assumptions::Source::kWatch);
  a.Bound(Pod("u2", "n1", 3), Assumptions::Source::kWatch);
  std::shared_ptr<const k8s::NodeDevices> v =
      a.View("n1", NodeView("pcie-8gpu", {1, 2, 6, 7}), nullptr);
  ASSERT_NE(v, nullptr);
  EXPECT_TRUE(Free(*v).empty());
}

TEST_F(AssumptionsTest, OtherNodesAndOtherResourcesAreUntouched) {
  Assumptions a(Opts());
  BoundPod p = Pod("u1", "n1", 2);
  p.requests = {{"example.com/fpga", 1}};
  a.Bound(p, Assumptions::Source::kWatch);
  a.Bound(Pod("u2", "n2", 2), Assumptions::Source::kWatch);
  EXPECT_EQ(a.View("n3", NodeView("dgx1-v100", {0, 1}), nullptr), nullptr);
  std::shared_ptr<const k8s::NodeDevices> v =
      a.View("n1", NodeView("dgx1-v100", {0, 1, 2}), nullptr);
  ASSERT_NE(v, nullptr);
  EXPECT_THAT(Free(*v), ElementsAre(0, 1, 2));
}

TEST_F(AssumptionsTest, TheAnnotationListingThePodEndsItsAssumptionOnce) {
  Assumptions a(Opts());
  const BoundPod p = Pod("u1", "n1", 2);
  a.Bound(p, Assumptions::Source::kWatch);
  const std::vector<int> free = {0, 1, 2, 3, 4, 5, 6, 7};
  ASSERT_NE(a.View("n1", NodeView("dgx1-v100", free), nullptr), nullptr);
  // The node published: its two devices in use and the pod's fingerprint.
  const std::vector<uint64_t> listed = {k8s::PodFingerprint("ml", "pod-u1")};
  k8s::NodeDevices published = NodeView("dgx1-v100", {2, 3, 4, 5, 6, 7}, std::nullopt, listed);
  EXPECT_EQ(a.View("n1", published, nullptr), nullptr);  // not counted twice
  EXPECT_EQ(a.stats().reflected, 1u);
  EXPECT_EQ(a.stats().assumed, 0u);
  // Its next status change is no new assumption.
  a.Bound(p, Assumptions::Source::kWatch);
  EXPECT_EQ(a.View("n1", NodeView("dgx1-v100", free), nullptr), nullptr);
  EXPECT_EQ(a.stats().started_watch, 1u);
  // Gone forgets it.
  a.Gone("u1");
  EXPECT_EQ(a.stats().known, 0u);
}

TEST_F(AssumptionsTest, AnAnnotationWithoutThePodKeepsTheAssumption) {
  Assumptions a(Opts());
  a.Bound(Pod("u1", "n1", 2), Assumptions::Source::kWatch);
  const std::vector<uint64_t> others = {k8s::PodFingerprint("ml", "someone-else")};
  EXPECT_NE(a.View("n1", NodeView("dgx1-v100", {0, 1, 2, 3}, std::nullopt, others), nullptr),
            nullptr);
  // A publisher that writes no `pods` cannot show it either.
  EXPECT_NE(a.View("n1", NodeView("dgx1-v100", {0, 1, 2, 3}, std::nullopt, std::nullopt), nullptr),
            nullptr);
  EXPECT_EQ(a.stats().assumed, 1u);
}

TEST_F(AssumptionsTest, DeletedPodsAndDeletedNodesEndTheirAssumptions) {
  Assumptions a(Opts());
  a.Bound(Pod("u1", "n1", 2), Assumptions::Source::kWatch);
  a.Bound(Pod("u2", "n2", 2), Assumptions::Source::kWatch);
  a.Gone("u1");
  EXPECT_EQ(a.View("n1", NodeView("dgx1-v100", {0, 1, 2}), nullptr), nullptr);
  a.NodeGone("n2");
  EXPECT_EQ(a.View("n2", NodeView("dgx1-v100", {0, 1, 2}), nullptr), nullptr);
  const Assumptions::Stats s = a.stats();
  EXPECT_EQ(s.deleted, 1u);
  EXPECT_EQ(s.node_deleted, 1u);
  EXPECT_EQ(s.assumed, 0u);
}

TEST_F(AssumptionsTest, ARelistEndsWatchedPodsItNoLongerHasAndKeepsBinds) {
  Assumptions a(Opts());
  a.Bound(Pod("watched", "n1", 1), Assumptions::Source::kWatch);
  a.Bound(Pod("bound-here", "n1", 1), Assumptions::Source::kBind);
  a.ReplaceBound({Pod("new", "n1", 1)});
  const Assumptions::Stats s = a.stats();
  EXPECT_EQ(s.deleted, 1u);
  EXPECT_EQ(s.assumed, 2u);  // bound-here and new
}

TEST_F(AssumptionsTest, TenThousandBindsThatNeverAppearAreAllGoneAfterTheTimeout) {
  Assumptions a(Opts(milliseconds(30'000)));
  for (int i = 0; i < 10'000; ++i) {
    a.Bound(Pod("u" + std::to_string(i), "n" + std::to_string(i % 100), 1),
            Assumptions::Source::kBind);
  }
  EXPECT_EQ(a.stats().assumed, 10'000u);
  clock_.Advance(milliseconds(29'999));
  a.Sweep();
  EXPECT_EQ(a.stats().assumed, 10'000u);
  clock_.Advance(milliseconds(1));
  a.Sweep();
  const Assumptions::Stats s = a.stats();
  EXPECT_EQ(s.assumed, 0u);
  EXPECT_EQ(s.expired, 10'000u);
  EXPECT_EQ(s.known, 0u);  // nothing kept: memory back where it started
  EXPECT_EQ(a.View("n7", NodeView("dgx1-v100", {0, 1}), nullptr), nullptr);
}

TEST_F(AssumptionsTest, AnExpiredWatchedPodIsNotAssumedAgainOnItsNextChange) {
  Assumptions a(Opts(milliseconds(1000)));
  a.Bound(Pod("u1", "n1", 1), Assumptions::Source::kWatch);
  clock_.Advance(milliseconds(1000));
  a.Sweep();
  EXPECT_EQ(a.stats().expired, 1u);
  a.Bound(Pod("u1", "n1", 1), Assumptions::Source::kWatch);
  EXPECT_EQ(a.stats().assumed, 0u);
  EXPECT_EQ(a.stats().known, 1u);  // remembered while it lives
  a.Gone("u1");
  EXPECT_EQ(a.stats().known, 0u);
}

TEST_F(AssumptionsTest, ViewsAreMemoisedUntilTheNodeOrItsAssumptionsChange) {
  Assumptions a(Opts());
  a.Bound(Pod("u1", "n1", 2), Assumptions::Source::kWatch);
  auto owner = std::make_shared<const k8s::NodeDevices>(NodeView("dgx1-v100", {0, 1, 2, 3, 4}));
  auto v1 = a.View("n1", *owner, owner);
  auto v2 = a.View("n1", *owner, owner);
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(a.stats().views_computed, 1u);
  a.Bound(Pod("u2", "n1", 1), Assumptions::Source::kWatch);
  auto v3 = a.View("n1", *owner, owner);
  EXPECT_NE(v3, v1);
  EXPECT_EQ(Free(*v3).size(), 2u);
  auto other = std::make_shared<const k8s::NodeDevices>(NodeView("dgx1-v100", {0, 1, 2, 3, 4}));
  a.View("n1", *other, other);
  EXPECT_EQ(a.stats().views_computed, 3u);
}

TEST_F(AssumptionsTest, OffWhenTheTimeoutIsZero) {
  Assumptions a(Opts(milliseconds(0)));
  EXPECT_FALSE(a.enabled());
  a.Bound(Pod("u1", "n1", 2), Assumptions::Source::kWatch);
  EXPECT_EQ(a.View("n1", NodeView("dgx1-v100", {0, 1, 2}), nullptr), nullptr);
  EXPECT_EQ(a.stats().assumed, 0u);
}

TEST_F(AssumptionsTest, PodsWithoutDeviceRequestsAreNotAssumed) {
  Assumptions a(Opts());
  BoundPod p = Pod("u1", "n1", 1);
  p.requests.clear();
  a.Bound(p, Assumptions::Source::kWatch);
  EXPECT_EQ(a.stats().assumed, 0u);
  EXPECT_EQ(a.stats().known, 0u);
}

TEST(AssumptionsBindWaitTest, AFilterWaitsForTheBindOfThePodBeforeIt) {
  Assumptions a({.timeout = milliseconds(30'000), .bind_wait = milliseconds(10'000)});
  a.InCycle("before");
  std::thread binder([&] {
    std::this_thread::sleep_for(milliseconds(20));
    a.Bound(Pod("before", "n1", 1), Assumptions::Source::kWatch);
  });
  // Returns when the bind is seen, not after the 10 s bound.
  EXPECT_EQ(a.WaitForBinds("next"), 0u);
  EXPECT_EQ(a.stats().assumed, 1u);
  binder.join();
}

TEST(AssumptionsBindWaitTest, APodThatIsNeverBoundIsWaitedForOnceWithinTheBound) {
  Assumptions a({.timeout = milliseconds(30'000), .bind_wait = milliseconds(30)});
  a.InCycle("never");
  EXPECT_EQ(a.WaitForBinds("next"), 1u);
  EXPECT_EQ(a.WaitForBinds("after"), 0u);  // given up on: not waited for again
  // A pod does not wait for itself, and a deleted pod is not waited for.
  a.InCycle("self");
  EXPECT_EQ(a.WaitForBinds("self"), 0u);
  a.InCycle("deleted");
  a.Gone("deleted");
  EXPECT_EQ(a.WaitForBinds("other"), 0u);
}

}  // namespace
}  // namespace kdm::scheduler
