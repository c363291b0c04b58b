// `kdm kubelet` under attack (hardening round 2), end to end: the real binary
// with `kdm plugin` and kdm_hostile_plugin processes over real sockets. Each
// test is named after the bug it guards against and failed on the code
// before its fix. Every wait is a bounded poll on a file or a log line;
// nothing asserts on time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kdm/test/e2e/e2e_util.h"
#include "kdm/test/e2e/kubelet_fixture.h"

namespace kdm::e2e {
namespace {

using ::testing::HasSubstr;

constexpr char kDev[] = "example.com/dev";

// A pod asking for `count` of `resource` in one container.
std::string Pod(const std::string& name, const std::string& resource, int count,
                const std::string& uid = "") {
  return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name +
         (uid.empty() ? "" : "\n  uid: " + uid) +
         "\nspec:\n  containers:\n  - name: main\n    resources:\n      limits:\n        " +
         resource + ": " + std::to_string(count) + "\n";
}

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class AgentHardeningE2eTest : public KubeletE2eTest {
 protected:
  Process& StartHostile(std::vector<std::string> args) {
    std::vector<std::string> all = {"--plugin-dir", root_ + "/device-plugins"};
    all.insert(all.end(), args.begin(), args.end());
    const std::string log = root_ + "/hostile" + std::to_string(hostile_.size()) + ".log";
    hostile_.push_back(std::make_unique<Process>(KDM_HOSTILE_PLUGIN, all, log));
    return *hostile_.back();
  }
  void TearDown() override {
    hostile_.clear();
    KubeletE2eTest::TearDown();
  }
  // Reports (never asserts) how long a pod took from its manifest to its
  // Admitted status, including the agent's 100 ms manifest debounce.
  void ReportAdmissionTime(const std::string& key, std::chrono::steady_clock::time_point since) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - since)
                        .count();
    RecordProperty(key, static_cast<int>(ms));
    std::cout << key << "=" << ms << "\n";
  }
  // Removes the SQLite checkpoint with its journal files.
  void RemoveCheckpoint() {
    for (const char* suffix : {"", "-wal", "-shm"}) {
      fs::remove(root_ + "/state/checkpoint.db" + std::string(suffix));
    }
  }

  std::vector<std::unique_ptr<Process>> hostile_;
};

// Bug 1: two manifests with one metadata.uid were both admitted with the same
// devices, and deleting one freed the other's devices for a third pod.
TEST_F(AgentHardeningE2eTest, RegressionDuplicateUidIsRejectedAndItsRemovalFreesNothing) {
  StartKubelet();
  StartPlugin({"--resource", kDev, "--count", "2"});
  ASSERT_TRUE(WaitFor([&] { return Allocatable(kDev, 2); })) << kubelet_->Log();

  WriteFileAtomically(Manifests() + "/a.yaml", Pod("a", kDev, 2, "same-uid"));
  json a = WaitPhase("default_a", "Admitted");
  WriteFileAtomically(Manifests() + "/b.yaml", Pod("b", kDev, 2, "same-uid"));
  json b = WaitPhase("manifest_b.yaml", "Rejected");
  EXPECT_EQ(b["reason"], "DuplicatePod");
  EXPECT_THAT(b["message"].get<std::string>(), HasSubstr("b.yaml"));
  EXPECT_THAT(b["message"].get<std::string>(), HasSubstr("a.yaml"));
  EXPECT_THAT(b["message"].get<std::string>(), HasSubstr("same-uid"));
  EXPECT_FALSE(fs::exists(StatusPath("default_b")));

  // Removing the duplicate frees nothing: a third pod finds no free device.
  fs::remove(Manifests() + "/b.yaml");
  ASSERT_TRUE(WaitFor([&] { return !fs::exists(StatusPath("manifest_b.yaml")); }));
  WriteFileAtomically(Manifests() + "/c.yaml", Pod("c", kDev, 1));
  json c = WaitPhase("default_c", "Rejected");
  EXPECT_THAT(c["message"].get<std::string>(), HasSubstr("Requested: 1, Available: 0"));
  EXPECT_EQ(WaitPhase("default_a", "Admitted")["containers"], a["containers"]);

  // Removing the owner frees its devices for the next pod.
  fs::remove(Manifests() + "/a.yaml");
  WriteFileAtomically(Manifests() + "/c.yaml", Pod("c", kDev, 2));
  WaitPhase("default_c", "Admitted");
  EXPECT_TRUE(kubelet_->Running());
}

