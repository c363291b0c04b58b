// http::Server over real sockets: the handler's view of a request, keep-alive,
// and the connection policy toward bad clients (garbage, a huge header, a
// big body, a slow client, held connections), the budget of bodies in flight,
// the worker threads (a full queue, Stop during a long handler) and bad
// options.
#include "kdm/http/server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kdm/base/sync.h"
#include "kdm/test/sanitizer_bounds.h"
#include "kdm/test/wait_until.h"

namespace kdm::http {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A connected TCP socket to 127.0.0.1:port whose reads give up after 10 s
// (a bound, never a measurement); -1 on failure.
int ConnectToServer(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Everything the server sends until it closes (or the read bound passes).
std::string ReadUntilClosed(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// Sends `request` on a new connection and returns all that came back.
std::string RoundTripOverSocket(uint16_t port, const std::string& request) {
  int fd = ConnectToServer(port);
  if (fd < 0) return "connect failed";
  SendAll(fd, request);
  std::string out = ReadUntilClosed(fd);
  ::close(fd);
  return out;
}

std::string Get(const std::string& target) {
  return "GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(Server::Options options = {}) {
    auto s = Server::Start(std::move(options), [this](Request& r) {
      ++requests_;
      if (r.path() == "/echo") {
        return Response{.body = r.method + " " + r.target + " " + r.body};
      }
      if (r.path() == "/json") {
        return Response{.status = 201,
                        .content_type = "application/json",
                        .body = "{}",
                        .headers = {{"X-Kdm", "yes"}}};
      }
      return Response{.status = 404, .body = "no\n"};
    });
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ASSERT_GT(server_->port(), 0);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  uint16_t port() const { return server_->port(); }

  std::atomic<int> requests_{0};
  std::unique_ptr<Server> server_;
};

TEST_F(HttpServerTest, TheHandlerGetsMethodTargetAndBodyAndShapesTheAnswer) {
  StartServer({.server_header = "kdm-test"});
  std::string r = RoundTripOverSocket(
      port(),
      "POST /echo?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(r, HasSubstr("Server: kdm-test\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Type: text/plain; charset=utf-8\r\n"));
  EXPECT_THAT(r, HasSubstr("\r\n\r\nPOST /echo?a=1 hello"));
  r = RoundTripOverSocket(port(), Get("/json"));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 201 Created\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Type: application/json\r\n"));
  EXPECT_THAT(r, HasSubstr("X-Kdm: yes\r\n"));
}

TEST_F(HttpServerTest, KeepAliveAnswersSeveralRequestsOnOneConnection) {
  StartServer();
  std::string r = RoundTripOverSocket(
      port(),
      "GET /echo HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n" + Get("/echo"));
  size_t n = 0;
  for (size_t at = 0; (at = r.find("HTTP/1.1 200 OK", at)) != std::string::npos; ++at) ++n;
  EXPECT_EQ(n, 3u) << r;
}

TEST_F(HttpServerTest, GarbageGetsA400AndTheServerKeepsServing) {
  StartServer();
  std::string r =
      RoundTripOverSocket(port(), std::string("\x16\x03\x01\x02\x00garbage\r\n\r\n", 16));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(r, HasSubstr("malformed HTTP request"));
  EXPECT_THAT(RoundTripOverSocket(port(), "GET /echo HTTP/1.1\r\nHost x\r\n\r\n"),
              StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(RoundTripOverSocket(port(), Get("/echo")), StartsWith("HTTP/1.1 200 OK"));
  EXPECT_EQ(requests_.load(), 1);
}

TEST_F(HttpServerTest, AHugeHeaderGetsA431AndAHugeBodyA413) {
  StartServer({.max_header_bytes = 1024, .max_body_bytes = 100});
  std::string r = RoundTripOverSocket(port(), "GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " +
                                                  std::string(64 * 1024, 'a') + "\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
  EXPECT_THAT(r, HasSubstr("request header is larger than the limit of 1024 bytes"));
  r = RoundTripOverSocket(port(), "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n" +
                                      std::string(101, 'b'));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 413 Payload Too Large\r\n"));
  EXPECT_THAT(r, HasSubstr("request body is larger than the limit of 100 bytes"));
  // At the limit: served.
  r = RoundTripOverSocket(port(),
                          "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                          "Connection: close\r\n\r\n" +
                              std::string(100, 'c'));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK"));
  EXPECT_EQ(requests_.load(), 1);
}

TEST_F(HttpServerTest, TheRefusalHandlerShapesTheServersOwnAnswers) {
  StartServer({.max_body_bytes = 10, .refusal = [](int status, const std::string& message) {
                 return Response{
                     .status = 400,
                     .content_type = "application/json",
                     .body = "{\"Error\":\"" + std::to_string(status) + " " + message + "\"}"};
               }});
  std::string r = RoundTripOverSocket(
      port(), "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n01234567890");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Type: application/json\r\n"));
  EXPECT_THAT(r,
              HasSubstr("{\"Error\":\"413 request body is larger than the limit of 10 bytes\"}"));
}

TEST_F(HttpServerTest, ASlowClientIsClosedWhenItsRequestTimeoutPasses) {
  StartServer({.request_timeout = std::chrono::milliseconds(200)});
  // Half a header, then nothing: the server closes the connection without
  // an answer once the request's deadline passes.
  int fd = ConnectToServer(port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /echo HTTP/1.1\r\nHost: x\r\n"));
  char buf[64];
  EXPECT_EQ(::recv(fd, buf, sizeof buf, 0), 0);  // closed (the read bound is 10 s)
  ::close(fd);
  // An idle connection, never sending a byte, is closed the same way.
  fd = ConnectToServer(port());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::recv(fd, buf, sizeof buf, 0), 0);
  ::close(fd);
  EXPECT_THAT(RoundTripOverSocket(port(), Get("/echo")), StartsWith("HTTP/1.1 200 OK"));
  EXPECT_EQ(requests_.load(), 1);
}

TEST_F(HttpServerTest, HeldConnectionsAreClosedToAdmitNewOnes) {
  StartServer({.max_connections = 2});
  // Two connections held, one silent, one sending a header slowly.
  int silent = ConnectToServer(port());
  int slow = ConnectToServer(port());
  ASSERT_GE(silent, 0);
  ASSERT_GE(slow, 0);
  ASSERT_TRUE(SendAll(slow, "GET /echo HTTP/1.1\r\nHost: x\r\n"));
  // Each new client is answered: it closes the connection that waited longest.
  for (int i = 0; i < 5; ++i) {
    EXPECT_THAT(RoundTripOverSocket(port(), Get("/echo")), StartsWith("HTTP/1.1 200 OK")) << i;
  }
  char buf[64];
  EXPECT_EQ(::recv(silent, buf, sizeof buf, 0), 0);  // evicted first
  ::close(silent);
  ::close(slow);
}

TEST_F(HttpServerTest, StopIsIdempotentClosesHeldConnectionsAndThePort) {
  StartServer({.threads = 3});
  // A keep-alive connection, answered once, so the server holds it.
  int held = ConnectToServer(port());
  ASSERT_GE(held, 0);
  ASSERT_TRUE(SendAll(held, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string answer;
  char buf[256];
  while (answer.find("GET /echo ") == std::string::npos) {
    ssize_t n = ::recv(held, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << answer;
    answer.append(buf, static_cast<size_t>(n));
  }
  const uint16_t p = port();
  server_->Stop();
  server_->Stop();
  EXPECT_EQ(::recv(held, buf, sizeof buf, 0), 0);
  ::close(held);
  EXPECT_EQ(RoundTripOverSocket(p, Get("/echo")), "connect failed");
}

TEST_F(HttpServerTest, ConcurrentClientsAllGetTheirOwnAnswer) {
  StartServer({.threads = 4});
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 10; ++i) {
        const std::string body = std::to_string(c) + "-" + std::to_string(i);
        std::string r = RoundTripOverSocket(
            port(), "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body);
        if (r.find("POST /echo " + body) != std::string::npos) ++ok;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 60);
}

TEST(HttpServerStartTest, BadAddressesAndOptionsAreRefused) {
  auto handler = [](Request&) { return Response{}; };
  for (const char* bad : {"nonsense", "127.0.0.1:65536", "::1:80", "[::1]", ""}) {
    auto s = Server::Start({.listen = bad, .listen_name = "metrics address"}, handler);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.status().message()),
                HasSubstr(std::string("metrics address \"") + bad + "\""))
        << bad;
  }
  EXPECT_EQ(Server::Start({}, nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Server::Start({.threads = 0}, handler).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Server::Start({.max_connections = 0}, handler).status().code(),
            StatusCode::kInvalidArgument);
  auto tls = Server::Start({.tls_cert_pem = "garbage"}, handler);
  EXPECT_EQ(tls.status().code(), StatusCode::kInvalidArgument);
  tls = Server::Start({.tls_cert_pem = "garbage", .tls_key_pem = "garbage"}, handler);
  EXPECT_THAT(std::string(tls.status().message()), StartsWith("TLS certificate: "));
}

TEST(HttpServerStartTest, APortInUseOrAnUnknownHostIsUnavailableNamingTheAddress) {
  auto handler = [](Request&) { return Response{}; };
  auto first = Server::Start({}, handler);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = Server::Start({.listen = taken}, handler);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(taken));
  auto unknown = Server::Start({.listen = "no-such-host.invalid:0"}, handler);
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("no-such-host.invalid:0"));
  auto v6 = Server::Start({.listen = "[::1]:0"}, handler);
  if (v6.ok()) {  // hosts without IPv6 cannot bind it
    EXPECT_GT((*v6)->port(), 0);
  }
}

// Two bodies of 600 KiB under a budget of 1 MiB: while the first is being
// read, the second is refused with 503 + Retry-After before any of it is
// read; once the first is answered, its bytes are free again.
TEST(HttpServerBudgetTest, BodiesInFlightShareOneBudget) {
  std::atomic<int> busy{0};
  auto s =
      Server::Start({.max_body_bytes = 1 << 20,
                     .max_total_body_bytes = 1 << 20,
                     .on_busy =
                         [&](std::string_view reason) {
                           if (reason == "body_budget") ++busy;
                         }},
                    [](Request& r) { return Response{.body = std::to_string(r.body.size())}; });
  ASSERT_TRUE(s.ok()) << s.status();
  auto& server = *s;
  const std::string body(600 << 10, 'b');
  const std::string header =
      "POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  int first = ConnectToServer(server->port());
  ASSERT_GE(first, 0);
  ASSERT_TRUE(SendAll(first, header + body.substr(0, 1000)));
  // The second sends its whole body; the answer comes before it is read.
  std::string refused;
  ASSERT_TRUE(test::WaitUntil([&] {
    refused = RoundTripOverSocket(server->port(), header + body);
    return refused.find(" 503 ") != std::string::npos;
  })) << refused;
  EXPECT_THAT(refused, HasSubstr("Retry-After: 1"));
  EXPECT_THAT(refused, HasSubstr("in flight are at the budget of 1048576 bytes"));
  EXPECT_GE(busy.load(), 1);
  ASSERT_TRUE(SendAll(first, body.substr(1000)));
  EXPECT_THAT(ReadUntilClosed(first), HasSubstr("\r\n\r\n614400"));
  ::close(first);
  EXPECT_THAT(RoundTripOverSocket(server->port(), header + body), HasSubstr("\r\n\r\n614400"));
  server->Stop();
}

// One worker, one place in the queue: a third slow request is refused with
// 503 + Retry-After, while a request that is not offloaded is answered on
// the I/O thread meanwhile. Stop() calls on_stop, which ends the handler.
TEST(HttpServerWorkersTest, AFullQueueIs503AndStopEndsALongHandler) {
  std::atomic<bool> stopping{false};
  std::atomic<int> running{0}, queue_full{0};
  auto s =
      Server::Start({.offload = [](const Request& r) { return r.path() == "/slow"; },
                     .workers = 1,
                     .max_queued = 1,
                     .on_stop = [&] { stopping = true; },
                     .on_busy =
                         [&](std::string_view reason) {
                           if (reason == "queue_full") ++queue_full;
                         }},
                    [&](Request& r) {
                      if (r.path() != "/slow") return Response{.body = "fast"};
                      ++running;
                      // Until Stop(): a handler far longer than any test.
                      test::WaitUntil([&] { return stopping.load(); }, std::chrono::minutes(5));
                      return Response{.body = "slow"};
                    });
  ASSERT_TRUE(s.ok()) << s.status();
  auto& server = *s;
  int a = ConnectToServer(server->port());
  ASSERT_TRUE(SendAll(a, Get("/slow")));
  ASSERT_TRUE(test::WaitUntil([&] { return running.load() == 1; }));
  int b = ConnectToServer(server->port());
  ASSERT_TRUE(SendAll(b, Get("/slow")));  // waits in the queue
  std::string third;
  ASSERT_TRUE(test::WaitUntil([&] {
    third = RoundTripOverSocket(server->port(), Get("/slow"));
    return third.find(" 503 ") != std::string::npos;
  })) << third;
  EXPECT_THAT(third, HasSubstr("Retry-After: 1"));
  EXPECT_GE(queue_full.load(), 1);
  EXPECT_THAT(RoundTripOverSocket(server->port(), Get("/fast")), HasSubstr("\r\n\r\nfast"));
  const auto start = std::chrono::steady_clock::now();
  server->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::seconds(2 * ::kdm::test::kSanitizerTimeScale));
  EXPECT_EQ(running.load(), 1);  // the queued one never ran
  ::close(a);
  ::close(b);
}

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Connections pending while the process is out of fds (the soft limit
// lowered after the server started, so its cap of 64 does not help):
// accept fails with EMFILE; the server pauses instead of retrying at once.
// Before, the accept loop spun on EMFILE (a core).
TEST(HttpServerFdTest, AcceptOutOfFdsBacksOffInsteadOfSpinning) {
  auto s = Server::Start({}, [](Request&) { return Response{.body = "ok"}; });
  ASSERT_TRUE(s.ok()) << s.status();
  auto& server = *s;
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // The clients' sockets first, then no fd to spare: every accept fails.
  std::vector<int> clients;
  for (int i = 0; i < 20; ++i) clients.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  size_t open = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd");
       it != std::filesystem::directory_iterator(); ++it) {
    ++open;
  }
  rlimit low = saved;
  low.rlim_cur = open;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int connected = 0;
  for (int fd : clients) {
    connected += ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  const double before = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the idle time measured
  const double cpu = ProcessCpuSeconds() - before;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(connected, 20);
  EXPECT_LT(cpu, 0.3 * ::kdm::test::kSanitizerTimeScale);
  for (int fd : clients) ::close(fd);
  // Accepting again once fds are free.
  EXPECT_THAT(RoundTripOverSocket(server->port(), Get("/")), HasSubstr("\r\n\r\nok"));
  server->Stop();
}

}  // namespace
}  // namespace kdm::http
