// FakeCluster (test/kube/fake_cluster.h) through the real kube::Client over
// HTTPS: Node LIST/GET/PATCH/WATCH, Pod LIST/WATCH with field selectors,
// Bindings, and what it answers to bad requests.
#include "kdm/test/kube/fake_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "kdm/kube/client.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/wait_until.h"

namespace kdm::kube::test {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// kube::kBoundPodsPath's selector, as the extender's Pod informer sends it.
constexpr char kBoundPodsQuery[] =
    "/api/v1/pods?fieldSelector=spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded%2C"
    "status.phase%21%3DFailed";
constexpr char kGpuSpec[] =
    R"({"containers":[{"name":"main","resources":{"limits":{"nvidia.com/gpu":"2"}}}]})";
constexpr char kBindingBody[] =
    R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"train","namespace":"ml"},)"
    R"("target":{"apiVersion":"v1","kind":"Node","name":"gpu-a"}})";

class FakeClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  void Start(FakeCluster::Options options) {
    if (server_) server_->Stop();
    options.on_bound = [this](const BoundPod& p) {
      MutexLock lock(&mu_);
      bound_.push_back(p.namespace_name + "/" + p.name + "@" + p.node + " uid=" + p.uid);
    };
    cluster_ = std::make_unique<FakeCluster>(options);
    auto pki = MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto s =
        TestApiServer::Start({.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    server_->SetHandler(cluster_->Handler());
    ClientConfig c;
    c.source = "test";
    c.host = "127.0.0.1";
    c.port = server_->port();
    c.ca = Pem{pki->ca.cert_pem, "the test CA"};
    c.token = "t";
    auto client = Client::Create({.config = c, .retry = {.max_attempts = 1}});
    ASSERT_TRUE(client.ok()) << client.status().message();
    client_ = std::move(*client);
  }

  Client::Response Call(const std::string& method, const std::string& path,
                        const std::string& body = "") {
    auto r = client_->Send(method, path, body, std::chrono::seconds(10));
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : Client::Response{};
  }
  json Get(const std::string& path) {
    Client::Response r = Call("GET", path);
    EXPECT_EQ(r.status, 200) << path << ": " << r.body;
    return json::parse(r.body, nullptr, false);
  }
  // The first `n` lines of a watch of `path` (replayed history or live).
  std::vector<json> WatchLines(const std::string& path, size_t n) {
    std::vector<json> lines;
    Status s = client_->Stream(path, std::chrono::seconds(10), std::chrono::seconds(10),
                               [&](std::string_view line) {
                                 lines.push_back(json::parse(line, nullptr, false));
                                 return lines.size() < n;
                               });
    EXPECT_TRUE(s.ok()) << s.message();
    return lines;
  }
  static std::vector<std::string> Types(const std::vector<json>& lines) {
    std::vector<std::string> out;
    for (const auto& l : lines) out.push_back(l.value("type", "?"));
    return out;
  }
  std::string Rv() { return std::to_string(cluster_->resource_version()); }

  Mutex mu_;
  std::vector<std::string> bound_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<FakeCluster> cluster_;
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(FakeClusterTest, ListsGetsAndMergePatchesNodeAnnotations) {
  ASSERT_TRUE(cluster_->AddNode("gpu-a", {{"nvidia.com/gpu", "8"}}).ok());
  ASSERT_TRUE(cluster_->AddNode("gpu-b", {{"nvidia.com/gpu", "4"}}).ok());
  EXPECT_EQ(cluster_->AddNode("gpu-a", {}).code(), StatusCode::kAlreadyExists);

  json list = Get("/api/v1/nodes");
  EXPECT_EQ(list["kind"], "NodeList");
  EXPECT_EQ(list["metadata"]["resourceVersion"], Rv());
  ASSERT_EQ(list["items"].size(), 2u);
  EXPECT_EQ(list["items"][1]["status"]["allocatable"]["nvidia.com/gpu"], "4");

  ASSERT_TRUE(client_
                  ->MergePatch("/api/v1/nodes/gpu-a",
                               R"({"metadata":{"annotations":{"kdm.io/devices":"v1","x":"y"}}})",
                               std::chrono::seconds(10))
                  .ok());
  ASSERT_TRUE(client_
                  ->MergePatch("/api/v1/nodes/gpu-a", R"({"metadata":{"annotations":{"x":null}}})",
                               std::chrono::seconds(10))
                  .ok());
  json node = Get("/api/v1/nodes/gpu-a");
  EXPECT_EQ(node["metadata"]["annotations"], json({{"kdm.io/devices", "v1"}}));
  EXPECT_EQ(node["metadata"]["resourceVersion"], Rv());
  EXPECT_EQ(cluster_->NodeAnnotation("gpu-a", "kdm.io/devices"), "v1");

  // Bad patches: one clear error each, nothing changed.
  const std::string before = Rv();
  for (const char* body : {"{{{ garbage", "[1,2]", R"({"spec":{"unschedulable":true}})",
                           R"({"metadata":{"labels":{"a":"b"}}})",
                           R"({"metadata":{"annotations":{"kdm.io/devices":5}}})", ""}) {
    Client::Response r = Call("PATCH", "/api/v1/nodes/gpu-a", body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_FALSE(json::parse(r.body, nullptr, false).value("message", "").empty()) << body;
  }
  EXPECT_EQ(Call("PATCH", "/api/v1/nodes/nope", "{}").status, 404);
  EXPECT_EQ(Call("GET", "/api/v1/nodes/nope").status, 404);
  EXPECT_EQ(Call("DELETE", "/api/v1/nodes").status, 405);
  EXPECT_EQ(Rv(), before);
  EXPECT_EQ(cluster_->NodeAnnotation("gpu-a", "kdm.io/devices"), "v1");
}

TEST_F(FakeClusterTest, NodeWatchesReplayFromTheirVersionAndStreamToEveryWatcher) {
  ASSERT_TRUE(cluster_->AddNode("gpu-a", {}).ok());
  const std::string rv = Get("/api/v1/nodes")["metadata"]["resourceVersion"];
  ASSERT_TRUE(client_
                  ->MergePatch("/api/v1/nodes/gpu-a", R"({"metadata":{"annotations":{"a":"1"}}})",
                               std::chrono::seconds(10))
                  .ok());
  ASSERT_TRUE(cluster_->AddNode("gpu-b", {}).ok());
  const std::string watch =
      "/api/v1/nodes?watch=1&resourceVersion=" + rv + "&allowWatchBookmarks=true";
  std::vector<json> lines = WatchLines(watch, 2);
  EXPECT_EQ(Types(lines), (std::vector<std::string>{"MODIFIED", "ADDED"}));
  EXPECT_EQ(lines[0]["object"]["metadata"]["annotations"]["a"], "1");
  EXPECT_EQ(lines[1]["object"]["metadata"]["name"], "gpu-b");

  // Two live watchers at once each see the next change.
  std::vector<std::vector<json>> seen(2);
  std::vector<std::thread> threads;
  const std::string now = "/api/v1/nodes?watch=1&resourceVersion=" + Rv();
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      (void)client_->Stream(now, std::chrono::seconds(10), std::chrono::seconds(10),
                            [&](std::string_view line) {
                              seen[i].push_back(json::parse(line, nullptr, false));
                              return false;
                            });
    });
  }
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return cluster_->WatchesOpened("nodes") == 3; }));
  ASSERT_TRUE(client_
                  ->MergePatch("/api/v1/nodes/gpu-b", R"({"metadata":{"annotations":{"b":"2"}}})",
                               std::chrono::seconds(10))
                  .ok());
  for (auto& t : threads) t.join();
  for (const auto& s : seen) {
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0]["type"], "MODIFIED");
    EXPECT_EQ(s[0]["object"]["metadata"]["annotations"]["b"], "2");
  }
  // The clients have gone: the next change drops their watchers.
  EXPECT_TRUE(kdm::test::WaitUntil([&] {
    (void)cluster_->AddNode("gpu-" + std::to_string(cluster_->resource_version()), {});
    return cluster_->OpenWatches() == 0;
  }));
}