// Weakness 6: admission was serial, so one plugin hung in Allocate delayed
// every other pod by the whole RPC deadline.
TEST_F(AgentHardeningE2eTest, RegressionPodOnAHealthyResourceIsAdmittedWhileAnotherPluginHangs) {
  // A deadline far longer than any wait below: the hung pod stays undecided
  // for the whole test, so an admission that waited behind it would time out.
  StartKubelet({"--rpc-timeout", "600s"});
  Process& hung = StartHostile({"--resource", "example.com/hung", "--hang", "allocate"});
  StartPlugin({"--resource", kDev, "--count", "2"});
  ASSERT_TRUE(WaitFor([&] { return Allocatable("example.com/hung", 4) && Allocatable(kDev, 2); }))
      << kubelet_->Log();

  for (int i = 0; i < 3; ++i) {
    WriteFileAtomically(Manifests() + "/hung" + std::to_string(i) + ".yaml",
                        Pod("hung" + std::to_string(i), "example.com/hung", 1));
  }
  ASSERT_TRUE(WaitFor([&] { return hung.Log().find("allocate_hanging") != std::string::npos; }))
      << hung.Log();
  const auto written = std::chrono::steady_clock::now();
  WriteFileAtomically(Manifests() + "/ok.yaml", Pod("ok", kDev, 1));
  json ok = WaitPhase("default_ok", "Admitted");
  ReportAdmissionTime("admitted_while_another_plugin_hangs_ms", written);
  EXPECT_EQ(ok["containers"][0]["devices"][kDev].size(), 1u);
  // The hung pods are still undecided: the healthy pod did not wait for them.
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(fs::exists(StatusPath("default_hung" + std::to_string(i)))) << i;
  }
  // Pods of the hung resource keep their order: only the first is in Allocate.
  EXPECT_EQ(CountOf(hung.Log(), "allocate_hanging"), 1) << hung.Log();
  EXPECT_TRUE(kubelet_->Running());
}

// Weakness 6: a hung PreStartContainer held admission for a fixed 30 s that no
// flag changed.
TEST_F(AgentHardeningE2eTest, RegressionPreStartTimeoutFlagBoundsAHungPreStartContainer) {
  StartKubelet({"--pre-start-timeout", "1s"});
  StartHostile({"--resource", "example.com/slow", "--hang", "prestart"});
  ASSERT_TRUE(WaitFor([&] { return Allocatable("example.com/slow", 4); })) << kubelet_->Log();
  WriteFileAtomically(Manifests() + "/p.yaml", Pod("p", "example.com/slow", 1));
  json p = WaitPhase("default_p", "Rejected");
  EXPECT_EQ(p["reason"], "UnexpectedAdmissionError");
  EXPECT_THAT(kubelet_->Log(), HasSubstr("pre_start_timeout=1000ms"));
  EXPECT_THAT(kubelet_->Log(), HasSubstr("event=pre_start_failed"));
}

TEST_F(AgentHardeningE2eTest, NewDurationFlagsRefuseBadValues) {
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"--pre-start-timeout", "0"},
                                                        {"--pre-start-timeout", "soon"},
                                                        {"--registration-grace", "-1s"},
                                                        {"--registration-grace", "forever"}}) {
    Process p({"kubelet", "--root", root_, flag, value}, root_ + "/usage.log");
    auto code = p.Wait();
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 2) << flag << " " << value;
    EXPECT_THAT(p.Log(), HasSubstr(flag)) << value;
  }
}

// Bug 3: a plugin flapping one device's health every millisecond starved
// admission of every pod and grew the log by megabytes.
TEST_F(AgentHardeningE2eTest, RegressionHealthFlapNeitherStarvesAdmissionNorFloodsTheLog) {
  StartKubelet();
  StartPlugin({"--resource", kDev, "--count", "2"});
  Process& flappy =
      StartHostile({"--resource", "example.com/flappy", "--flap-ms", "1", "--flap-for", "10"});
  ASSERT_TRUE(WaitFor([&] { return flappy.Log().find("flap_started") != std::string::npos; }))
      << flappy.Log();
  ASSERT_TRUE(WaitFor([&] { return Allocatable(kDev, 2); })) << kubelet_->Log();
  const auto written = std::chrono::steady_clock::now();
  WriteFileAtomically(Manifests() + "/ok.yaml", Pod("ok", kDev, 1));
  WaitPhase("default_ok", "Admitted");
  ReportAdmissionTime("admitted_during_flap_ms", written);
  // Admitted while the flap still runs: admission did not wait behind it.
  EXPECT_EQ(flappy.Log().find("flap_ended"), std::string::npos)
      << "the pod was admitted only after the 10 s flap ended";
  ASSERT_TRUE(WaitFor([&] { return flappy.Log().find("flap_ended") != std::string::npos; }))
      << flappy.Log();
  // The flapped device is reported with its final state, and a summary says
  // how many health lines were left out.
  ASSERT_TRUE(WaitFor([&] { return kubelet_->Log().find("suppressed=") != std::string::npos; }));
  const std::string log = kubelet_->Log();
  EXPECT_LT(log.size(), 1u << 20) << "log grew " << log.size() << " bytes during a 10 s flap";
  EXPECT_TRUE(std::regex_search(log, std::regex("suppressed=[1-9][0-9]*")));
  EXPECT_TRUE(kubelet_->Running());
}

