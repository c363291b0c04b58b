// `kdm extender` end to end: two `kdm kubelet` nodes with `kdm plugin`s (an
// NVLink DGX-1 and an 8-GPU PCIe box), their annotations from `kdm publish
// --dry-run`, served as Node objects by the in-tree HTTPS test API server
// (LIST, then a watch stream); the real binary, with --kubeconfig, answers
// NodeNames requests from its node cache and changes its choice as a pod's
// GPUs come and go on the NVLink node.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fstream>
#include <regex>

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

// The node's annotation as `kdm publish --dry-run` prints it.
std::string NodeObject(const std::string& name, const std::string& annotation) {
  std::string out = "{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"" + name +
                    "\",\"resourceVersion\":\"1\",\"annotations\":{\"kdm.io/devices\":";
  scheduler::AppendJsonString(annotation, &out);
  return out + "}},\"status\":{\"allocatable\":{\"nvidia.com/gpu\":\"8\"}}}";
}

class ExtenderE2eTest : public KubeletE2eTest {
 protected:
  void TearDown() override {
    if (extender_) extender_->Signal(SIGTERM);
    if (extender_) extender_->Wait();
    extender_.reset();
    plugins_b_.clear();
    kubelet_b_.reset();
    if (server_) server_->Stop();
    KubeletE2eTest::TearDown();
  }
  std::string RootB() const { return root_ + "/b"; }

