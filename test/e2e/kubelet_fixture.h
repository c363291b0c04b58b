// The `kdm kubelet` end-to-end fixture: a private root directory, the real
// binary started as a user would, `kdm plugin` processes, and bounded waits on
// the status files it writes. Shared by kubelet_e2e_test.cc and
// agent_hardening_e2e_test.cc.
#ifndef KDM_TEST_E2E_KUBELET_FIXTURE_H_
#define KDM_TEST_E2E_KUBELET_FIXTURE_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kdm/test/e2e/e2e_util.h"

namespace kdm::e2e {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

inline constexpr char kGpu[] = "nvidia.com/gpu";
inline constexpr char kFpga[] = "example.com/fpga";

class KubeletE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-kl-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    plugins_.clear();
    kubelet_.reset();
    if (HasFailure()) {
      for (const auto& e : fs::directory_iterator(root_)) {
        if (e.path().extension() == ".log") {
          std::cerr << "---- " << e.path() << "\n" << ReadFile(e.path()) << "\n";
        }
      }
    }
    fs::remove_all(root_);
  }

  std::string Manifests() const { return root_ + "/manifests"; }
  std::string StatusPath(const std::string& ns_name) const {
    return root_ + "/status/" + ns_name + ".json";
  }

  void StartKubelet(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"kubelet", "--root", root_, "-v", "1"};
    if (std::find(extra.begin(), extra.end(), "--rpc-timeout") == extra.end()) {
      args.insert(args.end(), {"--rpc-timeout", "5s"});
    }
    args.insert(args.end(), extra.begin(), extra.end());
    // One log per start, so that a restarted agent's log holds only its own lines.
    kubelet_ = std::make_unique<Process>(
        args, root_ + "/kubelet" + std::to_string(kubelet_starts_++) + ".log");
    ASSERT_TRUE(kubelet_->started());
    ASSERT_TRUE(WaitFor([&] { return fs::exists(root_ + "/status/node.json"); }))
        << kubelet_->Log();
  }

  Process& StartPlugin(std::vector<std::string> args) {
    std::vector<std::string> all = {"plugin", "--root", root_};
    all.insert(all.end(), args.begin(), args.end());
    plugins_.push_back(std::make_unique<Process>(
        all, root_ + "/plugin" + std::to_string(plugins_.size()) + ".log"));
    return *plugins_.back();
  }
  void StartGpuPlugin() {
    StartPlugin({"--resource", kGpu, "--preset", "dgx1-v100", "--policy", "packed", "--health-file",
                 root_ + "/health.json"});
  }

  json Node() {
    try {
      return json::parse(ReadFile(root_ + "/status/node.json"));
    } catch (const json::exception&) {
      return json::object();
    }
  }
  bool Allocatable(const std::string& resource, int n) {
    json node = Node();
    return node.contains("allocatable") && node["allocatable"].value(resource, -1) == n;
  }

  // Waits for the pod's status file to exist and satisfy `pred`.
  template <typename Pred>
  json WaitStatus(const std::string& ns_name, Pred pred) {
    json out;
    bool ok = WaitFor([&] {
      if (!fs::exists(StatusPath(ns_name))) return false;
      try {
        out = json::parse(ReadFile(StatusPath(ns_name)));
      } catch (const json::exception&) {
        return false;
      }
      return pred(out);
    });
    EXPECT_TRUE(ok) << ns_name << " status: " << out.dump() << "\n" << kubelet_->Log();
    return out;
  }
  json WaitPhase(const std::string& ns_name, const std::string& phase) {
    return WaitStatus(ns_name, [&](const json& j) { return j.value("phase", "") == phase; });
  }

  std::string root_;
  std::unique_ptr<Process> kubelet_;
  int kubelet_starts_ = 0;
  std::vector<std::unique_ptr<Process>> plugins_;
};

inline std::string PodYaml(const std::string& name, int gpus, const std::string& extra_label = "") {
  return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name +
         (extra_label.empty() ? "" : "\n  labels: {v: \"" + extra_label + "\"}") +
         "\nspec:\n  containers:\n  - name: main\n    resources:\n      limits:\n        "
         "nvidia.com/gpu: " +
         std::to_string(gpus) + "\n";
}

inline std::vector<std::string> Gpus(const json& status, const std::string& container = "main") {
  for (const auto& c : status["containers"]) {
    if (c["name"] == container && c["devices"].contains(kGpu)) {
      return c["devices"][kGpu].get<std::vector<std::string>>();
    }
  }
  return {};
}

}  // namespace kdm::e2e

#endif  // KDM_TEST_E2E_KUBELET_FIXTURE_H_
