// `kdm kubelet` + `kdm plugin --nvml --nvml-library <the fake libnvidia-ml>`:
// registration, packed preferred sets on the NVML topology, Xid health
// through the fake's event file (docs/nvml.md, "The fake NVML"), recovery,
// and the flags' errors. Also prints (never asserts) the injected-Xid ->
// allocatable latency.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/test/e2e/kubelet_fixture.h"
#include "kdm/test/nvml/fake_nvml/fake_sysfs.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/presets.h"

namespace kdm::e2e {
namespace {

const std::string kNodes = KDM_FAKE_NVML_NODES;
const std::string kFakeLibrary = KDM_FAKE_NVML_LIBRARY;

// NVIDIA's plugin's environment variables, which `kdm plugin --nvml` reads
// too: unset around every test (the plugin processes inherit the test's).
constexpr const char* kNvidiaPluginVariables[] = {
    "MIG_STRATEGY",      "FAIL_ON_INIT_ERROR",   "NVIDIA_DRIVER_ROOT", "NVIDIA_DEV_ROOT",
    "PASS_DEVICE_SPECS", "DEVICE_LIST_STRATEGY", "DEVICE_ID_STRATEGY", "CONFIG_FILE",
    "KUBELET_SOCKET",    "CDI_ANNOTATION_PREFIX"};

void UnsetNvidiaPluginVariables() {
  for (const char* v : kNvidiaPluginVariables) ::unsetenv(v);
}

std::vector<std::string> NodeUuids(const std::string& node_path) {
  json doc = json::parse(ReadFile(node_path));
  std::vector<std::string> uuids;
  for (const auto& g : doc["gpus"]) uuids.push_back(g["uuid"].get<std::string>());
  return uuids;
}

class NvmlPluginE2eTest : public KubeletE2eTest {
 protected:
  void SetUp() override {
    KubeletE2eTest::SetUp();
    node_ = kNodes + "/dgx1-v100.json";
    uuids_ = NodeUuids(node_);
    ASSERT_EQ(uuids_.size(), 8u);
    events_ = root_ + "/nvml-events";
    std::ofstream(events_).flush();
    sysfs_ = root_ + "/sys";
    ASSERT_EQ(nvml::test::WriteFakeSysfs(node_, sysfs_), "");
    dev_root_ = root_ + "/host";
    fs::create_directories(dev_root_ + "/dev");
    for (const char* n : {"nvidiactl", "nvidia-uvm"})
      std::ofstream(dev_root_ + "/dev/" + n).flush();
    // The plugin process inherits these (the fake library reads them).
    ::setenv("KDM_FAKE_NVML_NODE", node_.c_str(), 1);
    ::setenv("KDM_FAKE_NVML_EVENTS", events_.c_str(), 1);
    ::unsetenv("DP_DISABLE_HEALTHCHECKS");
    UnsetNvidiaPluginVariables();
  }
  void TearDown() override {
    ::unsetenv("KDM_FAKE_NVML_NODE");
    ::unsetenv("KDM_FAKE_NVML_EVENTS");
    ::unsetenv("DP_DISABLE_HEALTHCHECKS");
    UnsetNvidiaPluginVariables();
    KubeletE2eTest::TearDown();
  }

  Process& StartNvmlPlugin(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--nvml", "--nvml-library", kFakeLibrary, "--sysfs-root",
                                     sysfs_,   "--dev-root",     dev_root_};
    args.insert(args.end(), extra.begin(), extra.end());
    return StartPlugin(args);
  }
  // Appends one event line in one write (the fake reads complete lines).
  void Inject(const std::string& line) {
    const std::string text = line + "\n";
    int fd = ::open(events_.c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  void StartAndWaitForAll(std::vector<std::string> extra = {}) {
    StartKubelet();
    StartNvmlPlugin(std::move(extra));
    ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound))
        << kubelet_->Log() << "\n"
        << plugins_.back()->Log();
  }

