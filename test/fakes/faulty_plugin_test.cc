// The deliberately broken plugins (kdm::fakes::FaultyPlugin) over real unix
// sockets: for every fault, a raw v1beta1 client (or the small fake kubelet of
// test/pluginapi where registration matters) sees the wrong behaviour; where
// a fault does not apply the plugin answers like the healthy one; Stop ends
// every held call.
#include "kdm/fakes/faulty_plugin.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kdm/test/pluginapi/fake_registration_server.h"
#include "kdm/test/wait_until.h"

namespace kdm::fakes {
namespace {

using kdm::test::WaitUntil;
using kdm::testing::FakeRegistrationServer;
using kdm::testing::TempSocketDir;
using namespace std::chrono_literals;

constexpr char kResource[] = "example.com/gpu";
// Upper bound of every wait and RPC; a healthy run never comes close.
constexpr auto kBound = 10s;

// Four generic devices gpu-0 ... gpu-3, no NUMA, packed preferred policy.
PluginConfig Config(const std::string& dir, bool register_with_kubelet = false) {
  PluginConfig c;
  c.resource_name = kResource;
  c.plugin_dir = dir;
  c.count = 4;
  c.register_with_kubelet = register_with_kubelet;
  c.register_backoff_initial = 10ms;
  c.register_backoff_max = 50ms;
  c.watch_interval = 20ms;
  return c;
}

std::unique_ptr<FaultyPlugin> MustStart(PluginConfig c, const std::string& fault) {
  auto p = FaultyPlugin::Create(std::move(c), fault);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  Status s = (*p)->Start();
  EXPECT_TRUE(s.ok()) << s;
  return std::move(*p);
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> DialFaulty(const std::string& socket) {
  return v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
}

void Bound(grpc::ClientContext& ctx, std::chrono::milliseconds d = kBound) {
  ctx.set_deadline(std::chrono::system_clock::now() + d);
}

template <typename Repeated>
std::vector<std::string> FaultyStrings(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

std::vector<std::string> Ids(const v1beta1::ListAndWatchResponse& r) {
  std::vector<std::string> ids;
  for (const auto& d : r.devices()) ids.push_back(d.id());
  return ids;
}

const std::vector<std::string> kAllIds = {"gpu-0", "gpu-1", "gpu-2", "gpu-3"};

// A faulty plugin serving in a private directory, dialled by a raw client.
class Served {
 public:
  explicit Served(const std::string& fault, std::function<void(PluginConfig&)> tweak = nullptr) {
    PluginConfig c = Config(dir_.path());
    if (tweak) tweak(c);
    plugin_ = MustStart(std::move(c), fault);
    if (plugin_) stub_ = DialFaulty(plugin_->SocketPath());
  }
  ~Served() {
    if (plugin_) plugin_->Stop();
  }

  bool ok() const { return plugin_ != nullptr; }
  FaultyPlugin& plugin() { return *plugin_; }
  v1beta1::DevicePlugin::Stub& stub() { return *stub_; }
  const std::string& dir() const { return dir_.path(); }

  grpc::Status Allocate(const std::vector<std::string>& ids, v1beta1::AllocateResponse* out) {
    v1beta1::AllocateRequest req;
    auto* c = req.add_container_requests();
    for (const auto& id : ids) c->add_devices_ids(id);
    grpc::ClientContext ctx;
    Bound(ctx);
    return stub_->Allocate(&ctx, req, out);
  }

  grpc::Status Preferred(const std::vector<std::string>& available,
                         const std::vector<std::string>& must, int size,
                         v1beta1::PreferredAllocationResponse* out,
                         std::chrono::milliseconds deadline = kBound) {
    grpc::ClientContext ctx;
    Bound(ctx, deadline);
    return stub_->GetPreferredAllocation(&ctx, PreferredRequest(available, must, size), out);
  }

  v1beta1::DevicePluginOptions Options() {
    grpc::ClientContext ctx;
    Bound(ctx);
    v1beta1::DevicePluginOptions o;
    grpc::Status s = stub_->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &o);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return o;
  }

  // The first `n` messages of a fresh ListAndWatch stream (fewer if it ends).
  std::vector<v1beta1::ListAndWatchResponse> Watch(size_t n) {
    grpc::ClientContext ctx;
    Bound(ctx);
    auto stream = stub_->ListAndWatch(&ctx, v1beta1::Empty());
    std::vector<v1beta1::ListAndWatchResponse> out;
    v1beta1::ListAndWatchResponse msg;
    while (out.size() < n && stream->Read(&msg)) out.push_back(msg);
    ctx.TryCancel();
    stream->Finish();
    return out;
  }

  static v1beta1::PreferredAllocationRequest PreferredRequest(
      const std::vector<std::string>& available, const std::vector<std::string>& must, int size) {
    v1beta1::PreferredAllocationRequest req;
    auto* c = req.add_container_requests();
    for (const auto& id : available) c->add_available_deviceids(id);
    for (const auto& id : must) c->add_must_include_deviceids(id);
    c->set_allocation_size(size);
    return req;
  }

 private:
  TempSocketDir dir_;
  std::unique_ptr<FaultyPlugin> plugin_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

// A faulty plugin registered with the fake kubelet in a private directory.
class Registered {
 public:
  explicit Registered(const std::string& fault) : kubelet_(dir_.path()) {
    EXPECT_TRUE(kubelet_.Start());
    plugin_ = MustStart(Config(dir_.path(), /*register_with_kubelet=*/true), fault);
  }
  ~Registered() {
    if (plugin_) plugin_->Stop();
    kubelet_.Stop();
  }
  bool ok() const { return plugin_ != nullptr; }
  FaultyPlugin& plugin() { return *plugin_; }
  FakeRegistrationServer& kubelet() { return kubelet_; }

  // Waits (bounded) until the kubelet has recorded `n` Register requests.
  std::vector<v1beta1::RegisterRequest> WaitForRequests(size_t n) {
    std::vector<v1beta1::RegisterRequest> r;
    // Polls a recorder with no notification.
    WaitUntil(
        [&] {
          r = kubelet_.Requests();
          return r.size() >= n;
        },
        kBound);
    return r;
  }

 private:
  TempSocketDir dir_;
  FakeRegistrationServer kubelet_;
  std::unique_ptr<FaultyPlugin> plugin_;
};

// --- names ----------------------------------------------------------------

TEST(FaultyPluginTest, FaultNamesAreTheCataloguesInOrder) {
  const std::vector<std::string> expected = {"reg-bad-version",
                                             "reg-bad-resource-name",
                                             "reg-endpoint-path",
                                             "reg-options-mismatch",
                                             "lw-no-snapshot",
                                             "lw-duplicate-ids",
                                             "lw-bad-health",
                                             "lw-negative-numa",
                                             "health-not-sent",
                                             "lw-delta-updates",
                                             "alloc-two-responses",
                                             "alloc-accept-unknown",
                                             "alloc-relative-path",
                                             "alloc-bad-permissions",
                                             "alloc-bad-env",
                                             "alloc-bad-cdi",
                                             "alloc-not-concurrent",
                                             "pref-wrong-size",
                                             "pref-not-subset",
                                             "pref-drop-must-include",
                                             "pref-duplicates",
                                             "pref-random",
                                             "pref-slow",
                                             "prestart-unimplemented",
                                             "lw-drop-breaks",
                                             "health-stale-streams",
                                             "no-reregister"};
  EXPECT_EQ(FaultNames(), expected);
  for (const std::string& name : FaultNames()) EXPECT_TRUE(CheckFaultName(name).ok()) << name;
}

TEST(FaultyPluginTest, UnknownFaultNameIsInvalidAndListsTheKnownOnes) {
  for (const std::string& bad :
       std::vector<std::string>{"nope", "", "PREF-SLOW", "pref-slow ", "pref", "../reg-bad-version",
                                std::string("pref-slow\0x", 11), std::string(10'000, 'a')}) {
    Status s = CheckFaultName(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("unknown fault"), std::string::npos) << s;
    EXPECT_NE(s.message().find("reg-bad-version"), std::string::npos) << s;
    EXPECT_NE(s.message().find("no-reregister"), std::string::npos) << s;
    EXPECT_LT(s.message().size(), 1000u) << "a huge name is cut";
  }
  TempSocketDir dir;
  auto p = FaultyPlugin::Create(Config(dir.path()), "nope");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("\"nope\""), std::string::npos) << p.status();
}

TEST(FaultyPluginTest, CreateRejectsBadConfigsLikeTheHealthyPlugin) {
  TempSocketDir dir;
  PluginConfig no_source = Config(dir.path());
  no_source.count.reset();
  EXPECT_EQ(FaultyPlugin::Create(no_source, "pref-slow").status().code(),
            StatusCode::kInvalidArgument);
  PluginConfig bad_name = Config(dir.path());
  bad_name.resource_name = "gpu";
  EXPECT_EQ(FaultyPlugin::Create(bad_name, "pref-slow").status().code(),
            StatusCode::kInvalidArgument);
  PluginConfig long_dir = Config(dir.path() + "/" + std::string(200, 'd'));
  EXPECT_EQ(FaultyPlugin::Create(long_dir, "pref-slow").status().code(),
            StatusCode::kInvalidArgument);
}

// --- lifecycle --------------------------------------------------------------

TEST(FaultyPluginTest, StopIsIdempotentAndStartTwiceFails) {
  TempSocketDir dir;
  auto never_started = FaultyPlugin::Create(Config(dir.path()), "alloc-bad-env");
  ASSERT_TRUE(never_started.ok());
  (*never_started)->Stop();
  (*never_started)->Stop();
  Status after_stop = (*never_started)->Start();
  EXPECT_EQ(after_stop.code(), StatusCode::kFailedPrecondition) << after_stop;

  auto p = MustStart(Config(dir.path()), "lw-bad-health");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->fault(), "lw-bad-health");
  Status again = p->Start();
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again;
  struct stat st;
  ASSERT_EQ(::lstat(p->SocketPath().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  p->Stop();
  EXPECT_NE(::lstat(p->SocketPath().c_str(), &st), 0) << "socket left behind";
  p->Stop();
}

TEST(FaultyPluginTest, StartInMissingDirectoryFails) {
  TempSocketDir dir;
  auto p = FaultyPlugin::Create(Config(dir.path() + "/missing"), "pref-slow");
  ASSERT_TRUE(p.ok());
  Status s = (*p)->Start();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s;
}

// --- registration faults ----------------------------------------------------

TEST(FaultyPluginTest, RegBadVersionRegistersV1beta2) {
  Registered r("reg-bad-version");
  ASSERT_TRUE(r.ok());
  auto requests = r.WaitForRequests(1);
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests[0].version(), "v1beta2");
  EXPECT_EQ(requests[0].resource_name(), kResource);
}

TEST(FaultyPluginTest, RegBadResourceNameReplacesTheNamePart) {
  Registered r("reg-bad-resource-name");
  ASSERT_TRUE(r.ok());
  auto requests = r.WaitForRequests(1);
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests[0].resource_name(), "example.com/Bad Name!");
  EXPECT_EQ(requests[0].version(), "v1beta1");
}

TEST(FaultyPluginTest, RegEndpointPathRegistersAPathOutsideTheDirectory) {
  Registered r("reg-endpoint-path");
  ASSERT_TRUE(r.ok());
  const std::string name = std::filesystem::path(r.plugin().SocketPath()).filename().string();
  // The fake kubelet cannot dial "<dir>/../<name>": it refuses, the plugin retries.
  auto requests = r.WaitForRequests(2);
  ASSERT_GE(requests.size(), 2u);
  for (const auto& req : requests) EXPECT_EQ(req.endpoint(), "../" + name);
  EXPECT_EQ(r.plugin().RegistrationCount(), 0);
  EXPECT_FALSE(r.plugin().LastRegistrationError().ok());
  struct stat st;
  ASSERT_EQ(::lstat(r.plugin().SocketPath().c_str(), &st), 0) << "listens in the directory";
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
}

TEST(FaultyPluginTest, RegOptionsMismatchRegistersOtherOptionsThanItAnswers) {
  Registered r("reg-options-mismatch");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.plugin().WaitForRegistrationCount(1, kBound));
  auto requests = r.kubelet().Requests();
  auto dialed = r.kubelet().DialedOptions();
  ASSERT_FALSE(requests.empty());
  ASSERT_FALSE(dialed.empty());
  EXPECT_TRUE(requests[0].options().pre_start_required());
  EXPECT_FALSE(dialed[0].pre_start_required());
  EXPECT_EQ(requests[0].options().get_preferred_allocation_available(),
            dialed[0].get_preferred_allocation_available());
}

TEST(FaultyPluginTest, HealthyRegistrationWhereTheFaultIsElsewhere) {
  Registered r("lw-bad-health");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.plugin().WaitForRegistrationCount(1, kBound));
  auto requests = r.kubelet().Requests();
  auto dialed = r.kubelet().DialedOptions();
  ASSERT_EQ(requests.size(), 1u);
  ASSERT_EQ(dialed.size(), 1u);
  EXPECT_EQ(requests[0].version(), "v1beta1");
  EXPECT_EQ(requests[0].resource_name(), kResource);
  EXPECT_EQ(requests[0].endpoint(),
            std::filesystem::path(r.plugin().SocketPath()).filename().string());
  EXPECT_EQ(requests[0].options().SerializeAsString(), dialed[0].SerializeAsString());
  EXPECT_TRUE(r.plugin().LastRegistrationError().ok());
}

// Runs two plugins against one fake kubelet, restarts the kubelet twice and
// waits for the healthy-equivalent plugin to register after each restart; by
// then the no-reregister plugin, watching at the same interval, would have too.
TEST(FaultyPluginTest, NoReregisterNeverRegistersAgainAfterKubeletRestart) {
  TempSocketDir dir;
  FakeRegistrationServer kubelet(dir.path());
  ASSERT_TRUE(kubelet.Start());
  PluginConfig broken_config = Config(dir.path(), true);
  broken_config.socket_name = "broken.sock";
  PluginConfig other_config = Config(dir.path(), true);
  other_config.socket_name = "other.sock";
  auto broken = MustStart(broken_config, "no-reregister");
  auto other = MustStart(other_config, "alloc-bad-env");
  ASSERT_NE(broken, nullptr);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(broken->WaitForRegistrationCount(1, kBound));
  ASSERT_TRUE(other->WaitForRegistrationCount(1, kBound));
  for (int restart = 1; restart <= 2; ++restart) {
    kubelet.Stop();
    ASSERT_TRUE(kubelet.Start());
    ASSERT_TRUE(other->WaitForRegistrationCount(1 + restart, kBound)) << "restart " << restart;
  }
  EXPECT_EQ(broken->RegistrationCount(), 1);
  int broken_requests = 0;
  for (const auto& req : kubelet.Requests()) broken_requests += req.endpoint() == "broken.sock";
  EXPECT_EQ(broken_requests, 1) << "the fake kubelet keeps every request across restarts";
  broken->Stop();
  other->Stop();
  kubelet.Stop();
}

// The soak's finding, in the FaultyPlugin's own serving code (the SDK has its
// twin, PluginServerTest.RegressionSocketDeletedBetweenBindAndStatIsServedAgain):
// a kubelet starting up deleted the plugin's socket right after the bind,
// before the plugin recorded the file's identity; the plugin then never
// noticed its socket was gone and never served again.
TEST(FaultyPluginTest, RegressionSocketDeletedBetweenBindAndStatIsServedAgain) {
  TempSocketDir dir;
  PluginConfig c = Config(dir.path());
  c.socket_name = "faulty.sock";
  const std::string socket = dir.path() + "/faulty.sock";
  auto binds = std::make_shared<std::atomic<int>>(0);
  c.after_bind_for_test = [binds, socket] {
    if (binds->fetch_add(1) == 0) ::unlink(socket.c_str());
  };
  auto p = MustStart(c, "alloc-bad-env");
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->SocketPath(), socket);
  // The hook may run after the first socket file appeared: wait for the
  // second bind, not only for a file.
  ASSERT_TRUE(
      WaitUntil([&] { return binds->load() >= 2 && std::filesystem::exists(socket); }, kBound))
      << "binds: " << binds->load();
  auto stub = DialFaulty(socket);
  grpc::ClientContext ctx;
  Bound(ctx);
  v1beta1::DevicePluginOptions opts;
  grpc::Status s = stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &opts);
  EXPECT_TRUE(s.ok()) << s.error_message();
  p->Stop();
  EXPECT_FALSE(std::filesystem::exists(socket)) << "Stop removes the socket it serves";
}

