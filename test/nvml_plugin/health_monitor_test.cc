// HealthMonitor against an in-test NVML: the Api's function pointers point at
// functions of this file, which serve one FakeNvml (a fixture member) with a
// queue of events the test injects.
#include "kdm/nvml/health_monitor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "kdm/base/sync.h"
#include "kdm/test/wait_until.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

namespace kdm::nvml {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct FakeNvml {
  Mutex mu;
  std::deque<EventData> events ABSL_GUARDED_BY(mu);
  // Every wait answers this instead of waiting for events, when set.
  Return wait_answer ABSL_GUARDED_BY(mu) = kSuccess;
  std::set<DeviceHandle> lost ABSL_GUARDED_BY(mu);
  std::map<DeviceHandle, unsigned long long> supported ABSL_GUARDED_BY(mu);
  std::map<DeviceHandle, Return> supported_error ABSL_GUARDED_BY(mu);
  std::map<DeviceHandle, Return> register_error ABSL_GUARDED_BY(mu);
  std::map<DeviceHandle, unsigned long long> registered ABSL_GUARDED_BY(mu);
  Return create_error ABSL_GUARDED_BY(mu) = kSuccess;
  int sets_created ABSL_GUARDED_BY(mu) = 0;
  int sets_freed ABSL_GUARDED_BY(mu) = 0;
  int waits ABSL_GUARDED_BY(mu) = 0;
};

FakeNvml* g_fake = nullptr;
EventSetOpaque* const kSet = reinterpret_cast<EventSetOpaque*>(uintptr_t{0x5e7});

DeviceHandle Handle(int i) { return reinterpret_cast<DeviceHandle>(uintptr_t{0x1000} + i); }

extern "C" {
const char* FakeErrorString(Return ret) {
  switch (ret) {
    case kErrorTimeout:
      return "Timeout";
    case kErrorGpuIsLost:
      return "GPU is lost";
    case kErrorNotSupported:
      return "Not Supported";
    default:
      return "Unknown Error";
  }
}
Return FakeEventSetCreate(EventSetHandle* set) {
  MutexLock lock(&g_fake->mu);
  if (g_fake->create_error != kSuccess) return g_fake->create_error;
  ++g_fake->sets_created;
  *set = kSet;
  return kSuccess;
}
Return FakeEventSetFree(EventSetHandle set) {
  MutexLock lock(&g_fake->mu);
  if (set == kSet) ++g_fake->sets_freed;
  return kSuccess;
}
Return FakeGetSupportedEventTypes(DeviceHandle d, unsigned long long* types) {
  MutexLock lock(&g_fake->mu);
  if (auto it = g_fake->supported_error.find(d); it != g_fake->supported_error.end()) {
    return it->second;
  }
  auto it = g_fake->supported.find(d);
  *types =
      it == g_fake->supported.end()
          ? (kEventTypeXidCriticalError | kEventTypeDoubleBitEccError | kEventTypeSingleBitEccError)
          : it->second;
  return kSuccess;
}
Return FakeRegisterEvents(DeviceHandle d, unsigned long long types, EventSetHandle set) {
  MutexLock lock(&g_fake->mu);
  if (set != kSet) return kErrorInvalidArgument;
  if (auto it = g_fake->register_error.find(d); it != g_fake->register_error.end()) {
    return it->second;
  }
  g_fake->registered[d] |= types;
  return kSuccess;
}
Return FakeEventSetWait(EventSetHandle set, EventData* data, unsigned timeout_ms) {
  if (set != kSet) return kErrorInvalidArgument;
  MutexLock lock(&g_fake->mu);
  ++g_fake->waits;
  if (g_fake->wait_answer != kSuccess) return g_fake->wait_answer;
  auto ready = [](FakeNvml* f) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !f->events.empty(); };
  if (!g_fake->mu.AwaitWithTimeout(Condition(+ready, g_fake), absl::Milliseconds(timeout_ms))) {
    return kErrorTimeout;
  }
  *data = g_fake->events.front();
  g_fake->events.pop_front();
  return kSuccess;
}
Return FakeGetUuid(DeviceHandle d, char* uuid, unsigned length) {
  MutexLock lock(&g_fake->mu);
  if (g_fake->lost.count(d)) return kErrorGpuIsLost;
  std::snprintf(uuid, length, "GPU-%p", static_cast<void*>(d));
  return kSuccess;
}
}

class HealthMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_fake = &fake_;
    api_.ErrorString = &FakeErrorString;
    api_.EventSetCreate = &FakeEventSetCreate;
    api_.EventSetFree = &FakeEventSetFree;
    api_.DeviceGetSupportedEventTypes = &FakeGetSupportedEventTypes;
    api_.DeviceRegisterEvents = &FakeRegisterEvents;
    api_.EventSetWait_v2 = &FakeEventSetWait;
    api_.DeviceGetUUID = &FakeGetUuid;
  }
  void TearDown() override {
    if (monitor_) monitor_->Stop();
    monitor_.reset();
    g_fake = nullptr;
  }

  std::vector<MonitoredGpu> Gpus(int n) {
    std::vector<MonitoredGpu> gpus;
    for (int i = 0; i < n; ++i) gpus.push_back({"GPU-" + std::to_string(i), Handle(i)});
    return gpus;
  }
  HealthMonitor::Options Opts() {
    HealthMonitor::Options o;
    o.wait_timeout = 20ms;
    o.clock = clock_;
    o.on_change = [this](const std::map<std::string, bool>& health,
                         const std::vector<HealthChange>& changes) {
      MutexLock lock(&seen_mu_);
      reports_.push_back(health);
      for (const HealthChange& c : changes) changes_.push_back(c);
    };
    return o;
  }
  void StartMonitor(int n, HealthMonitor::Options o) {
    StatusOr<std::unique_ptr<HealthMonitor>> m = HealthMonitor::Start(api_, Gpus(n), std::move(o));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    monitor_ = std::move(*m);
  }
  void Inject(int gpu, unsigned long long type, unsigned long long data) {
    MutexLock lock(&fake_.mu);
    fake_.events.push_back({Handle(gpu), type, data, kNoInstanceId, kNoInstanceId});
  }
  void Xid(int gpu, unsigned long long xid) { Inject(gpu, kEventTypeXidCriticalError, xid); }
  // Waits until the monitor has taken every injected event (and handled all
  // but the last one's results: see WaitEventsSeen).
  bool WaitEventsSeen(uint64_t n) {
    return test::WaitUntil([&] { return monitor_->EventsSeenForTest() >= n; });
  }
  std::vector<HealthChange> Changes() {
    MutexLock lock(&seen_mu_);
    return changes_;
  }
  bool HealthIs(const std::string& id, bool healthy) {
    std::map<std::string, bool> h = monitor_->Health();
    return h.count(id) && h[id] == healthy;
  }

  FakeNvml fake_;
  Api api_;
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
  Mutex seen_mu_;
  std::vector<std::map<std::string, bool>> reports_ ABSL_GUARDED_BY(seen_mu_);
  std::vector<HealthChange> changes_ ABSL_GUARDED_BY(seen_mu_);
  std::unique_ptr<HealthMonitor> monitor_;
};

TEST_F(HealthMonitorTest, RegistersXidAndDoubleBitEccOnEveryGpu) {
  StartMonitor(2, Opts());
  MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.sets_created, 1);
  EXPECT_EQ(fake_.registered[Handle(0)], kEventTypeXidCriticalError | kEventTypeDoubleBitEccError);
  EXPECT_EQ(fake_.registered[Handle(1)], kEventTypeXidCriticalError | kEventTypeDoubleBitEccError);
  EXPECT_THAT(monitor_->Unmonitored(), IsEmpty());
}

TEST_F(HealthMonitorTest, ACriticalXidMakesItsGpuUnhealthyAndIsReportedAtOnce) {
  StartMonitor(3, Opts());
  Xid(1, 79);
  ASSERT_TRUE(test::WaitUntil([&] { return !Changes().empty(); }));
  std::vector<HealthChange> c = Changes();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].uuid, "GPU-1");
  EXPECT_FALSE(c[0].healthy);
  EXPECT_EQ(c[0].reason, "Xid 79");
  EXPECT_EQ(monitor_->Health(),
            (std::map<std::string, bool>{{"GPU-0", true}, {"GPU-1", false}, {"GPU-2", true}}));
  MutexLock lock(&seen_mu_);
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_EQ(reports_[0], monitor_->Health());
}

