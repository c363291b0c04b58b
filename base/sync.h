// kdm's locks: Mutex, MutexLock, Condition, CondVar and Notification, with
// abseil's API (the subset listed below) and abseil's thread annotations.
//
// Why not absl::Mutex directly: ThreadSanitizer only understands locks whose
// acquire and release it can see (pthread calls it intercepts, or explicit
// annotations). Debian's libabsl_synchronization is built without TSAN, so
// its Mutex (futex based) is invisible to it: under TSAN every access guarded
// by an absl::Mutex looks like a data race. So:
//   - normal builds: the kdm names are plain aliases of the absl types (same
//     code, same cost as before);
//   - ThreadSanitizer builds (gcc's __SANITIZE_THREAD__, clang's
//     __has_feature(thread_sanitizer)): they are kdm::std_sync's types, a small
//     implementation over std::mutex / std::condition_variable (pthread, which
//     TSAN intercepts) with the same semantics for this subset.
// Both carry the same ABSL_LOCKABLE / ABSL_*_LOCK_FUNCTION annotations, so
// clang's -Wthread-safety checks code the same way in either build.
//
// The subset (anything else compiles in normal builds only, so stay inside it):
//   Mutex:        Lock, Unlock, TryLock, Await, AwaitWithTimeout, LockWhen,
//                 LockWhenWithTimeout
//   MutexLock:    MutexLock(Mutex*), MutexLock(Mutex*, const Condition&)
//   Condition:    (const bool*), (T*, bool (T::*)()), (const T*, bool (T::*)() const),
//                 (bool (*)(T*), T*), (const F* functor)
//   CondVar:      Wait, WaitWithTimeout, Signal, SignalAll
//   Notification: Notification(), Notification(bool), HasBeenNotified, Notify,
//                 WaitForNotification, WaitForNotificationWithTimeout
// As with abseil, a Condition is re-evaluated whenever the Mutex is released
// (Unlock, or a wait that releases it), so changing guarded state under the
// lock is enough to wake an Await: no explicit signal is needed.
//
// Thread-safety: as abseil's. Mutex, CondVar and Notification are
// thread-safe; a MutexLock or Condition belongs to the thread that made it.
// A Condition is evaluated with the Mutex held and must have no side effects.
//
// Installed with kdm::base, which links absl::synchronization and absl::time
// for its users (the annotations and absl::Duration come from there).
//
// Example:
//   kdm::Mutex mu;
//   bool ready ABSL_GUARDED_BY(mu) = false;
//   // one thread:
//   { kdm::MutexLock lock(&mu); ready = true; }
//   // another:
//   kdm::MutexLock lock(&mu);
//   if (!mu.AwaitWithTimeout(kdm::Condition(&ready), absl::Seconds(5))) {
//     // 5 s passed and `ready` is still false (the lock is held either way)
//   }
#ifndef KDM_BASE_SYNC_H_
#define KDM_BASE_SYNC_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <type_traits>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if defined(__SANITIZE_THREAD__)
#define KDM_SYNC_USES_STD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KDM_SYNC_USES_STD 1
#endif
#endif
#ifndef KDM_SYNC_USES_STD
#define KDM_SYNC_USES_STD 0
#endif

namespace kdm {

// The std::mutex based implementation. Always compiled (it is small), so its
// tests run in every build; kdm::Mutex & co. name it only under TSAN.
namespace std_sync {

namespace internal {
using SteadyTime = std::chrono::steady_clock::time_point;

// The steady-clock deadline `timeout` from now; nullopt means "never" (an
// infinite or absurdly long timeout). A negative timeout is an immediate one.
inline std::optional<SteadyTime> DeadlineAfter(absl::Duration timeout) {
  constexpr absl::Duration kForever = absl::Hours(24 * 365 * 100);
  if (timeout >= kForever) return std::nullopt;
  if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
  return std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
}
}  // namespace internal

// A side-effect-free predicate, evaluated with the Mutex held.
class Condition {
 public:
  explicit Condition(const bool* cond) : eval_([cond] { return *cond; }) {}

  template <typename T>
  Condition(T* object, bool (std::type_identity_t<T>::*method)())
      : eval_([object, method] { return (object->*method)(); }) {}

  template <typename T>
  Condition(const T* object, bool (std::type_identity_t<T>::*method)() const)
      : eval_([object, method] { return (object->*method)(); }) {}

  template <typename T>
  Condition(bool (*func)(T*), T* arg) : eval_([func, arg] { return func(arg); }) {}

  // A functor, typically a lambda: Condition(&lambda). The functor must
  // outlive the Condition. Called through a member pointer, like abseil does,
  // so a lambda annotated ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) is accepted.
  template <typename F>
  explicit Condition(const F* functor)
      : Condition(functor, static_cast<bool (F::*)() const>(&F::operator())) {}

  bool Eval() const { return eval_(); }

 private:
  std::function<bool()> eval_;
};

class CondVar;

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }

