// `kdm kubelet` end to end: the built binary with `kdm plugin` processes,
// driven through files as a user would (manifests in, status files out):
// admission, the kubelet's rejection text, delete frees, change re-admits,
// init containers and sidecars, bad manifests keep the agent running,
// node.json, health drop, grace deletion, SIGKILL + restart recovers (both
// checkpoint formats), SIGTERM/SIGINT exit 0, usage errors, metrics (and its
// one event=metrics_serving line), docs/kubelet.md's quick start as written,
// README's command list against `kdm --help`.
// Every wait is a bounded poll on a file or a log line; nothing asserts on
// time.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/test/e2e/e2e_util.h"
#include "kdm/test/e2e/kubelet_fixture.h"

extern char** environ;

namespace kdm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using kdm::e2e::Gpus;
using kdm::e2e::HttpGet;
using kdm::e2e::KdmBinary;
using kdm::e2e::kFpga;
using kdm::e2e::kGpu;
using kdm::e2e::KubeletE2eTest;
using kdm::e2e::kWaitBound;
using kdm::e2e::PodYaml;
using kdm::e2e::Process;
using kdm::e2e::ReadFile;
using kdm::e2e::WaitUntil;
using kdm::e2e::WriteFileAtomically;
constexpr auto kBound = 30s;  // upper bound of every wait

TEST_F(KubeletE2eTest, AdmitRejectDeleteAndChange) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();

  WriteFileAtomically(Manifests() + "/a.yaml", PodYaml("a", 2));
  json a = WaitPhase("default_a", "Admitted");
  EXPECT_EQ(Gpus(a).size(), 2u);
  EXPECT_EQ(a["containers"][0]["envs"]["NVIDIA_VISIBLE_DEVICES"].get<std::string>().size() > 0,
            true);
  EXPECT_FALSE(a["containers"][0]["device_specs"].empty());

  WriteFileAtomically(Manifests() + "/b.yaml", PodYaml("b", 7));
  json b = WaitPhase("default_b", "Rejected");
  EXPECT_EQ(b["reason"], "UnexpectedAdmissionError");
  EXPECT_EQ(b["message"],
            "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
            "Requested: 7, Available: 6, which is unexpected");
  EXPECT_EQ(b["containers"], json::array());

  // Deleting a frees its GPUs and its status file.
  fs::remove(Manifests() + "/a.yaml");
  ASSERT_TRUE(WaitUntil([&] { return !fs::exists(StatusPath("default_a")); }, kWaitBound));
  // b stays rejected until its file changes: a later pod is handled first.
  WriteFileAtomically(Manifests() + "/c.yaml", PodYaml("c", 1));
  json c = WaitPhase("default_c", "Admitted");
  EXPECT_EQ(WaitPhase("default_b", "Rejected")["message"], b["message"]);

  // A changed file is admitted again (7 of the 7 now free).
  WriteFileAtomically(Manifests() + "/b.yaml", PodYaml("b", 7, "2"));
  b = WaitPhase("default_b", "Admitted");
  std::vector<std::string> b_gpus = Gpus(b);
  EXPECT_EQ(b_gpus.size(), 7u);
  for (const auto& id : Gpus(c)) EXPECT_THAT(b_gpus, ::testing::Not(::testing::Contains(id)));
  // Changed again: the old version is freed first, then the new admitted.
  WriteFileAtomically(Manifests() + "/b.yaml", PodYaml("b", 3));
  b = WaitStatus("default_b", [](const json& j) { return Gpus(j).size() == 3; });
  EXPECT_EQ(b["phase"], "Admitted");
  // Renamed inside its file: the old name's status goes, the new one comes.
  WriteFileAtomically(Manifests() + "/b.yaml", PodYaml("b2", 3));
  EXPECT_EQ(Gpus(WaitPhase("default_b2", "Admitted")).size(), 3u);
  EXPECT_TRUE(WaitUntil([&] { return !fs::exists(StatusPath("default_b")); }, kWaitBound));
  EXPECT_TRUE(kubelet_->Running());
}

