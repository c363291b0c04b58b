// kdm/base/sync.h: the kdm lock names and the std_sync implementation behave
// like abseil's for the subset kdm uses. Every test runs against kdm::std_sync
// (what ThreadSanitizer builds use) and, in normal builds, against the kdm
// aliases too (abseil itself), so a semantic difference shows up as one
// implementation passing and the other failing.
#include "kdm/base/sync.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kdm {
namespace {

// Long enough never to expire on a loaded machine under TSAN; the tests that
// expect success never wait this long.
constexpr absl::Duration kLongWait = absl::Seconds(30);
constexpr absl::Duration kShortWait = absl::Milliseconds(20);

struct KdmNames {
  using Mutex = kdm::Mutex;
  using MutexLock = kdm::MutexLock;
  using Condition = kdm::Condition;
  using CondVar = kdm::CondVar;
  using Notification = kdm::Notification;
};
struct StdSync {
  using Mutex = std_sync::Mutex;
  using MutexLock = std_sync::MutexLock;
  using Condition = std_sync::Condition;
  using CondVar = std_sync::CondVar;
  using Notification = std_sync::Notification;
};
// Under TSAN the two are the same types: test once.
using Implementations = std::conditional_t<kSyncUsesStd, ::testing::Types<StdSync>,
                                           ::testing::Types<StdSync, KdmNames>>;

class ImplementationName {
 public:
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, StdSync>) return "StdSync";
    return kSyncUsesStd ? "KdmNamesStd" : "KdmNamesAbsl";
  }
};

// Whether another thread finds `mu` locked (TryLock on a lock the calling
// thread holds is undefined, so ask from a fresh thread).
template <typename M>
bool LockedElsewhere(M& mu) {
  bool locked = false;
  std::thread([&] {
    if (mu.TryLock()) {
      mu.Unlock();
    } else {
      locked = true;
    }
  }).join();
  return locked;
}

template <typename S>
class SyncTest : public ::testing::Test {};
TYPED_TEST_SUITE(SyncTest, Implementations, ImplementationName);

TYPED_TEST(SyncTest, MutexLockGivesMutualExclusion) {
  typename TypeParam::Mutex mu;
  int counter = 0;  // plain int: a broken lock is a data race TSAN reports
  constexpr int kThreads = 4, kIncrements = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        typename TypeParam::MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  for (auto& t : threads) t.join();
  typename TypeParam::MutexLock lock(&mu);
  EXPECT_EQ(counter, kThreads * kIncrements);
}

TYPED_TEST(SyncTest, TryLockFailsWhileAnotherThreadHoldsTheLock) {
  typename TypeParam::Mutex mu;
  EXPECT_FALSE(LockedElsewhere(mu));
  mu.Lock();
  EXPECT_TRUE(LockedElsewhere(mu));
  mu.Unlock();
  if (mu.TryLock()) {
    EXPECT_TRUE(LockedElsewhere(mu));
    mu.Unlock();
  } else {
    ADD_FAILURE() << "TryLock failed on a free lock";
  }
}

// The heart of abseil's Await: no signal, just a change made under the lock.
TYPED_TEST(SyncTest, AwaitWithTimeoutWakesOnChangeUnderLockWithoutSignal) {
  typename TypeParam::Mutex mu;
  bool ready = false;
  std::thread setter([&] {
    typename TypeParam::MutexLock lock(&mu);
    ready = true;
  });
  {
    typename TypeParam::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(typename TypeParam::Condition(&ready), kLongWait));
    EXPECT_TRUE(ready);
  }
  setter.join();
}

TYPED_TEST(SyncTest, AwaitWithTimeoutReturnsFalseOnTimeoutStillHoldingTheLock) {
  typename TypeParam::Mutex mu;
  bool never = false;
  mu.Lock();
  absl::Time start = absl::Now();
  EXPECT_FALSE(mu.AwaitWithTimeout(typename TypeParam::Condition(&never), kShortWait));
  EXPECT_GE(absl::Now() - start, kShortWait);
  EXPECT_TRUE(LockedElsewhere(mu));
  mu.Unlock();
}

TYPED_TEST(SyncTest, AwaitWithTimeoutZeroOrNegativeOnlyChecksTheCondition) {
  typename TypeParam::Mutex mu;
  bool yes = true, no = false;
  typename TypeParam::MutexLock lock(&mu);
  EXPECT_TRUE(mu.AwaitWithTimeout(typename TypeParam::Condition(&yes), absl::ZeroDuration()));
  EXPECT_FALSE(mu.AwaitWithTimeout(typename TypeParam::Condition(&no), absl::ZeroDuration()));
  EXPECT_FALSE(mu.AwaitWithTimeout(typename TypeParam::Condition(&no), -absl::Seconds(1)));
  EXPECT_TRUE(mu.AwaitWithTimeout(typename TypeParam::Condition(&yes), absl::InfiniteDuration()));
}

