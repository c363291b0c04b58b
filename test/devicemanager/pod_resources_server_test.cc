// PodResourcesServer over a real unix socket, answered by a real Manager with
// SDK plugins (kdm::plugin::PluginServer) registered to it.
#include "kdm/devicemanager/pod_resources_server.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kdm/devicemanager/manager.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "podresources/v1/api.grpc.pb.h"

namespace kdm::devicemanager {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kGpu[] = "example.com/gpu";
constexpr char kNic[] = "example.com/nic";

// One device entry of a pod-resources answer, flattened for comparisons.
struct Entry {
  std::string resource;
  std::vector<std::string> ids;
  std::vector<int64_t> numa;
  friend bool operator==(const Entry&, const Entry&) = default;
  friend std::ostream& operator<<(std::ostream& os, const Entry& e) {
    os << e.resource << "[";
    for (const auto& id : e.ids) os << id << " ";
    os << "] numa[";
    for (int64_t n : e.numa) os << n << " ";
    return os << "]";
  }
};

std::vector<Entry> Flatten(const google::protobuf::RepeatedPtrField<v1::ContainerDevices>& in) {
  std::vector<Entry> out;
  for (const auto& d : in) {
    Entry e{d.resource_name(), {d.device_ids().begin(), d.device_ids().end()}, {}};
    for (const auto& n : d.topology().nodes()) e.numa.push_back(n.id());
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.resource, a.ids, a.numa) < std::tie(b.resource, b.ids, b.numa);
  });
  return out;
}

Container MakeContainer(const std::string& name, std::map<std::string, int64_t> devices,
                        bool restartable = false) {
  Container c;
  c.name = name;
  c.restartable = restartable;
  for (const auto& [r, n] : devices) {
    c.limits[r] = Quantity::FromInt(n);
    c.requests[r] = Quantity::FromInt(n);
  }
  return c;
}

std::unique_ptr<plugin::PluginServer> StartPlugin(const std::string& dir,
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

class PodResourcesServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-pr-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    Manager::Options mo;
    mo.plugin_dir = root_ + "/dp";
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
    subscription_ = manager_->Subscribe([this](const std::vector<DeviceHealthEvent>& events) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& e : events) health_events_.push_back(e);
      health_cv_.notify_all();
    });
    // 4 GPUs on 2 NUMA nodes, one more GPU spanning both; 2 NICs without
    // topology.
    gpu_ = StartPlugin(mo_dir(), kGpu,
                       {{"gpu0", true, {0}},
                        {"gpu1", true, {0}},
                        {"gpu2", true, {1}},
                        {"gpu3", true, {1}},
                        {"gpu4", true, {0, 1}}});
    nic_ = StartPlugin(mo_dir(), kNic, {{"nic0", true, {}}, {"nic1", true, {}}});
    ASSERT_NE(gpu_, nullptr);
    ASSERT_NE(nic_, nullptr);
    ASSERT_EQ(manager_->GetCapacity().resources[kGpu].allocatable, 5);
    ASSERT_EQ(manager_->GetCapacity().resources[kNic].allocatable, 2);
  }

  void TearDown() override {
    if (server_) server_->Stop();
    if (manager_) {
      manager_->Unsubscribe(subscription_);
      manager_->Stop();
    }
    if (gpu_) gpu_->Stop();
    if (nic_) nic_->Stop();
    std::filesystem::remove_all(root_);
  }

  std::string mo_dir() const { return root_ + "/dp"; }
  std::string socket() const { return root_ + "/pod-resources/kubelet.sock"; }

  void StartServer() {
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
    stub_ = v1::PodResourcesLister::NewStub(
        grpc::CreateChannel("unix://" + socket(), grpc::InsecureChannelCredentials()));
  }

  // Admits `pod` as the kubelet does (init containers, then app
  // containers) and makes it active.
  void Admit(const Pod& pod) {
    for (const auto& c : pod.init_containers) {
      Status s = manager_->Allocate(pod, c.name);
      ASSERT_TRUE(s.ok()) << s;
    }
    for (const auto& c : pod.containers) {
      Status s = manager_->Allocate(pod, c.name);
      ASSERT_TRUE(s.ok()) << s;
    }
    std::lock_guard<std::mutex> lock(mu_);
    pods_.push_back(pod);
  }

  grpc::Status List(v1::ListPodResourcesResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    return stub_->List(&ctx, v1::ListPodResourcesRequest(), out);
  }
  grpc::Status Get(const std::string& name, const std::string& ns,
                   v1::GetPodResourcesResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::GetPodResourcesRequest req;
    req.set_pod_name(name);
    req.set_pod_namespace(ns);
    return stub_->Get(&ctx, req, out);
  }
  grpc::Status Allocatable(v1::AllocatableResourcesResponse* out) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    return stub_->GetAllocatableResources(&ctx, v1::AllocatableResourcesRequest(), out);
  }

  // Devices of `container` in `pod` as the API reports them.
  static std::vector<Entry> DevicesOf(const v1::PodResources& pod, const std::string& container) {
    for (const auto& c : pod.containers()) {
      if (c.name() == container) return Flatten(c.devices());
    }
    ADD_FAILURE() << "no container " << container << " in pod " << pod.name();
    return {};
  }

  std::string root_;
  std::unique_ptr<Manager> manager_;
  std::unique_ptr<plugin::PluginServer> gpu_, nic_;
  std::unique_ptr<PodResourcesServer> server_;
  std::unique_ptr<v1::PodResourcesLister::Stub> stub_;
  int64_t subscription_ = 0;
  std::mutex mu_;
  std::condition_variable health_cv_;
  std::vector<DeviceHealthEvent> health_events_;
  std::vector<Pod> pods_;
};