  std::string node_;
  std::vector<std::string> uuids_;
  std::string events_;
  std::string sysfs_;
  std::string dev_root_;
};

// `kdm conform --health-trigger` on `kdm plugin --nvml` over the fake NVML:
// the trigger injects an Xid 79 for the GPU, and the change reaches the
// open stream and, after 3 cancelled streams, a new one (2 of 2).
TEST_F(NvmlPluginE2eTest, ConformHealthChecksPassWithAnXidTrigger) {
  Process conform(
      {"conform", "--root", root_, "--resource", kGpu, "--timeout", "10s", "--only",
       "lw.first-snapshot,health.trigger,lw.stream-drop,health.reconnect", "--health-trigger",
       "echo \"xid $KDM_DEVICE_ID 79\" >> \"$KDM_FAKE_NVML_EVENTS\"; :"},
      root_ + "/conform.out", root_ + "/conform.err");
  ASSERT_TRUE(conform.started());
  ASSERT_TRUE(
      WaitUntil([&] { return fs::exists(root_ + "/device-plugins/kubelet.sock"); }, kWaitBound))
      << conform.Err();
  StartNvmlPlugin();
  std::optional<int> code = conform.Wait();
  EXPECT_EQ(code, 0) << conform.Out() << conform.Err() << plugins_.back()->Log();
  EXPECT_THAT(conform.Out(), ::testing::HasSubstr("4 passed, 0 failed, 0 skipped"));
  EXPECT_THAT(conform.Out(),
              ::testing::HasSubstr("2 of 2 health changes reached the stream opened after 3 "
                                   "cancelled streams"));
  // Three GPUs got their Xid, each named by its UUID.
  std::string events = ReadFile(events_);
  int xids = 0;
  for (const std::string& uuid : uuids_) {
    if (events.find("xid " + uuid + " 79") != std::string::npos) ++xids;
  }
  EXPECT_EQ(xids, 3) << events;
}

TEST_F(NvmlPluginE2eTest, RegistersEveryGpuByUuidAndAdmitsAPackedSet) {
  StartAndWaitForAll();
  Process& plugin = *plugins_.back();
  ASSERT_TRUE(WaitUntil(
      [&] { return plugin.Log().find("ready plugin=nvidia.com/gpu") != std::string::npos; },
      kWaitBound));
  EXPECT_NE(plugin.Log().find(" devices=8 source=nvml"), std::string::npos) << plugin.Log();

  WriteFileAtomically(Manifests() + "/a.yaml", PodYaml("a", 2));
  json a = WaitPhase("default_a", "Admitted");
  std::vector<std::string> got = Gpus(a);
  // What kdm's packed allocator picks on the preset this node describes,
  // translated to the node's UUIDs (GPU i of the preset is GPU i of the node).
  StatusOr<topology::Topology> preset = topology::Preset("dgx1-v100");
  ASSERT_TRUE(preset.ok());
  std::vector<std::string> all;
  for (const auto& d : preset->devices()) all.push_back(d.id);
  StatusOr<std::vector<std::string>> want_ids =
      topology::AllocateIds(*preset, all, {}, 2, topology::Policy::kPacked);
  ASSERT_TRUE(want_ids.ok());
  std::set<std::string> want;
  for (const std::string& id : *want_ids) want.insert(uuids_[*preset->IndexOf(id)]);
  EXPECT_EQ(std::set<std::string>(got.begin(), got.end()), want) << a.dump();
  // The plugin answered it (not the kubelet's own fallback choice).
  EXPECT_NE(plugin.Log().find("event=preferred_allocation resource=nvidia.com/gpu policy=packed"),
            std::string::npos)
      << plugin.Log();
  // The Allocate answer: UUIDs, the GPUs' nodes and the control nodes present.
  const json& c = a["containers"][0];
  std::string visible = c["envs"]["NVIDIA_VISIBLE_DEVICES"].get<std::string>();
  for (const std::string& id : got) EXPECT_NE(visible.find(id), std::string::npos) << visible;
  std::string specs = c["device_specs"].dump();
  EXPECT_NE(specs.find("/dev/nvidiactl"), std::string::npos) << specs;
  EXPECT_NE(specs.find("/dev/nvidia-uvm"), std::string::npos) << specs;
  EXPECT_EQ(specs.find("/dev/nvidia-uvm-tools"), std::string::npos) << specs;
}

TEST_F(NvmlPluginE2eTest, ACriticalXidFlipsAllocatableAndASkippedXidDoesNot) {
  StartAndWaitForAll();
  // Xid 43 (an application error) on GPU 0, then Xid 79 on GPU 5: the fake
  // delivers them in order, so once allocatable drops, 43 was handled.
  Inject("xid " + uuids_[0] + " 43");
  Inject("xid " + uuids_[5] + " 79");
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 7); }, kWaitBound)) << Node().dump();
  const std::string log = plugins_.back()->Log();
  EXPECT_NE(log.find("event=health_event_skipped gpu=\"" + uuids_[0] +
                     "\" reason=\"Xid 43 (application error)\""),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("event=gpu_unhealthy gpu=\"" + uuids_[5] + "\" reason=\"Xid 79\""),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("event=gpu_unhealthy gpu=\"" + uuids_[0]), std::string::npos) << log;
  // A pod of 8 no longer fits; one of 7 gets every GPU but GPU 5.
  WriteFileAtomically(Manifests() + "/seven.yaml", PodYaml("seven", 7));
  json seven = WaitPhase("default_seven", "Admitted");
  std::vector<std::string> got = Gpus(seven);
  EXPECT_EQ(got.size(), 7u);
  EXPECT_EQ(std::find(got.begin(), got.end(), uuids_[5]), got.end());
}

