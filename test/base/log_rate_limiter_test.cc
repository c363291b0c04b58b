#include "kdm/base/log_rate_limiter.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace kdm {
namespace {

using namespace std::chrono_literals;
using Clock = LogRateLimiter::Clock;

TEST(LogRateLimiterTest, LetsTheBurstThroughThenCountsWhatItDrops) {
  LogRateLimiter limiter(3, 1s);
  const Clock::time_point t0{};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(limiter.Admit("gpu", t0 + i * 1ms), 0) << i;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(limiter.Admit("gpu", t0 + 10ms), std::nullopt) << i;
  EXPECT_EQ(limiter.total_suppressed(), 5);
  // The next window's first line carries the count of what was left out.
  EXPECT_EQ(limiter.Admit("gpu", t0 + 1s + 10ms), 5);
  EXPECT_EQ(limiter.Admit("gpu", t0 + 1s + 11ms), 0);
}

TEST(LogRateLimiterTest, KeysAreIndependent) {
  LogRateLimiter limiter(1, 1s);
  const Clock::time_point t0{};
  EXPECT_EQ(limiter.Admit("a", t0), 0);
  EXPECT_EQ(limiter.Admit("a", t0), std::nullopt);
  EXPECT_EQ(limiter.Admit("b", t0), 0);
}

TEST(LogRateLimiterTest, FlushSummarisesAFloodThatStoppedAndResets) {
  LogRateLimiter limiter(1, 100ms);
  const Clock::time_point t0{};
  EXPECT_EQ(limiter.Admit("gpu", t0), 0);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(limiter.Admit("gpu", t0 + 1ms), std::nullopt);
  EXPECT_TRUE(limiter.Flush(t0 + 50ms).empty()) << "window not over yet";
  auto flushed = limiter.Flush(t0 + 100ms);
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].first, "gpu");
  EXPECT_EQ(flushed[0].second, 7);
  EXPECT_TRUE(limiter.Flush(t0 + 300ms).empty()) << "the count was handed out once";
  EXPECT_EQ(limiter.Admit("gpu", t0 + 301ms), 0);
}

TEST(LogRateLimiterTest, ManyKeysShareOneOverflowBucket) {
  LogRateLimiter limiter(1, 1s, /*max_keys=*/2);
  const Clock::time_point t0{};
  EXPECT_EQ(limiter.Admit("a", t0), 0);
  EXPECT_EQ(limiter.Admit("b", t0), 0);
  // An attacker inventing keys gets one bucket between them all.
  EXPECT_EQ(limiter.Admit("c", t0), 0);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(limiter.Admit("x" + std::to_string(i), t0), std::nullopt) << i;
  }
  EXPECT_EQ(limiter.total_suppressed(), 100);
}

}  // namespace
}  // namespace kdm
