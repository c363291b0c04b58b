// The publish loop's rules (dedupe, min write interval, resync, failures)
// with a fake source, a fake writer and kdm::FakeClock, which drives Run()'s
// waits too; Stop() and the default (real) clock with bounded waits.
#include "kdm/kube/publisher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/test/wait_until.h"
#include "kdm/topology/presets.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace kdm::kube {
namespace {

using namespace std::chrono_literals;
using Result = Publisher::StepResult;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Eight GPUs GPU0..GPU7 (the dgx1-v100 preset's ids); `used` of them held,
// GPU<i> by pod default/pod-<i>.
class FakeSource final : public DeviceSource {
 public:
  StatusOr<NodeDevices> Read() override {
    ++reads;
    if (!fail.ok()) return fail;
    NodeDevices d;
    for (int i = 0; i < 8; ++i) d.allocatable["nvidia.com/gpu"]["GPU" + std::to_string(i)] = i / 4;
    for (int i = 0; i < used; ++i) {
      d.in_use["nvidia.com/gpu"].insert("GPU" + std::to_string(i));
      d.holders.emplace("default", "pod-" + std::to_string(i));
    }
    return d;
  }
  std::atomic<int> used{0};
  std::atomic<int> reads{0};
  Status fail;
};

class FakeWriter final : public AnnotationWriter {
 public:
  Status Write(const std::string& node, const std::string& value) override {
    ++attempts;
    if (!fail.ok()) return fail;
    nodes.push_back(node);
    values.push_back(value);
    count = static_cast<int>(values.size());
    return OkStatus();
  }
  // The `available` count of the value written `i`-th.
  size_t Available(size_t i) const {
    return nlohmann::json::parse(values.at(i))["resources"]["nvidia.com/gpu"]["available"].size();
  }
  std::vector<std::string> nodes;
  std::vector<std::string> values;
  std::atomic<int> count{0};
  int attempts = 0;
  Status fail;
};

class PublisherTest : public ::testing::Test {
 protected:
  Publisher::Options Opts() {
    Publisher::Options o;
    o.node = "gpu-node-7";
    o.topologies.emplace("nvidia.com/gpu", *topology::Preset("dgx1-v100"));
    o.interval = 100ms;
    o.min_write_interval = 1s;
    o.resync = 5min;
    o.clock = clock_;
    return o;
  }
  // 2026-11-24T23:00:00Z.
  std::shared_ptr<FakeClock> clock_ =
      std::make_shared<FakeClock>(Clock::WallTime(std::chrono::seconds(1795561200)));
  FakeSource source_;
  FakeWriter writer_;
};

TEST_F(PublisherTest, FirstPollWritesAndAnUnchangedValueIsNotWrittenAgain) {
  Publisher p(Opts(), &source_, &writer_);
  EXPECT_EQ(p.Step(), Result::kWritten);
  ASSERT_EQ(writer_.values.size(), 1u);
  EXPECT_EQ(writer_.nodes[0], "gpu-node-7");
  EXPECT_EQ(writer_.Available(0), 8u);
  EXPECT_THAT(writer_.values[0], HasSubstr(R"("updated":"2026-11-24T23:00:00Z")"));
  EXPECT_THAT(writer_.values[0], HasSubstr(R"("matrix":[["X","NV1")"));
  EXPECT_EQ(p.last_written(), writer_.values[0]);
  // Time passes (and `updated` would change) but the devices do not.
  for (int i = 0; i < 50; ++i) {
    clock_->Advance(2s);
    EXPECT_EQ(p.Step(), Result::kUnchanged);
  }
  EXPECT_EQ(writer_.values.size(), 1u);
}

TEST_F(PublisherTest, ChangesAreWrittenAtMostOncePerMinWriteInterval) {
  Publisher p(Opts(), &source_, &writer_);
  ASSERT_EQ(p.Step(), Result::kWritten);
  // A burst: 50 admissions, one poll every 10 ms, within 500 ms.
  for (int i = 1; i <= 50; ++i) {
    source_.used = 1 + i % 8;  // never the value written first
    clock_->Advance(10ms);
    EXPECT_EQ(p.Step(), Result::kRateLimited) << i;
  }
  EXPECT_EQ(writer_.values.size(), 1u);
  // Once the interval is over the newest value lands, once.
  clock_->Advance(500ms);
  EXPECT_EQ(p.Step(), Result::kWritten);
  EXPECT_EQ(writer_.Available(1), 8u - (1 + 50 % 8));
  clock_->Advance(1s);
  EXPECT_EQ(p.Step(), Result::kUnchanged);
  EXPECT_EQ(writer_.values.size(), 2u);
}

TEST_F(PublisherTest, BurstWithRegularPollsGivesBoundedWrites) {
  Publisher p(Opts(), &source_, &writer_);
  // 10 s of polls every 100 ms, the value changing at every poll.
  for (int i = 0; i < 100; ++i) {
    source_.used = i % 8;
    p.Step();
    clock_->Advance(100ms);
  }
  // One write per second at most (the first poll included).
  EXPECT_LE(writer_.values.size(), 10u);
  EXPECT_GE(writer_.values.size(), 9u);
}

TEST_F(PublisherTest, ResyncRewritesAnUnchangedValue) {
  Publisher p(Opts(), &source_, &writer_);
  ASSERT_EQ(p.Step(), Result::kWritten);
  clock_->Advance(5min - 1ms);
  EXPECT_EQ(p.Step(), Result::kUnchanged);
  clock_->Advance(1ms);
  EXPECT_EQ(p.Step(), Result::kWritten);
  ASSERT_EQ(writer_.values.size(), 2u);
  // Same content, a new `updated`.
  EXPECT_NE(writer_.values[0], writer_.values[1]);
  EXPECT_THAT(writer_.values[1], HasSubstr(R"("updated":"2026-11-24T23:05:00Z")"));
  // The resync period restarts from the last write.
  clock_->Advance(4min);
  EXPECT_EQ(p.Step(), Result::kUnchanged);
}

TEST_F(PublisherTest, WriteFailuresAreRetriedWithTheNewestValue) {
  Publisher p(Opts(), &source_, &writer_);
  writer_.fail = UnavailableError("connection refused");
  EXPECT_EQ(p.Step(), Result::kWriteFailed);
  // Retried at the next poll past the min write interval, not before.
  clock_->Advance(500ms);
  EXPECT_EQ(p.Step(), Result::kRateLimited);
  clock_->Advance(500ms);
  EXPECT_EQ(p.Step(), Result::kWriteFailed);
  EXPECT_EQ(writer_.attempts, 2);
  // The API server is down for 10 s while pods come and go.
  for (int i = 0; i < 100; ++i) {
    source_.used = (i % 3) + 1;
    clock_->Advance(100ms);
    p.Step();
  }
  EXPECT_LE(writer_.attempts, 12);
  EXPECT_TRUE(writer_.values.empty());
  // It comes back: the value of now lands.
  writer_.fail = OkStatus();
  source_.used = 5;
  clock_->Advance(1s);
  EXPECT_EQ(p.Step(), Result::kWritten);
  ASSERT_EQ(writer_.values.size(), 1u);
  EXPECT_EQ(writer_.Available(0), 3u);
  EXPECT_EQ(p.write_failures(), writer_.attempts - 1);
}

TEST_F(PublisherTest, ReadFailuresWriteNothing) {
  Publisher p(Opts(), &source_, &writer_);
  source_.fail = UnavailableError("List on /x failed: connection refused");
  EXPECT_EQ(p.Step(), Result::kReadFailed);
  clock_->Advance(10min);
  EXPECT_EQ(p.Step(), Result::kReadFailed);
  EXPECT_EQ(writer_.attempts, 0);
  source_.fail = OkStatus();
  EXPECT_EQ(p.Step(), Result::kWritten);
}

TEST_F(PublisherTest, RunPollsOnceAnIntervalOfTheClockHasPassed) {
  Publisher::Options o = Opts();
  o.interval = 5s;
  o.min_write_interval = 0ms;
  Publisher p(o, &source_, &writer_);
  std::thread loop([&p] { p.Run(); });
  // The first poll at once, then Run sleeps on the fake clock.
  ASSERT_TRUE(clock_->WaitForPendingTimers(1, 10s));
  EXPECT_EQ(source_.reads, 1);
  EXPECT_EQ(writer_.count, 1);
  source_.used = 3;
  clock_->Advance(4999ms);  // not yet: no poll
  EXPECT_EQ(source_.reads, 1);
  clock_->Advance(1ms);  // the interval is over: the next poll writes
  ASSERT_TRUE(test::WaitUntil([this] { return writer_.count >= 2; }, 10s));
  ASSERT_TRUE(clock_->WaitForPendingTimers(1, 10s));  // asleep again
  EXPECT_EQ(source_.reads, 2);
  p.Stop();  // ends the sleep without time passing
  loop.join();
  EXPECT_EQ(source_.reads, 2);
  p.Stop();  // idempotent
  EXPECT_EQ(clock_->PendingTimers(), 0u);
}

TEST_F(PublisherTest, RunPollsUntilStopOnTheRealClock) {
  Publisher::Options o = Opts();
  o.interval = 5ms;
  o.min_write_interval = 0ms;
  o.clock = NewRealClock();
  auto p = std::make_unique<Publisher>(o, &source_, &writer_);
  std::thread loop([pub = p.get()] { pub->Run(); });
  ASSERT_TRUE(test::WaitUntil([this] { return writer_.count >= 1; }, 10s));
  source_.used = 3;
  ASSERT_TRUE(test::WaitUntil([this] { return writer_.count >= 2; }, 10s));
  p->Stop();
  loop.join();
  const int reads = source_.reads;
  EXPECT_GE(reads, 2);
  p->Stop();  // idempotent
  EXPECT_EQ(source_.reads, reads);
}

TEST_F(PublisherTest, StopBeforeRunReturnsAtOnce) {
  Publisher::Options o = Opts();
  o.clock = nullptr;  // taken as the real clock
  Publisher p(o, &source_, &writer_);
  p.Stop();
  p.Run();
  EXPECT_EQ(source_.reads, 0);
}

TEST(BuildDevicesAnnotationTest, NamedResourcesArePublishedEvenWithoutDevices) {
  NodeDevices d;
  d.allocatable["example.com/fpga"]["f0"] = std::nullopt;
  d.in_use["example.com/fpga"] = {"f0"};
  d.in_use["nvidia.com/gpu"] = {"GPU3"};  // held but unhealthy
  std::map<std::string, topology::Topology> topos;
  topos.emplace("nvidia.com/gpu", *topology::Preset("dgx1-v100"));
  std::map<std::string, k8s::DeviceAttributes> attrs = {
      {"vendor.com/npu", *k8s::ParseAttributes("model=N1")}};
  std::vector<std::string> warnings;
  k8s::DevicesAnnotation a = BuildDevicesAnnotation("n", "t", d, topos, attrs, &warnings);
  EXPECT_EQ(a.node, "n");
  EXPECT_EQ(a.updated, "t");
  ASSERT_EQ(a.resources.size(), 3u);
  EXPECT_TRUE(a.resources["nvidia.com/gpu"].devices.empty());
  EXPECT_FALSE(a.resources["nvidia.com/gpu"].topology.has_value());
  EXPECT_TRUE(a.resources["example.com/fpga"].available.empty());
  EXPECT_EQ(a.resources["vendor.com/npu"].attributes->model, "N1");
  EXPECT_TRUE(warnings.empty());

  d.allocatable["nvidia.com/gpu"]["GPU-x"] = 0;
  a = BuildDevicesAnnotation("n", "t", d, topos, attrs, &warnings);
  EXPECT_THAT(warnings, ElementsAre(HasSubstr("nvidia.com/gpu: device 'GPU-x' is allocatable")));
}

TEST_F(PublisherTest, PodsFollowTheHoldersAndThePolicyIsWritten) {
  Publisher::Options o = Opts();
  o.policies["nvidia.com/gpu"] = topology::Policy::kBestSet;
  Publisher p(o, &source_, &writer_);
  ASSERT_EQ(p.Step(), Result::kWritten);
  EXPECT_THAT(writer_.values[0], HasSubstr(R"("updated":"2026-11-24T23:00:00Z","pods":[],)"));
  EXPECT_THAT(writer_.values[0], HasSubstr(R"("policy":"best-set")"));
  // Two pods start holding GPUs: a new value, with their fingerprints.
  source_.used = 2;
  clock_->Advance(1s);
  ASSERT_EQ(p.Step(), Result::kWritten);
  StatusOr<k8s::DevicesAnnotation> a = k8s::DecodeDevicesAnnotation(writer_.values[1]);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<uint64_t> want = {k8s::PodFingerprint("default", "pod-0"),
                                k8s::PodFingerprint("default", "pod-1")};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(a->pods, want);
  EXPECT_EQ(a->resources.at("nvidia.com/gpu").policy, topology::Policy::kBestSet);
}

TEST(BuildDevicesAnnotationTest, PodsAreTheHoldersFingerprintsSortedAndPolicyPerResource) {
  NodeDevices d;
  d.allocatable["nvidia.com/gpu"]["GPU0"] = 0;
  d.allocatable["example.com/fpga"]["f0"] = std::nullopt;
  d.in_use["nvidia.com/gpu"] = {"GPU0"};
  d.holders = {{"team-b", "job-3"}, {"default", "pod-b"}, {"default", "pod-a"}};
  std::map<std::string, topology::Policy> policies = {
      {"nvidia.com/gpu", topology::Policy::kFirstFit},
      {"vendor.com/npu", topology::Policy::kPacked}};  // no devices, not published
  k8s::DevicesAnnotation a = BuildDevicesAnnotation("n", "t", d, {}, {}, nullptr, policies);
  // docs/publish.md's vectors, sorted.
  ASSERT_TRUE(a.pods.has_value());
  EXPECT_THAT(*a.pods,
              ElementsAre(0x1cc7008e3498d9b4ull, 0x1cc7038e3498decdull, 0x42dce724367973d7ull));
  EXPECT_EQ(a.resources.at("nvidia.com/gpu").policy, topology::Policy::kFirstFit);
  EXPECT_EQ(a.resources.at("example.com/fpga").policy, std::nullopt);
  EXPECT_EQ(a.resources.count("vendor.com/npu"), 0u);
  // No holder: the key is still written, empty.
  d.holders.clear();
  a = BuildDevicesAnnotation("n", "t", d, {}, {});
  EXPECT_EQ(a.pods, std::vector<uint64_t>{});
  EXPECT_THAT(k8s::EncodeDevicesAnnotation(a), HasSubstr(R"("updated":"t","pods":[],)"));
}

// Was: a successful write was logged at -v only, so nothing said when the
// annotation was there at last. Now the first write is event=first_publish
// and later ones event=publish_written at info, 6 a minute (on the clock).
TEST_F(PublisherTest, FirstWriteIsSaidOnceAndLaterWritesAreRateLimited) {
  std::ostringstream captured;
  auto previous = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>(
      "publisher-capture", std::make_shared<spdlog::sinks::ostream_sink_st>(captured));
  logger->set_pattern("%L %v");
  logger->set_level(spdlog::level::debug);
  spdlog::set_default_logger(logger);
  Publisher p(Opts(), &source_, &writer_);
  ASSERT_EQ(p.Step(), Result::kWritten);
  // 19 more writes, one a second, each a changed value.
  for (int i = 1; i < 20; ++i) {
    clock_->Advance(1s);
    source_.used = i % 8;
    ASSERT_EQ(p.Step(), Result::kWritten) << i;
  }
  // A minute on: the next info line counts the lines left out.
  clock_->Advance(61s);
  source_.used = 5;
  ASSERT_EQ(p.Step(), Result::kWritten);
  spdlog::set_default_logger(previous);
  const std::string log = captured.str();
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) ++n;
    return n;
  };
  const std::string bytes = std::to_string(writer_.values.front().size());
  EXPECT_THAT(log, HasSubstr("I event=first_publish node=\"gpu-node-7\" resources=1 devices=8 "
                             "in_use=0 bytes=" +
                             bytes + "\n"));
  EXPECT_EQ(count("event=first_publish"), 1u) << log;
  EXPECT_EQ(count("I event=publish_written"), 7u) << log;
  EXPECT_EQ(count("D event=publish_written"), 13u) << log;
  EXPECT_THAT(log, HasSubstr("I event=publish_written node=\"gpu-node-7\" resources=1 devices=8 "
                             "in_use=5 bytes="));
  EXPECT_THAT(log, HasSubstr("writes=21 suppressed=13\n"));
}

