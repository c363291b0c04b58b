// kube::NodeInformer against the in-tree HTTPS test server: LIST, a chunked
// WATCH stream with bookmarks, 410 Gone and a relist, resuming after a
// stream ends, and recovery from a failed LIST; a 100,000-deep watch event
// and LIST item refused and skipped (issue 28); its back-off sleeps on
// kdm::FakeClock (which advances itself unless a test drives it), and the
// LISTs and watches a hostile server gets in 10 s of it are counted.
#include "kdm/kube/node_informer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kdm/base/clock.h"
#include "kdm/base/sync.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"
#include "kdm/test/wait_until.h"

namespace kdm::kube {
namespace {

using std::chrono::milliseconds;
using test::Reply;
using test::TestApiServer;
using test::WatchFeed;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Node(const std::string& name, const std::string& rv) {
  return R"({"kind":"Node","metadata":{"name":")" + name + R"(","resourceVersion":")" + rv +
         R"("}})";
}
std::string List(const std::string& rv, const std::vector<std::string>& nodes) {
  std::string items;
  for (const auto& n : nodes) items += (items.empty() ? "" : ",") + n;
  return R"({"kind":"NodeList","metadata":{"resourceVersion":")" + rv + R"("},"items":[)" + items +
         "]}";
}
// A Node whose spec.podCIDRs nests 100,000 deep (~200 KB).
std::string DeepNodeJson(const std::string& name, const std::string& rv) {
  return R"({"kind":"Node","metadata":{"name":")" + name + R"(","resourceVersion":")" + rv +
         R"("},"spec":{"podCIDRs":)" + std::string(100'000, '[') + std::string(100'000, ']') + "}}";
}
std::string Event(const std::string& type, const std::string& object) {
  return R"({"type":")" + type + R"(","object":)" + object + "}\n";
}

class NodeInformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<test::TestPki> pki = test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status();
    StatusOr<std::unique_ptr<TestApiServer>> s =
        TestApiServer::Start({.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    Client::Options options;
    options.config.source = "test";
    options.config.host = "127.0.0.1";
    options.config.port = server_->port();
    options.config.ca = Pem{pki->ca.cert_pem, "the test CA"};
    options.config.token = "t";
    options.retry.max_attempts = 1;  // the informer's own back-off is under test
    StatusOr<std::unique_ptr<Client>> c = Client::Create(std::move(options));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    if (informer_) informer_->Stop();
    // Feeds left open would hold their connection until the server stops.
    if (server_) server_->Stop();
  }

  // With `advance_on_sleep`, a back-off passes at once (the informer's
  // thread advances the fake clock); without, only the test's Advance() ends
  // it.
  // With `default_backoff`, the informer's own back-off defaults (client-go's
  // numbers, with jitter); else 500 ms doubling to 1 s without jitter.
  void StartInformer(bool advance_on_sleep = true, bool default_backoff = false) {
    clock_->SetAdvanceOnSleep(advance_on_sleep);
    NodeInformer::Options o;
    o.client = client_.get();
    o.clock = clock_;
    if (!default_backoff) {
      o.initial_backoff = milliseconds(500);
      o.max_backoff = milliseconds(1000);
      o.backoff_jitter = 0;  // exact sleeps
    }
    o.on_list = [this](std::vector<NodeObject> nodes) {
      std::string names;
      for (const auto& n : nodes) names += (names.empty() ? "" : ",") + n.name;
      MutexLock lock(&mu_);
      log_.push_back("list " + names);
    };
    o.on_event = [this](NodeEventType t, const NodeObject& n) {
      const char* type = t == NodeEventType::kAdded      ? "added"
                         : t == NodeEventType::kModified ? "modified"
                                                         : "deleted";
      MutexLock lock(&mu_);
      log_.push_back(std::string(type) + " " + n.name + "@" + n.resource_version);
    };
    StatusOr<std::unique_ptr<NodeInformer>> i = NodeInformer::Start(std::move(o));
    ASSERT_TRUE(i.ok()) << i.status();
    informer_ = std::move(*i);
  }

  std::vector<std::string> Log() {
    MutexLock lock(&mu_);
    return log_;
  }

  // Drives the fake clock `d` forward in 100 ms steps, each once the
  // informer sleeps (a back-off); stops early when it never sleeps (a busy
  // loop: no timer within 2 s, or over 200 requests). Returns the LISTs and
  // watches the server saw.
  std::pair<size_t, size_t> ListsAndWatchesWithin(milliseconds d) {
    const auto end = clock_->Now() + d;
    while (clock_->Now() < end && server_->RequestCount() <= 200) {
      if (!clock_->WaitForPendingTimers(1, milliseconds(2000))) break;
      clock_->Advance(milliseconds(100));
    }
    size_t lists = 0, watches = 0;
    for (const test::RecordedRequest& r : server_->Requests()) {
      (r.query.find("watch=1") != std::string::npos ? watches : lists)++;
    }
    return {lists, watches};
  }

  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<Client> client_;
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  std::unique_ptr<NodeInformer> informer_;
  Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

TEST_F(NodeInformerTest, ListWatchBookmarksAndRelistAfterGone) {
  auto feed1 = std::make_shared<WatchFeed>();
  auto feed2 = std::make_shared<WatchFeed>();
  server_->Enqueue({.body = List("100", {Node("n1", "90"), Node("n2", "95")})});
  server_->Enqueue({.feed = feed1});
  server_->Enqueue({.body = List("300", {Node("n1", "160"), Node("n3", "101")})});
  server_->Enqueue({.feed = feed2});
  feed1->Send(Event("ADDED", Node("n3", "101")));
  feed1->Send(Event("BOOKMARK", R"({"kind":"Node","metadata":{"resourceVersion":"150"}})"));
  feed1->Send(Event("MODIFIED", Node("n1", "160")) + Event("DELETED", Node("n2", "170")));
  feed1->Send(Event("ERROR", R"json({"kind":"Status","code":410,"reason":"Expired",)json"
                             R"json("message":"too old resource version: 170 (250)"})json"));
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return server_->RequestCount() == 4; }));
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return Log().size() == 5; }));
  EXPECT_THAT(Log(), ElementsAre("list n1,n2", "added n3@101", "modified n1@160", "deleted n2@170",
                                 "list n1,n3"));
  std::vector<test::RecordedRequest> seen = server_->Requests();
  EXPECT_EQ(seen[0].target, "/api/v1/nodes");
  EXPECT_EQ(seen[1].target, "/api/v1/nodes?watch=1&resourceVersion=100&allowWatchBookmarks=true");
  EXPECT_EQ(seen[2].target, "/api/v1/nodes");
  EXPECT_EQ(seen[3].target, "/api/v1/nodes?watch=1&resourceVersion=300&allowWatchBookmarks=true");
  EXPECT_TRUE(kdm::test::WaitUntil([&] { return feed2->attached(); }));
  NodeInformer::Stats stats = informer_->stats();
  EXPECT_EQ(stats.lists, 2u);
  EXPECT_EQ(stats.bookmarks, 1u);
  EXPECT_EQ(stats.events, 3u);
  EXPECT_EQ(stats.relists_after_gone, 1u);
  EXPECT_EQ(stats.resource_version, "300");
  // Stop ends the open watch at once.
  informer_->Stop();
  EXPECT_EQ(server_->RequestCount(), 4u);
}