TEST_F(NvmlPluginE2eTest, ExtraXidsOfDpDisableHealthchecksAreSkipped) {
  ::setenv("DP_DISABLE_HEALTHCHECKS", "48", 1);
  StartAndWaitForAll();
  Inject("xid " + uuids_[1] + " 48");
  Inject("ecc " + uuids_[2]);
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 7); }, kWaitBound)) << Node().dump();
  const std::string log = plugins_.back()->Log();
  EXPECT_NE(log.find("reason=\"Xid 48 (skipped by DP_DISABLE_HEALTHCHECKS)\""), std::string::npos)
      << log;
  EXPECT_NE(
      log.find("event=gpu_unhealthy gpu=\"" + uuids_[2] + "\" reason=\"double-bit ECC error\""),
      std::string::npos)
      << log;
}

TEST_F(NvmlPluginE2eTest, ALostGpuFlipsAllocatable) {
  StartAndWaitForAll({"--health-recovery", "200ms"});
  Inject("lost " + uuids_[3]);
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 7); }, kWaitBound)) << Node().dump();
  const std::string log = plugins_.back()->Log();
  EXPECT_NE(log.find("event=gpu_unhealthy gpu=\"" + uuids_[3] + "\" reason=\"GPU lost\""),
            std::string::npos)
      << log;
  // A lost GPU never recovers: a later Xid on another GPU recovers (200 ms
  // window) while the lost one stays out.
  Inject("xid " + uuids_[4] + " 79");
  ASSERT_TRUE(WaitUntil(
      [&] {
        return plugins_.back()->Log().find("event=gpu_healthy gpu=\"" + uuids_[4]) !=
               std::string::npos;
      },
      kWaitBound));
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 7); }, kWaitBound)) << Node().dump();
  EXPECT_EQ(plugins_.back()->Log().find("event=gpu_healthy gpu=\"" + uuids_[3]), std::string::npos);
}

TEST_F(NvmlPluginE2eTest, RecoversAfterTheWindowAndMeasuresXidToAllocatableLatency) {
  StartAndWaitForAll({"--health-recovery", "300ms"});
  // Each round: an Xid on one GPU, allocatable 8 -> 7 (timed), then recovery
  // 7 -> 8 after the window. Printed, never asserted (the target is 100 ms).
  // `kdm kubelet` rewrites node.json at most every 100 ms after a health
  // change (fakes/node_agent.cc), so each round first lets the recovery's
  // rewrite age past that window: a pause for pacing, not for a result.
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Inject("xid " + uuids_[i % 8] + " 79");
    ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 7); }, kWaitBound))
        << "round " << i << " " << Node().dump();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound))
        << "round " << i << " did not recover: " << Node().dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double sum = 0;
  for (double v : ms) sum += v;
  std::printf(
      "nvml e2e: injected Xid -> kdm kubelet allocatable over %zu injections: min %.1f ms, "
      "median %.1f ms, p90 %.1f ms, max %.1f ms, mean %.1f ms\n",
      ms.size(), sorted.front(), sorted[sorted.size() / 2], sorted[sorted.size() * 9 / 10],
      sorted.back(), sum / ms.size());
  EXPECT_NE(
      plugins_.back()->Log().find("reason=\"recovered after 300ms without a critical event\""),
      std::string::npos);
}

TEST_F(NvmlPluginE2eTest, WithoutRecoveryAnUnhealthyGpuStaysOut) {
  StartAndWaitForAll();
  Inject("xid " + uuids_[6] + " 79");
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 7); }, kWaitBound));
  // Another GPU's Xid makes it 6, never back to 7 or 8 in between.
  Inject("xid " + uuids_[7] + " 94");
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 6); }, kWaitBound));
  EXPECT_EQ(plugins_.back()->Log().find("event=gpu_healthy"), std::string::npos);
}

