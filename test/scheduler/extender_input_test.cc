// The extender under hostile input (issue 28): what a client or a node's
// annotation sends must not make the answer, the log or the memory grow
// beyond a fixed share of the input, and a deeply nested body is refused or
// skipped without recursion.
// - A 4 KiB NVIDIA_REQUIRE_CUDA of 455 failing alternatives gave a 17.8 KB
//   reason per node (2,000 nodes: a 35.6 MB answer to a 2.2 MB request).
// - One annotation_unreadable line per request (10,000 requests: 10,000
//   lines), and one per informer event of a flapping node.
// - The topology cache kept every distinct matrix of a flapping node.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/k8s/requirements.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/extender_json.h"
#include "kdm/scheduler/node_cache.h"
#include "kdm/test/wait_until.h"
#include "scheduler_test_util.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

namespace kdm::scheduler {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// Every line logged through spdlog's default logger while it lives.
class InputLogSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

class InputLogCapture {
 public:
  InputLogCapture() : previous_(spdlog::default_logger()), sink_(std::make_shared<InputLogSink>()) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~InputLogCapture() { spdlog::set_default_logger(previous_); }
  // The lines holding `event=<event> ` (or ending with it).
  std::vector<std::string> Event(const std::string& event) {
    std::vector<std::string> out;
    for (const std::string& l : sink_->Lines()) {
      if (l.find("event=" + event + " ") != std::string::npos) out.push_back(l);
    }
    return out;
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<InputLogSink> sink_;
};

// The N of `suppressed=N` in `line` (0 when absent).
int64_t SuppressedIn(const std::string& line) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("suppressed=([0-9]+)"))) return 0;
  return std::stoll(m[1]);
}

// "cuda>=99 cuda>=99 ..." (455 alternatives, 4,094 bytes): every one fails
// on a node with cuda 12.4.
std::string ManyAlternatives() {
  std::string v;
  for (int i = 0; i < 455; ++i) v += (i ? " " : "") + std::string("cuda>=99");
  return v;
}

TEST(ExtenderInputTest, RequirementReasonsStayProportionalToTheRequest) {
  const std::string value = ManyAlternatives();
  ASSERT_EQ(value.size(), 4094u);
  const topology::Topology t = *topology::Preset("dgx1-v100");
  const k8s::DeviceAttributes cuda124{.cuda = "12.4"};
  std::vector<std::string> nodes;
  for (int i = 0; i < 2000; ++i) {
    const std::string name = "gpu-" + std::to_string(i);
    nodes.push_back(test::MakeNode(name, test::MakeAnnotation(name, t, {0, 1}, cuda124, false)));
  }
  const std::string body =
      test::MakeArgs(test::MakePod(1, {{"NVIDIA_REQUIRE_CUDA", value}}), nodes);
  // Every node judged, however slow the machine (a sanitizer build, a busy
  // CI): the default 500 ms budget would pass the rest unjudged.
  Extender extender({.policy = ScorePolicy::kBestSet, .request_budget = std::chrono::hours(1)});
  HttpAnswer a = extender.Filter(body);
  ASSERT_EQ(a.status, 200) << a.body.substr(0, 300);
  json doc = json::parse(a.body);
  ASSERT_EQ(doc["FailedAndUnresolvableNodes"].size(), 2000u);
  const std::string reason = doc["FailedAndUnresolvableNodes"]["gpu-7"].get<std::string>();
  EXPECT_THAT(reason, HasSubstr("NVIDIA_REQUIRE_CUDA: cuda 12.4 does not satisfy cuda>=99"));
  EXPECT_THAT(reason, HasSubstr("and 452 more alternatives"));
  // Each reason is bounded, so the answer is a fraction of the request
  // (it was 16 times it).
  EXPECT_LE(reason.size(), k8s::kMaxRequirementMessageBytes + 100);
  EXPECT_LT(a.body.size(), body.size()) << "request " << body.size() << " bytes";
}

TEST(ExtenderInputTest, AContainerNameIsCutInReasons) {
  const topology::Topology t = *topology::Preset("dgx1-v100");
  std::string pod = test::MakePod(1, {{"NVIDIA_REQUIRE_CUDA", "cuda>=99"}});
  const std::string long_name(100000, 'c');
  pod.replace(pod.find("\"name\":\"main\""), 13, "\"name\":\"" + long_name + "\"");
  Extender extender({.policy = ScorePolicy::kBestSet});
  HttpAnswer a = extender.Filter(test::MakeArgs(
      pod, {test::MakeNode(
               "n", test::MakeAnnotation("n", t, {0}, k8s::DeviceAttributes{.cuda = "12.4"}))}));
  ASSERT_EQ(a.status, 200) << a.body.substr(0, 300);
  const std::string reason =
      json::parse(a.body)["FailedAndUnresolvableNodes"]["n"].get<std::string>();
  EXPECT_THAT(reason, HasSubstr("kdm: container " + std::string(60, 'c') + "...: "));
  EXPECT_LT(reason.size(), 200u);
}

