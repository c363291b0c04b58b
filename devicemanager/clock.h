// kdm::devicemanager::Clock: the time seam of the device manager.
//
// The Manager reads the time and schedules its timers (the endpoint grace
// period) only through a Clock. Production code uses NewRealClock(); tests use
// FakeClock, whose time moves only when the test calls Advance(), which runs
// every timer that became due, in due-time order, on the caller's thread. A
// 5-minute grace period is then tested in microseconds and deterministically.
//
// Thread-safety: every method may be called from any thread, including from
// inside a timer callback. Callbacks never run while the clock's own lock is
// held, so a callback may schedule or cancel timers.
//
// An embedder with its own event loop may implement Clock so that the
// Manager's timers run on that loop (docs/architecture.md#timers-on-your-loop).
// The Manager calls ScheduleAt with its own mutex held, so an implementation
// only enqueues there: it must not block or call back into the Manager.
//
// Example:
//   auto clock = std::make_shared<kdm::devicemanager::FakeClock>();
//   clock->ScheduleAfter(std::chrono::minutes(5), [] { Expire(); });
//   clock->Advance(std::chrono::minutes(5));  // Expire() has run on return
#ifndef KDM_DEVICEMANAGER_CLOCK_H_
#define KDM_DEVICEMANAGER_CLOCK_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace kdm::devicemanager {

class TimerQueue;

class Clock {
 public:
  using Duration = std::chrono::steady_clock::duration;
  using TimePoint = std::chrono::steady_clock::time_point;
  // 0 is never a valid id.
  using TimerId = std::uint64_t;

  virtual ~Clock() = default;

  // The current (monotonic) time.
  virtual TimePoint Now() const = 0;

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
};

// The system's steady clock. Timers run on one thread owned by the clock and
// joined by its destructor (pending timers are dropped then).
std::shared_ptr<Clock> NewRealClock();

// A clock for tests: time stands still until Advance().
class FakeClock : public Clock {
 public:
  FakeClock();
  ~FakeClock() override;

  TimePoint Now() const override;
  TimerId ScheduleAt(TimePoint when, std::function<void()> fn) override;
  bool Cancel(TimerId id) override;
  std::size_t PendingTimers() const override;

  // Moves the time forward by `d` and runs, on this thread and in due-time
  // order, every timer due by then. The time steps to each timer's due time
  // before its callback runs, so timers that callbacks schedule within the
  // window run too; on return Now() is the old time + d.
  void Advance(Duration d);

 private:
  std::unique_ptr<TimerQueue> queue_;
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_CLOCK_H_
