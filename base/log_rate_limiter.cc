#include "kdm/base/log_rate_limiter.h"

#include <utility>

namespace kdm {

namespace {
constexpr std::string_view kOverflowKey = "*";
}  // namespace

LogRateLimiter::LogRateLimiter(int burst, Clock::duration window, std::size_t max_keys)
    : burst_(burst < 1 ? 1 : burst),
      window_(window.count() <= 0 ? Clock::duration(1) : window),
      max_keys_(max_keys < 1 ? 1 : max_keys) {}

LogRateLimiter::Bucket& LogRateLimiter::BucketFor(std::string_view key) {
  auto it = buckets_.find(key);
  if (it != buckets_.end()) return it->second;
  if (buckets_.size() >= max_keys_) key = kOverflowKey;
  return buckets_.try_emplace(std::string(key)).first->second;
}

std::optional<int64_t> LogRateLimiter::Admit(std::string_view key, Clock::time_point now) {
  Bucket& b = BucketFor(key);
  if (b.used == 0 && b.suppressed == 0) {
    b.window_start = now;
  } else if (now - b.window_start >= window_) {
    b.window_start = now;
    b.used = 0;
  }
  if (b.used >= burst_) {
    ++b.suppressed;
    ++total_suppressed_;
    return std::nullopt;
  }
  ++b.used;
  return std::exchange(b.suppressed, 0);
}

std::vector<std::pair<std::string, int64_t>> LogRateLimiter::Flush(Clock::time_point now) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    Bucket& b = it->second;
    if (now - b.window_start < window_) {
      ++it;
      continue;
    }
    if (b.suppressed > 0) out.emplace_back(it->first, std::exchange(b.suppressed, 0));
    // A quiet key costs nothing until it speaks again.
    it = buckets_.erase(it);
  }
  return out;
}

}  // namespace kdm
