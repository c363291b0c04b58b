// Long waits say what they wait for (issue 30), every part a real process:
//   - `kdm plugin` with no agent logs `waiting for kubelet.sock at ...` once
//     at info (then at -v only) and registers once `kdm kubelet` starts;
//   - `kdm conform --root` says once what registration it waits for, and
//     for how long at most;
//   - `kdm extender --kubeconfig` against the in-tree test API server:
//     /readyz 503 with its reason until the LIST is answered, 200 after,
//     /livez 200 throughout, event=caches_synced once; a server that fails
//     every LIST is named in a warn line at once, not after the client's
//     retries;
//   - `kdm publish` logs its first write (event=first_publish with devices
//     and bytes) and later ones at info, rate-limited;
//   - `kdm extender` without --kubeconfig sent NodeNames warns once and
//     counts each request in kdm_extender_node_names_without_cache_total.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "kdm/base/sync.h"
#include "kdm/test/e2e/kubelet_fixture.h"
#include "kdm/test/kube/test_api_server.h"
#include "kdm/test/kube/test_pki.h"

namespace kdm::e2e::waits_test {

using ::testing::HasSubstr;

constexpr char kWaitsNode[] = "gpu-node-1";

// Occurrences of `needle` in `hay`.
size_t Occurrences(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

// An HTTP answer split: status code (0: no answer) and body.
struct Answer {
  int status = 0;
  std::string body;
};
Answer Split(const std::string& raw) {
  Answer a;
  if (raw.size() < 12 || raw.rfind("HTTP/1.1 ", 0) != 0) return a;
  a.status = std::stoi(raw.substr(9, 3));
  size_t end = raw.find("\r\n\r\n");
  if (end != std::string::npos) a.body = raw.substr(end + 4);
  return a;
}
Answer Get(int port, const std::string& path) { return Split(HttpGet(port, path)); }

// POST PATH with a JSON body to 127.0.0.1:PORT (Connection: close).
Answer Post(int port, const std::string& path, const std::string& body) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return {};
  }
  const std::string req = "POST " + path +
                          " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                          "Content-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  ::close(fd);
  return Split(out);
}

class WaitsE2eTest : public KubeletE2eTest {
 protected:
  void TearDown() override {
    for (Process* p : {extender_.get(), publish_.get()}) {
      if (p != nullptr) p->Signal(SIGTERM);
      if (p != nullptr) p->Wait();
    }
    if (HasFailure()) {
      if (extender_) std::cerr << "---- extender\n" << extender_->Err() << "\n";
      if (publish_) std::cerr << "---- publish\n" << publish_->Log() << "\n";
    }
    extender_.reset();
    publish_.reset();
    if (server_) server_->Stop();
    KubeletE2eTest::TearDown();
  }
  std::string Kubeconfig() const { return root_ + "/kubeconfig"; }

  // The test API server, reached through Kubeconfig().
  void StartApiServer() {
    auto pki = kube::test::MakeTestPki();
    ASSERT_TRUE(pki.ok()) << pki.status().message();
    auto s = kube::test::TestApiServer::Start(
        {.cert_pem = pki->server.cert_pem, .key_pem = pki->server.key_pem});
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    server_->SetHandler([this](const kube::test::RecordedRequest& r) { return Serve(r); });
    std::ofstream(root_ + "/ca.crt") << pki->ca.cert_pem;
    std::ofstream(Kubeconfig())
        << "apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: c\n  cluster:\n"
           "    server: "
        << server_->url() << "\n    certificate-authority: " << root_
        << "/ca.crt\ncontexts:\n- name: t\n  context: {cluster: c, user: u}\nusers:\n- name: u\n"
           "  user: {token: secret}\n";
  }