TEST_F(KubeletE2eTest, InitContainerDevicesPassToTheAppContainerAndSidecarsKeepTheirs) {
  StartKubelet();
  StartGpuPlugin();
  StartPlugin({"--resource", kFpga, "--count", "4"});
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8) && Allocatable(kFpga, 4); }, kWaitBound));
  WriteFileAtomically(Manifests() + "/p.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ml}
spec:
  initContainers:
  - name: fetch
    resources: {limits: {nvidia.com/gpu: 1}}
  - name: proxy
    restartPolicy: Always
    resources: {limits: {example.com/fpga: 1}}
  containers:
  - name: main
    resources:
      limits: {nvidia.com/gpu: 2, example.com/fpga: 1}
      requests: {nvidia.com/gpu: 2, example.com/fpga: 1}
)");
  json p = WaitPhase("ml_p", "Admitted");
  ASSERT_EQ(p["containers"].size(), 3u);
  EXPECT_EQ(p["containers"][0]["name"], "fetch");
  EXPECT_EQ(p["containers"][1]["name"], "proxy");
  EXPECT_EQ(p["containers"][2]["name"], "main");
  auto init = Gpus(p, "fetch");
  auto main = Gpus(p, "main");
  ASSERT_EQ(init.size(), 1u);
  ASSERT_EQ(main.size(), 2u);
  EXPECT_THAT(main, ::testing::Contains(init[0]));  // reused from the init container
  auto proxy_fpga = p["containers"][1]["devices"][kFpga];
  auto main_fpga = p["containers"][2]["devices"][kFpga];
  ASSERT_EQ(proxy_fpga.size(), 1u);
  ASSERT_EQ(main_fpga.size(), 1u);
  EXPECT_NE(proxy_fpga[0], main_fpga[0]);  // a sidecar keeps its device
}

