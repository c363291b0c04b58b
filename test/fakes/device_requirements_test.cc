// CheckDeviceRequirements: which containers and resources the node agent
// checks, and what its messages say.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "kdm/devicemanager/quantity.h"
#include "kdm/fakes/node_agent.h"

namespace kdm::fakes {
namespace {

using devicemanager::Container;
using devicemanager::Pod;
using devicemanager::Quantity;

Container WithGpus(const std::string& name, int n, const std::string& require) {
  Container c;
  c.name = name;
  c.limits["nvidia.com/gpu"] = *Quantity::Parse(std::to_string(n));
  if (!require.empty()) c.env = {{"NVIDIA_REQUIRE_CUDA", require}};
  return c;
}

const std::map<std::string, k8s::DeviceAttributes> kNode = {
    {"nvidia.com/gpu", *k8s::ParseAttributes("cuda=11.8,driver=520.61.05,brand=tesla")}};

TEST(DeviceRequirementsTest, AppAndInitContainersAreChecked) {
  Pod pod;
  pod.containers = {WithGpus("main", 1, "cuda>=11.0")};
  EXPECT_TRUE(CheckDeviceRequirements(pod, kNode).ok());
  pod.init_containers = {WithGpus("warmup", 1, "cuda>=12.2")};
  Status s = CheckDeviceRequirements(pod, kNode);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "container warmup, resource nvidia.com/gpu: NVIDIA_REQUIRE_CUDA: cuda 11.8 does not "
            "satisfy cuda>=12.2");
}

TEST(DeviceRequirementsTest, OnlyResourcesWithAttributesAndANonZeroLimit) {
  Pod pod;
  pod.containers = {WithGpus("zero", 0, "cuda>=99")};
  EXPECT_TRUE(CheckDeviceRequirements(pod, kNode).ok());
  Container fpga;
  fpga.name = "fpga";
  fpga.limits["example.com/fpga"] = *Quantity::Parse("1");
  fpga.env = {{"NVIDIA_REQUIRE_CUDA", "cuda>=99"}};
  pod.containers = {fpga};
  EXPECT_TRUE(CheckDeviceRequirements(pod, kNode).ok());
  pod.containers = {WithGpus("main", 1, "cuda>=99")};
  EXPECT_TRUE(CheckDeviceRequirements(pod, {}).ok());
}

TEST(DeviceRequirementsTest, MalformedRequirementNamesContainerAndToken) {
  Pod pod;
  pod.containers = {WithGpus("main", 1, "cuda>=12,,")};
  Status s = CheckDeviceRequirements(pod, kNode);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "container main: NVIDIA_REQUIRE_CUDA: an empty constraint in 'cuda>=12,,'");
}

TEST(DeviceRequirementsTest, DisableRequireSkipsTheContainer) {
  Pod pod;
  pod.containers = {WithGpus("main", 1, "cuda>=99")};
  pod.containers[0].env.emplace_back("NVIDIA_DISABLE_REQUIRE", "true");
  EXPECT_TRUE(CheckDeviceRequirements(pod, kNode).ok());
}

}  // namespace
}  // namespace kdm::fakes
