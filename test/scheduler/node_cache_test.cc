// The node cache against the in-tree HTTPS test API server: LIST, then a
// watch stream whose events change what NodeNames requests are answered
// with; unknown names and unreadable annotations pass through.
#include "kdm/scheduler/node_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kdm/scheduler/extender.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/wait_until.h"
#include "kdm/topology/node_score.h"
#include "scheduler_test_util.h"

namespace kdm::scheduler {
namespace {

using kube::test::Reply;
using kube::test::TestApiServer;
using kube::test::WatchFeed;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string List(const std::string& rv, const std::vector<std::string>& nodes) {
  std::string items;
  for (const auto& n : nodes) items += (items.empty() ? "" : ",") + n;
  return R"({"kind":"NodeList","metadata":{"resourceVersion":")" + rv + R"("},"items":[)" + items +
         "]}";
}

std::string Event(const std::string& type, const std::string& object) {
  return R"({"type":")" + type + R"(","object":)" + object + "}\n";
}

class NodeCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<kube::test::TestPki> pki = kube::test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto s =
        TestApiServer::Start({.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    kube::Client::Options options;
    options.config.source = "test";
    options.config.host = "127.0.0.1";
    options.config.port = server_->port();
    options.config.ca = kube::Pem{pki->ca.cert_pem, "the test CA"};
    options.config.token = "t";
    auto c = kube::Client::Create(std::move(options));
    ASSERT_TRUE(c.ok()) << c.status().message();
    client_ = std::move(*c);
    topology_ = std::make_unique<topology::Topology>(*topology::Preset("dgx1-v100"));
    cache_ = std::make_unique<NodeCache>(&topologies_);
    metrics_ = ExtenderMetrics::Create();
    extender_ = std::make_unique<Extender>(Extender::Options{.policy = ScorePolicy::kBestSet,
                                                             .cache = cache_.get(),
                                                             .metrics = metrics_.get(),
                                                             .topologies = &topologies_});
  }
  void TearDown() override {
    if (cache_) cache_->Stop();
    if (server_) server_->Stop();
  }
  std::string GpuNode(const std::string& name, const std::vector<int>& free) {
    return test::MakeNode(name, test::MakeAnnotation(name, *topology_, free));
  }
  // The filter answer for a 2-GPU pod over `names`.
  nlohmann::json Filter(const std::vector<std::string>& names) {
    std::string body = "{\"Pod\":" + test::MakePod(2) + ",\"NodeNames\":[";
    for (size_t i = 0; i < names.size(); ++i) body += (i ? ",\"" : "\"") + names[i] + "\"";
    body += "]}";
    HttpAnswer a = extender_->Filter(body);
    EXPECT_EQ(a.status, 200) << a.body;
    return nlohmann::json::parse(a.body);
  }

  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<topology::Topology> topology_;
  k8s::TopologyCache topologies_;
  std::unique_ptr<NodeCache> cache_;
  std::unique_ptr<ExtenderMetrics> metrics_;
  std::unique_ptr<Extender> extender_;
};

TEST_F(NodeCacheTest, ListThenWatchEventsChangeTheAnswers) {
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.body = List("100", {GpuNode("gpu-a", {0, 3, 5}), GpuNode("gpu-b", {1}),
                                         test::MakeNode("gpu-bad", "{\"version\":9}"),
                                         test::MakeNode("cpu-1", std::nullopt)})});
  server_->Enqueue({.feed = feed});
  kube::NodeInformer::Options o;
  o.initial_backoff = milliseconds(5);
  o.max_backoff = milliseconds(20);
  ASSERT_TRUE(cache_->Start(client_.get(), o).ok());
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return cache_->size() == 4; }));
  EXPECT_EQ(cache_->annotation_errors(), 1u);
  ASSERT_NE(cache_->Find("gpu-bad"), nullptr);
  EXPECT_THAT(cache_->Find("gpu-bad")->error, HasSubstr("version"));

  nlohmann::json r = Filter({"gpu-a", "gpu-b", "gpu-bad", "cpu-1", "not-in-cache"});
  EXPECT_THAT(r["NodeNames"].get<std::vector<std::string>>(),
              UnorderedElementsAre("gpu-a", "gpu-bad", "cpu-1", "not-in-cache"));
  EXPECT_EQ(r["FailedNodes"]["gpu-b"], "kdm: 1 nvidia.com/gpu free, pod needs 2");
  EXPECT_TRUE(r["Nodes"].is_null());

  // gpu-a fills up, gpu-b frees two, gpu-c joins, cpu-1 leaves.
  feed->Send(Event("MODIFIED", GpuNode("gpu-a", {5})));
  feed->Send(Event("MODIFIED", GpuNode("gpu-b", {1, 2, 6})));
  feed->Send(Event("ADDED", GpuNode("gpu-c", {0, 1})));
  feed->Send(Event("DELETED", test::MakeNode("cpu-1", std::nullopt)));
  ASSERT_TRUE(kdm::test::WaitUntil([&] {
    auto c = cache_->Find("gpu-c");
    return c != nullptr && cache_->Find("cpu-1") == nullptr;
  }));
  ASSERT_TRUE(kdm::test::WaitUntil([&] {
    auto b = cache_->Find("gpu-b");
    return b && b->devices && b->devices->resources.at(test::kGpu).available.size() == 3;
  }));
  r = Filter({"gpu-a", "gpu-b", "gpu-c", "cpu-1"});
  EXPECT_THAT(r["NodeNames"].get<std::vector<std::string>>(),
              UnorderedElementsAre("gpu-b", "gpu-c", "cpu-1"));  // cpu-1 now unknown
  EXPECT_EQ(r["FailedNodes"]["gpu-a"], "kdm: 1 nvidia.com/gpu free, pod needs 2");

  // Prioritize from the cache scores the cached free sets, as NodeScore does.
  std::string body = "{\"Pod\":" + test::MakePod(2) + ",\"NodeNames\":[\"gpu-b\",\"gpu-c\"]}";
  HttpAnswer p = extender_->Prioritize(body);
  ASSERT_EQ(p.status, 200);
  auto list = nlohmann::json::parse(p.body);
  const double b = *topology::NodeScore(*topology_, {1, 2, 6}, 2);
  const double c = *topology::NodeScore(*topology_, {0, 1}, 2);
  const auto want = Scorer::ExtenderScores({b, c});
  EXPECT_EQ(list[0]["Host"], "gpu-b");
  EXPECT_EQ(list[0]["Score"], want[0]);
  EXPECT_EQ(list[1]["Score"], want[1]);
  EXPECT_THAT(metrics_->Text(), HasSubstr("kdm_extender_node_cache_total{result=\"unknown\"} 2"));
}