TEST_F(NvmlPluginE2eTest, PassesKdmConform) {
  // `kdm conform` acts as the kubelet toward the plugin: every check passes.
  StartNvmlPlugin({"--cdi"});
  Process conform({"conform", "--root", root_, "--resource", kGpu, "--timeout", "10s"},
                  root_ + "/conform.out", root_ + "/conform.err");
  std::optional<int> code = conform.Wait();
  EXPECT_EQ(code, 0) << conform.Out() << conform.Err() << plugins_.back()->Log();
  EXPECT_NE(conform.Out().find(" passed, 0 failed, "), std::string::npos) << conform.Out();
}

// The flags' errors: exit 2 with one clear line.
class NvmlPluginFlagsE2eTest : public NvmlPluginE2eTest {
 protected:
  // Runs `kdm plugin --root <root> <args>`; returns the exit code, stderr in err_.
  int Run(std::vector<std::string> args) {
    std::vector<std::string> all = {"plugin", "--root", root_};
    all.insert(all.end(), args.begin(), args.end());
    Process p(all, root_ + "/out.txt", root_ + "/err.txt");
    std::optional<int> code = p.Wait();
    err_ = p.Err();
    return code.value_or(-1);
  }
  std::string err_;
};

TEST_F(NvmlPluginFlagsE2eTest, AMissingLibraryIsExit2WithOneLine) {
  EXPECT_EQ(Run({"--nvml", "--nvml-library", root_ + "/no/libnvidia-ml.so.1"}), 2);
  EXPECT_EQ(err_.rfind("NVML not found: ", 0), 0u) << err_;
  EXPECT_NE(err_.find("; is the NVIDIA driver installed?\n"), std::string::npos) << err_;
  EXPECT_EQ(std::count(err_.begin(), err_.end(), '\n'), 1) << err_;
}

TEST_F(NvmlPluginFlagsE2eTest, BadDpDisableHealthchecksIsAUsageErrorNamingTheToken) {
  ::setenv("DP_DISABLE_HEALTHCHECKS", "xids,bogus", 1);
  EXPECT_EQ(Run({"--nvml", "--nvml-library", kFakeLibrary}), 2);
  EXPECT_NE(err_.find("DP_DISABLE_HEALTHCHECKS=\"xids,bogus\": token \"bogus\" is not all, xids "
                      "or a decimal Xid"),
            std::string::npos)
      << err_;
}

TEST_F(NvmlPluginFlagsE2eTest, FlagsThatDoNotFitAreUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--nvml", "--preset", "dgx1-v100"}, "--nvml takes its devices from NVML"},
      {{"--nvml", "--count", "2"}, "--nvml takes its devices from NVML"},
      {{"--nvml", "--health-file", "h.json"}, "--health-file does not apply to --nvml"},
      {{"--nvml", "--fault", "hang-allocate"}, "--fault does not apply to --nvml"},
      {{"--nvml", "--policy", "none"}, "--policy none does not apply to --nvml"},
      {{"--nvml", "--policy", "tightest"}, "unknown policy \"tightest\""},
      {{"--nvml", "--health-recovery", "soon"}, "--health-recovery: "},
      {{"--nvml", "--health-recovery", "10"}, "--health-recovery: "},
      {{"--nvml", "--health-recovery", "0s"}, "--health-recovery must be a positive duration"},
      {{"--resource", kGpu, "--preset", "dgx1-v100", "--dev-root", "/"}, "need --nvml"},
      {{"--resource", kGpu, "--count", "2", "--nvml-library", "x.so"}, "need --nvml"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    if (std::find(args.begin(), args.end(), "--nvml-library") == args.end()) {
      args.insert(args.end(), {"--nvml-library", kFakeLibrary});
    }
    EXPECT_EQ(Run(args), 2) << c.message << "\n" << err_;
    EXPECT_NE(err_.find(c.message), std::string::npos) << err_;
  }
}

TEST_F(NvmlPluginFlagsE2eTest, ABrokenNodeDescriptionIsARuntimeErrorNamingIt) {
  const std::string bad = root_ + "/bad-node.json";
  std::ofstream(bad) << "{\"gpus\": [ {\"uuid\": 7} ]";
  ::setenv("KDM_FAKE_NVML_NODE", bad.c_str(), 1);
  EXPECT_EQ(Run({"--nvml", "--nvml-library", kFakeLibrary}), 1);
  EXPECT_NE(err_.find("nvmlInit_v2"), std::string::npos) << err_;
}

