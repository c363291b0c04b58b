// Fuzz target: the HTTP answer reader of the API server client
// (http/response_reader.h): status line, headers, Content-Length, chunked
// and until-the-end bodies, fed as bytes. The first input byte picks the
// size of the pieces the rest is fed in; each input is read three ways: a
// kept body, a discarded one, and a stream of lines.
//
// Properties of every input:
// - a failure is RESOURCE_EXHAUSTED or UNAVAILABLE;
// - what is kept is within its limit: a 2xx body within max_body_bytes, a
//   non-2xx one within max_error_body_bytes (longer: body_truncated), each
//   line within max_line_bytes, non-empty, without '\n' or a final '\r';
//   with discard_body a 2xx body is empty;
// - a status, once the header is read, is in 100..999;
// - the outcome does not depend on how the bytes were split: fed whole and
//   fed in pieces, the progress, status, body and lines are the same when
//   both finished.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "kdm/http/response_reader.h"

namespace {

using kdm::http::ResponseReader;

struct Outcome {
  ResponseReader::Progress progress = ResponseReader::Progress::kMore;
  int status = 0;
  std::string body;
  bool truncated = false;
  std::vector<std::string> lines;
};

constexpr ResponseReader::Limits kLimits = {
    .max_body_bytes = 64 * 1024, .max_line_bytes = 4096, .max_error_body_bytes = 256};

Outcome Read(std::string_view bytes, size_t piece, bool lines, bool discard) {
  Outcome out;
  std::function<bool(std::string_view)> on_line = [&out](std::string_view line) {
    out.lines.emplace_back(line);
    return true;
  };
  ResponseReader::Limits limits = kLimits;
  limits.discard_body = discard;
  ResponseReader reader(limits, lines ? &on_line : nullptr);
  ResponseReader::Progress p = ResponseReader::Progress::kMore;
  for (size_t at = 0; at < bytes.size() && p == ResponseReader::Progress::kMore; at += piece) {
    p = reader.Feed(bytes.substr(at, piece));
  }
  if (p == ResponseReader::Progress::kMore) p = reader.FeedEnd();
  out.progress = p;
  out.status = reader.status();
  out.truncated = reader.body_truncated();
  if (p == ResponseReader::Progress::kFailed) {
    const kdm::StatusCode code = reader.error().code();
    FUZZ_CHECK(code == kdm::StatusCode::kResourceExhausted || code == kdm::StatusCode::kUnavailable,
               "failure code: " << reader.error());
  }
  if (reader.header_done()) {
    FUZZ_CHECK(out.status >= 100 && out.status <= 999, "status " << out.status);
  }
  out.body = reader.TakeBody();
  if (out.status / 100 == 2) {
    FUZZ_CHECK(out.body.size() <= kLimits.max_body_bytes, "body over its limit");
    if (discard && !lines) FUZZ_CHECK(out.body.empty(), "a discarded body was kept");
  } else {
    FUZZ_CHECK(out.body.size() <= kLimits.max_error_body_bytes, "error body over its limit");
  }
  for (const std::string& line : out.lines) {
    FUZZ_CHECK(!line.empty() && line.size() <= kLimits.max_line_bytes, "line size " << line.size());
    FUZZ_CHECK(line.find('\n') == std::string::npos && line.back() != '\r', "line ending kept");
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  for (const auto& [lines, discard] : {std::pair{false, false}, {false, true}, {true, false}}) {
    Outcome whole = Read(bytes, std::max<size_t>(bytes.size(), 1), lines, discard);
    Outcome pieces = Read(bytes, piece, lines, discard);
    if (whole.progress != ResponseReader::Progress::kDone ||
        pieces.progress != ResponseReader::Progress::kDone) {
      continue;
    }
    FUZZ_CHECK(whole.status == pieces.status, "status depends on the split");
    FUZZ_CHECK(whole.body == pieces.body, "body depends on the split");
    FUZZ_CHECK(whole.truncated == pieces.truncated, "truncation depends on the split");
    FUZZ_CHECK(whole.lines == pieces.lines, "lines depend on the split");
  }
  return 0;
}
