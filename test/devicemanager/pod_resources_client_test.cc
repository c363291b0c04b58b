// PodResourcesClient against the real PodResourcesServer over a real unix
// socket, answered by a real Manager with SDK plugins registered to it; and
// against sockets that misbehave (nobody listening, nobody answering).
#include "kdm/devicemanager/pod_resources_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/pod_resources_server.h"
#include "kdm/pluginapi/sdk/plugin_server.h"

namespace kdm::devicemanager {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr char kClientGpu[] = "example.com/gpu";
constexpr char kClientNic[] = "example.com/nic";

Container MakeClientContainer(const std::string& name, std::map<std::string, int64_t> devices) {
  Container c;
  c.name = name;
  for (const auto& [r, n] : devices) {
    c.limits[r] = Quantity::FromInt(n);
    c.requests[r] = Quantity::FromInt(n);
  }
  return c;
}

std::unique_ptr<plugin::PluginServer> StartClientPlugin(const std::string& dir,
                                                        const std::string& resource,
                                                        std::vector<plugin::Device> devices) {
  plugin::PluginServer::Options o =
      plugin::AllocateNothingOptions(resource, dir, std::move(devices));
  o.register_backoff_initial = 10ms;
  auto server = plugin::PluginServer::Create(std::move(o));
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  Status s = (*server)->Start();
  EXPECT_TRUE(s.ok()) << s;
  if (!s.ok()) return nullptr;
  EXPECT_TRUE((*server)->WaitForRegistrationCount(1, 10s)) << resource << " did not register";
  return std::move(*server);
}

// A private directory per test (a unix socket path has at most 107 bytes).
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kdm-prc-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    path_ = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A unix socket bound at `path`; listening (connections are queued and never
// answered) or not (connections are refused). Closed on destruction.
class SilentSocket {
 public:
  SilentSocket(const std::string& path, bool listen) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (listen) {
      EXPECT_EQ(::listen(fd_, 16), 0);
    } else {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~SilentSocket() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

class PodResourcesClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Manager::Options mo;
    mo.plugin_dir = dir_.path() + "/dp";
    mo.registration_timeout = 5s;
    mo.rpc_timeout = 5s;
    mo.active_pods = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      std::set<std::string> uids;
      for (const auto& p : pods_) uids.insert(p.uid);
      return uids;
    };
    auto m = Manager::Create(std::move(mo));
    ASSERT_TRUE(m.ok()) << m.status();
    manager_ = std::move(*m);
    ASSERT_TRUE(manager_->Start().ok());
    // gpu2 spans NUMA nodes 0 and 1; the NIC has no topology.
    gpu_ = StartClientPlugin(dir_.path() + "/dp", kClientGpu,
                             {{"gpu0", true, {0}}, {"gpu1", true, {1}}, {"gpu2", true, {0, 1}}});
    nic_ = StartClientPlugin(dir_.path() + "/dp", kClientNic, {{"nic0", true, {}}});
    ASSERT_NE(gpu_, nullptr);
    ASSERT_NE(nic_, nullptr);

    PodResourcesServer::Options o;
    o.socket_path = socket();
    o.manager = manager_.get();
    o.active_pods = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<ActivePod> out;
      for (const auto& p : pods_) out.push_back(ActivePodOf(p));
      return out;
    };
    auto s = PodResourcesServer::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  void TearDown() override {
    if (server_) server_->Stop();
    if (manager_) manager_->Stop();
    if (gpu_) gpu_->Stop();
    if (nic_) nic_->Stop();
  }

  std::string socket() const { return dir_.path() + "/pod-resources/kubelet.sock"; }

  void Admit(const Pod& pod) {
    for (const auto& c : pod.containers) {
      Status s = manager_->Allocate(pod, c.name);
      ASSERT_TRUE(s.ok()) << s;
    }
    std::lock_guard<std::mutex> lock(mu_);
    pods_.push_back(pod);
  }

  std::unique_ptr<PodResourcesClient> Client(std::chrono::milliseconds timeout = 5s) {
    auto client = PodResourcesClient::Connect({.socket_path = socket(), .timeout = timeout});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  TempDir dir_;
  std::unique_ptr<Manager> manager_;
  std::unique_ptr<plugin::PluginServer> gpu_, nic_;
  std::unique_ptr<PodResourcesServer> server_;
  std::mutex mu_;
  std::vector<Pod> pods_;
};

Pod MakeClientPod(const std::string& name, std::vector<Container> app,
                  const std::string& ns = "default") {
  Pod p;
  p.uid = "uid-" + ns + "-" + name;
  p.namespace_name = ns;
  p.name = name;
  p.containers = std::move(app);
  return p;
}

TEST_F(PodResourcesClientTest, ListReportsPodsContainersAndOneEntryPerDevicePerNumaNode) {
  Admit(MakeClientPod("train", {MakeClientContainer("main", {{kClientGpu, 3}, {kClientNic, 1}}),
                                MakeClientContainer("log", {})}));
  Admit(MakeClientPod("idle", {MakeClientContainer("app", {})}, "batch"));
  auto client = Client();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->socket_path(), socket());

  auto pods = client->List();
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 2u);
  const PodResources& train = (*pods)[0];
  EXPECT_EQ(train.namespace_name, "default");
  EXPECT_EQ(train.name, "train");
  ASSERT_EQ(train.containers.size(), 2u);
  EXPECT_EQ(train.containers[0].name, "main");
  EXPECT_THAT(train.containers[0].devices,
              UnorderedElementsAre(ContainerDevices{kClientGpu, {"gpu0"}, 0},
                                   ContainerDevices{kClientGpu, {"gpu1"}, 1},
                                   ContainerDevices{kClientGpu, {"gpu2"}, 0},
                                   ContainerDevices{kClientGpu, {"gpu2"}, 1},
                                   ContainerDevices{kClientNic, {"nic0"}, std::nullopt}));
  EXPECT_EQ(train.containers[1].name, "log");
  EXPECT_THAT(train.containers[1].devices, IsEmpty());
  EXPECT_EQ((*pods)[1].namespace_name, "batch");
  EXPECT_EQ((*pods)[1].name, "idle");
}

