// kdm::http::MetricRegistry: the one way kdm keeps and exposes Prometheus
// metrics (prometheus-cpp's core, hidden). Families are registered once;
// Add(labels) returns the child for those labels (the same one each time);
// Text() is the text exposition (format 0.0.4) that GET /metrics serves,
// with kExpositionContentType.
//
// Handles (CounterFamily, Counter, ...) are small values that point into
// the registry: valid while it lives, cheap to copy.
//
// Thread-safety: every method may be called from any thread concurrently.
//
// Example:
//   http::MetricRegistry registry;
//   http::CounterFamily requests = registry.AddCounter("kdm_x_total", "Things done.");
//   requests.Add({{"verb", "filter"}}).Increment();
//   std::string text = registry.Text();
#ifndef KDM_HTTP_METRICS_H_
#define KDM_HTTP_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kdm::http {

inline constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

using MetricLabels = std::map<std::string, std::string>;

class Counter {
 public:
  // REQUIRES: by >= 0.
  void Increment(double by = 1) const;
  double Value() const;
  // Raises the counter to `value` when it is lower (a mirror of a total
  // counted elsewhere); never lowers it.
  void RaiseTo(double value) const;

 private:
  friend class CounterFamily;
  explicit Counter(void* metric) : metric_(metric) {}
  void* metric_;
};

class Gauge {
 public:
  void Set(double value) const;
  double Value() const;

 private:
  friend class GaugeFamily;
  explicit Gauge(void* metric) : metric_(metric) {}
  void* metric_;
};

class Histogram {
 public:
  void Observe(double value) const;

 private:
  friend class HistogramFamily;
  explicit Histogram(void* metric) : metric_(metric) {}
  void* metric_;
};

class CounterFamily {
 public:
  Counter Add(const MetricLabels& labels) const;
  // Drops the child with these labels from the exposition.
  void Remove(const MetricLabels& labels) const;

 private:
  friend class MetricRegistry;
  explicit CounterFamily(void* family) : family_(family) {}
  void* family_;
};

class GaugeFamily {
 public:
  Gauge Add(const MetricLabels& labels) const;
  void Remove(const MetricLabels& labels) const;

 private:
  friend class MetricRegistry;
  explicit GaugeFamily(void* family) : family_(family) {}
  void* family_;
};

class HistogramFamily {
 public:
  // `buckets`: the upper bounds, ascending; used when the child is created.
  Histogram Add(const MetricLabels& labels, const std::vector<double>& buckets) const;

 private:
  friend class MetricRegistry;
  explicit HistogramFamily(void* family) : family_(family) {}
  void* family_;
};

class MetricRegistry {
 public:
  MetricRegistry();
  ~MetricRegistry();
  MetricRegistry(const MetricRegistry&) = delete;
  MetricRegistry& operator=(const MetricRegistry&) = delete;

  // REQUIRES: a valid metric name not registered before.
  CounterFamily AddCounter(const std::string& name, const std::string& help);
  GaugeFamily AddGauge(const std::string& name, const std::string& help);
  HistogramFamily AddHistogram(const std::string& name, const std::string& help);

  // The text exposition of every family.
  std::string Text() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdm::http

#endif  // KDM_HTTP_METRICS_H_
