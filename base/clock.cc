#include "kdm/base/clock.h"

#include <algorithm>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "kdm/base/sync.h"

namespace kdm {

// The timers of one clock, ordered by (due time, id). Shared by the real and
// the fake clock; only who calls RunDue() differs.
class TimerQueue {
 public:
  using TimePoint = Clock::TimePoint;
  using TimerId = Clock::TimerId;

  explicit TimerQueue(TimePoint fake_start = TimePoint()) : fake_now_(fake_start) {}

  TimerId Schedule(TimePoint when, std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    TimerId id = ++last_id_;
    timers_.emplace(Key{when, id}, std::move(fn));
    due_.emplace(id, when);
    changed_.SignalAll();
    return id;
  }

  bool Cancel(TimerId id) ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    auto it = due_.find(id);
    if (it != due_.end()) {
      timers_.erase(Key{it->second, id});
      due_.erase(it);
      return true;
    }
    while (running_id_ == id && running_thread_ != std::this_thread::get_id()) {
      changed_.Wait(&mu_);
    }
    return false;
  }

  std::size_t Pending() const ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    return timers_.size();
  }

  bool AwaitPending(std::size_t count, std::chrono::milliseconds timeout) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    auto enough = [this, count]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return timers_.size() >= count; };
    return mu_.AwaitWithTimeout(kdm::Condition(&enough), absl::FromChrono(timeout));
  }

  // Runs every timer due at or before `now`, one at a time, without the lock.
  // With `move_fake_time`, the fake time first steps to each timer's due
  // time, so a callback sees Now() == its due time (and a timer it schedules
  // within the window runs too); at the end the fake time is `now`.
  void RunDue(TimePoint now, bool move_fake_time = false) ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      std::function<void()> fn;
      {
        kdm::MutexLock lock(&mu_);
        if (timers_.empty() || timers_.begin()->first.when > now) {
          if (move_fake_time) fake_now_ = std::max(fake_now_, now);
          return;
        }
        auto it = timers_.begin();
        if (move_fake_time) fake_now_ = std::max(fake_now_, it->first.when);
        TimerId id = it->first.id;
        fn = std::move(it->second);
        timers_.erase(it);
        due_.erase(id);
        running_id_ = id;
        running_thread_ = std::this_thread::get_id();
      }
      fn();
      kdm::MutexLock lock(&mu_);
      running_id_ = 0;
      changed_.SignalAll();
    }
  }

  // Real clock's loop: sleeps until the next timer is due or Shutdown().
  void RunUntilShutdown() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      {
        kdm::MutexLock lock(&mu_);
        if (shutdown_) return;
        if (timers_.empty()) {
          changed_.Wait(&mu_);
          continue;
        }
        auto wait = timers_.begin()->first.when - std::chrono::steady_clock::now();
        if (wait > Clock::Duration::zero()) {
          changed_.WaitWithTimeout(&mu_, absl::FromChrono(wait));
          continue;
        }
      }
      RunDue(std::chrono::steady_clock::now());
    }
  }

  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    shutdown_ = true;
    changed_.SignalAll();
  }

  // Fake clock's time.
  TimePoint FakeNow() const ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    return fake_now_;
  }
  // The fake time `d` from now (not moved yet: RunDue moves it).
  TimePoint FakeTarget(Clock::Duration d) const ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    return fake_now_ + d;
  }

 private:
  struct Key {
    TimePoint when;
    TimerId id;
    friend auto operator<=>(const Key&, const Key&) = default;
  };

  mutable kdm::Mutex mu_;
  kdm::CondVar changed_;
  std::map<Key, std::function<void()>> timers_ ABSL_GUARDED_BY(mu_);
  std::map<TimerId, TimePoint> due_ ABSL_GUARDED_BY(mu_);
  TimerId last_id_ ABSL_GUARDED_BY(mu_) = 0;
  TimerId running_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread::id running_thread_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  TimePoint fake_now_ ABSL_GUARDED_BY(mu_);
};

Clock::WallTime Clock::WallNow() const { return std::chrono::system_clock::now(); }

