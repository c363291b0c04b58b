// Regression tests of issue 16 ("Hardening, round 2") for the Manager, against
// gMock plugin stubs and a fake clock:
//  - health events reach subscribers in the order the Ledger produced them,
//    and a slow subscriber cannot make the queue grow without bound;
//  - a failed checkpoint write of a snapshot, a stream end or a grace expiry
//    is retried until it lands (the store ends equal to the Ledger);
//  - text from a plugin cannot forge or flood log lines;
//  - a plugin flapping health cannot flood the log with devices_updated.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "kdm/base/sync.h"
#include "kdm/checkpoint/store.h"
#include "kdm/devicemanager/manager_impl.h"
#include "kdm/devicemanager/metrics.h"
#include "kdm/test/devicemanager/test_pods.h"
#include "kdm/test/mocks/mock_device_plugin.h"
#include "kdm/test/wait_until.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

namespace kdm::devicemanager {

// For gMock's messages.
void PrintTo(const DeviceHealthEvent& e, std::ostream* os) {
  *os << "{" << e.resource_name << " " << e.device_id << (e.healthy ? " healthy}" : " unhealthy}");
}

namespace {

using ::kdm::testing::FakeListAndWatch;
using ::kdm::testing::MockDevicePluginStub;
using ::kdm::testing::Snapshot;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::Invoke;
using ::testing::StrictMock;

using kdm::devicemanager::testing::MakePod;

constexpr char kHardGpu[] = "vendor.com/gpu";
constexpr char kHardNic[] = "vendor.com/nic";

// Fault injection as a decorator: a memory store whose next `fail_next`
// Apply calls fail. Locked: the Manager writes from its threads while the
// test reads.
class FailingStore : public checkpoint::Store {
 public:
  StatusOr<checkpoint::CheckpointData> Load() override {
    std::lock_guard<std::mutex> l(mu_);
    return inner_->Load();
  }
  Status Apply(const checkpoint::Change& c) override {
    std::lock_guard<std::mutex> l(mu_);
    if (fail_next_ > 0) {
      --fail_next_;
      ++failures_;
      return InternalError("disk full");
    }
    return inner_->Apply(c);
  }
  Status Replace(const checkpoint::CheckpointData& d) override {
    std::lock_guard<std::mutex> l(mu_);
    return inner_->Replace(d);
  }
  Status SetBootId(const std::string& b) override {
    std::lock_guard<std::mutex> l(mu_);
    return inner_->SetBootId(b);
  }
  std::string Describe() const override { return "failing"; }

  void FailNext(int n) {
    std::lock_guard<std::mutex> l(mu_);
    fail_next_ = n;
  }
  int failures() {
    std::lock_guard<std::mutex> l(mu_);
    return failures_;
  }

 private:
  std::mutex mu_;
  int fail_next_ = 0;
  int failures_ = 0;
  std::unique_ptr<checkpoint::Store> inner_ = checkpoint::NewMemoryStore();
};

// Every log line, split at '\n' as a log file would show it.
class LineSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> l(lines_mu_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::string text(buf.data(), buf.size());
    std::lock_guard<std::mutex> l(lines_mu_);
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      lines_.push_back(text.substr(start, end - start));
      start = end + 1;
    }
  }
  void flush_() override {}

 private:
  std::mutex lines_mu_;
  std::vector<std::string> lines_;
};

// Installs a LineSink as the default logger ("%v": a line starts with its
// event) for its lifetime.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()), sink_(std::make_shared<LineSink>()) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_pattern("%v");
    logger->set_level(spdlog::level::info);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> Lines() { return sink_->Lines(); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<LineSink> sink_;
};

// Effects of other threads are waited for with the default bound (10 s).
using kdm::test::WaitUntil;

struct HardFakePlugin {
  std::shared_ptr<StrictMock<MockDevicePluginStub>> stub =
      std::make_shared<StrictMock<MockDevicePluginStub>>();
  std::shared_ptr<FakeListAndWatch> stream = std::make_shared<FakeListAndWatch>();
};

