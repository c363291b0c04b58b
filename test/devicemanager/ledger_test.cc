// Unit tests of the Ledger: one per admission rule and error text of
// docs/kubelet-rules.md#allocation, the reservation rules of
// docs/promises.md#reservations, the validation of preferred answers of
// docs/promises.md#validated-preferred-answers, bad input, and a randomized
// property test that checks CheckInvariants() after every step.
#include "kdm/devicemanager/ledger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace kdm::devicemanager {

// gtest prints a skipped entry by its fields (found by ADL, so outside the
// anonymous namespace).
void PrintTo(const SkippedCheckpointEntry& e, std::ostream* os) {
  *os << "{pod=" << e.pod_uid << " container=" << e.container_name
      << " resource=" << e.resource_name << " device=" << e.device_id
      << " held_by=" << e.held_by_pod_uid << " reason=" << e.reason << "}";
}

namespace {

using checkpoint::ContainerKey;
using checkpoint::kNoNumaNode;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr char kGpu[] = "vendor.com/gpu";
constexpr char kNic[] = "vendor.com/nic";

Container MakeContainer(const std::string& name, int64_t gpus, bool restartable = false) {
  Container c;
  c.name = name;
  c.restartable = restartable;
  if (gpus > 0) {
    c.limits[kGpu] = Quantity::FromInt(gpus);
    c.requests[kGpu] = Quantity::FromInt(gpus);
  }
  return c;
}

Pod MakePod(const std::string& uid, std::vector<Container> inits, std::vector<Container> apps) {
  Pod pod;
  pod.uid = uid;
  pod.namespace_name = "default";
  pod.name = "pod-" + uid;
  pod.init_containers = std::move(inits);
  pod.containers = std::move(apps);
  return pod;
}

Pod OneContainerPod(const std::string& uid, int64_t gpus) {
  return MakePod(uid, {}, {MakeContainer("main", gpus)});
}

// gpu0..gpu{n-1}, healthy, without topology.
std::vector<LedgerDevice> Gpus(int n) {
  std::vector<LedgerDevice> out;
  for (int i = 0; i < n; ++i) out.push_back({"gpu" + std::to_string(i), true, {}});
  return out;
}

// Two NUMA nodes: gpu0, gpu1 on node 0; gpu2, gpu3 on node 1.
std::vector<LedgerDevice> NumaGpus() {
  return {{"gpu0", true, {0}}, {"gpu1", true, {0}}, {"gpu2", true, {1}}, {"gpu3", true, {1}}};
}

void Register(Ledger& ledger, const std::string& resource,
              const std::vector<LedgerDevice>& devices) {
  StatusOr<SnapshotReport> r = ledger.SetDevices(resource, devices);
  ASSERT_TRUE(r.ok()) << r.status();
}

// Plan + Reserve(default choice) + Commit; returns the devices recorded.
std::vector<std::string> Admit(Ledger& ledger, const Pod& pod, const std::string& container,
                               int64_t count, const std::optional<NumaHint>& hint = std::nullopt,
                               const std::string& resource = kGpu) {
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, container, resource, count, hint);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  if (plan->reuse) return plan->reuse_ids;
  Status s = ledger.Reserve(*plan, ledger.DefaultChoice(*plan));
  EXPECT_TRUE(s.ok()) << s;
  StatusOr<checkpoint::Change> change = ledger.Commit(plan->key, "resp-" + container);
  EXPECT_TRUE(change.ok()) << change.status();
  EXPECT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants();
  std::optional<checkpoint::PodDevicesEntry> e = ledger.Entry(plan->key);
  return e ? FlattenDeviceIds(e->device_ids) : std::vector<std::string>{};
}

// ------------------------------------------------------------------ helpers

TEST(NaturalLessTest, OrdersDigitRunsAsNumbers) {
  std::vector<std::string> ids = {"gpu10", "gpu2", "gpu1", "a", "gpu02", "gpu", "b1"};
  std::sort(ids.begin(), ids.end(), NaturalLess);
  EXPECT_THAT(ids, ElementsAre("a", "b1", "gpu", "gpu1", "gpu02", "gpu2", "gpu10"));
  EXPECT_FALSE(NaturalLess("x", "x"));
}

TEST(FlattenDeviceIdsTest, UniqueAcrossNumaNodesInNaturalOrder) {
  checkpoint::DevicesPerNuma by_numa = {{0, {"gpu10", "gpu1"}}, {1, {"gpu1", "gpu2"}}};
  EXPECT_THAT(FlattenDeviceIds(by_numa), ElementsAre("gpu1", "gpu2", "gpu10"));
}

// ------------------------------------------------------------------ devices

TEST(LedgerDevicesTest, CapacityIsHealthyPlusUnhealthyAllocatableIsHealthy) {
  Ledger ledger;
  Register(ledger, kGpu, {{"gpu0", true, {}}, {"gpu1", false, {}}, {"gpu2", true, {}}});
  Capacity cap = ledger.GetCapacity();
  EXPECT_EQ(cap.resources.at(kGpu), (ResourceCapacity{3, 2}));
  EXPECT_THAT(cap.deleted, IsEmpty());
  EXPECT_THAT(ledger.HealthyDevices(kGpu), ElementsAre("gpu0", "gpu2"));
}

TEST(LedgerDevicesTest, SnapshotIsCompleteMissingIdsAreForgotten) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(3));
  Register(ledger, kGpu, {{"gpu1", true, {}}, {"gpu7", false, {}}});
  EXPECT_EQ(ledger.GetCapacity().resources.at(kGpu), (ResourceCapacity{2, 1}));
  std::vector<LedgerDevice> devices = ledger.Devices(kGpu);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].id, "gpu1");
  EXPECT_EQ(devices[1].id, "gpu7");
  EXPECT_FALSE(devices[1].healthy);
}

TEST(LedgerDevicesTest, SnapshotReportsRegisteredDevicesChange) {
  Ledger ledger;
  StatusOr<SnapshotReport> r = ledger.SetDevices(kGpu, {{"gpu1", true, {}}, {"gpu0", false, {}}});
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->change.registered_devices.at(kGpu), ElementsAre("gpu1"));
  EXPECT_THAT(r->duplicate_ids, IsEmpty());
  EXPECT_EQ(r->empty_ids, 0);
}

// What SnapshotReport::health_changes must hold, from the device lists
// before and after a snapshot: new or flipped devices in natural order, then
// devices that were healthy and are gone, in plain order, as unhealthy.
std::vector<LedgerDevice> ExpectedHealthChanges(const std::vector<LedgerDevice>& before,
                                                const std::vector<LedgerDevice>& after) {
  std::map<std::string, bool> old_health;
  for (const LedgerDevice& d : before) old_health[d.id] = d.healthy;
  std::vector<LedgerDevice> out;
  std::set<std::string> seen;
  for (const LedgerDevice& d : after) {
    seen.insert(d.id);
    auto it = old_health.find(d.id);
    if (it == old_health.end() || it->second != d.healthy) out.push_back({d.id, d.healthy, {}});
  }
  for (const auto& [id, healthy] : old_health) {
    if (healthy && !seen.count(id)) out.push_back({id, false, {}});
  }
  return out;
}

