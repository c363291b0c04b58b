// Extender: kube-scheduler's filter and prioritize verbs, from a request
// body to an HTTP answer (docs/extender.md). No I/O of its own: the HTTP
// server (http_server.h) hands it bodies.
//
// - 400 with {"Error": "..."} for a body that does not decode (the message
//   names the field); otherwise 200 with the scheduler's JSON.
// - Nodes given in full are read from the body; NodeNames are looked up in
//   the node cache (when there is one); unknown names and nodes without a
//   readable annotation get no opinion: they pass the filter and score 0.
// - A request with unreadable annotations is logged (event=annotation_
//   unreadable), at most kUnreadableLogBurst lines a second in all, each
//   with `suppressed=N`, the lines left out since the last.
// - Time: each request has one budget (request_budget, from the decoded
//   body on; a node's share of it as ScoreBudget says). Nodes not reached
//   within it pass the filter unjudged / score 0, counted in
//   kdm_extender_unscored_nodes_total{verb,reason}; the answer is never
//   late. After Stop() every request ends at its next node the same way.
//
// Thread-safety: Filter and Prioritize may be called from any number of
// threads at once.
#ifndef KDM_SCHEDULER_EXTENDER_H_
#define KDM_SCHEDULER_EXTENDER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/sync.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/scheduler/assumptions.h"
#include "kdm/scheduler/extender_json.h"
#include "kdm/scheduler/metrics.h"
#include "kdm/scheduler/node_cache.h"
#include "kdm/scheduler/scorer.h"

namespace kdm::scheduler {

struct HttpAnswer {
  int status = 200;
  std::string body;
};

class Extender {
 public:
  struct Options {
    ScorePolicy policy = kDefaultScorePolicy;
    // Not owned; may be null (then NodeNames get no opinion).
    const NodeCache* cache = nullptr;
    // Not owned; may be null.
    ExtenderMetrics* metrics = nullptr;
    // Not owned; null: the extender keeps its own.
    k8s::TopologyCache* topologies = nullptr;
    // The time one request may spend judging or scoring its nodes.
    std::chrono::milliseconds request_budget{500};
    // Not owned; null: the steady clock.
    const Clock* clock = nullptr;
    // Not owned; null: no assumed allocations (the annotations as they are).
    Assumptions* assumptions = nullptr;
    // Posts a Binding to the API server (POST /bind); null: /bind answers
    // an error naming what is missing.
    std::function<Status(const BindArgs&)> bind;
  };

  explicit Extender(Options options);

  // `body` may be padded with PadBody (read in place) or not (copied).
  HttpAnswer Filter(const std::string& body);
  HttpAnswer Prioritize(const std::string& body);
  // kube-scheduler's bindVerb: assumes the pod on the node (its request as
  // the last filter for its uid read it), posts the Binding, and answers
  // ExtenderBindingResult; a failed post ends the assumption and is the
  // answer's Error.
  HttpAnswer Bind(const std::string& body);

  Scorer::Stats memo_stats() const { return scorer_.stats(); }

  static constexpr int kUnreadableLogBurst = 5;
  // Pods whose request /bind can find: the last this many filtered.
  static constexpr size_t kRecentPods = 8192;
  // Requests running now and later end at their next node (any thread).
  void Stop() { stopping_ = true; }

 private:
  void LogUnreadable(const std::string& pod, uint64_t errors, const std::string& first_error);
  void RememberPod(const PodRequest& pod);

  const Options options_;
  std::unique_ptr<k8s::TopologyCache> own_topologies_;
  k8s::TopologyCache* topologies_;
  Scorer scorer_;
  Mutex log_mu_;
  LogRateLimiter unreadable_log_ ABSL_GUARDED_BY(log_mu_){kUnreadableLogBurst,
                                                          std::chrono::seconds(1)};
  std::atomic<bool> stopping_{false};
  Mutex recent_mu_;
  std::unordered_map<std::string, BoundPod> recent_ ABSL_GUARDED_BY(recent_mu_);
  std::deque<std::string> recent_order_ ABSL_GUARDED_BY(recent_mu_);
};

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_EXTENDER_H_
