// `kdm kubelet --restrict RESOURCE=ns1,ns2` end to end, and the hardened
// socket surface as a user meets it: the built binary with a `kdm plugin`
// process, driven through manifests and status files. A pod of a listed
// namespace gets its GPUs; one of another namespace is rejected with a
// clear reason and holds nothing; a pod not asking for the resource is
// unaffected; bad --restrict values are usage errors (exit 2); the plugin
// directory is 0750 and kubelet.sock 0600. Every wait is a bounded poll.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kdm/test/e2e/e2e_util.h"

extern char** environ;

namespace kdm {
namespace {

namespace fs = std::filesystem;
using kdm::e2e::KdmBinary;
using kdm::e2e::kWaitBound;
using kdm::e2e::Process;
using kdm::e2e::ReadFile;
using kdm::e2e::WaitUntil;
using kdm::e2e::WriteFileAtomically;
using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kRestrictGpu[] = "nvidia.com/gpu";

std::string RestrictPodYaml(const std::string& ns, const std::string& name,
                            const std::string& resource, int count) {
  return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name + "\n  namespace: " + ns +
         "\nspec:\n  containers:\n  - name: main\n    resources:\n      limits:\n        " +
         resource + ": " + std::to_string(count) + "\n";
}

class RestrictE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-rs-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    plugin_.reset();
    if (HasFailure() && kubelet_) std::cerr << "---- kubelet\n" << kubelet_->Log() << "\n";
    kubelet_.reset();
    fs::remove_all(root_);
  }

  json Status(const std::string& ns_name) {
    try {
      return json::parse(ReadFile(root_ + "/status/" + ns_name + ".json"));
    } catch (const json::exception&) {
      return json::object();
    }
  }
  json WaitPhase(const std::string& ns_name, const std::string& phase) {
    json out;
    bool ok = WaitUntil(
        [&] {
          out = Status(ns_name);
          return out.value("phase", "") == phase;
        },
        kWaitBound);
    EXPECT_TRUE(ok) << ns_name << ": " << out.dump();
    return out;
  }
  int Allocatable(const std::string& resource) {
    try {
      json node = json::parse(ReadFile(root_ + "/status/node.json"));
      return node["allocatable"].value(resource, -1);
    } catch (const json::exception&) {
      return -1;
    }
  }

  std::string root_;
  std::unique_ptr<Process> kubelet_;
  std::unique_ptr<Process> plugin_;
};

TEST_F(RestrictE2eTest, OnlyListedNamespacesGetTheResource) {
  kubelet_ = std::make_unique<Process>(
      std::vector<std::string>{"kubelet", "--root", root_, "--restrict",
                               "nvidia.com/gpu=ml,research", "--restrict", "example.com/fpga=hw"},
      root_ + "/kubelet.log");
  ASSERT_TRUE(kubelet_->started());
  ASSERT_TRUE(WaitUntil([&] { return fs::exists(root_ + "/status/node.json"); }, kWaitBound))
      << kubelet_->Log();
  plugin_ =
      std::make_unique<Process>(std::vector<std::string>{"plugin", "--root", root_, "--resource",
                                                         kRestrictGpu, "--preset", "dgx1-v100"},
                                root_ + "/plugin.log");
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kRestrictGpu) == 8; }, kWaitBound))
      << plugin_->Log();

  // The sockets a user meets.
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/device-plugins").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_EQ(::lstat((root_ + "/device-plugins/kubelet.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(::lstat((root_ + "/pod-resources/kubelet.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);

  const std::string manifests = root_ + "/manifests";
  WriteFileAtomically(manifests + "/other.yaml",
                      RestrictPodYaml("default", "train", kRestrictGpu, 2));
  json rejected = WaitPhase("default_train", "Rejected");
  EXPECT_EQ(rejected["reason"], "RestrictedResource");
  EXPECT_EQ(rejected["message"],
            "resource \"nvidia.com/gpu\" is restricted to namespaces ml, research; pod namespace "
            "\"default\" is not allowed");
  EXPECT_EQ(rejected["containers"], json::array());

  WriteFileAtomically(manifests + "/ml.yaml", RestrictPodYaml("ml", "train", kRestrictGpu, 8));
  json admitted = WaitPhase("ml_train", "Admitted");
  ASSERT_EQ(admitted["containers"].size(), 1u);
  EXPECT_EQ(admitted["containers"][0]["devices"][kRestrictGpu].size(), 8u);
  // All 8 went to ml: nothing was held for the rejected pod.
  EXPECT_TRUE(WaitUntil([&] { return Allocatable(kRestrictGpu) == 8; }, kWaitBound));

  // A pod not asking for a restricted resource is unaffected.
  WriteFileAtomically(manifests + "/cpu.yaml", RestrictPodYaml("default", "cpu-only", "cpu", 1));
  WaitPhase("default_cpu-only", "Admitted");
  EXPECT_THAT(kubelet_->Log(), HasSubstr("reason=RestrictedResource"));
  EXPECT_TRUE(kubelet_->Running());
}

TEST_F(RestrictE2eTest, BadRestrictValuesAreUsageErrors) {
  struct Case {
    std::vector<std::string> restrict_args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--restrict", "nvidia.com/gpu"}, "\"nvidia.com/gpu\": no '='"},
      {{"--restrict", "nvidia.com/gpu="}, "the namespace list is empty"},
      {{"--restrict", "nvidia.com/gpu=ml,"}, "an empty namespace name"},
      {{"--restrict", "gpu=ml"}, "\"gpu\" is not an extended resource name"},
      {{"--restrict", "nvidia.com/gpu=ml", "--restrict", "nvidia.com/gpu=research"},
       "resource \"nvidia.com/gpu\" is restricted twice"},
      {{"--restrict", "nvidia.com/gpu=ML_team"}, "namespace \"ML_team\" is not a DNS-1123 label"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<std::string> args = {"kubelet", "--root", root_ + "/r"};
    args.insert(args.end(), cases[i].restrict_args.begin(), cases[i].restrict_args.end());
    Process p(args, root_ + "/usage" + std::to_string(i) + ".out");
    EXPECT_EQ(p.Wait(), 2) << p.Log();
    EXPECT_THAT(p.Log(), HasSubstr("kdm kubelet: --restrict "));
    EXPECT_THAT(p.Log(), HasSubstr(cases[i].message));
  }
  EXPECT_FALSE(fs::exists(root_ + "/r"));  // nothing was started
}

}  // namespace
}  // namespace kdm