TEST(ExtenderInputTest, UnreadableAnnotationLinesAreRateLimitedWithCounts) {
  InputLogCapture log;
  Extender extender({.policy = ScorePolicy::kBestSet});
  const std::string body = test::MakeArgs(test::MakePod(1), {test::MakeNode("bad", "{\"x\":")});
  const auto start = std::chrono::steady_clock::now();
  constexpr int kRequests = 10000;
  for (int i = 0; i < kRequests; ++i) ASSERT_EQ(extender.Filter(body).status, 200);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // A few lines per second of the flood (10,000 before).
  const size_t bound = Extender::kUnreadableLogBurst * (static_cast<size_t>(seconds) + 2);
  EXPECT_LE(log.Event("annotation_unreadable").size(), bound) << seconds << " s";
  // The lines left out are counted on the next line let through, and once
  // a window is over the next request of any kind logs the rest: with
  // honest requests until it has, every bad one is a line or counted.
  const std::string good =
      test::MakeArgs(test::MakePod(1), {test::MakeNode("plain", std::nullopt)});
  auto counted = [&] {
    int64_t n = 0;
    for (const std::string& l : log.Event("annotation_unreadable")) n += SuppressedIn(l);
    for (const std::string& l : log.Event("annotation_unreadable_suppressed")) {
      n += SuppressedIn(l);
    }
    return n;
  };
  auto accounted = [&] {
    return static_cast<int64_t>(log.Event("annotation_unreadable").size()) + counted();
  };
  EXPECT_TRUE(kdm::test::WaitUntil([&] {
    EXPECT_EQ(extender.Filter(good).status, 200);
    return accounted() == kRequests;
  })) << accounted();
  EXPECT_GT(counted(), 0);
  EXPECT_THAT(log.Event("annotation_unreadable").front(),
              HasSubstr("first=\"bad: kdm.io/devices: "));
}

// A node whose annotation flaps between unreadable values: one line per
// change at first, then a few per window; another node still gets its line.
TEST(ExtenderInputTest, AFlappingNodeCannotFloodTheNodeCacheLog) {
  InputLogCapture log;
  k8s::TopologyCache topologies;
  NodeCache cache(&topologies);
  for (int i = 0; i < 1000; ++i) {
    kube::NodeObject n{.name = "flapper"};
    n.annotations[std::string(k8s::kDevicesAnnotationKey)] = "{\"v\":" + std::to_string(i);
    cache.Apply(i == 0 ? kube::NodeEventType::kAdded : kube::NodeEventType::kModified, n);
  }
  kube::NodeObject other{.name = "other"};
  other.annotations[std::string(k8s::kDevicesAnnotationKey)] = "[]";
  cache.Apply(kube::NodeEventType::kAdded, other);
  EXPECT_EQ(cache.annotation_errors(), 1001u);
  const std::vector<std::string> lines = log.Event("annotation_unreadable");
  size_t flapper = 0, others = 0;
  for (const std::string& l : lines) {
    (l.find("node=\"flapper\"") != std::string::npos ? flapper : others)++;
  }
  // 1,000 before; each window of kUnreadableLogWindow lets a few through.
  EXPECT_LE(flapper, 2 * static_cast<size_t>(NodeCache::kUnreadableLogBurst));
  EXPECT_EQ(others, 1u);
}

// A flapping node with a new matrix at each change: the topology cache keeps
// its bytes (it kept every matrix, up to 4,096).
TEST(ExtenderInputTest, AFlappingMatrixKeepsTheTopologyCacheWithinItsBytes) {
  topology::Topology t = *topology::Preset("dgx1-v100");
  std::vector<std::vector<topology::Link>> links(t.size());
  for (int i = 0; i < t.size(); ++i) {
    for (int j = 0; j < t.size(); ++j) links[i].push_back(t.LinkBetween(i, j));
  }
  k8s::TopologyCache probe;
  ASSERT_TRUE(k8s::DecodeNodeDevices(test::MakeAnnotation("n", t, {0}), &probe).ok());
  const size_t entry = probe.stats().bytes;
  k8s::TopologyCache topologies(4 * entry);
  NodeCache cache(&topologies);
  for (int v = 1; v <= 60; ++v) {
    links[2][5].nvlinks = links[5][2].nvlinks = v;
    topology::Topology changed = *topology::Topology::Create(t.devices(), links);
    kube::NodeObject n{.name = "flapper"};
    n.annotations[std::string(k8s::kDevicesAnnotationKey)] =
        test::MakeAnnotation("flapper", changed, {0, 1});
    cache.Apply(kube::NodeEventType::kModified, n);
    ASSERT_LE(topologies.stats().bytes, 4 * entry);
  }
  EXPECT_EQ(cache.annotation_errors(), 0u);
  EXPECT_LE(topologies.stats().entries, 4u);
  EXPECT_GE(topologies.stats().evictions, 56u);
  // The node's current matrix is the one read last.
  std::shared_ptr<const CachedNode> n = cache.Find("flapper");
  ASSERT_TRUE(n && n->devices);
  EXPECT_EQ(n->devices->resources.at(test::kGpu).topology->topology.LinkBetween(2, 5).nvlinks, 60);
}

