// The extender's Prometheus metrics (docs/extender.md, "Metrics"), served
// as text on GET /metrics:
//   kdm_extender_requests_total{verb,code}      requests answered
//   kdm_extender_request_seconds{verb}          latency (histogram)
//   kdm_extender_nodes_total{verb}              nodes judged or scored
//   kdm_extender_score_memo_total{result}       score memo hit / miss
//   kdm_extender_node_cache_total{result}       NodeNames found / unknown
//   kdm_extender_node_names_without_cache_total{verb}  NodeNames requests to
//                                               an extender with no node cache
//   kdm_extender_annotation_errors_total        annotations that did not read
//   kdm_extender_cached_nodes                   nodes in the node cache
//   kdm_extender_topology_cache_bytes           the topology cache's bytes
//   kdm_extender_topology_cache_entries         ... and entries
//   kdm_extender_topology_cache_evictions_total ... and entries evicted
//   kdm_extender_log_suppressed_total{event}    log lines left out (rate limit)
//   kdm_extender_busy_total{reason}             503s: body_budget, queue_full
//   kdm_extender_unscored_nodes_total{verb,reason}  nodes passed unjudged or
//                                               scored 0 for want of time:
//                                               request_budget, node_budget,
//                                               stopping
//   kdm_extender_assumptions_total{source}      assumptions started: watch, bind
//   kdm_extender_assumptions_ended_total{reason}  ... ended: reflected,
//                                               deleted, expired, node_deleted,
//                                               bind_failed
//   kdm_extender_assumed_pods                   assumptions in force
//   kdm_extender_bind_wait_seconds              a filter's wait for the binds
//                                               of pods in their cycle
//   kdm_extender_bind_wait_given_up_total       pods whose bind a filter
//                                               stopped waiting for
//
// Thread-safety: every method may be called from any thread.
#ifndef KDM_SCHEDULER_METRICS_H_
#define KDM_SCHEDULER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kdm/k8s/devices_annotation.h"

namespace kdm::scheduler {

class ExtenderMetrics {
 public:
  static std::unique_ptr<ExtenderMetrics> Create();
  virtual ~ExtenderMetrics() = default;

  virtual void Request(std::string_view verb, int code, double seconds) = 0;
  virtual void Nodes(std::string_view verb, uint64_t n) = 0;
  virtual void Memo(uint64_t hits, uint64_t misses) = 0;
  virtual void NodeCache(uint64_t found, uint64_t unknown) = 0;
  // A `verb` request named nodes only (NodeNames) but there is no node cache.
  virtual void NodeNamesWithoutCache(std::string_view verb) = 0;
  virtual void AnnotationErrors(uint64_t n) = 0;
  virtual void CachedNodes(uint64_t n) = 0;
  // The topology cache whose Stats the exposition shows (read at each
  // Text()); not owned, must outlive this object; null: none shown.
  virtual void WatchTopologyCache(const k8s::TopologyCache* cache) = 0;
  // Lines of `event` the log rate limit left out.
  virtual void LogSuppressed(std::string_view event, uint64_t n) = 0;
  virtual void Busy(std::string_view reason) = 0;
  virtual void Unscored(std::string_view verb, std::string_view reason, uint64_t n) = 0;
  virtual void AssumptionStarted(std::string_view source) = 0;
  virtual void AssumptionEnded(std::string_view reason) = 0;
  virtual void AssumedPods(uint64_t n) = 0;
  virtual void BindWait(double seconds, uint64_t gave_up) = 0;
  // The Prometheus text exposition.
  virtual std::string Text() const = 0;
};

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_METRICS_H_
