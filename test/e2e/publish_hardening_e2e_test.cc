// `kdm publish` and `kdm topo --nvml` under hostile or oversized NVML input
// (issue 28, items 11 and 12): the real kdm binary on the fake
// libnvidia-ml.so.1 (test/nvml/), with node descriptions written here.
//   - a GPU whose UUID, name and driver version hold a newline, an ESC and a
//     forged `event=` text: no output line starts with the forged text, no
//     raw ESC byte reaches stdout or stderr (table output included);
//   - a 256-GPU node: `--topology nvidia.com/gpu=nvml` would make an
//     annotation of about 800 KB, over the API server's 256 KiB: refused with
//     one line naming the size and the limit, nothing printed (--dry-run)
//     and nothing sent to the API server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/test/e2e/kubelet_fixture.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/nvml/fake_nvml/fake_sysfs.h"

namespace kdm::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const std::string kHardeningFakeLibrary = KDM_FAKE_NVML_LIBRARY;

// A fake NVML node of `n` GPUs, every pair linked through the system (SYS).
nlohmann::json ManyGpuNode(int n) {
  nlohmann::json gpus = nlohmann::json::array();
  for (int i = 0; i < n; ++i) {
    char uuid[64], bus[32];
    std::snprintf(uuid, sizeof uuid, "GPU-%08x-0000-4000-8000-%012x", i, i);
    std::snprintf(bus, sizeof bus, "%08X:%02X:00.0", i / 128, i % 128 + 1);
    gpus.push_back({{"uuid", uuid},
                    {"name", "NVIDIA H100 80GB HBM3"},
                    {"minor", i},
                    {"memory_mib", 81559},
                    {"pci_bus_id", bus},
                    {"numa", i % 2},
                    {"compute_capability", "9.0"},
                    {"brand", "nvidia"}});
  }
  return {{"driver_version", "550.54.15"}, {"cuda_driver_version", 12040}, {"gpus", gpus}};
}

class PublishHardeningE2eTest : public KubeletE2eTest {
 protected:
  void TearDown() override {
    ::unsetenv("KDM_FAKE_NVML_NODE");
    KubeletE2eTest::TearDown();
  }
  // Writes the node description and its sysfs half; the fake reads it from
  // KDM_FAKE_NVML_NODE, which every process started afterwards inherits.
  void UseNode(const nlohmann::json& node) {
    const std::string path = root_ + "/node.json";
    std::ofstream(path) << node.dump();
    ASSERT_EQ(nvml::test::WriteFakeSysfs(path, Sysfs()), "");
    ::setenv("KDM_FAKE_NVML_NODE", path.c_str(), 1);
  }
  std::string Sysfs() const { return root_ + "/sys"; }
  // Writes ROOT/ca.pem and ROOT/kubeconfig (token auth against `url`);
  // the kubeconfig's path.
  std::string WriteKubeconfig(const std::string& url, const std::string& ca_pem) const {
    std::ofstream(root_ + "/ca.pem") << ca_pem;
    const std::string path = root_ + "/kubeconfig";
    std::ofstream(path) << "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
                           "clusters:\n- name: test\n  cluster:\n    server: "
                        << url << "\n    certificate-authority: " << root_
                        << "/ca.pem\nusers:\n- name: kdm\n  user:\n    token: secret-token\n"
                           "contexts:\n- name: test\n  context:\n    cluster: test\n"
                           "    user: kdm\n";
    return path;
  }
  std::string Socket() const { return root_ + "/pod-resources/kubelet.sock"; }
  std::vector<std::string> NvmlFlags() const {
    return {"--nvml-library", kHardeningFakeLibrary, "--sysfs-root", Sysfs()};
  }
  std::vector<std::string> PublishArgs(std::vector<std::string> extra) const {
    std::vector<std::string> args = {
        "publish", "--node-name", "gpu-node-7",         "--pod-resources-socket",
        Socket(),  "--topology",  "nvidia.com/gpu=nvml"};
    for (const std::string& f : NvmlFlags()) args.push_back(f);
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  // Runs `kdm ARGS...` to its end: exit code, stdout in out_, stderr in err_.
  int Run(const std::vector<std::string>& args) {
    const std::string n = std::to_string(runs_++);
    Process p(args, root_ + "/run" + n + ".out", root_ + "/run" + n + ".err");
    std::optional<int> code = p.Wait();
    out_ = p.Out();
    err_ = p.Err();
    return code.value_or(-1);
  }
  // `kdm plugin --nvml` on the node, registered with the kubelet.
  void StartNvmlPlugin(int gpus) {
    fs::create_directories(root_ + "/host/dev");
    for (const char* n : {"nvidiactl", "nvidia-uvm"}) {
      std::ofstream(root_ + "/host/dev/" + n).flush();
    }
    std::vector<std::string> args = {"--nvml"};
    for (const std::string& f : NvmlFlags()) args.push_back(f);
    args.insert(args.end(), {"--dev-root", root_ + "/host"});
    StartPlugin(args);
    ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, gpus); }, kWaitBound))
        << plugins_.back()->Log();
  }

  int runs_ = 0;
  std::string out_, err_;
};