TEST_F(KubeletE2eTest, BadManifestsAreRejectedAndTheAgentKeepsRunning) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound));
  const std::string pod =
      "apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec:\n"
      "  containers:\n  - name: c\n    resources:\n";
  auto named = [&](const std::string& name, const std::string& resources) {
    return std::regex_replace(pod, std::regex("NAME"), name) + resources;
  };
  struct Bad {
    std::string file, status, text, message;
  };
  std::vector<Bad> bad = {
      {"yaml.yaml", "manifest_yaml.yaml", "kind: [Pod\n",
       "yaml.yaml: invalid YAML at line 2, column 1"},
      {"notpod.yaml", "manifest_notpod.yaml",
       "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
       "notpod.yaml: kind: not a Pod: kind is \"Deployment\""},
      {"noname.json", "manifest_noname.json",
       R"({"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"containers": []}})",
       "noname.json: metadata.name: missing"},
      {"nolimit.yaml", "default_nolimit", named("nolimit", "      requests: {nvidia.com/gpu: 1}\n"),
       "nolimit.yaml: spec.containers[0].resources.requests[nvidia.com/gpu]: device resource "
       "\"nvidia.com/gpu\" is requested without a limit"},
      {"neq.yaml", "default_neq",
       named("neq", "      limits: {nvidia.com/gpu: 2}\n      requests: {nvidia.com/gpu: 1}\n"),
       "neq.yaml: spec.containers[0].resources.requests[nvidia.com/gpu]: must be equal to the "
       "limit \"2\""},
      {"unknown.yaml", "default_unknown", named("unknown", "      limits: {gpu: 1}\n"),
       "unknown.yaml: spec.containers[0].resources.limits[gpu]: unknown resource \"gpu\""},
      {"neg.yaml", "default_neg", named("neg", "      limits: {nvidia.com/gpu: -2}\n"),
       "neg.yaml: spec.containers[0].resources.limits[nvidia.com/gpu]: must be greater than or "
       "equal to 0"},
      {"frac.yaml", "default_frac", named("frac", "      limits: {nvidia.com/gpu: 0.5}\n"),
       "frac.yaml: spec.containers[0].resources.limits[nvidia.com/gpu]: must be a whole number "
       "of devices, got \"0.5\""},
      {"dup.yaml", "default_dup",
       "apiVersion: v1\nkind: Pod\nmetadata: {name: dup}\nspec: {containers: [{name: x}, {name: "
       "x}]}\n",
       "dup.yaml: spec.containers[1].name: duplicate container name \"x\""},
  };
  for (const auto& b : bad) WriteFileAtomically(Manifests() + "/" + b.file, b.text);
  {
    // 10 MB: refused without being read whole.
    std::ofstream out(Manifests() + "/.huge.tmp");
    std::string line = "# " + std::string(1000, 'x') + "\n";
    for (int i = 0; i < 10 * 1000; ++i) out << line;
  }
  fs::rename(Manifests() + "/.huge.tmp", Manifests() + "/huge.yaml");
  bad.push_back({"huge.yaml", "manifest_huge.yaml", "",
                 "huge.yaml: file is larger than the 1048576-byte manifest limit"});
  // A pod asking for a resource no plugin registered.
  WriteFileAtomically(Manifests() + "/unreg.yaml",
                      named("unreg", "      limits: {example.com/nic: 1}\n"));
  bad.push_back({"unreg.yaml", "default_unreg", "",
                 "Allocate failed due to cannot allocate unregistered device example.com/nic, "
                 "which is unexpected"});
  for (const auto& b : bad) {
    json s = WaitPhase(b.status, "Rejected");
    EXPECT_THAT(s.value("message", ""), HasSubstr(b.message)) << b.file;
    EXPECT_EQ(s["reason"], b.file == "unreg.yaml" ? "UnexpectedAdmissionError" : "InvalidManifest")
        << b.file;
  }
  EXPECT_TRUE(kubelet_->Running());
  // Still admitting, and fixing a bad file admits it.
  WriteFileAtomically(Manifests() + "/good.yaml", PodYaml("good", 1));
  WaitPhase("default_good", "Admitted");
  WriteFileAtomically(Manifests() + "/frac.yaml",
                      named("frac", "      limits: {nvidia.com/gpu: 1}\n"));
  WaitPhase("default_frac", "Admitted");
  // Removing a bad manifest removes its status.
  fs::remove(Manifests() + "/yaml.yaml");
  EXPECT_TRUE(WaitUntil([&] { return !fs::exists(StatusPath("manifest_yaml.yaml")); }, kWaitBound));
  // Editors' temporary files are not manifests.
  WriteFileAtomically(Manifests() + "/good.yaml~", PodYaml("backup", 1));
  WriteFileAtomically(Manifests() + "/last.yaml", PodYaml("last", 1));
  WaitPhase("default_last", "Admitted");
  EXPECT_FALSE(fs::exists(StatusPath("default_backup")));
}

TEST_F(KubeletE2eTest, NodeJsonHealthDropAndGraceDeletion) {
  StartKubelet({"--grace", "300ms"});
  StartGpuPlugin();
  Process& fpga = StartPlugin({"--resource", kFpga, "--count", "4"});
  // The registration counter is bumped after the devices arrive; node.json
  // catches up at its next refresh.
  ASSERT_TRUE(WaitUntil(
      [&] {
        json n = Node();
        return Allocatable(kGpu, 8) && Allocatable(kFpga, 4) && n.value("registrations", 0) >= 2;
      },
      kWaitBound))
      << Node().dump();
  json node = Node();
  EXPECT_EQ(node["capacity"][kGpu], 8);
  EXPECT_EQ(node["plugins"][1],
            json({{"resource", kGpu}, {"state", "Healthy"}, {"devices", 8}, {"healthy", 8}}));
  EXPECT_EQ(node["deleted_resources"], json::array());

  WriteFileAtomically(root_ + "/health.json", R"({"GPU3": "Unhealthy"})");
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 7); }, kWaitBound)) << Node().dump();
  EXPECT_EQ(Node()["capacity"][kGpu], 8);

  fpga.Signal(SIGTERM);
  EXPECT_EQ(fpga.Wait(), 0);
  ASSERT_TRUE(WaitUntil(
      [&] {
        json n = Node();
        return n.contains("deleted_resources") && n["deleted_resources"] == json({kFpga});
      },
      kWaitBound))
      << Node().dump();
  EXPECT_FALSE(Node()["capacity"].contains(kFpga));
}