TEST_F(FakeClusterTest, ATooOldVersionIsGoneAndABadOneIsRefused) {
  Start({.max_history = 2});
  for (const char* n : {"a", "b", "c", "d"}) ASSERT_TRUE(cluster_->AddNode(n, {}).ok());
  std::vector<json> lines = WatchLines("/api/v1/nodes?watch=1&resourceVersion=1", 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["type"], "ERROR");
  EXPECT_EQ(lines[0]["object"]["code"], 410);
  Client::Response r = Call("GET", "/api/v1/nodes?watch=1&resourceVersion=12abc");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.body, HasSubstr("resourceVersion"));
}

TEST_F(FakeClusterTest, BoundPodSelectorSeesPodsEnterAndLeave) {
  ASSERT_TRUE(cluster_->CreatePod("ml", "train", "uid-1", kGpuSpec).ok());
  ASSERT_TRUE(cluster_->CreatePod("ml", "idle", "uid-2", kGpuSpec).ok());
  ASSERT_TRUE(cluster_->CreatePod("web", "serve", "uid-3", kGpuSpec).ok());
  EXPECT_EQ(cluster_->CreatePod("ml", "train", "uid-9", kGpuSpec).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(cluster_->CreatePod("ml", "bad", "uid-9", "[]").code(), StatusCode::kInvalidArgument);
  json list = Get(kBoundPodsQuery);
  EXPECT_EQ(list["kind"], "PodList");
  EXPECT_TRUE(list["items"].empty());
  const std::string rv = list["metadata"]["resourceVersion"];

  ASSERT_EQ(Call("POST", "/api/v1/namespaces/ml/pods/train/binding", kBindingBody).status, 201);
  ASSERT_TRUE(cluster_->Bind("web", "serve", "gpu-b").ok());
  ASSERT_TRUE(cluster_->SetPhase("ml", "train", "Succeeded").ok());
  ASSERT_TRUE(cluster_->DeletePod("web", "serve").ok());
  ASSERT_TRUE(cluster_->DeletePod("ml", "idle").ok());  // never selected: no event

  std::vector<json> lines = WatchLines(
      std::string(kBoundPodsQuery) + "&watch=1&resourceVersion=" + rv + "&allowWatchBookmarks=true",
      4);
  EXPECT_EQ(Types(lines), (std::vector<std::string>{"ADDED", "ADDED", "DELETED", "DELETED"}));
  EXPECT_EQ(lines[0]["object"]["metadata"]["uid"], "uid-1");
  EXPECT_EQ(lines[0]["object"]["spec"]["nodeName"], "gpu-a");
  EXPECT_EQ(lines[0]["object"]["status"]["conditions"][0]["type"], "PodScheduled");
  EXPECT_EQ(lines[2]["object"]["status"]["phase"], "Succeeded");
  EXPECT_EQ(lines[3]["object"]["metadata"]["name"], "serve");

  // Namespaced and by-name selections.
  ASSERT_TRUE(cluster_->CreatePod("ml", "eval", "uid-4", kGpuSpec).ok());
  EXPECT_EQ(Get("/api/v1/namespaces/ml/pods")["items"].size(), 2u);  // train, eval
  EXPECT_EQ(Get("/api/v1/pods?fieldSelector=metadata.name%3Deval")["items"].size(), 1u);
  EXPECT_EQ(Get("/api/v1/namespaces/web/pods")["items"].size(), 0u);
  EXPECT_EQ(
      Get("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-a,metadata.namespace=ml")["items"].size(),
      1u);
  MutexLock lock(&mu_);
  EXPECT_EQ(bound_,
            (std::vector<std::string>{"ml/train@gpu-a uid=uid-1", "web/serve@gpu-b uid=uid-3"}));
}

TEST_F(FakeClusterTest, BindingsRefuseUnknownBoundAndMalformed) {
  ASSERT_TRUE(cluster_->CreatePod("ml", "train", "uid-1", kGpuSpec).ok());
  const std::string path = "/api/v1/namespaces/ml/pods/train/binding";
  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> bad = {
      {"{{{", "Binding"},
      {"[]", "Binding"},
      {R"({"kind":"Pod","target":{"name":"gpu-a"}})", "Binding"},
      {R"({"kind":"Binding","target":{"name":""}})", "target.name"},
      {R"({"kind":"Binding","target":{"name":7}})", "target.name"},
      {R"({"kind":"Binding","metadata":{"name":"other"},"target":{"name":"gpu-a"}})",
       "metadata.name"},
      {std::string(1 << 16, '['), "Binding"},
  };
  for (const auto& c : bad) {
    Client::Response r = Call("POST", path, c.body);
    EXPECT_EQ(r.status, 400) << c.body.substr(0, 60);
    EXPECT_THAT(r.body, HasSubstr(c.message)) << c.body.substr(0, 60);
  }
  EXPECT_EQ(cluster_->PodNode("ml", "train"), "");
  json other = json::parse(kBindingBody);
  other["metadata"]["name"] = "nope";
  Client::Response unknown = Call("POST", "/api/v1/namespaces/ml/pods/nope/binding", other.dump());
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(unknown.body, HasSubstr("nope"));
  EXPECT_EQ(Call("GET", path).status, 405);
  EXPECT_EQ(Call("POST", "/api/v1/namespaces/ml/pods/train/status", "{}").status, 404);

  EXPECT_EQ(Call("POST", path, kBindingBody).status, 201);
  // 409 (the client gives up at once: max_attempts 1) names the node.
  auto again = client_->Send("POST", path, kBindingBody, std::chrono::seconds(10));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAborted);
  EXPECT_THAT(again.status().message(), HasSubstr("409"));
  EXPECT_THAT(again.status().message(), HasSubstr("already assigned to node \"gpu-a\""));
  EXPECT_EQ(cluster_->PodNode("ml", "train"), "gpu-a");
  EXPECT_EQ(cluster_->bindings(), 1u);
  MutexLock lock(&mu_);
  EXPECT_EQ(bound_.size(), 1u);
}