TEST(LedgerDevicesTest, SnapshotReportsHealthChangesInNaturalOrder) {
  Ledger ledger;
  StatusOr<SnapshotReport> r = ledger.SetDevices(
      kGpu, {{"gpu10", true, {}}, {"gpu2", false, {}}, {"gpu1", true, {}}, {"gpu3", true, {}}});
  ASSERT_TRUE(r.ok());
  // All new: every device, natural order.
  EXPECT_EQ(r->health_changes,
            (std::vector<LedgerDevice>{
                {"gpu1", true, {}}, {"gpu2", false, {}}, {"gpu3", true, {}}, {"gpu10", true, {}}}));
  // Same ids: only the flips (gpu10 before gpu2 in plain order, not here).
  r = ledger.SetDevices(
      kGpu, {{"gpu10", false, {1}}, {"gpu2", true, {0}}, {"gpu1", true, {}}, {"gpu3", true, {}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->health_changes,
            (std::vector<LedgerDevice>{{"gpu2", true, {}}, {"gpu10", false, {}}}));
  // The kept entries took the new topology and health.
  EXPECT_EQ(
      ledger.Devices(kGpu),
      (std::vector<LedgerDevice>{
          {"gpu1", true, {}}, {"gpu2", true, {0}}, {"gpu3", true, {}}, {"gpu10", false, {1}}}));
  EXPECT_THAT(r->change.registered_devices.at(kGpu), ElementsAre("gpu1", "gpu2", "gpu3"));
  // Nothing changed: no event.
  r = ledger.SetDevices(
      kGpu, {{"gpu10", false, {1}}, {"gpu2", true, {0}}, {"gpu1", true, {}}, {"gpu3", true, {}}});
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->health_changes, IsEmpty());
  // gpu3 (healthy) and gpu10 (unhealthy) gone, gpu9 new: the new one first,
  // then only the healthy one that went away.
  r = ledger.SetDevices(kGpu, {{"gpu9", true, {}}, {"gpu2", true, {0}}, {"gpu1", true, {}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->health_changes,
            (std::vector<LedgerDevice>{{"gpu9", true, {}}, {"gpu3", false, {}}}));
  EXPECT_EQ(
      ledger.Devices(kGpu),
      (std::vector<LedgerDevice>{{"gpu1", true, {}}, {"gpu2", true, {0}}, {"gpu9", true, {}}}));
  // Same count, other ids: a full re-sort, not the kept order.
  r = ledger.SetDevices(kGpu, {{"gpu20", true, {}}, {"gpu2", true, {0}}, {"gpu1", true, {}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->health_changes,
            (std::vector<LedgerDevice>{{"gpu20", true, {}}, {"gpu9", false, {}}}));
  EXPECT_EQ(
      ledger.Devices(kGpu),
      (std::vector<LedgerDevice>{{"gpu1", true, {}}, {"gpu2", true, {0}}, {"gpu20", true, {}}}));
}

TEST(LedgerDevicesTest, EmptyResourceNameIsRejected) {
  Ledger ledger;
  StatusOr<SnapshotReport> r = ledger.SetDevices("", Gpus(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("empty resource name"));
  EXPECT_TRUE(ledger.GetCapacity().resources.empty());
}

TEST(LedgerDevicesTest, DuplicateIdsAreMergedAndReported) {
  Ledger ledger;
  StatusOr<SnapshotReport> r = ledger.SetDevices(
      kGpu, {{"gpu0", true, {0}}, {"gpu1", true, {}}, {"gpu0", false, {1}}, {"gpu1", true, {}}});
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->duplicate_ids, ElementsAre("gpu0", "gpu1"));
  // Counted once; healthy only if every copy says so; first topology wins.
  EXPECT_EQ(ledger.GetCapacity().resources.at(kGpu), (ResourceCapacity{2, 1}));
  std::vector<LedgerDevice> devices = ledger.Devices(kGpu);
  EXPECT_EQ(devices[0], (LedgerDevice{"gpu0", false, {0}}));
  EXPECT_EQ(devices[1], (LedgerDevice{"gpu1", true, {}}));
}

TEST(LedgerDevicesTest, EmptyIdsSkippedAndNegativeNumaIgnored) {
  Ledger ledger;
  StatusOr<SnapshotReport> r =
      ledger.SetDevices(kGpu, {{"", true, {0}}, {"gpu0", true, {1, -1, 1, 0}}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->empty_ids, 1);
  EXPECT_EQ(ledger.Devices(kGpu), (std::vector<LedgerDevice>{{"gpu0", true, {0, 1}}}));
}

TEST(LedgerDevicesTest, UnhealthyWhenEndpointStopsCapacityKept) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  checkpoint::Change c = ledger.MarkAllUnhealthy(kGpu);
  EXPECT_EQ(ledger.GetCapacity().resources.at(kGpu), (ResourceCapacity{2, 0}));
  EXPECT_THAT(c.registered_devices.at(kGpu), IsEmpty());
  EXPECT_TRUE(ledger.HasResource(kGpu));
  // Unknown resource: nothing happens.
  EXPECT_TRUE(ledger.MarkAllUnhealthy("vendor.com/none").empty());
  EXPECT_FALSE(ledger.HasResource("vendor.com/none"));
}

TEST(LedgerDevicesTest, DeletedAfterGraceUntilRegisteredAgain) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Register(ledger, kNic, Gpus(1));
  Pod pod = OneContainerPod("p1", 1);
  Admit(ledger, pod, "main", 1);
  checkpoint::Change c = ledger.RemoveResource(kGpu);
  EXPECT_THAT(c.removed_resources, ElementsAre(kGpu));
  Capacity cap = ledger.GetCapacity();
  EXPECT_FALSE(cap.resources.count(kGpu));
  EXPECT_TRUE(cap.resources.count(kNic));
  EXPECT_THAT(cap.deleted, ElementsAre(kGpu));
  EXPECT_FALSE(ledger.HasResource(kGpu));
  // The pod still holds its device, and the resource is still a device
  // resource.
  EXPECT_TRUE(ledger.Entry({"p1", "main", kGpu}).has_value());
  EXPECT_TRUE(ledger.IsDeviceResource(kGpu));
  EXPECT_TRUE(ledger.RemoveResource("vendor.com/none").empty());
  Register(ledger, kGpu, Gpus(2));
  EXPECT_THAT(ledger.GetCapacity().deleted, IsEmpty());
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

// ------------------------------------------------------------------ requests

TEST(LedgerRequestsTest, DeviceResourcesOnlyZeroLeftOut) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Register(ledger, kNic, Gpus(2));
  Container c = MakeContainer("main", 2);
  c.limits["cpu"] = *Quantity::Parse("500m");
  c.limits["memory"] = *Quantity::Parse("1Gi");
  c.limits[kNic] = Quantity::FromInt(0);
  StatusOr<std::map<std::string, int64_t>> r = ledger.ContainerRequests(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::map<std::string, int64_t>{{kGpu, 2}}));
}

TEST(LedgerRequestsTest, RequestMustEqualLimit) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Container c = MakeContainer("main", 2);
  c.requests[kGpu] = Quantity::FromInt(1);
  StatusOr<std::map<std::string, int64_t>> r = ledger.ContainerRequests(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("container \"main\" requests 1 of resource "
                                              "\"vendor.com/gpu\" but its limit is 2"));
  // A limit alone is fine (Kubernetes defaults the request to the limit) ...
  c.requests.clear();
  EXPECT_TRUE(ledger.ContainerRequests(c).ok());
  // ... a request alone is not.
  Container only_request;
  only_request.name = "x";
  only_request.requests[kGpu] = Quantity::FromInt(1);
  EXPECT_THAT(ledger.ContainerRequests(only_request).status().message(),
              HasSubstr("without a limit"));
}

TEST(LedgerRequestsTest, FractionalNegativeHugeQuantitiesRejectedNamingValue) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  for (const char* text : {"500m", "-1", "3Gi"}) {
    Container c;
    c.name = "main";
    c.limits[kGpu] = *Quantity::Parse(text);
    StatusOr<std::map<std::string, int64_t>> r = ledger.ContainerRequests(c);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("container \"main\" resource \"vendor.com/gpu\""));
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("\"") + text + "\""));
  }
}

TEST(LedgerRequestsTest, PodRequestsWithSidecars) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(8));
  // sidecar 1 + init 3 at once = 4; apps 2 + sidecar 1 = 3 → 4.
  Pod pod = MakePod("p", {MakeContainer("side", 1, true), MakeContainer("init", 3)},
                    {MakeContainer("a", 1), MakeContainer("b", 1)});
  EXPECT_EQ(*ledger.PodRequests(pod), (std::map<std::string, int64_t>{{kGpu, 4}}));
  // Bigger apps win.
  pod.containers.push_back(MakeContainer("c", 3));
  EXPECT_EQ(*ledger.PodRequests(pod), (std::map<std::string, int64_t>{{kGpu, 6}}));
  // An init container after a sidecar needs room next to it; one before does
  // not.
  Pod early = MakePod("q", {MakeContainer("init", 3), MakeContainer("side", 1, true)}, {});
  EXPECT_EQ(*ledger.PodRequests(early), (std::map<std::string, int64_t>{{kGpu, 3}}));
  Pod bad = MakePod("r", {}, {MakeContainer("a", 1)});
  bad.containers[0].limits[kGpu] = *Quantity::Parse("1.5");
  EXPECT_FALSE(ledger.PodRequests(bad).ok());
}