class KubeletRestartTest : public KubeletE2eTest,
                           public ::testing::WithParamInterface<const char*> {};

TEST_P(KubeletRestartTest, SigkillAndRestartRecoversEveryAllocation) {
  StartKubelet({"--checkpoint", GetParam()});
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound));
  WriteFileAtomically(Manifests() + "/a.yaml", PodYaml("a", 2));
  WriteFileAtomically(Manifests() + "/b.yaml", PodYaml("b", 4));
  auto a = Gpus(WaitPhase("default_a", "Admitted"));
  auto b = Gpus(WaitPhase("default_b", "Admitted"));
  ASSERT_EQ(a.size() + b.size(), 6u);

  kubelet_->Signal(SIGKILL);
  EXPECT_EQ(kubelet_->Wait(), 128 + SIGKILL);
  // While it is down: b's manifest goes away, c arrives.
  fs::remove(Manifests() + "/b.yaml");
  WriteFileAtomically(Manifests() + "/c.yaml", PodYaml("c", 6));
  StartKubelet({"--checkpoint", GetParam()});

  // The plugin registers again; a keeps its GPUs, b's are collected and
  // given to c.
  ASSERT_TRUE(WaitUntil(
      [&] {
        return kubelet_->Log().find("event=pod_admitted file=\"a.yaml\" pod=default/a") !=
               std::string::npos;
      },
      kWaitBound))
      << kubelet_->Log();
  EXPECT_THAT(kubelet_->Log(), HasSubstr("recovered=true"));
  EXPECT_EQ(Gpus(WaitPhase("default_a", "Admitted")), a);
  json c = WaitPhase("default_c", "Admitted");
  auto c_gpus = Gpus(c);
  EXPECT_EQ(c_gpus.size(), 6u);
  for (const auto& id : a) EXPECT_THAT(c_gpus, ::testing::Not(::testing::Contains(id)));
  // b's status file went with its manifest.
  EXPECT_TRUE(WaitUntil([&] { return !fs::exists(StatusPath("default_b")); }, kWaitBound));
  EXPECT_TRUE(Allocatable(kGpu, 8));
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, KubeletRestartTest,
                         ::testing::Values("sqlite", "kubelet-json"), [](const auto& info) {
                           return std::string(info.param) == "sqlite" ? "Sqlite" : "KubeletJson";
                         });

TEST_F(KubeletE2eTest, RejectedPodStaysRejectedAcrossARestart) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound));
  WriteFileAtomically(Manifests() + "/big.yaml", PodYaml("big", 9));
  std::string message = WaitPhase("default_big", "Rejected")["message"];
  kubelet_->Signal(SIGTERM);
  ASSERT_EQ(kubelet_->Wait(), 0);
  StartKubelet();
  ASSERT_TRUE(WaitUntil(
      [&] {
        return kubelet_->Log().find("event=pod_still_rejected file=\"big.yaml\"") !=
               std::string::npos;
      },
      kWaitBound))
      << kubelet_->Log();
  EXPECT_EQ(WaitPhase("default_big", "Rejected")["message"], message);
}

TEST_F(KubeletE2eTest, SigtermAndSigintExitZero) {
  for (int sig : {SIGTERM, SIGINT}) {
    StartKubelet();
    ASSERT_TRUE(
        WaitUntil([&] { return fs::exists(root_ + "/pod-resources/kubelet.sock"); }, kWaitBound));
    ASSERT_TRUE(fs::exists(root_ + "/device-plugins/kubelet.sock"));
    kubelet_->Signal(sig);
    EXPECT_EQ(kubelet_->Wait(), 0) << kubelet_->Log();
    EXPECT_THAT(kubelet_->Log(), HasSubstr("event=stopped"));
    fs::remove(root_ + "/status/node.json");
  }
}