// Bug 4: plugin text reached the log raw: device ids, the preferred answer
// and Allocate error texts could forge lines, and a 3 MB error became a 3 MB
// line.
TEST_F(AgentHardeningE2eTest, RegressionHostilePluginTextCannotForgeOrFloodLogLines) {
  StartKubelet();
  StartHostile({"--resource", "example.com/forge", "--forge"});
  ASSERT_TRUE(WaitFor([&] {
    return Node().contains("capacity") && Node()["capacity"].value("example.com/forge", 0) > 0;
  })) << kubelet_->Log();
  WriteFileAtomically(Manifests() + "/p.yaml", Pod("p", "example.com/forge", 2));
  json p = WaitPhase("default_p", "Rejected");
  ASSERT_TRUE(
      WaitFor([&] { return kubelet_->Log().find("event=allocate_failed") != std::string::npos; }));
  const std::string log = kubelet_->Log();
  EXPECT_THAT(log, HasSubstr("event=preferred_allocation_fallback"));
  std::istringstream lines(log);
  std::string line;
  const std::regex prefix(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z [A-Z] )");
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    EXPECT_TRUE(std::regex_search(line, prefix))
        << "a line the agent did not write: " << line.substr(0, 200);
    EXPECT_LT(line.size(), 8u << 10) << line.substr(0, 200);
  }
  EXPECT_GT(n, 5);
  EXPECT_EQ(log.find("\nevent=forged_by_plugin"), std::string::npos);
  EXPECT_TRUE(kubelet_->Running());
}

// Weakness 7: after a corrupt checkpoint was quarantined, pods admitted before
// the restart were re-admitted before their plugin registered and rejected
// "unregistered device" for good.
TEST_F(AgentHardeningE2eTest, RegressionAdmittedPodsWaitForTheirPluginAfterCheckpointLoss) {
  StartKubelet();
  StartPlugin({"--resource", kDev, "--count", "4"});
  ASSERT_TRUE(WaitFor([&] { return Allocatable(kDev, 4); })) << kubelet_->Log();
  for (int i = 0; i < 4; ++i) {
    WriteFileAtomically(Manifests() + "/p" + std::to_string(i) + ".yaml",
                        Pod("p" + std::to_string(i), kDev, 1));
  }
  for (int i = 0; i < 4; ++i) WaitPhase("default_p" + std::to_string(i), "Admitted");

  // The node goes down with its plugin; the checkpoint is found corrupt.
  kubelet_->Signal(SIGKILL);
  ASSERT_TRUE(kubelet_->Wait().has_value());
  plugins_.clear();
  RemoveCheckpoint();
  {
    std::ofstream corrupt(root_ + "/state/checkpoint.db", std::ios::trunc);
    corrupt << "this is not an SQLite database";
  }
  StartKubelet();
  ASSERT_TRUE(WaitFor(
      [&] { return kubelet_->Log().find("event=checkpoint_quarantined") != std::string::npos; }));
  ASSERT_TRUE(WaitFor([&] {
    return CountOf(kubelet_->Log(), "event=pod_waiting_for_plugins") == 4;
  })) << kubelet_->Log();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(WaitPhase("default_p" + std::to_string(i), "Admitted")["phase"], "Admitted");
  }
  StartPlugin({"--resource", kDev, "--count", "4"});
  ASSERT_TRUE(WaitFor([&] { return CountOf(kubelet_->Log(), "event=pod_admitted") == 4; }))
      << kubelet_->Log();
  std::set<std::string> devices;
  for (int i = 0; i < 4; ++i) {
    json p = WaitPhase("default_p" + std::to_string(i), "Admitted");
    for (const auto& id : p["containers"][0]["devices"][kDev])
      devices.insert(id.get<std::string>());
  }
  EXPECT_EQ(devices.size(), 4u) << "each pod has a device nobody else holds";
  EXPECT_EQ(kubelet_->Log().find("event=pod_rejected"), std::string::npos);
}

// Weakness 7, the other end: a plugin that never comes back leaves the pods
// waiting only for --registration-grace; then they are judged.
TEST_F(AgentHardeningE2eTest, AdmittedPodsAreJudgedWhenTheRegistrationGraceEnds) {
  StartKubelet();
  StartPlugin({"--resource", kDev, "--count", "1"});
  ASSERT_TRUE(WaitFor([&] { return Allocatable(kDev, 1); })) << kubelet_->Log();
  WriteFileAtomically(Manifests() + "/p.yaml", Pod("p", kDev, 1));
  WaitPhase("default_p", "Admitted");
  kubelet_->Signal(SIGKILL);
  ASSERT_TRUE(kubelet_->Wait().has_value());
  plugins_.clear();
  RemoveCheckpoint();
  StartKubelet({"--registration-grace", "1s"});
  json p = WaitPhase("default_p", "Rejected");
  EXPECT_THAT(p["message"].get<std::string>(), HasSubstr("unregistered device example.com/dev"));
  EXPECT_THAT(kubelet_->Log(), HasSubstr("event=registration_grace_over waiting_pods=1"));
}

}  // namespace
}  // namespace kdm::e2e
