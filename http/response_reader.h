// kdm::http::ResponseReader: reads one HTTP/1.1 answer from the bytes of a
// connection, fed as they arrive: status line, headers, a body with a
// Content-Length, chunked or up to the end of the connection. What is kept
// is bounded, whatever the server sends:
// - a 2xx body is kept whole up to Limits::max_body_bytes (more is
//   RESOURCE_EXHAUSTED), or not read at all with Limits::discard_body, or,
//   with `on_line`, handed over line by line (without '\n' or '\r'; empty
//   lines skipped), each line up to Limits::max_line_bytes (more is
//   RESOURCE_EXHAUSTED); each byte is searched for '\n' once;
// - a non-2xx body is kept up to Limits::max_error_body_bytes, then the
//   answer is done (body_truncated()): the rest is never read;
// - a header, or a chunk's size line, longer than kMaxPendingBytes is a
//   protocol error.
// HttpsClient feeds it from its socket; the fuzzer (fuzz/http_answer_fuzzer.cc)
// feeds it bytes.
//
// Thread-compatibility: one answer, one thread.
//
// Example:
//   ResponseReader reader({.max_body_bytes = 1 << 20}, nullptr);
//   ResponseReader::Progress p = reader.Feed(bytes);   // per read
//   if (end_of_connection) p = reader.FeedEnd();
//   if (p == ResponseReader::Progress::kDone) Use(reader.status(), reader.TakeBody());
#ifndef KDM_HTTP_RESPONSE_READER_H_
#define KDM_HTTP_RESPONSE_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kdm/base/status.h"

namespace kdm::http {

class ResponseReader {
 public:
  struct Limits {
    uint64_t max_body_bytes = 256ull << 20;
    uint64_t max_line_bytes = 8ull << 20;
    uint64_t max_error_body_bytes = 4096;
    bool discard_body = false;
  };
  // Unconsumed bytes kept while a header or a chunk size line is incomplete.
  static constexpr size_t kMaxPendingBytes = 64 * 1024;

  enum class Progress {
    kMore,    // feed more bytes
    kDone,    // the answer is read (as far as it will be)
    kFailed,  // error() says why
  };

  // `on_line`, when not null, takes a 2xx body line by line; returning
  // false ends the answer (kDone). Not owned; must outlive the reader.
  ResponseReader(Limits limits, const std::function<bool(std::string_view)>* on_line);
  ~ResponseReader();
  ResponseReader(const ResponseReader&) = delete;
  ResponseReader& operator=(const ResponseReader&) = delete;

  // The next bytes of the connection. After kDone or kFailed, nothing more
  // is read.
  Progress Feed(std::string_view bytes);
  // The connection ended: kDone when that ends the body (one without a
  // length), else kFailed.
  Progress FeedEnd();

  bool header_done() const;
  int status() const;                      // 0 before the header
  const std::string& retry_after() const;  // the Retry-After value, or ""
  // True once a 2xx header was read with `on_line`: the body is a stream.
  bool streaming() const;
  std::string TakeBody();
  bool body_truncated() const;
  // After kFailed: RESOURCE_EXHAUSTED (a limit above) or UNAVAILABLE (the
  // answer is not HTTP), naming what was wrong.
  const Status& error() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdm::http

#endif  // KDM_HTTP_RESPONSE_READER_H_
