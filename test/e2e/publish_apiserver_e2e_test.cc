// `kdm publish` and `kdm kubelet --publish` writing to an API server: the
// real binaries (`kdm kubelet`, `kdm plugin`, `kdm publish`) against the
// in-tree HTTPS test API server (test/kube/test_api_server.h, certificates
// made at test time) reached through a kubeconfig, as on a cluster node:
//   - an admitted pod shows up as fewer available devices in the next PATCH;
//   - 50 admissions in a burst give a bounded number of PATCHes (bound derived
//     from --min-write-interval and the burst's measured length), the last
//     with the right value;
//   - the API server gone for 10 s (stopped, then restarted on its port):
//     publish keeps running and the value of now lands once it is back;
//   - `kdm kubelet --publish` patches its own Node;
//   - `--topology RESOURCE=nvml` with the fake NVML library (dry run);
//   - bad flags and files: clear one-line errors and exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/base/sync.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/test/e2e/kubelet_fixture.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/nvml/fake_nvml/fake_sysfs.h"
#include "kdm/topology/presets.h"

namespace kdm::e2e {
namespace {

using kube::test::Reply;
using kube::test::TestApiServer;
using ::testing::HasSubstr;

constexpr char kNode[] = "gpu-node-7";
const std::string kNodes = KDM_FAKE_NVML_NODES;
const std::string kFakeLibrary = KDM_FAKE_NVML_LIBRARY;

// One PATCH the server took.
struct Patch {
  std::string path;
  std::string content_type;
  std::string value;  // the kdm.io/devices annotation it set
  std::chrono::steady_clock::time_point at;
};

class PublishApiServerE2eTest : public KubeletE2eTest {
 protected:
  static void SetUpTestSuite() {
    StatusOr<kube::test::TestPki> pki = kube::test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = new kube::test::TestPki(std::move(*pki));
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override {
    KubeletE2eTest::SetUp();
    StartServer(0);
    ASSERT_NE(server_, nullptr);
    port_ = server_->port();
    std::ofstream(root_ + "/ca.pem") << pki_->ca.cert_pem;
    // A kubeconfig as kubectl writes one: the CA by a relative file name
    // (resolved against the kubeconfig's directory) and a bearer token.
    std::ofstream(Kubeconfig()) << "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
                                   "clusters:\n- name: test\n  cluster:\n    server: "
                                << server_->url()
                                << "\n    certificate-authority: ca.pem\n"
                                   "users:\n- name: kdm\n  user:\n    token: secret-token\n"
                                   "contexts:\n- name: test\n  context:\n    cluster: test\n"
                                   "    user: kdm\n";
  }
  void TearDown() override {
    ::unsetenv("KDM_FAKE_NVML_NODE");
    publish_.reset();
    if (server_) server_->Stop();
    server_.reset();
    KubeletE2eTest::TearDown();
  }

  // (Re)starts the server on `port` (0: any); PATCHes of our node are
  // recorded and answered 200, anything else 404.
  void StartServer(uint16_t port) {
    auto s = TestApiServer::Start(
        {.cert_pem = pki_->server.cert_pem, .key_pem = pki_->server.key_pem, .port = port});
    ASSERT_TRUE(s.ok()) << s.status() << " (port " << port << ")";
    server_ = std::move(*s);
    server_->SetHandler([this](const kube::test::RecordedRequest& r) { return Handle(r); });
  }
  Reply Handle(const kube::test::RecordedRequest& r) {
    if (r.method != "PATCH" || r.path != std::string("/api/v1/nodes/") + kNode) {
      return Reply{.status = 404, .body = R"({"kind":"Status","reason":"NotFound","code":404})"};
    }
    Patch p{r.path, "", "", std::chrono::steady_clock::now()};
    auto ct = r.headers.find("content-type");
    if (ct != r.headers.end()) p.content_type = ct->second;
    json body = json::parse(r.body, nullptr, false);
    if (!body.is_discarded() && body.size() == 1 && body.contains("metadata") &&
        body["metadata"].size() == 1 && body["metadata"].contains("annotations") &&
        body["metadata"]["annotations"].size() == 1 &&
        body["metadata"]["annotations"].contains("kdm.io/devices") &&
        body["metadata"]["annotations"]["kdm.io/devices"].is_string()) {
      p.value = body["metadata"]["annotations"]["kdm.io/devices"].get<std::string>();
    } else {
      p.value = "<malformed patch> " + r.body;
    }
    {
      MutexLock lock(&mu_);
      patches_.push_back(p);
    }
    return Reply{.status = 200, .body = R"({"kind":"Node","metadata":{"name":"gpu-node-7"}})"};
  }

  std::string Kubeconfig() const { return root_ + "/kubeconfig"; }
  std::string Socket() const { return root_ + "/pod-resources/kubelet.sock"; }

  std::vector<Patch> Patches() {
    MutexLock lock(&mu_);
    return patches_;
  }
  // The last PATCH's annotation, decoded (nullopt: none yet, or malformed).
  std::optional<k8s::DevicesAnnotation> Last() {
    std::vector<Patch> p = Patches();
    if (p.empty()) return std::nullopt;
    StatusOr<k8s::DevicesAnnotation> a = k8s::DecodeDevicesAnnotation(p.back().value);
    if (!a.ok()) return std::nullopt;
    return *a;
  }
  // The last PATCH lists exactly `available` free devices of `resource`,
  // none of them in `held`.
  bool LastShows(const std::string& resource, size_t available,
                 const std::set<std::string>& held = {}) {
    std::optional<k8s::DevicesAnnotation> a = Last();
    if (!a || !a->resources.count(resource)) return false;
    const auto& free = a->resources[resource].available;
    if (free.size() != available) return false;
    return std::none_of(free.begin(), free.end(),
                        [&](const std::string& id) { return held.count(id) > 0; });
  }
  std::string LastValue() {
    std::vector<Patch> p = Patches();
    return p.empty() ? "<no PATCH>" : p.back().value;
  }

  void StartPublish(std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "publish",    "--node-name", kNode, "--pod-resources-socket", Socket(), "--kubeconfig",
        Kubeconfig(), "-v",          "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    publish_ = std::make_unique<Process>(args, root_ + "/publish.log");
    ASSERT_TRUE(publish_->started());
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

  static kube::test::TestPki* pki_;
  std::unique_ptr<TestApiServer> server_;
  uint16_t port_ = 0;
  std::unique_ptr<Process> publish_;
  Mutex mu_;
  std::vector<Patch> patches_ ABSL_GUARDED_BY(mu_);
  int runs_ = 0;
  std::string out_, err_;
};

kube::test::TestPki* PublishApiServerE2eTest::pki_ = nullptr;

std::string FpgaPodYaml(const std::string& name) {
  return "apiVersion: v1\nkind: Pod\nmetadata:\n  name: " + name +
         "\nspec:\n  containers:\n  - name: main\n    resources:\n      limits:\n        "
         "example.com/fpga: 1\n";
}

TEST_F(PublishApiServerE2eTest, AnAdmittedPodShowsAsFewerAvailableInTheNextPatch) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();
  StartPublish({"--topology", "nvidia.com/gpu=preset:dgx1-v100", "--interval", "100ms",
                "--min-write-interval", "200ms"});
  ASSERT_TRUE(WaitUntil([&] { return LastShows(kGpu, 8); }, kWaitBound)) << LastValue() << "\n"
                                                                         << publish_->Log();
  {
    std::vector<Patch> p = Patches();
    EXPECT_EQ(p[0].path, "/api/v1/nodes/gpu-node-7");
    EXPECT_EQ(p[0].content_type, "application/merge-patch+json");
    std::vector<kube::test::RecordedRequest> seen = server_->Requests();
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen[0].headers["authorization"], "Bearer secret-token");
    std::optional<k8s::DevicesAnnotation> a = Last();
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->node, kNode);
    ASSERT_TRUE(a->resources[kGpu].topology.has_value());
    EXPECT_EQ(*a->resources[kGpu].topology, *topology::Preset("dgx1-v100"));
  }
  const size_t before = Patches().size();