TEST_F(HealthMonitorTest, ApplicationXidsAndSkippedXidsChangeNothing) {
  HealthMonitor::Options o = Opts();
  o.checks.skipped_xids = {48};
  StartMonitor(2, std::move(o));
  for (unsigned long long xid : {13, 31, 43, 45, 68, 109, 48}) Xid(0, xid);
  Inject(0, kEventTypeSingleBitEccError, 0);
  // An event that follows them all makes GPU-1 unhealthy: once that is seen,
  // the earlier ones have been handled too (one thread, in order).
  Xid(1, 94);
  ASSERT_TRUE(test::WaitUntil([&] { return !Changes().empty(); }));
  EXPECT_EQ(monitor_->EventsSeenForTest(), 9u);
  std::vector<HealthChange> c = Changes();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].uuid, "GPU-1");
  EXPECT_TRUE(HealthIs("GPU-0", true));
}

TEST_F(HealthMonitorTest, DoubleBitEccMakesItsGpuUnhealthy) {
  StartMonitor(2, Opts());
  Inject(0, kEventTypeDoubleBitEccError, 0);
  ASSERT_TRUE(test::WaitUntil([&] { return !Changes().empty(); }));
  EXPECT_TRUE(HealthIs("GPU-0", false));
  EXPECT_EQ(Changes().at(0).reason, "double-bit ECC error");
}

TEST_F(HealthMonitorTest, XidsDisabledRegistersOnlyEccAndIgnoresXids) {
  HealthMonitor::Options o = Opts();
  o.checks.xids_disabled = true;
  StartMonitor(2, std::move(o));
  {
    MutexLock lock(&fake_.mu);
    EXPECT_EQ(fake_.registered[Handle(0)], kEventTypeDoubleBitEccError);
  }
  Xid(0, 79);
  Inject(1, kEventTypeDoubleBitEccError, 0);
  ASSERT_TRUE(test::WaitUntil([&] { return HealthIs("GPU-1", false); }));
  EXPECT_TRUE(HealthIs("GPU-0", true));
}

TEST_F(HealthMonitorTest, OnlyTheSupportedSubsetIsRegistered) {
  {
    MutexLock lock(&fake_.mu);
    fake_.supported[Handle(0)] = kEventTypeXidCriticalError;  // ECC off
  }
  StartMonitor(1, Opts());
  MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.registered[Handle(0)], kEventTypeXidCriticalError);
}

TEST_F(HealthMonitorTest, AGpuThatCannotRegisterIsUnmonitoredAndStaysHealthy) {
  {
    MutexLock lock(&fake_.mu);
    fake_.supported_error[Handle(0)] = kErrorNotSupported;
    fake_.supported[Handle(1)] = kEventTypeSingleBitEccError;  // none of ours
    fake_.register_error[Handle(2)] = kErrorNotSupported;
  }
  StartMonitor(4, Opts());
  EXPECT_THAT(monitor_->Unmonitored(), ElementsAre("GPU-0", "GPU-1", "GPU-2"));
  Xid(3, 79);
  ASSERT_TRUE(test::WaitUntil([&] { return HealthIs("GPU-3", false); }));
  EXPECT_EQ(monitor_->Health(),
            (std::map<std::string, bool>{
                {"GPU-0", true}, {"GPU-1", true}, {"GPU-2", true}, {"GPU-3", false}}));
}

TEST_F(HealthMonitorTest, ALostGpuIsFoundByProbingAndNeverRecovers) {
  HealthMonitor::Options o = Opts();
  o.recovery = 1s;
  StartMonitor(3, std::move(o));
  {
    MutexLock lock(&fake_.mu);
    fake_.lost.insert(Handle(2));
    fake_.wait_answer = kErrorGpuIsLost;
  }
  ASSERT_TRUE(test::WaitUntil([&] { return !Changes().empty(); }));
  EXPECT_TRUE(HealthIs("GPU-2", false));
  std::vector<HealthChange> c = Changes();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].reason, "GPU lost");
  EXPECT_TRUE(HealthIs("GPU-0", true));
  EXPECT_TRUE(HealthIs("GPU-1", true));
  // Far past the window, after more waits: still lost.
  clock_->Advance(1h);
  int waits = 0;
  {
    MutexLock lock(&fake_.mu);
    waits = fake_.waits;
  }
  ASSERT_TRUE(test::WaitUntil([&] {
    MutexLock lock(&fake_.mu);
    return fake_.waits >= waits + 2;
  }));
  EXPECT_TRUE(HealthIs("GPU-2", false));
  EXPECT_EQ(Changes().size(), 1u);
}