bool Clock::SleepUntil(TimePoint deadline, Wakeup& wakeup) {
  if (wakeup.woken()) return true;
  if (Now() >= deadline) return false;
  bool due = false;  // guarded by wakeup.mu_
  const TimerId id = ScheduleAt(deadline, [&wakeup, &due] {
    kdm::MutexLock lock(&wakeup.mu_);
    due = true;
  });
  bool woken;
  {
    kdm::MutexLock lock(&wakeup.mu_);
    auto done = [&wakeup, &due]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(wakeup.mu_) { return due || wakeup.woken_; };
    wakeup.mu_.Await(kdm::Condition(&done));
    woken = wakeup.woken_;
  }
  // After Cancel the callback is not running, so `due` may go.
  Cancel(id);
  return woken;
}

bool Clock::SleepUntilSteady(TimePoint deadline, Wakeup& wakeup) {
  kdm::MutexLock lock(&wakeup.mu_);
  while (!wakeup.woken_) {
    const Duration left = deadline - std::chrono::steady_clock::now();
    if (left <= Duration::zero()) return false;
    wakeup.mu_.AwaitWithTimeout(kdm::Condition(&wakeup.woken_), absl::FromChrono(left));
  }
  return true;
}

namespace {

class RealClock final : public Clock {
 public:
  ~RealClock() override {
    queue_.Shutdown();
    kdm::MutexLock lock(&thread_mu_);
    if (thread_.joinable()) thread_.join();
  }

  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  TimerId ScheduleAt(TimePoint when, std::function<void()> fn) override {
    {
      kdm::MutexLock lock(&thread_mu_);
      if (!thread_.joinable()) thread_ = std::thread([this] { queue_.RunUntilShutdown(); });
    }
    return queue_.Schedule(when, std::move(fn));
  }
  bool Cancel(TimerId id) override { return queue_.Cancel(id); }
  std::size_t PendingTimers() const override { return queue_.Pending(); }
  bool SleepUntil(TimePoint deadline, Wakeup& wakeup) override {
    return SleepUntilSteady(deadline, wakeup);
  }

 private:
  TimerQueue queue_;
  kdm::Mutex thread_mu_;  // a leaf: guards starting the thread
  // Runs the timers, from the first ScheduleAt; joined by the destructor.
  std::thread thread_ ABSL_GUARDED_BY(thread_mu_);
};

}  // namespace

std::shared_ptr<Clock> NewRealClock() { return std::make_shared<RealClock>(); }

// The fake time starts at an arbitrary non-zero point so that Now() - grace
// never wraps.
FakeClock::FakeClock(WallTime wall_start)
    : wall_start_(wall_start),
      start_(TimePoint(std::chrono::hours(24 * 365))),
      queue_(std::make_unique<TimerQueue>(start_)) {}
FakeClock::~FakeClock() = default;

Clock::TimePoint FakeClock::Now() const { return queue_->FakeNow(); }
Clock::WallTime FakeClock::WallNow() const {
  return wall_start_ + std::chrono::duration_cast<WallTime::duration>(Now() - start_);
}
Clock::TimerId FakeClock::ScheduleAt(TimePoint when, std::function<void()> fn) {
  return queue_->Schedule(when, std::move(fn));
}
bool FakeClock::Cancel(TimerId id) { return queue_->Cancel(id); }
std::size_t FakeClock::PendingTimers() const { return queue_->Pending(); }
void FakeClock::Advance(Duration d) {
  queue_->RunDue(queue_->FakeTarget(d), /*move_fake_time=*/true);
}
bool FakeClock::SleepUntil(TimePoint deadline, Wakeup& wakeup) {
  const TimePoint now = Now();
  bool advance;
  {
    kdm::MutexLock lock(&sleeps_mu_);
    sleeps_.push_back(deadline - now);
    advance = advance_on_sleep_;
  }
  if (!advance) return Clock::SleepUntil(deadline, wakeup);
  if (wakeup.woken()) return true;
  if (deadline > now) Advance(deadline - now);
  return false;
}
void FakeClock::SetAdvanceOnSleep(bool on) {
  kdm::MutexLock lock(&sleeps_mu_);
  advance_on_sleep_ = on;
}
std::vector<Clock::Duration> FakeClock::Sleeps() const {
  kdm::MutexLock lock(&sleeps_mu_);
  return sleeps_;
}
bool FakeClock::WaitForPendingTimers(std::size_t count, std::chrono::milliseconds timeout) const {
  return queue_->AwaitPending(count, timeout);
}

}  // namespace kdm
