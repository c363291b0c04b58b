// kube/ internal: the LIST + WATCH loop behind every informer of kdm::kube
// (NodeInformer, PodInformer), as client-go's reflector: LIST, hand the set
// over, WATCH from its version, relist after 410 or a bad line, back off,
// refuse (and skip) documents nested too deep. docs/kube.md describes it;
// kube/node_informer.h has the contract both informers keep.
//
// What differs between informers is a Codec:
//   struct Codec {
//     using Object = NodeObject;          // what is handed over
//     using EventType = NodeEventType;
//     using List = NodeList;              // resource_version, refused, Items()
//     using Event = WatchEvent;           // kind (kBookmark, kGone, kRefused or
//                                         // the object), type, resource_version, refusal
//     StatusOr<List> DecodeList(std::string_view body) const;
//     StatusOr<Event> DecodeLine(std::string_view line) const;
//     static std::vector<Object>& Items(List& list);
//     static const Object& ObjectOf(const Event& event);
//   };
// and the name its log events start with ("node_informer": event=
// node_informer_error, _refused, _backoff).
//
// Thread-safety: as the informers': callbacks on the reflector's thread;
// Stop() and stats() from any thread. Not installed.
#ifndef KDM_KUBE_REFLECTOR_H_
#define KDM_KUBE_REFLECTOR_H_

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/log_value.h"
#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/kube/client.h"
#include "kdm/kube/list_watch.h"

namespace kdm::kube::internal {

inline constexpr size_t kMaxInformerLoggedBytes = 256;

// Checks and normalises the options every informer takes. `what` names the
// informer in the error ("node informer"). Errors: INVALID_ARGUMENT without
// a client or callbacks.
inline Status CheckListWatchOptions(const char* what, bool has_callbacks,
                                    ListWatchOptions& options) {
  if (options.client == nullptr) return InvalidArgumentError(std::string(what) + ": no client");
  if (!has_callbacks) {
    return InvalidArgumentError(std::string(what) + ": on_list and on_event are required");
  }
  if (options.initial_backoff.count() <= 0) options.initial_backoff = std::chrono::milliseconds(1);
  if (options.max_backoff < options.initial_backoff) options.max_backoff = options.initial_backoff;
  return OkStatus();
}

template <typename Codec>
class Reflector {
 public:
  using Object = typename Codec::Object;
  using EventType = typename Codec::EventType;
  using List = typename Codec::List;
  using Event = typename Codec::Event;
  using OnList = std::function<void(std::vector<Object>)>;
  using OnEvent = std::function<void(EventType, const Object&)>;

  Reflector(std::string name, ListWatchOptions options, std::string path, Codec codec,
            OnList on_list, OnEvent on_event)
      : name_(std::move(name)),
        options_(std::move(options)),
        path_(std::move(path)),
        codec_(std::move(codec)),
        on_list_(std::move(on_list)),
        on_event_(std::move(on_event)),
        clock_(options_.clock ? options_.clock : NewRealClock()),
        rng_(options_.jitter_seed != 0 ? options_.jitter_seed : std::random_device()()),
        backoff_(options_.initial_backoff) {}
  ~Reflector() { Stop(); }

  Reflector(const Reflector&) = delete;
  Reflector& operator=(const Reflector&) = delete;

  void StartThread() {
    thread_ = std::thread([this] { Run(); });
  }

  void Stop() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    stop_wakeup_.Wake();
    cancel_.Cancel();
    MutexLock join_lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

  ListWatchStats stats() const {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  using milliseconds = std::chrono::milliseconds;

  // What one watch line asked for.
  enum class LineOutcome { kContinue, kRelistGone, kRelistError };

  bool Stopping() {
    MutexLock lock(&mu_);
    return stopping_;
  }

  // Waits `d` on the clock or until Stop(); true when stopping.
  bool Sleep(milliseconds d) {
    clock_->SleepFor(d, stop_wakeup_);
    return Stopping();
  }

  // A failed LIST or watch: the first is logged at once (warn, with the
  // error), later ones at most kFailureLogBurst a minute (the rest at debug,
  // counted in the next line's suppressed=N): a server down for an hour
  // says so without a line per back-off.
  void Failed(const Status& s) {
    const std::optional<int64_t> suppressed =
        failure_log_.Admit("error", std::chrono::steady_clock::now());
    spdlog::log(suppressed ? spdlog::level::warn : spdlog::level::debug,
                "event={}_error error={} suppressed={}", name_,
                QuoteLogValue(s.ToString(), kMaxInformerLoggedBytes), suppressed.value_or(0));
    MutexLock lock(&mu_);
    ++stats_.errors;
    stats_.last_error = s.ToString();
  }

  std::string WatchPath(const std::string& rv) const {
    const char sep = path_.find('?') == std::string::npos ? '?' : '&';
    return path_ + sep + "watch=1&resourceVersion=" + rv + "&allowWatchBookmarks=true";
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
      spdlog::warn("event={}_refused path={} detail={} suppressed={}", name_,
                   QuoteLogValue(path_, kMaxInformerLoggedBytes),
                   QuoteLogValue(what, 2 * kMaxInformerLoggedBytes), *suppressed);
    }
  }