// ------------------------------------------------------------------ allocation

TEST(LedgerAllocateTest, FirstFitInNaturalOrderAndCommitChange) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(12));
  Pod pod = OneContainerPod("p1", 3);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 3, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->reuse);
  EXPECT_EQ(plan->size, 3);
  EXPECT_EQ(plan->kind, ContainerKind::kApp);
  EXPECT_THAT(plan->must_include, IsEmpty());
  EXPECT_EQ(plan->candidates.size(), 12u);
  EXPECT_EQ(plan->candidates[2], "gpu2");
  EXPECT_EQ(plan->candidates[10], "gpu10");
  EXPECT_TRUE(plan->real_choice);
  EXPECT_THAT(ledger.DefaultChoice(*plan), ElementsAre("gpu0", "gpu1", "gpu2"));
  ASSERT_TRUE(ledger.Reserve(*plan, ledger.DefaultChoice(*plan)).ok());
  EXPECT_EQ(ledger.GetCapacity().resources.at(kGpu), (ResourceCapacity{12, 12}));
  StatusOr<checkpoint::Change> change = ledger.Commit(plan->key, "bytes");
  ASSERT_TRUE(change.ok());
  ASSERT_EQ(change->upserts.size(), 1u);
  EXPECT_EQ(change->upserts[0],
            (checkpoint::PodDevicesEntry{
                "p1", "main", kGpu, {{kNoNumaNode, {"gpu0", "gpu1", "gpu2"}}}, "bytes"}));
  EXPECT_FALSE(ledger.Reservation(plan->key).has_value());
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerAllocateTest, CommitGroupsDevicesByNumaNode) {
  Ledger ledger;
  Register(ledger, kGpu, {{"gpu0", true, {0}}, {"gpu1", true, {0, 1}}, {"gpu2", true, {}}});
  Pod pod = OneContainerPod("p1", 3);
  Admit(ledger, pod, "main", 3);
  checkpoint::DevicesPerNuma want = {{kNoNumaNode, {"gpu2"}}, {0, {"gpu0", "gpu1"}}, {1, {"gpu1"}}};
  EXPECT_EQ(ledger.Entry({"p1", "main", kGpu})->device_ids, want);
}

TEST(LedgerAllocateTest, RestartedContainerReusesRecordedDevices) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(4));
  Pod pod = OneContainerPod("p1", 2);
  std::vector<std::string> first = Admit(ledger, pod, "main", 2);
  StatusOr<AllocationPlan> again = ledger.Plan(pod, "main", kGpu, 2, std::nullopt);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->reuse);
  EXPECT_EQ(again->reuse_ids, first);
  EXPECT_EQ(ledger.DefaultChoice(*again), first);
  // Nothing to reserve for a reuse plan.
  Status s = ledger.Reserve(*again, first);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("reuses its recorded devices"));
}

TEST(LedgerAllocateTest, ChangedRequestIsAnError) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(4));
  Pod pod = OneContainerPod("p1", 2);
  Admit(ledger, pod, "main", 2);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 3, std::nullopt);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(plan.status().message(),
            "pod \"p1\" container \"main\" changed request for resource "
            "\"vendor.com/gpu\" from 2 to 3");
}

TEST(LedgerAllocateTest, ChangedRequestCheckedBeforeRegistration) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(4));
  Pod pod = OneContainerPod("p1", 2);
  Admit(ledger, pod, "main", 2);
  (void)ledger.RemoveResource(kGpu);
  EXPECT_THAT(ledger.Plan(pod, "main", kGpu, 1, std::nullopt).status().message(),
              HasSubstr("changed request"));
  EXPECT_EQ(ledger.Plan(pod, "main", kGpu, 2, std::nullopt).status().message(),
            "cannot allocate unregistered device vendor.com/gpu");
}

TEST(LedgerAllocateTest, UnregisteredDevice) {
  Ledger ledger;
  Pod pod = OneContainerPod("p1", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(plan.status().message(), "cannot allocate unregistered device vendor.com/gpu");
}

TEST(LedgerAllocateTest, NoHealthyDevicesPresent) {
  Ledger ledger;
  Register(ledger, kGpu, {{"gpu0", false, {}}});
  Pod pod = OneContainerPod("p1", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(plan.status().message(),
            "no healthy devices present; cannot allocate unhealthy devices "
            "vendor.com/gpu");
  // The same after the endpoint stops, and for an empty snapshot.
  Register(ledger, kGpu, Gpus(2));
  (void)ledger.MarkAllUnhealthy(kGpu);
  EXPECT_THAT(ledger.Plan(pod, "main", kGpu, 1, std::nullopt).status().message(),
              HasSubstr("no healthy devices present"));
  Register(ledger, kGpu, {});
  EXPECT_THAT(ledger.Plan(pod, "main", kGpu, 1, std::nullopt).status().message(),
              HasSubstr("no healthy devices present"));
}

TEST(LedgerAllocateTest, PreviouslyAllocatedDevicesNoLongerHealthy) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(3));
  Pod pod = OneContainerPod("p1", 1);
  EXPECT_THAT(Admit(ledger, pod, "main", 1), ElementsAre("gpu0"));
  Register(ledger, kGpu, {{"gpu0", false, {}}, {"gpu1", true, {}}, {"gpu2", true, {}}});
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(plan.status().message(),
            "previously allocated devices are no longer healthy; cannot "
            "allocate unhealthy "
            "devices vendor.com/gpu");
  // A device dropped from the snapshot counts as no longer healthy too.
  Register(ledger, kGpu, {{"gpu1", true, {}}});
  EXPECT_THAT(ledger.Plan(pod, "main", kGpu, 1, std::nullopt).status().message(),
              HasSubstr("previously allocated devices are no longer healthy"));
}

TEST(LedgerAllocateTest, RequestedNumberUnavailable) {
  Ledger ledger;
  Register(ledger, kGpu, {{"gpu0", true, {}}, {"gpu1", true, {}}, {"gpu2", false, {}}});
  Pod pod = OneContainerPod("p1", 3);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 3, std::nullopt);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(plan.status().message(),
            "requested number of devices unavailable for vendor.com/gpu. "
            "Requested: 3, Available: 2");
}

TEST(LedgerAllocateTest, AvailableExcludesAllocatedAndReserved) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(4));
  Pod a = OneContainerPod("a", 1);
  Admit(ledger, a, "main", 1);
  Pod b = OneContainerPod("b", 1);
  StatusOr<AllocationPlan> pb = ledger.Plan(b, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pb.ok());
  ASSERT_TRUE(ledger.Reserve(*pb, {"gpu3"}).ok());
  Pod c = OneContainerPod("c", 3);
  EXPECT_EQ(ledger.Plan(c, "main", kGpu, 3, std::nullopt).status().message(),
            "requested number of devices unavailable for vendor.com/gpu. "
            "Requested: 3, Available: 2");
  StatusOr<AllocationPlan> pc = ledger.Plan(c, "main", kGpu, 2, std::nullopt);
  ASSERT_TRUE(pc.ok());
  EXPECT_THAT(pc->candidates, ElementsAre("gpu1", "gpu2"));
  EXPECT_FALSE(pc->real_choice);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerAllocateTest, TwoResourcesAreIndependent) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(1));
  Register(ledger, kNic, Gpus(1));  // same ids, different resource
  Pod pod = MakePod("p", {}, {MakeContainer("main", 1)});
  pod.containers[0].limits[kNic] = Quantity::FromInt(1);
  EXPECT_THAT(Admit(ledger, pod, "main", 1, std::nullopt, kGpu), ElementsAre("gpu0"));
  EXPECT_THAT(Admit(ledger, pod, "main", 1, std::nullopt, kNic), ElementsAre("gpu0"));
  EXPECT_EQ(ledger.ContainerEntries("p", "main").size(), 2u);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

// ------------------------------------------------------------------ init
// containers