// NVIDIA's plugin's habits (issue 30, item 8): its flags and environment
// variables, the Allocate shapes of each device list and id strategy as the
// kubelet stores them, --fail-on-init-error=false.
class NvidiaHabitsE2eTest : public NvmlPluginE2eTest {
 protected:
  // Admits a pod of `gpus` GPUs; returns its first container's status
  // (devices, envs, mounts, device_specs, annotations, cdi_devices).
  json AdmitAndGetContainer(const std::string& name, int gpus) {
    WriteFileAtomically(Manifests() + "/" + name + ".yaml", PodYaml(name, gpus));
    json status = WaitPhase("default_" + name, "Admitted");
    if (!status.contains("containers") || status["containers"].empty()) return json::object();
    return status["containers"][0];
  }
  // The NVML index of each UUID (the node file lists GPUs in index order).
  std::string IndexOf(const std::string& uuid) const {
    auto it = std::find(uuids_.begin(), uuids_.end(), uuid);
    return std::to_string(it - uuids_.begin());
  }
};

// The items of a comma-separated list, as a set (the status file lists a
// container's devices sorted, the Allocate request in the preferred order).
std::set<std::string> CommaSet(const std::string& list) {
  std::set<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.insert(item);
  return out;
}

TEST_F(NvidiaHabitsE2eTest, EnvvarWithIndexIdsFromNvidiasVariable) {
  ::setenv("DEVICE_ID_STRATEGY", "index", 1);
  StartAndWaitForAll();
  json c = AdmitAndGetContainer("idx", 2);
  std::vector<std::string> got = c["devices"][kGpu].get<std::vector<std::string>>();
  ASSERT_EQ(got.size(), 2u) << c.dump();
  // The kubelet still sees UUIDs (as under NVIDIA's plugin); the runtime
  // gets the NVML indices, in the same order.
  EXPECT_EQ(got[0].rfind("GPU-", 0), 0u) << c.dump();
  const std::string visible = c["envs"]["NVIDIA_VISIBLE_DEVICES"];
  EXPECT_EQ(CommaSet(visible), (std::set<std::string>{IndexOf(got[0]), IndexOf(got[1])}))
      << c.dump();
  EXPECT_TRUE(c["mounts"].empty()) << c.dump();
  EXPECT_TRUE(c["annotations"].empty()) << c.dump();
  EXPECT_NE(plugins_.back()->Log().find("device_id_strategy=index device_list_strategy=envvar"),
            std::string::npos)
      << plugins_.back()->Log();
}

TEST_F(NvidiaHabitsE2eTest, VolumeMountsMountDevNullPerGpu) {
  StartAndWaitForAll({"--device-list-strategy", "volume-mounts"});
  json c = AdmitAndGetContainer("vm", 2);
  std::vector<std::string> got = c["devices"][kGpu].get<std::vector<std::string>>();
  ASSERT_EQ(got.size(), 2u) << c.dump();
  EXPECT_EQ(c["envs"]["NVIDIA_VISIBLE_DEVICES"], "/var/run/nvidia-container-devices") << c.dump();
  ASSERT_EQ(c["mounts"].size(), 2u) << c.dump();
  std::set<std::string> paths;
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(c["mounts"][i]["host_path"], "/dev/null") << c.dump();
    paths.insert(c["mounts"][i]["container_path"].get<std::string>());
  }
  EXPECT_EQ(paths, (std::set<std::string>{"/var/run/nvidia-container-devices/" + got[0],
                                          "/var/run/nvidia-container-devices/" + got[1]}))
      << c.dump();
  // Device nodes stay (kdm's --pass-device-specs default).
  EXPECT_NE(c["device_specs"].dump().find("/dev/nvidiactl"), std::string::npos) << c.dump();
}