TEST_F(HealthMonitorTest, ALostGpuThatNoProbeFindsMarksEveryGpuUnhealthy) {
  StartMonitor(2, Opts());
  {
    MutexLock lock(&fake_.mu);
    fake_.wait_answer = kErrorGpuIsLost;
  }
  ASSERT_TRUE(test::WaitUntil([&] { return Changes().size() >= 2; }));
  EXPECT_TRUE(HealthIs("GPU-0", false));
  EXPECT_TRUE(HealthIs("GPU-1", false));
  EXPECT_THAT(Changes().at(0).reason, HasSubstr("did not say which"));
}

TEST_F(HealthMonitorTest, RecoveryAfterTheWindowWithTheInjectedClock) {
  HealthMonitor::Options o = Opts();
  o.recovery = 30s;
  StartMonitor(2, std::move(o));
  Xid(0, 79);
  ASSERT_TRUE(test::WaitUntil([&] { return HealthIs("GPU-0", false); }));
  // Just short of the window: several more waits, still unhealthy.
  clock_->Advance(30s - 1ms);
  int waits = 0;
  {
    MutexLock lock(&fake_.mu);
    waits = fake_.waits;
  }
  ASSERT_TRUE(test::WaitUntil([&] {
    MutexLock lock(&fake_.mu);
    return fake_.waits >= waits + 2;
  }));
  EXPECT_TRUE(HealthIs("GPU-0", false));
  // A new critical event restarts the window.
  Xid(0, 79);
  ASSERT_TRUE(WaitEventsSeen(2));
  clock_->Advance(1ms);
  {
    MutexLock lock(&fake_.mu);
    waits = fake_.waits;
  }
  ASSERT_TRUE(test::WaitUntil([&] {
    MutexLock lock(&fake_.mu);
    return fake_.waits >= waits + 2;
  }));
  EXPECT_TRUE(HealthIs("GPU-0", false));
  clock_->Advance(30s);
  ASSERT_TRUE(test::WaitUntil([&] { return Changes().size() >= 2; }));
  EXPECT_TRUE(HealthIs("GPU-0", true));
  std::vector<HealthChange> c = Changes();
  ASSERT_EQ(c.size(), 2u);
  EXPECT_TRUE(c[1].healthy);
  EXPECT_EQ(c[1].reason, "recovered after 30000ms without a critical event");
}

// Counts the lines of one event and the sum of their suppressed= values
// (installed as the default logger for its lifetime; keeps no line).
class SkippedLineCounter : public spdlog::sinks::base_sink<std::mutex> {
 public:
  struct Counts {
    int64_t lines = 0;       // event=health_event_skipped
    int64_t summaries = 0;   // event=health_event_skipped_suppressed
    int64_t suppressed = 0;  // the sum of suppressed=N over both
  };
  Counts Get() {
    std::lock_guard<std::mutex> l(counts_mu_);
    return counts_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string text(msg.payload.data(), msg.payload.size());
    const bool summary = text.rfind("event=health_event_skipped_suppressed ", 0) == 0;
    const bool line = text.rfind("event=health_event_skipped ", 0) == 0;
    if (!summary && !line) return;
    int64_t n = 0;
    if (std::size_t at = text.find(" suppressed="); at != std::string::npos) {
      n = std::stoll(text.substr(at + 12));
    }
    std::lock_guard<std::mutex> l(counts_mu_);
    ++(summary ? counts_.summaries : counts_.lines);
    counts_.suppressed += n;
  }
  void flush_() override {}

 private:
  std::mutex counts_mu_;
  Counts counts_;
};

// Issue 28: a workload causes application Xids (13) at will, and each was
// logged as event=health_event_skipped: 100,000 of them wrote 100,000 lines
// (14 MB). Now a few lines per GPU per second, and the rest counted
// (suppressed=N on the next line let through, or on an
// event=health_event_skipped_suppressed line once the window is over).
TEST_F(HealthMonitorTest, RegressionApplicationXidFloodLogsBoundedLinesWithSuppressedCount) {
  auto counter = std::make_shared<SkippedLineCounter>();
  std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  auto logger = std::make_shared<spdlog::logger>("capture", counter);
  logger->set_level(spdlog::level::info);
  spdlog::set_default_logger(logger);
  struct Restore {
    std::shared_ptr<spdlog::logger> logger;
    ~Restore() { spdlog::set_default_logger(logger); }
  } restore{previous};

  StartMonitor(2, Opts());
  constexpr int64_t kXids = 100'000;
  {
    MutexLock lock(&fake_.mu);
    for (int64_t i = 0; i < kXids; ++i) {
      fake_.events.push_back({Handle(static_cast<int>(i % 2)), kEventTypeXidCriticalError, 13,
                              kNoInstanceId, kNoInstanceId});
    }
  }
  ASSERT_TRUE(WaitEventsSeen(kXids));
  // The window is over: what was held back is summarised without another
  // event having to come.
  clock_->Advance(2s);
  const bool all_accounted = test::WaitUntil([&] {
    SkippedLineCounter::Counts c = counter->Get();
    return c.lines + c.suppressed == kXids;
  });
  SkippedLineCounter::Counts c = counter->Get();
  EXPECT_TRUE(all_accounted) << "lines " << c.lines << " suppressed " << c.suppressed;
  EXPECT_LE(c.lines, 20) << "one line per Xid floods the log";
  EXPECT_GE(c.lines, 2);  // the first of each GPU is logged
  EXPECT_GE(c.summaries, 1);
  EXPECT_EQ(c.lines + c.suppressed, kXids);
  EXPECT_TRUE(HealthIs("GPU-0", true));
  EXPECT_TRUE(HealthIs("GPU-1", true));
}