TEST_F(NodeInformerTest, EndedStreamResumesFromTheLastBookmark) {
  auto feed1 = std::make_shared<WatchFeed>();
  auto feed2 = std::make_shared<WatchFeed>();
  server_->Enqueue({.body = List("7", {})});
  server_->Enqueue({.feed = feed1});
  server_->Enqueue({.feed = feed2});
  feed1->Send(Event("ADDED", Node("a", "8")));
  feed1->Send(Event("BOOKMARK", R"({"metadata":{"resourceVersion":"12"}})"));
  feed1->End();  // the server's watch timeout
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return server_->RequestCount() == 3; }));
  std::vector<test::RecordedRequest> seen = server_->Requests();
  EXPECT_EQ(seen[2].target, "/api/v1/nodes?watch=1&resourceVersion=12&allowWatchBookmarks=true");
  EXPECT_THAT(Log(), ElementsAre("list ", "added a@8"));
  EXPECT_EQ(informer_->stats().lists, 1u);
}

TEST_F(NodeInformerTest, GoneOnTheWatchRequestRelists) {
  server_->Enqueue({.body = List("5", {Node("a", "5")})});
  server_->Enqueue({.status = 410, .body = R"({"kind":"Status","code":410})"});
  server_->Enqueue({.body = List("9", {Node("b", "9")})});
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed});
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return feed->attached(); }));
  EXPECT_THAT(Log(), ElementsAre("list a", "list b"));
  EXPECT_EQ(informer_->stats().relists_after_gone, 1u);
}

