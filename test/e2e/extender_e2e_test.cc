// `kdm extender` end to end, every part a real process: two nodes, each a
// `kdm kubelet` with a `kdm plugin` (gpu-a: an NVLink DGX-1 V100, publishing
// through `kdm kubelet --publish`; gpu-b: an 8-GPU PCIe box, published by a
// `kdm publish` beside its kubelet), both PATCHing the kdm.io/devices
// annotation onto their Node objects in a small in-test API server (built on
// the in-tree HTTPS test server: it keeps the Nodes, answers LIST, and turns
// every PATCH into a MODIFIED event on the open watch). The real binary, with
// --kubeconfig, keeps its node cache from that LIST + WATCH and answers
// NodeNames requests; its choice follows a pod's GPUs as they come and go.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fstream>
#include <map>
#include <regex>

#include "kdm/base/sync.h"
#include "kdm/scheduler/extender_json.h"
#include "kdm/test/e2e/kubelet_fixture.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"

namespace kdm::e2e {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using ::testing::HasSubstr;

constexpr char kAnnotation[] = "kdm.io/devices";
const std::string kAllFree =
    "\"available\":[\"GPU0\",\"GPU1\",\"GPU2\",\"GPU3\",\"GPU4\",\"GPU5\",\"GPU6\",\"GPU7\"]";

class ExtenderE2eTest : public KubeletE2eTest {
 protected:
  void TearDown() override {
    if (extender_) extender_->Signal(SIGTERM);
    if (extender_) extender_->Wait();
    extender_.reset();
    publish_b_.reset();
    plugins_b_.clear();
    kubelet_b_.reset();
    KubeletE2eTest::TearDown();  // gpu-a's kubelet and plugin
    if (server_) server_->Stop();
  }
  std::string RootB() const { return root_ + "/b"; }
  std::string Kubeconfig() const { return root_ + "/kubeconfig"; }