  WriteFileAtomically(Manifests() + "/train.yaml", PodYaml("train", 2));
  std::vector<std::string> held = Gpus(WaitPhase("default_train", "Admitted"));
  ASSERT_EQ(held.size(), 2u);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return LastShows(kGpu, 6, {held.begin(), held.end()});
      },
      kWaitBound))
      << LastValue() << "\n"
      << publish_->Log();
  // The first PATCH after the admission already has it: dedupe writes
  // nothing while nothing changes, so the next write is the changed value.
  std::vector<Patch> p = Patches();
  ASSERT_GT(p.size(), before);
  auto next = k8s::DecodeDevicesAnnotation(p[before].value);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->resources[kGpu].available.size(), 6u) << p[before].value;
  // The same PATCH names the pod that holds them (pod-resources List, over
  // the socket); no --plugin-policy: no policy.
  EXPECT_EQ(next->pods, std::vector<uint64_t>{k8s::PodFingerprint("default", "train")})
      << p[before].value;
  EXPECT_EQ(next->resources[kGpu].policy, std::nullopt);

  // Deleting the pod frees them again.
  fs::remove(Manifests() + "/train.yaml");
  ASSERT_TRUE(WaitUntil([&] { return LastShows(kGpu, 8); }, kWaitBound)) << LastValue();
  publish_->Signal(SIGTERM);
  EXPECT_EQ(publish_->Wait(), 0) << publish_->Log();
}