  // Nodes: LIST answered from node_list_ (a feed the test ends, or at once),
  // or 500 when refuse_node_list_; watches kept open. Pods: an empty LIST,
  // watches kept open. PATCH of a Node: recorded, 200.
  kube::test::Reply Serve(const kube::test::RecordedRequest& r) {
    MutexLock lock(&mu_);
    const bool watch = r.query.find("watch=1") != std::string::npos;
    if (r.method == "GET" && (r.path == "/api/v1/nodes" || r.path == "/api/v1/pods") && watch) {
      watches_.push_back(std::make_shared<kube::test::WatchFeed>());
      return {.feed = watches_.back()};
    }
    if (r.method == "GET" && r.path == "/api/v1/nodes") {
      ++node_lists_;
      if (refuse_node_list_) {
        return {.status = 500,
                .body = R"({"kind":"Status","code":500,"message":"etcd is on fire"})"};
      }
      if (node_list_) return {.feed = node_list_};
      return {.body = NodeList()};
    }
    if (r.method == "GET" && r.path == "/api/v1/pods") {
      return {.body = R"({"kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]})"};
    }
    if (r.method == "PATCH" && r.path == std::string("/api/v1/nodes/") + kWaitsNode) {
      json body = json::parse(r.body, nullptr, false);
      patches_.push_back(body.is_discarded()
                             ? std::string()
                             : body["metadata"]["annotations"].value("kdm.io/devices", ""));
      return {.body = R"({"kind":"Node","metadata":{"name":"gpu-node-1"}})"};
    }
    return {.status = 404, .body = R"({"kind":"Status","message":"not found"})"};
  }
  static std::string NodeList() {
    return R"({"kind":"NodeList","metadata":{"resourceVersion":"2"},"items":[{"kind":"Node",)"
           R"("metadata":{"name":"gpu-node-1","resourceVersion":"2"}}]})";
  }
  int NodeLists() {
    MutexLock lock(&mu_);
    return node_lists_;
  }
  std::vector<std::string> Patches() {
    MutexLock lock(&mu_);
    return patches_;
  }

  void StartExtender(std::vector<std::string> extra) {
    std::vector<std::string> args = {"extender", "--listen", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    extender_ = std::make_unique<Process>(args, root_ + "/extender.out", root_ + "/extender.err");
    std::smatch m;
    ASSERT_TRUE(WaitUntil(
        [&] {
          std::string err = extender_->Err();
          if (!std::regex_search(err, m,
                                 std::regex("listening on 127\\.0\\.0\\.1:([0-9]+)[^\n]*\n"))) {
            return false;
          }
          port_ = std::stoi(m[1]);
          return true;
        },
        kWaitBound))
        << extender_->Err();
  }

  Mutex mu_;
  std::shared_ptr<kube::test::WatchFeed> node_list_ ABSL_GUARDED_BY(mu_);
  bool refuse_node_list_ ABSL_GUARDED_BY(mu_) = false;
  int node_lists_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<kube::test::WatchFeed>> watches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> patches_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<kube::test::TestApiServer> server_;
  std::unique_ptr<Process> extender_;
  std::unique_ptr<Process> publish_;
  int port_ = 0;
};

// Was: a plugin started before its agent said nothing at all until it
// registered.
TEST_F(WaitsE2eTest, PluginWithoutAgentSaysOnceWhatItWaitsForThenRegisters) {
  Process& plugin = StartPlugin({"--resource", kFpga, "--count", "2", "-v", "1"});
  const std::string socket = root_ + "/device-plugins/kubelet.sock";
  ASSERT_TRUE(WaitUntil(
      [&] {
        return plugin.Log().find("waiting for kubelet.sock at " + socket) != std::string::npos;
      },
      kWaitBound))
      << plugin.Log();
  // Retries go on at -v (debug) only: wait for one, so "once" is tested
  // across retries.
  ASSERT_TRUE(WaitUntil(
      [&] { return plugin.Log().find(" D event=waiting_for_kubelet") != std::string::npos; },
      kWaitBound))
      << plugin.Log();
  StartKubelet();
  ASSERT_TRUE(WaitUntil([&] { return plugin.Log().find("event=registered") != std::string::npos; },
                        kWaitBound))
      << plugin.Log();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kFpga, 2); }, kWaitBound)) << kubelet_->Log();
  const std::string log = plugin.Log();
  EXPECT_EQ(Occurrences(log, " I event=waiting_for_kubelet"), 1u) << log;
  EXPECT_THAT(log, HasSubstr("socket=\"" + socket + "\""));
  EXPECT_GE(Occurrences(log, "event=registered"), 1u) << log;
}