  // The API server: the Nodes kept here, LIST, WATCH (the one open feed),
  // and PATCH of a Node's kdm.io/devices annotation (a MODIFIED event).
  void StartApiServer() {
    auto pki = kube::test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto s = kube::test::TestApiServer::Start(
        {.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    server_->SetHandler([this](const kube::test::RecordedRequest& r) { return Serve(r); });
    std::ofstream(root_ + "/ca.crt") << pki->ca.cert_pem;
    std::ofstream(Kubeconfig())
        << "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: c\n  cluster:\n"
           "    server: "
        << server_->url() << "\n    certificate-authority: " << root_
        << "/ca.crt\ncontexts:\n- name: t\n  context: {cluster: c, user: u}\nusers:\n- name: u\n"
           "  user: {token: secret}\n";
  }

  kube::test::Reply Serve(const kube::test::RecordedRequest& r) {
    const std::string prefix = "/api/v1/nodes";
    MutexLock lock(&mu_);
    if (r.method == "GET" && r.path == prefix && r.query.find("watch=1") != std::string::npos) {
      feed_ = std::make_shared<kube::test::WatchFeed>();
      return {.feed = feed_};
    }
    if (r.method == "GET" && r.path == prefix) {
      std::string items;
      for (const auto& [name, value] : nodes_) {
        items += (items.empty() ? "" : ",") + NodeJson(name, value);
      }
      return {.body =
                  "{\"kind\":\"NodeList\",\"apiVersion\":\"v1\",\"metadata\":{"
                  "\"resourceVersion\":\"" +
                  std::to_string(version_) + "\"},\"items\":[" + items + "]}"};
    }
    if (r.method == "PATCH" && r.path.rfind(prefix + "/", 0) == 0) {
      const std::string name = r.path.substr(prefix.size() + 1);
      json patch = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
      if (!patch.is_object() || !patch["metadata"]["annotations"][kAnnotation].is_string()) {
        return {.status = 400, .body = "{\"kind\":\"Status\",\"message\":\"bad patch\"}"};
      }
      nodes_[name] = patch["metadata"]["annotations"][kAnnotation].get<std::string>();
      ++version_;
      ++patches_;
      const std::string node = NodeJson(name, nodes_[name]);
      if (feed_) feed_->Send("{\"type\":\"MODIFIED\",\"object\":" + node + "}\n");
      return {.body = node};
    }
    return {.status = 404, .body = "{\"kind\":\"Status\",\"message\":\"not found\"}"};
  }

  std::string NodeJson(const std::string& name, const std::string& annotation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string out = "{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"" + name +
                      "\",\"resourceVersion\":\"" + std::to_string(version_) +
                      "\",\"annotations\":{\"" + kAnnotation + "\":";
    scheduler::AppendJsonString(annotation, &out);
    return out + "}},\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"8\"}}}";
  }

  // The node's annotation as last PATCHed ("" before any).
  std::string Annotation(const std::string& name) {
    MutexLock lock(&mu_);
    auto it = nodes_.find(name);
    return it == nodes_.end() ? "" : it->second;
  }
  bool WatchOpen() {
    MutexLock lock(&mu_);
    return feed_ != nullptr && feed_->attached();
  }

  // POSTs to the extender; the answer's JSON (null on failure).
  json Post(const std::string& verb, const std::string& body) {
    try {
      net::io_context ioc;
      beast::tcp_stream stream(ioc);
      stream.expires_after(std::chrono::seconds(10));
      stream.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
      http::request<http::string_body> req(http::verb::post, "/" + verb, 11);
      req.set(http::field::host, "127.0.0.1");
      req.set(http::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
      http::write(stream, req);
      beast::flat_buffer buffer;
      http::response<http::string_body> res;
      http::read(stream, buffer, res);
      if (res.result_int() != 200) return json();
      return json::parse(res.body());
    } catch (const std::exception&) {
      return json();
    }
  }
  std::string Args(int gpus) const {
    return "{\"Pod\":{\"metadata\":{\"name\":\"big\",\"namespace\":\"ml\"},\"spec\":{"
           "\"containers\":[{\"name\":\"main\",\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"" +
           std::to_string(gpus) + "\"}}}]}},\"NodeNames\":[\"gpu-a\",\"gpu-b\"]}";
  }
  // gpu-a's and gpu-b's scores for a pod of `gpus`.
  std::pair<int, int> Scores(int gpus) {
    json p = Post("prioritize", Args(gpus));
    if (!p.is_array() || p.size() != 2) return {-1, -1};
    return {p[0]["Score"].get<int>(), p[1]["Score"].get<int>()};
  }

  // Runs `kdm extender ARGS` to its end; its exit code, stderr in err_.
  int RunExtender(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"extender"};
    all.insert(all.end(), args.begin(), args.end());
    const std::string n = std::to_string(runs_++);
    Process p(all, root_ + "/run" + n + ".out", root_ + "/run" + n + ".err");
    std::optional<int> code = p.Wait();
    err_ = p.Err();
    return code.value_or(-1);
  }

  Mutex mu_;
  std::map<std::string, std::string> nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t patches_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<kube::test::WatchFeed> feed_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<kube::test::TestApiServer> server_;
  std::unique_ptr<Process> kubelet_b_;
  std::vector<std::unique_ptr<Process>> plugins_b_;
  std::unique_ptr<Process> publish_b_;
  std::unique_ptr<Process> extender_;
  uint16_t port_ = 0;
  int runs_ = 0;
  std::string err_;
};

TEST_F(ExtenderE2eTest, ChoosesTheNvlinkNodeAsTheNodesPublishTheirGpus) {
  StartApiServer();
  // Node gpu-a: the fixture's kubelet, publishing itself, with a DGX-1.
  StartKubelet({"--publish", "--node-name", "gpu-a", "--topology",
                std::string(kGpu) + "=preset:dgx1-v100", "--kubeconfig", Kubeconfig(), "--interval",
                "100ms", "--min-write-interval", "100ms"});
  StartGpuPlugin();
  // Node gpu-b: a second kubelet with 8 PCIe GPUs and `kdm publish`.
  fs::create_directories(RootB());
  kubelet_b_ = std::make_unique<Process>(
      std::vector<std::string>{"kubelet", "--root", RootB(), "--rpc-timeout", "5s"},
      root_ + "/kubelet-b.log");
  ASSERT_TRUE(
      WaitUntil([&] { return fs::exists(RootB() + "/pod-resources/kubelet.sock"); }, kWaitBound))
      << kubelet_b_->Log();
  plugins_b_.push_back(
      std::make_unique<Process>(std::vector<std::string>{"plugin", "--root", RootB(), "--resource",
                                                         kGpu, "--preset", "pcie-8gpu"},
                                root_ + "/plugin-b.log"));
  publish_b_ = std::make_unique<Process>(
      std::vector<std::string>{"publish", "--node-name", "gpu-b", "--pod-resources-socket",
                               RootB() + "/pod-resources/kubelet.sock", "--topology",
                               std::string(kGpu) + "=preset:pcie-8gpu", "--kubeconfig",
                               Kubeconfig(), "--interval", "100ms", "--min-write-interval",
                               "100ms"},
      root_ + "/publish-b.log");
  // Both nodes have published all eight GPUs free.
  ASSERT_TRUE(WaitUntil(
      [&] {
        return Annotation("gpu-a").find(kAllFree) != std::string::npos &&
               Annotation("gpu-b").find(kAllFree) != std::string::npos;
      },
      kWaitBound))
      << Annotation("gpu-a") << "\n"
      << Annotation("gpu-b") << "\n"
      << kubelet_->Log() << publish_b_->Log();

  extender_ = std::make_unique<Process>(
      // best-set: the scores below (10 vs 1) are its; the default is packed.
      std::vector<std::string>{"extender", "--listen", "127.0.0.1:0", "--kubeconfig", Kubeconfig(),
                               "--policy", "best-set"},
      root_ + "/extender.out", root_ + "/extender.err");
  std::smatch m;
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::string err = extender_->Err();
        if (!std::regex_search(err, m,
                               std::regex("listening on 127\\.0\\.0\\.1:([0-9]+)[^\n]*\n"))) {
          return false;
        }
        port_ = static_cast<uint16_t>(std::stoi(m[1]));
        return true;
      },
      kWaitBound))
      << extender_->Err();
  // The whole line has been written (the wait above matched its end).
  EXPECT_THAT(extender_->Err(), HasSubstr("with node cache"));
  ASSERT_TRUE(WaitUntil([&] { return WatchOpen(); }, kWaitBound)) << extender_->Err();