TEST_F(PublishApiServerE2eTest, FiftyAdmissionsInABurstGiveABoundedNumberOfPatches) {
  StartKubelet();
  StartPlugin({"--resource", kFpga, "--count", "64"});
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kFpga, 64); }, kWaitBound)) << kubelet_->Log();
  constexpr auto kMinWrite = std::chrono::seconds(1);
  StartPublish({"--interval", "50ms", "--min-write-interval", "1s"});
  ASSERT_TRUE(WaitUntil([&] { return LastShows(kFpga, 64); }, kWaitBound)) << LastValue() << "\n"
                                                                           << publish_->Log();

  const size_t before = Patches().size();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) {
    WriteFileAtomically(Manifests() + "/p" + std::to_string(i) + ".yaml",
                        FpgaPodYaml("p" + std::to_string(i)));
  }
  std::set<std::string> held;
  for (int i = 0; i < 50; ++i) {
    json status = WaitPhase("default_p" + std::to_string(i), "Admitted");
    for (const auto& c : status["containers"]) {
      if (c["devices"].contains(kFpga)) {
        for (const auto& id : c["devices"][kFpga]) held.insert(id.get<std::string>());
      }
    }
  }
  ASSERT_EQ(held.size(), 50u);
  ASSERT_TRUE(WaitUntil([&] { return LastShows(kFpga, 14, held); }, kWaitBound))
      << LastValue() << "\n"
      << publish_->Log();
  const auto end = std::chrono::steady_clock::now();

  // At most one write per min write interval over the burst (from the first
  // manifest to the final value landing), plus one at each edge. (The gaps
  // between arrivals are not checked: a request's own latency varies them.)
  std::vector<Patch> p = Patches();
  const size_t during = p.size() - before;
  const auto bound = static_cast<size_t>((end - start) / kMinWrite) + 2;
  EXPECT_GE(during, 1u);
  EXPECT_LE(during, bound) << "burst of " << std::chrono::duration<double>(end - start).count()
                           << " s";
  // The last PATCH has the value of now: the 50 held devices exactly.
  std::optional<k8s::DevicesAnnotation> a = Last();
  ASSERT_TRUE(a.has_value());
  const auto& fpga = a->resources[kFpga];
  EXPECT_EQ(fpga.devices.size(), 64u);
  std::set<std::string> free(fpga.available.begin(), fpga.available.end());
  for (const auto& d : fpga.devices) {
    EXPECT_NE(held.count(d.id) > 0, free.count(d.id) > 0) << d.id;
  }
}

