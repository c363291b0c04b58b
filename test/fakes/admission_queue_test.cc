#include "kdm/fakes/admission_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "kdm/base/sync.h"
#include "kdm/test/wait_until.h"

namespace kdm::fakes {
namespace {

constexpr absl::Duration kBound = absl::Seconds(30);

// What ran, in the order it started.
class Journal {
 public:
  void Add(const std::string& what) {
    kdm::MutexLock lock(&mu_);
    entries_.push_back(what);
  }
  std::vector<std::string> entries() const {
    kdm::MutexLock lock(&mu_);
    return entries_;
  }
  bool WaitForSize(size_t n) const {
    kdm::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entries_.size() >= n; };
    return mu_.AwaitWithTimeout(kdm::Condition(&done), kBound);
  }

 private:
  mutable kdm::Mutex mu_;
  std::vector<std::string> entries_ ABSL_GUARDED_BY(mu_);
};

TEST(AdmissionQueueTest, JobsOnDifferentResourcesDoNotWaitForEachOther) {
  AdmissionQueue queue(4);
  kdm::Notification release_hung;
  Journal journal;
  ASSERT_TRUE(queue.Submit({"vendor.com/hung"}, [&] {
    journal.Add("hung");
    release_hung.WaitForNotificationWithTimeout(kBound);
  }));
  ASSERT_TRUE(journal.WaitForSize(1));
  kdm::Notification healthy_done;
  ASSERT_TRUE(queue.Submit({"vendor.com/ok"}, [&] { healthy_done.Notify(); }));
  ASSERT_TRUE(queue.Submit({}, [&] { journal.Add("no devices"); }));
  // Both finish while the first job is still held.
  EXPECT_TRUE(healthy_done.WaitForNotificationWithTimeout(kBound));
  EXPECT_TRUE(journal.WaitForSize(2));
  EXPECT_GE(queue.running(), 1);  // the held job (the others may be finishing)
  release_hung.Notify();
  queue.Stop();
}

TEST(AdmissionQueueTest, JobsSharingAResourceRunInSubmissionOrder) {
  AdmissionQueue queue(4);
  kdm::Notification release;
  Journal journal;
  ASSERT_TRUE(queue.Submit({"a"}, [&] {
    journal.Add("1:a");
    release.WaitForNotificationWithTimeout(kBound);
  }));
  ASSERT_TRUE(journal.WaitForSize(1));
  // {a,b} waits for {a}; {b} was submitted after {a,b}, so it waits too,
  // although b itself is free: a later pod never passes an earlier one on a
  // resource they share. {c} shares nothing and runs.
  ASSERT_TRUE(queue.Submit({"a", "b"}, [&] { journal.Add("2:ab"); }));
  ASSERT_TRUE(queue.Submit({"b"}, [&] { journal.Add("3:b"); }));
  ASSERT_TRUE(queue.Submit({"c"}, [&] { journal.Add("4:c"); }));
  ASSERT_TRUE(journal.WaitForSize(2));
  EXPECT_EQ(journal.entries()[1], "4:c");
  EXPECT_EQ(queue.queued(), 2);
  release.Notify();
  ASSERT_TRUE(journal.WaitForSize(4));
  EXPECT_EQ(journal.entries(), (std::vector<std::string>{"1:a", "4:c", "2:ab", "3:b"}));
  queue.Stop();
}

TEST(AdmissionQueueTest, OneResourceNeverRunsTwoJobsAtOnce) {
  AdmissionQueue queue(8);
  std::atomic<int> inside{0};
  std::atomic<int> most{0};
  Journal journal;
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(queue.Submit({"r"}, [&, i] {
      int now = ++inside;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      journal.Add(std::to_string(i));
      --inside;
    }));
  }
  ASSERT_TRUE(journal.WaitForSize(200));
  EXPECT_EQ(most.load(), 1);
  std::vector<std::string> expected;
  for (int i = 0; i < 200; ++i) expected.push_back(std::to_string(i));
  EXPECT_EQ(journal.entries(), expected);
  queue.Stop();
}

TEST(AdmissionQueueTest, StopDropsQueuedJobsWaitsForRunningOnesAndRefusesNewOnes) {
  AdmissionQueue queue(1);
  kdm::Notification started, release;
  std::atomic<bool> finished{false}, dropped_ran{false};
  ASSERT_TRUE(queue.Submit({"a"}, [&] {
    started.Notify();
    release.WaitForNotificationWithTimeout(kBound);
    finished = true;
  }));
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(kBound));
  ASSERT_TRUE(queue.Submit({"a"}, [&] { dropped_ran = true; }));
  ASSERT_EQ(queue.queued(), 1);
  std::thread stopper([&] { queue.Stop(); });
  // Stop drops the queued job first (under the queue's lock), then waits for
  // the running one: once the queue is empty, let the running job finish.
  test::WaitUntil([&] { return queue.queued() == 0; }, std::chrono::seconds(30));
  EXPECT_EQ(queue.queued(), 0);
  release.Notify();
  stopper.join();
  EXPECT_TRUE(finished);
  EXPECT_FALSE(dropped_ran);
  EXPECT_FALSE(queue.Submit({"b"}, [] {}));
  queue.Stop();  // idempotent
}

}  // namespace
}  // namespace kdm::fakes
