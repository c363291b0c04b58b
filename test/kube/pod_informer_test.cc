// kube::PodInformer against the in-tree HTTPS test server: the bound-pods
// field selector is what is requested, LIST then WATCH events are delivered
// in order (ADDED / MODIFIED / DELETED) as parsed pods, a 410 relists only
// after the back-off (on kdm::FakeClock), a deep event is skipped and the
// next delivered, a pod with a bad quantity is delivered with `error`, and
// an event over the client's line limit relists.
// The loop is NodeInformer's (kube/reflector.h); node_informer_test.cc
// covers the rest of it.
#include "kdm/kube/pod_informer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kdm/base/clock.h"
#include "kdm/base/sync.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/wait_until.h"

namespace kdm::kube {
namespace {

using std::chrono::milliseconds;
using test::TestApiServer;
using test::WatchFeed;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A pod `name` (uid "uid-<name>") on `node`, asking `gpus` GPUs.
std::string BoundPod(const std::string& name, const std::string& rv, const std::string& node,
                     const std::string& gpus = "1") {
  return R"({"kind":"Pod","metadata":{"name":")" + name + R"(","namespace":"ml","uid":"uid-)" +
         name + R"(","resourceVersion":")" + rv + R"("},"spec":{"nodeName":")" + node +
         R"(","containers":[{"name":"main","resources":{"limits":{"nvidia.com/gpu":")" + gpus +
         R"("}}}]},"status":{"phase":"Running"}})";
}
std::string BoundPodList(const std::string& rv, const std::vector<std::string>& pods) {
  std::string items;
  for (const auto& p : pods) items += (items.empty() ? "" : ",") + p;
  return R"({"kind":"PodList","metadata":{"resourceVersion":")" + rv + R"("},"items":[)" + items +
         "]}";
}
std::string PodEvent(const std::string& type, const std::string& object) {
  return R"({"type":")" + type + R"(","object":)" + object + "}\n";
}

class PodInformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<test::TestPki> pki = test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status();
    StatusOr<std::unique_ptr<TestApiServer>> s =
        TestApiServer::Start({.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ca_pem_ = pki->ca.cert_pem;
    client_ = MakeClient(/*max_line_bytes=*/8ull << 20);
  }
  std::unique_ptr<Client> MakeClient(uint64_t max_line_bytes) {
    Client::Options options;
    options.max_line_bytes = max_line_bytes;
    options.config.source = "test";
    options.config.host = "127.0.0.1";
    options.config.port = server_->port();
    options.config.ca = Pem{ca_pem_, "the test CA"};
    options.config.token = "t";
    options.retry.max_attempts = 1;  // the informer's own back-off is under test
    StatusOr<std::unique_ptr<Client>> c = Client::Create(std::move(options));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  void TearDown() override {
    if (informer_) informer_->Stop();
    if (server_) server_->Stop();
  }

  // With `advance_on_sleep`, a back-off passes at once; without, only the
  // test's Advance() ends it. Back-off: 500 ms doubling to 1 s, no jitter.
  void StartInformer(bool advance_on_sleep = true) {
    clock_->SetAdvanceOnSleep(advance_on_sleep);
    PodInformer::Options o;
    o.client = client_.get();
    o.clock = clock_;
    o.initial_backoff = milliseconds(500);
    o.max_backoff = milliseconds(1000);
    o.backoff_jitter = 0;
    o.on_list = [this](std::vector<PodObject> pods) {
      std::string names;
      for (const auto& p : pods) names += (names.empty() ? "" : ",") + p.name + "@" + p.node_name;
      MutexLock lock(&mu_);
      log_.push_back("list " + names);
    };
    o.on_event = [this](PodEventType t, const PodObject& p) {
      const char* type = t == PodEventType::kAdded      ? "added"
                         : t == PodEventType::kModified ? "modified"
                                                        : "deleted";
      MutexLock lock(&mu_);
      log_.push_back(std::string(type) + " " + p.namespace_name + "/" + p.name + " " + p.uid + "@" +
                     p.node_name + " rv=" + p.resource_version +
                     (p.error.empty() ? "" : " error=" + p.error));
      pods_.push_back(p);
    };
    StatusOr<std::unique_ptr<PodInformer>> i = PodInformer::Start(std::move(o));
    ASSERT_TRUE(i.ok()) << i.status();
    informer_ = std::move(*i);
  }

  std::vector<std::string> Log() {
    MutexLock lock(&mu_);
    return log_;
  }

  std::string ca_pem_;
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<Client> client_;
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::unique_ptr<PodInformer> informer_;
  Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::vector<PodObject> pods_ ABSL_GUARDED_BY(mu_);
};

TEST_F(PodInformerTest, ListThenWatchEventsInOrderOnTheBoundPodsSelector) {
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.body = BoundPodList("100", {BoundPod("a", "90", "n1")})});
  server_->Enqueue({.feed = feed});
  feed->Send(PodEvent("ADDED", BoundPod("b", "101", "n2", "2")));
  feed->Send(PodEvent("BOOKMARK", R"({"kind":"Pod","metadata":{"resourceVersion":"150"}})"));
  feed->Send(PodEvent("MODIFIED", BoundPod("b", "160", "n2", "2")) +
             PodEvent("DELETED", BoundPod("a", "170", "n1")));
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return Log().size() == 4; })) << Log().size();
  EXPECT_THAT(Log(), ElementsAre("list a@n1", "added ml/b uid-b@n2 rv=101",
                                 "modified ml/b uid-b@n2 rv=160", "deleted ml/a uid-a@n1 rv=170"));
  std::vector<test::RecordedRequest> seen = server_->Requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].method, "GET");
  EXPECT_EQ(seen[0].target,
            "/api/v1/pods?fieldSelector=spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded%2C"
            "status.phase%21%3DFailed");
  EXPECT_EQ(seen[0].target, kBoundPodsPath);
  EXPECT_EQ(seen[1].target,
            std::string(kBoundPodsPath) + "&watch=1&resourceVersion=100&allowWatchBookmarks=true");
  {
    MutexLock lock(&mu_);
    ASSERT_EQ(pods_.size(), 3u);
    ASSERT_EQ(pods_[0].pod.containers.size(), 1u);
    EXPECT_EQ(pods_[0].pod.containers[0].limits.at("nvidia.com/gpu"), k8s::Quantity::FromInt(2));
    EXPECT_EQ(pods_[0].phase, "Running");
  }
  PodInformer::Stats stats = informer_->stats();
  EXPECT_EQ(stats.lists, 1u);
  EXPECT_EQ(stats.events, 3u);
  EXPECT_EQ(stats.bookmarks, 1u);
  EXPECT_EQ(stats.resource_version, "170");
}

// A 410 in the stream: the LIST again waits the back-off, and only the
// clock's advance ends it.
TEST_F(PodInformerTest, GoneRelistsAfterTheBackOff) {
  auto feed1 = std::make_shared<WatchFeed>();
  auto feed2 = std::make_shared<WatchFeed>();
  server_->Enqueue({.body = BoundPodList("5", {BoundPod("a", "5", "n1")})});
  server_->Enqueue({.feed = feed1});
  server_->Enqueue({.body = BoundPodList("9", {BoundPod("b", "9", "n1")})});
  server_->Enqueue({.feed = feed2});
  feed1->Send(PodEvent("ERROR", R"({"kind":"Status","code":410,"message":"too old"})"));
  StartInformer(/*advance_on_sleep=*/false);
  ASSERT_TRUE(clock_->WaitForPendingTimers(1, milliseconds(10'000)));  // the back-off
  EXPECT_EQ(server_->RequestCount(), 2u);
  clock_->Advance(milliseconds(499));
  EXPECT_EQ(clock_->PendingTimers(), 1u);
  EXPECT_EQ(server_->RequestCount(), 2u);  // no LIST before the back-off ends
  clock_->Advance(milliseconds(1));
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return feed2->attached(); }));
  EXPECT_THAT(Log(), ElementsAre("list a@n1", "list b@n1"));
  EXPECT_THAT(clock_->Sleeps(), ElementsAre(milliseconds(500)));
  EXPECT_EQ(server_->Requests()[2].target, kBoundPodsPath);
  PodInformer::Stats stats = informer_->stats();
  EXPECT_EQ(stats.relists_after_gone, 1u);
  EXPECT_EQ(stats.backoffs, 1u);
  EXPECT_EQ(stats.lists, 2u);
}