// A LIST of N annotated nodes costs N annotation decodes and nothing else:
// the informer parsed each node once and handed over its annotation value;
// the cache decodes that value once and never parses a node's JSON again
// (kube::NodeObject carries no JSON text to parse). A MODIFIED event is one
// more decode; a DELETED one none.
TEST_F(NodeCacheTest, ListOfNNodesIsNAnnotationDecodes) {
  constexpr int kAnnotated = 7;
  std::vector<std::string> items;
  for (int i = 0; i < kAnnotated; ++i) items.push_back(GpuNode("gpu-" + std::to_string(i), {i}));
  items.push_back(test::MakeNode("cpu-0", std::nullopt));
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.body = List("100", items)});
  server_->Enqueue({.feed = feed});
  ASSERT_TRUE(cache_->Start(client_.get()).ok());
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return cache_->size() == kAnnotated + 1; }));
  EXPECT_EQ(cache_->annotation_decodes(), static_cast<uint64_t>(kAnnotated));
  EXPECT_EQ(cache_->annotation_errors(), 0u);
  ASSERT_NE(cache_->Find("gpu-3"), nullptr);
  ASSERT_TRUE(cache_->Find("gpu-3")->devices.has_value());
  EXPECT_EQ(cache_->Find("gpu-3")->devices->resources.at(test::kGpu).available.size(), 1u);

  feed->Send(Event("MODIFIED", GpuNode("gpu-0", {0, 1})));
  feed->Send(Event("DELETED", GpuNode("gpu-1", {1})));
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return cache_->Find("gpu-1") == nullptr; }));
  EXPECT_EQ(cache_->annotation_decodes(), static_cast<uint64_t>(kAnnotated + 1));
}

// The informer's bad input stays the cache's to report: an annotation that
// is not a string marks the node unreadable; the node is still known.
TEST_F(NodeCacheTest, AnnotationOfTheWrongTypeIsAnErrorNotADecode) {
  server_->Enqueue({.body = List("100", {R"({"metadata":{"name":"odd","annotations":)"
                                         R"({"kdm.io/devices":{"v":1}}}})"})});
  server_->Enqueue({.feed = std::make_shared<WatchFeed>()});
  ASSERT_TRUE(cache_->Start(client_.get()).ok());
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return cache_->size() == 1; }));
  EXPECT_EQ(cache_->annotation_decodes(), 0u);
  EXPECT_EQ(cache_->annotation_errors(), 1u);
  EXPECT_THAT(cache_->Find("odd")->error, HasSubstr("must be a string"));
}

}  // namespace
}  // namespace kdm::scheduler
