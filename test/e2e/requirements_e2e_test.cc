// `kdm kubelet --attributes RESOURCE=KEY=VALUE,...` end to end: the built
// binary with a `kdm plugin` process, driven through manifests and status
// files. A container whose NVIDIA_REQUIRE_* the node's GPUs meet is
// admitted; one they do not meet is rejected with reason
// UnmetDeviceRequirement naming the constraint and the node's value and
// holds no device; NVIDIA_DISABLE_REQUIRE=true skips the check; a malformed
// requirement is rejected naming the token; bad --attributes values are
// usage errors (exit 2). Every wait is a bounded poll.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kdm/test/e2e/kubelet_fixture.h"

namespace kdm::e2e {
namespace {

using ::testing::HasSubstr;

// A pod whose one container asks for `gpus` GPUs and carries `env`.
std::string CudaPod(const std::string& name, int gpus,
                    const std::vector<std::pair<std::string, std::string>>& env) {
  std::string yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name +
                     "\nspec:\n  containers:\n  - name: main\n    env:\n";
  for (const auto& [k, v] : env) yaml += "    - {name: " + k + ", value: \"" + v + "\"}\n";
  if (gpus > 0) {
    yaml += "    resources:\n      limits:\n        nvidia.com/gpu: " + std::to_string(gpus) + "\n";
  }
  return yaml;
}

class RequirementsE2eTest : public KubeletE2eTest {};

TEST_F(RequirementsE2eTest, UnmetRequirementsAreRejectedAndMetOnesAdmitted) {
  StartKubelet({"--attributes",
                "nvidia.com/gpu=model=Tesla V100-SXM2-16GB,memory_mib=16160,driver=520.61.05,"
                "cuda=11.8,arch=7.0,brand=tesla"});
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();

  // The CUDA 12.2 image's requirement: neither group holds on this node.
  WriteFileAtomically(
      Manifests() + "/new.yaml",
      CudaPod("new-cuda", 2,
              {{"NVIDIA_REQUIRE_CUDA", "cuda>=12.2 brand=tesla,driver>=535,driver<536"}}));
  json rejected = WaitPhase("default_new-cuda", "Rejected");
  EXPECT_EQ(rejected["reason"], "UnmetDeviceRequirement");
  EXPECT_EQ(rejected["message"],
            "container main, resource nvidia.com/gpu: NVIDIA_REQUIRE_CUDA: cuda 11.8 does not "
            "satisfy cuda>=12.2 or driver 520.61.05 does not satisfy driver>=535");
  EXPECT_TRUE(Gpus(rejected).empty());

  // Met: an older image, two variables (AND).
  WriteFileAtomically(Manifests() + "/old.yaml",
                      CudaPod("old-cuda", 2,
                              {{"NVIDIA_REQUIRE_CUDA", "cuda>=11.0 brand=tesla,driver>=450"},
                               {"NVIDIA_REQUIRE_ARCH", "arch>=7.0"}}));
  json admitted = WaitPhase("default_old-cuda", "Admitted");
  EXPECT_EQ(Gpus(admitted).size(), 2u);

  // The same unmet requirement, turned off.
  WriteFileAtomically(Manifests() + "/off.yaml", CudaPod("off", 1,
                                                         {{"NVIDIA_REQUIRE_CUDA", "cuda>=12.2"},
                                                          {"NVIDIA_DISABLE_REQUIRE", "true"}}));
  EXPECT_EQ(Gpus(WaitPhase("default_off", "Admitted")).size(), 1u);

  // A container that asks for no GPU is not checked.
  WriteFileAtomically(Manifests() + "/cpu.yaml",
                      CudaPod("cpu-only", 0, {{"NVIDIA_REQUIRE_CUDA", "cuda>=99"}}));
  WaitPhase("default_cpu-only", "Admitted");

  // A malformed requirement names the token.
  WriteFileAtomically(Manifests() + "/typo.yaml",
                      CudaPod("typo", 1, {{"NVIDIA_REQUIRE_CUDA", "cdua>=11"}}));
  json typo = WaitPhase("default_typo", "Rejected");
  EXPECT_EQ(typo["reason"], "UnmetDeviceRequirement");
  EXPECT_THAT(typo["message"].get<std::string>(),
              HasSubstr("container main: NVIDIA_REQUIRE_CUDA: unknown key 'cdua' in 'cdua>=11'"));

  // Editing the manifest to a requirement the node meets admits the pod.
  WriteFileAtomically(Manifests() + "/new.yaml",
                      CudaPod("new-cuda", 2, {{"NVIDIA_REQUIRE_CUDA", "cuda>=11.8"}}));
  EXPECT_EQ(Gpus(WaitPhase("default_new-cuda", "Admitted")).size(), 2u);

  // The rejected pods hold nothing: 5 of 8 GPUs are in use, the last 3 fit.
  WriteFileAtomically(Manifests() + "/fill.yaml", CudaPod("fill", 3, {}));
  EXPECT_EQ(Gpus(WaitPhase("default_fill", "Admitted")).size(), 3u);
  EXPECT_THAT(kubelet_->Log(), HasSubstr("reason=UnmetDeviceRequirement"));
  EXPECT_TRUE(kubelet_->Running());
}

TEST_F(RequirementsE2eTest, WithoutAttributesNothingIsChecked) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();
  WriteFileAtomically(Manifests() + "/new.yaml",
                      CudaPod("new-cuda", 1, {{"NVIDIA_REQUIRE_CUDA", "cuda>=99"}}));
  EXPECT_EQ(Gpus(WaitPhase("default_new-cuda", "Admitted")).size(), 1u);
}

TEST_F(RequirementsE2eTest, BadAttributesAreUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--attributes", "nvidia.com/gpu"}, "no '='"},
      {{"--attributes", "gpu=cuda=12.4"}, "\"gpu\" is not an extended resource name"},
      {{"--attributes", "nvidia.com/gpu=cdua=12.4"}, "unknown attribute 'cdua'"},
      {{"--attributes", "nvidia.com/gpu=cuda=twelve"}, "attribute 'cuda': not a version"},
      {{"--attributes", "nvidia.com/gpu=cuda"}, "attribute item 'cuda' is not KEY=VALUE"},
      {{"--attributes", "nvidia.com/gpu=memory_mib=16GB"}, "not a whole number of MiB"},
      {{"--attributes", "nvidia.com/gpu=cuda=12.4", "--attributes", "nvidia.com/gpu=arch=9.0"},
       "resource nvidia.com/gpu given twice"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<std::string> args = {"kubelet", "--root", root_ + "/r"};
    args.insert(args.end(), cases[i].args.begin(), cases[i].args.end());
    Process p(args, root_ + "/usage" + std::to_string(i) + ".out");
    EXPECT_EQ(p.Wait(), 2) << p.Log();
    EXPECT_THAT(p.Log(), HasSubstr("kdm kubelet: --attributes "));
    EXPECT_THAT(p.Log(), HasSubstr(cases[i].message));
  }
  EXPECT_FALSE(fs::exists(root_ + "/r"));  // nothing was started
}

}  // namespace
}  // namespace kdm::e2e