TEST_F(PublishApiServerE2eTest, ApiServerDownForTenSecondsThenTheRightValueLands) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();
  StartPublish({"--interval", "100ms", "--min-write-interval", "500ms", "--timeout", "2s"});
  ASSERT_TRUE(WaitUntil([&] { return LastShows(kGpu, 8); }, kWaitBound)) << LastValue() << "\n"
                                                                         << publish_->Log();

  // The API server goes away (connections refused).
  server_->Stop();
  server_.reset();
  const auto down = std::chrono::steady_clock::now();
  WriteFileAtomically(Manifests() + "/train.yaml", PodYaml("train", 2));
  std::vector<std::string> held = Gpus(WaitPhase("default_train", "Admitted"));
  ASSERT_EQ(held.size(), 2u);
  ASSERT_TRUE(WaitUntil(
      [&] { return publish_->Log().find("event=publish_write_failed") != std::string::npos; },
      kWaitBound))
      << publish_->Log();
  // Stay down for 10 s in all (the scenario, not an assertion), checking
  // that publish keeps running.
  while (std::chrono::steady_clock::now() - down < std::chrono::seconds(10)) {
    ASSERT_TRUE(publish_->Running()) << publish_->Log();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(publish_->Running()) << publish_->Log();
  EXPECT_TRUE(LastShows(kGpu, 8)) << "nothing reached a stopped server";

  StartServer(port_);
  ASSERT_NE(server_, nullptr);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return LastShows(kGpu, 6, {held.begin(), held.end()});
      },
      kWaitBound))
      << LastValue() << "\n"
      << publish_->Log();
  ASSERT_TRUE(WaitUntil(
      [&] { return publish_->Log().find("event=publish_write_recovered") != std::string::npos; },
      kWaitBound))
      << publish_->Log();
  EXPECT_TRUE(publish_->Running());
  publish_->Signal(SIGTERM);
  EXPECT_EQ(publish_->Wait(), 0) << publish_->Log();
}

TEST_F(PublishApiServerE2eTest, KubeletPublishPatchesItsOwnNode) {
  StartKubelet({"--publish", "--node-name", kNode, "--topology", "nvidia.com/gpu=preset:dgx1-v100",
                "--attributes", "nvidia.com/gpu=cuda=12.2,brand=tesla", "--kubeconfig",
                Kubeconfig(), "--interval", "100ms", "--min-write-interval", "200ms",
                "--plugin-policy", "nvidia.com/gpu=best-set"});
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return LastShows(kGpu, 8); }, kWaitBound)) << LastValue() << "\n"
                                                                         << kubelet_->Log();
  std::optional<k8s::DevicesAnnotation> a = Last();
  ASSERT_TRUE(a.has_value());
  // No pod holds a device yet: `pods` is written, empty.
  EXPECT_EQ(a->pods, std::vector<uint64_t>{}) << LastValue();
  EXPECT_EQ(a->resources[kGpu].policy, topology::Policy::kBestSet) << LastValue();
  ASSERT_TRUE(a->resources[kGpu].topology.has_value());
  EXPECT_EQ(*a->resources[kGpu].topology, *topology::Preset("dgx1-v100"));
  ASSERT_TRUE(a->resources[kGpu].attributes.has_value());
  EXPECT_EQ(a->resources[kGpu].attributes->cuda, "12.2");

  WriteFileAtomically(Manifests() + "/train.yaml", PodYaml("train", 2));
  std::vector<std::string> held = Gpus(WaitPhase("default_train", "Admitted"));
  ASSERT_EQ(held.size(), 2u);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return LastShows(kGpu, 6, {held.begin(), held.end()});
      },
      kWaitBound))
      << LastValue() << "\n"
      << kubelet_->Log();
  // The value that shows the admission names the pod (its fingerprint, as
  // the extender computes it from the Pod) and still says the policy.
  a = Last();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->pods, std::vector<uint64_t>{k8s::PodFingerprint("default", "train")}) << LastValue();
  EXPECT_THAT(
      LastValue(),
      HasSubstr("\"pods\":[\"" +
                k8s::FormatPodFingerprint(k8s::PodFingerprint("default", "train")) + "\"]"));
  EXPECT_EQ(a->resources[kGpu].policy, topology::Policy::kBestSet);
  // The --attributes still check requirements in the same agent.
  WriteFileAtomically(
      Manifests() + "/old.yaml",
      "apiVersion: v1\nkind: Pod\nmetadata:\n  name: old\nspec:\n  containers:\n"
      "  - name: main\n    env:\n    - {name: NVIDIA_REQUIRE_CUDA, value: "
      "\"cuda>=12.4\"}\n    resources:\n      limits:\n        nvidia.com/gpu: 1\n");
  json old = WaitPhase("default_old", "Rejected");
  EXPECT_EQ(old.value("reason", ""), "UnmetDeviceRequirement") << old.dump();

  // SIGTERM: the loop's thread is joined and the agent exits cleanly.
  kubelet_->Signal(SIGTERM);
  EXPECT_EQ(kubelet_->Wait(), 0) << kubelet_->Log();
}

