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
#include <future>
#include <memory>

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

}  // namespace
}  // namespace kdm::http