TEST_F(NodeInformerTest, FailedListAndGarbageLinesBackOffAndRecover) {
  server_->Enqueue({.status = 403, .body = R"({"message":"nodes is forbidden"})"});
  server_->Enqueue({.body = "not json"});
  server_->Enqueue({.body = R"({"metadata":{"resourceVersion":"1"},"items":[{"metadata":{}}]})"});
  server_->Enqueue({.body = List("2", {Node("a", "2")})});
  auto feed1 = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed1});
  feed1->Send("{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"x\"}}}\n");
  feed1->Send("}}} garbage\n");
  server_->Enqueue({.body = List("3", {Node("a", "3")})});
  auto feed2 = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed2});
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return feed2->attached(); }));
  EXPECT_THAT(Log(), ElementsAre("list a", "added x@", "list a"));
  NodeInformer::Stats stats = informer_->stats();
  EXPECT_EQ(stats.errors, 4u);
  EXPECT_THAT(stats.last_error, HasSubstr("not a JSON object"));
  EXPECT_EQ(stats.lists, 2u);
}

TEST_F(NodeInformerTest, BackOffEndsOnlyWhenTheClockAdvances) {
  server_->Enqueue({.status = 503, .body = R"({"message":"not yet"})"});
  server_->Enqueue({.status = 503, .body = R"({"message":"still not"})"});
  server_->Enqueue({.body = List("2", {Node("a", "2")})});
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed});
  StartInformer(/*advance_on_sleep=*/false);
  ASSERT_TRUE(clock_->WaitForPendingTimers(1, milliseconds(10'000)));  // first back-off
  EXPECT_EQ(server_->RequestCount(), 1u);
  clock_->Advance(milliseconds(499));
  EXPECT_EQ(clock_->PendingTimers(), 1u);  // still backing off: no new LIST
  EXPECT_EQ(server_->RequestCount(), 1u);
  clock_->Advance(milliseconds(1));
  // The second LIST fails too: the back-off doubles.
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return clock_->Sleeps().size() == 2; }));
  ASSERT_TRUE(clock_->WaitForPendingTimers(1, milliseconds(10'000)));
  EXPECT_EQ(server_->RequestCount(), 2u);
  EXPECT_THAT(clock_->Sleeps(), ElementsAre(milliseconds(500), milliseconds(1000)));
  clock_->Advance(milliseconds(1000));
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return feed->attached(); }));
  EXPECT_THAT(Log(), ElementsAre("list a"));
  EXPECT_EQ(informer_->stats().errors, 2u);
}

TEST_F(NodeInformerTest, StopEndsABackOffWithoutTimePassing) {
  server_->Enqueue({.status = 503});
  StartInformer(/*advance_on_sleep=*/false);
  ASSERT_TRUE(clock_->WaitForPendingTimers(1, milliseconds(10'000)));
  const auto before = clock_->Now();
  informer_->Stop();  // returns: the thread is joined
  EXPECT_EQ(clock_->Now(), before);
  EXPECT_EQ(clock_->PendingTimers(), 0u);
  EXPECT_EQ(server_->RequestCount(), 1u);
}

// The informer hands over what it parsed, once: name, version and the
// wanted annotation values (with the reader's padding), never JSON text. A
// node whose annotations have the wrong type is still handed over, with
// annotations_error set.
TEST_F(NodeInformerTest, HandsOverWantedAnnotationsParsedOnce) {
  server_->Enqueue(
      {.body = List("7", {R"({"metadata":{"name":"a","resourceVersion":"5","annotations":)"
                          R"({"kdm.io/devices":"{\"v\":1}","other":"x"}}})",
                          R"({"metadata":{"name":"b","annotations":{"kdm.io/devices":3}}})",
                          R"({"metadata":{"name":"c","annotations":[]}})",
                          R"({"metadata":{"name":"d","annotations":null}})"})});
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed});
  Mutex nodes_mu;
  std::vector<NodeObject> nodes;
  bool listed = false;
  NodeInformer::Options o;
  o.client = client_.get();
  o.clock = clock_;
  o.annotation_keys = {"kdm.io/devices"};
  o.on_list = [&](std::vector<NodeObject> all) {
    MutexLock lock(&nodes_mu);
    nodes = std::move(all);
    listed = true;
  };
  o.on_event = [](NodeEventType, const NodeObject&) {};
  StatusOr<std::unique_ptr<NodeInformer>> i = NodeInformer::Start(std::move(o));
  ASSERT_TRUE(i.ok()) << i.status();
  informer_ = std::move(*i);
  ASSERT_TRUE(kdm::test::WaitUntil([&] {
    MutexLock lock(&nodes_mu);
    return listed;
  }));
  // Stopped once its watch streams, as the other tests stop it (a Stop()
  // while the watch is still connecting can be lost in the HTTPS client
  // until the idle timeout).
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return feed->attached(); }));
  informer_->Stop();
  MutexLock lock(&nodes_mu);
  ASSERT_EQ(nodes.size(), 4u);
  EXPECT_EQ(nodes[0].name, "a");
  EXPECT_EQ(nodes[0].resource_version, "5");
  ASSERT_EQ(nodes[0].annotations.size(), 1u);  // "other" was not asked for
  const std::string& value = nodes[0].annotations.at("kdm.io/devices");
  EXPECT_EQ(value, R"({"v":1})");
  EXPECT_GE(value.capacity() - value.size(), k8s::DecodePadding());
  EXPECT_EQ(nodes[0].annotations_error, "");
  EXPECT_TRUE(nodes[1].annotations.empty());
  EXPECT_EQ(nodes[1].annotations_error, "metadata.annotations['kdm.io/devices']: must be a string");
  EXPECT_EQ(nodes[2].annotations_error, "metadata.annotations: must be an object");
  EXPECT_EQ(nodes[3].annotations_error, "");
  EXPECT_TRUE(nodes[3].annotations.empty());
}