// Connections accepted on the unix socket bound at `path` and open now: the
// server's side of each shows in /proc/net/unix with the socket's path and
// state 03 (connected); the listening socket itself is state 01.
int OpenConnectionsTo(const std::string& path) {
  std::ifstream in("/proc/net/unix");
  std::string line;
  std::getline(in, line);  // header
  int count = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string num, refs, protocol, flags, type, state, inode, name;
    if (!(fields >> num >> refs >> protocol >> flags >> type >> state >> inode >> name)) continue;
    if (name == path && state == "03") ++count;
  }
  return count;
}

// `kdm kubelet --publish` reads its Manager in-process: the annotation
// lands and follows an admission while nothing ever connects to the
// agent's own pod-resources socket. (The loop of earlier releases dialled
// it at start and kept its gRPC connection open: one connection here.)
TEST_F(PublishApiServerE2eTest, KubeletPublishNeverDialsItsOwnPodResourcesSocket) {
  StartKubelet({"--publish", "--node-name", kNode, "--topology", "nvidia.com/gpu=preset:dgx1-v100",
                "--kubeconfig", Kubeconfig(), "--interval", "100ms", "--min-write-interval",
                "100ms"});
  ASSERT_TRUE(WaitUntil([&] { return fs::exists(Socket()); }, kWaitBound)) << kubelet_->Log();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return LastShows(kGpu, 8); }, kWaitBound)) << LastValue() << "\n"
                                                                         << kubelet_->Log();
  WriteFileAtomically(Manifests() + "/train.yaml", PodYaml("train", 2));
  std::vector<std::string> held = Gpus(WaitPhase("default_train", "Admitted"));
  ASSERT_EQ(held.size(), 2u);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return LastShows(kGpu, 6, {held.begin(), held.end()});
      },
      kWaitBound))
      << LastValue() << "\n"
      << kubelet_->Log();
  EXPECT_EQ(OpenConnectionsTo(Socket()), 0) << "something dialled " << Socket();

  kubelet_->Signal(SIGTERM);
  EXPECT_EQ(kubelet_->Wait(), 0) << kubelet_->Log();
}

TEST_F(PublishApiServerE2eTest, NvmlTopologyAndAttributesFromTheFakeLibrary) {
  const std::string node = kNodes + "/dgx1-v100.json";
  ASSERT_EQ(nvml::test::WriteFakeSysfs(node, root_ + "/sys"), "");
  fs::create_directories(root_ + "/host/dev");
  for (const char* n : {"nvidiactl", "nvidia-uvm"}) std::ofstream(root_ + "/host/dev/" + n).flush();
  ::setenv("KDM_FAKE_NVML_NODE", node.c_str(), 1);
  StartKubelet();
  StartPlugin({"--nvml", "--nvml-library", kFakeLibrary, "--sysfs-root", root_ + "/sys",
               "--dev-root", root_ + "/host"});
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound))
      << kubelet_->Log() << "\n"
      << plugins_.back()->Log();
  const std::vector<std::string> common = {"publish",
                                           "--node-name",
                                           kNode,
                                           "--pod-resources-socket",
                                           Socket(),
                                           "--topology",
                                           "nvidia.com/gpu=nvml",
                                           "--nvml-library",
                                           kFakeLibrary,
                                           "--sysfs-root",
                                           root_ + "/sys",
                                           "--dry-run"};
  ASSERT_EQ(Run(common), 0) << err_;
  auto a = k8s::DecodeDevicesAnnotation(out_);
  ASSERT_TRUE(a.ok()) << a.status() << "\n" << out_;
  const k8s::ResourceDevices& gpu = a->resources[kGpu];
  json doc = json::parse(ReadFile(node));
  ASSERT_EQ(gpu.devices.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(gpu.devices[i].id, doc["gpus"][i]["uuid"].get<std::string>()) << i;
  }
  EXPECT_EQ(gpu.devices[0].numa, 0);
  EXPECT_EQ(gpu.devices[7].numa, 1);
  // The links are the NVML node's: the dgx1-v100 preset's, row for row.
  ASSERT_TRUE(gpu.topology.has_value()) << err_;
  StatusOr<topology::Topology> preset = topology::Preset("dgx1-v100");
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(gpu.topology->LinkBetween(i, j).nvlinks, preset->LinkBetween(i, j).nvlinks)
          << i << "," << j;
    }
  }
  ASSERT_TRUE(gpu.attributes.has_value());
  EXPECT_EQ(gpu.attributes->model, "Tesla V100-SXM2-32GB");
  EXPECT_EQ(gpu.attributes->memory_mib, 32510);
  EXPECT_EQ(gpu.attributes->driver, "550.54.15");
  EXPECT_EQ(gpu.attributes->cuda, "12.4");
  EXPECT_EQ(gpu.attributes->arch, "7.0");
  EXPECT_EQ(gpu.attributes->brand, "tesla");

  // --attributes wins over NVML's, as a whole.
  std::vector<std::string> with = common;
  with.insert(with.end(), {"--attributes", "nvidia.com/gpu=cuda=12.2"});
  ASSERT_EQ(Run(with), 0) << err_;
  a = k8s::DecodeDevicesAnnotation(out_);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->resources[kGpu].attributes.has_value());
  EXPECT_EQ(a->resources[kGpu].attributes->cuda, "12.2");
  EXPECT_FALSE(a->resources[kGpu].attributes->model.has_value());
}