// Was: silent (logged at warn and above only) until --timeout ran out.
TEST_F(WaitsE2eTest, ConformSaysOnceWhatRegistrationItWaitsForAndItsBound) {
  Process conform({"conform", "--root", root_, "--resource", kFpga, "--timeout", "300ms"},
                  root_ + "/conform.out", root_ + "/conform.err");
  EXPECT_EQ(conform.Wait(), 3) << conform.Err();
  const std::string err = conform.Err();
  EXPECT_EQ(Occurrences(err, "event=waiting_for_registration"), 1u) << err;
  EXPECT_THAT(err, HasSubstr(" I event=waiting_for_registration resource=\"example.com/fpga\""));
  EXPECT_THAT(err, HasSubstr("timeout=300ms"));
  EXPECT_THAT(err,
              HasSubstr("waiting up to 300ms for a plugin of example.com/fpga to register on " +
                        root_ + "/device-plugins/kubelet.sock"));
  EXPECT_THAT(err, HasSubstr("no plugin registered"));
}

// Was: /healthz "ok" with an empty cache, and no /readyz nor /livez.
TEST_F(WaitsE2eTest, ExtenderIsReadyOnlyOnceItsCachesHaveTheirFirstList) {
  {
    MutexLock lock(&mu_);
    node_list_ = std::make_shared<kube::test::WatchFeed>();
  }
  StartApiServer();
  StartExtender({"--kubeconfig", Kubeconfig()});
  std::shared_ptr<kube::test::WatchFeed> list;
  {
    MutexLock lock(&mu_);
    list = node_list_;
  }
  // The LIST is in flight and unanswered.
  ASSERT_TRUE(WaitUntil([&] { return list->attached(); }, kWaitBound)) << extender_->Err();
  Answer ready = Get(port_, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "node cache not synced");
  EXPECT_EQ(Get(port_, "/livez").status, 200);
  EXPECT_EQ(Get(port_, "/livez").body, "ok");
  EXPECT_EQ(Get(port_, "/healthz").status, 200);
  ASSERT_TRUE(WaitUntil(
      [&] { return extender_->Err().find("event=waiting_for_caches") != std::string::npos; },
      kWaitBound));
  EXPECT_THAT(extender_->Err(), HasSubstr("reason=\"node cache not synced\""));
  EXPECT_EQ(extender_->Err().find("event=caches_synced"), std::string::npos);

  list->Send(NodeList());
  list->End();
  ASSERT_TRUE(WaitUntil([&] { return Get(port_, "/readyz").status == 200; }, kWaitBound))
      << extender_->Err();
  EXPECT_EQ(Get(port_, "/readyz").body, "ok");
  EXPECT_EQ(Get(port_, "/livez").status, 200);
  ASSERT_TRUE(
      WaitUntil([&] { return extender_->Err().find("event=caches_synced") != std::string::npos; },
                kWaitBound));
  const std::string err = extender_->Err();
  EXPECT_THAT(err, HasSubstr("event=caches_synced nodes=1 pods=0"));
  EXPECT_EQ(Occurrences(err, "event=caches_synced"), 1u) << err;
  EXPECT_EQ(Occurrences(err, "event=waiting_for_caches"), 1u) << err;
  // Wrong method and unknown path still answer as before.
  EXPECT_EQ(Post(port_, "/readyz", "{}").status, 405);
}

// Was: the client retried the failing LIST for ~15 s (8 attempts) before
// the informer's first line.
TEST_F(WaitsE2eTest, ExtenderSaysAtOnceThatTheApiServerFailsItsList) {
  {
    MutexLock lock(&mu_);
    refuse_node_list_ = true;
  }
  StartApiServer();
  StartExtender({"--kubeconfig", Kubeconfig()});
  int lists_when_said = -1;
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::string err = extender_->Err();
        if (!std::regex_search(err,
                               std::regex(" W event=[a-z_]+ request=\"GET /api/v1/nodes\"[^\n]*"
                                          "500 Internal Server Error: etcd is on fire"))) {
          return false;
        }
        // Read after the line: at least the LISTs made before it.
        lists_when_said = NodeLists();
        return true;
      },
      kWaitBound))
      << extender_->Err();
  // Said after the first failed attempt (the next ones come 100 ms, 300 ms
  // ... later), long before the client's 8th, when it used to be said.
  EXPECT_LE(lists_when_said, 4);
  Answer ready = Get(port_, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "node cache not synced");
  EXPECT_EQ(Get(port_, "/livez").status, 200);
}

