#include "kdm/k8s/quantity.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace kdm::k8s {
namespace {

using ::testing::HasSubstr;

struct ParseCase {
  std::string text;
  int64_t units;  // floor
  int32_t nanos;
};

class QuantityParseTest : public ::testing::TestWithParam<ParseCase> {};

TEST_P(QuantityParseTest, ParsesToExactValue) {
  const ParseCase& c = GetParam();
  StatusOr<Quantity> q = Quantity::Parse(c.text);
  ASSERT_TRUE(q.ok()) << c.text << ": " << q.status();
  EXPECT_EQ(q->FloorUnits(), c.units) << c.text;
  EXPECT_EQ(q->FractionNanos(), c.nanos) << c.text;
  EXPECT_EQ(q->ToString(), c.text);
}

INSTANTIATE_TEST_SUITE_P(
    Grammar, QuantityParseTest,
    ::testing::Values(
        ParseCase{"0", 0, 0}, ParseCase{"2", 2, 0}, ParseCase{"+3", 3, 0}, ParseCase{"-2", -2, 0},
        ParseCase{"007", 7, 0}, ParseCase{"500m", 0, 500000000}, ParseCase{"1500m", 1, 500000000},
        ParseCase{"-500m", -1, 500000000}, ParseCase{"1n", 0, 1}, ParseCase{"1u", 0, 1000},
        ParseCase{"1k", 1000, 0}, ParseCase{"1.5k", 1500, 0}, ParseCase{"1M", 1000000, 0},
        ParseCase{"1G", 1000000000, 0}, ParseCase{"1T", 1000000000000, 0},
        ParseCase{"1P", 1000000000000000, 0}, ParseCase{"1E", 1000000000000000000, 0},
        ParseCase{"1Ki", 1024, 0}, ParseCase{"1.5Ki", 1536, 0}, ParseCase{"1Mi", 1048576, 0},
        ParseCase{"1Gi", 1073741824, 0}, ParseCase{"1Ti", 1099511627776, 0},
        ParseCase{"1Pi", 1125899906842624, 0}, ParseCase{"1Ei", 1152921504606846976, 0},
        ParseCase{"7Ei", 8070450532247928832, 0}, ParseCase{"1e3", 1000, 0},
        ParseCase{"1E3", 1000, 0}, ParseCase{"1e+2", 100, 0}, ParseCase{"1e-3", 0, 1000000},
        ParseCase{"25e-1", 2, 500000000}, ParseCase{".5", 0, 500000000}, ParseCase{"5.", 5, 0},
        ParseCase{"1.0", 1, 0}, ParseCase{"0.000000001", 0, 1},
        ParseCase{"9223372036854775807", INT64_MAX, 0},
        // Finer than a nano unit rounds up, as Kubernetes does.
        ParseCase{"1e-12", 0, 1}, ParseCase{"0.0000000001", 0, 1},
        ParseCase{"1.0000000001", 1, 1}));

class QuantityRejectTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(QuantityRejectTest, RejectsWithReason) {
  const auto& [text, why] = GetParam();
  StatusOr<Quantity> q = Quantity::Parse(text);
  ASSERT_FALSE(q.ok()) << text;
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(q.status().message(), HasSubstr("invalid quantity \"" + text + "\""));
  EXPECT_THAT(q.status().message(), HasSubstr(why));
}

INSTANTIATE_TEST_SUITE_P(
    BadInput, QuantityRejectTest,
    ::testing::Values(std::pair<std::string, std::string>{"", "empty"},
                      std::pair<std::string, std::string>{" 1", "no digits"},
                      std::pair<std::string, std::string>{"1 ", "unknown suffix \" \""},
                      std::pair<std::string, std::string>{"abc", "no digits"},
                      std::pair<std::string, std::string>{"1x", "unknown suffix \"x\""},
                      std::pair<std::string, std::string>{"1ki", "unknown suffix \"ki\""},
                      std::pair<std::string, std::string>{"1KI", "unknown suffix \"KI\""},
                      std::pair<std::string, std::string>{"1Ki2", "unknown suffix"},
                      std::pair<std::string, std::string>{"1.2.3", "more than one decimal point"},
                      std::pair<std::string, std::string>{"+", "no digits"},
                      std::pair<std::string, std::string>{"-", "no digits"},
                      std::pair<std::string, std::string>{".", "no digits"},
                      std::pair<std::string, std::string>{"--1", "no digits"},
                      std::pair<std::string, std::string>{"1e", "exponent has no digits"},
                      std::pair<std::string, std::string>{"1e+", "exponent has no digits"},
                      std::pair<std::string, std::string>{"1e1.5", "is not an integer"},
                      std::pair<std::string, std::string>{"1e99999", "exponent out of range"},
                      std::pair<std::string, std::string>{"8Ei", "out of range"},
                      std::pair<std::string, std::string>{"9223372036854775808", "out of range"},
                      std::pair<std::string, std::string>{"-9223372036854775809", "out of range"},
                      std::pair<std::string, std::string>{"1e19", "out of range"},
                      std::pair<std::string, std::string>{
                          "100000000000000000000000000000000000000000", "out of range"},
                      std::pair<std::string, std::string>{"1.0000000000000000000000000000001",
                                                          "significant digits"}));

TEST(QuantityTest, ComparesValuesNotSpellings) {
  auto p = [](const char* s) { return *Quantity::Parse(s); };
  EXPECT_EQ(p("1"), p("1000m"));
  EXPECT_EQ(p("1k"), p("1e3"));
  EXPECT_EQ(p("2"), Quantity::FromInt(2));
  EXPECT_EQ(p("0"), Quantity());
  EXPECT_LT(p("500m"), p("1"));
  EXPECT_LT(p("-1"), p("0"));
  EXPECT_LT(p("-1"), p("-500m"));
  EXPECT_GT(p("1Ki"), p("1k"));
  EXPECT_NE(p("1"), p("1.000000001"));
}

TEST(QuantityTest, FromIntSpellsTheNumber) {
  EXPECT_EQ(Quantity::FromInt(42).ToString(), "42");
  EXPECT_EQ(Quantity::FromInt(-3).FloorUnits(), -3);
  EXPECT_EQ(Quantity().ToString(), "0");
  EXPECT_TRUE(Quantity().IsZero());
  EXPECT_TRUE(Quantity::FromInt(-1).IsNegative());
}

TEST(QuantityTest, DeviceCountOfWholeNumbers) {
  EXPECT_EQ(*Quantity::Parse("2")->DeviceCount(), 2);
  EXPECT_EQ(*Quantity::Parse("0")->DeviceCount(), 0);
  EXPECT_EQ(*Quantity::Parse("1e1")->DeviceCount(), 10);
  EXPECT_EQ(*Quantity::Parse("2000m")->DeviceCount(), 2);
  EXPECT_EQ(*Quantity::Parse("2147483647")->DeviceCount(), Quantity::kMaxDeviceCount);
}

TEST(QuantityTest, DeviceCountRejectsFractionNamingTheValue) {
  StatusOr<int64_t> n = Quantity::Parse("500m")->DeviceCount();
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(n.status().message(), HasSubstr("\"500m\" is not a whole number"));
  EXPECT_FALSE(Quantity::Parse("1.5")->DeviceCount().ok());
  EXPECT_FALSE(Quantity::Parse("1n")->DeviceCount().ok());
}

TEST(QuantityTest, DeviceCountRejectsNegative) {
  StatusOr<int64_t> n = Quantity::Parse("-1")->DeviceCount();
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), HasSubstr("\"-1\" is negative"));
  EXPECT_THAT(Quantity::Parse("-500m")->DeviceCount().status().message(), HasSubstr("negative"));
}

