#include "kdm/http/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace kdm::http {
namespace {

prometheus::Labels ToPrometheusLabels(const MetricLabels& labels) {
  return prometheus::Labels(labels.begin(), labels.end());
}

template <typename T>
T& As(void* p) {
  return *static_cast<T*>(p);
}

}  // namespace

struct MetricRegistry::Impl {
  prometheus::Registry registry;
};

void Counter::Increment(double by) const { As<prometheus::Counter>(metric_).Increment(by); }
double Counter::Value() const { return As<prometheus::Counter>(metric_).Value(); }
void Counter::RaiseTo(double value) const {
  auto& c = As<prometheus::Counter>(metric_);
  const double delta = value - c.Value();
  if (delta > 0) c.Increment(delta);
}

void Gauge::Set(double value) const { As<prometheus::Gauge>(metric_).Set(value); }
double Gauge::Value() const { return As<prometheus::Gauge>(metric_).Value(); }

void Histogram::Observe(double value) const { As<prometheus::Histogram>(metric_).Observe(value); }

Counter CounterFamily::Add(const MetricLabels& labels) const {
  return Counter(
      &As<prometheus::Family<prometheus::Counter>>(family_).Add(ToPrometheusLabels(labels)));
}
void CounterFamily::Remove(const MetricLabels& labels) const {
  auto& family = As<prometheus::Family<prometheus::Counter>>(family_);
  family.Remove(&family.Add(ToPrometheusLabels(labels)));
}

Gauge GaugeFamily::Add(const MetricLabels& labels) const {
  return Gauge(&As<prometheus::Family<prometheus::Gauge>>(family_).Add(ToPrometheusLabels(labels)));
}
void GaugeFamily::Remove(const MetricLabels& labels) const {
  auto& family = As<prometheus::Family<prometheus::Gauge>>(family_);
  family.Remove(&family.Add(ToPrometheusLabels(labels)));
}

Histogram HistogramFamily::Add(const MetricLabels& labels,
                               const std::vector<double>& buckets) const {
  return Histogram(&As<prometheus::Family<prometheus::Histogram>>(family_).Add(
      ToPrometheusLabels(labels), prometheus::Histogram::BucketBoundaries(buckets)));
}

MetricRegistry::MetricRegistry() : impl_(std::make_unique<Impl>()) {}
MetricRegistry::~MetricRegistry() = default;

CounterFamily MetricRegistry::AddCounter(const std::string& name, const std::string& help) {
  return CounterFamily(&prometheus::BuildCounter().Name(name).Help(help).Register(impl_->registry));
}
GaugeFamily MetricRegistry::AddGauge(const std::string& name, const std::string& help) {
  return GaugeFamily(&prometheus::BuildGauge().Name(name).Help(help).Register(impl_->registry));
}
HistogramFamily MetricRegistry::AddHistogram(const std::string& name, const std::string& help) {
  return HistogramFamily(
      &prometheus::BuildHistogram().Name(name).Help(help).Register(impl_->registry));
}

std::string MetricRegistry::Text() const {
  return prometheus::TextSerializer().Serialize(impl_->registry.Collect());
}

}  // namespace kdm::http
