// The Manager with real device plugins (kdm's SDK, plus two hand-written
// misbehaving ones) over real unix sockets in a private temp directory per
// test: registration accept/reject table, two resources, health flips,
// plugin loss and the grace period (fake clock), re-registration, rolling
// update, duplicate registration without leaks, hung RPCs, invalid preferred
// answers, concurrent admission with churn, and restart.
#include <dirent.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/base/sync.h"
#include "kdm/checkpoint/store.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/manager_impl.h"
#include "kdm/pluginapi/grpc_status.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/test/devicemanager/test_pods.h"

namespace kdm::devicemanager {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr char kGpu[] = "vendor.com/gpu";
constexpr char kNic[] = "vendor.com/nic";

// Waits, bounded (`bound`), for an effect of another thread to become visible.
template <typename Pred>
bool WaitUntil(std::chrono::milliseconds bound, Pred pred) {
  for (int64_t i = 0; i < bound.count(); ++i) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return pred();
}
// The same with a bound of 10 s.
template <typename Pred>
bool WaitUntil(Pred pred) {
  return WaitUntil(std::chrono::milliseconds(10'000), std::move(pred));
}

int CountThreads() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// The names of this process's threads by count ("grpc_global_tim x2 ..."),
// to tell whose threads a failed thread count saw.
std::string ThreadNames() {
  std::map<std::string, int> names;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return "?";
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::FILE* f = std::fopen(("/proc/self/task/" + std::string(e->d_name) + "/comm").c_str(), "r");
    if (f == nullptr) continue;
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) {
      std::string name(buf);
      if (!name.empty() && name.back() == '\n') name.pop_back();
      names[name]++;
    }
    std::fclose(f);
  }
  closedir(d);
  std::string out;
  for (const auto& [name, n] : names) out += name + " x" + std::to_string(n) + "; ";
  return out;
}

// A bound (listening) unix socket at `path`, closed on destruction.
class BoundSocket {
 public:
  explicit BoundSocket(const std::string& path) : fd_(::socket(AF_UNIX, SOCK_STREAM, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ok_ =
        ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(fd_, 4) == 0;
  }
  ~BoundSocket() { ::close(fd_); }
  bool ok() const { return ok_; }

 private:
  int fd_;
  bool ok_ = false;
};

using kdm::devicemanager::testing::MakePod;

std::vector<plugin::Device> Devices(const std::string& prefix, int n) {
  std::vector<plugin::Device> d;
  for (int i = 0; i < n; ++i) d.push_back({prefix + std::to_string(i), true, {i % 2}});
  return d;
}

StatusOr<v1beta1::ContainerAllocateResponse> EchoAllocate(
    const v1beta1::ContainerAllocateRequest& req) {
  v1beta1::ContainerAllocateResponse r;
  std::string ids;
  for (const auto& id : req.devices_ids()) ids += (ids.empty() ? "" : ",") + id;
  (*r.mutable_envs())["DEVICES"] = ids;
  return r;
}

// A DevicePlugin that hangs in GetDevicePluginOptions, or answers options
// but never sends a ListAndWatch message, until released.
class HangingPlugin final : public v1beta1::DevicePlugin::Service {
 public:
  enum class Mode { kHangOptions, kSilentStream };
  HangingPlugin(const std::string& path, Mode mode) : mode_(mode) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix://" + path, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~HangingPlugin() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  bool ok() const { return server_ != nullptr; }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions*) override {
    if (mode_ == Mode::kHangOptions) release_.WaitForNotificationWithTimeout(absl::Seconds(10));
    return grpc::Status::OK;
  }
  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>*) override {
    while (!ctx->IsCancelled() && !release_.WaitForNotificationWithTimeout(absl::Milliseconds(5))) {
    }
    return grpc::Status::OK;
  }

 private:
  const Mode mode_;
  kdm::Notification release_;
  std::unique_ptr<grpc::Server> server_;
};

class ManagerIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-it-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    clock_ = std::make_shared<FakeClock>();
    store_ = std::shared_ptr<checkpoint::Store>(checkpoint::NewMemoryStore());
  }
  void TearDown() override {
    for (auto& p : plugins_) p->Stop();
    if (manager_) manager_->Stop();
    manager_.reset();
    std::filesystem::remove_all(dir_);
  }

  Manager::Options BaseOptions() {
    Manager::Options o;
    o.plugin_dir = dir_;
    o.store = store_;
    o.clock = clock_;
    o.registration_timeout = std::chrono::milliseconds(2000);
    o.rpc_timeout = std::chrono::milliseconds(5000);
    o.boot_id_provider = [this]() -> StatusOr<std::string> { return boot_id_; };
    o.active_pods = [] { return std::set<std::string>(); };
    return o;
  }

  void StartManager(Manager::Options o) {
    auto m = Manager::Create(std::move(o));
    ASSERT_TRUE(m.ok()) << m.status();
    manager_ = std::move(*m);
    impl_ = dynamic_cast<ManagerImpl*>(manager_.get());
    ASSERT_NE(impl_, nullptr);
    ASSERT_TRUE(manager_->Start().ok());
  }
  void StartManager() { StartManager(BaseOptions()); }

  plugin::PluginServer* StartPlugin(plugin::PluginServer::Options o) {
    o.plugin_dir = dir_;
    if (!o.allocate) o.allocate = &EchoAllocate;
    o.register_backoff_initial = std::chrono::milliseconds(10);
    o.register_backoff_max = std::chrono::milliseconds(100);
    o.watch_interval = std::chrono::milliseconds(20);
    auto p = plugin::PluginServer::Create(std::move(o));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    Status s = (*p)->Start();
    EXPECT_TRUE(s.ok()) << s;
    plugins_.push_back(std::move(*p));
    return plugins_.back().get();
  }
  plugin::PluginServer* StartPlugin(const std::string& resource, const std::string& socket,
                                    std::vector<plugin::Device> devices, bool register_it = true) {
    plugin::PluginServer::Options o;
    o.resource_name = resource;
    o.socket_name = socket;
    o.devices = std::move(devices);
    o.register_with_kubelet = register_it;
    return StartPlugin(std::move(o));
  }

  // One Register call to the manager's kubelet.sock.
  Status Register(const std::string& version, const std::string& resource,
                  const std::string& endpoint) {
    auto channel =
        grpc::CreateChannel("unix://" + dir_ + "/kubelet.sock", grpc::InsecureChannelCredentials());
    auto stub = v1beta1::Registration::NewStub(channel);
    v1beta1::RegisterRequest req;
    req.set_version(version);
    req.set_resource_name(resource);
    req.set_endpoint(endpoint);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1beta1::Empty empty;
    grpc::Status s = stub->Register(&ctx, req, &empty);
    return pluginapi::FromGrpcStatus(s);
  }

  CapacityReport::Amounts Cap(const std::string& resource) {
    auto cap = manager_->GetCapacity();
    auto it = cap.resources.find(resource);
    return it == cap.resources.end() ? CapacityReport::Amounts{-1, -1} : it->second;
  }
  bool CapIs(const std::string& resource, int64_t capacity, int64_t allocatable) {
    return WaitUntil([&] {
      return Cap(resource) == CapacityReport::Amounts{capacity, allocatable};
    });
  }

  std::vector<std::string> DevicesOf(const std::string& uid, const std::string& c) {
    std::vector<std::string> ids;
    for (const auto& cd : manager_->GetDevices(uid, c)) {
      ids.insert(ids.end(), cd.device_ids.begin(), cd.device_ids.end());
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  std::string dir_;
  std::string boot_id_ = "boot-a";
  std::shared_ptr<FakeClock> clock_;
  std::shared_ptr<checkpoint::Store> store_;
  std::vector<std::unique_ptr<plugin::PluginServer>> plugins_;
  // Health events seen by Subscribe(); members so that they outlive the
  // Manager (TearDown stops it, which may still notify).
  kdm::Mutex seen_mu_;
  std::vector<DeviceHealthEvent> seen_;
  std::unique_ptr<Manager> manager_;
  ManagerImpl* impl_ = nullptr;

  void SubscribeToHealth() {
    manager_->Subscribe([this](const std::vector<DeviceHealthEvent>& ev) {
      kdm::MutexLock l(&seen_mu_);
      seen_.insert(seen_.end(), ev.begin(), ev.end());
    });
  }
  std::vector<DeviceHealthEvent> Seen() {
    kdm::MutexLock l(&seen_mu_);
    return seen_;
  }
};

TEST_F(ManagerIntegrationTest, PluginDirectoryIsCreated0750) {
  std::string sub = dir_ + "/a/b";
  Manager::Options o = BaseOptions();
  o.plugin_dir = sub;
  StartManager(std::move(o));
  struct stat st;
  ASSERT_EQ(stat(sub.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  EXPECT_TRUE(std::filesystem::exists(sub + "/kubelet.sock"));
}

TEST_F(ManagerIntegrationTest, RegistrationAcceptRejectTable) {
  Manager::Options o = BaseOptions();
  o.registration_timeout = std::chrono::milliseconds(300);
  StartManager(std::move(o));
  ASSERT_NE(StartPlugin(kGpu, "ok.sock", Devices("gpu", 2), /*register_it=*/false), nullptr);

  // Files for the endpoint checks.
  char other_tmpl[] = "/tmp/kdm-it-out-XXXXXX";
  ASSERT_NE(mkdtemp(other_tmpl), nullptr);
  std::string other = other_tmpl;
  BoundSocket outside(other + "/real.sock");
  ASSERT_TRUE(outside.ok());
  ASSERT_EQ(symlink((other + "/real.sock").c_str(), (dir_ + "/out.sock").c_str()), 0);
  ASSERT_EQ(symlink((dir_ + "/ok.sock").c_str(), (dir_ + "/alias.sock").c_str()), 0);
  {
    std::FILE* f = std::fopen((dir_ + "/file.sock").c_str(), "w");
    std::fclose(f);
  }
  std::filesystem::create_directory(dir_ + "/sub");
  HangingPlugin hang_options(dir_ + "/hang.sock", HangingPlugin::Mode::kHangOptions);
  HangingPlugin silent(dir_ + "/silent.sock", HangingPlugin::Mode::kSilentStream);
  ASSERT_TRUE(hang_options.ok());
  ASSERT_TRUE(silent.ok());

  struct Case {
    std::string version, resource, endpoint;
    StatusCode code;
    std::string message;  // exact, or a substring when `exact` is false
    bool exact = true;
  };
  const std::string v = "v1beta1";
  auto bad_version = [](const std::string& ver) {
    return "requested API version \"" + ver +
           "\" is not supported by kubelet. Supported version is \"v1beta1\"";
  };
  auto bad_name = [](const std::string& r) { return "the ResourceName \"" + r + "\" is invalid"; };
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  std::vector<Case> cases = {
      {"", kGpu, "ok.sock", kInvalid, bad_version("")},
      {"v1alpha", kGpu, "ok.sock", kInvalid, bad_version("v1alpha")},
      {"v1beta2", kGpu, "ok.sock", kInvalid, bad_version("v1beta2")},
      {"V1BETA1", kGpu, "ok.sock", kInvalid, bad_version("V1BETA1")},
  };
  for (std::string r : std::vector<std::string>{
           "gpu", "", "kubernetes.io/gpu", "vendor.kubernetes.io/gpu", "requests.vendor.com/gpu",
           "Vendor.com/gpu", "vendor.com/", "/gpu", "vendor.com/-gpu", "vendor.com/gpu-",
           "vendor.com/g/pu", "vendor..com/gpu", "-vendor.com/gpu", "vendor_x.com/gpu",
           "vendor.com/gp u", std::string("vendor.com/") + std::string(64, 'g'),
           std::string(254, 'v') + "/gpu"}) {
    cases.push_back({v, r, "ok.sock", kInvalid, bad_name(r)});
  }
  cases.push_back({v, kGpu, "", kInvalid, "invalid endpoint \"\": the socket file name is empty"});
  cases.push_back({v, kGpu, "sub/ok.sock", kInvalid,
                   "invalid endpoint \"sub/ok.sock\": must be a plain file name inside the plugin "
                   "directory, without '/'"});
  cases.push_back({v, kGpu, "../ok.sock", kInvalid,
                   "invalid endpoint \"../ok.sock\": must be a plain file name inside the plugin "
                   "directory, without '/'"});
  cases.push_back({v, kGpu, "..", kInvalid, "invalid endpoint \"..\": must not contain \"..\""});
  cases.push_back({v, kGpu, dir_ + "/ok.sock", kInvalid, "without '/'", false});
  const std::string kSymlink =
      ": is a symlink; the plugin's socket itself must be in the plugin "
      "directory";
  cases.push_back({v, kGpu, "out.sock", kInvalid, "invalid endpoint \"out.sock\"" + kSymlink});
  cases.push_back({v, kGpu, "alias.sock", kInvalid, "invalid endpoint \"alias.sock\"" + kSymlink});
  cases.push_back({v, kGpu, "file.sock", kInvalid,
                   "invalid endpoint \"file.sock\": not a unix socket but a regular file"});
  cases.push_back(
      {v, kGpu, "sub", kInvalid, "invalid endpoint \"sub\": not a unix socket but a directory"});
  cases.push_back({v, kGpu, "missing.sock", StatusCode::kNotFound,
                   "invalid endpoint \"missing.sock\": no such file in " + dir_});
  cases.push_back({v, kGpu, "hang.sock", StatusCode::kDeadlineExceeded,
                   "GetDevicePluginOptions of vendor.com/gpu at " + dir_ + "/hang.sock", false});
  cases.push_back({v, kGpu, "silent.sock", StatusCode::kDeadlineExceeded,
                   "sent no device list within 300 ms", false});
  int64_t rejected = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE("version=\"" + c.version + "\" resource=\"" + c.resource + "\" endpoint=\"" +
                 c.endpoint + "\"");
    Status s = Register(c.version, c.resource, c.endpoint);
    EXPECT_EQ(s.code(), c.code) << s;
    if (c.exact) {
      EXPECT_EQ(s.message(), c.message);
    } else {
      EXPECT_THAT(s.message(), HasSubstr(c.message));
    }
    ++rejected;
  }
  EXPECT_TRUE(manager_->GetCapacity().resources.empty());
  // Accepted: the plain socket (a symlink to it is refused above).
  EXPECT_TRUE(Register(v, kGpu, "ok.sock").ok());
  EXPECT_TRUE(CapIs(kGpu, 2, 2));
  ManagerStats st = manager_->GetStats();
  EXPECT_EQ(st.registrations_rejected, rejected);
  EXPECT_EQ(st.registrations_accepted, 1);
  std::filesystem::remove_all(other);
}

TEST_F(ManagerIntegrationTest, TwoResourcesRegisterAndAllocate) {
  StartManager();
  auto* gpu = StartPlugin(kGpu, "gpu.sock", Devices("gpu", 4));
  auto* nic = StartPlugin(kNic, "nic.sock", Devices("nic", 2));
  ASSERT_TRUE(gpu->WaitForRegistrationCount(1, std::chrono::seconds(10)));
  ASSERT_TRUE(nic->WaitForRegistrationCount(1, std::chrono::seconds(10)));
  EXPECT_TRUE(CapIs(kGpu, 4, 4));
  EXPECT_TRUE(CapIs(kNic, 2, 2));
  Pod pod = MakePod("p", {{"main", {{kGpu, 2}, {kNic, 1}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  EXPECT_THAT(DevicesOf("p", "main"), ElementsAre("gpu0", "gpu1", "nic0"));
  auto run = manager_->GetDeviceRunContainerOptions(pod, "main");
  ASSERT_TRUE(run.ok()) << run.status();
  // Both resources set DEVICES: the first by name (vendor.com/gpu) wins.
  EXPECT_EQ(run->envs.at("DEVICES"), "gpu0,gpu1");
  EXPECT_EQ(run->conflicts.size(), 1u);
  std::vector<ContainerDevices> allocatable = manager_->GetAllocatableDevices();
  EXPECT_EQ(allocatable.size(), 6u);
  EXPECT_TRUE(impl_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerIntegrationTest, HealthFlipsAreVisibleInCapacity) {
  StartManager();
  // Subscribed before the plugin exists, so every batch is seen. (Subscribing
  // once capacity shows the first snapshot raced that snapshot's own batch,
  // which is delivered after the capacity changes, on the endpoint's thread:
  // under load it arrived after the subscription, as three extra events.)
  SubscribeToHealth();
  auto* gpu = StartPlugin(kGpu, "gpu.sock", Devices("gpu", 3));
  ASSERT_TRUE(CapIs(kGpu, 3, 3));
  ASSERT_TRUE(gpu->SetHealth("gpu1", false).ok());
  EXPECT_TRUE(CapIs(kGpu, 3, 2));
  ASSERT_TRUE(gpu->SetHealth("gpu1", true).ok());
  EXPECT_TRUE(CapIs(kGpu, 3, 3));
  gpu->SetDevices(Devices("gpu", 5));
  EXPECT_TRUE(CapIs(kGpu, 5, 5));
  // Health callbacks run after the capacity changes: wait for the last batch.
  EXPECT_TRUE(WaitUntil([&] { return Seen().size() >= 7; }));
  EXPECT_THAT(
      Seen(),
      ElementsAre(DeviceHealthEvent{kGpu, "gpu0", true}, DeviceHealthEvent{kGpu, "gpu1", true},
                  DeviceHealthEvent{kGpu, "gpu2", true}, DeviceHealthEvent{kGpu, "gpu1", false},
                  DeviceHealthEvent{kGpu, "gpu1", true}, DeviceHealthEvent{kGpu, "gpu3", true},
                  DeviceHealthEvent{kGpu, "gpu4", true}));
}

TEST_F(ManagerIntegrationTest, PluginKilledBecomesUnhealthyThenDeletedAfterGrace) {
  StartManager();
  auto* gpu = StartPlugin(kGpu, "gpu.sock", Devices("gpu", 2));
  ASSERT_TRUE(CapIs(kGpu, 2, 2));
  gpu->Stop();
  EXPECT_TRUE(CapIs(kGpu, 2, 0));
  ASSERT_TRUE(WaitUntil([&] { return clock_->PendingTimers() == 1; }));
  EXPECT_EQ(manager_->Allocate(MakePod("p", {{"main", {{kGpu, 1}}}}), "main").message(),
            "no healthy devices present; cannot allocate unhealthy devices vendor.com/gpu");
  clock_->Advance(std::chrono::minutes(5));
  CapacityReport cap = manager_->GetCapacity();
  EXPECT_EQ(cap.resources.count(kGpu), 0u);
  EXPECT_THAT(cap.deleted, ElementsAre(kGpu));
}

TEST_F(ManagerIntegrationTest, ReRegistrationWithinGraceRestores) {
  StartManager();
  auto* gpu = StartPlugin(kGpu, "gpu.sock", Devices("gpu", 2));
  ASSERT_TRUE(CapIs(kGpu, 2, 2));
  ASSERT_TRUE(manager_->Allocate(MakePod("p", {{"main", {{kGpu, 1}}}}), "main").ok());
  gpu->Stop();
  ASSERT_TRUE(CapIs(kGpu, 2, 0));
  clock_->Advance(std::chrono::minutes(4));
  StartPlugin(kGpu, "gpu.sock", Devices("gpu", 2));
  EXPECT_TRUE(CapIs(kGpu, 2, 2));
  clock_->Advance(std::chrono::minutes(2));
  EXPECT_TRUE(CapIs(kGpu, 2, 2));
  EXPECT_TRUE(manager_->GetCapacity().deleted.empty());
  // The allocation made before the loss is intact.
  EXPECT_THAT(DevicesOf("p", "main"), ElementsAre("gpu0"));
  EXPECT_TRUE(manager_->Allocate(MakePod("q", {{"main", {{kGpu, 1}}}}), "main").ok());
  EXPECT_THAT(DevicesOf("q", "main"), ElementsAre("gpu1"));
}

TEST_F(ManagerIntegrationTest, RollingUpdateNeverDropsAllocatable) {
  StartManager();
  SubscribeToHealth();
  auto* v1 = StartPlugin(kGpu, "gpu-v1.sock", Devices("gpu", 2));
  ASSERT_TRUE(CapIs(kGpu, 2, 2));
  auto* v2 = StartPlugin(kGpu, "gpu-v2.sock", Devices("gpu", 2));
  ASSERT_TRUE(v2->WaitForRegistrationCount(1, std::chrono::seconds(10)));
  EXPECT_TRUE(WaitUntil([&] { return impl_->LiveEndpointsForTest(kGpu) == 2; }));
  v1->Stop();
  EXPECT_TRUE(WaitUntil([&] { return impl_->LiveEndpointsForTest(kGpu) == 1; }));
  EXPECT_EQ(Cap(kGpu), (CapacityReport::Amounts{2, 2}));
  for (const DeviceHealthEvent& e : Seen()) EXPECT_TRUE(e.healthy) << e.device_id;
  EXPECT_EQ(clock_->PendingTimers(), 0u);
  // The new plugin serves allocations.
  EXPECT_TRUE(manager_->Allocate(MakePod("p", {{"main", {{kGpu, 2}}}}), "main").ok());
}

TEST_F(ManagerIntegrationTest, DuplicateRegistrationOnOneSocketLeaksNoThreadOrConnection) {
  StartManager();
  auto* gpu = StartPlugin(kGpu, "gpu.sock", Devices("gpu", 2), /*register_it=*/false);
  // Warm up gRPC's own thread pools.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Register("v1beta1", kGpu, "gpu.sock").ok());
  ASSERT_TRUE(WaitUntil([&] { return gpu->OpenStreams() == 1; }));
  const int before = CountThreads();
  const std::string names_before = ThreadNames();
  constexpr int kRounds = 25;
  for (int i = 0; i < kRounds; ++i) ASSERT_TRUE(Register("v1beta1", kGpu, "gpu.sock").ok());
  EXPECT_EQ(impl_->LiveEndpointsForTest(kGpu), 1);
  EXPECT_TRUE(WaitUntil([&] { return gpu->OpenStreams() == 1; })) << gpu->OpenStreams();
  // gRPC's sync servers (kubelet.sock, and the plugin, in this process) add
  // pollers while busy; a spare one exits only after an idle poll of
  // cq_timeout_msec (10 s by default), counted from its last piece of work.
  // The bound is that plus room for a loaded machine: with 10 s, a poller
  // made late in the rounds outlived the wait (seen once in ~700 runs with
  // two CPU hogs: before=16 after=19). A leak (a thread per round) still
  // fails.
  EXPECT_TRUE(WaitUntil(std::chrono::seconds(30), [&] { return CountThreads() <= before + 2; }))
      << "threads before=" << before << " after=" << CountThreads() << " after " << kRounds
      << " re-registrations\nbefore: " << names_before << "\nafter:  " << ThreadNames();
  EXPECT_EQ(Cap(kGpu), (CapacityReport::Amounts{2, 2}));
}

TEST_F(ManagerIntegrationTest, HungAllocateHitsItsDeadlineAndFreesItsReservation) {
  Manager::Options o = BaseOptions();
  o.rpc_timeout = std::chrono::milliseconds(300);
  StartManager(std::move(o));
  // Shared with the handler: the client gives up at its deadline, so the
  // handler may still be leaving the wait when this test body returns (a
  // stack Notification was destroyed under it: "Mutex corrupt", once in ~700
  // runs under two CPU hogs). The plugins stop in TearDown.
  auto release = std::make_shared<kdm::Notification>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  plugin::PluginServer::Options po;
  po.resource_name = kGpu;
  po.socket_name = "gpu.sock";
  po.devices = Devices("gpu", 2);
  po.allocate = [release, calls](const v1beta1::ContainerAllocateRequest& req)
      -> StatusOr<v1beta1::ContainerAllocateResponse> {
    if ((*calls)++ == 0) release->WaitForNotificationWithTimeout(absl::Seconds(10));
    return EchoAllocate(req);
  };
  StartPlugin(std::move(po));
  ASSERT_TRUE(CapIs(kGpu, 2, 2));
  Status s = manager_->Allocate(MakePod("p", {{"main", {{kGpu, 2}}}}), "main");
  release->Notify();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("Allocate of vendor.com/gpu"));
  EXPECT_TRUE(DevicesOf("p", "main").empty());
  EXPECT_TRUE(impl_->CheckInvariantsForTest().ok());
  EXPECT_EQ(manager_->GetStats().rpc_errors.at("Allocate"), 1);
  // Both devices are free for the next pod.
  EXPECT_TRUE(manager_->Allocate(MakePod("q", {{"main", {{kGpu, 2}}}}), "main").ok());
  EXPECT_THAT(DevicesOf("q", "main"), ElementsAre("gpu0", "gpu1"));
}

TEST_F(ManagerIntegrationTest, HungPluginDelaysOnlyItsOwnPods) {
  StartManager();
  kdm::Notification entered, release;
  plugin::PluginServer::Options po;
  po.resource_name = kGpu;
  po.socket_name = "gpu.sock";
  po.devices = Devices("gpu", 2);
  po.allocate = [&](const v1beta1::ContainerAllocateRequest& req)
      -> StatusOr<v1beta1::ContainerAllocateResponse> {
    entered.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(10));
    return EchoAllocate(req);
  };
  StartPlugin(std::move(po));
  StartPlugin(kNic, "nic.sock", Devices("nic", 2));
  ASSERT_TRUE(CapIs(kGpu, 2, 2));
  ASSERT_TRUE(CapIs(kNic, 2, 2));
  std::atomic<bool> gpu_done{false};
  Status gpu_status;
  std::thread gpu_pod([&] {
    gpu_status = manager_->Allocate(MakePod("g", {{"main", {{kGpu, 1}}}}), "main");
    gpu_done = true;
  });
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // The GPU plugin is stuck inside Allocate; NIC pods are admitted meanwhile.
  EXPECT_TRUE(manager_->Allocate(MakePod("n", {{"main", {{kNic, 1}}}}), "main").ok());
  EXPECT_EQ(manager_->GetCapacity().resources.size(), 2u);
  EXPECT_FALSE(gpu_done.load());
  release.Notify();
  gpu_pod.join();
  EXPECT_TRUE(gpu_status.ok()) << gpu_status;
}

TEST_F(ManagerIntegrationTest, InvalidPreferredAnswersFallBackAndThePodIsAdmitted) {
  StartManager();
  kdm::Mutex mu;
  std::deque<StatusOr<std::vector<std::string>>> answers;
  plugin::PluginServer::Options po;
  po.resource_name = kGpu;
  po.socket_name = "gpu.sock";
  po.devices = Devices("gpu", 12);
  po.get_preferred_allocation = [&](const v1beta1::ContainerPreferredAllocationRequest&)
      -> StatusOr<v1beta1::ContainerPreferredAllocationResponse> {
    kdm::MutexLock l(&mu);
    auto a = answers.front();
    answers.pop_front();
    if (!a.ok()) return a.status();
    v1beta1::ContainerPreferredAllocationResponse r;
    for (const auto& id : *a) r.add_deviceids(id);
    return r;
  };
  StartPlugin(std::move(po));
  ASSERT_TRUE(CapIs(kGpu, 12, 12));
  {
    kdm::MutexLock l(&mu);
    answers = {std::vector<std::string>{"gpu7"},                    // wrong size
               std::vector<std::string>{"gpu7", "gpu7"},            // duplicates
               std::vector<std::string>{"gpu7", "nope"},            // unknown id
               Status(StatusCode::kInternal, "allocator crashed"),  // RPC error
               std::vector<std::string>{"gpu9"},                    // init: valid
               std::vector<std::string>{"gpu10", "gpu11"}};  // main: misses must-include gpu9
  }
  for (int i = 0; i < 4; ++i) {
    std::string uid = "p" + std::to_string(i);
    ASSERT_TRUE(manager_->Allocate(MakePod(uid, {{"main", {{kGpu, 2}}}}), "main").ok()) << uid;
    EXPECT_EQ(DevicesOf(uid, "main").size(), 2u);
  }
  Pod pod = MakePod("h", {{"main", {{kGpu, 2}}}}, {{"init", {{kGpu, 1}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "init").ok());
  EXPECT_THAT(DevicesOf("h", "init"), ElementsAre("gpu9"));
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  EXPECT_THAT(DevicesOf("h", "main"), ::testing::Contains("gpu9"));
  ManagerStats st = manager_->GetStats();
  EXPECT_EQ(st.preferred_invalid, 4);
  EXPECT_EQ(st.preferred_rpc_error, 1);
  EXPECT_EQ(st.preferred_ok, 1);
  EXPECT_TRUE(impl_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerIntegrationTest, EightThreadsAdmitAThousandPodsAgainst64DevicesWithChurn) {
  StartManager();
  auto* gpu = StartPlugin(kGpu, "gpu.sock", Devices("gpu", 64));
  ASSERT_TRUE(CapIs(kGpu, 64, 64));
  constexpr int kThreads = 8;
  constexpr int kPodsPerThread = 125;
  std::atomic<int> admitted{0}, refused{0}, violations{0}, unexpected{0};
  std::atomic<bool> done{false};
  std::thread health_churn([&] {
    for (int i = 0; !done && i < 200; ++i) {
      (void)gpu->SetHealth("gpu63", i % 2 == 1);
      absl::SleepFor(absl::Milliseconds(2));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      std::deque<std::string> live;
      for (int i = 0; i < kPodsPerThread; ++i) {
        std::string uid = "t" + std::to_string(t) + "-" + std::to_string(i);
        int n = 1 + static_cast<int>(rng() % 4);
        Status s = manager_->Allocate(MakePod(uid, {{"main", {{kGpu, n}}}}), "main");
        if (s.ok()) {
          admitted++;
          live.push_back(uid);
          if (static_cast<int>(DevicesOf(uid, "main").size()) != n) violations++;
        } else if (s.code() == StatusCode::kResourceExhausted) {
          refused++;
        } else {
          unexpected++;
          ADD_FAILURE() << s;
        }
        if (!impl_->CheckInvariantsForTest().ok()) violations++;
        if (live.size() > 2 || (!live.empty() && rng() % 3 == 0)) {
          if (!manager_->RemovePod(live.front()).ok()) unexpected++;
          live.pop_front();
          if (!impl_->CheckInvariantsForTest().ok()) violations++;
        }
      }
      for (const auto& uid : live) (void)manager_->RemovePod(uid);
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  health_churn.join();
  EXPECT_EQ(admitted + refused, kThreads * kPodsPerThread);
  EXPECT_GT(admitted.load(), 500);
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_TRUE(manager_->GetPodsWithDevices().empty());
  EXPECT_TRUE(impl_->CheckInvariantsForTest().ok());
  EXPECT_EQ(manager_->GetStats().allocations, admitted.load());
}

TEST_F(ManagerIntegrationTest, RestartRestoresAllocationsAndReportsZeroUntilThePluginReturns) {
  std::atomic<int> allocate_calls{0};
  auto counting = [&](const v1beta1::ContainerAllocateRequest& req) {
    allocate_calls++;
    return EchoAllocate(req);
  };
  StartManager();
  {
    plugin::PluginServer::Options po;
    po.resource_name = kGpu;
    po.socket_name = "gpu.sock";
    po.devices = Devices("gpu", 4);
    po.allocate = counting;
    StartPlugin(std::move(po));
  }
  ASSERT_TRUE(CapIs(kGpu, 4, 4));
  Pod pod = MakePod("p", {{"main", {{kGpu, 3}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  ASSERT_EQ(allocate_calls.load(), 1);
  // The node agent restarts while the plugin is down.
  plugins_.back()->Stop();
  manager_->Stop();
  manager_.reset();
  StartManager();
  EXPECT_EQ(Cap(kGpu), (CapacityReport::Amounts{0, 0}));
  EXPECT_THAT(DevicesOf("p", "main"), ElementsAre("gpu0", "gpu1", "gpu2"));
  {
    plugin::PluginServer::Options po;
    po.resource_name = kGpu;
    po.socket_name = "gpu.sock";
    po.devices = Devices("gpu", 4);
    po.allocate = counting;
    StartPlugin(std::move(po));
  }
  ASSERT_TRUE(CapIs(kGpu, 4, 4));
  EXPECT_TRUE(manager_->Allocate(pod, "main").ok());
  EXPECT_EQ(allocate_calls.load(), 1);  // never re-allocated
  EXPECT_EQ(manager_->Allocate(MakePod("q", {{"main", {{kGpu, 2}}}}), "main").message(),
            "requested number of devices unavailable for vendor.com/gpu. Requested: 2, "
            "Available: 1");
  auto run = manager_->GetDeviceRunContainerOptions(pod, "main");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->envs.at("DEVICES"), "gpu0,gpu1,gpu2");
}

TEST_F(ManagerIntegrationTest, RunningPluginReRegistersAfterManagerRestart) {
  StartManager();
  auto* gpu = StartPlugin(kGpu, "gpu.sock", Devices("gpu", 2));
  ASSERT_TRUE(gpu->WaitForRegistrationCount(1, std::chrono::seconds(10)));
  manager_->Stop();
  manager_.reset();
  StartManager();  // removes gpu.sock: the plugin notices and registers again
  EXPECT_TRUE(gpu->WaitForRegistrationCount(2, std::chrono::seconds(10)));
  EXPECT_TRUE(CapIs(kGpu, 2, 2));
}

}  // namespace
}  // namespace kdm::devicemanager
