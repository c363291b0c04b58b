#include "kdm/base/log_value.h"

#include <gtest/gtest.h>

#include <string>

namespace kdm {
namespace {

TEST(QuoteLogValueTest, PlainTextIsOnlyQuoted) {
  EXPECT_EQ(QuoteLogValue("nvidia.com/gpu"), "\"nvidia.com/gpu\"");
  EXPECT_EQ(QuoteLogValue(""), "\"\"");
}

TEST(QuoteLogValueTest, QuotesAndBackslashesAreEscaped) {
  EXPECT_EQ(QuoteLogValue("a\"b\\c"), "\"a\\\"b\\\\c\"");
}

TEST(QuoteLogValueTest, NewlinesCannotForgeASecondLogLine) {
  const std::string quoted = QuoteLogValue("x.sock\nevent=register_accepted\r\t");
  EXPECT_EQ(quoted, "\"x.sock\\nevent=register_accepted\\r\\t\"");
  EXPECT_EQ(quoted.find('\n'), std::string::npos);
}

TEST(QuoteLogValueTest, OtherControlBytesAndNulAreHexEscaped) {
  const std::string text("a\0b\x1b[31m\x7f", 9);
  EXPECT_EQ(QuoteLogValue(text), "\"a\\x00b\\x1b[31m\\x7f\"");
}

TEST(QuoteLogValueTest, Utf8IsKept) {
  EXPECT_EQ(QuoteLogValue("gpu-\xc3\xa9"), "\"gpu-\xc3\xa9\"");
}

TEST(QuoteLogValueTest, LongValuesAreCutAndTheRestCounted) {
  const std::string huge(1'000'000, 'a');
  const std::string quoted = QuoteLogValue(huge, 8);
  EXPECT_EQ(quoted, "\"aaaaaaaa\"...(+999992 bytes)");
  EXPECT_EQ(QuoteLogValue("abc", 3), "\"abc\"");
}

}  // namespace
}  // namespace kdm