TEST(LedgerHandOverTest, FinishedInitContainerDevicesGoToAppContainer) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(4));
  Pod pod = MakePod("p", {MakeContainer("init", 1)}, {MakeContainer("app", 1)});
  EXPECT_THAT(Admit(ledger, pod, "init", 1), ElementsAre("gpu0"));
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "app", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->must_include, ElementsAre("gpu0"));
  EXPECT_THAT(plan->candidates, IsEmpty());
  EXPECT_FALSE(plan->real_choice);
  ASSERT_TRUE(ledger.Reserve(*plan, ledger.DefaultChoice(*plan)).ok());
  EXPECT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants();
  ASSERT_TRUE(ledger.Commit(plan->key, "r").ok());
  EXPECT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants();
  // Recorded for both; three devices still free.
  EXPECT_THAT(FlattenDeviceIds(ledger.Entry({"p", "app", kGpu})->device_ids), ElementsAre("gpu0"));
  EXPECT_THAT(FlattenDeviceIds(ledger.Entry({"p", "init", kGpu})->device_ids), ElementsAre("gpu0"));
  Pod other = OneContainerPod("q", 3);
  EXPECT_TRUE(ledger.Plan(other, "main", kGpu, 3, std::nullopt).ok());
}

TEST(LedgerHandOverTest, HandOverFirstThenFreeDevices) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(3));
  Pod pod = MakePod("p", {MakeContainer("init", 1)}, {MakeContainer("app", 3)});
  EXPECT_THAT(Admit(ledger, pod, "init", 1), ElementsAre("gpu0"));
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "app", kGpu, 3, std::nullopt);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->must_include, ElementsAre("gpu0"));
  EXPECT_THAT(plan->candidates, ElementsAre("gpu1", "gpu2"));
  EXPECT_FALSE(plan->real_choice);
  // Too many: the count is what is still needed after the hand-over.
  Pod big = MakePod("p", {MakeContainer("init", 1)}, {MakeContainer("app", 4)});
  EXPECT_EQ(ledger.Plan(big, "app", kGpu, 4, std::nullopt).status().message(),
            "requested number of devices unavailable for vendor.com/gpu. "
            "Requested: 3, Available: 2");
}

TEST(LedgerHandOverTest, LaterInitContainerReusesEarlierOne) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(3));
  Pod pod =
      MakePod("p", {MakeContainer("i1", 2), MakeContainer("i2", 1)}, {MakeContainer("app", 2)});
  EXPECT_THAT(Admit(ledger, pod, "i1", 2), ElementsAre("gpu0", "gpu1"));
  EXPECT_THAT(Admit(ledger, pod, "i2", 1), ElementsAre("gpu0"));
  EXPECT_THAT(Admit(ledger, pod, "app", 2), ElementsAre("gpu0", "gpu1"));
  EXPECT_EQ(ledger.GetCapacity().resources.at(kGpu).allocatable, 3);
  Pod other = OneContainerPod("q", 1);
  EXPECT_THAT(Admit(ledger, other, "main", 1), ElementsAre("gpu2"));
}

TEST(LedgerHandOverTest, SidecarDevicesAreNeverHandedOver) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(3));
  Pod pod = MakePod("p", {MakeContainer("side", 1, true)}, {MakeContainer("app", 1)});
  EXPECT_THAT(Admit(ledger, pod, "side", 1), ElementsAre("gpu0"));
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "app", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->must_include, IsEmpty());
  EXPECT_THAT(ledger.DefaultChoice(*plan), ElementsAre("gpu1"));
  // And the sidecar keeps its device.
  EXPECT_THAT(Admit(ledger, pod, "app", 1), ElementsAre("gpu1"));
  EXPECT_THAT(FlattenDeviceIds(ledger.Entry({"p", "side", kGpu})->device_ids), ElementsAre("gpu0"));
}

TEST(LedgerHandOverTest, SidecarAfterFinishedInitTakesItsDevicesAndKeepsThem) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(3));
  Pod pod = MakePod("p", {MakeContainer("init", 1), MakeContainer("side", 1, true)},
                    {MakeContainer("app", 1)});
  EXPECT_THAT(Admit(ledger, pod, "init", 1), ElementsAre("gpu0"));
  EXPECT_THAT(Admit(ledger, pod, "side", 1), ElementsAre("gpu0"));
  // gpu0 now runs in the sidecar: the app must not get it.
  EXPECT_THAT(Admit(ledger, pod, "app", 1), ElementsAre("gpu1"));
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerHandOverTest, TwoAppContainersNeverShareAHandedOverDevice) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(3));
  Pod pod =
      MakePod("p", {MakeContainer("init", 1)}, {MakeContainer("a", 1), MakeContainer("b", 1)});
  Admit(ledger, pod, "init", 1);
  // a and b plan while the other's admission is in flight.
  StatusOr<AllocationPlan> pa = ledger.Plan(pod, "a", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pa.ok());
  ASSERT_TRUE(ledger.Reserve(*pa, ledger.DefaultChoice(*pa)).ok());
  StatusOr<AllocationPlan> pb = ledger.Plan(pod, "b", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pb.ok());
  EXPECT_THAT(pb->must_include, IsEmpty());
  EXPECT_THAT(ledger.DefaultChoice(*pb), ElementsAre("gpu1"));
  // b cannot grab gpu0 even by naming it.
  AllocationPlan forged = *pb;
  forged.must_include = {"gpu0"};
  Status s = ledger.Reserve(forged, {"gpu0"});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("\"gpu0\" of resource \"vendor.com/gpu\" is reserved by another"));
  ASSERT_TRUE(ledger.Commit(pa->key, "r").ok());
  StatusOr<AllocationPlan> pb2 = ledger.Plan(pod, "b", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pb2.ok());
  EXPECT_THAT(pb2->must_include, IsEmpty());
  Status s2 = ledger.Reserve(forged, {"gpu0"});
  EXPECT_THAT(s2.message(), HasSubstr("is allocated to pod \"p\" container \"a\""));
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerHandOverTest, UnhealthyInitDevicesAreNotHandedOver) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = MakePod("p", {MakeContainer("init", 1)}, {MakeContainer("app", 1)});
  Admit(ledger, pod, "init", 1);
  Register(ledger, kGpu, {{"gpu0", false, {}}, {"gpu1", true, {}}});
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "app", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->must_include, IsEmpty());
  EXPECT_THAT(ledger.DefaultChoice(*plan), ElementsAre("gpu1"));
}

TEST(LedgerHandOverTest, OtherPodsNeverReceiveHandOver) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = MakePod("p", {MakeContainer("init", 1)}, {MakeContainer("app", 1)});
  Admit(ledger, pod, "init", 1);
  Pod other = MakePod("q", {MakeContainer("init", 1)}, {MakeContainer("app", 1)});
  StatusOr<AllocationPlan> plan = ledger.Plan(other, "app", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->must_include, IsEmpty());
  AllocationPlan forged = *plan;
  forged.must_include = {"gpu0"};
  EXPECT_THAT(ledger.Reserve(forged, {"gpu0"}).message(), HasSubstr("is allocated to pod \"p\""));
}

// ------------------------------------------------------------------ NUMA
// alignment

TEST(LedgerNumaTest, AlignedCandidatesOnlyWhenTheySuffice) {
  Ledger ledger;
  Register(ledger, kGpu, NumaGpus());
  Pod pod = OneContainerPod("p", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, NumaHint{{1}, true});
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->candidates, ElementsAre("gpu2", "gpu3"));
  EXPECT_TRUE(plan->real_choice);
  EXPECT_THAT(ledger.DefaultChoice(*plan), ElementsAre("gpu2"));
  // Exactly enough aligned devices: no choice to make.
  StatusOr<AllocationPlan> two =
      ledger.Plan(OneContainerPod("q", 2), "main", kGpu, 2, NumaHint{{1}, true});
  ASSERT_TRUE(two.ok());
  EXPECT_THAT(two->candidates, ElementsAre("gpu2", "gpu3"));
  EXPECT_FALSE(two->real_choice);
}

TEST(LedgerNumaTest, AllAlignedDevicesMustBeIncludedWhenTooFew) {
  Ledger ledger;
  std::vector<LedgerDevice> devices = NumaGpus();
  devices.push_back({"gpu4", true, {}});
  Register(ledger, kGpu, devices);
  Pod pod = OneContainerPod("p", 3);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 3, NumaHint{{1}, false});
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->must_include, ElementsAre("gpu2", "gpu3"));
  // Devices on other NUMA nodes before devices without topology.
  EXPECT_THAT(plan->candidates, ElementsAre("gpu0", "gpu1", "gpu4"));
  EXPECT_TRUE(plan->real_choice);
  EXPECT_THAT(ledger.DefaultChoice(*plan), ElementsAre("gpu2", "gpu3", "gpu0"));
}