  std::string DryRun(const std::string& node, const std::string& root, const std::string& preset) {
    const std::string n = std::to_string(runs_++);
    Process p({"publish", "--node-name", node, "--pod-resources-socket",
               root + "/pod-resources/kubelet.sock", "--topology",
               std::string(kGpu) + "=preset:" + preset, "--dry-run"},
              root_ + "/publish" + n + ".out", root_ + "/publish" + n + ".err");
    EXPECT_EQ(p.Wait(), 0) << p.Err();
    std::string out = p.Out();
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
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

  std::unique_ptr<Process> kubelet_b_;
  std::vector<std::unique_ptr<Process>> plugins_b_;
  std::unique_ptr<kube::test::TestApiServer> server_;
  std::unique_ptr<Process> extender_;
  uint16_t port_ = 0;
  int runs_ = 0;
};

TEST_F(ExtenderE2eTest, ChoosesTheNvlinkNodeUntilItsGpusAreTaken) {
  // Node gpu-a: the fixture's kubelet with a DGX-1 (V100) plugin.
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();
  // Node gpu-b: a second kubelet with 8 PCIe GPUs.
  fs::create_directories(RootB());
  kubelet_b_ = std::make_unique<Process>(
      std::vector<std::string>{"kubelet", "--root", RootB(), "--rpc-timeout", "5s"},
      root_ + "/kubelet-b.log");
  ASSERT_TRUE(WaitUntil([&] { return fs::exists(RootB() + "/status/node.json"); }, kWaitBound))
      << kubelet_b_->Log();
  plugins_b_.push_back(
      std::make_unique<Process>(std::vector<std::string>{"plugin", "--root", RootB(), "--resource",
                                                         kGpu, "--preset", "pcie-8gpu"},
                                root_ + "/plugin-b.log"));
  ASSERT_TRUE(WaitUntil(
      [&] {
        return DryRun("gpu-b", RootB(), "pcie-8gpu").find("\"available\":[\"GPU0\"") !=
               std::string::npos;
      },
      kWaitBound))
      << plugins_b_[0]->Log();

  // The API server: LIST with both nodes, then a watch stream.
  auto pki = kube::test::MakeTestPki();
  ASSERT_TRUE(pki.ok()) << pki.status().message();
  auto s = kube::test::TestApiServer::Start(
      {.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
  ASSERT_TRUE(s.ok()) << s.status().message();
  server_ = std::move(*s);
  auto feed = std::make_shared<kube::test::WatchFeed>();
  server_->Enqueue({.body = "{\"kind\":\"NodeList\",\"metadata\":{\"resourceVersion\":\"10\"},"
                            "\"items\":[" +
                            NodeObject("gpu-a", DryRun("gpu-a", root_, "dgx1-v100")) + "," +
                            NodeObject("gpu-b", DryRun("gpu-b", RootB(), "pcie-8gpu")) + "]}"});
  server_->Enqueue({.feed = feed});
  std::ofstream(root_ + "/ca.crt") << pki->ca.cert_pem;
  std::ofstream(root_ + "/kubeconfig")
      << "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: c\n  cluster:\n"
         "    server: "
      << server_->url() << "\n    certificate-authority: " << root_
      << "/ca.crt\ncontexts:\n- name: t\n  context: {cluster: c, user: u}\nusers:\n- name: u\n"
         "  user: {token: secret}\n";

  extender_ =
      std::make_unique<Process>(std::vector<std::string>{"extender", "--listen", "127.0.0.1:0",
                                                         "--kubeconfig", root_ + "/kubeconfig"},
                                root_ + "/extender.out", root_ + "/extender.err");
  std::smatch m;
  ASSERT_TRUE(WaitUntil(
      [&] {
        std::string err = extender_->Err();
        if (!std::regex_search(err, m, std::regex("listening on 127\\.0\\.0\\.1:([0-9]+)"))) {
          return false;
        }
        port_ = static_cast<uint16_t>(std::stoi(m[1]));
        return true;
      },
      kWaitBound))
      << extender_->Err();
  EXPECT_THAT(extender_->Err(), HasSubstr("with node cache"));

  // A 4-GPU pod: the NVLink node wins (10 vs 1, docs/extender.md's example).
  ASSERT_TRUE(WaitUntil([&] { return Scores(4) == std::make_pair(10, 1); }, kWaitBound))
      << Scores(4).first << " " << Scores(4).second << "\n"
      << extender_->Err();

  // A 6-GPU pod takes most of gpu-a; its annotation changes.
  WriteFileAtomically(Manifests() + "/train.yaml", PodYaml("train", 6));
  ASSERT_EQ(Gpus(WaitPhase("default_train", "Admitted")).size(), 6u);
  feed->Send("{\"type\":\"MODIFIED\",\"object\":" +
             NodeObject("gpu-a", DryRun("gpu-a", root_, "dgx1-v100")) + "}\n");
  json f;
  ASSERT_TRUE(WaitUntil(
      [&] {
        f = Post("filter", Args(4));
        return f.is_object() && f["FailedNodes"].contains("gpu-a");
      },
      kWaitBound))
      << f.dump();
  EXPECT_EQ(f["FailedNodes"]["gpu-a"], "kdm: 2 nvidia.com/gpu free, pod needs 4");
  EXPECT_EQ(f["NodeNames"], json::array({"gpu-b"}));
  EXPECT_EQ(Scores(4), std::make_pair(0, 10));

  // The pod goes: gpu-a is back in front.
  fs::remove(Manifests() + "/train.yaml");
  ASSERT_TRUE(WaitUntil(
      [&] {
        return DryRun("gpu-a", root_, "dgx1-v100")
                   .find(
                       "\"available\":[\"GPU0\",\"GPU1\","
                       "\"GPU2\",\"GPU3\",\"GPU4\",\"GPU5\","
                       "\"GPU6\",\"GPU7\"]") != std::string::npos;
      },
      kWaitBound));
  feed->Send("{\"type\":\"MODIFIED\",\"object\":" +
             NodeObject("gpu-a", DryRun("gpu-a", root_, "dgx1-v100")) + "}\n");
  ASSERT_TRUE(WaitUntil([&] { return Scores(4) == std::make_pair(10, 1); }, kWaitBound));
  f = Post("filter", Args(4));
  EXPECT_EQ(f["NodeNames"], json::array({"gpu-a", "gpu-b"}));
}

}  // namespace
}  // namespace kdm::e2e