  // A 4-GPU pod: the NVLink node wins (10 vs 1, docs/extender.md's example).
  ASSERT_TRUE(WaitUntil([&] { return Scores(4) == std::make_pair(10, 1); }, kWaitBound))
      << Scores(4).first << " " << Scores(4).second << "\n"
      << extender_->Err();

  // A 6-GPU pod is admitted on gpu-a; its kubelet publishes two free GPUs,
  // the watch carries the change, and gpu-a no longer fits a 4-GPU pod.
  WriteFileAtomically(Manifests() + "/train.yaml", PodYaml("train", 6));
  ASSERT_EQ(Gpus(WaitPhase("default_train", "Admitted")).size(), 6u);
  json f;
  ASSERT_TRUE(WaitUntil(
      [&] {
        f = Post("filter", Args(4));
        return f.is_object() && f["FailedNodes"].contains("gpu-a");
      },
      kWaitBound))
      << f.dump() << "\n"
      << Annotation("gpu-a");
  EXPECT_EQ(f["FailedNodes"]["gpu-a"], "kdm: 2 nvidia.com/gpu free, pod needs 4");
  EXPECT_EQ(f["NodeNames"], json::array({"gpu-b"}));
  EXPECT_EQ(Scores(4), std::make_pair(0, 10));

  // The pod goes: gpu-a publishes all eight free and is back in front.
  fs::remove(Manifests() + "/train.yaml");
  ASSERT_TRUE(WaitUntil([&] { return Scores(4) == std::make_pair(10, 1); }, kWaitBound))
      << Annotation("gpu-a");
  f = Post("filter", Args(4));
  EXPECT_EQ(f["NodeNames"], json::array({"gpu-a", "gpu-b"}));
}