TEST_F(KubeletE2eTest, UsageErrorsExitTwo) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"kubelet"}, "--root is required"},
      {{"kubelet", "--root", root_, "--checkpoint", "xml"}, "--checkpoint"},
      {{"kubelet", "--root", root_, "--grace", "5 minutes"}, "--grace: invalid duration"},
      {{"kubelet", "--root", root_, "--rpc-timeout", "10"},
       "a number needs a unit (did you mean 10s?"},
      {{"kubelet", "--root", root_, "--rpc-timeout", "3d"}, "unknown unit \"d\""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Process p(cases[i].args, root_ + "/usage" + std::to_string(i) + ".out");
    EXPECT_EQ(p.Wait(), 2) << p.Log();
    EXPECT_THAT(p.Log(), HasSubstr(cases[i].message));
  }
  // A root that cannot be created: runtime error, exit 1.
  std::ofstream(root_ + "/file") << "x";
  Process p({"kubelet", "--root", root_ + "/file/sub"}, root_ + "/usage-root.out");
  EXPECT_EQ(p.Wait(), 1) << p.Log();
  EXPECT_THAT(p.Log(), HasSubstr(root_ + "/file/sub"));
}

TEST_F(KubeletE2eTest, MetricsServedWhenAsked) {
  StartKubelet({"--metrics-addr", "127.0.0.1:0"});
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound));
  std::smatch m;
  std::string log = kubelet_->Log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("event=metrics_serving addr=\\S+ port=(\\d+)")))
      << log;
  int port = std::stoi(m[1]);
  WriteFileAtomically(Manifests() + "/a.yaml", PodYaml("a", 2));
  WaitPhase("default_a", "Admitted");
  EXPECT_THAT(HttpGet(port, "/healthz"), HasSubstr("ok"));
  std::string metrics = HttpGet(port, "/metrics");
  EXPECT_THAT(metrics,
              HasSubstr("kdm_resource_allocatable_devices{resource_name=\"nvidia.com/gpu\"} 8"));
  EXPECT_THAT(metrics, HasSubstr("kdm_allocations_total 1"));
  EXPECT_THAT(metrics, HasSubstr("kdm_plugin_endpoints{state=\"connected\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("kdm_plugin_endpoints{state=\"stopped\"} 0"));
  // The kubelet's own metric names, fed by the Manager as events happen.
  EXPECT_THAT(
      metrics,
      HasSubstr("kubelet_device_plugin_registration_total{resource_name=\"nvidia.com/gpu\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("kubelet_device_plugin_alloc_duration_seconds_count{resource_name="
                                 "\"nvidia.com/gpu\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("kdm_checkpoint_write_seconds_count"));
  EXPECT_THAT(HttpGet(port, "/nope"), HasSubstr("404"));
  // The live agent's exposition passes promtool (Debian package prometheus,
  // installed by ./run; a missing promtool fails here).
  size_t body = metrics.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  std::ofstream(root_ + "/metrics.txt") << metrics.substr(body + 4);
  std::string cmd =
      "promtool check metrics < " + root_ + "/metrics.txt > " + root_ + "/promtool.out 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadFile(root_ + "/promtool.out");
}

// Issue 30, item 10: the agent logged event=metrics_serving twice, once with
// address= and once with addr=. One line, one key name.
TEST_F(KubeletE2eTest, RegressionMetricsServingIsLoggedOnceWithAddr) {
  StartKubelet({"--metrics-addr", "127.0.0.1:0"});
  // agent_started comes after the metrics server has started.
  ASSERT_TRUE(WaitUntil(
      [&] { return kubelet_->Log().find("event=agent_started") != std::string::npos; }, kBound))
      << kubelet_->Log();
  const std::string log = kubelet_->Log();
  size_t lines = 0;
  for (size_t p = log.find("event=metrics_serving"); p != std::string::npos;
       p = log.find("event=metrics_serving", p + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << log;
  EXPECT_TRUE(
      std::regex_search(log, std::regex(R"(event=metrics_serving addr=127\.0\.0\.1:0 port=\d+\n)")))
      << log;
  EXPECT_EQ(log.find("address="), std::string::npos) << log;
}

// Issue 30, item 10: docs/kubelet.md's quick start wrote the manifest and read
// the status file without waiting for the agent. Its lines, as the doc shows
// them (another directory, the built kdm), end with the pod admitted.
TEST_F(KubeletE2eTest, QuickStartAsTheDocShowsIt) {
  const std::string doc = ReadFile(std::string(KDM_TEST_SOURCE_DIR) + "/docs/kubelet.md");
  const size_t begin = doc.find("```sh\n");
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc.find("```\n", begin + 6);
  ASSERT_NE(end, std::string::npos);
  std::string script = doc.substr(begin + 6, end - begin - 6);
  ASSERT_NE(script.find("until "), std::string::npos) << script;
  const std::string node = root_ + "/node";
  for (size_t p = script.find("/tmp/node"); p != std::string::npos;
       p = script.find("/tmp/node", p + node.size())) {
    script.replace(p, 9, node);
  }
  // `kdm` on PATH is the built one; the doc's background jobs (the agent and
  // the plugin) get SIGTERM when the script ends, however it ends.
  fs::create_directory(root_ + "/bin");
  fs::create_symlink(KdmBinary(), root_ + "/bin/kdm");
  std::ofstream(root_ + "/quickstart.sh") << "PATH='" << root_ << "/bin':\"$PATH\"\n"
                                          << "trap 'exit 1' TERM\n"
                                          << "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n"
                                          << "set -e\n"
                                          << script;
  // The doc's own waits are unbounded; timeout bounds them here.
  Process run("/usr/bin/timeout", {"25", "bash", root_ + "/quickstart.sh"},
              root_ + "/quickstart.log");
  ASSERT_TRUE(run.started());
  EXPECT_EQ(run.Wait(), 0) << run.Log();
  const std::string log = run.Log();
  EXPECT_TRUE(std::regex_search(log, std::regex(R"("phase": *"Admitted")"))) << log;
  json status = json::parse(ReadFile(node + "/status/default_train.json"), nullptr, false);
  ASSERT_FALSE(status.is_discarded()) << log;
  EXPECT_EQ(status["phase"], "Admitted") << log;
}

// Issue 30, item 10: README's command list lacked subcommands `kdm --help`
// shows. Every one of them is in the README's list.
TEST(ReadmeTest, ListsEverySubcommandKdmHelpShows) {
  char tmpl[] = "/tmp/kdm-rd-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::string help;
  {
    Process p({"--help"}, dir + "/help.log");
    ASSERT_TRUE(p.started());
    EXPECT_EQ(p.Wait(), 0) << p.Log();
    help = p.Log();
  }
  fs::remove_all(dir);
  const std::string readme = ReadFile(std::string(KDM_TEST_SOURCE_DIR) + "/README.md");
  const size_t at = readme.find("(`kdm --help`):");
  ASSERT_NE(at, std::string::npos) << "README.md has no `kdm --help` list";
  const std::string list = readme.substr(at, readme.find(".\n", at) - at);
  ASSERT_NE(help.find("Subcommands:"), std::string::npos) << help;
  std::istringstream lines(help.substr(help.find("Subcommands:")));
  std::string line;
  std::getline(lines, line);  // "Subcommands:"
  int names = 0;
  while (std::getline(lines, line) && !line.empty()) {
    std::istringstream words(line);
    std::string name;
    if (!(words >> name)) break;
    ++names;
    EXPECT_NE(list.find("`" + name + "`"), std::string::npos)
        << "README.md's command list lacks `" << name << "`: " << list;
  }
  EXPECT_GE(names, 9) << help;
}

}  // namespace
}  // namespace kdm