v1beta1::ListAndWatchResponse HardGpus(int n, bool healthy = true) {
  std::vector<kdm::testing::TestDevice> d;
  for (int i = 0; i < n; ++i) d.push_back({"gpu" + std::to_string(i), healthy, i % 2});
  return Snapshot(d);
}

// gpu0 healthy, gpu1 as given.
v1beta1::ListAndWatchResponse Gpu1(bool healthy) {
  return Snapshot({{"gpu0", true, 0}, {"gpu1", healthy, 1}});
}

class ManagerHardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-mh-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    clock_ = std::make_shared<FakeClock>();
    store_ = std::make_shared<FailingStore>();
  }
  void TearDown() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    for (auto& [path, p] : plugins_) p.stream->Close();
    if (manager_) manager_->Stop();
    manager_.reset();
    std::filesystem::remove_all(dir_);
  }

  Manager::Options BaseOptions() {
    Manager::Options o;
    o.plugin_dir = dir_;
    o.store = store_;
    o.clock = clock_;
    o.rpc_timeout = std::chrono::milliseconds(250);
    o.registration_timeout = std::chrono::milliseconds(2000);
    o.grace_period = std::chrono::minutes(5);
    o.boot_id_provider = []() -> StatusOr<std::string> { return std::string("boot-1"); };
    o.active_pods = [] { return std::set<std::string>(); };
    return o;
  }

  void MakeManager() {
    manager_ = std::make_unique<ManagerImpl>(
        BaseOptions(),
        [this](const std::string& path, std::chrono::milliseconds)
            -> StatusOr<std::shared_ptr<v1beta1::DevicePlugin::StubInterface>> {
          auto it = plugins_.find(path);
          if (it == plugins_.end()) return UnavailableError("no plugin at " + path);
          return std::shared_ptr<v1beta1::DevicePlugin::StubInterface>(it->second.stub);
        });
  }

  HardFakePlugin& AddPlugin(const std::string& socket, v1beta1::ListAndWatchResponse first,
                            bool preferred = false, bool pre_start = false) {
    HardFakePlugin& p = plugins_[socket];
    v1beta1::DevicePluginOptions opts;
    opts.set_get_preferred_allocation_available(preferred);
    opts.set_pre_start_required(pre_start);
    EXPECT_CALL(*p.stub, GetDevicePluginOptions(_, _, _))
        .WillOnce(Invoke(
            [opts](grpc::ClientContext*, const v1beta1::Empty&, v1beta1::DevicePluginOptions* out) {
              *out = opts;
              return grpc::Status::OK;
            }));
    auto stream = p.stream;
    EXPECT_CALL(*p.stub, ListAndWatchRaw(_, _)).WillOnce(Invoke([stream](auto*, const auto&) {
      return stream->NewReader();
    }));
    p.stream->Push(std::move(first));
    return p;
  }

  int64_t Allocatable(const std::string& resource) {
    auto cap = manager_->GetCapacity();
    auto it = cap.resources.find(resource);
    return it == cap.resources.end() ? -1 : it->second.allocatable;
  }

  // The store holds exactly what the Ledger holds (boot id aside).
  ::testing::AssertionResult StoreMatchesLedger() {
    auto stored = store_->Load();
    if (!stored.ok()) return ::testing::AssertionFailure() << stored.status();
    stored->boot_id.clear();
    checkpoint::CheckpointData ledger = manager_->LedgerCheckpointForTest();
    if (*stored == ledger) return ::testing::AssertionSuccess();
    auto show = [](const checkpoint::CheckpointData& d) {
      std::string s = "entries=" + std::to_string(d.entries.size()) + " registered={";
      for (const auto& [r, ids] : d.registered_devices) {
        s += r + ":[";
        for (const auto& id : ids) s += id + " ";
        s += "] ";
      }
      return s + "}";
    };
    return ::testing::AssertionFailure()
           << "store: " << show(*stored) << "\nledger: " << show(ledger);
  }

  std::vector<DeviceHealthEvent> Seen() {
    kdm::MutexLock l(&seen_mu_);
    return seen_;
  }

  std::string dir_;
  std::shared_ptr<FakeClock> clock_;
  std::shared_ptr<FailingStore> store_;
  std::map<std::string, HardFakePlugin> plugins_;
  // A subscriber's callback runs until TearDown stops the Manager, after the
  // test body has returned: whatever it touches is a member, never a local of
  // the body (a local Notification here was written after its frame was gone
  // and smashed the main thread's stack, seen under ThreadSanitizer).
  kdm::Notification blocked_;                  // the subscriber has started to block
  std::atomic<bool> first_delivery_{true};     // the delivery hook acts once
  std::atomic<bool> second_was_ready_{false};  // what the hook saw
  kdm::Notification release_;                  // lets a blocked subscriber go (TearDown too)
  kdm::Mutex seen_mu_;
  std::vector<DeviceHealthEvent> seen_;
  std::unique_ptr<ManagerImpl> manager_;
};

