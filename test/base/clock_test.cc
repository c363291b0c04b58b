// kdm::Clock: FakeClock's timers, time and sleeps driven by Advance(), and
// the real clock's timers and sleeps (bounded waits only; no assertion on
// how long anything took).
#include "kdm/base/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kdm/base/sync.h"

namespace kdm {
namespace {

using namespace std::chrono_literals;

TEST(FakeClockTest, AdvanceRunsDueTimersInOrderOnTheCallingThread) {
  FakeClock clock;
  std::vector<int> order;
  auto t0 = clock.Now();
  clock.ScheduleAfter(std::chrono::seconds(3), [&] { order.push_back(3); });
  clock.ScheduleAfter(std::chrono::seconds(1), [&] {
    order.push_back(1);
    // Scheduled from a callback, due within the same Advance(): runs too.
    clock.ScheduleAfter(std::chrono::seconds(1), [&] { order.push_back(2); });
  });
  auto late = clock.ScheduleAfter(std::chrono::seconds(10), [&] { order.push_back(10); });
  EXPECT_EQ(clock.PendingTimers(), 3u);
  clock.Advance(std::chrono::milliseconds(999));
  EXPECT_TRUE(order.empty());
  clock.Advance(std::chrono::seconds(3));
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(clock.Now() - t0, std::chrono::milliseconds(3999));
  EXPECT_TRUE(clock.Cancel(late));
  EXPECT_FALSE(clock.Cancel(late));
  clock.Advance(std::chrono::hours(1));
  EXPECT_EQ(order.size(), 3u);
  EXPECT_EQ(clock.PendingTimers(), 0u);
}

TEST(FakeClockTest, CancelFromInsideItsOwnCallbackDoesNotWait) {
  FakeClock clock;
  Clock::TimerId id = 0;
  bool ran = false;
  id = clock.ScheduleAfter(std::chrono::seconds(1), [&] {
    EXPECT_FALSE(clock.Cancel(id));
    ran = true;
  });
  clock.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(ran);
}

TEST(FakeClockTest, CallbackSeesItsOwnDueTime) {
  FakeClock clock;
  const auto t0 = clock.Now();
  Clock::TimePoint seen;
  clock.ScheduleAfter(2s, [&] { seen = clock.Now(); });
  clock.Advance(1min);
  EXPECT_EQ(seen - t0, 2s);
  EXPECT_EQ(clock.Now() - t0, 1min);
}

TEST(FakeClockTest, WallTimeStartsWhereAskedAndMovesWithAdvance) {
  const Clock::WallTime start{std::chrono::seconds(1795561200)};
  FakeClock clock(start);
  EXPECT_EQ(clock.WallNow(), start);
  clock.Advance(90s);
  EXPECT_EQ(clock.WallNow() - start, 90s);
  EXPECT_EQ(FakeClock().WallNow(), FakeClock::kDefaultWallStart);
}

TEST(FakeClockTest, SleepEndsOnlyWhenAdvanceReachesTheDeadline) {
  FakeClock clock;
  Wakeup never;
  std::atomic<int> result{-1};
  std::thread sleeper([&] { result = clock.SleepFor(10s, never) ? 1 : 0; });
  ASSERT_TRUE(clock.WaitForPendingTimers(1, 10s));
  clock.Advance(9999ms);
  EXPECT_EQ(result, -1);  // still asleep: 1 ms of fake time is left
  EXPECT_EQ(clock.PendingTimers(), 1u);
  clock.Advance(1ms);  // the sleeper's timer ran: it is awake (or waking)
  sleeper.join();
  EXPECT_EQ(result, 0);
  EXPECT_EQ(clock.PendingTimers(), 0u);
}

TEST(FakeClockTest, WakeEndsASleepWithoutTimePassing) {
  FakeClock clock;
  const auto t0 = clock.Now();
  Wakeup stop;
  std::atomic<int> result{-1};
  std::thread sleeper([&] { result = clock.SleepFor(1h, stop) ? 1 : 0; });
  ASSERT_TRUE(clock.WaitForPendingTimers(1, 10s));
  stop.Wake();
  sleeper.join();
  EXPECT_EQ(result, 1);
  EXPECT_EQ(clock.Now(), t0);
  EXPECT_EQ(clock.PendingTimers(), 0u);  // the sleeper's timer is cancelled
}

TEST(FakeClockTest, SleepReturnsAtOnceWhenWokenOrAlreadyDue) {
  FakeClock clock;
  Wakeup stop;
  EXPECT_FALSE(clock.SleepUntil(clock.Now(), stop));
  EXPECT_FALSE(clock.SleepFor(-1s, stop));
  stop.Wake();
  stop.Wake();  // idempotent
  EXPECT_TRUE(stop.woken());
  EXPECT_TRUE(clock.SleepFor(1h, stop));
  EXPECT_EQ(clock.PendingTimers(), 0u);
}

TEST(FakeClockTest, WaitForPendingTimersIsBounded) {
  FakeClock clock;
  EXPECT_FALSE(clock.WaitForPendingTimers(1, 1ms));
  clock.ScheduleAfter(1s, [] {});
  EXPECT_TRUE(clock.WaitForPendingTimers(1, 1ms));
}

TEST(FakeClockTest, AdvanceOnSleepPassesTheTimeOnTheSleepersThread) {
  FakeClock clock;
  const auto t0 = clock.Now();
  std::vector<int> ran;
  clock.ScheduleAfter(2s, [&] { ran.push_back(2); });
  clock.SetAdvanceOnSleep(true);
  Wakeup stop;
  EXPECT_FALSE(clock.SleepFor(3s, stop));  // returns at once, 3 s later
  EXPECT_EQ(clock.Now() - t0, 3s);
  EXPECT_EQ(ran, std::vector<int>{2});  // what fell due ran, on this thread
  EXPECT_FALSE(clock.SleepFor(250ms, stop));
  stop.Wake();
  EXPECT_TRUE(clock.SleepFor(1h, stop));  // woken: no time passes
  EXPECT_EQ(clock.Now() - t0, 3250ms);
  EXPECT_EQ(clock.Sleeps(), (std::vector<Clock::Duration>{3s, 250ms, 1h}));
}

TEST(RealClockTest, RunsATimerOnItsThreadAndCancelsPendingOnes) {
  auto clock = NewRealClock();
  kdm::Notification fired;
  std::thread::id ran_on;
  clock->ScheduleAfter(std::chrono::milliseconds(1), [&] {
    ran_on = std::this_thread::get_id();
    fired.Notify();
  });
  auto never = clock->ScheduleAfter(std::chrono::hours(1), [] { ADD_FAILURE() << "ran"; });
  ASSERT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(clock->Cancel(never));
  EXPECT_EQ(clock->PendingTimers(), 0u);
}

TEST(RealClockTest, WithoutTimersItIsJustTheSystemClocks) {
  auto clock = NewRealClock();  // no timer: no thread to start or join
  const auto before = std::chrono::steady_clock::now();
  EXPECT_GE(clock->Now(), before);
  EXPECT_GT(clock->WallNow().time_since_epoch().count(), 0);
  Wakeup stop;
  EXPECT_FALSE(clock->SleepFor(1ms, stop));  // a real, short sleep that ends
  EXPECT_GE(clock->Now() - before, 1ms);
}

TEST(RealClockTest, WakeEndsALongSleep) {
  auto clock = NewRealClock();
  Wakeup stop;
  std::atomic<int> result{-1};
  std::thread sleeper([&] { result = clock->SleepFor(1h, stop) ? 1 : 0; });
  stop.Wake();  // before or during the sleep: either way it returns true
  sleeper.join();
  EXPECT_EQ(result, 1);
  EXPECT_EQ(clock->PendingTimers(), 0u);  // the real clock sleeps without a timer
}

// A Clock that implements only what an embedder must (timers on "its loop",
// here a FakeClock's) gets SleepUntil from the base class.
class LoopClockForTest final : public Clock {
 public:
  TimePoint Now() const override { return loop.Now(); }
  TimerId ScheduleAt(TimePoint when, std::function<void()> fn) override {
    return loop.ScheduleAt(when, std::move(fn));
  }
  bool Cancel(TimerId id) override { return loop.Cancel(id); }
  std::size_t PendingTimers() const override { return loop.PendingTimers(); }
  FakeClock loop;
};

TEST(ClockTest, DefaultSleepRunsOnTheClocksTimers) {
  LoopClockForTest clock;
  Wakeup stop;
  std::atomic<int> result{-1};
  std::thread sleeper([&] { result = clock.SleepFor(5s, stop) ? 1 : 0; });
  ASSERT_TRUE(clock.loop.WaitForPendingTimers(1, 10s));
  clock.loop.Advance(5s);
  sleeper.join();
  EXPECT_EQ(result, 0);
  const auto wall = clock.WallNow();  // the default: the system clock
  EXPECT_GT(wall.time_since_epoch().count(), 0);
}

}  // namespace
}  // namespace kdm
