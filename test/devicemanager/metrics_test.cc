// Metrics and MetricsServer: the exposition's content, `promtool check
// metrics` on it, and scrapes (good and bad requests) over a real loopback
// socket.
#include "kdm/devicemanager/metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kdm/devicemanager/manager.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/test/devicemanager/test_pods.h"
#include "kdm/test/wait_until.h"

namespace kdm::devicemanager {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::MakePod;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kMetricsGpu[] = "example.com/gpu";

std::string MakeTempDir() {
  char tmpl[] = "/tmp/kdm-metrics-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return "";
  return tmpl;
}

// Runs `promtool check metrics` on `text`. Returns its exit status and output.
// Fails the test (does not skip) when promtool is missing.
std::pair<int, std::string> Promtool(const std::string& text) {
  const char* paths[] = {"/usr/bin/promtool", "/usr/local/bin/promtool"};
  std::string promtool;
  for (const char* p : paths) {
    if (::access(p, X_OK) == 0) promtool = p;
  }
  if (promtool.empty()) {
    ADD_FAILURE() << "promtool is not installed: install the Debian package `prometheus` "
                     "(./run deps does) to check the metrics exposition";
    return {-1, ""};
  }
  std::string dir = MakeTempDir();
  std::string in = dir + "/metrics.txt", out = dir + "/out.txt";
  std::ofstream(in) << text;
  std::string cmd = promtool + " check metrics < " + in + " > " + out + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream f(out);
  std::string output((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, output};
}

// A blocking loopback client: connects, sends `request`, reads until the
// server closes (or 10 s pass).
std::string Exchange(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "socket failed";
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "connect failed";
  }
  std::size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early on a bad request
    sent += static_cast<std::size_t>(n);
  }
  std::string response;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return response;
}

std::string Body(const std::string& response) {
  auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

std::string GetRequest(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
}

TEST(MetricsTest, RendersTheKubeletNamesAndKdmsOwn) {
  auto m = Metrics::Create();
  m->ObserveRegistration(kMetricsGpu);
  m->ObserveRegistration(kMetricsGpu);
  m->ObserveAllocation(kMetricsGpu, 0.02);
  m->ObserveAllocation(kMetricsGpu, 3.0);
  m->ObserveCheckpointWrite(0.0004);
  std::string text = m->Render(nullptr);
  EXPECT_THAT(text, HasSubstr("# TYPE kubelet_device_plugin_registration_total counter"));
  EXPECT_THAT(
      text,
      HasSubstr("kubelet_device_plugin_registration_total{resource_name=\"example.com/gpu\"} 2"));
  EXPECT_THAT(text, HasSubstr("# TYPE kubelet_device_plugin_alloc_duration_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="
                              "\"example.com/gpu\",le=\"0.025\"} 1"));
  EXPECT_THAT(text, HasSubstr("kubelet_device_plugin_alloc_duration_seconds_bucket{resource_name="
                              "\"example.com/gpu\",le=\"5\"} 2"));
  EXPECT_THAT(text, HasSubstr("kubelet_device_plugin_alloc_duration_seconds_count{resource_name="
                              "\"example.com/gpu\"} 2"));
  EXPECT_THAT(text, HasSubstr("# TYPE kdm_checkpoint_write_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("kdm_checkpoint_write_seconds_bucket{le=\"0.0005\"} 1"));
  EXPECT_THAT(text, HasSubstr("kdm_preferred_allocation_total{outcome=\"invalid\"} 0"));
  EXPECT_THAT(text, HasSubstr("kdm_device_resources{state=\"serving\"} 0"));
  auto [rc, out] = Promtool(text);
  EXPECT_EQ(rc, 0) << out << "\n--- exposition ---\n" << text;
}

// A real Manager with an SDK plugin: the kdm_* metrics follow its state.
class MetricsWithManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir();
    ASSERT_FALSE(root_.empty());
    Manager::Options mo;
    mo.plugin_dir = root_ + "/dp";
    mo.registration_timeout = 5s;
    mo.rpc_timeout = 5s;
    mo.metrics = wired_;
    // Pods of namespace "default" (every test's) may use the GPUs; others not.
    mo.restrictions = {{kMetricsGpu, {"default"}}};
    auto m = Manager::Create(std::move(mo));
    ASSERT_TRUE(m.ok()) << m.status();
    manager_ = std::move(*m);
    ASSERT_TRUE(manager_->Start().ok());

    plugin::PluginServer::Options o;
    o.resource_name = kMetricsGpu;
    o.plugin_dir = root_ + "/dp";
    o.devices = {{"gpu0", true, {0}}, {"gpu1", true, {0}}, {"gpu2", true, {1}}};
    o.allocate = [](const v1beta1::ContainerAllocateRequest&)
        -> StatusOr<v1beta1::ContainerAllocateResponse> {
      return v1beta1::ContainerAllocateResponse();
    };
    // Always answers a device that was not offered: kdm refuses the answer.
    o.get_preferred_allocation = [](const v1beta1::ContainerPreferredAllocationRequest&)
        -> StatusOr<v1beta1::ContainerPreferredAllocationResponse> {
      v1beta1::ContainerPreferredAllocationResponse r;
      r.add_deviceids("gpu-not-offered");
      return r;
    };
    o.register_backoff_initial = 10ms;
    auto p = plugin::PluginServer::Create(std::move(o));
    ASSERT_TRUE(p.ok()) << p.status();
    plugin_ = std::move(*p);
    ASSERT_TRUE(plugin_->Start().ok());
    ASSERT_TRUE(plugin_->WaitForRegistrationCount(1, 10s));
  }
  void TearDown() override {
    if (manager_) manager_->Stop();
    if (plugin_) plugin_->Stop();
    std::filesystem::remove_all(root_);
  }

  std::string root_;
  // Given to the Manager (Options::metrics): it reports into it.
  std::shared_ptr<Metrics> wired_ = Metrics::Create();
  std::unique_ptr<Manager> manager_;
  std::unique_ptr<plugin::PluginServer> plugin_;
};