// Was: answered 0 / no opinion for every node without a word.
TEST_F(WaitsE2eTest, ExtenderWithoutNodeCacheWarnsOnceAndCountsNodeNames) {
  StartExtender({});
  // No caches to wait for: ready at once.
  EXPECT_EQ(Get(port_, "/readyz").status, 200);
  const std::string args =
      R"({"Pod":{"metadata":{"name":"big","namespace":"ml"},"spec":{"containers":[{"name":"main",)"
      R"("resources":{"limits":{"nvidia.com/gpu":"2"}}}]}},"NodeNames":["gpu-a","gpu-b"]})";
  for (const char* verb : {"/filter", "/filter", "/prioritize"}) {
    Answer a = Post(port_, verb, args);
    EXPECT_EQ(a.status, 200) << verb << " " << a.body;
  }
  ASSERT_TRUE(WaitUntil(
      [&] { return extender_->Err().find("event=node_names_without_cache") != std::string::npos; },
      kWaitBound));
  const std::string err = extender_->Err();
  EXPECT_EQ(Occurrences(err, "event=node_names_without_cache"), 1u) << err;
  EXPECT_THAT(err, HasSubstr(" W event=node_names_without_cache verb=filter nodes=2"));
  EXPECT_THAT(err, HasSubstr("give --kubeconfig or --in-cluster"));
  const std::string metrics = Get(port_, "/metrics").body;
  EXPECT_THAT(metrics, HasSubstr("kdm_extender_node_names_without_cache_total{verb=\"filter\"} 2"));
  EXPECT_THAT(metrics,
              HasSubstr("kdm_extender_node_names_without_cache_total{verb=\"prioritize\"} 1"));
  // A request with Nodes (not names only) is not counted.
  Answer a = Post(port_, "/filter",
                  R"({"Pod":{"metadata":{"name":"p"},"spec":{"containers":[]}},"Nodes":{"items":[)"
                  R"({"metadata":{"name":"gpu-a"}}]}})");
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_THAT(Get(port_, "/metrics").body,
              HasSubstr("kdm_extender_node_names_without_cache_total{verb=\"filter\"} 2"));
}

// Was: a successful write logged at -v only; nothing said the annotation
// was there at last.
TEST_F(WaitsE2eTest, PublishLogsItsFirstWriteAndLaterOnesRateLimited) {
  StartApiServer();
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();
  publish_ = std::make_unique<Process>(
      std::vector<std::string>{"publish", "--node-name", kWaitsNode, "--pod-resources-socket",
                               root_ + "/pod-resources/kubelet.sock", "--kubeconfig", Kubeconfig(),
                               "--interval", "20ms", "--min-write-interval", "20ms", "--resync",
                               "20ms"},
      root_ + "/publish.log");
  // Far more writes than the info lines allowed a minute (6).
  ASSERT_TRUE(WaitUntil([&] { return Patches().size() >= 20; }, kWaitBound)) << publish_->Log();
  const std::string log = publish_->Log();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      log, m,
      std::regex(" I event=first_publish node=\"gpu-node-1\" resources=1 devices=8 in_use=0 "
                 "bytes=([0-9]+)")))
      << log;
  EXPECT_EQ(std::stoul(m[1]), Patches().front().size());
  EXPECT_EQ(Occurrences(log, "event=first_publish"), 1u) << log;
  const size_t info_lines = Occurrences(log, " I event=publish_written");
  EXPECT_GE(info_lines, 1u) << log;
  EXPECT_LE(info_lines, 6u) << log;
  EXPECT_THAT(log, HasSubstr(" I event=publish_written node=\"gpu-node-1\" resources=1 devices=8"));
}

}  // namespace kdm::e2e::waits_test