Pod MakePod(const std::string& name, std::vector<Container> init, std::vector<Container> app,
            const std::string& ns = "default") {
  Pod p;
  p.uid = "uid-" + ns + "-" + name;
  p.namespace_name = ns;
  p.name = name;
  p.init_containers = std::move(init);
  p.containers = std::move(app);
  return p;
}

TEST_F(PodResourcesServerTest, ListReportsActivePodsWithOneEntryPerDevicePerNumaNode) {
  StartServer();
  Admit(MakePod("train", {},
                {MakeContainer("main", {{kGpu, 5}, {kNic, 2}}), MakeContainer("log", {})}));
  Admit(MakePod("idle", {}, {MakeContainer("app", {})}, "batch"));

  v1::ListPodResourcesResponse list;
  grpc::Status s = List(&list);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(list.pod_resources_size(), 2);
  const v1::PodResources& train = list.pod_resources(0);
  EXPECT_EQ(train.name(), "train");
  EXPECT_EQ(train.namespace_(), "default");
  ASSERT_EQ(train.containers_size(), 2);
  EXPECT_EQ(train.containers(0).name(), "main");
  // gpu4 spans NUMA nodes 0 and 1: it appears once per node; NICs have no
  // topology and appear once each, without one.
  EXPECT_THAT(DevicesOf(train, "main"),
              ElementsAre(Entry{kGpu, {"gpu0"}, {0}}, Entry{kGpu, {"gpu1"}, {0}},
                          Entry{kGpu, {"gpu2"}, {1}}, Entry{kGpu, {"gpu3"}, {1}},
                          Entry{kGpu, {"gpu4"}, {0}}, Entry{kGpu, {"gpu4"}, {1}},
                          Entry{kNic, {"nic0"}, {}}, Entry{kNic, {"nic1"}, {}}));
  for (const auto& d : train.containers(0).devices()) {
    if (d.resource_name() == kNic) {
      EXPECT_FALSE(d.has_topology());
    }
  }
  EXPECT_THAT(DevicesOf(train, "log"), IsEmpty());
  const v1::PodResources& idle = list.pod_resources(1);
  EXPECT_EQ(idle.name(), "idle");
  EXPECT_EQ(idle.namespace_(), "batch");
  ASSERT_EQ(idle.containers_size(), 1);
  EXPECT_THAT(DevicesOf(idle, "app"), IsEmpty());
}