TEST_F(MetricsWithManagerTest, TheManagerReportsRegistrationsAllocationsAndCheckpointWrites) {
  Pod pod = MakePod("uid-1", {{"main", {{kMetricsGpu, 2}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  std::string text = wired_->Render(manager_.get());
  EXPECT_THAT(
      text,
      HasSubstr("kubelet_device_plugin_registration_total{resource_name=\"example.com/gpu\"} 1"));
  EXPECT_THAT(text, HasSubstr("kubelet_device_plugin_alloc_duration_seconds_count{resource_name="
                              "\"example.com/gpu\"} 1"));
  // The allocation is one checkpoint transaction (the in-memory store).
  EXPECT_THAT(text, ::testing::ContainsRegex("kdm_checkpoint_write_seconds_count [1-9]"));
  auto [rc, out] = Promtool(text);
  EXPECT_EQ(rc, 0) << out << "\n--- exposition ---\n" << text;
}

TEST_F(MetricsWithManagerTest, KdmMetricsFollowTheManagersState) {
  Pod pod = MakePod("uid-1", {{"main", {{kMetricsGpu, 1}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());

  auto m = Metrics::Create();
  std::string text = m->Render(manager_.get());
  EXPECT_THAT(text,
              HasSubstr("kdm_resource_capacity_devices{resource_name=\"example.com/gpu\"} 3"));
  EXPECT_THAT(text,
              HasSubstr("kdm_resource_allocatable_devices{resource_name=\"example.com/gpu\"} 3"));
  EXPECT_THAT(text, HasSubstr("kdm_device_resources{state=\"serving\"} 1"));
  EXPECT_THAT(text, HasSubstr("kdm_registrations_total{result=\"accepted\"} 1"));
  EXPECT_THAT(text, HasSubstr("kdm_preferred_allocation_total{outcome=\"invalid\"} 1"));
  EXPECT_THAT(text, HasSubstr("kdm_preferred_allocation_total{outcome=\"ok\"} 0"));
  EXPECT_THAT(text, HasSubstr("kdm_allocations_total 1"));
  // Counters mirror, never double-count, across scrapes.
  text = m->Render(manager_.get());
  EXPECT_THAT(text, HasSubstr("kdm_preferred_allocation_total{outcome=\"invalid\"} 1"));
  EXPECT_THAT(text, HasSubstr("kdm_allocations_total 1"));
  auto [rc, out] = Promtool(text);
  EXPECT_EQ(rc, 0) << out << "\n--- exposition ---\n" << text;

  // The plugin goes away: its devices turn unhealthy for the grace period;
  // capacity stays, allocatable drops.
  std::mutex mu;
  std::condition_variable cv;
  int unhealthy = 0;
  int64_t id = manager_->Subscribe([&](const std::vector<DeviceHealthEvent>& events) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& e : events) unhealthy += e.healthy ? 0 : 1;
    cv.notify_all();
  });
  plugin_->Stop();
  bool arrived;
  {
    std::unique_lock<std::mutex> lock(mu);
    arrived = cv.wait_for(lock, 10s, [&] { return unhealthy == 3; });
  }
  // Unsubscribed before any assertion can return: the callback uses locals.
  manager_->Unsubscribe(id);
  ASSERT_TRUE(arrived);
  text = m->Render(manager_.get());
  EXPECT_THAT(text,
              HasSubstr("kdm_resource_allocatable_devices{resource_name=\"example.com/gpu\"} 0"));
  EXPECT_THAT(text, HasSubstr("kdm_device_resources{state=\"unhealthy\"} 1"));
}

TEST_F(MetricsWithManagerTest, RefusedSnapshotsAndRestrictedRejectionsAreCounted) {
  auto m = Metrics::Create();
  std::string text = m->Render(manager_.get());
  EXPECT_THAT(text, HasSubstr("# TYPE kdm_snapshots_refused_total counter"));
  EXPECT_THAT(text, HasSubstr("kdm_snapshots_refused_total 0"));
  EXPECT_THAT(text, HasSubstr("# TYPE kdm_restricted_rejections_total counter"));
  EXPECT_THAT(text, HasSubstr("kdm_restricted_rejections_total 0"));

  // A pod outside the allowed namespaces is refused before any reservation.
  Pod pod = MakePod("uid-2", {{"main", {{kMetricsGpu, 1}}}});
  pod.namespace_name = "guests";
  Status refused_pod = manager_->Allocate(pod, "main");
  EXPECT_EQ(refused_pod.code(), StatusCode::kPermissionDenied) << refused_pod;

  // A snapshot with a 254-byte device id is dropped; the old devices stay.
  plugin_->SetDevices({{"gpu0", true, {0}}, {std::string(254, 'x'), true, {0}}});
  ASSERT_TRUE(test::WaitUntil([&] { return manager_->GetStats().snapshots_refused == 1; }));

  text = m->Render(manager_.get());
  EXPECT_THAT(text, HasSubstr("kdm_snapshots_refused_total 1"));
  EXPECT_THAT(text, HasSubstr("kdm_restricted_rejections_total 1"));
  EXPECT_THAT(text,
              HasSubstr("kdm_resource_capacity_devices{resource_name=\"example.com/gpu\"} 3"));
  // Mirrored, not added up, across scrapes.
  text = m->Render(manager_.get());
  EXPECT_THAT(text, HasSubstr("kdm_snapshots_refused_total 1"));
  EXPECT_THAT(text, HasSubstr("kdm_restricted_rejections_total 1"));
  auto [rc, out] = Promtool(text);
  EXPECT_EQ(rc, 0) << out << "\n--- exposition ---\n" << text;
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metrics_ = Metrics::Create();
    metrics_->ObserveRegistration(kMetricsGpu);
    auto s = MetricsServer::Start("127.0.0.1:0", metrics_, nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ASSERT_GT(server_->port(), 0);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  std::shared_ptr<Metrics> metrics_;
  std::unique_ptr<MetricsServer> server_;
};

TEST_F(MetricsServerTest, ServesMetricsThatPromtoolAccepts) {
  std::string r = Exchange(server_->port(), GetRequest("/metrics"));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  std::string body = Body(r);
  EXPECT_THAT(
      body,
      HasSubstr("kubelet_device_plugin_registration_total{resource_name=\"example.com/gpu\"} 1"));
  auto [rc, out] = Promtool(body);
  EXPECT_EQ(rc, 0) << out << "\n--- exposition ---\n" << body;
}

TEST_F(MetricsServerTest, HealthzAnswersOk) {
  std::string r = Exchange(server_->port(), GetRequest("/healthz"));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(Body(r), "ok\n");
}

TEST_F(MetricsServerTest, UnknownPathIs404AndOtherMethodsAre405) {
  std::string r = Exchange(server_->port(), GetRequest("/nope"));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 404 Not Found\r\n"));
  EXPECT_THAT(Body(r), HasSubstr("/metrics"));
  r = Exchange(
      server_->port(),
      "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 405 Method Not Allowed\r\n"));
  EXPECT_THAT(r, HasSubstr("Allow: GET\r\n"));
}

TEST_F(MetricsServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  std::string two = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + GetRequest("/healthz");
  std::string r = Exchange(server_->port(), two);
  std::size_t first = r.find("HTTP/1.1 200 OK");
  ASSERT_NE(first, std::string::npos) << r;
  EXPECT_NE(r.find("HTTP/1.1 200 OK", first + 1), std::string::npos) << r;
}

TEST_F(MetricsServerTest, GarbageGetsA400AndTheServerKeepsServing) {
  std::string r = Exchange(server_->port(), std::string("\x16\x03\x01\x02\x00garbage\r\n\r\n", 16));
  EXPECT_THAT(r, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(Body(r), HasSubstr("malformed HTTP request"));
  r = Exchange(server_->port(), "GET /metrics HTTP/1.1\r\nHost x\r\n\r\n");  // bad header line
  EXPECT_THAT(r, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(Exchange(server_->port(), GetRequest("/healthz")), StartsWith("HTTP/1.1 200 OK"));
}

TEST_F(MetricsServerTest, OversizedHeadersGetA431AndABigBodyA413) {
  std::string big = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(64 * 1024, 'a') +
                    "\r\nConnection: close\r\n\r\n";
  std::string r = Exchange(server_->port(), big);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
  std::string body(1 << 20, 'b');
  r = Exchange(server_->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                                    std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 413 Payload Too Large\r\n"));
  EXPECT_THAT(Exchange(server_->port(), GetRequest("/healthz")), StartsWith("HTTP/1.1 200 OK"));
}

TEST_F(MetricsServerTest, ATruncatedRequestIsDroppedWithoutHarm) {
  // The client sends half a request and closes its side.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string half = "GET /metr";
  ASSERT_EQ(::send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
  ::shutdown(fd, SHUT_WR);
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  ::close(fd);
  if (n > 0) {
    EXPECT_THAT(std::string(buf, static_cast<std::size_t>(n)), StartsWith("HTTP/1.1 400"));
  }
  EXPECT_THAT(Exchange(server_->port(), GetRequest("/healthz")), StartsWith("HTTP/1.1 200 OK"));
}

TEST_F(MetricsServerTest, ConcurrentScrapesAllSucceed) {
  // Observations race with scrapes from several clients.
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        metrics_->ObserveAllocation(kMetricsGpu, 0.001 * (t + 1));
        std::string r = Exchange(server_->port(), GetRequest(i % 2 ? "/metrics" : "/healthz"));
        if (r.rfind("HTTP/1.1 200 OK\r\n", 0) == 0) ok++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 60);
  EXPECT_THAT(metrics_->Render(nullptr), HasSubstr("kubelet_device_plugin_alloc_duration_seconds_"
                                                   "count{resource_name=\"example.com/gpu\"} 60"));
}

TEST_F(MetricsServerTest, StopIsIdempotentAndClosesThePort) {
  int port = server_->port();
  server_->Stop();
  server_->Stop();
  EXPECT_EQ(Exchange(port, GetRequest("/healthz")), "connect failed");
}

TEST(MetricsServerStartTest, BadAddressesAreRefusedWithClearErrors) {
  auto m = Metrics::Create();
  for (const char* bad :
       {"nonsense", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:9x", "[::1", "[::1]", "::1:80"}) {
    auto s = MetricsServer::Start(bad, m, nullptr);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr(std::string("\"") + bad + "\"")) << bad;
  }
  auto s = MetricsServer::Start("127.0.0.1:0", nullptr, nullptr);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  s = MetricsServer::Start("no-such-host.invalid:0", m, nullptr);
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(s.status().message(), HasSubstr("no-such-host.invalid:0"));
}

TEST(MetricsServerStartTest, APortInUseIsUnavailableNamingTheAddress) {
  auto m = Metrics::Create();
  auto first = MetricsServer::Start("127.0.0.1:0", m, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  std::string addr = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = MetricsServer::Start(addr, m, nullptr);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(addr));
  auto v6 = MetricsServer::Start("[::1]:0", m, nullptr);
  if (v6.ok()) {
    EXPECT_GT((*v6)->port(), 0);
  }
}

}  // namespace
}  // namespace kdm::devicemanager