// ------------------------------------------------------------------ item 5: order

// Regression (issue 16, item 5): the events of the first snapshot were
// delivered by the registering thread after it released the lock, those of
// the next by the endpoint's reader thread, so the second batch could reach
// subscribers first. The sync point holds the delivery of the first batch
// until the second snapshot has been taken in and either delivered (the old
// code: the reader delivered it itself) or queued behind the first.
TEST_F(ManagerHardeningTest, RegressionLaterSnapshotsEventsNeverOvertakeEarlierOnes) {
  MakeManager();
  HardFakePlugin& p = AddPlugin("/p/gpu.sock", HardGpus(2));
  manager_->Subscribe([this](const std::vector<DeviceHealthEvent>& ev) {
    kdm::MutexLock l(&seen_mu_);
    seen_.insert(seen_.end(), ev.begin(), ev.end());
  });
  // The hook runs on the delivery thread until TearDown: members, not locals.
  HardFakePlugin* plugin = &p;  // a fixture member (plugins_), copied into the hook
  manager_->SetBeforeHealthDeliveryForTest([this, plugin](const std::vector<DeviceHealthEvent>&) {
    if (!first_delivery_.exchange(false)) return;
    plugin->stream->Push(Gpu1(false));
    second_was_ready_ = WaitUntil([&] {
      for (const auto& e : Seen()) {
        if (!e.healthy) return true;  // delivered already
      }
      return manager_->PendingHealthEventsForTest() > 0;  // queued behind this batch
    });
  });
  ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, "/p/gpu.sock").ok());
  ASSERT_TRUE(WaitUntil([&] { return Seen().size() >= 3; }));
  EXPECT_TRUE(second_was_ready_);
  EXPECT_THAT(Seen(), ElementsAre(DeviceHealthEvent{kHardGpu, "gpu0", true},
                                  DeviceHealthEvent{kHardGpu, "gpu1", true},
                                  DeviceHealthEvent{kHardGpu, "gpu1", false}));
}