// Issue 28: one deep event killed `kdm extender`. It is refused and skipped;
// the next event on the same watch is delivered, without a relist.
TEST_F(NodeInformerTest, DeepWatchEventIsSkippedAndTheNextIsDelivered) {
  server_->Enqueue({.body = List("10", {Node("a", "10")})});
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed});
  feed->Send(Event("ADDED", DeepNodeJson("deep", "11")));
  feed->Send(Event("ADDED", Node("b", "12")));
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return Log().size() >= 2; })) << Log().size();
  EXPECT_THAT(Log(), ElementsAre("list a", "added b@12"));
  NodeInformer::Stats stats = informer_->stats();
  EXPECT_EQ(stats.refused, 1u);
  EXPECT_EQ(stats.errors, 0u);
  EXPECT_EQ(stats.lists, 1u);
  EXPECT_EQ(stats.resource_version, "12");
  EXPECT_EQ(server_->RequestCount(), 2u);
}

// A deep item of a LIST is refused; the others make the list.
TEST_F(NodeInformerTest, DeepListItemIsSkippedAndTheRestListed) {
  server_->Enqueue(
      {.body = List("10", {Node("a", "8"), DeepNodeJson("deep", "9"), Node("c", "7")})});
  auto feed = std::make_shared<WatchFeed>();
  server_->Enqueue({.feed = feed});
  feed->Send(Event("ADDED", Node("b", "12")));
  StartInformer();
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return Log().size() >= 2; })) << Log().size();
  EXPECT_THAT(Log(), ElementsAre("list a,c", "added b@12"));
  EXPECT_EQ(informer_->stats().refused, 1u);
  EXPECT_EQ(informer_->stats().lists, 1u);
}

// Issue 28: a server answering every WATCH with 410 got ~1,000 LISTs in 5 s.
TEST_F(NodeInformerTest, GoneOnEveryWatchGetsAFewListsInTenSeconds) {
  server_->SetHandler([](const test::RecordedRequest& r) -> Reply {
    if (r.query.find("watch=1") != std::string::npos) {
      return {.status = 410, .body = R"({"kind":"Status","code":410})"};
    }
    return {.body = List("5", {})};
  });
  StartInformer(/*advance_on_sleep=*/false, /*default_backoff=*/true);
  auto [lists, watches] = ListsAndWatchesWithin(milliseconds(10'000));
  EXPECT_LE(lists, 10u);
  EXPECT_GE(lists, 2u);
  EXPECT_LE(watches, lists);
  EXPECT_GE(informer_->stats().backoffs, 2u);
}

// Issue 28: a server ending every watch at once got ~2,000 watches in 5 s.
TEST_F(NodeInformerTest, WatchesEndedAtOnceGetAFewWatchesInTenSeconds) {
  server_->SetHandler([](const test::RecordedRequest& r) -> Reply {
    if (r.query.find("watch=1") != std::string::npos) return {.body = ""};
    return {.body = List("5", {})};
  });
  StartInformer(/*advance_on_sleep=*/false, /*default_backoff=*/true);
  auto [lists, watches] = ListsAndWatchesWithin(milliseconds(10'000));
  EXPECT_LE(watches, 10u);
  EXPECT_GE(watches, 2u);
  EXPECT_EQ(lists, 1u);
  EXPECT_GE(informer_->stats().short_watches, 2u);
}

TEST_F(NodeInformerTest, StartNeedsAClientAndCallbacks) {
  NodeInformer::Options o;
  EXPECT_EQ(NodeInformer::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.client = client_.get();
  EXPECT_EQ(NodeInformer::Start(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kdm::kube
