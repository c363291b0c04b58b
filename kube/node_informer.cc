#include "kdm/kube/node_informer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <thread>
#include <utility>

#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/log_value.h"
#include "kdm/base/sync.h"

namespace kdm::kube {
namespace {

using std::chrono::milliseconds;

constexpr size_t kMaxLoggedBytes = 256;

// What one watch line asked for.
enum class LineOutcome { kContinue, kRelistGone, kRelistError };

class NodeInformerImpl final : public NodeInformer {
 public:
  explicit NodeInformerImpl(Options options)
      : options_(std::move(options)),
        clock_(options_.clock ? options_.clock : NewRealClock()),
        rng_(options_.jitter_seed != 0 ? options_.jitter_seed : std::random_device()()),
        backoff_(options_.initial_backoff) {}
  ~NodeInformerImpl() override { Stop(); }

  void StartThread() {
    thread_ = std::thread([this] { Run(); });
  }

  void Stop() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    stop_wakeup_.Wake();
    cancel_.Cancel();
    MutexLock join_lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

  Stats stats() const override {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  bool Stopping() {
    MutexLock lock(&mu_);
    return stopping_;
  }

  // Waits `d` on the clock or until Stop(); true when stopping.
  bool Sleep(milliseconds d) {
    clock_->SleepFor(d, stop_wakeup_);
    return Stopping();
  }

  void Failed(const Status& s) {
    spdlog::warn("event=node_informer_error error={}",
                 QuoteLogValue(s.ToString(), kMaxLoggedBytes));
    MutexLock lock(&mu_);
    ++stats_.errors;
    stats_.last_error = s.ToString();
  }

  std::string WatchPath(const std::string& rv) const {
    const char sep = options_.path.find('?') == std::string::npos ? '?' : '&';
    return options_.path + sep + "watch=1&resourceVersion=" + rv + "&allowWatchBookmarks=true";
  }

  // A refused document: logged (rate-limited: they come from outside),
  // counted, skipped.
  void Refused(const std::string& what) {
    {
      MutexLock lock(&mu_);
      ++stats_.refused;
    }
    if (std::optional<int64_t> suppressed =
            refusal_log_.Admit("refused", std::chrono::steady_clock::now())) {
      spdlog::warn("event=node_informer_refused path={} detail={} suppressed={}",
                   QuoteLogValue(options_.path, kMaxLoggedBytes),
                   QuoteLogValue(what, 2 * kMaxLoggedBytes), *suppressed);
    }
  }

  // LIST: the set and its version, handed to on_list.
  StatusOr<std::string> List() {
    StatusOr<Client::Response> r =
        options_.client->Send("GET", options_.path, "", options_.request_timeout, &cancel_);
    if (!r.ok()) return r.status();
    Status http = Client::StatusForResponse("GET", options_.path, *r);
    if (!http.ok()) return http;
    StatusOr<NodeList> list = DecodeNodeList(r->body, options_.annotation_keys);
    r->body = std::string();  // the text is not needed past here
    if (!list.ok()) return list.status().WithPrefix("GET " + options_.path);
    for (const std::string& refused : list->refused) Refused("LIST " + refused);
    {
      MutexLock lock(&mu_);
      ++stats_.lists;
      stats_.resource_version = list->resource_version;
    }
    if (options_.on_list) options_.on_list(std::move(list->nodes));
    return list->resource_version;
  }

  LineOutcome OnLine(std::string_view line, std::string& rv) {
    StatusOr<WatchEvent> event = DecodeWatchLine(line, options_.annotation_keys);
    if (!event.ok()) {
      Failed(event.status().WithPrefix("watch " + options_.path));
      return LineOutcome::kRelistError;
    }
    switch (event->kind) {
      case WatchEvent::Kind::kGone:
        return LineOutcome::kRelistGone;
      case WatchEvent::Kind::kRefused:
        // Skipped: the next event goes on from the last good version.
        Refused("watch event " + event->refusal);
        return LineOutcome::kContinue;
      case WatchEvent::Kind::kBookmark: {
        rv = event->resource_version;
        MutexLock lock(&mu_);
        ++stats_.bookmarks;
        stats_.resource_version = rv;
        return LineOutcome::kContinue;
      }
      case WatchEvent::Kind::kNode:
        break;
    }
    if (!event->resource_version.empty()) rv = event->resource_version;
    {
      MutexLock lock(&mu_);
      ++stats_.events;
      stats_.resource_version = rv;
    }
    if (options_.on_event) options_.on_event(event->type, event->node);
    return LineOutcome::kContinue;
  }

  // The next back-off wait: the current step plus jitter, capped; the step
  // doubles, and starts over after backoff_reset without a wait.
  milliseconds NextBackoff() {
    const auto now = clock_->Now();
    if (last_backoff_end_ && now - *last_backoff_end_ >= options_.backoff_reset) {
      backoff_ = options_.initial_backoff;
    }
    int64_t wait = backoff_.count();
    const double jitter = std::clamp(options_.backoff_jitter, 0.0, 1.0);
    if (jitter > 0) {
      std::uniform_int_distribution<int64_t> extra(0, static_cast<int64_t>(wait * jitter));
      wait += extra(rng_);
    }
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
    return std::min(milliseconds(wait), options_.max_backoff);
  }

  // Waits a back-off; true when stopping.
  bool BackOff(const char* reason) {
    const milliseconds wait = NextBackoff();
    Stats s;
    {
      MutexLock lock(&mu_);
      s = stats_;
      ++stats_.backoffs;
    }
    spdlog::info(
        "event=node_informer_backoff reason={} wait_ms={} lists={} watches={} "
        "relists_after_gone={} short_watches={} errors={} backoffs={}",
        reason, wait.count(), s.lists, s.watches, s.relists_after_gone, s.short_watches, s.errors,
        s.backoffs + 1);
    const bool stop = Sleep(wait);
    last_backoff_end_ = clock_->Now();
    return stop;
  }

  void Run() {
    // Why the next LIST waits a back-off; null for the first.
    const char* relist_reason = nullptr;
    while (!Stopping()) {
      if (relist_reason != nullptr && BackOff(relist_reason)) return;
      StatusOr<std::string> listed = List();
      if (!listed.ok()) {
        if (Stopping()) return;
        Failed(listed.status());
        relist_reason = "list_failed";
        continue;
      }
      relist_reason = "relist";
      std::string rv = *listed;
      // Watch from rv until a relist is needed.
      const char* rewatch_reason = nullptr;
      while (!Stopping()) {
        if (rewatch_reason != nullptr && BackOff(rewatch_reason)) return;
        rewatch_reason = nullptr;
        LineOutcome outcome = LineOutcome::kContinue;
        {
          MutexLock lock(&mu_);
          ++stats_.watches;
        }
        const std::string path = WatchPath(rv);
        const auto started = clock_->Now();
        bool any_line = false;
        Status s = options_.client->Stream(
            path, options_.request_timeout, options_.idle_timeout,
            [&](std::string_view line) {
              any_line = true;
              outcome = OnLine(line, rv);
              return outcome == LineOutcome::kContinue;
            },
            &cancel_);
        if (Stopping()) return;
        if (outcome == LineOutcome::kRelistGone ||
            s.code() == StatusCode::kFailedPrecondition) {  // 410 on the request itself
          MutexLock lock(&mu_);
          ++stats_.relists_after_gone;
          relist_reason = "gone";
          break;
        }
        if (outcome == LineOutcome::kRelistError) {
          relist_reason = "bad_event";
          break;
        }
        if (s.code() == StatusCode::kResourceExhausted) {
          // An event over the line limit broke the stream mid-line; a
          // rewatch from the same version would meet it again, a LIST
          // reads it whole (within max_body_bytes) and moves past it.
          Failed(s);
          relist_reason = "line_too_long";
          break;
        }
        if (!s.ok()) {
          Failed(s);
          rewatch_reason = "watch_failed";
          continue;
        }
        // The server ended it. A watch that ends at once with nothing in it
        // is a server (or proxy) that would be asked again in a busy loop.
        if (!any_line && clock_->Now() - started < options_.short_watch) {
          MutexLock lock(&mu_);
          ++stats_.short_watches;
          rewatch_reason = "short_watch";
        }
      }
    }
  }

  const Options options_;
  const std::shared_ptr<kdm::Clock> clock_;
  Cancellation cancel_;
  Wakeup stop_wakeup_;  // Stop() wakes it: ends a back-off at once
  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // The informer's thread only:
  std::mt19937_64 rng_;
  milliseconds backoff_;
  std::optional<kdm::Clock::TimePoint> last_backoff_end_;
  LogRateLimiter refusal_log_{/*burst=*/5, std::chrono::seconds(60)};
  Mutex join_mu_;
  std::thread thread_;
};

}  // namespace

StatusOr<std::unique_ptr<NodeInformer>> NodeInformer::Start(Options options) {
  if (options.client == nullptr) return InvalidArgumentError("node informer: no client");
  if (!options.on_list || !options.on_event) {
    return InvalidArgumentError("node informer: on_list and on_event are required");
  }
  if (options.initial_backoff.count() <= 0) options.initial_backoff = milliseconds(1);
  if (options.max_backoff < options.initial_backoff) options.max_backoff = options.initial_backoff;
  auto informer = std::make_unique<NodeInformerImpl>(std::move(options));
  informer->StartThread();
  return std::unique_ptr<NodeInformer>(std::move(informer));
}

}  // namespace kdm::kube