TYPED_TEST(SyncTest, AwaitWithInfiniteTimeoutWaitsForTheChange) {
  typename TypeParam::Mutex mu;
  bool ready = false;
  std::thread setter([&] {
    typename TypeParam::MutexLock lock(&mu);
    ready = true;
  });
  {
    typename TypeParam::MutexLock lock(&mu);
    EXPECT_TRUE(
        mu.AwaitWithTimeout(typename TypeParam::Condition(&ready), absl::InfiniteDuration()));
  }
  setter.join();
}

TYPED_TEST(SyncTest, AwaitReturnsOnceTheConditionHolds) {
  typename TypeParam::Mutex mu;
  int stage = 0;
  std::thread setter([&] {
    for (int i = 0; i < 3; ++i) {
      typename TypeParam::MutexLock lock(&mu);
      ++stage;  // the waiter re-checks after each release; only 3 is enough
    }
  });
  auto reached = [&] { return stage == 3; };
  {
    typename TypeParam::MutexLock lock(&mu);
    mu.Await(typename TypeParam::Condition(&reached));
    EXPECT_EQ(stage, 3);
  }
  setter.join();
}

// An awaiter that changed state before waiting releases the lock to wait:
// that release must wake the other awaiter, as an Unlock would.
TYPED_TEST(SyncTest, ReleasingTheLockToAwaitWakesOtherAwaiters) {
  typename TypeParam::Mutex mu;
  bool a_ready = false, b_done = false;
  std::thread b([&] {
    typename TypeParam::MutexLock lock(&mu);
    mu.Await(typename TypeParam::Condition(&a_ready));  // A's Unlock frees it at worst
    b_done = true;
  });
  {
    typename TypeParam::MutexLock lock(&mu);
    a_ready = true;
    // Nothing but A's own release-to-wait can wake B while A waits here.
    EXPECT_TRUE(mu.AwaitWithTimeout(typename TypeParam::Condition(&b_done), kLongWait));
  }
  b.join();
}

struct Flags {
  bool value = false;
  bool Get() { return value; }
  bool GetConst() const { return value; }
  static bool Static(Flags* f) { return f->value; }
};

TYPED_TEST(SyncTest, ConditionFormsEvaluateTheirPredicate) {
  using Condition = typename TypeParam::Condition;
  typename TypeParam::Mutex mu;
  Flags flags;
  const Flags* const_flags = &flags;
  auto lambda = [&flags] { return flags.value; };
  typename TypeParam::MutexLock lock(&mu);
  for (bool value : {false, true}) {
    flags.value = value;
    EXPECT_EQ(mu.AwaitWithTimeout(Condition(&flags.value), absl::ZeroDuration()), value);
    EXPECT_EQ(mu.AwaitWithTimeout(Condition(&flags, &Flags::Get), absl::ZeroDuration()), value);
    EXPECT_EQ(mu.AwaitWithTimeout(Condition(const_flags, &Flags::GetConst), absl::ZeroDuration()),
              value);
    EXPECT_EQ(mu.AwaitWithTimeout(Condition(&Flags::Static, &flags), absl::ZeroDuration()), value);
    EXPECT_EQ(mu.AwaitWithTimeout(Condition(&lambda), absl::ZeroDuration()), value);
  }
}

TYPED_TEST(SyncTest, LockWhenWithTimeoutHoldsTheLockWhateverTheResult) {
  typename TypeParam::Mutex mu;
  bool ready = false;
  EXPECT_FALSE(mu.LockWhenWithTimeout(typename TypeParam::Condition(&ready), kShortWait));
  EXPECT_TRUE(LockedElsewhere(mu));
  mu.Unlock();

  std::thread setter([&] {
    typename TypeParam::MutexLock lock(&mu);
    ready = true;
  });
  EXPECT_TRUE(mu.LockWhenWithTimeout(typename TypeParam::Condition(&ready), kLongWait));
  EXPECT_TRUE(ready);
  mu.Unlock();
  setter.join();
}

TYPED_TEST(SyncTest, MutexLockWithConditionLocksOnceItHolds) {
  typename TypeParam::Mutex mu;
  bool ready = false;
  std::thread setter([&] {
    typename TypeParam::MutexLock lock(&mu);
    ready = true;
  });
  {
    typename TypeParam::MutexLock lock(&mu, typename TypeParam::Condition(&ready));
    EXPECT_TRUE(ready);
  }
  setter.join();
}