  // Wakes the threads in Await*/LockWhen* so they re-check their conditions
  // (before unlocking: the Mutex may be destroyed right after).
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    if (awaiting_ > 0) released_.notify_all();
    mu_.unlock();
  }

  // Returns true and holds the lock if it was free; false otherwise.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

  // REQUIRES: the lock is held. Returns once `cond` is true, releasing the
  // lock while waiting.
  void Await(const Condition& cond) { AwaitUntil(cond, std::nullopt); }

  // REQUIRES: the lock is held. Waits until `cond` is true or `timeout` has
  // passed; returns the value of `cond` at the end. Holds the lock on return.
  bool AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
    return AwaitUntil(cond, internal::DeadlineAfter(timeout));
  }

  // Lock() then Await(cond).
  void LockWhen(const Condition& cond) ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    Lock();
    Await(cond);
  }

  // Lock() then AwaitWithTimeout(cond, timeout): holds the lock on return
  // whatever the result; true if `cond` holds.
  bool LockWhenWithTimeout(const Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    Lock();
    return AwaitWithTimeout(cond, timeout);
  }

 private:
  friend class CondVar;

  // Waits on `cv` (the Mutex's own `released_` or a CondVar's) with the lock
  // held, releasing it meanwhile; false when `deadline` passed. Releasing the
  // lock to wait is a release like Unlock(): Await callers re-check.
  bool WaitOn(std::condition_variable& cv, const std::optional<internal::SteadyTime>& deadline,
              bool count_as_awaiting) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    if (count_as_awaiting) ++awaiting_;
    bool woken = true;
    if (!deadline) {
      cv.wait(lock);
    } else {
      woken = cv.wait_until(lock, *deadline) == std::cv_status::no_timeout;
    }
    if (count_as_awaiting) --awaiting_;
    lock.release();  // still held: the caller's lock
    return woken;
  }

  bool AwaitUntil(const Condition& cond, const std::optional<internal::SteadyTime>& deadline) {
    bool first = true;
    while (!cond.Eval()) {
      if (deadline && std::chrono::steady_clock::now() >= *deadline) return false;
      // The caller may have changed guarded state before calling Await: the
      // release to wait must wake the other awaiters, like Unlock(). Later
      // rounds only evaluated a side-effect-free condition, so they need not
      // (and must not: two awaiters would wake each other for ever).
      if (first && awaiting_ > 0) released_.notify_all();
      first = false;
      WaitOn(released_, deadline, /*count_as_awaiting=*/true);
    }
    return true;
  }

  std::mutex mu_;
  std::condition_variable released_;  // notified when the lock is released
  int awaiting_ = 0;                  // threads in WaitOn(released_); under mu_
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  // Locks once `cond` holds (Mutex::LockWhen).
  MutexLock(Mutex* mu, const Condition& cond) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->LockWhen(cond);
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }

 private:
  Mutex* const mu_;
};

// A condition variable used with kdm::std_sync::Mutex. Wakeups may be
// spurious: wait in a loop that re-checks the guarded state.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // REQUIRES: `mu` is held. Releases it, waits for a Signal, re-acquires it.
  void Wait(Mutex* mu) {
    Notify(mu);
    mu->WaitOn(cv_, std::nullopt, /*count_as_awaiting=*/false);
  }

  // REQUIRES: `mu` is held. As Wait, for at most `timeout`; returns true if
  // the timeout expired (abseil's convention), false if signalled.
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
    Notify(mu);
    return !mu->WaitOn(cv_, internal::DeadlineAfter(timeout), /*count_as_awaiting=*/false);
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  // Waiting releases `mu`: its Await callers re-check, as on Unlock().
  static void Notify(Mutex* mu) {
    if (mu->awaiting_ > 0) mu->released_.notify_all();
  }

  std::condition_variable cv_;
};

// A one-shot event: Notify() once, wait any number of times. Notify()
// happens-before every wait that returns true. The Notification may be
// destroyed as soon as a wait returned true, even while Notify() is still
// returning in another thread.
class Notification {
 public:
  Notification() = default;
  explicit Notification(bool prenotify) : notified_(prenotify) {}
  Notification(const Notification&) = delete;
  Notification& operator=(const Notification&) = delete;
  ~Notification() { std::lock_guard<std::mutex> wait_for_notify_to_return(mu_); }

  bool HasBeenNotified() const { return notified_.load(std::memory_order_acquire); }

  // Calling it twice is a bug (as with abseil): the process aborts.
  void Notify() {
    std::lock_guard<std::mutex> lock(mu_);
    if (notified_.load(std::memory_order_relaxed)) {
      std::fputs("kdm::Notification::Notify() called twice\n", stderr);
      std::abort();
    }
    notified_.store(true, std::memory_order_release);
    cv_.notify_all();
  }

  void WaitForNotification() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return notified_.load(std::memory_order_relaxed); });
  }

  // Returns true once notified; false if `timeout` passed first.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    auto deadline = internal::DeadlineAfter(timeout);
    std::unique_lock<std::mutex> lock(mu_);
    auto notified = [this] { return notified_.load(std::memory_order_relaxed); };
    if (!deadline) {
      cv_.wait(lock, notified);
      return true;
    }
    return cv_.wait_until(lock, *deadline, notified);
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::atomic<bool> notified_{false};
};

}  // namespace std_sync

// True when the kdm names below are std_sync's (ThreadSanitizer builds).
inline constexpr bool kSyncUsesStd = KDM_SYNC_USES_STD != 0;

#if KDM_SYNC_USES_STD
using Mutex = std_sync::Mutex;
using MutexLock = std_sync::MutexLock;
using Condition = std_sync::Condition;
using CondVar = std_sync::CondVar;
using Notification = std_sync::Notification;
#else
using Mutex = absl::Mutex;
using MutexLock = absl::MutexLock;
using Condition = absl::Condition;
using CondVar = absl::CondVar;
using Notification = absl::Notification;
#endif

}  // namespace kdm

#endif  // KDM_BASE_SYNC_H_