// Issue 30: `kdm get devices` shows each GPU's NVML index and model where
// the agent reads the node's GPUs through NVML (`kdm kubelet --publish
// --topology RESOURCE=nvml`): index i is the node's GPU i, by UUID.
TEST_F(PublishApiServerE2eTest, GetDevicesShowsNvmlIndexAndModelOfAnNvmlAgent) {
  const std::string node = kNodes + "/dgx1-v100.json";
  ASSERT_EQ(nvml::test::WriteFakeSysfs(node, root_ + "/sys"), "");
  fs::create_directories(root_ + "/host/dev");
  for (const char* n : {"nvidiactl", "nvidia-uvm"}) std::ofstream(root_ + "/host/dev/" + n).flush();
  ::setenv("KDM_FAKE_NVML_NODE", node.c_str(), 1);
  StartKubelet({"--publish", "--node-name", kNode, "--topology", "nvidia.com/gpu=nvml",
                "--nvml-library", kFakeLibrary, "--sysfs-root", root_ + "/sys", "--kubeconfig",
                Kubeconfig(), "--interval", "100ms", "--min-write-interval", "200ms"});
  StartPlugin({"--nvml", "--nvml-library", kFakeLibrary, "--sysfs-root", root_ + "/sys",
               "--dev-root", root_ + "/host"});
  json doc = json::parse(ReadFile(node));
  json devices;
  ASSERT_TRUE(WaitUntil(
      [&] {
        if (Run({"get", "devices", "--root", root_, "-o", "json"}) != 0) return false;
        devices = json::parse(out_)["devices"];
        return devices.size() == 8 && devices[0].contains("index");
      },
      kWaitBound))
      << out_ << err_ << kubelet_->Log();
  for (const json& d : devices) {
    ASSERT_TRUE(d.contains("index")) << d.dump();
    const int i = d["index"].get<int>();
    ASSERT_GE(i, 0);
    ASSERT_LT(i, 8);
    EXPECT_EQ(d["id"], doc["gpus"][i]["uuid"]) << d.dump();
    EXPECT_EQ(d["model"], "Tesla V100-SXM2-32GB") << d.dump();
  }
  ASSERT_EQ(Run({"get", "devices", "--root", root_, "-o", "wide"}), 0) << err_;
  EXPECT_THAT(out_, HasSubstr("GPU"));
  const std::string uuid3 = doc["gpus"][3]["uuid"].get<std::string>();
  size_t row = out_.find(uuid3);
  ASSERT_NE(row, std::string::npos) << out_;
  const std::string line = out_.substr(row, out_.find('\n', row) - row);
  EXPECT_THAT(line, HasSubstr(" 3 ")) << line;
  EXPECT_THAT(line, HasSubstr("Tesla V100-SXM2-32GB")) << line;
  ::unsetenv("KDM_FAKE_NVML_NODE");
}