TEST_F(PodResourcesServerTest, ListLeavesOutPodsTheAgentDoesNotReportActive) {
  StartServer();
  Pod gone = MakePod("gone", {}, {MakeContainer("main", {{kGpu, 1}})});
  Admit(gone);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pods_.clear();  // the agent forgot it; the Manager still holds its device
  }
  ASSERT_THAT(manager_->GetPodsWithDevices(), ElementsAre(gone.uid));
  v1::ListPodResourcesResponse list;
  ASSERT_TRUE(List(&list).ok());
  EXPECT_EQ(list.pod_resources_size(), 0);
}

TEST_F(PodResourcesServerTest, SidecarsAreListedAndPlainInitContainersAreNot) {
  StartServer();
  Pod pod = MakePod("web",
                    {MakeContainer("setup", {{kNic, 1}}),
                     MakeContainer("proxy", {{kGpu, 1}}, /*restartable=*/true)},
                    {MakeContainer("main", {{kGpu, 1}})});
  Admit(pod);
  ASSERT_THAT(ActivePodOf(pod).containers, ElementsAre("proxy", "main"));

  v1::ListPodResourcesResponse list;
  ASSERT_TRUE(List(&list).ok());
  ASSERT_EQ(list.pod_resources_size(), 1);
  const v1::PodResources& web = list.pod_resources(0);
  std::vector<std::string> names;
  for (const auto& c : web.containers()) names.push_back(c.name());
  EXPECT_THAT(names, ElementsAre("proxy", "main"));
  std::vector<Entry> proxy = DevicesOf(web, "proxy");
  std::vector<Entry> main = DevicesOf(web, "main");
  ASSERT_EQ(proxy.size(), 1u);
  ASSERT_EQ(main.size(), 1u);
  EXPECT_EQ(proxy[0].resource, kGpu);
  EXPECT_EQ(main[0].resource, kGpu);
  EXPECT_NE(proxy[0].ids, main[0].ids) << "a sidecar keeps its GPU while main runs";
}

TEST_F(PodResourcesServerTest, GetAnswersOnePodAndNotFoundForAnUnknownOne) {
  StartServer();
  Admit(MakePod("train", {}, {MakeContainer("main", {{kGpu, 2}})}));
  Admit(MakePod("train", {}, {MakeContainer("main", {{kNic, 1}})}, "other"));

  v1::GetPodResourcesResponse got;
  grpc::Status s = Get("train", "other", &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.pod_resources().name(), "train");
  EXPECT_EQ(got.pod_resources().namespace_(), "other");
  EXPECT_THAT(DevicesOf(got.pod_resources(), "main"), ElementsAre(Entry{kNic, {"nic0"}, {}}));

  v1::GetPodResourcesResponse missing;
  s = Get("nope", "default", &missing);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "pod nope in namespace default not found");
  s = Get("train", "elsewhere", &missing);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "pod train in namespace elsewhere not found");
}

TEST_F(PodResourcesServerTest, GetWithAnEmptyPodNameIsInvalidArgument) {
  StartServer();
  v1::GetPodResourcesResponse got;
  grpc::Status s = Get("", "default", &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("pod_name"));
}

TEST_F(PodResourcesServerTest, AllocatableReportsHealthyDevicesOnly) {
  StartServer();
  v1::AllocatableResourcesResponse before;
  ASSERT_TRUE(Allocatable(&before).ok());
  EXPECT_EQ(Flatten(before.devices()).size(), 8u);  // 5 GPUs (gpu4 twice) + 2 NICs

  ASSERT_TRUE(gpu_->SetHealth("gpu2", false).ok());
  {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(health_cv_.wait_for(lock, 10s, [&] {
      return std::find(health_events_.begin(), health_events_.end(),
                       DeviceHealthEvent{kGpu, "gpu2", false}) != health_events_.end();
    }));
  }
  v1::AllocatableResourcesResponse after;
  ASSERT_TRUE(Allocatable(&after).ok());
  EXPECT_THAT(Flatten(after.devices()),
              ElementsAre(Entry{kGpu, {"gpu0"}, {0}}, Entry{kGpu, {"gpu1"}, {0}},
                          Entry{kGpu, {"gpu3"}, {1}}, Entry{kGpu, {"gpu4"}, {0}},
                          Entry{kGpu, {"gpu4"}, {1}}, Entry{kNic, {"nic0"}, {}},
                          Entry{kNic, {"nic1"}, {}}));
}