// --- ListAndWatch faults ----------------------------------------------------

TEST(FaultyPluginTest, LwNoSnapshotSendsNothingUntilTheClientGivesUp) {
  Served s("lw-no-snapshot");
  ASSERT_TRUE(s.ok());
  grpc::ClientContext ctx;
  Bound(ctx, 300ms);
  auto stream = s.stub().ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse msg;
  EXPECT_FALSE(stream->Read(&msg));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server lets go of the stream once the client gave up, not only on Stop.
  EXPECT_TRUE(WaitUntil([&] { return s.plugin().HeldCalls() == 0; }, kBound));
}

TEST(FaultyPluginTest, StopDuringBlockedLwNoSnapshotReturnsWithinBound) {
  Served s("lw-no-snapshot");
  ASSERT_TRUE(s.ok());
  grpc::ClientContext ctx;
  Bound(ctx, 60s);
  auto stream = s.stub().ListAndWatch(&ctx, v1beta1::Empty());
  auto reader = std::async(std::launch::async, [&] {
    v1beta1::ListAndWatchResponse msg;
    bool got = stream->Read(&msg);
    stream->Finish();
    return got;
  });
  ASSERT_TRUE(WaitUntil([&] { return s.plugin().HeldCalls() == 1; }, kBound)) << "stream not held";
  auto stop = std::async(std::launch::async, [&] { s.plugin().Stop(); });
  ASSERT_EQ(stop.wait_for(kBound), std::future_status::ready) << "Stop hangs";
  ASSERT_EQ(reader.wait_for(kBound), std::future_status::ready) << "stream not ended";
  EXPECT_FALSE(reader.get());
}

