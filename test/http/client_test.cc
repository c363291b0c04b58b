// The HTTPS client's bounds, against a local listener that accepts and never
// speaks.
#include "kdm/http/client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "kdm/http/response_reader.h"

namespace kdm::http {
namespace {

// A listening socket on 127.0.0.1 with a port of the kernel's choice.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  uint16_t port() const { return port_; }
  // True when a connection waits to be accepted.
  bool HasPendingConnection() const {
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

std::unique_ptr<HttpsClient> ClientOf(const SilentListener& server) {
  StatusOr<std::unique_ptr<HttpsClient>> client =
      HttpsClient::Create({.host = "127.0.0.1",
                           .port = server.port(),
                           .server_name = "https://127.0.0.1",
                           .insecure_skip_tls_verify = true});
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Regression: a deadline that fired while a step's answer was already queued
// (the resolve of a numeric host) was lost: the next step opened a new
// socket and waited with no deadline left to end it (against this silent
// server, for ever). Whichever step the deadline meets, the call now ends
// with DEADLINE_EXCEEDED. A call still running after a generous bound is
// cancelled, so that the failure is reported rather than hung.
TEST(HttpsClientTest, RegressionADeadlineThatHasPassedEndsTheCall) {
  SilentListener server;
  std::unique_ptr<HttpsClient> client = ClientOf(server);
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 50; ++i) {
    Cancellation cancel;
    std::future<RoundTripResult> call = std::async(std::launch::async, [&] {
      return client->RoundTrip({.method = "GET", .target = "/"},
                               std::chrono::steady_clock::now() - std::chrono::seconds(1), &cancel);
    });
    if (call.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      cancel.Cancel();
      ADD_FAILURE() << "round " << i << ": a deadline that had passed did not end the call";
    }
    RoundTripResult r = call.get();
    ASSERT_FALSE(r.response.has_value());
    EXPECT_EQ(r.error.code(), StatusCode::kDeadlineExceeded) << r.error;
    EXPECT_FALSE(r.retryable);
  }
}

TEST(HttpsClientTest, ACancelBeforeTheCallStartsNoStep) {
  SilentListener server;
  std::unique_ptr<HttpsClient> client = ClientOf(server);
  ASSERT_NE(client, nullptr);
  Cancellation cancel;
  cancel.Cancel();
  RoundTripResult r =
      client->RoundTrip({.method = "GET", .target = "/"},
                        std::chrono::steady_clock::now() + std::chrono::seconds(30), &cancel);
  EXPECT_EQ(r.error.code(), StatusCode::kCancelled) << r.error;
  EXPECT_FALSE(server.HasPendingConnection());
}

// ResponseReader, fed bytes: what the client keeps of an answer (issue 28).
class ResponseReaderTest : public ::testing::Test {
 protected:
  // Feeds `bytes` in pieces of `piece`, then the end of the connection.
  ResponseReader::Progress Read(ResponseReader& reader, const std::string& bytes, size_t piece) {
    ResponseReader::Progress p = ResponseReader::Progress::kMore;
    for (size_t at = 0; at < bytes.size() && p == ResponseReader::Progress::kMore; at += piece) {
      p = reader.Feed(std::string_view(bytes).substr(at, piece));
    }
    return p == ResponseReader::Progress::kMore ? reader.FeedEnd() : p;
  }
  std::vector<std::string> lines_;
  std::function<bool(std::string_view)> on_line_ = [this](std::string_view l) {
    lines_.emplace_back(l);
    return true;
  };
};

TEST_F(ResponseReaderTest, ChunkedLinesSplitAnywhere) {
  const std::string answer =
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "6\r\n{\"a\":1\r\n4\r\n}\r\n{\r\n3\r\n}\nx\r\n0\r\n\r\n";
  for (size_t piece : {1u, 2u, 7u, 1000u}) {
    lines_.clear();
    ResponseReader reader({}, &on_line_);
    EXPECT_EQ(Read(reader, answer, piece), ResponseReader::Progress::kDone) << piece;
    EXPECT_TRUE(reader.streaming());
    EXPECT_EQ(lines_, (std::vector<std::string>{"{\"a\":1}", "{}", "x"})) << piece;
  }
}

TEST_F(ResponseReaderTest, ALineOverItsLimitFails) {
  ResponseReader reader({.max_line_bytes = 10}, &on_line_);
  EXPECT_EQ(Read(reader, "HTTP/1.1 200 OK\r\n\r\n0123456789\n0123456789A", 3),
            ResponseReader::Progress::kFailed);
  EXPECT_EQ(reader.error().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(lines_, std::vector<std::string>{"0123456789"});
}

TEST_F(ResponseReaderTest, AnErrorBodyIsCutAtItsLimitAndTheRestNotRead) {
  ResponseReader reader({.max_error_body_bytes = 8}, nullptr);
  const std::string answer =
      "HTTP/1.1 500 Internal Server Error\r\nRetry-After: 2\r\nContent-Length: 1000000\r\n\r\n"
      "[[],[],[],[]";
  EXPECT_EQ(reader.Feed(answer), ResponseReader::Progress::kDone);
  EXPECT_EQ(reader.status(), 500);
  EXPECT_EQ(reader.retry_after(), "2");
  EXPECT_TRUE(reader.body_truncated());
  EXPECT_EQ(reader.TakeBody(), "[[],[],[");
  // A body of exactly the limit is whole.
  ResponseReader exact({.max_error_body_bytes = 4}, nullptr);
  EXPECT_EQ(Read(exact, "HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nnope", 1),
            ResponseReader::Progress::kDone);
  EXPECT_FALSE(exact.body_truncated());
  EXPECT_EQ(exact.TakeBody(), "nope");
}

TEST_F(ResponseReaderTest, ADiscardedBodyIsNotRead) {
  ResponseReader reader({.discard_body = true}, nullptr);
  EXPECT_EQ(reader.Feed("HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\nxxxx"),
            ResponseReader::Progress::kDone);
  EXPECT_EQ(reader.status(), 200);
  EXPECT_EQ(reader.TakeBody(), "");
}

TEST_F(ResponseReaderTest, BadAnswersFail) {
  for (const std::string& bad :
       {std::string("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n"),
        std::string("not http\r\n\r\n"),
        "HTTP/1.1 200 OK\r\nX-Long: " + std::string(100'000, 'h') + "\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;" + std::string(100'000, 'e'),
        std::string("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"),
        std::string("HTTP/1.1 200 OK\r\nContent-")}) {
    ResponseReader reader({}, nullptr);
    EXPECT_EQ(Read(reader, bad, 4096), ResponseReader::Progress::kFailed) << bad.substr(0, 60);
    EXPECT_EQ(reader.error().code(), StatusCode::kUnavailable) << reader.error();
  }
  ResponseReader big({.max_body_bytes = 4}, nullptr);
  EXPECT_EQ(Read(big, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n12345", 2),
            ResponseReader::Progress::kFailed);
  EXPECT_EQ(big.error().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace kdm::http
