#include "kdm/http/response_reader.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstring>
#include <limits>

#include "kdm/http/asio_names.h"

namespace kdm::http {

using namespace asio_names;  // NOLINT(build/namespaces): http/'s own short names
using Progress = ResponseReader::Progress;

struct ResponseReader::Impl {
  Impl(Limits l, const std::function<bool(std::string_view)>* line_fn)
      : limits(l), on_line(line_fn) {
    parser.eager(true);
    parser.header_limit(static_cast<std::uint32_t>(kMaxPendingBytes));
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  }

  Progress Fail(Status s) {
    error = std::move(s);
    over = Progress::kFailed;
    return over;
  }

  Progress OnHeader() {
    status = static_cast<int>(parser.get().result_int());
    auto it = parser.get().find(bhttp::field::retry_after);
    if (it != parser.get().end()) retry_after = std::string(it->value());
    const bool ok = status / 100 == 2;
    streaming = ok && on_line != nullptr;
    if (ok && on_line == nullptr && limits.discard_body) return Progress::kDone;
    return Progress::kMore;
  }

  // One line (without '\n'), handed over unless empty.
  Progress Deliver(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) return Progress::kMore;
    return (*on_line)(line) ? Progress::kMore : Progress::kDone;
  }

  Progress TooLongLine() {
    return Fail(ResourceExhaustedError("a line of the stream is longer than " +
                                       std::to_string(limits.max_line_bytes) + " bytes"));
  }

  // Each byte is looked at once: only the new bytes are searched for '\n'.
  Progress OnLines(std::string_view data) {
    while (!data.empty()) {
      const void* nl = std::memchr(data.data(), '\n', data.size());
      const size_t end = nl == nullptr ? data.size() : static_cast<const char*>(nl) - data.data();
      if (line.size() + end > limits.max_line_bytes) return TooLongLine();
      if (nl == nullptr) {
        line.append(data);
        return Progress::kMore;
      }
      Progress p;
      if (line.empty()) {
        p = Deliver(data.substr(0, end));
      } else {
        line.append(data.substr(0, end));
        p = Deliver(line);
        line.clear();
      }
      if (p != Progress::kMore) return p;
      data.remove_prefix(end + 1);
    }
    return Progress::kMore;
  }

  Progress OnBody(std::string_view data) {
    if (streaming) return OnLines(data);
    if (status / 100 != 2) {
      // Truncated only once a byte past the limit came: a body of exactly
      // the limit is whole, however it was split.
      const uint64_t room = limits.max_error_body_bytes - body.size();
      if (data.size() > room) {
        body.append(data.substr(0, room));
        truncated = true;
        return Progress::kDone;
      }
      body.append(data);
      return Progress::kMore;
    }
    if (body.size() + data.size() > limits.max_body_bytes) {
      return Fail(ResourceExhaustedError("the answer is larger than " +
                                         std::to_string(limits.max_body_bytes) + " bytes"));
    }
    body.append(data);
    return Progress::kMore;
  }

  // The body ended as HTTP says.
  Progress OnEnd() {
    if (streaming && !line.empty()) {
      Progress p = Deliver(line);
      line.clear();
      if (p == Progress::kFailed) return p;
    }
    return Progress::kDone;
  }

  Progress Feed(std::string_view bytes) {
    if (over != Progress::kMore) return over;
    pending.append(bytes);
    size_t pos = 0;
    Progress p = Progress::kMore;
    char out[16 * 1024];
    while (p == Progress::kMore && !parser.is_done()) {
      parser.get().body().data = out;
      parser.get().body().size = sizeof out;
      beast::error_code ec;
      const size_t used =
          parser.put(net::const_buffer(pending.data() + pos, pending.size() - pos), ec);
      pos += used;
      const size_t n = sizeof out - parser.get().body().size;
      if (!header_seen && parser.is_header_done()) {
        header_seen = true;
        p = OnHeader();
      }
      if (p == Progress::kMore && n > 0) p = OnBody(std::string_view(out, n));
      if (p != Progress::kMore) break;
      if (ec == bhttp::error::need_buffer) continue;
      if (ec == bhttp::error::need_more) break;
      if (ec) return Fail(UnavailableError("not an HTTP answer: " + ec.message()));
      if (used == 0 && n == 0) break;
    }
    pending.erase(0, pos);
    if (p == Progress::kMore && parser.is_done()) p = OnEnd();
    if (p == Progress::kMore && pending.size() > kMaxPendingBytes) {
      return Fail(UnavailableError("not an HTTP answer: a header or chunk size line over " +
                                   std::to_string(kMaxPendingBytes) + " bytes"));
    }
    if (p != Progress::kMore && over == Progress::kMore) over = p;
    return p;
  }

  Progress FeedEnd() {
    if (over != Progress::kMore) return over;
    if (!parser.is_header_done()) {
      return Fail(UnavailableError("the connection ended before the answer's header"));
    }
    beast::error_code ec;
    parser.put_eof(ec);
    if (ec)
      return Fail(UnavailableError("the connection ended inside the answer: " + ec.message()));
    over = OnEnd();
    return over;
  }

  const Limits limits;
  const std::function<bool(std::string_view)>* const on_line;
  bhttp::response_parser<bhttp::buffer_body> parser;
  std::string pending;  // bytes the parser has not taken yet
  std::string line;     // the current partial line of a stream
  std::string body;
  std::string retry_after;
  Status error;
  int status = 0;
  bool header_seen = false;
  bool streaming = false;
  bool truncated = false;
  Progress over = Progress::kMore;
};

ResponseReader::ResponseReader(Limits limits, const std::function<bool(std::string_view)>* on_line)
    : impl_(std::make_unique<Impl>(limits, on_line)) {}
ResponseReader::~ResponseReader() = default;
Progress ResponseReader::Feed(std::string_view bytes) { return impl_->Feed(bytes); }
Progress ResponseReader::FeedEnd() { return impl_->FeedEnd(); }
bool ResponseReader::header_done() const { return impl_->header_seen; }
int ResponseReader::status() const { return impl_->status; }
const std::string& ResponseReader::retry_after() const { return impl_->retry_after; }
bool ResponseReader::streaming() const { return impl_->streaming; }
std::string ResponseReader::TakeBody() { return std::move(impl_->body); }
bool ResponseReader::body_truncated() const { return impl_->truncated; }
const Status& ResponseReader::error() const { return impl_->error; }

}  // namespace kdm::http
