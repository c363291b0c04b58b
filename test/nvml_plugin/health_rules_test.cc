#include "kdm/nvml/health_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "kdm/nvml/nvml_api.h"

namespace kdm::nvml {
namespace {

using ::testing::HasSubstr;

TEST(HealthRulesTest, ApplicationXidsLeaveTheGpuHealthy) {
  HealthChecks defaults;
  for (uint64_t xid : std::initializer_list<uint64_t>{13, 31, 43, 45, 68, 109}) {
    HealthVerdict v = ClassifyEvent(defaults, kEventTypeXidCriticalError, xid);
    EXPECT_FALSE(v.unhealthy) << xid;
    EXPECT_THAT(v.reason, HasSubstr("application error")) << xid;
    EXPECT_TRUE(IsApplicationXid(xid));
  }
}

TEST(HealthRulesTest, OtherCriticalXidsEccAndNothingElseMakeItUnhealthy) {
  HealthChecks defaults;
  for (uint64_t xid :
       std::initializer_list<uint64_t>{0, 1, 48, 63, 64, 74, 79, 94, 95, 119, 4294967295u}) {
    HealthVerdict v = ClassifyEvent(defaults, kEventTypeXidCriticalError, xid);
    EXPECT_TRUE(v.unhealthy) << xid;
    EXPECT_EQ(v.reason, "Xid " + std::to_string(xid));
    EXPECT_FALSE(IsApplicationXid(xid));
  }
  HealthVerdict ecc = ClassifyEvent(defaults, kEventTypeDoubleBitEccError, 0);
  EXPECT_TRUE(ecc.unhealthy);
  EXPECT_EQ(ecc.reason, "double-bit ECC error");
  // Single-bit ECC and unknown types are not health events.
  HealthVerdict sbe = ClassifyEvent(defaults, kEventTypeSingleBitEccError, 0);
  EXPECT_FALSE(sbe.unhealthy);
  EXPECT_EQ(sbe.reason, "event type 0x1 (not a health event)");
  EXPECT_FALSE(ClassifyEvent(defaults, 0x400, 79).unhealthy);
}

TEST(HealthRulesTest, UnsetOrEmptyIsTheDefault) {
  for (const char* value : {"", "  ", "\t"}) {
    StatusOr<HealthChecks> c = ParseDisableHealthChecks(value);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(*c, HealthChecks{}) << "'" << value << "'";
  }
  EXPECT_EQ(EventMaskFor(HealthChecks{}), kEventTypeXidCriticalError | kEventTypeDoubleBitEccError);
}

TEST(HealthRulesTest, AllDisablesEverything) {
  StatusOr<HealthChecks> c = ParseDisableHealthChecks("ALL");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->disabled);
  EXPECT_EQ(EventMaskFor(*c), 0u);
  EXPECT_FALSE(ClassifyEvent(*c, kEventTypeXidCriticalError, 79).unhealthy);
  EXPECT_FALSE(ClassifyEvent(*c, kEventTypeDoubleBitEccError, 0).unhealthy);
}

TEST(HealthRulesTest, XidsIgnoresXidEventsButKeepsEcc) {
  StatusOr<HealthChecks> c = ParseDisableHealthChecks(" xids ");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->disabled);
  EXPECT_TRUE(c->xids_disabled);
  EXPECT_EQ(EventMaskFor(*c), kEventTypeDoubleBitEccError);
  HealthVerdict v = ClassifyEvent(*c, kEventTypeXidCriticalError, 79);
  EXPECT_FALSE(v.unhealthy);
  EXPECT_EQ(v.reason, "Xid 79 (Xid checks disabled)");
  EXPECT_TRUE(ClassifyEvent(*c, kEventTypeDoubleBitEccError, 0).unhealthy);
}

TEST(HealthRulesTest, AListOfXidsIsSkippedOnTopOfTheApplicationOnes) {
  StatusOr<HealthChecks> c = ParseDisableHealthChecks("48, 79,48");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->skipped_xids, (std::set<uint64_t>{48, 79}));
  HealthVerdict v = ClassifyEvent(*c, kEventTypeXidCriticalError, 48);
  EXPECT_FALSE(v.unhealthy);
  EXPECT_EQ(v.reason, "Xid 48 (skipped by DP_DISABLE_HEALTHCHECKS)");
  EXPECT_FALSE(ClassifyEvent(*c, kEventTypeXidCriticalError, 43).unhealthy);
  EXPECT_TRUE(ClassifyEvent(*c, kEventTypeXidCriticalError, 94).unhealthy);
  EXPECT_TRUE(ClassifyEvent(*c, kEventTypeDoubleBitEccError, 0).unhealthy);
}

TEST(HealthRulesTest, MixedFormsAreAllowed) {
  StatusOr<HealthChecks> c = ParseDisableHealthChecks("xids,48");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->xids_disabled);
  EXPECT_EQ(c->skipped_xids, (std::set<uint64_t>{48}));
  StatusOr<HealthChecks> all = ParseDisableHealthChecks("79,All");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->disabled);
}

TEST(HealthRulesTest, GarbageIsAnErrorNamingTheToken) {
  struct Case {
    const char* value;
    const char* token_message;
  };
  const Case cases[] = {
      {"nope", "token \"nope\" is not all, xids or a decimal Xid"},
      {"48,x", "token \"x\" is not all, xids or a decimal Xid"},
      {"-1", "token \"-1\" is not all, xids or a decimal Xid"},
      {"+5", "token \"+5\" is not all, xids or a decimal Xid"},
      {"0x30", "token \"0x30\" is not all, xids or a decimal Xid"},
      {"4 8", "token \"4 8\" is not all, xids or a decimal Xid"},
      {"48;79", "token \"48;79\" is not all, xids or a decimal Xid"},
      {"allx", "token \"allx\" is not all, xids or a decimal Xid"},
      {"48,", "token \"\" is empty"},
      {",48", "token \"\" is empty"},
      {"48,,79", "token \"\" is empty"},
      {"4294967296", "token \"4294967296\" is too large for an Xid"},
      {"99999999999999999999999", "token \"99999999999999999999999\" is too large for an Xid"},
  };
  for (const Case& c : cases) {
    StatusOr<HealthChecks> r = ParseDisableHealthChecks(c.value);
    ASSERT_FALSE(r.ok()) << c.value;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.value;
    EXPECT_THAT(r.status().message(),
                HasSubstr(std::string("DP_DISABLE_HEALTHCHECKS=\"") + c.value + "\""))
        << c.value;
    EXPECT_THAT(r.status().message(), HasSubstr(c.token_message)) << c.value;
  }
  // The largest 32-bit Xid is fine.
  EXPECT_TRUE(ParseDisableHealthChecks("4294967295").ok());
}

TEST(HealthRulesTest, AHugeValueIsRefusedWithoutEchoingItWhole) {
  std::string huge(1 << 20, '7');
  StatusOr<HealthChecks> r = ParseDisableHealthChecks(huge);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("too large for an Xid"));
  EXPECT_LT(r.status().message().size(), 1000u);
}

}  // namespace
}  // namespace kdm::nvml