// A subscriber that blocks while a plugin flaps one device 10,000 times: the
// queue coalesces (pending changes of one device collapse, the latest wins),
// stays bounded, and once the subscriber returns it sees the final state.
TEST_F(ManagerHardeningTest, SlowSubscriberKeepsTheQueueBoundedAndSeesTheFinalState) {
  MakeManager();
  HardFakePlugin& p = AddPlugin("/p/gpu.sock", HardGpus(2));
  manager_->Subscribe([&](const std::vector<DeviceHealthEvent>& ev) {
    if (!blocked_.HasBeenNotified()) {
      blocked_.Notify();
      release_.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    kdm::MutexLock l(&seen_mu_);
    seen_.insert(seen_.end(), ev.begin(), ev.end());
  });
  ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, "/p/gpu.sock").ok());
  ASSERT_TRUE(blocked_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  constexpr int kFlips = 10'000;
  for (int i = 0; i < kFlips; ++i) p.stream->Push(Gpu1(i % 2 == 1));  // ends healthy
  // The last snapshot adds gpu2, so its arrival is visible.
  p.stream->Push(Snapshot({{"gpu0", true, 0}, {"gpu1", false, 1}, {"gpu2", true, 0}}));
  ASSERT_TRUE(
      WaitUntil([&] { return manager_->GetCapacity().resources.at(kHardGpu).capacity == 3; }));
  const std::size_t max_pending = manager_->MaxPendingHealthEventsForTest();
  EXPECT_LE(max_pending, ManagerImpl::kHealthEventsCoalesceAt + 2);
  EXPECT_GT(max_pending, 0u);
  release_.Notify();
  ASSERT_TRUE(WaitUntil([&] { return manager_->PendingHealthEventsForTest() == 0; }));
  ASSERT_TRUE(WaitUntil([&] {
    auto seen = Seen();
    return !seen.empty() && seen.back().device_id == "gpu2";
  }));
  std::vector<DeviceHealthEvent> seen = Seen();
  EXPECT_LT(seen.size(), 2u + ManagerImpl::kHealthEventsCoalesceAt + 3);
  // The last word on each device is its final state.
  std::map<std::string, bool> last;
  for (const auto& e : seen) last[e.device_id] = e.healthy;
  EXPECT_EQ(last, (std::map<std::string, bool>{{"gpu0", true}, {"gpu1", false}, {"gpu2", true}}));
}

TEST_F(ManagerHardeningTest, StopDeliversEveryQueuedEventThenNoCallbackRuns) {
  MakeManager();
  HardFakePlugin& p = AddPlugin("/p/gpu.sock", HardGpus(2));
  manager_->Subscribe([&](const std::vector<DeviceHealthEvent>& ev) {
    if (!blocked_.HasBeenNotified()) {
      blocked_.Notify();
      release_.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    kdm::MutexLock l(&seen_mu_);
    seen_.insert(seen_.end(), ev.begin(), ev.end());
  });
  ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, "/p/gpu.sock").ok());
  ASSERT_TRUE(blocked_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  p.stream->Push(Gpu1(false));
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kHardGpu) == 1; }));
  release_.Notify();
  p.stream->Close();
  manager_->Stop();
  const std::vector<DeviceHealthEvent> at_stop = Seen();
  ASSERT_GE(at_stop.size(), 3u);
  EXPECT_EQ(at_stop[2], (DeviceHealthEvent{kHardGpu, "gpu1", false}));
  manager_.reset();
  EXPECT_EQ(Seen(), at_stop);
}

// ------------------------------------------------------------------ item 10: retries

// Regression (issue 16, item 10): a snapshot whose write failed was dropped,
// so the store kept the old healthy set while the Ledger moved on.
TEST_F(ManagerHardeningTest, RegressionSnapshotWriteFailureIsRetriedUntilItLands) {
  MakeManager();
  HardFakePlugin& p = AddPlugin("/p/gpu.sock", HardGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, "/p/gpu.sock").ok());
  ASSERT_TRUE(StoreMatchesLedger());
  store_->FailNext(3);
  p.stream->Push(Gpu1(false));
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kHardGpu) == 1; }));
  EXPECT_EQ(store_->failures(), 1);
  EXPECT_FALSE(StoreMatchesLedger());
  EXPECT_TRUE(manager_->CheckpointPendingForTest());
  // Back-off 100 ms, 200 ms, 400 ms: two more failures, then it lands.
  clock_->Advance(std::chrono::milliseconds(100));
  EXPECT_EQ(store_->failures(), 2);
  clock_->Advance(std::chrono::milliseconds(199));
  EXPECT_EQ(store_->failures(), 2);
  clock_->Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(store_->failures(), 3);
  EXPECT_FALSE(StoreMatchesLedger());
  clock_->Advance(std::chrono::milliseconds(400));
  EXPECT_TRUE(StoreMatchesLedger());
  EXPECT_FALSE(manager_->CheckpointPendingForTest());
  ManagerStats st = manager_->GetStats();
  EXPECT_EQ(st.checkpoint_errors, 3);
  EXPECT_EQ(st.checkpoint_retries, 3);
  // And /metrics shows them.
  std::string text = Metrics::Create()->Render(manager_.get());
  EXPECT_THAT(text, ::testing::HasSubstr("kdm_checkpoint_retries_total 3"));
  EXPECT_THAT(text, ::testing::HasSubstr("kdm_checkpoint_errors_total 3"));
  // Nothing more is scheduled for it.
  clock_->Advance(std::chrono::seconds(60));
  EXPECT_EQ(manager_->GetStats().checkpoint_retries, 3);
}