TEST_F(PodResourcesClientTest, GetAllocatableResourcesReportsTheHealthyDevices) {
  auto client = Client();
  ASSERT_NE(client, nullptr);
  auto devices = client->GetAllocatableResources();
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_THAT(*devices, UnorderedElementsAre(ContainerDevices{kClientGpu, {"gpu0"}, 0},
                                             ContainerDevices{kClientGpu, {"gpu1"}, 1},
                                             ContainerDevices{kClientGpu, {"gpu2"}, 0},
                                             ContainerDevices{kClientGpu, {"gpu2"}, 1},
                                             ContainerDevices{kClientNic, {"nic0"}, std::nullopt}));
  // The same answer through another client: the calls hold no state.
  auto again = Client()->GetAllocatableResources();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->size(), devices->size());
}

TEST_F(PodResourcesClientTest, ConnectRefusesBadOptionsAndMissingSockets) {
  auto bad = PodResourcesClient::Connect({.socket_path = ""});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  bad = PodResourcesClient::Connect({.socket_path = "/" + std::string(200, 'x') + ".sock"});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("107"));
  bad = PodResourcesClient::Connect({.socket_path = socket(), .timeout = 0ms});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("timeout must be positive"));

  const std::string missing = dir_.path() + "/none.sock";
  bad = PodResourcesClient::Connect({.socket_path = missing});
  EXPECT_EQ(bad.status(), NotFoundError("pod-resources socket " + missing + " does not exist"));
  const std::string file = dir_.path() + "/file.sock";
  std::ofstream(file) << "x";
  bad = PodResourcesClient::Connect({.socket_path = file});
  EXPECT_EQ(bad.status(),
            FailedPreconditionError("pod-resources socket " + file + " is not a socket"));
}

TEST_F(PodResourcesClientTest, ASocketNobodyServesFailsNamingTheMethodAndTheSocket) {
  const std::string path = dir_.path() + "/stale.sock";
  SilentSocket stale(path, /*listen=*/false);  // bound, never listened: refused
  auto client = PodResourcesClient::Connect({.socket_path = path, .timeout = 2s});
  ASSERT_TRUE(client.ok()) << client.status();
  auto pods = (*client)->List();
  ASSERT_FALSE(pods.ok());
  EXPECT_THAT(pods.status().message(), HasSubstr("List on " + path + " failed: "));
  auto devices = (*client)->GetAllocatableResources();
  ASSERT_FALSE(devices.ok());
  EXPECT_THAT(devices.status().message(),
              HasSubstr("GetAllocatableResources on " + path + " failed: "));
}

TEST_F(PodResourcesClientTest, AServerThatNeverAnswersIsBoundedByTheDeadline) {
  const std::string path = dir_.path() + "/silent.sock";
  SilentSocket silent(path, /*listen=*/true);  // accepts into the backlog, never speaks
  auto client = PodResourcesClient::Connect({.socket_path = path, .timeout = 300ms});
  ASSERT_TRUE(client.ok()) << client.status();
  auto pods = (*client)->List();  // returns: the deadline, not the silent server, ends it
  ASSERT_FALSE(pods.ok());
  EXPECT_EQ(pods.status().code(), StatusCode::kDeadlineExceeded) << pods.status();
  EXPECT_THAT(pods.status().message(), HasSubstr("List on " + path + " failed"));
}

TEST_F(PodResourcesClientTest, ARelativeSocketPathIsDialed) {
  // Dialed from the fixture's directory, wherever the binary was started.
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(dir_.path());
  struct Restore {
    std::filesystem::path path;
    ~Restore() { std::filesystem::current_path(path); }
  } restore{before};
  const std::string relative = "pod-resources/kubelet.sock";
  ASSERT_TRUE(std::filesystem::exists(relative));
  auto client = PodResourcesClient::Connect({.socket_path = relative});
  ASSERT_TRUE(client.ok()) << client.status();
  auto devices = (*client)->GetAllocatableResources();
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_EQ(devices->size(), 5u);
}

}  // namespace
}  // namespace kdm::devicemanager