TEST_F(FakeClusterTest, BadSelectorsAreClearErrors) {
  struct Case {
    std::string query;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"fieldSelector=spec.schedulerName%3Ddefault", "spec.schedulerName"},
      {"fieldSelector=status.podIP%21%3D", "status.podIP"},
      {"fieldSelector=spec.nodeName", "has no = or !="},
      {"fieldSelector=spec.nodeName%3Da,,", "has no = or !="},
      {"fieldSelector=%zz", "percent-encoding"},
      {"fieldSelector=spec.nodeName%3", "percent-encoding"},
  };
  for (const auto& c : cases) {
    for (const std::string& path :
         {"/api/v1/pods?" + c.query, "/api/v1/pods?watch=1&resourceVersion=1&" + c.query}) {
      Client::Response r = Call("GET", path);
      EXPECT_EQ(r.status, 400) << path;
      EXPECT_THAT(r.body, HasSubstr(c.message)) << path;
    }
  }
  EXPECT_EQ(cluster_->WatchesOpened("pods"), 0u);
  EXPECT_EQ(Call("GET", "/api/v1/configmaps").status, 404);
}

TEST(FakeClusterSelectorTest, ParsesTermsAndDecodes) {
  auto terms = ParsePodFieldSelector("spec.nodeName!=,status.phase==Running,metadata.name=a=b");
  ASSERT_TRUE(terms.ok()) << terms.status().message();
  ASSERT_EQ(terms->size(), 3u);
  EXPECT_TRUE((*terms)[0].negated);
  EXPECT_EQ((*terms)[0].value, "");
  EXPECT_EQ((*terms)[1].value, "Running");
  EXPECT_EQ((*terms)[2].value, "a=b");
  EXPECT_EQ(*UrlDecode("a%21%3Db+c"), "a!=b c");
  EXPECT_FALSE(UrlDecode("%4").ok());
  EXPECT_TRUE(ParsePodFieldSelector("")->empty());
}

}  // namespace
}  // namespace kdm::kube::test