// Regression (issue 16, item 10): the stream end's write (every device
// unhealthy) was dropped.
TEST_F(ManagerHardeningTest, RegressionStreamEndWriteFailureIsRetriedUntilItLands) {
  MakeManager();
  HardFakePlugin& p = AddPlugin("/p/gpu.sock", HardGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, "/p/gpu.sock").ok());
  store_->FailNext(2);
  p.stream->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "plugin died"));
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kHardGpu) == 0; }));
  EXPECT_EQ(store_->failures(), 1);
  EXPECT_FALSE(StoreMatchesLedger());
  clock_->Advance(std::chrono::milliseconds(100));
  EXPECT_FALSE(StoreMatchesLedger());
  clock_->Advance(std::chrono::milliseconds(200));
  EXPECT_TRUE(StoreMatchesLedger());
  EXPECT_EQ(manager_->GetStats().checkpoint_retries, 2);
  // The grace timer still runs, and its own write lands.
  clock_->Advance(std::chrono::minutes(5));
  EXPECT_THAT(manager_->GetCapacity().deleted, ElementsAre(kHardGpu));
  EXPECT_TRUE(StoreMatchesLedger());
}

// Regression (issue 16, item 10): the grace expiry's write (the resource
// removed) was dropped.
TEST_F(ManagerHardeningTest, RegressionGraceExpiryWriteFailureIsRetriedUntilItLands) {
  MakeManager();
  HardFakePlugin& p = AddPlugin("/p/gpu.sock", HardGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, "/p/gpu.sock").ok());
  p.stream->Close();
  ASSERT_TRUE(WaitUntil([&] { return clock_->PendingTimers() == 1; }));
  ASSERT_TRUE(StoreMatchesLedger());
  store_->FailNext(4);
  clock_->Advance(std::chrono::minutes(5));
  EXPECT_THAT(manager_->GetCapacity().deleted, ElementsAre(kHardGpu));
  EXPECT_EQ(store_->failures(), 1);
  EXPECT_FALSE(StoreMatchesLedger());
  // 100 + 200 + 400 ms: three more failures; 800 ms later it lands.
  clock_->Advance(std::chrono::milliseconds(700));
  EXPECT_EQ(store_->failures(), 4);
  EXPECT_FALSE(StoreMatchesLedger());
  clock_->Advance(std::chrono::milliseconds(800));
  EXPECT_TRUE(StoreMatchesLedger());
  EXPECT_EQ(manager_->GetStats().checkpoint_retries, 4);
}

