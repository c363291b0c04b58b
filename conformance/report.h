// kdm::conformance::Report: the outcome of one `kdm conform` run, and its two
// renderings: text for people (stdout) and JUnit XML for CI.
//
// Text: one line per check, verdict word first, then the id, then the
// reason ("PASS  reg.version        version \"v1beta1\""), then the summary
// line exactly "N passed, M failed, K skipped".
// JUnit: one <testsuite name="kdm-conform">, one <testcase> per check with
// classname = the id's group ("reg"), name = the id, time in seconds, and a
// <failure message=...> or <skipped message=...> child; every attribute and
// text is XML-escaped.
//
// Thread-safety: values and pure functions.
//
// Example:
//   std::cout << RenderText(report);
//   KDM_RETURN_IF_ERROR(WriteFileAtomically(path, RenderJUnit(report)));
#ifndef KDM_CONFORMANCE_REPORT_H_
#define KDM_CONFORMANCE_REPORT_H_

#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/base/status.h"
#include "kdm/conformance/check.h"

namespace kdm::conformance {

struct Report {
  // In the order the checks ran (the catalogue's order).
  std::vector<CheckResult> results;

  int passed() const { return Count(Verdict::kPass); }
  int failed() const { return Count(Verdict::kFail); }
  int skipped() const { return Count(Verdict::kSkip); }
  int Count(Verdict verdict) const;
  // The result of the check with this id, or nullptr when it did not run.
  const CheckResult* Find(std::string_view id) const;
};

// "N passed, M failed, K skipped".
std::string SummaryLine(const Report& report);

// Every check's line, then the summary line; each line ends with '\n'.
std::string RenderText(const Report& report);

// The JUnit XML document (UTF-8, with an XML declaration).
std::string RenderJUnit(const Report& report);

// Escapes &, <, >, " and ' for XML text and attributes; control characters
// other than tab, newline and carriage return (not allowed in XML 1.0) become
// '?'.
std::string XmlEscape(std::string_view text);

// Writes `content` to `path` (mode 0644) with Env::WriteFileAtomically: a
// temporary file in the same directory, fsync, rename, directory fsync, so a
// reader sees the old file or the whole new one, even after a crash. Errors
// name the path and the reason; codes follow the errno policy (ErrnoToStatus).
Status WriteFileAtomically(const std::string& path, std::string_view content,
                           Env* env = Env::Default());

}  // namespace kdm::conformance

#endif  // KDM_CONFORMANCE_REPORT_H_
