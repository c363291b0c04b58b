// kdm::Clock: the one seam between kdm and time. Every kdm component that
// reads the time, arms a timer or waits for a while does it through a Clock:
// the Manager's grace period and checkpoint retries, the kube Client's
// deadline and retry back-off, the NodeInformer's re-list waits, the
// Publisher's polls and its `updated` stamp, the NVML health monitor's
// recovery times, the plugin SDK's registration back-off and watch interval.
// (Still on the real clock: gRPC and Asio deadlines of real I/O, the SDK's
// liveness poll of gRPC calls, and latency metrics.)
//
// NewRealClock() is the system's clocks: Now() is std::chrono::steady_clock,
// WallNow() std::chrono::system_clock, waits really block, and timers run on
// one thread owned by the clock (started at the first ScheduleAt, joined by
// the destructor). FakeClock is the clock for tests and simulations: its time
// moves only when someone calls Advance(), which runs every timer that became
// due, in due-time order, on the caller's thread, and ends the SleepUntil()
// waits that became due. A 5-minute grace period or a 30-second back-off is
// then tested in microseconds and deterministically.
//
// Thread-safety: every method may be called from any thread, including from
// inside a timer callback. Callbacks never run while the clock's own lock is
// held, so a callback may schedule or cancel timers.
//
// An embedder with its own event loop may implement Clock so that timers run
// on that loop (docs/architecture.md#timers-on-your-loop): Now(), ScheduleAt(),
// Cancel() and PendingTimers() are all it must write. The Manager calls
// ScheduleAt with its own mutex held, so an implementation only enqueues
// there: it must not block or call back into the Manager.
//
// Example:
//   auto clock = std::make_shared<kdm::FakeClock>();
//   clock->ScheduleAfter(std::chrono::minutes(5), [] { Expire(); });
//   clock->Advance(std::chrono::minutes(5));  // Expire() has run on return
//
//   kdm::Wakeup stop;                     // Stop() calls stop.Wake()
//   while (!clock->SleepFor(interval, stop)) Poll();
#ifndef KDM_BASE_CLOCK_H_
#define KDM_BASE_CLOCK_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kdm/base/sync.h"

namespace kdm {

// Ends Clock::SleepUntil() waits early: once Wake() was called, every
// current and later SleepUntil() given this Wakeup returns true at once.
// Wake() is sticky and idempotent, which is what a Stop() wants.
// Thread-safe.
class Wakeup {
 public:
  Wakeup() = default;
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;

  void Wake() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    woken_ = true;
  }
  bool woken() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return woken_;
  }

 private:
  friend class Clock;
  mutable Mutex mu_;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

class Clock {
 public:
  using Duration = std::chrono::steady_clock::duration;
  using TimePoint = std::chrono::steady_clock::time_point;
  using WallTime = std::chrono::system_clock::time_point;
  // 0 is never a valid id.
  using TimerId = std::uint64_t;

  virtual ~Clock() = default;

  // The current monotonic time: for intervals, deadlines and timers.
  virtual TimePoint Now() const = 0;

  // The current calendar time, for stamps that people or other systems read
  // (the Publisher's RFC 3339 `updated`); never for intervals. Default: the
  // system clock. FakeClock moves it together with Now().
  virtual WallTime WallNow() const;

  // Runs `fn` once, at or after `when`: on the clock's timer thread (real
  // clock) or inside Advance() (fake clock). Returns an id for Cancel().
  virtual TimerId ScheduleAt(TimePoint when, std::function<void()> fn) = 0;
  TimerId ScheduleAfter(Duration delay, std::function<void()> fn) {
    return ScheduleAt(Now() + delay, std::move(fn));
  }

  // Removes a pending timer. Returns true if it had not started running.
  // When the callback is running on another thread, waits until it has
  // returned, so after Cancel() the callback is guaranteed not to be running
  // (unless Cancel is called from inside that very callback).
  // REQUIRES: the caller holds no lock that the callback takes.
  virtual bool Cancel(TimerId id) = 0;

  // Number of timers scheduled and not yet run or cancelled.
  virtual std::size_t PendingTimers() const = 0;

  // Blocks the calling thread until Now() >= `deadline` (returns false) or
  // `wakeup` is woken (returns true; at once if it already was). The real
  // clock waits on its own; the default implementation arms a timer for
  // `deadline`, so a FakeClock's sleeper wakes when Advance() reaches it,
  // and a sleeper is one of PendingTimers() while it sleeps.
  // REQUIRES: not called on the thread that runs this clock's timers (a
  // timer callback, or FakeClock's Advance() caller): nothing would end it.
  virtual bool SleepUntil(TimePoint deadline, Wakeup& wakeup);
  bool SleepFor(Duration d, Wakeup& wakeup) { return SleepUntil(Now() + d, wakeup); }

 protected:
  // SleepUntil on std::chrono::steady_clock, with no timer.
  static bool SleepUntilSteady(TimePoint deadline, Wakeup& wakeup);
};

// The system's clocks (see the top of this file). Cheap to make: the timer
// thread starts only at the first ScheduleAt. Pending timers are dropped when
// the last reference goes.
std::shared_ptr<Clock> NewRealClock();

class TimerQueue;

// A clock for tests: time stands still until Advance().
class FakeClock : public Clock {
 public:
  // A fixed calendar time: 2026-01-01T00:00:00Z.
  static constexpr WallTime kDefaultWallStart = WallTime(std::chrono::seconds(1767225600));

  // WallNow() starts at `wall_start` and moves with Now().
  explicit FakeClock(WallTime wall_start = kDefaultWallStart);
  ~FakeClock() override;

  TimePoint Now() const override;
  WallTime WallNow() const override;
  TimerId ScheduleAt(TimePoint when, std::function<void()> fn) override;
  bool Cancel(TimerId id) override;
  std::size_t PendingTimers() const override;
  // Records the sleep (Sleeps()), then as Clock::SleepUntil: another thread's
  // Advance() or a Wake() ends it; or, with SetAdvanceOnSleep(true), it
  // advances the clock to `deadline` itself.
  bool SleepUntil(TimePoint deadline, Wakeup& wakeup) override;

  // On: a SleepUntil() that is not woken already does not block but calls
  // Advance() to its deadline on the sleeper's thread and returns false, as
  // if the time had passed at once. For single-threaded tests of code that
  // sleeps (a client's retry back-off). Off by default.
  void SetAdvanceOnSleep(bool on);

  // How long each SleepUntil() so far was asked to sleep (its deadline -
  // Now() at the call), in call order.
  std::vector<Duration> Sleeps() const;

  // Moves the time forward by `d` and runs, on this thread and in due-time
  // order, every timer due by then (SleepUntil() sleepers included: they
  // wake). The time steps to each timer's due time before its callback runs,
  // so timers that callbacks schedule within the window run too; on return
  // Now() is the old time + d.
  void Advance(Duration d);

  // Waits, in real time and at most `timeout`, until at least `count` timers
  // are pending, e.g. until another thread sleeps in SleepUntil(), so that a
  // test advances the time only once that thread waits for it. Returns
  // whether they are.
  bool WaitForPendingTimers(std::size_t count, std::chrono::milliseconds timeout) const;

 private:
  const WallTime wall_start_;
  const TimePoint start_;
  std::unique_ptr<TimerQueue> queue_;
  mutable Mutex sleeps_mu_;  // a leaf
  bool advance_on_sleep_ ABSL_GUARDED_BY(sleeps_mu_) = false;
  std::vector<Duration> sleeps_ ABSL_GUARDED_BY(sleeps_mu_);
};

}  // namespace kdm

#endif  // KDM_BASE_CLOCK_H_