// A pending change travels with the next write, before it (one
// transaction), and an allocation whose write fails is still rolled back.
TEST_F(ManagerHardeningTest, PendingChangeLandsWithTheNextWriteAndAllocationsStillRollBack) {
  MakeManager();
  HardFakePlugin& p = AddPlugin("/p/gpu.sock", HardGpus(2));
  EXPECT_CALL(*p.stub, Allocate(_, _, _))
      .WillRepeatedly(Invoke([](auto*, const auto&, v1beta1::AllocateResponse* resp) {
        resp->add_container_responses();
        return grpc::Status::OK;
      }));
  ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, "/p/gpu.sock").ok());
  store_->FailNext(2);
  p.stream->Push(Gpu1(false));
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kHardGpu) == 1; }));
  // The allocation's write (with the pending snapshot) fails: rolled back.
  Status s = manager_->Allocate(MakePod("a", {{"main", {{kHardGpu, 1}}}}), "main");
  EXPECT_EQ(s.message(), "cannot write checkpoint (allocation): disk full");
  EXPECT_TRUE(manager_->GetPodsWithDevices().empty());
  EXPECT_TRUE(manager_->CheckpointPendingForTest());
  EXPECT_FALSE(StoreMatchesLedger());
  // The next one lands, and the snapshot with it, before any retry ran.
  ASSERT_TRUE(manager_->Allocate(MakePod("a", {{"main", {{kHardGpu, 1}}}}), "main").ok());
  EXPECT_FALSE(manager_->CheckpointPendingForTest());
  EXPECT_TRUE(StoreMatchesLedger());
  EXPECT_EQ(manager_->GetStats().checkpoint_retries, 0);
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
}

// ------------------------------------------------------------------ item 4: log values

// Regression (issue 16, item 4): device ids, preferred answers, Allocate and
// PreStartContainer errors, stream-end messages, socket paths and env keys
// from a plugin went into log lines raw.
TEST_F(ManagerHardeningTest, RegressionHostilePluginTextCannotForgeOrFloodLogLines) {
  const std::string forged = "x\nevent=forged resource=vendor.com/gpu";
  const std::string huge = "\nevent=forged " + std::string(3 << 20, 'E');
  const std::string socket = "/p/gpu.sock\nevent=forged socket=y";
  MakeManager();
  // Two copies of a forged id (snapshot_repaired), a second normal device.
  v1beta1::ListAndWatchResponse first =
      Snapshot({{forged, true, 0}, {forged, true, 0}, {"gpu1", true, 1}, {"gpu2", true, 1}});
  HardFakePlugin& gpu = AddPlugin(socket, first, /*preferred=*/true, /*pre_start=*/true);
  HardFakePlugin& nic = AddPlugin("/p/nic.sock", Snapshot({{"nic0", true, -1}}));
  EXPECT_CALL(*gpu.stub, GetPreferredAllocation(_, _, _))
      .WillRepeatedly(Invoke([&](auto*, const auto&, v1beta1::PreferredAllocationResponse* r) {
        auto* c = r->add_container_responses();
        // About 3 MB of ids, each with a forged line.
        for (int i = 0; i < 10'000; ++i) c->add_deviceids(forged + std::string(300, 'i'));
        return grpc::Status::OK;
      }));
  auto env_response = [&](const std::string& value) {
    v1beta1::AllocateResponse resp;
    (*resp.add_container_responses()->mutable_envs())["K\nevent=forged"] = value;
    return resp;
  };
  EXPECT_CALL(*gpu.stub, Allocate(_, _, _))
      .WillOnce(Invoke([&](auto*, const auto&, v1beta1::AllocateResponse*) {
        return grpc::Status(grpc::StatusCode::INTERNAL, huge);
      }))
      .WillRepeatedly(Invoke([&](auto*, const auto&, v1beta1::AllocateResponse* resp) {
        *resp = env_response("gpu");
        return grpc::Status::OK;
      }));
  EXPECT_CALL(*nic.stub, Allocate(_, _, _))
      .WillRepeatedly(Invoke([&](auto*, const auto&, v1beta1::AllocateResponse* resp) {
        *resp = env_response("nic");
        return grpc::Status::OK;
      }));
  EXPECT_CALL(*gpu.stub, PreStartContainer(_, _, _))
      .WillOnce(::testing::Return(grpc::Status(grpc::StatusCode::UNKNOWN, huge)))
      .WillOnce(::testing::Return(grpc::Status::OK));

  std::vector<std::string> lines;
  {
    LogCapture capture;
    ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, socket).ok());
    ASSERT_TRUE(manager_->RegisterPlugin(kHardNic, "/p/nic.sock").ok());
    Pod pod = MakePod("p", {{"main", {{kHardGpu, 2}, {kHardNic, 1}}}});
    EXPECT_FALSE(manager_->Allocate(pod, "main").ok());  // the huge Allocate error
    ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
    EXPECT_FALSE(manager_->GetDeviceRunContainerOptions(pod, "main").ok());  // pre-start
    EXPECT_TRUE(manager_->GetDeviceRunContainerOptions(pod, "main").ok());   // conflict
    gpu.stream->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, huge));
    ASSERT_TRUE(WaitUntil([&] { return Allocatable(kHardGpu) == 0; }));
    nic.stream->Close();  // the fake stream ignores cancellation
    manager_->Stop();
    lines = capture.Lines();
  }
  std::set<std::string> events;
  int forged_lines = 0, long_lines = 0;
  std::string first_forged, first_long;
  for (const std::string& line : lines) {
    std::size_t first_char = line.find_first_not_of(" \t");
    const std::string head = first_char == std::string::npos ? "" : line.substr(first_char);
    if (head.rfind("event=forged", 0) == 0 && forged_lines++ == 0) first_forged = head;
    if (line.size() > 4096 && long_lines++ == 0) {
      first_long = std::to_string(line.size()) + " bytes: " + line.substr(0, 120);
    }
    if (head.rfind("event=", 0) == 0) events.insert(head.substr(0, head.find(' ')));
  }
  EXPECT_EQ(forged_lines, 0) << "first: " << first_forged.substr(0, 200);
  EXPECT_EQ(long_lines, 0) << "first: " << first_long;
  // Each place that logs plugin text was reached.
  for (const char* e :
       {"event=plugin_registered", "event=snapshot_repaired", "event=devices_updated",
        "event=preferred_allocation_fallback", "event=allocate_failed", "event=allocated",
        "event=pre_start_failed", "event=run_options_conflict", "event=listandwatch_ended",
        "event=endpoint_stopped"}) {
    EXPECT_TRUE(events.count(e)) << e << " was not logged";
  }
}