TEST_F(ExtenderE2eTest, BadFlagsAreClearErrors) {
  std::ofstream(root_ + "/garbage.yaml") << "{{{ not yaml";
  std::ofstream(root_ + "/cert.pem") << "not a certificate";
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, 2, "--listen is required"},
      {{"--listen", "nohost"}, 2, "nohost"},
      {{"--listen", "127.0.0.1:99999"}, 2, "99999"},
      {{"--listen", "127.0.0.1:0", "--policy", "fastest"}, 2, "fastest"},
      {{"--listen", "127.0.0.1:0", "--tls-cert", root_ + "/cert.pem"}, 2, "give both or neither"},
      {{"--listen", "127.0.0.1:0", "--kubeconfig", root_ + "/kc", "--in-cluster"},
       2,
       "give one, not both"},
      {{"--listen", "127.0.0.1:0", "--kubeconfig", root_ + "/missing.yaml"}, 1, "missing.yaml"},
      {{"--listen", "127.0.0.1:0", "--kubeconfig", root_ + "/garbage.yaml"}, 1, "garbage.yaml"},
      {{"--listen", "127.0.0.1:0", "--tls-cert", root_ + "/cert.pem", "--tls-key",
        root_ + "/cert.pem"},
       1,
       "--tls-cert " + root_ + "/cert.pem: TLS certificate: "},
      {{"--listen", "127.0.0.1:0", "--tls-cert", root_ + "/none.pem", "--tls-key",
        root_ + "/none.pem"},
       1,
       "none.pem"},
      {{"--listen", "127.0.0.1:0", "--no-such-flag"}, 2, "--no-such-flag"},
      // Round 3's flags (issue 28).
      {{"--listen", "127.0.0.1:0", "--request-budget", "soon"}, 2, "--request-budget"},
      {{"--listen", "127.0.0.1:0", "--request-budget", "0ms"}, 2, "--request-budget"},
      {{"--listen", "127.0.0.1:0", "--request-budget", "2m"}, 2, "--request-budget"},
      {{"--listen", "127.0.0.1:0", "--max-body-bytes", "4096", "--max-total-body-bytes", "1024"},
       2,
       "--max-total-body-bytes: at least --max-body-bytes"},
      {{"--listen", "127.0.0.1:0", "--max-total-body-bytes", "lots"}, 2, "--max-total-body-bytes"},
      {{"--listen", "127.0.0.1:0", "--topology-cache-bytes", "-5"}, 2, "--topology-cache-bytes"},
      {{"--listen", "127.0.0.1:0", "--topology-cache-bytes", "99999999999999999999999"},
       2,
       "--topology-cache-bytes"},
      {{"--listen", "127.0.0.1:0", "--threads", "0"}, 2, "--threads"},
      // Assumed allocations (issue 29).
      {{"--listen", "127.0.0.1:0", "--assume-timeout", "soon"}, 2, "--assume-timeout"},
      {{"--listen", "127.0.0.1:0", "--assume-timeout", "2h"}, 2, "--assume-timeout: must be 0"},
      {{"--listen", "127.0.0.1:0", "--assume-timeout", "-1s"}, 2, "--assume-timeout"},
      {{"--listen", "127.0.0.1:0", "--bind-wait", "10s"}, 2, "--bind-wait: must be 0"},
      {{"--listen", "127.0.0.1:0", "--bind-wait", "1x"}, 2, "--bind-wait"},
      {{"--listen", "127.0.0.1:0", "--max-body-bytes", "10"}, 2, "--max-body-bytes"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(RunExtender(cases[i].args), cases[i].code) << i << ": " << err_;
    EXPECT_THAT(err_, HasSubstr(cases[i].message)) << i;
  }
}

}  // namespace
}  // namespace kdm::e2e