TEST_F(PodInformerTest, DeepEventIsSkippedAndTheNextDelivered) {
  server_->Enqueue({.body = BoundPodList("10", {})});
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed});
  feed->Send(PodEvent("ADDED", R"({"metadata":{"name":"deep","namespace":"ml","uid":"d",)"
                               R"("resourceVersion":"11"},"spec":{"containers":)" +
                                   std::string(100'000, '[') + std::string(100'000, ']') + "}}"));
  feed->Send(PodEvent("ADDED", BoundPod("b", "12", "n1")));
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return Log().size() >= 2; })) << Log().size();
  EXPECT_THAT(Log(), ElementsAre("list ", "added ml/b uid-b@n1 rv=12"));
  PodInformer::Stats stats = informer_->stats();
  EXPECT_EQ(stats.refused, 1u);
  EXPECT_EQ(stats.errors, 0u);
  EXPECT_EQ(stats.lists, 1u);
  EXPECT_EQ(server_->RequestCount(), 2u);
}

// A pod the informer cannot read past its identity is handed over with
// `error`; a pod without a uid breaks the stream (LIST again).
TEST_F(PodInformerTest, BadQuantityIsHandedOverAndAPodWithoutUidRelists) {
  server_->Enqueue({.body = BoundPodList("10", {})});
  auto feed1 = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed1});
  feed1->Send(PodEvent("ADDED", BoundPod("q", "11", "n1", "two")));
  feed1->Send(PodEvent("ADDED", R"({"metadata":{"name":"x","namespace":"ml"}})"));
  server_->Enqueue({.body = BoundPodList("20", {BoundPod("c", "20", "n2")})});
  auto feed2 = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed2});
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return feed2->attached(); }));
  EXPECT_THAT(Log(), ElementsAre("list ",
                                 "added ml/q uid-q@n1 rv=11 error=spec.containers[0].resources."
                                 "limits['nvidia.com/gpu']: invalid quantity \"two\": no digits",
                                 "list c@n2"));
  PodInformer::Stats stats = informer_->stats();
  EXPECT_EQ(stats.errors, 1u);
  EXPECT_THAT(stats.last_error, HasSubstr("the object has no metadata.uid"));
}

// A pod event over the client's line limit breaks the watch mid-line: the
// informer LISTs again (which reads the pod whole) rather than rewatching
// into the same line.
TEST_F(PodInformerTest, EventOverTheLineLimitRelists) {
  client_ = MakeClient(/*max_line_bytes=*/4096);
  ASSERT_NE(client_, nullptr);
  const std::string big = R"({"metadata":{"name":"big","namespace":"ml","uid":"uid-big",)"
                          R"("resourceVersion":"11","labels":{"x":")" +
                          std::string(100'000, 'x') + R"("}},"spec":{"nodeName":"n1"}})";
  server_->Enqueue({.body = BoundPodList("10", {})});
  auto feed1 = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed1});
  feed1->Send(PodEvent("ADDED", big));
  server_->Enqueue({.body = BoundPodList("11", {big})});
  auto feed2 = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed2});
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return feed2->attached(); }));
  EXPECT_THAT(Log(), ElementsAre("list ", "list big@n1"));
  PodInformer::Stats stats = informer_->stats();
  EXPECT_EQ(stats.errors, 1u);
  EXPECT_THAT(stats.last_error, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_EQ(stats.lists, 2u);
  EXPECT_EQ(stats.resource_version, "11");
}

TEST_F(PodInformerTest, StartNeedsAClientAndCallbacks) {
  PodInformer::Options o;
  EXPECT_EQ(PodInformer::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.client = client_.get();
  StatusOr<std::unique_ptr<PodInformer>> i = PodInformer::Start(o);
  EXPECT_EQ(i.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(i.status().message(), "pod informer: on_list and on_event are required");
}

}  // namespace
}  // namespace kdm::kube
