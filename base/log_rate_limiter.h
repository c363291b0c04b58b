// kdm::LogRateLimiter: keeps a chatty source (a plugin flapping a device's
// health every millisecond) from flooding the log. Per key (a resource name,
// an event name) it lets through at most `burst` lines in each `window`; the
// lines it holds back are counted, and the count is handed to the caller with
// the next line let through (or by Flush once the window is over), so the log
// says how much it left out (`suppressed=N`) instead of going quiet.
//
// Thread-compatibility: not thread-safe; callers serialize (the Manager calls
// it under its lock, the node agent on its io thread). Pure: time is passed in.
//
// Example:
//   kdm::LogRateLimiter limiter(/*burst=*/20, std::chrono::seconds(1));
//   if (auto suppressed = limiter.Admit(resource, now)) {
//     spdlog::info("event=device_health resource={} ... suppressed={}", ..., *suppressed);
//   }
//   ...
//   for (const auto& [key, n] : limiter.Flush(now)) {
//     spdlog::info("event=device_health_suppressed resource={} suppressed={}", key, n);
//   }
#ifndef KDM_BASE_LOG_RATE_LIMITER_H_
#define KDM_BASE_LOG_RATE_LIMITER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kdm {

class LogRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  // REQUIRES: burst >= 1, window > 0, max_keys >= 1.
  // `max_keys` bounds the memory an attacker choosing keys can make it use:
  // past it, every new key shares one overflow bucket ("*").
  LogRateLimiter(int burst, Clock::duration window, std::size_t max_keys = 1024);

  // A line for `key` at `now`. std::nullopt: drop it (it is counted). Else
  // log it; the value is how many lines of `key` were dropped since the last
  // one let through (0 normally), to print as `suppressed=N`.
  std::optional<int64_t> Admit(std::string_view key, Clock::time_point now);

  // Keys whose window is over with lines still counted as dropped: each
  // with its count, which is then reset. Call it from a periodic task so the
  // last burst of a flood is summarised even when no line follows it.
  std::vector<std::pair<std::string, int64_t>> Flush(Clock::time_point now);

  // Lines dropped since construction, all keys together.
  int64_t total_suppressed() const { return total_suppressed_; }

 private:
  struct Bucket {
    Clock::time_point window_start;
    int used = 0;
    int64_t suppressed = 0;
  };
  Bucket& BucketFor(std::string_view key);

  const int burst_;
  const Clock::duration window_;
  const std::size_t max_keys_;
  std::map<std::string, Bucket, std::less<>> buckets_;
  int64_t total_suppressed_ = 0;
};

}  // namespace kdm

#endif  // KDM_BASE_LOG_RATE_LIMITER_H_
