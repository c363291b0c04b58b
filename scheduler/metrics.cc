#include "kdm/scheduler/metrics.h"

#include <atomic>

#include "kdm/http/metrics.h"

namespace kdm::scheduler {
namespace {

class MetricsImpl final : public ExtenderMetrics {
 public:
  MetricsImpl()
      : requests_(registry_.AddCounter("kdm_extender_requests_total",
                                       "Extender requests answered, by verb and HTTP status.")),
        seconds_(registry_.AddHistogram("kdm_extender_request_seconds",
                                        "Time to answer an extender request, by verb.")),
        nodes_(registry_.AddCounter("kdm_extender_nodes_total",
                                    "Nodes judged (filter) or scored (prioritize).")),
        memo_(registry_.AddCounter("kdm_extender_score_memo_total",
                                   "Score memo lookups, by result (hit, miss).")),
        cache_(registry_.AddCounter(
            "kdm_extender_node_cache_total",
            "NodeNames looked up in the node cache, by result (hit, unknown).")),
        annotation_errors_(registry_
                               .AddCounter("kdm_extender_annotation_errors_total",
                                           "kdm.io/devices annotations that could not be read (the "
                                           "node got no opinion).")
                               .Add({})),
        cached_nodes_(
            registry_.AddGauge("kdm_extender_cached_nodes", "Nodes in the node cache.").Add({})),
        topology_bytes_(registry_
                            .AddGauge("kdm_extender_topology_cache_bytes",
                                      "Estimated bytes of the topologies kept in the topology "
                                      "cache (bounded by --topology-cache-bytes).")
                            .Add({})),
        topology_entries_(registry_
                              .AddGauge("kdm_extender_topology_cache_entries",
                                        "Distinct topologies kept in the topology cache.")
                              .Add({})),
        topology_evictions_(registry_
                                .AddCounter("kdm_extender_topology_cache_evictions_total",
                                            "Topologies evicted (least recently used) to keep "
                                            "the topology cache within its bytes.")
                                .Add({})),
        log_suppressed_(registry_.AddCounter(
            "kdm_extender_log_suppressed_total",
            "Log lines left out by the rate limit on lines caused by outside input, by event.")),
        busy_(registry_.AddCounter(
            "kdm_extender_busy_total",
            "Requests answered 503 (Retry-After), by reason (body_budget, queue_full).")),
        unscored_(registry_.AddCounter("kdm_extender_unscored_nodes_total",
                                       "Nodes passed unjudged (filter) or scored 0 (prioritize) "
                                       "for want of time, by verb and reason (request_budget, "
                                       "node_budget, stopping).")),
        assumptions_(registry_.AddCounter("kdm_extender_assumptions_total",
                                          "Pods assumed bound to a node until its annotation "
                                          "shows them, by source (watch, bind).")),
        assumptions_ended_(registry_.AddCounter(
            "kdm_extender_assumptions_ended_total",
            "Assumptions ended, by reason (reflected, deleted, expired, node_deleted, "
            "bind_failed).")),
        assumed_pods_(
            registry_.AddGauge("kdm_extender_assumed_pods", "Assumptions in force.").Add({})),
        bind_wait_(registry_.AddHistogram(
            "kdm_extender_bind_wait_seconds",
            "Time a filter waited for the binds of the pods before it in their cycle.")),
        bind_wait_given_up_(registry_
                                .AddCounter("kdm_extender_bind_wait_given_up_total",
                                            "Pods in their cycle whose bind a filter stopped "
                                            "waiting for (--bind-wait).")
                                .Add({})),
        node_names_without_cache_(registry_.AddCounter(
            "kdm_extender_node_names_without_cache_total",
            "Requests that named nodes only (NodeNames, nodeCacheCapable) to an extender "
            "without a node cache (no --kubeconfig/--in-cluster): every node got no opinion, "
            "by verb.")),
        memo_hit_(memo_.Add({{"result", "hit"}})),
        memo_miss_(memo_.Add({{"result", "miss"}})),
        cache_hit_(cache_.Add({{"result", "hit"}})),
        cache_unknown_(cache_.Add({{"result", "unknown"}})) {}

