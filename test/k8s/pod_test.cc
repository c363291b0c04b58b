// The pod's device request rules (k8s/pod.h): one container's counts
// (request == limit, whole numbers, the quantity grammar) and the pod's
// effective request (apps summed, sidecars, the largest init container).
#include "kdm/k8s/pod.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "kdm/k8s/names.h"

namespace kdm::k8s {
namespace {

using ::testing::HasSubstr;

constexpr char kGpu[] = "vendor.com/gpu";

bool Extended(const std::string& r) { return IsExtendedResourceName(r); }

Container WithLimit(const std::string& name, const std::string& limit, bool sidecar = false) {
  Container c;
  c.name = name;
  c.restartable = sidecar;
  StatusOr<Quantity> q = Quantity::Parse(limit);
  EXPECT_TRUE(q.ok()) << q.status();
  if (q.ok()) c.limits[kGpu] = *q;
  return c;
}

TEST(PodRequestsTest, ALimitAloneIsTheRequest) {
  StatusOr<std::map<std::string, int64_t>> r =
      ContainerDeviceRequests(WithLimit("main", "2"), Extended);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::map<std::string, int64_t>{{kGpu, 2}}));
}

TEST(PodRequestsTest, TheFullQuantityGrammar) {
  for (const auto& [text, count] :
       std::map<std::string, int64_t>{{"2k", 2000}, {"1e3", 1000}, {"3000m", 3}, {"0", 0}}) {
    StatusOr<std::map<std::string, int64_t>> r =
        ContainerDeviceRequests(WithLimit("main", text), Extended);
    ASSERT_TRUE(r.ok()) << text << ": " << r.status();
    if (count == 0) {
      EXPECT_TRUE(r->empty()) << text;
    } else {
      EXPECT_EQ(r->at(kGpu), count) << text;
    }
  }
}

TEST(PodRequestsTest, CountsTheKubeletRefuses) {
  for (const std::string& text :
       std::vector<std::string>{"1000000000000000000", "9223372036854775807", "1.5", "-1"}) {
    StatusOr<std::map<std::string, int64_t>> r =
        ContainerDeviceRequests(WithLimit("main", text), Extended);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("container \"main\" resource \"vendor.com/gpu\""));
    EXPECT_THAT(r.status().message(), HasSubstr("\"" + text + "\""));
  }
}

TEST(PodRequestsTest, RequestsMustEqualLimits) {
  Container c = WithLimit("main", "2");
  c.requests[kGpu] = Quantity::FromInt(1);
  StatusOr<std::map<std::string, int64_t>> r = ContainerDeviceRequests(c, Extended);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "container \"main\" requests 1 of resource \"vendor.com/gpu\" but its limit is 2; "
            "devices need request == limit");
  // Equal values in other spellings are equal.
  c.requests[kGpu] = *Quantity::Parse("2000m");
  EXPECT_TRUE(ContainerDeviceRequests(c, Extended).ok());

  Container only_request;
  only_request.name = "main";
  only_request.requests[kGpu] = Quantity::FromInt(1);
  r = ContainerDeviceRequests(only_request, Extended);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("without a limit"));
}

TEST(PodRequestsTest, ResourcesThatAreNotDevicesAreNotRead) {
  Container c;
  c.name = "main";
  c.limits["cpu"] = *Quantity::Parse("1.5");
  c.requests["memory"] = *Quantity::Parse("1Gi");
  StatusOr<std::map<std::string, int64_t>> r = ContainerDeviceRequests(c, Extended);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->empty());
}

TEST(PodRequestsTest, InitContainersSidecarsAndApps) {
  Pod pod;
  pod.init_containers = {WithLimit("side", "1", true), WithLimit("init", "3")};
  pod.containers = {WithLimit("a", "1"), WithLimit("b", "1")};
  // sidecar 1 + init 3 at once = 4; apps 2 + sidecar 1 = 3.
  EXPECT_EQ(*EffectiveDeviceRequests(pod, Extended), (std::map<std::string, int64_t>{{kGpu, 4}}));
  pod.containers.push_back(WithLimit("c", "3"));
  EXPECT_EQ(*EffectiveDeviceRequests(pod, Extended), (std::map<std::string, int64_t>{{kGpu, 6}}));
  // An init container before the sidecar does not run next to it.
  Pod early;
  early.init_containers = {WithLimit("init", "3"), WithLimit("side", "1", true)};
  EXPECT_EQ(*EffectiveDeviceRequests(early, Extended), (std::map<std::string, int64_t>{{kGpu, 3}}));
  // No devices: an empty answer, not a zero entry.
  Pod none;
  none.containers = {WithLimit("a", "0")};
  EXPECT_TRUE(EffectiveDeviceRequests(none, Extended)->empty());
}

TEST(PodRequestsTest, TenHugeContainersAreRefusedNotWrapped) {
  // 10 x 999999999999999999 wraps an int64 sum; each count is refused first.
  Pod pod;
  for (int i = 0; i < 10; ++i) {
    pod.containers.push_back(WithLimit("c" + std::to_string(i), "999999999999999999"));
  }
  StatusOr<std::map<std::string, int64_t>> r = EffectiveDeviceRequests(pod, Extended);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("too large for a device count"));
  EXPECT_THAT(r.status().message(), HasSubstr("container \"c0\""));
}

TEST(PodRequestsTest, TheLargestCountsStillSum) {
  // Two containers at the wire's limit sum to more than an int32, exactly.
  Pod pod;
  pod.containers = {WithLimit("a", "2147483647"), WithLimit("b", "2147483647")};
  StatusOr<std::map<std::string, int64_t>> r = EffectiveDeviceRequests(pod, Extended);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->at(kGpu), int64_t{2} * 2147483647);
}

}  // namespace
}  // namespace kdm::k8s