TEST(LedgerNumaTest, NoHintOrEmptyHintMeansPlainOrder) {
  Ledger ledger;
  Register(ledger, kGpu, NumaGpus());
  Pod pod = OneContainerPod("p", 1);
  for (const std::optional<NumaHint>& hint :
       {std::optional<NumaHint>(), std::optional<NumaHint>(NumaHint{})}) {
    StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, hint);
    ASSERT_TRUE(plan.ok());
    EXPECT_THAT(plan->candidates, ElementsAre("gpu0", "gpu1", "gpu2", "gpu3"));
  }
}

TEST(LedgerNumaTest, AlignedHandOverDevicesPreferred) {
  Ledger ledger;
  Register(ledger, kGpu, NumaGpus());
  Pod pod = MakePod("p", {MakeContainer("init", 2)}, {MakeContainer("app", 1)});
  // init gets gpu0 (node 0) and gpu2 (node 1).
  StatusOr<AllocationPlan> pi = ledger.Plan(pod, "init", kGpu, 2, std::nullopt);
  ASSERT_TRUE(pi.ok());
  ASSERT_TRUE(ledger.Reserve(*pi, {"gpu0", "gpu2"}).ok());
  ASSERT_TRUE(ledger.Commit(pi->key, "r").ok());
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "app", kGpu, 1, NumaHint{{1}, true});
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(plan->must_include, ElementsAre("gpu2"));
}

// ------------------------------------------------------------------ preferred
// answers

class LedgerPreferredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Register(ledger_, kGpu, Gpus(4));
    Admit(ledger_, pod_, "init", 1);  // gpu0
    StatusOr<AllocationPlan> plan = ledger_.Plan(pod_, "app", kGpu, 2, std::nullopt);
    ASSERT_TRUE(plan.ok());
    plan_ = *plan;
    ASSERT_THAT(plan_.must_include, ElementsAre("gpu0"));
    ASSERT_THAT(plan_.candidates, ElementsAre("gpu1", "gpu2", "gpu3"));
  }
  Ledger ledger_;
  Pod pod_ = MakePod("p", {MakeContainer("init", 1)}, {MakeContainer("app", 2)});
  AllocationPlan plan_;
};

TEST_F(LedgerPreferredTest, ValidAnswerAccepted) {
  EXPECT_TRUE(ledger_.ValidatePreferred(plan_, {"gpu3", "gpu0"}).ok());
}

TEST_F(LedgerPreferredTest, WrongSizeRejected) {
  Status s = ledger_.ValidatePreferred(plan_, {"gpu0"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("has 1 devices, want 2"));
  EXPECT_THAT(ledger_.ValidatePreferred(plan_, {}).message(), HasSubstr("has 0 devices"));
}

TEST_F(LedgerPreferredTest, DuplicatesRejected) {
  EXPECT_THAT(ledger_.ValidatePreferred(plan_, {"gpu0", "gpu0"}).message(),
              HasSubstr("lists device \"gpu0\" more than once"));
}

TEST_F(LedgerPreferredTest, UnknownOrNotOfferedIdsRejected) {
  EXPECT_THAT(ledger_.ValidatePreferred(plan_, {"gpu0", "gpu9"}).message(),
              HasSubstr("names device \"gpu9\", which was not offered"));
  EXPECT_THAT(ledger_.ValidatePreferred(plan_, {"gpu0", ""}).message(), HasSubstr("not offered"));
}

TEST_F(LedgerPreferredTest, MissingMustIncludeRejected) {
  EXPECT_THAT(ledger_.ValidatePreferred(plan_, {"gpu1", "gpu2"}).message(),
              HasSubstr("leaves out must-include device \"gpu0\""));
}

TEST_F(LedgerPreferredTest, ReusePlanHasNothingToValidate) {
  AllocationPlan reuse = plan_;
  reuse.reuse = true;
  EXPECT_EQ(ledger_.ValidatePreferred(reuse, {"gpu0", "gpu1"}).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(LedgerPreferredTest, SwapDefaultReservationForPreferredOne) {
  ASSERT_TRUE(ledger_.Reserve(plan_, ledger_.DefaultChoice(plan_)).ok());
  EXPECT_THAT(*ledger_.Reservation(plan_.key), ElementsAre("gpu0", "gpu1"));
  ASSERT_TRUE(ledger_.ValidatePreferred(plan_, {"gpu0", "gpu3"}).ok());
  ASSERT_TRUE(ledger_.Reserve(plan_, {"gpu0", "gpu3"}).ok());
  EXPECT_THAT(*ledger_.Reservation(plan_.key), ElementsAre("gpu0", "gpu3"));
  // gpu1 is free again.
  StatusOr<AllocationPlan> other =
      ledger_.Plan(OneContainerPod("q", 2), "main", kGpu, 2, std::nullopt);
  ASSERT_TRUE(other.ok());
  EXPECT_THAT(other->candidates, ElementsAre("gpu1", "gpu2"));
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

TEST_F(LedgerPreferredTest, SwapFailsCleanlyWhenAnotherAdmissionTookADevice) {
  ASSERT_TRUE(ledger_.Reserve(plan_, ledger_.DefaultChoice(plan_)).ok());
  Pod q = OneContainerPod("q", 1);
  StatusOr<AllocationPlan> other = ledger_.Plan(q, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(ledger_.Reserve(*other, {"gpu3"}).ok());
  Status s = ledger_.Reserve(plan_, {"gpu0", "gpu3"});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("\"gpu3\" of resource \"vendor.com/gpu\" is reserved by another"));
  // The default reservation is kept.
  EXPECT_THAT(*ledger_.Reservation(plan_.key), ElementsAre("gpu0", "gpu1"));
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

// ------------------------------------------------------------------
// reservations

TEST(LedgerReserveTest, ReservedDevicesAreNeverOfferedToOthers) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod a = OneContainerPod("a", 1);
  StatusOr<AllocationPlan> pa = ledger.Plan(a, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pa.ok());
  ASSERT_TRUE(ledger.Reserve(*pa, {"gpu0"}).ok());
  Pod b = OneContainerPod("b", 1);
  StatusOr<AllocationPlan> pb = ledger.Plan(b, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pb.ok());
  EXPECT_THAT(pb->candidates, ElementsAre("gpu1"));
  Status s = ledger.Reserve(*pb, {"gpu0"});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("\"gpu0\""));
  EXPECT_FALSE(ledger.Reservation(pb->key).has_value());
}

TEST(LedgerReserveTest, ReleaseFreesDevices) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(1));
  Pod a = OneContainerPod("a", 1);
  StatusOr<AllocationPlan> pa = ledger.Plan(a, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pa.ok());
  ASSERT_TRUE(ledger.Reserve(*pa, {"gpu0"}).ok());
  Pod b = OneContainerPod("b", 1);
  EXPECT_THAT(ledger.Plan(b, "main", kGpu, 1, std::nullopt).status().message(),
              HasSubstr("Requested: 1, Available: 0"));
  ledger.ReleaseReservation(pa->key);
  ledger.ReleaseReservation(pa->key);  // idempotent
  EXPECT_TRUE(ledger.Plan(b, "main", kGpu, 1, std::nullopt).ok());
  // A released reservation cannot be committed.
  StatusOr<checkpoint::Change> c = ledger.Commit(pa->key, "r");
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(c.status().message(), HasSubstr("no reservation to commit for pod \"a\""));
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerReserveTest, BadReservationsChangeNothing) {
  Ledger ledger;
  Register(ledger, kGpu, {{"gpu0", true, {}}, {"gpu1", true, {}}, {"gpu2", false, {}}});
  Pod pod = OneContainerPod("p", 2);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 2, std::nullopt);
  ASSERT_TRUE(plan.ok());
  struct Case {
    std::vector<std::string> ids;
    StatusCode code;
    std::string text;
  };
  for (const Case& c : std::vector<Case>{
           {{"gpu0"}, StatusCode::kInvalidArgument, "has 1 devices, want 2"},
           {{"gpu0", "gpu0"}, StatusCode::kInvalidArgument, "lists a device twice"},
           {{"gpu0", "gpu9"},
            StatusCode::kFailedPrecondition,
            "\"gpu9\" of resource \"vendor.com/gpu\" is not registered"},
           {{"gpu0", "gpu2"},
            StatusCode::kFailedPrecondition,
            "\"gpu2\" of resource \"vendor.com/gpu\" is unhealthy"},
       }) {
    Status s = ledger.Reserve(*plan, c.ids);
    EXPECT_EQ(s.code(), c.code) << c.text;
    EXPECT_THAT(s.message(), HasSubstr(c.text));
    EXPECT_FALSE(ledger.Reservation(plan->key).has_value());
  }
  EXPECT_EQ(ledger.GetCapacity().resources.at(kGpu).allocatable, 2);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerReserveTest, AllocatedDeviceCannotBeReserved) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Admit(ledger, OneContainerPod("a", 1), "main", 1);
  Pod b = OneContainerPod("b", 1);
  StatusOr<AllocationPlan> pb = ledger.Plan(b, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pb.ok());
  EXPECT_THAT(ledger.Reserve(*pb, {"gpu0"}).message(),
              HasSubstr("\"gpu0\" of resource \"vendor.com/gpu\" is allocated "
                        "to pod \"a\" container \"main\""));
}