  void Request(std::string_view verb, int code, double seconds) override {
    const std::string v(verb);
    requests_.Add({{"verb", v}, {"code", std::to_string(code)}}).Increment();
    seconds_
        .Add({{"verb", v}}, {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5})
        .Observe(seconds);
  }
  void Nodes(std::string_view verb, uint64_t n) override {
    nodes_.Add({{"verb", std::string(verb)}}).Increment(static_cast<double>(n));
  }
  void Memo(uint64_t hits, uint64_t misses) override {
    memo_hit_.Increment(static_cast<double>(hits));
    memo_miss_.Increment(static_cast<double>(misses));
  }
  void NodeCache(uint64_t found, uint64_t unknown) override {
    cache_hit_.Increment(static_cast<double>(found));
    cache_unknown_.Increment(static_cast<double>(unknown));
  }
  void AnnotationErrors(uint64_t n) override {
    annotation_errors_.Increment(static_cast<double>(n));
  }
  void NodeNamesWithoutCache(std::string_view verb) override {
    node_names_without_cache_.Add({{"verb", std::string(verb)}}).Increment();
  }
  void CachedNodes(uint64_t n) override { cached_nodes_.Set(static_cast<double>(n)); }
  void WatchTopologyCache(const k8s::TopologyCache* cache) override {
    topologies_.store(cache, std::memory_order_release);
  }
  void LogSuppressed(std::string_view event, uint64_t n) override {
    log_suppressed_.Add({{"event", std::string(event)}}).Increment(static_cast<double>(n));
  }
  void Busy(std::string_view reason) override {
    busy_.Add({{"reason", std::string(reason)}}).Increment();
  }
  void Unscored(std::string_view verb, std::string_view reason, uint64_t n) override {
    unscored_.Add({{"verb", std::string(verb)}, {"reason", std::string(reason)}})
        .Increment(static_cast<double>(n));
  }
  void AssumptionStarted(std::string_view source) override {
    assumptions_.Add({{"source", std::string(source)}}).Increment();
  }
  void AssumptionEnded(std::string_view reason) override {
    assumptions_ended_.Add({{"reason", std::string(reason)}}).Increment();
  }
  void AssumedPods(uint64_t n) override { assumed_pods_.Set(static_cast<double>(n)); }
  void BindWait(double seconds, uint64_t gave_up) override {
    bind_wait_.Add({}, {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1})
        .Observe(seconds);
    if (gave_up > 0) bind_wait_given_up_.Increment(static_cast<double>(gave_up));
  }
  std::string Text() const override {
    if (const k8s::TopologyCache* cache = topologies_.load(std::memory_order_acquire)) {
      const k8s::TopologyCache::Stats s = cache->stats();
      topology_bytes_.Set(static_cast<double>(s.bytes));
      topology_entries_.Set(static_cast<double>(s.entries));
      topology_evictions_.RaiseTo(static_cast<double>(s.evictions));
    }
    return registry_.Text();
  }

 private:
  http::MetricRegistry registry_;
  const http::CounterFamily requests_;
  const http::HistogramFamily seconds_;
  const http::CounterFamily nodes_;
  const http::CounterFamily memo_;
  const http::CounterFamily cache_;
  const http::Counter annotation_errors_;
  const http::Gauge cached_nodes_;
  const http::Gauge topology_bytes_;
  const http::Gauge topology_entries_;
  const http::Counter topology_evictions_;
  const http::CounterFamily log_suppressed_;
  std::atomic<const k8s::TopologyCache*> topologies_{nullptr};
  const http::CounterFamily busy_;
  const http::CounterFamily unscored_;
  const http::CounterFamily assumptions_;
  const http::CounterFamily assumptions_ended_;
  const http::Gauge assumed_pods_;
  const http::HistogramFamily bind_wait_;
  const http::Counter bind_wait_given_up_;
  const http::CounterFamily node_names_without_cache_;
  const http::Counter memo_hit_;
  const http::Counter memo_miss_;
  const http::Counter cache_hit_;
  const http::Counter cache_unknown_;
};

}  // namespace

std::unique_ptr<ExtenderMetrics> ExtenderMetrics::Create() {
  return std::make_unique<MetricsImpl>();
}

}  // namespace kdm::scheduler