TEST_F(NvidiaHabitsE2eTest, CdiAnnotationsAloneAnswerOnlyTheAnnotation) {
  ::setenv("DEVICE_LIST_STRATEGY", "cdi-annotations", 1);
  StartAndWaitForAll({"--cdi-annotation-prefix", "cdi.example.com/"});
  json c = AdmitAndGetContainer("ann", 2);
  std::vector<std::string> got = c["devices"][kGpu].get<std::vector<std::string>>();
  ASSERT_EQ(got.size(), 2u) << c.dump();
  ASSERT_EQ(c["annotations"].size(), 1u) << c.dump();
  const std::string key = c["annotations"].begin().key();
  const std::string prefix = "cdi.example.com/nvidia-device-plugin_";
  EXPECT_EQ(key.rfind(prefix, 0), 0u) << key;
  EXPECT_EQ(key.size(), prefix.size() + 36) << key;  // a UUID
  EXPECT_EQ(CommaSet(c["annotations"][key]),
            (std::set<std::string>{"nvidia.com/gpu=" + got[0], "nvidia.com/gpu=" + got[1]}))
      << c.dump();
  // Only CDI strategies: the CDI spec brings env and nodes, as NVIDIA's.
  EXPECT_TRUE(c["envs"].empty()) << c.dump();
  EXPECT_TRUE(c["device_specs"].empty()) << c.dump();
  EXPECT_TRUE(c["mounts"].empty()) << c.dump();
  EXPECT_TRUE(c["cdi_devices"].empty()) << c.dump();
}

TEST_F(NvidiaHabitsE2eTest, CdiCriBesideEnvvarFillsTheCdiDevicesField) {
  StartAndWaitForAll({"--device-list-strategy", "envvar,cdi-cri", "--device-id-strategy", "index"});
  json c = AdmitAndGetContainer("cri", 1);
  std::vector<std::string> got = c["devices"][kGpu].get<std::vector<std::string>>();
  ASSERT_EQ(got.size(), 1u) << c.dump();
  EXPECT_EQ(c["cdi_devices"], json::array({"nvidia.com/gpu=" + IndexOf(got[0])})) << c.dump();
  EXPECT_EQ(c["envs"]["NVIDIA_VISIBLE_DEVICES"], IndexOf(got[0])) << c.dump();
  EXPECT_TRUE(c["annotations"].empty()) << c.dump();
}

TEST_F(NvidiaHabitsE2eTest, TheCommandLineWinsOverNvidiasVariables) {
  // Each variable is overridden by its flag; the ones without a flag apply.
  ::setenv("DEVICE_ID_STRATEGY", "index", 1);
  ::setenv("DEVICE_LIST_STRATEGY", "volume-mounts", 1);
  ::setenv("MIG_STRATEGY", "mixed", 1);
  ::setenv("PASS_DEVICE_SPECS", "true", 1);
  ::setenv("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver", 1);
  StartAndWaitForAll({"--device-id-strategy", "uuid", "--device-list-strategy=envvar",
                      "--mig-strategy", "none", "--pass-device-specs=true"});
  json c = AdmitAndGetContainer("prec", 1);
  std::vector<std::string> got = c["devices"][kGpu].get<std::vector<std::string>>();
  ASSERT_EQ(got.size(), 1u) << c.dump();
  EXPECT_EQ(c["envs"]["NVIDIA_VISIBLE_DEVICES"], got[0]) << c.dump();
  EXPECT_TRUE(c["mounts"].empty()) << c.dump();
  // NVIDIA_DRIVER_ROOT had no flag: the nodes' host paths are under it, the
  // container paths stay /dev/....
  ASSERT_FALSE(c["device_specs"].empty()) << c.dump();
  for (const json& d : c["device_specs"]) {
    const std::string container = d["container_path"];
    EXPECT_EQ(container.rfind("/dev/nvidia", 0), 0u) << c.dump();
    EXPECT_EQ(d["host_path"], "/run/nvidia/driver" + container) << c.dump();
  }
}

TEST_F(NvidiaHabitsE2eTest, PassDeviceSpecsFalseFromItsVariableDropsTheNodes) {
  ::setenv("PASS_DEVICE_SPECS", "false", 1);
  ::setenv("DEVICE_LIST_STRATEGY", "envvar", 1);
  StartAndWaitForAll();
  json c = AdmitAndGetContainer("nospecs", 1);
  EXPECT_TRUE(c["device_specs"].empty()) << c.dump();
  EXPECT_FALSE(c["envs"]["NVIDIA_VISIBLE_DEVICES"].get<std::string>().empty()) << c.dump();
}