TEST_F(PublishApiServerE2eTest, BadClientFlagsAndFilesAreClearErrors) {
  StartKubelet();
  std::ofstream(root_ + "/garbage.yaml") << "clusters: [\n  {name: x\n";
  std::ofstream(root_ + "/nouser.yaml")
      << "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n"
         "    server: http://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: k\n";
  const std::vector<std::string> common = {"publish", "--node-name", kNode,
                                           "--pod-resources-socket", Socket()};
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--context", "c1", "--in-cluster"}, 2, "--context and --in-cluster"},
      {{"--kubeconfig", Kubeconfig(), "--in-cluster"}, 2, "give one, not both"},
      {{"--kubeconfig", Kubeconfig(), "--in-cluster", "--dry-run"}, 2, "give one, not both"},
      {{"--kubeconfig", root_ + "/missing.yaml"},
       1,
       "--kubeconfig: kubeconfig " + root_ + "/missing.yaml"},
      {{"--kubeconfig", root_ + "/garbage.yaml"}, 1, "garbage.yaml"},
      {{"--kubeconfig", root_ + "/nouser.yaml"}, 1, "clusters[0].cluster.server"},
      {{"--kubeconfig", root_}, 1, "--kubeconfig"},
      {{"--kubeconfig", Kubeconfig(), "--topology", "nvidia.com/gpu=nvml", "--nvml-library",
        root_ + "/no-libnvidia-ml.so"},
       2,
       "--topology \"nvidia.com/gpu=nvml\": NVML not found: "},
      {{"--kubeconfig", Kubeconfig(), "--nvml-library", root_ + "/x.so"},
       2,
       "--nvml-library and --sysfs-root need a --topology RESOURCE=nvml"},
      {{"--kubeconfig", Kubeconfig(), "--min-write-interval", "x"}, 2, "--min-write-interval"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<std::string> args = common;
    args.insert(args.end(), cases[i].args.begin(), cases[i].args.end());
    EXPECT_EQ(Run(args), cases[i].code) << i << ": " << err_;
    EXPECT_THAT(err_, HasSubstr("kdm publish: " + std::string())) << i;
    EXPECT_THAT(err_, HasSubstr(cases[i].message)) << i << ": " << err_;
    EXPECT_EQ(std::count(err_.begin(), err_.end(), '\n'), 1) << i << ": " << err_;
    EXPECT_TRUE(out_.empty()) << i << ": " << out_;
  }
  EXPECT_EQ(server_->RequestCount(), 0u);

  // The same checks through `kdm kubelet --publish` (one shared function),
  // before the agent starts anything.
  const std::string other = root_ + "/other";
  std::vector<Case> kubelet_cases = {
      {{"--node-name", kNode}, 2, "need --publish"},
      {{"--kubeconfig", Kubeconfig()}, 2, "need --publish"},
      {{"--publish", "--kubeconfig", Kubeconfig()}, 2, "--node-name is required"},
      {{"--publish", "--node-name", kNode, "--context", "c", "--in-cluster"},
       2,
       "--context and --in-cluster"},
      {{"--publish", "--node-name", kNode, "--kubeconfig", Kubeconfig(), "--in-cluster"},
       2,
       "give one, not both"},
      {{"--publish", "--node-name", kNode, "--kubeconfig", root_ + "/missing.yaml"},
       1,
       "missing.yaml"},
      {{"--publish", "--node-name", kNode, "--kubeconfig", Kubeconfig(), "--topology",
        "nvidia.com/gpu=preset:dgx9"},
       2,
       "dgx9"},
      {{"--publish", "--node-name", "Bad_Node", "--kubeconfig", Kubeconfig()},
       2,
       "not a DNS-1123 subdomain"},
      {{"--plugin-policy", "nvidia.com/gpu=packed"}, 2, "need --publish"},
      {{"--publish", "--node-name", kNode, "--kubeconfig", Kubeconfig(), "--plugin-policy",
        "nvidia.com/gpu=fastest"},
       2,
       "--plugin-policy \"nvidia.com/gpu=fastest\": \"fastest\" is not a policy (packed, "
       "best-set or first-fit)"},
  };
  for (size_t i = 0; i < kubelet_cases.size(); ++i) {
    std::vector<std::string> args = {"kubelet", "--root", other};
    args.insert(args.end(), kubelet_cases[i].args.begin(), kubelet_cases[i].args.end());
    EXPECT_EQ(Run(args), kubelet_cases[i].code) << i << ": " << err_;
    EXPECT_THAT(err_, HasSubstr("kdm kubelet: ")) << i;
    EXPECT_THAT(err_, HasSubstr(kubelet_cases[i].message)) << i << ": " << err_;
    EXPECT_FALSE(fs::exists(other + "/pod-resources")) << i << ": nothing started";
  }
}

}  // namespace
}  // namespace kdm::e2e