TEST(QuantityTest, DeviceCountRejectsHuge) {
  StatusOr<int64_t> n = Quantity::Parse("3Gi")->DeviceCount();
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), HasSubstr("\"3Gi\" is too large for a device count"));
  EXPECT_FALSE(Quantity::Parse("2147483648")->DeviceCount().ok());
  EXPECT_FALSE(Quantity::Parse("7Ei")->DeviceCount().ok());
}

TEST(QuantityTest, PlusIsExactAndRefusesOverflow) {
  StatusOr<Quantity> sum = Quantity::Parse("1.5")->Plus(*Quantity::Parse("500m"));
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, Quantity::FromInt(2));
  EXPECT_EQ(sum->ToString(), "2");
  sum = Quantity::Parse("1")->Plus(*Quantity::Parse("250m"));
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->ToString(), "1.25");
  sum = Quantity::Parse("-2")->Plus(*Quantity::Parse("500m"));
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->ToString(), "-1.5");
  EXPECT_EQ(*sum, *Quantity::Parse("-1.5"));

  const Quantity max = *Quantity::Parse("9223372036854775807");
  StatusOr<Quantity> over = max.Plus(max);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(over.status().message(), HasSubstr("9223372036854775807"));
  EXPECT_FALSE(max.Plus(*Quantity::Parse("1n")).ok());
  EXPECT_TRUE(max.Plus(*Quantity::Parse("-1")).ok());
}

TEST(QuantityTest, CheckedAndSaturatingAdd) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(CheckedAdd(2, 3), 5);
  EXPECT_EQ(CheckedAdd(kMax, 1), std::nullopt);
  EXPECT_EQ(CheckedAdd(kMax, kMax), std::nullopt);  // 2 x (2^63 - 1)
  EXPECT_EQ(CheckedAdd(kMin, -1), std::nullopt);
  EXPECT_EQ(SaturatingAdd(kMax, kMax), kMax);
  EXPECT_EQ(SaturatingAdd(kMin, -5), kMin);
  EXPECT_EQ(SaturatingAdd(kMax, -1), kMax - 1);
  // Ten times 999999999999999999 does not fit; saturating stops at the top.
  int64_t sum = 0;
  for (int i = 0; i < 10; ++i) sum = SaturatingAdd(sum, 999999999999999999);
  EXPECT_EQ(sum, kMax);
}

}  // namespace
}  // namespace kdm::k8s
