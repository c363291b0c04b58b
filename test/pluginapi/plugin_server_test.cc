// PluginServer over real unix sockets, against a small fake kubelet.
#include "kdm/pluginapi/sdk/plugin_server.h"

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "kdm/test/pluginapi/fake_registration_server.h"
#include "kdm/test/wait_until.h"

namespace kdm::plugin {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using kdm::test::WaitUntil;
using kdm::testing::FakeRegistrationServer;
using kdm::testing::TempSocketDir;
using namespace std::chrono_literals;

constexpr char kResource[] = "example.com/widget";

PluginServer::Options BaseOptions(const std::string& dir) {
  PluginServer::Options o;
  o.resource_name = kResource;
  o.plugin_dir = dir;
  o.devices = {{"w0", true, {0}}, {"w1", true, {1}}, {"w2", true, {}}};
  o.allocate = [](const v1beta1::ContainerAllocateRequest& req)
      -> StatusOr<v1beta1::ContainerAllocateResponse> {
    v1beta1::ContainerAllocateResponse r;
    std::string ids;
    for (const auto& id : req.devices_ids()) ids += (ids.empty() ? "" : ",") + id;
    (*r.mutable_envs())["WIDGETS"] = ids;
    return r;
  };
  o.register_backoff_initial = 10ms;
  o.register_backoff_max = 50ms;
  o.watch_interval = 20ms;
  return o;
}

std::unique_ptr<PluginServer> MustCreate(PluginServer::Options o) {
  auto s = PluginServer::Create(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> Dial(const std::string& socket) {
  return v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
}

std::chrono::system_clock::time_point Deadline() { return std::chrono::system_clock::now() + 5s; }

bool HasHealth(const v1beta1::ListAndWatchResponse& s, const std::string& id,
               const std::string& h) {
  for (const auto& d : s.devices()) {
    if (d.id() == id) return d.health() == h;
  }
  return false;
}

class PluginServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    kubelet_ = std::make_unique<FakeRegistrationServer>(dir_.path());
    ASSERT_TRUE(kubelet_->Start());
  }
  TempSocketDir dir_;
  std::unique_ptr<FakeRegistrationServer> kubelet_;
};

TEST_F(PluginServerTest, RegistersWithKubeletAndServesOptions) {
  auto o = BaseOptions(dir_.path());
  o.pre_start_container = [](const std::vector<std::string>&) { return OkStatus(); };
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  EXPECT_TRUE(server->Registered());
  EXPECT_TRUE(server->LastRegistrationError().ok());

  auto requests = kubelet_->Requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].version(), "v1beta1");
  EXPECT_EQ(requests[0].endpoint(), "example.com_widget.sock");
  EXPECT_EQ(requests[0].resource_name(), kResource);
  EXPECT_TRUE(requests[0].options().pre_start_required());
  EXPECT_FALSE(requests[0].options().get_preferred_allocation_available());
  auto dialed = kubelet_->DialedOptions();
  ASSERT_EQ(dialed.size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(dialed[0], requests[0].options()));

  struct stat st;
  ASSERT_EQ(::stat(server->SocketPath().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  server->Stop();
}

TEST_F(PluginServerTest, RefusalSurfacesKubeletErrorThenRetries) {
  kubelet_->SetRefusal("the ResourceName \"example.com/widget\" is invalid");
  auto server = MustCreate(BaseOptions(dir_.path()));
  ASSERT_TRUE(server->Start().ok());
  // Wait for at least two refused attempts (back-off retries).
  WaitUntil([&] { return kubelet_->Requests().size() >= 2; }, 5s);
  ASSERT_GE(kubelet_->Requests().size(), 2u);
  Status err = server->LastRegistrationError();
  EXPECT_EQ(err.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(err.message().find("the ResourceName \"example.com/widget\" is invalid"),
            std::string::npos)
      << err;
  EXPECT_FALSE(server->Registered());
  EXPECT_EQ(server->RegistrationCount(), 0);

  kubelet_->SetRefusal(std::nullopt);
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  EXPECT_TRUE(server->LastRegistrationError().ok());
  server->Stop();
}

// The registration back-off is a wait on Options::clock: after a refusal the
// supervisor tries again only once the FakeClock has moved by the back-off,
// however long that takes in real time. Stop() then ends its watch_interval
// wait on a clock that never moves.
TEST_F(PluginServerTest, RegistrationBackoffMovesOnlyWithTheClock) {
  kubelet_->SetRefusal("not yet");
  auto clock = std::make_shared<FakeClock>();
  auto o = BaseOptions(dir_.path());
  o.clock = clock;
  o.register_backoff_initial = 30s;
  o.register_backoff_max = 30s;
  o.watch_interval = 10min;
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  // Refused once; the supervisor then sleeps on the clock (its one timer).
  ASSERT_TRUE(WaitUntil([&] { return kubelet_->Requests().size() >= 1; }, 10s));
  ASSERT_TRUE(clock->WaitForPendingTimers(1, 10s));
  kubelet_->SetRefusal(std::nullopt);

  clock->Advance(29s);  // not due yet: still sleeping, no second attempt
  ASSERT_TRUE(clock->WaitForPendingTimers(1, 10s));
  EXPECT_EQ(kubelet_->Requests().size(), 1u);
  EXPECT_EQ(server->RegistrationCount(), 0);
  EXPECT_FALSE(server->LastRegistrationError().ok());

  clock->Advance(1s);
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  EXPECT_EQ(kubelet_->Requests().size(), 2u);
  EXPECT_TRUE(server->LastRegistrationError().ok());
  server->Stop();
  EXPECT_EQ(clock->PendingTimers(), 0u);
}

TEST_F(PluginServerTest, ListAndWatchSendsFirstSnapshotThenUpdates) {
  auto server = MustCreate(BaseOptions(dir_.path()));
  ASSERT_TRUE(server->Start().ok());
  auto first = kubelet_->WaitForSnapshots(1);
  ASSERT_GE(first.size(), 1u);
  ASSERT_EQ(first[0].devices_size(), 3);
  EXPECT_EQ(first[0].devices(0).id(), "w0");
  EXPECT_EQ(first[0].devices(0).health(), "Healthy");
  ASSERT_EQ(first[0].devices(0).topology().nodes_size(), 1);
  EXPECT_EQ(first[0].devices(1).topology().nodes(0).id(), 1);
  EXPECT_FALSE(first[0].devices(2).has_topology());

  ASSERT_TRUE(server->SetHealth("w1", false).ok());
  auto unhealthy =
      kubelet_->WaitForSnapshot([](const auto& s) { return HasHealth(s, "w1", "Unhealthy"); });
  ASSERT_TRUE(unhealthy.has_value());
  EXPECT_EQ(unhealthy->devices_size(), 3) << "every message is a full snapshot";

  server->SetDevices({{"w9", true, {}}});
  auto replaced = kubelet_->WaitForSnapshot(
      [](const auto& s) { return s.devices_size() == 1 && s.devices(0).id() == "w9"; });
  EXPECT_TRUE(replaced.has_value());

  EXPECT_EQ(server->SetHealth("nope", false).code(), StatusCode::kNotFound);
  server->Stop();
}

TEST_F(PluginServerTest, RapidHealthFlipsEndOnTheNewestFullSnapshot) {
  auto server = MustCreate(BaseOptions(dir_.path()));
  ASSERT_TRUE(server->Start().ok());
  ASSERT_GE(kubelet_->WaitForSnapshots(1).size(), 1u);
  for (int i = 0; i < 500; ++i) ASSERT_TRUE(server->SetHealth("w0", i % 2 == 1).ok());
  // The last flip (i = 499) left w0 healthy; flip once more to a unique end state.
  ASSERT_TRUE(server->SetHealth("w2", false).ok());
  auto last =
      kubelet_->WaitForSnapshot([](const auto& s) { return HasHealth(s, "w2", "Unhealthy"); });
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(HasHealth(*last, "w0", "Healthy"));
  for (const auto& s : kubelet_->WaitForSnapshots(0)) EXPECT_EQ(s.devices_size(), 3);
  // Coalescing: never more messages than versions (501 changes + the first).
  EXPECT_LE(kubelet_->WaitForSnapshots(0).size(), 502u);
  server->Stop();
}

TEST_F(PluginServerTest, AllocateResponseRoundTripsUnchanged) {
  v1beta1::ContainerAllocateResponse canned;
  (*canned.mutable_envs())["A"] = "1";
  (*canned.mutable_annotations())["k"] = "v";
  auto* m = canned.add_mounts();
  m->set_container_path("/usr/lib/w");
  m->set_host_path("/opt/w");
  m->set_read_only(true);
  auto* d = canned.add_devices();
  d->set_container_path("/dev/w0");
  d->set_host_path("/dev/w0");
  d->set_permissions("rwm");
  canned.add_cdi_devices()->set_name("example.com/widget=w0");
  std::atomic<int> calls{0};
  auto o = BaseOptions(dir_.path());
  o.register_with_kubelet = false;
  o.allocate = [&](const v1beta1::ContainerAllocateRequest& req)
      -> StatusOr<v1beta1::ContainerAllocateResponse> {
    ++calls;
    if (req.devices_ids_size() == 0) return InvalidArgumentError("no devices requested");
    return canned;
  };
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  auto stub = Dial(server->SocketPath());

  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("w0");
  req.add_container_requests()->add_devices_ids("w1");
  v1beta1::AllocateResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  ASSERT_TRUE(stub->Allocate(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 2);
  EXPECT_TRUE(MessageDifferencer::Equals(resp.container_responses(0), canned));
  EXPECT_TRUE(MessageDifferencer::Equals(resp.container_responses(1), canned));
  EXPECT_EQ(calls.load(), 2);

  // A handler error reaches the caller with its code and text.
  v1beta1::AllocateRequest bad;
  bad.add_container_requests();
  grpc::ClientContext ctx2;
  ctx2.set_deadline(Deadline());
  grpc::Status s = stub->Allocate(&ctx2, bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "no devices requested");
  server->Stop();
}

TEST_F(PluginServerTest, PreferredAllocationRoundTripsAndIsAdvertised) {
  auto o = BaseOptions(dir_.path());
  o.register_with_kubelet = false;
  o.get_preferred_allocation = [](const v1beta1::ContainerPreferredAllocationRequest& req)
      -> StatusOr<v1beta1::ContainerPreferredAllocationResponse> {
    v1beta1::ContainerPreferredAllocationResponse r;
    for (const auto& id : req.must_include_deviceids()) r.add_deviceids(id);
    for (const auto& id : req.available_deviceids()) {
      if (r.deviceids_size() >= req.allocation_size()) break;
      if (std::find(r.deviceids().begin(), r.deviceids().end(), id) == r.deviceids().end()) {
        r.add_deviceids(id);
      }
    }
    return r;
  };
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  auto stub = Dial(server->SocketPath());

  v1beta1::DevicePluginOptions opts;
  grpc::ClientContext c0;
  ASSERT_TRUE(stub->GetDevicePluginOptions(&c0, v1beta1::Empty(), &opts).ok());
  EXPECT_TRUE(opts.get_preferred_allocation_available());
  EXPECT_FALSE(opts.pre_start_required());

  v1beta1::PreferredAllocationRequest req;
  auto* c = req.add_container_requests();
  c->add_available_deviceids("w0");
  c->add_available_deviceids("w1");
  c->add_available_deviceids("w2");
  c->add_must_include_deviceids("w2");
  c->set_allocation_size(2);
  v1beta1::PreferredAllocationResponse resp;
  grpc::ClientContext c1;
  ASSERT_TRUE(stub->GetPreferredAllocation(&c1, req, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  EXPECT_EQ(std::vector<std::string>(resp.container_responses(0).deviceids().begin(),
                                     resp.container_responses(0).deviceids().end()),
            (std::vector<std::string>{"w2", "w0"}));
  server->Stop();
}

TEST_F(PluginServerTest, PreferredAllocationNotOfferedIsUnimplemented) {
  auto o = BaseOptions(dir_.path());
  o.register_with_kubelet = false;
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  auto stub = Dial(server->SocketPath());
  v1beta1::PreferredAllocationResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub->GetPreferredAllocation(&ctx, v1beta1::PreferredAllocationRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  server->Stop();
}

TEST_F(PluginServerTest, PreStartContainerGetsTheDeviceIds) {
  std::mutex mu;
  std::vector<std::string> seen;
  auto o = BaseOptions(dir_.path());
  o.register_with_kubelet = false;
  o.pre_start_container = [&](const std::vector<std::string>& ids) {
    std::lock_guard lock(mu);
    seen = ids;
    return ids.size() > 2 ? FailedPreconditionError("too many") : OkStatus();
  };
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  auto stub = Dial(server->SocketPath());
  v1beta1::PreStartContainerRequest req;
  req.add_devices_ids("w0");
  req.add_devices_ids("w1");
  v1beta1::PreStartContainerResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->PreStartContainer(&ctx, req, &resp).ok());
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(seen, (std::vector<std::string>{"w0", "w1"}));
  }
  req.add_devices_ids("w2");
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub->PreStartContainer(&ctx2, req, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  server->Stop();
}

TEST_F(PluginServerTest, MethodPathsAnswerOnTheWire) {
  auto o = BaseOptions(dir_.path());
  o.register_with_kubelet = false;
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  auto channel =
      grpc::CreateChannel("unix:" + server->SocketPath(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::Slice no_bytes{std::string()};  // Empty encodes to zero bytes
  grpc::ByteBuffer request(&no_bytes, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status result;
  generic.UnaryCall(&ctx, "/v1beta1.DevicePlugin/GetDevicePluginOptions", grpc::StubOptions(),
                    &request, &response, [&](grpc::Status s) {
                      std::lock_guard lock(mu);
                      result = s;
                      done = true;
                      cv.notify_all();
                    });
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return done; }));
  EXPECT_TRUE(result.ok()) << result.error_message();
  lock.unlock();
  server->Stop();
}

TEST_F(PluginServerTest, ReRegistersWhenKubeletSockIsCreatedAgain) {
  auto server = MustCreate(BaseOptions(dir_.path()));
  ASSERT_TRUE(server->Start().ok());
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  // The kubelet restarts: its socket goes away and comes back (a new inode).
  kubelet_->Stop();
  kubelet_ = std::make_unique<FakeRegistrationServer>(dir_.path());
  ASSERT_TRUE(kubelet_->Start());
  ASSERT_TRUE(server->WaitForRegistrationCount(2, 10s));
  EXPECT_EQ(kubelet_->Requests().size(), 1u);
  EXPECT_GE(kubelet_->WaitForSnapshots(1).size(), 1u) << "the new kubelet gets a stream";
  server->Stop();
}

// A restarting kubelet gives both signals at once (plugin sockets deleted,
// kubelet.sock created again); the plugin answers with one registration.
TEST_F(PluginServerTest, RegressionOneKubeletRestartCausesOneRegistration) {
  auto server = MustCreate(BaseOptions(dir_.path()));
  ASSERT_TRUE(server->Start().ok());
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  kubelet_->Stop();
  ASSERT_EQ(::unlink(server->SocketPath().c_str()), 0);
  kubelet_ = std::make_unique<FakeRegistrationServer>(dir_.path());
  ASSERT_TRUE(kubelet_->Start());
  ASSERT_TRUE(server->WaitForRegistrationCount(2, 10s));
  // Give a spurious second registration the chance to happen.
  EXPECT_FALSE(server->WaitForRegistrationCount(3, 1s));
  EXPECT_EQ(kubelet_->Requests().size(), 1u);
  server->Stop();
}

TEST_F(PluginServerTest, ServesAgainWhenItsOwnSocketIsDeleted) {
  auto server = MustCreate(BaseOptions(dir_.path()));
  ASSERT_TRUE(server->Start().ok());
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  ASSERT_EQ(::unlink(server->SocketPath().c_str()), 0);
  ASSERT_TRUE(server->WaitForRegistrationCount(2, 10s));
  EXPECT_TRUE(std::filesystem::exists(server->SocketPath()));
  // The new socket answers.
  auto stub = Dial(server->SocketPath());
  v1beta1::DevicePluginOptions opts;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  EXPECT_TRUE(stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &opts).ok());
  server->Stop();
}

// Found by the soak (test/soak): a kubelet starting while the plugin binds
// deleted the new socket before the plugin recorded its identity; the plugin
// then took "no socket" for its own and never served again, so every
// registration was refused ("invalid endpoint ... no such file").
TEST_F(PluginServerTest, RegressionSocketDeletedBetweenBindAndStatIsServedAgain) {
  PluginServer::Options o = BaseOptions(dir_.path());
  auto deleted = std::make_shared<std::atomic<int>>(0);
  std::string socket = dir_.path() + "/example.com_widget.sock";
  o.after_bind_for_test = [deleted, socket] {
    if (deleted->fetch_add(1) == 0) ::unlink(socket.c_str());
  };
  auto server = MustCreate(std::move(o));
  ASSERT_EQ(server->SocketPath(), socket);
  ASSERT_TRUE(server->Start().ok());
  // The hook may run after the first socket file appeared (slow machines,
  // TSAN): wait for the second bind, not only for a file.
  WaitUntil([&] { return deleted->load() >= 2 && std::filesystem::exists(socket); }, 10s);
  ASSERT_GE(deleted->load(), 2) << "never bound a second time";
  ASSERT_TRUE(std::filesystem::exists(socket)) << "the plugin never served again";
  auto stub = Dial(socket);
  v1beta1::DevicePluginOptions opts;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  EXPECT_TRUE(stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &opts).ok());
  server->Stop();
}

TEST_F(PluginServerTest, StopEndsStreamsRemovesSocketAndIsIdempotent) {
  auto server = MustCreate(BaseOptions(dir_.path()));
  ASSERT_TRUE(server->Start().ok());
  ASSERT_GE(kubelet_->WaitForSnapshots(1).size(), 1u);
  WaitUntil([&] { return server->OpenStreams() == 1; }, 5s);
  EXPECT_EQ(server->OpenStreams(), 1);
  std::string socket = server->SocketPath();
  server->Stop();
  EXPECT_EQ(server->OpenStreams(), 0);
  EXPECT_FALSE(std::filesystem::exists(socket));
  server->Stop();  // twice is fine
  EXPECT_EQ(server->Start().code(), StatusCode::kFailedPrecondition);
}

TEST_F(PluginServerTest, StopWithoutStartIsFine) {
  auto server = MustCreate(BaseOptions(dir_.path()));
  server->Stop();
  server->Stop();
  EXPECT_FALSE(server->Registered());
}

TEST_F(PluginServerTest, RemovesAStaleSocketFileFirst) {
  std::string stale = dir_.path() + "/" + DefaultSocketName(kResource);
  { std::ofstream(stale) << "left over"; }
  auto server = MustCreate(BaseOptions(dir_.path()));
  ASSERT_TRUE(server->Start().ok());
  struct stat st;
  ASSERT_EQ(::stat(stale.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  server->Stop();
}

// ------------------------------------------------------------- bad input --

TEST(PluginServerBadInput, EmptyResourceName) {
  auto o = BaseOptions("/tmp");
  o.resource_name = "";
  auto s = PluginServer::Create(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("resource_name is empty"), std::string::npos);
}

TEST(PluginServerBadInput, NullClock) {
  PluginServer::Options o = AllocateNothingOptions(kResource, "/tmp", {});
  o.clock = nullptr;
  auto server = PluginServer::Create(std::move(o));
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
}

TEST(PluginServerBadInput, MissingAllocateHandler) {
  auto o = BaseOptions("/tmp");
  o.allocate = nullptr;
  auto s = PluginServer::Create(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no Allocate handler"), std::string::npos);
}

TEST(PluginServerBadInput, SocketPathLongerThanAUnixSocketAllows) {
  auto o = BaseOptions("/tmp/" + std::string(120, 'd'));
  auto s = PluginServer::Create(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("longer than the 107 bytes a unix socket path allows"),
            std::string::npos)
      << s.status();
}

TEST(PluginServerBadInput, SocketNameWithASlash) {
  auto o = BaseOptions("/tmp");
  o.socket_name = "../escape.sock";
  auto s = PluginServer::Create(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("plain file name"), std::string::npos) << s.status();
}

TEST(PluginServerBadInput, MissingDirectory) {
  TempSocketDir dir;
  auto server = MustCreate(BaseOptions(dir.path() + "/missing"));
  Status s = server->Start();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("does not exist"), std::string::npos) << s;
}

TEST(PluginServerBadInput, UnwritableDirectory) {
  // Root may write anywhere, so the check runs as 'nobody' in a child.
  TempSocketDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  std::string locked = dir.path() + "/locked";
  ASSERT_EQ(::mkdir(locked.c_str(), 0755), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::getuid() == 0 && ::setuid(65534) != 0) _exit(10);
    auto server = PluginServer::Create(BaseOptions(locked));
    if (!server.ok()) _exit(11);
    Status s = (*server)->Start();
    if (s.code() != StatusCode::kPermissionDenied) _exit(12);
    if (s.message().find("not writable") == std::string::npos) _exit(13);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child check failed with code " << WEXITSTATUS(status);
}

// --- the handler interface ---------------------------------------------------

// A handler written against the interface directly: whole requests, its own
// options, errors, and a ListAndWatch that decorates the SDK's stream.
class WidgetHandler final : public DevicePluginHandler {
 public:
  StatusOr<v1beta1::DevicePluginOptions> GetDevicePluginOptions() override {
    if (options_error) return FailedPreconditionError("options unavailable");
    v1beta1::DevicePluginOptions o;
    o.set_pre_start_required(true);
    o.set_get_preferred_allocation_available(true);
    return o;
  }

  Status ListAndWatch(ListAndWatchStream& stream) override {
    if (refuse_streams) return NotFoundError("no streams today");
    // The SDK's snapshots, every id prefixed on its way out.
    class Prefixing final : public ForwardingStream {
     public:
      using ForwardingStream::ForwardingStream;
      bool Write(const v1beta1::ListAndWatchResponse& message) override {
        v1beta1::ListAndWatchResponse renamed = message;
        for (auto& d : *renamed.mutable_devices()) d.set_id("x-" + d.id());
        return inner().Write(renamed);
      }
    };
    Prefixing prefixing(stream);
    return StreamSnapshots(prefixing);
  }

  StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& request,
                                               CallContext& call) override {
    allocate_calls.fetch_add(1);
    EXPECT_FALSE(call.ClientGone());
    EXPECT_FALSE(call.Ended());
    v1beta1::AllocateResponse r;
    for (const auto& c : request.container_requests()) {
      if (c.devices_ids().empty()) return InvalidArgumentError("container without devices");
      (*r.add_container_responses()->mutable_envs())["CONTAINERS"] =
          std::to_string(request.container_requests_size());
    }
    return r;
  }

  StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, CallContext&) override {
    return PreferEachContainer(request, [](const v1beta1::ContainerPreferredAllocationRequest& c) {
      v1beta1::ContainerPreferredAllocationResponse r;
      for (int i = 0; i < c.allocation_size() && i < c.available_deviceids_size(); ++i) {
        r.add_deviceids(c.available_deviceids(i));
      }
      return r;
    });
  }

  Status PreStartContainer(const std::vector<std::string>& ids, CallContext&) override {
    if (std::find(ids.begin(), ids.end(), "w2") != ids.end()) {
      return ResourceExhaustedError("w2 is warming up");
    }
    return OkStatus();
  }

  std::atomic<bool> options_error{false};
  std::atomic<bool> refuse_streams{false};
  std::atomic<int> allocate_calls{0};
};

PluginServer::Options HandlerOptions(const std::string& dir,
                                     std::shared_ptr<DevicePluginHandler> handler) {
  PluginServer::Options o = BaseOptions(dir);
  o.allocate = nullptr;
  o.handler = std::move(handler);
  return o;
}

TEST_F(PluginServerTest, ServesAHandlerItsOptionsAnswersAndErrors) {
  auto handler = std::make_shared<WidgetHandler>();
  auto server = MustCreate(HandlerOptions(dir_.path(), handler));
  ASSERT_TRUE(server->Start().ok());
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  auto requests = kubelet_->Requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_TRUE(requests[0].options().pre_start_required());
  EXPECT_TRUE(requests[0].options().get_preferred_allocation_available());

  auto stub = Dial(server->SocketPath());
  {
    // One Allocate call with two containers reaches the handler once, whole.
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("w0");
    req.add_container_requests()->add_devices_ids("w1");
    v1beta1::AllocateResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    ASSERT_TRUE(stub->Allocate(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.container_responses_size(), 2);
    EXPECT_EQ(resp.container_responses(1).envs().at("CONTAINERS"), "2");
    EXPECT_EQ(handler->allocate_calls.load(), 1);
  }
  {
    v1beta1::AllocateRequest req;
    req.add_container_requests();
    v1beta1::AllocateResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    grpc::Status s = stub->Allocate(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "container without devices");
  }
  {
    v1beta1::PreferredAllocationRequest req;
    auto* c = req.add_container_requests();
    c->add_available_deviceids("w2");
    c->add_available_deviceids("w1");
    c->set_allocation_size(1);
    v1beta1::PreferredAllocationResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    ASSERT_TRUE(stub->GetPreferredAllocation(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.container_responses_size(), 1);
    ASSERT_EQ(resp.container_responses(0).deviceids_size(), 1);
    EXPECT_EQ(resp.container_responses(0).deviceids(0), "w2");
  }
  {
    v1beta1::PreStartContainerRequest req;
    req.add_devices_ids("w2");
    v1beta1::PreStartContainerResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    grpc::Status s = stub->PreStartContainer(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(s.error_message(), "w2 is warming up");
  }
  {
    // The handler decorates the SDK's stream: the snapshot, ids rewritten.
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    auto stream = stub->ListAndWatch(&ctx, v1beta1::Empty());
    v1beta1::ListAndWatchResponse first;
    ASSERT_TRUE(stream->Read(&first));
    ASSERT_EQ(first.devices_size(), 3);
    EXPECT_EQ(first.devices(0).id(), "x-w0");
    ASSERT_TRUE(server->SetHealth("w1", false).ok());
    v1beta1::ListAndWatchResponse second;
    ASSERT_TRUE(stream->Read(&second));
    EXPECT_TRUE(HasHealth(second, "x-w1", "Unhealthy"));
    ctx.TryCancel();
    stream->Finish();
  }
  {
    // A stream's Status is the stream's end.
    handler->refuse_streams = true;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    auto stream = stub->ListAndWatch(&ctx, v1beta1::Empty());
    v1beta1::ListAndWatchResponse msg;
    EXPECT_FALSE(stream->Read(&msg));
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(), "no streams today");
  }
  {
    handler->options_error = true;
    v1beta1::DevicePluginOptions o;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    EXPECT_EQ(stub->GetDevicePluginOptions(&ctx, v1beta1::Empty(), &o).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  server->Stop();
}

TEST_F(PluginServerTest, OptionsErrorFailsTheRegistrationAttempt) {
  auto handler = std::make_shared<WidgetHandler>();
  handler->options_error = true;
  auto server = MustCreate(HandlerOptions(dir_.path(), handler));
  ASSERT_TRUE(server->Start().ok());
  Status err;
  for (int i = 0; i < 500 && err.ok(); ++i) {
    err = server->LastRegistrationError();
    if (err.ok()) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(err.code(), StatusCode::kFailedPrecondition) << err;
  EXPECT_NE(err.message().find("options unavailable"), std::string::npos) << err;
  EXPECT_TRUE(kubelet_->Requests().empty()) << "nothing is sent without options";
  handler->options_error = false;
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  server->Stop();
}

TEST(PluginServerBadInput, HandlerAndFunctionsTogetherAreRefused) {
  TempSocketDir dir;
  PluginServer::Options o = BaseOptions(dir.path());
  o.handler = std::make_shared<WidgetHandler>();
  auto s = PluginServer::Create(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("not both"), std::string::npos) << s.status();
}

TEST_F(PluginServerTest, RewriteHookChangesTheRequestAndCanWithholdIt) {
  std::atomic<int> calls{0};
  auto o = BaseOptions(dir_.path());
  o.rewrite_register_request = [&calls](v1beta1::RegisterRequest& r, int registrations) {
    calls.fetch_add(1);
    r.set_resource_name("example.com/renamed");
    return registrations == 0;  // register once, never again
  };
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  ASSERT_TRUE(server->WaitForRegistrationCount(1, 10s));
  auto requests = kubelet_->Requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].resource_name(), "example.com/renamed");
  EXPECT_EQ(requests[0].endpoint(), "example.com_widget.sock");

  // A kubelet restart: the hook is asked again and withholds.
  kubelet_->Stop();
  ASSERT_TRUE(kubelet_->Start());
  for (int i = 0; i < 1000 && calls.load() < 2; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(calls.load(), 2);
  EXPECT_EQ(server->RegistrationCount(), 1);
  EXPECT_TRUE(server->LastRegistrationError().ok()) << "withholding is not a failure";
  EXPECT_EQ(kubelet_->Requests().size(), 1u);
  server->Stop();
}

// The stream waits on its condition: nothing that is not a new snapshot
// wakes it, and a new snapshot reaches the client at once (the cancellation
// check, the one bounded part of the wait, is an hour away here).
TEST_F(PluginServerTest, IdleStreamDoesNotWakeAndAChangeArrivesAtOnce) {
  auto o = BaseOptions(dir_.path());
  o.register_with_kubelet = false;
  o.cancel_check_interval = std::chrono::hours(1);
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  auto stub = Dial(server->SocketPath());
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = stub->ListAndWatch(&ctx, v1beta1::Empty());
  v1beta1::ListAndWatchResponse first;
  ASSERT_TRUE(stream->Read(&first));
  const uint64_t before = server->StreamWakeupsForTest();
  // Not changes: the same health again, reads of the state.
  ASSERT_TRUE(server->SetHealth("w0", true).ok());
  EXPECT_EQ(server->Devices().size(), 3u);
  EXPECT_EQ(server->OpenStreams(), 1);
  // Long enough for the old stream (it woke every 100 ms) to have woken.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(server->StreamWakeupsForTest(), before) << "an idle stream woke up";

  ASSERT_TRUE(server->SetHealth("w1", false).ok());
  v1beta1::ListAndWatchResponse second;
  ASSERT_TRUE(stream->Read(&second)) << "the change did not arrive before the client's deadline";
  EXPECT_TRUE(HasHealth(second, "w1", "Unhealthy"));
  EXPECT_EQ(server->StreamWakeupsForTest(), before + 1) << "one change, one wake";
  // Stop ends the waiting stream without the cancellation check.
  server->Stop();
  v1beta1::ListAndWatchResponse none;
  EXPECT_FALSE(stream->Read(&none));
  stream->Finish();
}

// --- ids the server does not list (issue 30, item 3) --------------------------

// One Allocate of `ids` in one container; the call's status.
grpc::Status AllocateIds(v1beta1::DevicePlugin::Stub& stub, const std::vector<std::string>& ids,
                         v1beta1::AllocateResponse* response) {
  v1beta1::AllocateRequest req;
  auto* c = req.add_container_requests();
  for (const std::string& id : ids) c->add_devices_ids(id);
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  return stub.Allocate(&ctx, req, response);
}

TEST_F(PluginServerTest, RegressionUnlistedIdsNeverReachTheFunctions) {
  std::atomic<int> allocates{0}, prefers{0}, pre_starts{0};
  auto o = BaseOptions(dir_.path());
  o.register_with_kubelet = false;
  o.allocate = [&](const v1beta1::ContainerAllocateRequest&)
      -> StatusOr<v1beta1::ContainerAllocateResponse> {
    ++allocates;
    return v1beta1::ContainerAllocateResponse();
  };
  o.get_preferred_allocation = [&](const v1beta1::ContainerPreferredAllocationRequest&)
      -> StatusOr<v1beta1::ContainerPreferredAllocationResponse> {
    ++prefers;
    return v1beta1::ContainerPreferredAllocationResponse();
  };
  o.pre_start_container = [&](const std::vector<std::string>&) {
    ++pre_starts;
    return OkStatus();
  };
  auto server = MustCreate(std::move(o));
  ASSERT_TRUE(server->Start().ok());
  auto stub = Dial(server->SocketPath());
  v1beta1::AllocateResponse resp;

  // An unknown id in the second container: NOT_FOUND naming it, and the
  // first container's (listed) id does not reach the function either.
  {
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("w0");
    req.add_container_requests()->add_devices_ids("gpu-9");
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    grpc::Status s = stub->Allocate(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(),
              "Allocate: device \"gpu-9\" is not a device of example.com/widget");
  }
  // Garbage, near misses and path tricks: each refused in one capped line.
  const std::vector<std::string> bad = {"",
                                        "W0",
                                        "w0 ",
                                        " w0",
                                        "w",
                                        "w00",
                                        "../w0",
                                        "w0\nw1",
                                        std::string("w0\0", 3),
                                        std::string(1 << 20, 'w')};
  for (const std::string& id : bad) {
    grpc::Status s = AllocateIds(*stub, {"w1", id}, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << id.size();
    EXPECT_EQ(s.error_message().find('\n'), std::string::npos) << s.error_message();
    EXPECT_LT(s.error_message().size(), 400u) << id.size();
    EXPECT_NE(s.error_message().find("is not a device of example.com/widget"), std::string::npos);
  }
  {
    v1beta1::PreferredAllocationRequest req;
    auto* c = req.add_container_requests();
    c->add_available_deviceids("w0");
    c->add_available_deviceids("nope");
    c->set_allocation_size(1);
    v1beta1::PreferredAllocationResponse presp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    grpc::Status s = stub->GetPreferredAllocation(&ctx, req, &presp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(),
              "GetPreferredAllocation: device \"nope\" is not a device of example.com/widget");
    c->clear_available_deviceids();
    c->add_available_deviceids("w0");
    c->add_must_include_deviceids("w9");
    grpc::ClientContext ctx2;
    ctx2.set_deadline(Deadline());
    s = stub->GetPreferredAllocation(&ctx2, req, &presp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("\"w9\""), std::string::npos) << s.error_message();
  }
  {
    v1beta1::PreStartContainerRequest req;
    req.add_devices_ids("w1");
    req.add_devices_ids("fpga0");
    v1beta1::PreStartContainerResponse presp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    grpc::Status s = stub->PreStartContainer(&ctx, req, &presp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(s.error_message(),
              "PreStartContainer: device \"fpga0\" is not a device of example.com/widget");
  }
  EXPECT_EQ(allocates.load(), 0);
  EXPECT_EQ(prefers.load(), 0);
  EXPECT_EQ(pre_starts.load(), 0);

  // Listed ids still pass, unhealthy ones too (health is the kubelet's to judge).
  ASSERT_TRUE(server->SetHealth("w2", false).ok());
  EXPECT_TRUE(AllocateIds(*stub, {"w0", "w2"}, &resp).ok());
  EXPECT_EQ(allocates.load(), 1);
  // The check follows SetDevices: w0 is gone, w7 is new.
  server->SetDevices({{"w7", true, {}}});
  EXPECT_EQ(AllocateIds(*stub, {"w0"}, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(AllocateIds(*stub, {"w7"}, &resp).ok());
  EXPECT_EQ(allocates.load(), 2);
  server->Stop();
}

TEST_F(PluginServerTest, AHandlerSeesOnlyListedIdsUnlessTheCheckIsOff) {
  for (bool refuse : {true, false}) {
    SCOPED_TRACE(refuse ? "refuse_unlisted_ids" : "check off");
    auto handler = std::make_shared<WidgetHandler>();
    auto o = HandlerOptions(dir_.path(), handler);
    o.register_with_kubelet = false;
    o.refuse_unlisted_ids = refuse;
    auto server = MustCreate(std::move(o));
    ASSERT_TRUE(server->Start().ok());
    auto stub = Dial(server->SocketPath());
    v1beta1::AllocateResponse resp;
    grpc::Status s = AllocateIds(*stub, {"x-w0"}, &resp);  // the name its stream shows
    if (refuse) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
      EXPECT_EQ(handler->allocate_calls.load(), 0);
    } else {
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(handler->allocate_calls.load(), 1);
    }
    server->Stop();
  }
}

}  // namespace
}  // namespace kdm::plugin