TEST(FaultyPluginTest, LwDuplicateIdsListsOneIdTwice) {
  Served s("lw-duplicate-ids");
  ASSERT_TRUE(s.ok());
  auto msgs = s.Watch(1);
  ASSERT_EQ(msgs.size(), 1u);
  std::vector<std::string> ids = Ids(msgs[0]);
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 4u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), "gpu-0"), 2);
}

TEST(FaultyPluginTest, LwBadHealthReportsLowerCaseHealthy) {
  Served s("lw-bad-health");
  ASSERT_TRUE(s.ok());
  auto msgs = s.Watch(1);
  ASSERT_EQ(msgs.size(), 1u);
  ASSERT_EQ(msgs[0].devices_size(), 4);
  EXPECT_EQ(msgs[0].devices(0).health(), "healthy");
  for (int i = 1; i < 4; ++i) EXPECT_EQ(msgs[0].devices(i).health(), "Healthy");
}

TEST(FaultyPluginTest, LwNegativeNumaReportsNodeMinusOne) {
  Served s("lw-negative-numa", [](PluginConfig& c) {
    c.count.reset();
    c.preset = "dgx1-v100";
  });
  ASSERT_TRUE(s.ok());
  auto msgs = s.Watch(1);
  ASSERT_EQ(msgs.size(), 1u);
  ASSERT_EQ(msgs[0].devices_size(), 8);
  ASSERT_EQ(msgs[0].devices(0).topology().nodes_size(), 1);
  EXPECT_EQ(msgs[0].devices(0).topology().nodes(0).id(), -1);
  for (int i = 1; i < 8; ++i) {
    for (const auto& n : msgs[0].devices(i).topology().nodes()) EXPECT_GE(n.id(), 0);
  }
}