TYPED_TEST(SyncTest, CondVarWaitWithTimeoutReportsTimeout) {
  typename TypeParam::Mutex mu;
  typename TypeParam::CondVar cv;
  typename TypeParam::MutexLock lock(&mu);
  // Spurious wakeups are allowed: loop until the timeout is reported.
  absl::Time deadline = absl::Now() + kLongWait;
  bool timed_out = false;
  while (!timed_out && absl::Now() < deadline) timed_out = cv.WaitWithTimeout(&mu, kShortWait);
  EXPECT_TRUE(timed_out);
}

TYPED_TEST(SyncTest, CondVarSignalAllWakesEveryWaiter) {
  typename TypeParam::Mutex mu;
  typename TypeParam::CondVar cv;
  bool go = false;
  int woken = 0, waiting = 0;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      typename TypeParam::MutexLock lock(&mu);
      ++waiting;
      absl::Time deadline = absl::Now() + kLongWait;
      while (!go && absl::Now() < deadline) cv.WaitWithTimeout(&mu, kLongWait);
      if (go) ++woken;
    });
  }
  {
    typename TypeParam::MutexLock lock(&mu);
    auto all_waiting = [&] { return waiting == 3; };
    ASSERT_TRUE(mu.AwaitWithTimeout(typename TypeParam::Condition(&all_waiting), kLongWait));
    go = true;
  }
  cv.SignalAll();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woken, 3);
}

// A thread waiting on a CondVar releases the Mutex: awaiters re-check.
TYPED_TEST(SyncTest, CondVarWaitReleaseWakesAwaiters) {
  typename TypeParam::Mutex mu;
  typename TypeParam::CondVar cv;
  bool marked = false, done = false;
  std::thread waiter;
  {
    typename TypeParam::MutexLock lock(&mu);
    // Started under the lock: it runs only once this thread awaits.
    waiter = std::thread([&] {
      typename TypeParam::MutexLock lock(&mu);
      marked = true;
      // Gives up (half-way through the awaiter's bound) and unmarks: an
      // awaiter woken only by this Unlock sees false.
      absl::Time deadline = absl::Now() + kLongWait / 2;
      while (!done && absl::Now() < deadline) cv.WaitWithTimeout(&mu, kLongWait / 2);
      marked = false;
    });
    EXPECT_TRUE(mu.AwaitWithTimeout(typename TypeParam::Condition(&marked), kLongWait));
    done = true;
  }
  cv.Signal();
  waiter.join();
}

TYPED_TEST(SyncTest, NotificationWaitsTimesOutAndPublishes) {
  typename TypeParam::Notification n;
  EXPECT_FALSE(n.HasBeenNotified());
  EXPECT_FALSE(n.WaitForNotificationWithTimeout(kShortWait));
  int payload = 0;  // written before Notify, read after the wait: no race
  std::thread notifier([&] {
    payload = 42;
    n.Notify();
  });
  EXPECT_TRUE(n.WaitForNotificationWithTimeout(kLongWait));
  EXPECT_EQ(payload, 42);
  EXPECT_TRUE(n.HasBeenNotified());
  n.WaitForNotification();  // returns at once, any number of times
  EXPECT_TRUE(n.WaitForNotificationWithTimeout(absl::ZeroDuration()));
  notifier.join();
}

TYPED_TEST(SyncTest, PrenotifiedNotificationNeverWaits) {
  typename TypeParam::Notification n(true);
  EXPECT_TRUE(n.HasBeenNotified());
  EXPECT_TRUE(n.WaitForNotificationWithTimeout(absl::ZeroDuration()));
}

TYPED_TEST(SyncTest, HasBeenNotifiedPublishesWithoutWaiting) {
  typename TypeParam::Notification n;
  int payload = 0;
  std::thread notifier([&] {
    payload = 7;
    n.Notify();
  });
  absl::Time deadline = absl::Now() + kLongWait;
  while (!n.HasBeenNotified() && absl::Now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(n.HasBeenNotified());
  EXPECT_EQ(payload, 7);
  notifier.join();
}

// The waiter may destroy the Notification as soon as its wait returned, while
// Notify() may still be returning (ASan/TSAN would see a use after free).
TYPED_TEST(SyncTest, NotificationMayBeDestroyedRightAfterTheWait) {
  for (int i = 0; i < 50; ++i) {
    auto n = std::make_unique<typename TypeParam::Notification>();
    std::thread notifier([raw = n.get()] { raw->Notify(); });
    ASSERT_TRUE(n->WaitForNotificationWithTimeout(kLongWait));
    n.reset();
    notifier.join();
  }
}

TEST(SyncNotificationDeathTest, NotifyingTwiceAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std_sync::Notification n;
        n.Notify();
        n.Notify();
      },
      "Notify");
}

}  // namespace
}  // namespace kdm