// Issue 30: a --topology for a resource the node does not have was
// published as an empty entry. Now it is said once, left out, and published
// from the first read that has the resource (a plugin registering later).
TEST_F(PublisherTest, ATopologyForAResourceTheNodeLacksIsSaidOnceAndLeftOut) {
  std::ostringstream captured;
  auto previous = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>(
      "publisher-missing", std::make_shared<spdlog::sinks::ostream_sink_st>(captured));
  logger->set_pattern("%L %v");
  spdlog::set_default_logger(logger);
  Publisher::Options o = Opts();
  o.topologies.emplace("example.com/fpga", *topology::Preset("dgx1-v100"));
  Publisher p(o, &source_, &writer_);
  ASSERT_EQ(p.Step(), Result::kWritten);
  clock_->Advance(2s);
  source_.used = 1;
  ASSERT_EQ(p.Step(), Result::kWritten);
  spdlog::set_default_logger(previous);
  ASSERT_EQ(writer_.values.size(), 2u);
  for (const std::string& v : writer_.values) {
    EXPECT_THAT(v, ::testing::Not(HasSubstr("example.com/fpga"))) << v;
    EXPECT_THAT(v, HasSubstr("nvidia.com/gpu"));
  }
  const std::string log = captured.str();
  const std::string line =
      "W event=publish_topology_without_resource resource=\"example.com/fpga\"";
  EXPECT_THAT(log, HasSubstr(line));
  EXPECT_EQ(log.find(line), log.rfind(line)) << log;  // once
}

}  // namespace
}  // namespace kdm::kube