TEST(FaultyPluginTest, LwDeltaUpdatesSendsSingleDeviceMessagesAfterTheFirst) {
  Served s("lw-delta-updates");
  ASSERT_TRUE(s.ok());
  auto msgs = s.Watch(3);
  ASSERT_EQ(msgs.size(), 3u);
  EXPECT_EQ(Ids(msgs[0]), kAllIds);
  ASSERT_EQ(msgs[1].devices_size(), 1);
  EXPECT_EQ(msgs[1].devices(0).id(), "gpu-0");
  EXPECT_EQ(msgs[1].devices(0).health(), "Unhealthy");
  ASSERT_EQ(msgs[2].devices_size(), 1);
  EXPECT_EQ(msgs[2].devices(0).id(), "gpu-1");
  // A fresh stream still starts with the full list.
  auto fresh = s.Watch(1);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(Ids(fresh[0]), kAllIds);
}

TEST(FaultyPluginTest, LwDropBreaksFailsEveryStreamAfterACancelledOne) {
  Served s("lw-drop-breaks");
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s.Watch(1).size(), 1u) << "the first stream is healthy";
  // The server notices the cancel within its poll interval; streams opened
  // before that still work (and are cancelled too).
  grpc::Status last;
  auto end = std::chrono::steady_clock::now() + kBound;
  while (std::chrono::steady_clock::now() < end) {
    grpc::ClientContext ctx;
    Bound(ctx);
    auto stream = s.stub().ListAndWatch(&ctx, v1beta1::Empty());
    v1beta1::ListAndWatchResponse msg;
    if (!stream->Read(&msg)) {
      last = stream->Finish();
      break;
    }
    ctx.TryCancel();
    stream->Finish();
  }
  EXPECT_EQ(last.error_code(), grpc::StatusCode::UNAVAILABLE) << last.error_message();
  // Allocate is untouched.
  v1beta1::AllocateResponse resp;
  EXPECT_TRUE(s.Allocate({"gpu-1"}, &resp).ok());
}

