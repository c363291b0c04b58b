// MetricRegistry: the text exposition of each kind of family, children
// added and removed, and counters mirrored with RaiseTo.
#include "kdm/http/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kdm::http {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricRegistryTest, ExposesCountersGaugesAndHistogramsAsText) {
  MetricRegistry registry;
  CounterFamily requests = registry.AddCounter("kdm_test_requests_total", "Requests.");
  GaugeFamily nodes = registry.AddGauge("kdm_test_nodes", "Nodes.");
  HistogramFamily seconds = registry.AddHistogram("kdm_test_seconds", "Seconds.");
  requests.Add({{"verb", "filter"}, {"code", "200"}}).Increment();
  requests.Add({{"verb", "filter"}, {"code", "200"}}).Increment(2);
  nodes.Add({}).Set(7);
  seconds.Add({{"verb", "filter"}}, {0.1, 1}).Observe(0.5);
  const std::string text = registry.Text();
  EXPECT_THAT(text, HasSubstr("# HELP kdm_test_requests_total Requests.\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE kdm_test_requests_total counter\n"));
  EXPECT_THAT(text, HasSubstr("kdm_test_requests_total{code=\"200\",verb=\"filter\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("kdm_test_nodes 7\n"));
  EXPECT_THAT(text, HasSubstr("kdm_test_seconds_bucket{verb=\"filter\",le=\"0.1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("kdm_test_seconds_bucket{verb=\"filter\",le=\"1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kdm_test_seconds_count{verb=\"filter\"} 1\n"));
  EXPECT_EQ(std::string(kExpositionContentType), "text/plain; version=0.0.4; charset=utf-8");
}

TEST(MetricRegistryTest, RemovedChildrenLeaveTheExpositionAndRaiseToNeverLowers) {
  MetricRegistry registry;
  GaugeFamily capacity = registry.AddGauge("kdm_test_capacity", "Capacity.");
  capacity.Add({{"resource_name", "a"}}).Set(1);
  capacity.Add({{"resource_name", "b"}}).Set(2);
  capacity.Remove({{"resource_name", "a"}});
  EXPECT_THAT(registry.Text(), Not(HasSubstr("resource_name=\"a\"")));
  EXPECT_THAT(registry.Text(), HasSubstr("kdm_test_capacity{resource_name=\"b\"} 2"));

  Counter mirrored = registry.AddCounter("kdm_test_mirrored_total", "Mirrored.").Add({});
  mirrored.RaiseTo(5);
  mirrored.RaiseTo(3);
  EXPECT_EQ(mirrored.Value(), 5);
  EXPECT_THAT(registry.Text(), HasSubstr("kdm_test_mirrored_total 5\n"));
}

}  // namespace
}  // namespace kdm::http
