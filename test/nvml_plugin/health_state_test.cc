#include "kdm/nvml/health_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kdm::nvml {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

const HealthState::TimePoint kT0 = HealthState::TimePoint() + 1000h;

TEST(HealthStateTest, EveryDeviceStartsHealthy) {
  HealthState s({"GPU-a", "GPU-b"}, std::nullopt);
  EXPECT_EQ(s.Snapshot(), (std::map<std::string, bool>{{"GPU-a", true}, {"GPU-b", true}}));
  EXPECT_FALSE(s.NextRecovery().has_value());
}

TEST(HealthStateTest, WithoutAWindowAnUnhealthyDeviceStaysUnhealthy) {
  HealthState s({"GPU-a", "GPU-b"}, std::nullopt);
  StatusOr<bool> changed = s.MarkUnhealthy("GPU-a", kT0);
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(*changed);
  // A second event changes nothing.
  EXPECT_FALSE(*s.MarkUnhealthy("GPU-a", kT0 + 1s));
  EXPECT_THAT(s.Recover(kT0 + 24h * 365), IsEmpty());
  EXPECT_FALSE(*s.Healthy("GPU-a"));
  EXPECT_TRUE(*s.Healthy("GPU-b"));
}

TEST(HealthStateTest, RecoversExactlyWhenTheWindowHasPassed) {
  HealthState s({"GPU-a", "GPU-b"}, 30s);
  ASSERT_TRUE(*s.MarkUnhealthy("GPU-a", kT0));
  EXPECT_EQ(s.NextRecovery(), kT0 + 30s);
  EXPECT_THAT(s.Recover(kT0 + 30s - 1us), IsEmpty());
  EXPECT_FALSE(*s.Healthy("GPU-a"));
  EXPECT_THAT(s.Recover(kT0 + 30s), ElementsAre("GPU-a"));
  EXPECT_TRUE(*s.Healthy("GPU-a"));
  EXPECT_FALSE(s.NextRecovery().has_value());
  EXPECT_THAT(s.Recover(kT0 + 60s), IsEmpty());
}

TEST(HealthStateTest, ANewCriticalEventRestartsTheWindow) {
  HealthState s({"GPU-a"}, 30s);
  ASSERT_TRUE(*s.MarkUnhealthy("GPU-a", kT0));
  EXPECT_FALSE(*s.MarkUnhealthy("GPU-a", kT0 + 20s));
  EXPECT_EQ(s.NextRecovery(), kT0 + 50s);
  EXPECT_THAT(s.Recover(kT0 + 30s), IsEmpty());
  EXPECT_THAT(s.Recover(kT0 + 50s), ElementsAre("GPU-a"));
}

TEST(HealthStateTest, DevicesRecoverIndependentlyAndTheNextIsTheEarliest) {
  HealthState s({"GPU-a", "GPU-b", "GPU-c"}, 10s);
  ASSERT_TRUE(*s.MarkUnhealthy("GPU-b", kT0 + 5s));
  ASSERT_TRUE(*s.MarkUnhealthy("GPU-a", kT0 + 7s));
  EXPECT_EQ(s.NextRecovery(), kT0 + 15s);
  EXPECT_THAT(s.Recover(kT0 + 15s), ElementsAre("GPU-b"));
  EXPECT_EQ(s.NextRecovery(), kT0 + 17s);
  EXPECT_THAT(s.Recover(kT0 + 100s), ElementsAre("GPU-a"));
}

TEST(HealthStateTest, ALostGpuNeverRecovers) {
  HealthState s({"GPU-a", "GPU-b"}, 1s);
  ASSERT_TRUE(*s.MarkUnhealthy("GPU-a", kT0));
  EXPECT_FALSE(*s.MarkLost("GPU-a"));  // already unhealthy: no change
  EXPECT_TRUE(*s.MarkLost("GPU-b"));
  EXPECT_TRUE(s.Lost("GPU-a"));
  EXPECT_TRUE(s.Lost("GPU-b"));
  EXPECT_FALSE(s.NextRecovery().has_value());
  EXPECT_THAT(s.Recover(kT0 + 24h), IsEmpty());
  EXPECT_EQ(s.Snapshot(), (std::map<std::string, bool>{{"GPU-a", false}, {"GPU-b", false}}));
}

TEST(HealthStateTest, UnknownIdsAreNotFoundNamingTheId) {
  HealthState s({"GPU-a"}, 1s);
  for (const StatusOr<bool>& r :
       {s.MarkUnhealthy("GPU-zz", kT0), s.MarkLost("GPU-zz"), s.Healthy("GPU-zz")}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(r.status().message(), "device \"GPU-zz\" is not a GPU of this plugin");
  }
  EXPECT_FALSE(s.Lost("GPU-zz"));
  EXPECT_TRUE(*s.Healthy("GPU-a"));
}

}  // namespace
}  // namespace kdm::nvml
