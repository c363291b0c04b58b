#include "kdm/conformance/report.h"

#include <algorithm>
#include <cstdio>

#include "kdm/base/env.h"

namespace kdm::conformance {

namespace {

std::string Seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

int Report::Count(Verdict verdict) const {
  return static_cast<int>(std::count_if(
      results.begin(), results.end(), [&](const CheckResult& r) { return r.verdict == verdict; }));
}

const CheckResult* Report::Find(std::string_view id) const {
  for (const CheckResult& r : results) {
    if (r.info.id == id) return &r;
  }
  return nullptr;
}

std::string SummaryLine(const Report& report) {
  return std::to_string(report.passed()) + " passed, " + std::to_string(report.failed()) +
         " failed, " + std::to_string(report.skipped()) + " skipped";
}

std::string RenderText(const Report& report) {
  size_t width = 0;
  for (const CheckResult& r : report.results) width = std::max(width, r.info.id.size());
  std::string out;
  for (const CheckResult& r : report.results) {
    out += VerdictName(r.verdict);
    out += "  ";
    out += r.info.id;
    out += std::string(width - r.info.id.size(), ' ');
    out += "  ";
    // One check, one line: a reason never breaks the line format.
    for (char c : r.reason) out += (c == '\n' || c == '\r') ? ' ' : c;
    out += '\n';
  }
  out += SummaryLine(report);
  out += '\n';
  return out;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += '?';
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string RenderJUnit(const Report& report) {
  std::chrono::milliseconds total{0};
  for (const CheckResult& r : report.results) total += r.duration;
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<testsuite name=\"kdm-conform\" tests=\"" + std::to_string(report.results.size()) +
         "\" failures=\"" + std::to_string(report.failed()) + "\" errors=\"0\" skipped=\"" +
         std::to_string(report.skipped()) + "\" time=\"" + Seconds(total) + "\">\n";
  for (const CheckResult& r : report.results) {
    out += "  <testcase classname=\"" + XmlEscape(CheckGroup(r.info.id)) + "\" name=\"" +
           XmlEscape(r.info.id) + "\" time=\"" + Seconds(r.duration) + "\"";
    if (r.verdict == Verdict::kPass) {
      out += "/>\n";
      continue;
    }
    out += ">\n";
    const char* tag = r.verdict == Verdict::kFail ? "failure" : "skipped";
    out += std::string("    <") + tag + " message=\"" + XmlEscape(r.reason) + "\"/>\n";
    out += "  </testcase>\n";
  }
  out += "</testsuite>\n";
  return out;
}

Status WriteFileAtomically(const std::string& path, std::string_view content, Env* env) {
  if (path.empty()) return InvalidArgumentError("the report path is empty");
  // A report is for everyone who may read the directory.
  return env->WriteFileAtomically(path, content,
                                  {.mode = 0644, .naming = TempFileNaming::kHiddenRandom});
}

}  // namespace kdm::conformance