TEST_F(HealthMonitorTest, AnEventOfAnUnknownHandleIsIgnored) {
  StartMonitor(1, Opts());
  Xid(7, 79);
  Xid(0, 79);
  ASSERT_TRUE(test::WaitUntil([&] { return !Changes().empty(); }));
  EXPECT_TRUE(HealthIs("GPU-0", false));
  EXPECT_EQ(Changes().size(), 1u);
  EXPECT_EQ(monitor_->Health().size(), 1u);
}

TEST_F(HealthMonitorTest, AllDisablesMonitoringWithoutAnEventSet) {
  HealthMonitor::Options o = Opts();
  o.checks.disabled = true;
  StartMonitor(2, std::move(o));
  Xid(0, 79);
  monitor_->Stop();
  MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.sets_created, 0);
  EXPECT_EQ(fake_.waits, 0);
  EXPECT_EQ(monitor_->Health(), (std::map<std::string, bool>{{"GPU-0", true}, {"GPU-1", true}}));
}

TEST_F(HealthMonitorTest, AnEventSetThatCannotBeCreatedIsStartsError) {
  {
    MutexLock lock(&fake_.mu);
    fake_.create_error = kErrorNotSupported;
  }
  StatusOr<std::unique_ptr<HealthMonitor>> m = HealthMonitor::Start(api_, Gpus(1), Opts());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "nvmlEventSetCreate: Not Supported (NVML error 3)");
}

TEST_F(HealthMonitorTest, AGpuListedTwiceIsRefused) {
  std::vector<MonitoredGpu> gpus = Gpus(2);
  gpus[1].uuid = gpus[0].uuid;
  StatusOr<std::unique_ptr<HealthMonitor>> m = HealthMonitor::Start(api_, gpus, Opts());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("\"GPU-0\" is listed twice"));
}

TEST_F(HealthMonitorTest, StopJoinsTheThreadFreesTheSetAndIsIdempotent) {
  StartMonitor(2, Opts());
  ASSERT_TRUE(test::WaitUntil([&] {
    MutexLock lock(&fake_.mu);
    return fake_.waits >= 1;
  }));
  monitor_->Stop();
  monitor_->Stop();
  MutexLock lock(&fake_.mu);
  EXPECT_EQ(fake_.sets_freed, 1);
  const int waits = fake_.waits;
  fake_.mu.Unlock();
  // No wait after Stop returned: the thread is gone.
  EXPECT_EQ(monitor_->EventsSeenForTest(), 0u);
  fake_.mu.Lock();
  EXPECT_EQ(fake_.waits, waits);
}

TEST_F(HealthMonitorTest, WaitErrorsDoNotEndTheMonitor) {
  StartMonitor(1, Opts());
  {
    MutexLock lock(&fake_.mu);
    fake_.wait_answer = kErrorUnknown;
  }
  int waits = 0;
  {
    MutexLock lock(&fake_.mu);
    waits = fake_.waits;
  }
  ASSERT_TRUE(test::WaitUntil([&] {
    MutexLock lock(&fake_.mu);
    return fake_.waits >= waits + 2;
  }));
  {
    MutexLock lock(&fake_.mu);
    fake_.wait_answer = kSuccess;
  }
  Xid(0, 79);
  ASSERT_TRUE(test::WaitUntil([&] { return HealthIs("GPU-0", false); }));
}

}  // namespace
}  // namespace kdm::nvml