// ------------------------------------------------- deep nesting

std::string Deep(size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

// The body reader (simdjson On-Demand) descends only into the fields it
// reads, a fixed few levels, and skips the rest without recursion: a body
// nested 1,000 or 100,000 deep is refused naming the field, or skipped
// (under a field it does not read: a Node's spec.podCIDRs, the issue's
// attack on the informer), the node's span kept whole.
TEST(ExtenderInputTest, DeeplyNestedBodiesAreRefusedOrSkippedWithoutRecursion) {
  const std::string pod = test::MakePod(1);
  for (size_t depth : {size_t{1000}, size_t{100000}}) {
    SCOPED_TRACE(depth);
    struct Case {
      std::string body;
      std::string expect;  // empty: accepted
    };
    const std::string node_head = "{\"metadata\":{\"name\":\"n\"},\"spec\":{\"podCIDRs\":";
    const std::vector<Case> cases = {
        {Deep(depth), "body must be a JSON object"},
        {"{\"Pod\":" + Deep(depth) + ",\"NodeNames\":[]}", "Pod: must be an object"},
        {"{\"Pod\":{\"spec\":{\"containers\":" + Deep(depth) + "}},\"NodeNames\":[]}",
         "Pod.spec.containers[0]: must be an object"},
        {"{\"Pod\":" + pod + ",\"NodeNames\":" + Deep(depth) + "}",
         "NodeNames[0]: must be a string"},
        {"{\"Pod\":" + pod + ",\"Nodes\":{\"items\":" + Deep(depth) + "}}",
         "Nodes.items[0]: must be an object"},
        {"{\"Pod\":" + pod +
             ",\"Nodes\":{\"items\":[{\"metadata\":{\"name\":\"n\","
             "\"annotations\":" +
             Deep(depth) + "}}]}}",
         "Nodes.items[0].metadata.annotations: must be an object"},
        {"{\"Pod\":" + pod + ",\"NodeNames\":[]," + std::string(depth, '['), "not JSON"},
        // Skipped: fields the reader does not read.
        {"{\"Pod\":" + pod + ",\"x\":" + Deep(depth) + ",\"NodeNames\":[]}", ""},
        {"{\"Pod\":" + pod + ",\"Nodes\":{\"items\":[" + node_head + Deep(depth) + "}}]}}", ""},
    };
    for (const Case& c : cases) {
      StatusOr<ExtenderArgs> args = DecodeExtenderArgs(c.body);
      if (c.expect.empty()) {
        ASSERT_TRUE(args.ok()) << args.status();
        if (args->nodes) {
          ASSERT_EQ(args->nodes->size(), 1u);
          EXPECT_EQ((*args->nodes)[0].raw.size(), node_head.size() + 2 * depth + 1 + 2);
        }
        continue;
      }
      ASSERT_FALSE(args.ok()) << c.expect;
      EXPECT_EQ(args.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(args.status().message()), HasSubstr(c.expect));
    }
    // Through the Extender: a 400 naming the field, or an answer.
    Extender extender({.policy = ScorePolicy::kBestSet});
    EXPECT_EQ(extender.Filter(cases[1].body).status, 400);
    EXPECT_EQ(extender.Prioritize(cases.back().body).status, 200);
  }
}

// A token that starts like null and is not one ("nulx") was an error taken
// as a bool where the reader allows null: simdjson threw and one request
// aborted the extender.
TEST(ExtenderInputTest, ABrokenNullIsA400NotACrash) {
  const std::string pod = test::MakePod(1);
  struct Case {
    std::string body;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"Pod":nulx,"NodeNames":["a"]})", "Pod: must be an object"},
      {R"({"Pod":nul"x"l,"NodeNames":["a"]})", "Pod: must be an object"},
      {"{\"Pod\":" + pod + R"(,"Nodes":{"items":nulx}})", "Nodes.items: must be an array"},
      {"{\"Pod\":" + pod + R"(,"Nodes":{"items":[{"metadata":{"name":"n","annotations":nulx}}]}})",
       "Nodes.items[0].metadata.annotations: must be an object"},
  };
  Extender extender({.policy = ScorePolicy::kBestSet});
  for (const Case& c : cases) {
    StatusOr<ExtenderArgs> args = DecodeExtenderArgs(c.body);
    ASSERT_FALSE(args.ok()) << c.body;
    EXPECT_EQ(args.status().code(), StatusCode::kInvalidArgument) << c.body;
    EXPECT_THAT(std::string(args.status().message()), HasSubstr(c.expect)) << c.body;
    EXPECT_EQ(extender.Filter(c.body).status, 400) << c.body;
  }
}

}  // namespace
}  // namespace kdm::scheduler