TEST_F(PodResourcesServerTest, AHugeRequestIsRefusedAndTheServerKeepsServing) {
  StartServer();
  v1::GetPodResourcesResponse got;
  grpc::Status s = Get(std::string(2 << 20, 'x'), "default", &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  v1::ListPodResourcesResponse list;
  EXPECT_TRUE(List(&list).ok());
}

TEST_F(PodResourcesServerTest, GarbageBytesOnTheSocketDoNotStopTheServer) {
  StartServer();
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string garbage = "GET / HTTP/1.1\r\n\r\n\x01\x02\x03 not http/2 at all";
  ASSERT_EQ(::write(fd, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  ::close(fd);
  v1::ListPodResourcesResponse list;
  EXPECT_TRUE(List(&list).ok());
}

TEST_F(PodResourcesServerTest, SocketIs0600InADirectory0750AndAStaleSocketIsReplaced) {
  // The directory does not exist yet: Start creates it.
  StartServer();
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/pod-resources").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  ASSERT_EQ(::stat(socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  server_->Stop();
  server_->Stop();  // idempotent
  EXPECT_FALSE(std::filesystem::exists(socket())) << "Stop removes the socket";

  // Stale socket left by a crash: Start replaces it and serves.
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  server_.reset();
  StartServer();
  v1::ListPodResourcesResponse list;
  EXPECT_TRUE(List(&list).ok());
}

TEST_F(PodResourcesServerTest, StartRefusesBadOptionsWithClearErrors) {
  PodResourcesServer::Options o;
  o.manager = manager_.get();
  auto s = PodResourcesServer::Start(o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("socket_path"));

  o.socket_path = root_ + "/" + std::string(120, 'a') + ".sock";
  s = PodResourcesServer::Start(o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              HasSubstr("longer than the 107 bytes a unix socket path allows"));

  o.socket_path = socket();
  o.manager = nullptr;
  s = PodResourcesServer::Start(o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("manager"));

  // A regular file where the socket goes is not ours to delete.
  o.manager = manager_.get();
  std::filesystem::create_directories(root_ + "/pod-resources");
  std::ofstream(socket()) << "precious";
  s = PodResourcesServer::Start(o);
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr(socket() + " exists and is not a socket"));
  std::filesystem::remove(socket());

  // The parent is a file, not a directory.
  std::ofstream(root_ + "/file") << "x";
  o.socket_path = root_ + "/file/kubelet.sock";
  s = PodResourcesServer::Start(o);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr(root_ + "/file"));
}

TEST_F(PodResourcesServerTest, ARelativeSocketPathIsServed) {
  PodResourcesServer::Options o;
  o.socket_path = std::filesystem::relative(socket()).string();
  ASSERT_NE(o.socket_path.front(), '/');
  o.manager = manager_.get();
  auto s = PodResourcesServer::Start(std::move(o));
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = std::move(*s);
  stub_ = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix://" + socket(), grpc::InsecureChannelCredentials()));
  v1::ListPodResourcesResponse list;
  grpc::Status st = List(&list);
  EXPECT_TRUE(st.ok()) << st.error_message();
}

TEST_F(PodResourcesServerTest, NoActivePodsCallbackListsNothing) {
  PodResourcesServer::Options o;
  o.socket_path = socket();
  o.manager = manager_.get();
  auto s = PodResourcesServer::Start(std::move(o));
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = std::move(*s);
  stub_ = v1::PodResourcesLister::NewStub(
      grpc::CreateChannel("unix://" + socket(), grpc::InsecureChannelCredentials()));
  Admit(MakePod("train", {}, {MakeContainer("main", {{kGpu, 1}})}));
  v1::ListPodResourcesResponse list;
  ASSERT_TRUE(List(&list).ok());
  EXPECT_EQ(list.pod_resources_size(), 0);
  v1::GetPodResourcesResponse got;
  EXPECT_EQ(Get("train", "default", &got).error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace kdm::devicemanager