TEST(FaultyPluginTest, StreamsSurviveCancelsWhereTheFaultIsElsewhere) {
  Served s("alloc-bad-env");
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 20; ++i) ASSERT_EQ(s.Watch(1).size(), 1u) << "stream " << i;
  auto msgs = s.Watch(1);
  ASSERT_EQ(msgs.size(), 1u);
  EXPECT_EQ(Ids(msgs[0]), kAllIds);
  for (const auto& d : msgs[0].devices()) EXPECT_EQ(d.health(), "Healthy");
}

// --- Allocate faults --------------------------------------------------------

TEST(FaultyPluginTest, AllocTwoResponsesAnswersTwoContainers) {
  Served s("alloc-two-responses");
  ASSERT_TRUE(s.ok());
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(s.Allocate({"gpu-1"}, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 2);
  v1beta1::ContainerAllocateRequest req;
  req.add_devices_ids("gpu-1");
  auto healthy = s.plugin().healthy().Allocate(req);
  ASSERT_TRUE(healthy.ok());
  EXPECT_EQ(resp.container_responses(0).SerializeAsString(), healthy->SerializeAsString());
}

TEST(FaultyPluginTest, AllocAcceptUnknownAnswersOkForIdsNeverListed) {
  Served s("alloc-accept-unknown");
  ASSERT_TRUE(s.ok());
  v1beta1::AllocateResponse resp;
  grpc::Status st = s.Allocate({"no-such-device"}, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(resp.container_responses_size(), 1);
  EXPECT_EQ(resp.container_responses(0).envs().at("GPU_VISIBLE_DEVICES"), "no-such-device");
  // The healthy plugin refuses the same request.
  v1beta1::ContainerAllocateRequest req;
  req.add_devices_ids("no-such-device");
  EXPECT_EQ(s.plugin().healthy().Allocate(req).status().code(), StatusCode::kNotFound);
}

TEST(FaultyPluginTest, AllocRelativePathMakesTheFirstHostPathRelative) {
  Served s("alloc-relative-path");
  ASSERT_TRUE(s.ok());
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(s.Allocate({"gpu-0", "gpu-2"}, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  const auto& devices = resp.container_responses(0).devices();
  ASSERT_EQ(devices.size(), 2);
  EXPECT_EQ(devices[0].host_path(), "dev/gpu0");
  EXPECT_EQ(devices[0].container_path(), "/dev/gpu0");
  EXPECT_EQ(devices[1].host_path(), "/dev/gpu2");
}

TEST(FaultyPluginTest, AllocBadPermissionsAnswersRwx) {
  Served s("alloc-bad-permissions");
  ASSERT_TRUE(s.ok());
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(s.Allocate({"gpu-3"}, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  ASSERT_GE(resp.container_responses(0).devices_size(), 1);
  EXPECT_EQ(resp.container_responses(0).devices(0).permissions(), "rwx");
}

TEST(FaultyPluginTest, AllocBadEnvAddsAnInvalidEnvName) {
  Served s("alloc-bad-env");
  ASSERT_TRUE(s.ok());
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(s.Allocate({"gpu-0"}, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  const auto& envs = resp.container_responses(0).envs();
  EXPECT_EQ(envs.count("1 BAD=NAME"), 1u);
  EXPECT_EQ(envs.at("GPU_VISIBLE_DEVICES"), "gpu-0");
}

TEST(FaultyPluginTest, AllocBadCdiAnswersAnUnqualifiedCdiNameEvenWithoutCdi) {
  Served s("alloc-bad-cdi");
  ASSERT_TRUE(s.ok());
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(s.Allocate({"gpu-2"}, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  const auto& cdi = resp.container_responses(0).cdi_devices();
  ASSERT_EQ(cdi.size(), 1);
  EXPECT_EQ(cdi[0].name().find('/'), std::string::npos) << cdi[0].name();
  EXPECT_EQ(cdi[0].name().find('='), std::string::npos) << cdi[0].name();
}

TEST(FaultyPluginTest, AllocNotConcurrentRefusesOverlappingCalls) {
  Served s("alloc-not-concurrent");
  ASSERT_TRUE(s.ok());
  v1beta1::AllocateResponse one;
  ASSERT_TRUE(s.Allocate({"gpu-0"}, &one).ok()) << "a lone call succeeds";
  // Rounds of 8 simultaneous calls until one is refused (each call is held
  // ~20 ms, so the first round nearly always shows it).
  std::atomic<int> busy{0}, ok{0}, other{0};
  for (int round = 0; round < 50 && busy == 0; ++round) {
    std::vector<std::thread> threads;
    std::atomic<bool> go{false};
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        while (!go) std::this_thread::yield();
        v1beta1::AllocateResponse resp;
        grpc::Status st = s.Allocate({"gpu-1"}, &resp);
        if (st.ok()) {
          ++ok;
        } else if (st.error_code() == grpc::StatusCode::UNAVAILABLE &&
                   st.error_message().find("busy") != std::string::npos) {
          ++busy;
        } else {
          ++other;
        }
      });
    }
    go = true;
    for (auto& t : threads) t.join();
  }
  EXPECT_GT(busy.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(other.load(), 0);
}

// --- GetPreferredAllocation faults ------------------------------------------

TEST(FaultyPluginTest, PrefWrongSizeAnswersOneIdFewer) {
  Served s("pref-wrong-size");
  ASSERT_TRUE(s.ok());
  v1beta1::PreferredAllocationResponse resp;
  ASSERT_TRUE(s.Preferred(kAllIds, {}, 3, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  EXPECT_EQ(resp.container_responses(0).deviceids_size(), 2);
}

TEST(FaultyPluginTest, PrefNotSubsetAnswersAnIdNotAvailable) {
  Served s("pref-not-subset");
  ASSERT_TRUE(s.ok());
  v1beta1::PreferredAllocationResponse resp;
  ASSERT_TRUE(s.Preferred(kAllIds, {}, 2, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  std::vector<std::string> ids = FaultyStrings(resp.container_responses(0).deviceids());
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), "no-such-device"), 1);
}

TEST(FaultyPluginTest, PrefDropMustIncludeLeavesMustIncludeOut) {
  Served s("pref-drop-must-include");
  ASSERT_TRUE(s.ok());
  v1beta1::PreferredAllocationResponse resp;
  ASSERT_TRUE(s.Preferred(kAllIds, {"gpu-3"}, 2, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  std::vector<std::string> ids = FaultyStrings(resp.container_responses(0).deviceids());
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), "gpu-3"), 0);
  for (const auto& id : ids) {
    EXPECT_EQ(std::count(kAllIds.begin(), kAllIds.end(), id), 1) << id;
  }
}

TEST(FaultyPluginTest, PrefDuplicatesRepeatsTheFirstIdInPlaceOfTheLast) {
  Served s("pref-duplicates");
  ASSERT_TRUE(s.ok());
  v1beta1::PreferredAllocationResponse resp;
  ASSERT_TRUE(s.Preferred(kAllIds, {}, 3, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  std::vector<std::string> ids = FaultyStrings(resp.container_responses(0).deviceids());
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.front(), ids.back());
}

TEST(FaultyPluginTest, PrefRandomGivesDifferentSetsForTheSameRequest) {
  Served s("pref-random", [](PluginConfig& c) { c.count = 8; });
  ASSERT_TRUE(s.ok());
  std::vector<std::string> available;
  for (int i = 0; i < 8; ++i) available.push_back("gpu-" + std::to_string(i));
  std::set<std::set<std::string>> answers;
  for (int i = 0; i < 5; ++i) {
    v1beta1::PreferredAllocationResponse resp;
    ASSERT_TRUE(s.Preferred(available, {"gpu-5"}, 3, &resp).ok());
    ASSERT_EQ(resp.container_responses_size(), 1);
    std::vector<std::string> ids = FaultyStrings(resp.container_responses(0).deviceids());
    std::set<std::string> set(ids.begin(), ids.end());
    EXPECT_EQ(set.size(), 3u);
    EXPECT_EQ(set.count("gpu-5"), 1u) << "must-include is kept";
    answers.insert(set);
  }
  EXPECT_GE(answers.size(), 2u);
}

TEST(FaultyPluginTest, PrefSlowHoldsOnlyTheLargestRequestsUntilTheClientGivesUp) {
  Served s("pref-slow");
  ASSERT_TRUE(s.ok());
  v1beta1::PreferredAllocationResponse resp;
  // 4 devices: size 3 (= count - 1) and 4 are held.
  grpc::Status held = s.Preferred(kAllIds, {}, 3, &resp, 300ms);
  EXPECT_EQ(held.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << held.error_message();
  // The server lets go of the call once the client gave up, not only on Stop.
  EXPECT_TRUE(WaitUntil([&] { return s.plugin().HeldCalls() == 0; }, kBound));
  v1beta1::PreferredAllocationResponse small;
  ASSERT_TRUE(s.Preferred(kAllIds, {}, 2, &small).ok());
  ASSERT_EQ(small.container_responses_size(), 1);
  EXPECT_EQ(small.container_responses(0).deviceids_size(), 2);
}

TEST(FaultyPluginTest, StopDuringBlockedPrefSlowReturnsWithinBound) {
  Served s("pref-slow");
  ASSERT_TRUE(s.ok());
  auto call = std::async(std::launch::async, [&] {
    v1beta1::PreferredAllocationResponse resp;
    return s.Preferred(kAllIds, {}, 4, &resp, 60s);
  });
  ASSERT_TRUE(WaitUntil([&] { return s.plugin().HeldCalls() == 1; }, kBound)) << "call not held";
  auto stop = std::async(std::launch::async, [&] { s.plugin().Stop(); });
  ASSERT_EQ(stop.wait_for(kBound), std::future_status::ready) << "Stop hangs";
  ASSERT_EQ(call.wait_for(kBound), std::future_status::ready) << "call not ended";
  EXPECT_FALSE(call.get().ok());
}

TEST(FaultyPluginTest, PrefFaultsOfferPreferredEvenWithPolicyNone) {
  Served s("pref-wrong-size", [](PluginConfig& c) { c.policy = std::nullopt; });
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s.Options().get_preferred_allocation_available());
  Served other("alloc-bad-env", [](PluginConfig& c) { c.policy = std::nullopt; });
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other.Options().get_preferred_allocation_available());
  v1beta1::PreferredAllocationResponse resp;
  EXPECT_EQ(other.Preferred(kAllIds, {}, 2, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

// --- PreStartContainer --------------------------------------------------------

TEST(FaultyPluginTest, PrestartUnimplementedSaysRequiredButAnswersUnimplemented) {
  Served s("prestart-unimplemented");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s.Options().pre_start_required());
  v1beta1::PreStartContainerRequest req;
  req.add_devices_ids("gpu-0");
  v1beta1::PreStartContainerResponse resp;
  grpc::ClientContext ctx;
  Bound(ctx);
  EXPECT_EQ(s.stub().PreStartContainer(&ctx, req, &resp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// --- where the fault does not apply ------------------------------------------

TEST(FaultyPluginTest, AnswersLikeTheHealthyPluginWhereTheFaultDoesNotApply) {
  Served s("alloc-bad-env", [](PluginConfig& c) { c.pre_start = true; });
  ASSERT_TRUE(s.ok());
  // GetPreferredAllocation: exactly the healthy answer.
  auto req = Served::PreferredRequest(kAllIds, {"gpu-2"}, 2);
  auto healthy = s.plugin().healthy().PreferredAllocation(req.container_requests(0));
  ASSERT_TRUE(healthy.ok());
  v1beta1::PreferredAllocationResponse resp;
  ASSERT_TRUE(s.Preferred(kAllIds, {"gpu-2"}, 2, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  EXPECT_EQ(resp.container_responses(0).SerializeAsString(), healthy->SerializeAsString());
  // An impossible request fails as the healthy plugin's does.
  v1beta1::PreferredAllocationResponse impossible;
  EXPECT_FALSE(s.Preferred(kAllIds, {}, 9, &impossible).ok());
  // Unknown ids are refused.
  v1beta1::AllocateResponse alloc;
  EXPECT_EQ(s.Allocate({"nope"}, &alloc).error_code(), grpc::StatusCode::NOT_FOUND);
  // PreStartContainer is offered and answered.
  EXPECT_TRUE(s.Options().pre_start_required());
  v1beta1::PreStartContainerRequest pre;
  pre.add_devices_ids("gpu-0");
  v1beta1::PreStartContainerResponse pre_resp;
  grpc::ClientContext ctx;
  Bound(ctx);
  EXPECT_TRUE(s.stub().PreStartContainer(&ctx, pre, &pre_resp).ok());

  // And a pref-* fault allocates correctly.
  Served p("pref-wrong-size");
  ASSERT_TRUE(p.ok());
  v1beta1::AllocateResponse pa;
  ASSERT_TRUE(p.Allocate({"gpu-0", "gpu-1"}, &pa).ok());
  ASSERT_EQ(pa.container_responses_size(), 1);
  v1beta1::ContainerAllocateRequest areq;
  areq.add_devices_ids("gpu-0");
  areq.add_devices_ids("gpu-1");
  auto healthy_alloc = p.plugin().healthy().Allocate(areq);
  ASSERT_TRUE(healthy_alloc.ok());
  EXPECT_EQ(pa.container_responses(0).SerializeAsString(), healthy_alloc->SerializeAsString());
}

}  // namespace
}  // namespace kdm::fakes