TEST_F(NvidiaHabitsE2eTest, NvidiaDevRootBeatsTheDriverRootForHostPaths) {
  ::setenv("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver", 1);
  ::setenv("NVIDIA_DEV_ROOT", "/", 1);
  StartAndWaitForAll();
  json c = AdmitAndGetContainer("devroot", 1);
  ASSERT_FALSE(c["device_specs"].empty()) << c.dump();
  for (const json& d : c["device_specs"])
    EXPECT_EQ(d["host_path"], d["container_path"]) << c.dump();
}

TEST_F(NvidiaHabitsE2eTest, KubeletSocketFromItsVariableGivesThePluginDirectory) {
  StartKubelet();
  ::setenv("KUBELET_SOCKET", (root_ + "/device-plugins/kubelet.sock").c_str(), 1);
  // No --root and no --plugin-dir: the directory is the socket's.
  plugins_.push_back(std::make_unique<Process>(
      std::vector<std::string>{"plugin", "--nvml", "--nvml-library", kFakeLibrary, "--sysfs-root",
                               sysfs_, "--dev-root", dev_root_},
      root_ + "/plugin-ks.log"));
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound))
      << plugins_.back()->Log();
}

TEST_F(NvidiaHabitsE2eTest, AnEmptyKubeletSocketServesWithoutRegistering) {
  StartKubelet();
  Process& gpu = StartNvmlPlugin({"--kubelet-socket", ""});
  ASSERT_TRUE(
      WaitUntil([&] { return gpu.Log().find("ready plugin=nvidia.com/gpu") != std::string::npos; },
                kWaitBound))
      << gpu.Log();
  // A plugin started after it registers and is counted; by then the GPU
  // plugin, serving first, would have been too had it registered.
  StartPlugin({"--resource", kFpga, "--count", "2"});
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kFpga, 2); }, kWaitBound)) << Node().dump();
  EXPECT_FALSE(Node()["allocatable"].contains(kGpu)) << Node().dump();
  EXPECT_EQ(gpu.Log().find("event=registered"), std::string::npos) << gpu.Log();
  EXPECT_TRUE(fs::exists(root_ + "/device-plugins/nvidia.com_gpu.sock"));
}

TEST_F(NvidiaHabitsE2eTest, FailOnInitErrorFalseWaitsWithoutNvmlAndExitsZeroOnSigterm) {
  struct Case {
    std::string how;  // "env" or "flag"
    std::vector<std::string> args;
    std::string error;  // in the logged line
  };
  const std::string broken = root_ + "/broken-node.json";
  const std::vector<Case> cases = {
      {"env", {"--nvml-library", root_ + "/no/libnvidia-ml.so.1"}, "NVML not found: "},
      {"flag", {"--nvml-library", kFakeLibrary, "--fail-on-init-error=false"}, "nvmlInit_v2"},
  };
  std::ofstream(broken) << "{\"gpus\": [ {\"uuid\": 7} ]";
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& k = cases[i];
    if (k.how == "env") {
      ::setenv("FAIL_ON_INIT_ERROR", "false", 1);
    } else {
      ::unsetenv("FAIL_ON_INIT_ERROR");
      ::setenv("KDM_FAKE_NVML_NODE", broken.c_str(), 1);
    }
    std::vector<std::string> args = {"plugin", "--root", root_, "--nvml"};
    args.insert(args.end(), k.args.begin(), k.args.end());
    Process p(args, root_ + "/fail-init" + std::to_string(i) + ".log");
    ASSERT_TRUE(WaitUntil(
        [&] { return p.Log().find("event=nvml_init_failed") != std::string::npos; }, kWaitBound))
        << k.how << "\n"
        << p.Log();
    const std::string log = p.Log();
    EXPECT_NE(log.find(k.error), std::string::npos) << log;
    EXPECT_NE(log.find("action=wait_for_stop_signal"), std::string::npos) << log;
    // It stays, logging nothing more, until stopped: the line came once.
    EXPECT_TRUE(p.Running()) << log;
    p.Signal(SIGTERM);
    EXPECT_EQ(p.Wait(), 0) << p.Log();
    const std::string final_log = p.Log();
    size_t first = final_log.find("event=nvml_init_failed");
    EXPECT_EQ(final_log.find("event=nvml_init_failed", first + 1), std::string::npos) << final_log;
    EXPECT_NE(final_log.find("event=stopped"), std::string::npos) << final_log;
  }
}

