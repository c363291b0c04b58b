// kdm::test::WaitUntil: the one bounded poll of the tests. For state that
// another thread or process changes without a notification to wait on (a
// counter, a file, a plugin's stream count): polls the predicate until it
// holds or the bound passes.
//
// Every wait in a test has a bound, so a broken build fails instead of
// hanging; a bound is never a timing assertion: on a slow machine a wait only
// takes longer, up to its bound. The default (10 s) fits in-process effects;
// tests that wait on other processes or run under TSAN pass their own.
//
// Example:
//   ASSERT_TRUE(kdm::test::WaitUntil([&] { return server->OpenStreams() == 1; }));
//   EXPECT_TRUE(kdm::test::WaitUntil([&] { return Seen().size() >= 3; }, 30s));
#ifndef KDM_TEST_WAIT_UNTIL_H_
#define KDM_TEST_WAIT_UNTIL_H_

#include <algorithm>
#include <chrono>
#include <thread>

namespace kdm::test {

inline constexpr std::chrono::milliseconds kDefaultWaitBound{10'000};

// Returns true as soon as `pred()` holds; false when it still does not once
// `bound` has passed (its last evaluation starts after the bound). Polls
// every 1 ms at first, backing off to 10 ms: quick effects are seen at once,
// and a long wait does not keep a core busy.
template <typename Pred>
bool WaitUntil(Pred&& pred, std::chrono::milliseconds bound = kDefaultWaitBound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  std::chrono::milliseconds pause{1};
  for (;;) {
    const bool last = std::chrono::steady_clock::now() >= deadline;
    if (pred()) return true;
    if (last) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(10));
  }
}

}  // namespace kdm::test

#endif  // KDM_TEST_WAIT_UNTIL_H_