TEST(LedgerReserveTest, ResourceRemovedBeforeReserve) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = OneContainerPod("p", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  (void)ledger.RemoveResource(kGpu);
  EXPECT_EQ(ledger.Reserve(*plan, {"gpu0"}).message(),
            "cannot allocate unregistered device vendor.com/gpu");
}

TEST(LedgerReserveTest, SecondAdmissionOfSameContainerIsAborted) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = OneContainerPod("p", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(ledger.Reserve(*plan, {"gpu0"}).ok());
  StatusOr<AllocationPlan> again = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  EXPECT_EQ(again.status().code(), StatusCode::kAborted);
  EXPECT_THAT(again.status().message(), HasSubstr("already in progress"));
}

TEST(LedgerReserveTest, RecordedContainerCannotReserveAgain) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = OneContainerPod("p", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  Admit(ledger, pod, "main", 1);
  EXPECT_THAT(ledger.Reserve(*plan, {"gpu1"}).message(), HasSubstr("already has devices recorded"));
}

TEST(LedgerReserveTest, DeviceForgottenWhileReservedIsStillCommitted) {
  Ledger ledger;
  Register(ledger, kGpu, {{"gpu0", true, {0}}, {"gpu1", true, {0}}});
  Pod pod = OneContainerPod("p", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(ledger.Reserve(*plan, {"gpu0"}).ok());
  Register(ledger, kGpu, {{"gpu1", true, {0}}});
  EXPECT_TRUE(ledger.CheckInvariants().ok());
  StatusOr<checkpoint::Change> c = ledger.Commit(plan->key, "r");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->upserts[0].device_ids, (checkpoint::DevicesPerNuma{{kNoNumaNode, {"gpu0"}}}));
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerReserveTest, UndoCommitWhenCheckpointWriteFails) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = OneContainerPod("p", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(ledger.Reserve(*plan, {"gpu1"}).ok());
  ASSERT_TRUE(ledger.Commit(plan->key, "r").ok());
  EXPECT_EQ(ledger.UndoCommit({"p", "other", kGpu}).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ledger.UndoCommit(plan->key).ok());
  EXPECT_FALSE(ledger.Entry(plan->key).has_value());
  EXPECT_THAT(*ledger.Reservation(plan->key), ElementsAre("gpu1"));
  EXPECT_TRUE(ledger.CheckInvariants().ok());
  EXPECT_THAT(ledger.UndoCommit(plan->key).message(), HasSubstr("no commit to revert"));
  ledger.ReleaseReservation(plan->key);
  EXPECT_EQ(ledger.GetCapacity().resources.at(kGpu).allocatable, 2);
  StatusOr<AllocationPlan> again = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->reuse);
}

// ------------------------------------------------------------------ removal,
// GC

TEST(LedgerRemoveTest, RemovePodFreesDevicesAndReservations) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = MakePod("p", {}, {MakeContainer("a", 1), MakeContainer("b", 1)});
  Admit(ledger, pod, "a", 1);
  StatusOr<AllocationPlan> pb = ledger.Plan(pod, "b", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pb.ok());
  ASSERT_TRUE(ledger.Reserve(*pb, ledger.DefaultChoice(*pb)).ok());
  checkpoint::Change c = ledger.RemovePod("p");
  EXPECT_THAT(c.removed_pods, ElementsAre("p"));
  EXPECT_THAT(ledger.PodEntries("p"), IsEmpty());
  EXPECT_FALSE(ledger.Reservation(pb->key).has_value());
  // The admission in flight then fails to commit.
  EXPECT_FALSE(ledger.Commit(pb->key, "r").ok());
  EXPECT_TRUE(ledger.Plan(OneContainerPod("q", 2), "main", kGpu, 2, std::nullopt).ok());
  EXPECT_TRUE(ledger.RemovePod("unknown").empty());
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerRemoveTest, GarbageCollectionKeepsActivePodsAndReservations) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(4));
  Admit(ledger, OneContainerPod("a", 1), "main", 1);
  Admit(ledger, OneContainerPod("b", 1), "main", 1);
  Admit(ledger, OneContainerPod("c", 1), "main", 1);
  Pod pending = OneContainerPod("d", 1);
  StatusOr<AllocationPlan> pd = ledger.Plan(pending, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(pd.ok());
  ASSERT_TRUE(ledger.Reserve(*pd, ledger.DefaultChoice(*pd)).ok());
  checkpoint::Change c = ledger.RetainOnlyPods({"b"});
  EXPECT_THAT(c.removed_pods, ElementsAre("a", "c"));
  std::vector<checkpoint::PodDevicesEntry> all = ledger.AllEntries();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].pod_uid, "b");
  EXPECT_TRUE(ledger.Reservation(pd->key).has_value());
  EXPECT_TRUE(ledger.Commit(pd->key, "r").ok());
  EXPECT_TRUE(ledger.RetainOnlyPods({"b", "d"}).empty());
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

// ------------------------------------------------------------------ queries

TEST(LedgerQueryTest, EntriesByContainerPodAndAll) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(4));
  Register(ledger, kNic, Gpus(4));
  Pod pod = MakePod("p", {}, {MakeContainer("a", 1), MakeContainer("b", 1)});
  pod.containers[0].limits[kNic] = Quantity::FromInt(1);
  Admit(ledger, pod, "a", 1, std::nullopt, kGpu);
  Admit(ledger, pod, "a", 1, std::nullopt, kNic);
  Admit(ledger, pod, "b", 1, std::nullopt, kGpu);
  Admit(ledger, OneContainerPod("q", 1), "main", 1);
  std::vector<checkpoint::PodDevicesEntry> a = ledger.ContainerEntries("p", "a");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].resource_name, kGpu);
  EXPECT_EQ(a[1].resource_name, kNic);
  EXPECT_EQ(a[0].alloc_response, "resp-a");
  EXPECT_EQ(ledger.PodEntries("p").size(), 3u);
  EXPECT_EQ(ledger.AllEntries().size(), 4u);
  EXPECT_THAT(ledger.ContainerEntries("p", "zzz"), IsEmpty());
  EXPECT_FALSE(ledger.Entry({"nope", "a", kGpu}).has_value());
  EXPECT_THAT(ledger.Resources(), ElementsAre(kGpu, kNic));
}

// ------------------------------------------------------------------ restart

TEST(LedgerRestoreTest, RestoredEntriesAreAllocatedResourcesWaitForPlugin) {
  checkpoint::CheckpointData data;
  data.entries.push_back({"p", "main", kGpu, {{0, {"gpu1"}}}, "resp"});
  data.entries.push_back({"", "main", kGpu, {{0, {"gpu2"}}}, "bad"});
  data.registered_devices[kGpu] = {"gpu0", "gpu1", "gpu2"};
  Ledger ledger;
  EXPECT_THAT(ledger.Restore(data).skipped,
              ElementsAre(SkippedCheckpointEntry{"", "main", kGpu, "", "",
                                                 "empty pod uid, container or resource name"}));
  EXPECT_TRUE(ledger.CheckInvariants().ok());
  // Registered but no devices until the plugin comes back
  // (docs/kubelet-rules.md#kubelet-restart).
  EXPECT_EQ(ledger.GetCapacity().resources.at(kGpu), (ResourceCapacity{0, 0}));
  Pod pod = OneContainerPod("p", 1);
  EXPECT_THAT(ledger.Plan(pod, "main", kGpu, 1, std::nullopt).status().message(),
              HasSubstr("no healthy devices present"));
  Register(ledger, kGpu, {{"gpu0", true, {0}}, {"gpu1", true, {0}}});
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->reuse);
  EXPECT_THAT(plan->reuse_ids, ElementsAre("gpu1"));
  // gpu1 is held: another pod gets gpu0 only.
  Pod other = OneContainerPod("q", 1);
  EXPECT_THAT(ledger.Plan(other, "main", kGpu, 1, std::nullopt)->candidates, ElementsAre("gpu0"));
}