// ------------------------------------------------------------------ item 3: log rate

// Regression (issue 16, item 3): a plugin flapping a device's health wrote
// one event=devices_updated line per snapshot (22 MB of log in a day).
TEST_F(ManagerHardeningTest, RegressionFlappingPluginLogsABoundedNumberOfSnapshotLines) {
  MakeManager();
  HardFakePlugin& p = AddPlugin("/p/gpu.sock", HardGpus(2));
  constexpr int kFlips = 10'000;
  std::vector<std::string> lines;
  {
    LogCapture capture;
    ASSERT_TRUE(manager_->RegisterPlugin(kHardGpu, "/p/gpu.sock").ok());
    for (int i = 0; i < kFlips - 1; ++i) p.stream->Push(Gpu1(i % 2 == 1));
    // The last snapshot adds gpu2, so its arrival is visible.
    p.stream->Push(Snapshot({{"gpu0", true, 0}, {"gpu1", true, 1}, {"gpu2", true, 0}}));
    ASSERT_TRUE(WaitUntil([&] { return Allocatable(kHardGpu) == 3; }));
    // The window is over: the trailing count is logged by the flush timer.
    clock_->Advance(std::chrono::seconds(1));
    lines = capture.Lines();
  }
  int64_t logged = 0, suppressed = 0, summaries = 0;
  for (const std::string& line : lines) {
    const bool update = line.rfind("event=devices_updated ", 0) == 0;
    const bool summary = line.rfind("event=devices_updated_suppressed ", 0) == 0;
    if (!update && !summary) continue;
    logged += update;
    summaries += summary;
    std::size_t at = line.find(" suppressed=");
    if (at != std::string::npos) suppressed += std::stoll(line.substr(at + 12));
  }
  // 1 registration snapshot + kFlips later ones, every one logged or counted.
  EXPECT_LE(logged, ManagerImpl::kSnapshotLogBurst) << logged << " lines";
  EXPECT_EQ(summaries, 1);
  EXPECT_EQ(logged + suppressed, kFlips + 1);
}

}  // namespace
}  // namespace kdm::devicemanager
