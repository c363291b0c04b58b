#include "kdm/devicemanager/clock.h"

#include <algorithm>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "kdm/base/sync.h"

namespace kdm::devicemanager {

// The timers of one clock, ordered by (due time, id). Shared by the real and
// the fake clock; only who calls RunDue() differs.
class TimerQueue {
 public:
  using TimePoint = Clock::TimePoint;
  using TimerId = Clock::TimerId;

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
  // Starts at an arbitrary non-zero point so that Now() - grace never wraps.
  TimePoint fake_now_ ABSL_GUARDED_BY(mu_) = TimePoint(std::chrono::hours(24 * 365));
};

namespace {

class RealClock : public Clock {
 public:
  RealClock() : thread_([this] { queue_.RunUntilShutdown(); }) {}
  ~RealClock() override {
    queue_.Shutdown();
    thread_.join();
  }

  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  TimerId ScheduleAt(TimePoint when, std::function<void()> fn) override {
    return queue_.Schedule(when, std::move(fn));
  }
  bool Cancel(TimerId id) override { return queue_.Cancel(id); }
  std::size_t PendingTimers() const override { return queue_.Pending(); }

 private:
  TimerQueue queue_;
  std::thread thread_;  // runs the timers; joined by the destructor
};

}  // namespace

std::shared_ptr<Clock> NewRealClock() { return std::make_shared<RealClock>(); }

FakeClock::FakeClock() : queue_(std::make_unique<TimerQueue>()) {}
FakeClock::~FakeClock() = default;

Clock::TimePoint FakeClock::Now() const { return queue_->FakeNow(); }
Clock::TimerId FakeClock::ScheduleAt(TimePoint when, std::function<void()> fn) {
  return queue_->Schedule(when, std::move(fn));
}
bool FakeClock::Cancel(TimerId id) { return queue_->Cancel(id); }
std::size_t FakeClock::PendingTimers() const { return queue_->Pending(); }
void FakeClock::Advance(Duration d) {
  queue_->RunDue(queue_->FakeTarget(d), /*move_fake_time=*/true);
}

}  // namespace kdm::devicemanager