TEST(LedgerRestoreTest, DeviceInTwoPodsIsRestoredOnce) {
  checkpoint::CheckpointData data;
  data.entries.push_back({"p", "init", kGpu, {{kNoNumaNode, {"gpu0"}}}, "r"});
  data.entries.push_back(
      {"p", "app", kGpu, {{kNoNumaNode, {"gpu0"}}}, "r"});  // same pod: hand-over
  data.entries.push_back({"q", "main", kGpu, {{kNoNumaNode, {"gpu0", "gpu1"}}}, "r"});  // conflict
  data.entries.push_back({"q", "main", kNic, {{kNoNumaNode, {"gpu0"}}}, "r"});  // other resource
  data.registered_devices[kGpu] = {};
  Ledger ledger;
  // Issue 16: the skipped entry used to be only counted (`skipped=1` in the
  // log); the report names it, the device and the pod that holds it.
  EXPECT_THAT(ledger.Restore(data).skipped,
              ElementsAre(SkippedCheckpointEntry{"q", "main", kGpu, "gpu0", "p",
                                                 "device held by another pod"}));
  EXPECT_EQ(ledger.AllEntries().size(), 3u);
  EXPECT_FALSE(ledger.Entry({"q", "main", kGpu}).has_value());
  EXPECT_TRUE(ledger.Entry({"q", "main", kNic}).has_value());
  EXPECT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants();
}

TEST(LedgerRestoreTest, CheckpointDataRoundTrip) {
  Ledger ledger;
  Register(ledger, kGpu, NumaGpus());
  Pod pod = MakePod("p", {MakeContainer("init", 1)}, {MakeContainer("app", 2)});
  Admit(ledger, pod, "init", 1);
  Admit(ledger, pod, "app", 2);
  checkpoint::CheckpointData data = ledger.ToCheckpointData();
  EXPECT_EQ(data.entries.size(), 2u);
  EXPECT_THAT(data.registered_devices.at(kGpu), ElementsAre("gpu0", "gpu1", "gpu2", "gpu3"));
  Ledger restored;
  EXPECT_THAT(restored.Restore(data).skipped, IsEmpty());
  EXPECT_EQ(restored.AllEntries(), ledger.AllEntries());
  EXPECT_TRUE(restored.CheckInvariants().ok());
  // A restore replaces everything.
  EXPECT_THAT(restored.Restore({}).skipped, IsEmpty());
  EXPECT_THAT(restored.AllEntries(), IsEmpty());
  EXPECT_TRUE(restored.GetCapacity().resources.empty());
}

// ------------------------------------------------------------------ bad input

TEST(LedgerBadInputTest, PlanRejectsBadArguments) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = OneContainerPod("p", 1);
  StatusOr<AllocationPlan> r = ledger.Plan(pod, "nope", kGpu, 1, std::nullopt);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "pod \"p\" has no container \"nope\"");
  Pod no_uid = OneContainerPod("", 1);
  EXPECT_THAT(ledger.Plan(no_uid, "main", kGpu, 1, std::nullopt).status().message(),
              HasSubstr("empty uid"));
  EXPECT_THAT(ledger.Plan(pod, "main", "", 1, std::nullopt).status().message(),
              HasSubstr("empty resource name"));
  for (int64_t n : {int64_t{0}, int64_t{-1}, int64_t{1} << 40}) {
    StatusOr<AllocationPlan> bad = ledger.Plan(pod, "main", kGpu, n, std::nullopt);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(bad.status().message(), HasSubstr("invalid device count " + std::to_string(n)));
  }
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(LedgerBadInputTest, HugeRequestIsUnavailableNotACrash) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = OneContainerPod("p", 1);
  EXPECT_EQ(
      ledger.Plan(pod, "main", kGpu, Quantity::kMaxDeviceCount, std::nullopt).status().message(),
      "requested number of devices unavailable for vendor.com/gpu. Requested: "
      "2147483647, Available: 2");
}

TEST(LedgerBadInputTest, ContainerHintsForUnknownContainer) {
  Ledger ledger;
  Register(ledger, kGpu, NumaGpus());
  Pod pod = OneContainerPod("p", 1);
  EXPECT_EQ(ledger.ContainerTopologyHints(pod, "nope").status().code(), StatusCode::kNotFound);
}

// ---------------------------------------------------------- the checker

TEST(LedgerInvariantTest, CatchesADeviceInTwoPods) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Admit(ledger, OneContainerPod("a", 1), "main", 1);  // gpu0
  ledger.ForceRecordForTest({"b", "main", kGpu, {{kNoNumaNode, {"gpu0"}}}, "r"},
                            ContainerKind::kApp);
  Status s = ledger.CheckInvariants();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("device \"gpu0\" of \"vendor.com/gpu\" is "
                                     "held by pods \"a\" and \"b\""));
}

TEST(LedgerInvariantTest, CatchesTwoRunningContainersSharingADevice) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  ledger.ForceRecordForTest({"p", "a", kGpu, {{kNoNumaNode, {"gpu1"}}}, "r"}, ContainerKind::kApp);
  ledger.ForceRecordForTest({"p", "init", kGpu, {{kNoNumaNode, {"gpu1"}}}, "r"},
                            ContainerKind::kInit);
  EXPECT_TRUE(ledger.CheckInvariants().ok());  // hand-over from an init container
  ledger.ForceRecordForTest({"p", "side", kGpu, {{kNoNumaNode, {"gpu1"}}}, "r"},
                            ContainerKind::kSidecar);
  EXPECT_THAT(ledger.CheckInvariants().message(),
              HasSubstr("held by two running containers of pod \"p\""));
}

TEST(LedgerInvariantTest, CatchesAReservedDeviceThatIsAlsoAllocated) {
  Ledger ledger;
  Register(ledger, kGpu, Gpus(2));
  Pod pod = OneContainerPod("p", 1);
  StatusOr<AllocationPlan> plan = ledger.Plan(pod, "main", kGpu, 1, std::nullopt);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(ledger.Reserve(*plan, {"gpu1"}).ok());
  ledger.ForceRecordForTest({"q", "main", kGpu, {{kNoNumaNode, {"gpu1"}}}, "r"},
                            ContainerKind::kApp);
  EXPECT_THAT(ledger.CheckInvariants().message(),
              HasSubstr("reserved by pod \"p\" container \"main\" resource "
                        "\"vendor.com/gpu\" is also allocated"));
}

// ---------------------------------------------------------- property test

// Random sequences of every mutating operation, with CheckInvariants() and an
// independent check of "no device in two running containers" after each step.
class LedgerPropertyTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(LedgerPropertyTest, InvariantsHoldAfterEveryStep) {
  std::mt19937 rng(GetParam());
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  Ledger ledger;
  const std::vector<std::string> resources = {kGpu, kNic};
  const int kDevices = 8;
  // Pods: uid -> spec. Each has up to 2 init (maybe sidecar) and 2 app
  // containers.
  std::map<std::string, Pod> pods;
  int next_pod = 0;
  struct InFlight {
    AllocationPlan plan;
  };
  std::vector<InFlight> in_flight;
  int commits = 0;
  int errors = 0;
  int handovers = 0;
  int preferred = 0;
  int forged_accepted = 0;

  auto random_snapshot = [&]() {
    std::vector<LedgerDevice> snap;
    for (int i = 0; i < kDevices; ++i) {
      if (pick(6) == 0) continue;  // sometimes missing
      LedgerDevice d{"dev" + std::to_string(i), pick(5) != 0, {}};
      if (pick(3) != 0) d.numa_nodes.push_back(i % 2);
      snap.push_back(d);
      if (pick(20) == 0) snap.push_back(d);  // duplicate
    }
    return snap;
  };

