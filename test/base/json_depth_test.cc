// kdm::FindJsonDepthViolation / FindJsonDeepSpans: brackets inside strings
// and escapes do not count; a 100,000-deep document is found in one pass.
#include "kdm/base/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace kdm {
namespace {

TEST(JsonDepthTest, CountsBracketsOutsideStringsOnly) {
  EXPECT_EQ(FindJsonDepthViolation(R"({"a":[1,{"b":2}]})", 3), std::nullopt);
  EXPECT_EQ(FindJsonDepthViolation(R"({"a":[1,{"b":2}]})", 2), 8u);
  EXPECT_EQ(FindJsonDepthViolation(R"({"a":"[[[{{{"})", 1), std::nullopt);
  // An escaped quote does not end the string; an escaped backslash does not
  // escape the quote after it.
  EXPECT_EQ(FindJsonDepthViolation(R"({"a":"\"[[["})", 1), std::nullopt);
  EXPECT_EQ(FindJsonDepthViolation(R"({"a":"\\",[[]]})", 2), 11u);
  EXPECT_EQ(FindJsonDepthViolation("", 1), std::nullopt);
  EXPECT_EQ(FindJsonDepthViolation("]]]]{", 1), std::nullopt);  // no underflow
}

TEST(JsonDepthTest, FindsAHundredThousandDeepNesting) {
  std::string deep =
      R"({"spec":{"podCIDRs":)" + std::string(100'000, '[') + std::string(100'000, ']') + "}}";
  EXPECT_EQ(FindJsonDepthViolation(deep, 64), 20u + 62u);
}

TEST(JsonDepthTest, DeepSpansAreTheValuesAtTheLevelThatGoTooDeep) {
  const std::string deep_item = R"({"m":)" + std::string(5, '[') + std::string(5, ']') + "}";
  const std::string body =
      R"({"items":[{"a":1},)" + deep_item + R"(,{"b":[2]},)" + deep_item + R"(],"x":"[[[[[[["})";
  std::vector<JsonDeepSpan> spans = FindJsonDeepSpans(body, 4, 3);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(body.substr(spans[0].begin, spans[0].end - spans[0].begin), deep_item);
  EXPECT_EQ(body.substr(spans[1].begin, spans[1].end - spans[1].begin), deep_item);
  EXPECT_EQ(body[spans[0].at], '[');
  EXPECT_EQ(spans[0].at, spans[0].begin + 6);  // {"m":[ is level 4, the next [ level 5
  // Never closed: runs to the end of the text.
  const std::string open = R"({"items":[{"m":[[[[[[)";
  spans = FindJsonDeepSpans(open, 4, 3);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].end, open.size());
  EXPECT_TRUE(FindJsonDeepSpans(R"({"items":[{"a":[[1]]}]})", 5, 3).empty());
}

}  // namespace
}  // namespace kdm