  // LIST: the set and its version, handed to on_list.
  StatusOr<std::string> ListOnce() {
    StatusOr<Client::Response> r =
        options_.client->Send("GET", path_, "", options_.request_timeout, &cancel_);
    if (!r.ok()) return r.status();
    Status http = Client::StatusForResponse("GET", path_, *r);
    if (!http.ok()) return http;
    StatusOr<List> list = codec_.DecodeList(r->body);
    r->body = std::string();  // the text is not needed past here
    if (!list.ok()) return list.status().WithPrefix("GET " + path_);
    for (const std::string& refused : list->refused) Refused("LIST " + refused);
    {
      MutexLock lock(&mu_);
      ++stats_.lists;
      stats_.resource_version = list->resource_version;
    }
    on_list_(std::move(Codec::Items(*list)));
    return list->resource_version;
  }

  LineOutcome OnLine(std::string_view line, std::string& rv) {
    StatusOr<Event> event = codec_.DecodeLine(line);
    if (!event.ok()) {
      Failed(event.status().WithPrefix("watch " + path_));
      return LineOutcome::kRelistError;
    }
    if (event->kind == Event::Kind::kGone) return LineOutcome::kRelistGone;
    if (event->kind == Event::Kind::kRefused) {
      // Skipped: the next event goes on from the last good version.
      Refused("watch event " + event->refusal);
      return LineOutcome::kContinue;
    }
    if (event->kind == Event::Kind::kBookmark) {
      rv = event->resource_version;
      MutexLock lock(&mu_);
      ++stats_.bookmarks;
      stats_.resource_version = rv;
      return LineOutcome::kContinue;
    }
    if (!event->resource_version.empty()) rv = event->resource_version;
    {
      MutexLock lock(&mu_);
      ++stats_.events;
      stats_.resource_version = rv;
    }
    on_event_(event->type, Codec::ObjectOf(*event));
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
    ListWatchStats s;
    {
      MutexLock lock(&mu_);
      s = stats_;
      ++stats_.backoffs;
    }
    spdlog::info(
        "event={}_backoff reason={} wait_ms={} lists={} watches={} "
        "relists_after_gone={} short_watches={} errors={} backoffs={}",
        name_, reason, wait.count(), s.lists, s.watches, s.relists_after_gone, s.short_watches,
        s.errors, s.backoffs + 1);
    const bool stop = Sleep(wait);
    last_backoff_end_ = clock_->Now();
    return stop;
  }

  void Run() {
    // Why the next LIST waits a back-off; null for the first.
    const char* relist_reason = nullptr;
    while (!Stopping()) {
      if (relist_reason != nullptr && BackOff(relist_reason)) return;
      StatusOr<std::string> listed = ListOnce();
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

  const std::string name_;
  const ListWatchOptions options_;
  const std::string path_;
  const Codec codec_;
  const OnList on_list_;
  const OnEvent on_event_;
  const std::shared_ptr<kdm::Clock> clock_;
  Cancellation cancel_;
  Wakeup stop_wakeup_;  // Stop() wakes it: ends a back-off at once
  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ListWatchStats stats_ ABSL_GUARDED_BY(mu_);
  // The reflector's thread only:
  std::mt19937_64 rng_;
  milliseconds backoff_;
  std::optional<kdm::Clock::TimePoint> last_backoff_end_;
  LogRateLimiter refusal_log_{/*burst=*/5, std::chrono::seconds(60)};
  static constexpr int kFailureLogBurst = 3;
  LogRateLimiter failure_log_{kFailureLogBurst, std::chrono::seconds(60)};
  Mutex join_mu_;
  std::thread thread_;
};

}  // namespace kdm::kube::internal

#endif  // KDM_KUBE_REFLECTOR_H_