  for (int step = 0; step < 3000; ++step) {
    const std::string& resource = resources[pick(2)];
    switch (pick(9)) {
      case 0: {
        std::vector<LedgerDevice> before = ledger.Devices(resource);
        StatusOr<SnapshotReport> r = ledger.SetDevices(resource, random_snapshot());
        ASSERT_TRUE(r.ok());
        ASSERT_EQ(r->health_changes, ExpectedHealthChanges(before, ledger.Devices(resource)));
        break;
      }
      case 1:
      case 2:
      case 3: {  // Plan + Reserve, maybe commit at once
        Pod pod;
        if (pods.empty() || pick(3) == 0) {
          std::vector<Container> inits;
          for (int i = 0, n = pick(3); i < n; ++i) {
            inits.push_back(MakeContainer("i" + std::to_string(i), 1 + pick(2), pick(3) == 0));
          }
          std::vector<Container> apps;
          for (int i = 0, n = 1 + pick(2); i < n; ++i)
            apps.push_back(MakeContainer("a" + std::to_string(i), 1 + pick(3)));
          pod = MakePod("pod" + std::to_string(next_pod++), inits, apps);
          pods[pod.uid] = pod;
        } else {
          auto it = pods.begin();
          std::advance(it, pick(static_cast<int>(pods.size())));
          pod = it->second;
        }
        std::vector<const Container*> all;
        for (const Container& c : pod.init_containers) all.push_back(&c);
        for (const Container& c : pod.containers) all.push_back(&c);
        const Container* c = all[pick(static_cast<int>(all.size()))];
        if (pick(2) == 0) {
          // Mostly admit in start order, as a node agent does: the first
          // container without devices of this resource yet.
          for (const Container* next : all) {
            if (!ledger.Entry({pod.uid, next->name, resource})) {
              c = next;
              break;
            }
          }
        }
        int64_t count = c->limits.at(kGpu).FloorUnits();
        std::optional<NumaHint> hint;
        if (pick(2) == 0) hint = NumaHint{{pick(2)}, true};
        StatusOr<AllocationPlan> plan = ledger.Plan(pod, c->name, resource, count, hint);
        if (!plan.ok()) {
          ++errors;
          break;
        }
        if (plan->reuse) break;
        for (const std::string& id : plan->must_include) {
          for (const checkpoint::PodDevicesEntry& e : ledger.PodEntries(pod.uid)) {
            std::vector<std::string> held = FlattenDeviceIds(e.device_ids);
            if (e.resource_name == resource && std::count(held.begin(), held.end(), id))
              ++handovers;
          }
        }
        std::vector<std::string> choice = ledger.DefaultChoice(*plan);
        if (plan->real_choice && pick(2) == 0) {
          // A "plugin" answer: shuffled offer, sometimes invalid.
          std::vector<std::string> offer = plan->candidates;
          std::shuffle(offer.begin(), offer.end(), rng);
          std::vector<std::string> answer = plan->must_include;
          for (const std::string& id : offer) {
            if (static_cast<int64_t>(answer.size()) < plan->size) answer.push_back(id);
          }
          if (pick(4) == 0) answer.push_back("bogus");
          if (ledger.ValidatePreferred(*plan, answer).ok()) {
            choice = answer;
            ++preferred;
          }
        }
        if (pick(6) == 0) {
          // A forged reservation: random ids, some claimed as hand-over.
          // Reserve must refuse anything unsafe; the invariant check below
          // catches it if it does not.
          AllocationPlan forged = *plan;
          std::vector<std::string> ids;
          while (static_cast<int64_t>(ids.size()) < plan->size) {
            std::string id =
                pick(10) == 0 ? std::string("bogus") : "dev" + std::to_string(pick(kDevices));
            if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
          }
          forged.must_include.clear();
          for (const std::string& id : ids) {
            if (pick(2) == 0) forged.must_include.push_back(id);
          }
          if (ledger.Reserve(forged, ids).ok()) {
            ++forged_accepted;
            in_flight.push_back({forged});
          }
          break;
        }
        ASSERT_TRUE(ledger.Reserve(*plan, choice).ok());
        if (pick(2) == 0) {
          ASSERT_TRUE(ledger.Commit(plan->key, "r").ok());
          ++commits;
        } else {
          in_flight.push_back({*plan});
        }
        break;
      }
      case 4: {  // finish an admission in flight
        if (in_flight.empty()) break;
        size_t i = static_cast<size_t>(pick(static_cast<int>(in_flight.size())));
        InFlight f = in_flight[i];
        in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
        if (pick(3) == 0) {
          ledger.ReleaseReservation(f.plan.key);  // the RPC failed
        } else if (ledger.Commit(f.plan.key, "r").ok()) {
          ++commits;
          if (pick(5) == 0) {
            ASSERT_TRUE(ledger.UndoCommit(f.plan.key).ok());
          }
          if (ledger.Reservation(f.plan.key)) ledger.ReleaseReservation(f.plan.key);
        }
        break;
      }
      case 5: {
        if (pods.empty()) break;
        auto it = pods.begin();
        std::advance(it, pick(static_cast<int>(pods.size())));
        (void)ledger.RemovePod(it->first);
        pods.erase(it);
        break;
      }
      case 6: {
        (void)ledger.MarkAllUnhealthy(resource);
        break;
      }
      case 7: {
        if (pick(4) == 0) (void)ledger.RemoveResource(resource);
        std::set<std::string> active;
        for (const auto& [uid, pod] : pods) {
          if (pick(4) != 0) active.insert(uid);
        }
        (void)ledger.RetainOnlyPods(active);
        break;
      }
      case 8: {
        if (!pods.empty()) {
          // Hints are well formed: sorted nodes, preferred = smallest.
          auto it = pods.begin();
          std::advance(it, pick(static_cast<int>(pods.size())));
          const Container& c = it->second.containers[0];
          ResourceHints h = ledger.TopologyHints(it->second, c.name, resource, 1 + pick(3));
          if (h && !h->empty()) {
            size_t smallest = h->front().nodes.size();
            for (const NumaHint& hint : *h) {
              ASSERT_TRUE(std::is_sorted(hint.nodes.begin(), hint.nodes.end()));
              ASSERT_GE(hint.nodes.size(), smallest);
              if (hint.preferred) {
                ASSERT_EQ(hint.nodes.size(), smallest);
              }
            }
          }
        }
        if (pick(10) == 0) {
          // Restart: only committed state survives.
          in_flight.clear();
          (void)ledger.Restore(ledger.ToCheckpointData());
        }
        break;
      }
    }
    Status inv = ledger.CheckInvariants();
    ASSERT_TRUE(inv.ok()) << "step " << step << ": " << inv;
    // Independent check: among running containers (sidecars and apps, per the
    // pod specs) no device is held twice.
    std::map<std::pair<std::string, std::string>, std::string> running_holder;
    for (const checkpoint::PodDevicesEntry& e : ledger.AllEntries()) {
      auto pod = pods.find(e.pod_uid);
      std::optional<ContainerKind> kind =
          pod == pods.end() ? std::nullopt : pod->second.KindOf(e.container_name);
      if (kind == ContainerKind::kInit) continue;
      for (const std::string& id : FlattenDeviceIds(e.device_ids)) {
        auto [it, inserted] =
            running_holder.try_emplace({e.resource_name, id}, e.pod_uid + "/" + e.container_name);
        ASSERT_TRUE(inserted) << "step " << step << ": " << id << " held by " << it->second
                              << " and " << e.pod_uid << "/" << e.container_name;
      }
    }
  }
  // The sequence exercised the interesting paths.
  EXPECT_GT(commits, 50);
  EXPECT_GT(errors, 10);
  RecordProperty("commits", commits);
  RecordProperty("errors", errors);
  RecordProperty("handovers", handovers);
  RecordProperty("preferred", preferred);
  RecordProperty("forged_accepted", forged_accepted);
  EXPECT_GT(handovers, 0);
  EXPECT_GT(preferred, 0);
  EXPECT_GT(forged_accepted, 0);  // safe forged picks are fine
}

INSTANTIATE_TEST_SUITE_P(Seeds, LedgerPropertyTest,
                         ::testing::Values(1u, 2u, 3u, 4u, 5u, 42u, 2026u, 90210u));

}  // namespace
}  // namespace kdm::devicemanager
