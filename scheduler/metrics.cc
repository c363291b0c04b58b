#include "kdm/scheduler/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace kdm::scheduler {
namespace {

class MetricsImpl final : public ExtenderMetrics {
 public:
  MetricsImpl()
      : registry_(std::make_shared<prometheus::Registry>()),
        requests_(prometheus::BuildCounter()
                      .Name("kdm_extender_requests_total")
                      .Help("Extender requests answered, by verb and HTTP status.")
                      .Register(*registry_)),
        seconds_(prometheus::BuildHistogram()
                     .Name("kdm_extender_request_seconds")
                     .Help("Time to answer an extender request, by verb.")
                     .Register(*registry_)),
        nodes_(prometheus::BuildCounter()
                   .Name("kdm_extender_nodes_total")
                   .Help("Nodes judged (filter) or scored (prioritize).")
                   .Register(*registry_)),
        memo_(prometheus::BuildCounter()
                  .Name("kdm_extender_score_memo_total")
                  .Help("Score memo lookups, by result (hit, miss).")
                  .Register(*registry_)),
        cache_(prometheus::BuildCounter()
                   .Name("kdm_extender_node_cache_total")
                   .Help("NodeNames looked up in the node cache, by result (hit, unknown).")
                   .Register(*registry_)),
        annotation_errors_(prometheus::BuildCounter()
                               .Name("kdm_extender_annotation_errors_total")
                               .Help("kdm.io/devices annotations that could not be read (the "
                                     "node got no opinion).")
                               .Register(*registry_)
                               .Add({})),
        cached_nodes_(prometheus::BuildGauge()
                          .Name("kdm_extender_cached_nodes")
                          .Help("Nodes in the node cache.")
                          .Register(*registry_)
                          .Add({})),
        memo_hit_(memo_.Add({{"result", "hit"}})),
        memo_miss_(memo_.Add({{"result", "miss"}})),
        cache_hit_(cache_.Add({{"result", "hit"}})),
        cache_unknown_(cache_.Add({{"result", "unknown"}})) {}

  void Request(std::string_view verb, int code, double seconds) override {
    const std::string v(verb);
    requests_.Add({{"verb", v}, {"code", std::to_string(code)}}).Increment();
    seconds_
        .Add({{"verb", v}},
             prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25, 0.5, 1, 2.5, 5})
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
  void CachedNodes(uint64_t n) override { cached_nodes_.Set(static_cast<double>(n)); }
  std::string Text() const override {
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  prometheus::Family<prometheus::Counter>& nodes_;
  prometheus::Family<prometheus::Counter>& memo_;
  prometheus::Family<prometheus::Counter>& cache_;
  prometheus::Counter& annotation_errors_;
  prometheus::Gauge& cached_nodes_;
  prometheus::Counter& memo_hit_;
  prometheus::Counter& memo_miss_;
  prometheus::Counter& cache_hit_;
  prometheus::Counter& cache_unknown_;
};

}  // namespace

std::unique_ptr<ExtenderMetrics> ExtenderMetrics::Create() {
  return std::make_unique<MetricsImpl>();
}

}  // namespace kdm::scheduler