// Every line of `text` that starts with `forged`, and whether a raw ESC is in it.
void ExpectNoForgedLine(const std::string& what, const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    EXPECT_THAT(line, Not(StartsWith("event=forged"))) << what << ":\n" << text;
  }
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << what << " holds a raw ESC:\n" << text;
}

TEST_F(PublishHardeningE2eTest, DriverTextWithNewlinesAndEscapesForgesNoLine) {
  // GPU 0's UUID, name and the driver version hold a newline, an ESC and a
  // forged event; its one NVLink leads nowhere, so a warning names the UUID.
  nlohmann::json node = ManyGpuNode(2);
  node["driver_version"] = "550.54\nevent=forged_driver \x1b[2J";
  node["gpus"][0]["uuid"] = "GPU-1\nevent=forged_uuid x=\x1b[31mred";
  node["gpus"][0]["name"] = "H100\nevent=forged_name \x1b]0;title\x07";
  node["gpus"][0]["nvlinks"] = {{{"remote_bus_id", "00000000:99:00.0"}, {"count", 1}}};
  UseNode(node);
  StartKubelet();

  // `kdm topo --nvml`: the table, and the JSON.
  std::vector<std::string> topo = {"topo", "--nvml"};
  for (const std::string& f : NvmlFlags()) topo.push_back(f);
  ASSERT_EQ(Run(topo), 0) << err_;
  ExpectNoForgedLine("kdm topo --nvml stdout", out_);
  ExpectNoForgedLine("kdm topo --nvml stderr", err_);
  // The table shows the UUID quoted and escaped, still recognisable.
  EXPECT_THAT(out_, HasSubstr(R"("GPU-1\nevent=forged_uuid x=\x1b[31mred")")) << out_;
  EXPECT_THAT(err_, HasSubstr("warning: GPU \"GPU-1\\nevent=forged_uuid")) << err_;
  topo.push_back("--json");
  ASSERT_EQ(Run(topo), 0) << err_;
  ExpectNoForgedLine("kdm topo --nvml --json stdout", out_);
  ExpectNoForgedLine("kdm topo --nvml --json stderr", err_);
  // --size names the chosen devices by their ids.
  topo.pop_back();
  topo.insert(topo.end(), {"--size", "2"});
  ASSERT_EQ(Run(topo), 0) << err_;
  ExpectNoForgedLine("kdm topo --nvml --size stdout", out_);

  // `kdm publish --dry-run`: warnings on stderr, the annotation on stdout
  // (with the node's GPUs registered: a --topology for a resource the node
  // does not have is an error, issue 30).
  StartNvmlPlugin(2);
  ASSERT_EQ(Run(PublishArgs({"--dry-run"})), 0) << err_;
  ExpectNoForgedLine("kdm publish stdout", out_);
  ExpectNoForgedLine("kdm publish stderr", err_);
  EXPECT_THAT(err_, HasSubstr("GPU \"GPU-1\\nevent=forged_uuid")) << err_;
}

TEST_F(PublishHardeningE2eTest, AnnotationOverTheApiServersLimitIsRefusedAndNeverSent) {
  UseNode(ManyGpuNode(256));
  StartKubelet();
  StartNvmlPlugin(256);

  // --dry-run: one line naming the size and the limit, nothing on stdout.
  EXPECT_EQ(Run(PublishArgs({"--dry-run"})), 1) << err_;
  EXPECT_EQ(out_.size(), 0u) << out_.size() << " bytes printed";
  EXPECT_THAT(err_, HasSubstr("262144 bytes (256 KiB")) << err_;
  EXPECT_THAT(err_, HasSubstr("the value would be at least ")) << err_;
  EXPECT_EQ(std::count(err_.begin(), err_.end(), '\n'), 1) << err_;

  // Against an API server: it exits with the same line and sends nothing.
  StatusOr<kube::test::TestPki> pki = kube::test::MakeTestPki();
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto server = kube::test::TestApiServer::Start(
      {.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->SetHandler([](const kube::test::RecordedRequest&) {
    return kube::test::Reply{.status = 200, .body = "{}"};
  });
  const std::string kubeconfig = WriteKubeconfig((*server)->url(), pki->ca.cert_pem);
  EXPECT_EQ(Run(PublishArgs({"--kubeconfig", kubeconfig})), 1) << err_;
  EXPECT_THAT(err_, HasSubstr("262144 bytes (256 KiB")) << err_;
  EXPECT_EQ((*server)->RequestCount(), 0u);
  (*server)->Stop();
}

TEST_F(PublishHardeningE2eTest, DevicesAloneOverTheLimitAreNeverSent) {
  // Two resources of 1,024 devices with 60-byte names and no topology: the
  // check at start passes, the value (about 350 KB) is made by the loop.
  const std::string a = "example.com/" + std::string(60, 'a');
  const std::string b = "example.com/" + std::string(60, 'b');
  StartKubelet();
  StartPlugin({"--resource", a, "--count", "1024", "--socket-name", "a.sock"});
  StartPlugin({"--resource", b, "--count", "1024", "--socket-name", "b.sock"});
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(a, 1024) && Allocatable(b, 1024); }, kWaitBound));

  EXPECT_EQ(Run({"publish", "--node-name", "gpu-node-7", "--pod-resources-socket", Socket(),
                 "--dry-run"}),
            1)
      << err_;
  EXPECT_EQ(out_.size(), 0u) << out_.size() << " bytes printed";
  EXPECT_THAT(err_, HasSubstr("over the limit of 262144 bytes")) << err_;

  StatusOr<kube::test::TestPki> pki = kube::test::MakeTestPki();
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto server = kube::test::TestApiServer::Start(
      {.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->SetHandler([](const kube::test::RecordedRequest&) {
    return kube::test::Reply{.status = 200, .body = "{}"};
  });
  const std::string kubeconfig = WriteKubeconfig((*server)->url(), pki->ca.cert_pem);
  Process publish(
      {"publish", "--node-name", "gpu-node-7", "--pod-resources-socket", Socket(), "--kubeconfig",
       kubeconfig, "--interval", "100ms", "--min-write-interval", "100ms"},
      root_ + "/publish.log");
  ASSERT_TRUE(WaitUntil(
      [&] { return publish.Log().find("event=publish_annotation_too_large") != std::string::npos; },
      kWaitBound))
      << publish.Log();
  // Several polls later: still no request, one line for all of them.
  ASSERT_TRUE(WaitUntil(
      [&] { return publish.Log().find("event=publish_write_failed") != std::string::npos; },
      kWaitBound))
      << publish.Log();
  EXPECT_EQ((*server)->RequestCount(), 0u) << publish.Log();
  const std::string log = publish.Log();
  EXPECT_THAT(log, HasSubstr("limit=262144 total=1 ")) << log;
  (*server)->Stop();
}

// The same value made by `kdm kubelet --publish`: never sent, and counted in
// the agent's metrics (kdm_publish_annotation_too_large_total).
TEST_F(PublishHardeningE2eTest, KubeletPublishCountsAnnotationsOverTheLimitInItsMetrics) {
  const std::string a = "example.com/" + std::string(60, 'a');
  const std::string b = "example.com/" + std::string(60, 'b');
  StatusOr<kube::test::TestPki> pki = kube::test::MakeTestPki();
  ASSERT_TRUE(pki.ok()) << pki.status();
  auto server = kube::test::TestApiServer::Start(
      {.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->SetHandler([](const kube::test::RecordedRequest&) {
    return kube::test::Reply{.status = 200, .body = "{}"};
  });
  const std::string kubeconfig = WriteKubeconfig((*server)->url(), pki->ca.cert_pem);
  StartKubelet({"--metrics-addr", "127.0.0.1:0", "--publish", "--node-name", "gpu-node-7",
                "--kubeconfig", kubeconfig, "--interval", "100ms", "--min-write-interval",
                "100ms"});
  StartPlugin({"--resource", a, "--count", "1024", "--socket-name", "a.sock"});
  StartPlugin({"--resource", b, "--count", "1024", "--socket-name", "b.sock"});
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(a, 1024) && Allocatable(b, 1024); }, kWaitBound));
  std::smatch m;
  const std::string log = kubelet_->Log();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("event=metrics_serving addr=\\S+ port=(\\d+)")))
      << log;
  const int port = std::stoi(m[1]);
  std::string metrics;
  ASSERT_TRUE(WaitUntil(
      [&] {
        metrics = HttpGet(port, "/metrics");
        return std::regex_search(metrics,
                                 std::regex("\nkdm_publish_annotation_too_large_total [1-9]"));
      },
      kWaitBound))
      << metrics << kubelet_->Log();
  EXPECT_THAT(kubelet_->Log(), HasSubstr("event=publish_annotation_too_large"));
  // Values from before both plugins registered may have been sent, never
  // one over the limit.
  for (const kube::test::RecordedRequest& r : (*server)->Requests()) {
    EXPECT_LT(r.body.size(), k8s::kMaxAnnotationBytes) << r.method << " " << r.target;
  }
  (*server)->Stop();
}

}  // namespace
}  // namespace kdm::e2e
