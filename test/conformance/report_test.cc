// Report rendering of kdm::conformance: the text lines and summary, JUnit
// XML with escaping, the atomic file write.
#include "kdm/conformance/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace kdm::conformance {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

CheckResult Result(const std::string& id, Verdict v, const std::string& reason, int ms = 0) {
  const CheckInfo* info = FindCheck(id);
  return CheckResult{info ? *info : CheckInfo{id, "", ""}, v, reason,
                     std::chrono::milliseconds(ms)};
}

Report Sample() {
  Report r;
  r.results.push_back(Result("reg.version", Verdict::kPass, "version \"v1beta1\"", 1));
  r.results.push_back(
      Result("alloc.permissions", Verdict::kFail, "permissions \"rwx\" hold \"x\"", 12));
  r.results.push_back(Result("pref.size", Verdict::kSkip, "not offered", 0));
  return r;
}

size_t CountOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

TEST(ReportTest, Counts) {
  Report r = Sample();
  EXPECT_EQ(r.passed(), 1);
  EXPECT_EQ(r.failed(), 1);
  EXPECT_EQ(r.skipped(), 1);
  EXPECT_EQ(SummaryLine(r), "1 passed, 1 failed, 1 skipped");
  ASSERT_NE(r.Find("pref.size"), nullptr);
  EXPECT_EQ(r.Find("pref.size")->verdict, Verdict::kSkip);
  EXPECT_EQ(r.Find("lw.ids"), nullptr);
  EXPECT_EQ(SummaryLine(Report{}), "0 passed, 0 failed, 0 skipped");
}

TEST(ReportTest, TextHasOneLinePerCheckVerdictFirstThenSummary) {
  std::string text = RenderText(Sample());
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u) << text;
  EXPECT_TRUE(std::regex_match(lines[0], std::regex(R"(PASS  reg\.version +version "v1beta1")")))
      << lines[0];
  EXPECT_TRUE(std::regex_match(lines[1], std::regex(R"(FAIL  alloc\.permissions  permissions.*)")))
      << lines[1];
  EXPECT_TRUE(std::regex_match(lines[2], std::regex(R"(SKIP  pref\.size +not offered)")))
      << lines[2];
  EXPECT_EQ(lines[3], "1 passed, 1 failed, 1 skipped");
  // Reasons start in one column.
  EXPECT_EQ(lines[0].find("version \"v1beta1"), lines[2].find("not offered"));
}

TEST(ReportTest, TextKeepsAReasonWithNewlinesOnOneLine) {
  Report r;
  r.results.push_back(Result("lw.ids", Verdict::kFail, "first\nsecond\rthird"));
  EXPECT_EQ(RenderText(r), "FAIL  lw.ids  first second third\n0 passed, 1 failed, 0 skipped\n");
}

TEST(ReportTest, JUnitShape) {
  std::string xml = RenderJUnit(Sample());
  EXPECT_THAT(xml, HasSubstr("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"));
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"kdm-conform\" tests=\"3\" failures=\"1\" "
                             "errors=\"0\" skipped=\"1\" time=\"0.013\">"));
  EXPECT_EQ(CountOf(xml, "<testcase "), 3u);
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"reg\" name=\"reg.version\" time=\"0.001\"/>"));
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"alloc\" name=\"alloc.permissions\" "
                             "time=\"0.012\">\n    <failure message=\"permissions "
                             "&quot;rwx&quot; hold &quot;x&quot;\"/>\n  </testcase>"));
  EXPECT_THAT(xml, HasSubstr("<skipped message=\"not offered\"/>"));
  EXPECT_EQ(CountOf(xml, "<failure"), 1u);
  EXPECT_EQ(CountOf(xml, "<skipped"), 1u);
  EXPECT_THAT(xml, HasSubstr("</testsuite>\n"));
}

TEST(ReportTest, JUnitEscapesEverythingMarkupCouldBreakOn) {
  Report r;
  r.results.push_back(
      Result("alloc.env-names", Verdict::kFail, "env <\"1 BAD=NAME\"> & 'x'\x01\x1f\ttab"));
  std::string xml = RenderJUnit(r);
  EXPECT_THAT(xml, HasSubstr("message=\"env &lt;&quot;1 BAD=NAME&quot;&gt; &amp; "
                             "&apos;x&apos;??\ttab\""));
  EXPECT_THAT(xml, Not(HasSubstr("\x01")));
  EXPECT_EQ(XmlEscape("a&b"), "a&amp;b");
  EXPECT_EQ(XmlEscape(""), "");
  EXPECT_EQ(XmlEscape("&&"), "&amp;&amp;");
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kdm-rep-XXXXXX";
    path_ = ::mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ReportTest, WriteFileAtomicallyReplacesAndLeavesNoTemporary) {
  TempDir dir;
  std::string path = dir.path() + "/junit.xml";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "new content").ok());
  EXPECT_EQ(Slurp(path), "new content");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(ReportTest, WriteFileAtomicallyNamesTheUnwritablePath) {
  Status s = WriteFileAtomically("/nonexistent-kdm-dir/sub/junit.xml", "x");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent-kdm-dir/sub/junit.xml"));
  EXPECT_FALSE(WriteFileAtomically("", "x").ok());
  TempDir dir;
  // A directory in the way: the rename fails, the temporary is cleaned up.
  std::filesystem::create_directory(dir.path() + "/taken");
  std::filesystem::create_directory(dir.path() + "/taken/inside");
  s = WriteFileAtomically(dir.path() + "/taken", "x");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir.path() + "/taken"));
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

}  // namespace
}  // namespace kdm::conformance