TEST_F(NvmlPluginFlagsE2eTest, NvidiasFlagsAndVariablesRefuseBadValuesNamingThem) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::pair<std::string, std::string>> env;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--device-list-strategy", "bogus"},
       {},
       "kdm plugin: --device-list-strategy: \"bogus\" is not envvar, volume-mounts, "
       "cdi-annotations or cdi-cri"},
      {{"--device-list-strategy", "envvar,,cdi-cri"}, {}, "has an empty entry"},
      {{},
       {{"DEVICE_LIST_STRATEGY", "envvar;cdi-cri"}},
       "kdm plugin: DEVICE_LIST_STRATEGY (--device-list-strategy): \"envvar;cdi-cri\" is not"},
      {{},
       {{"DEVICE_ID_STRATEGY", "minor"}},
       "kdm plugin: DEVICE_ID_STRATEGY (--device-id-strategy): \"minor\" is not uuid or index"},
      {{"--device-id-strategy", "UUID"}, {}, "--device-id-strategy: \"UUID\" is not uuid or index"},
      {{"--fail-on-init-error=maybe"}, {}, "--fail-on-init-error: \"maybe\" is not true or false"},
      {{},
       {{"PASS_DEVICE_SPECS", "yes"}},
       "PASS_DEVICE_SPECS (--pass-device-specs): \"yes\" is not true or false"},
      {{"--mig-strategy", "single"}, {}, "--mig-strategy: \"single\" is not supported yet"},
      {{},
       {{"MIG_STRATEGY", "mixed"}},
       "MIG_STRATEGY (--mig-strategy): \"mixed\" is not supported yet: kdm serves whole GPUs only "
       "until MIG comes with issue 31"},
      {{"--mig-strategy", "all"}, {}, "--mig-strategy: \"all\" is not none, single or mixed"},
      {{"--config-file", "/etc/nvidia/config.yaml"},
       {},
       "--config-file: \"/etc/nvidia/config.yaml\": config files are not supported yet"},
      {{}, {{"CONFIG_FILE", "/c.yaml"}}, "CONFIG_FILE (--config-file): \"/c.yaml\": config files"},
      {{"--cdi-annotation-prefix", "cdi.k8s.io"},
       {},
       "--cdi-annotation-prefix: \"cdi.k8s.io\" must end with '/'"},
      {{"--cdi-annotation-prefix", "Bad Prefix/"}, {}, "must be a DNS-1123 subdomain"},
      {{"--driver-root", "run/nvidia/driver"},
       {},
       "--driver-root: \"run/nvidia/driver\" must be an absolute path on the host"},
      {{}, {{"NVIDIA_DEV_ROOT", "dev"}}, "NVIDIA_DEV_ROOT (--nvidia-dev-root): \"dev\" must be"},
      {{"--kubelet-socket", "/var/lib/kubelet/device-plugins/kubelet.socket"},
       {},
       "must name a file kubelet.sock"},
      {{"--kubelet-socket", "/var/lib/kubelet/device-plugins/kubelet.sock"},
       {},
       "is not in the plugin directory"},
  };
  for (const Case& c : cases) {
    UnsetNvidiaPluginVariables();
    for (const auto& [name, value] : c.env) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<std::string> args = {"--nvml", "--nvml-library", kFakeLibrary};
    args.insert(args.end(), c.args.begin(), c.args.end());
    EXPECT_EQ(Run(args), 2) << c.message << "\n" << err_;
    EXPECT_NE(err_.find(c.message), std::string::npos) << err_;
    // One line, then the usage hint.
    EXPECT_EQ(std::count(err_.begin(), err_.end(), '\n'), 2) << err_;
  }
}

TEST_F(NvmlPluginFlagsE2eTest, NvidiasFlagsNeedNvmlButItsVariablesDoNotTripOtherPlugins) {
  EXPECT_EQ(Run({"--resource", kGpu, "--count", "2", "--device-id-strategy", "index"}), 2);
  EXPECT_NE(err_.find("kdm plugin: --device-id-strategy needs --nvml"), std::string::npos) << err_;
  // A garbage variable is not read by a plugin without --nvml.
  ::setenv("DEVICE_ID_STRATEGY", "garbage", 1);
  ::setenv("CONFIG_FILE", "/c.yaml", 1);
  Process p({"plugin", "--root", root_, "--resource", kGpu, "--count", "2"}, root_ + "/count.log");
  ASSERT_TRUE(
      WaitUntil([&] { return p.Log().find("ready plugin=") != std::string::npos; }, kWaitBound))
      << p.Log();
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(), 0) << p.Log();
}

}  // namespace
}  // namespace kdm::e2e
