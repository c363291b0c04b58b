// publish::ManagerSource against a real Manager with SDK plugins registered
// to it: it reads the allocatable devices with their NUMA nodes and the
// devices the active pods hold, in-process, and says exactly what
// PodResourcesSource reads over the pod-resources socket of the same
// Manager (one read path, devicemanager::ListPodResources).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/pod_resources_client.h"
#include "kdm/devicemanager/pod_resources_server.h"
#include "kdm/devicemanager/quantity.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/publish/device_sources.h"

namespace kdm::publish {
namespace {

using namespace std::chrono_literals;
using devicemanager::ActivePod;
using devicemanager::Container;
using devicemanager::Manager;
using devicemanager::Pod;
using ::testing::ElementsAre;
using ::testing::Pair;

constexpr char kSourceGpu[] = "example.com/gpu";

std::unique_ptr<plugin::PluginServer> StartGpuPlugin(const std::string& dir,
                                                     std::vector<plugin::Device> devices) {
  plugin::PluginServer::Options o;
  o.resource_name = kSourceGpu;
  o.plugin_dir = dir;
  o.devices = std::move(devices);
  o.allocate =
      [](const v1beta1::ContainerAllocateRequest&) -> StatusOr<v1beta1::ContainerAllocateResponse> {
    return v1beta1::ContainerAllocateResponse();
  };
  o.register_backoff_initial = 10ms;
  auto server = plugin::PluginServer::Create(std::move(o));
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  Status s = (*server)->Start();
  EXPECT_TRUE(s.ok()) << s;
  if (!s.ok()) return nullptr;
  EXPECT_TRUE((*server)->WaitForRegistrationCount(1, 10s)) << "the plugin did not register";
  return std::move(*server);
}

Pod GpuPod(const std::string& uid, int64_t gpus) {
  Pod pod;
  pod.uid = uid;
  pod.namespace_name = "ml";
  pod.name = "train-" + uid;
  Container c;
  c.name = "main";
  c.limits[kSourceGpu] = devicemanager::Quantity::FromInt(gpus);
  c.requests[kSourceGpu] = devicemanager::Quantity::FromInt(gpus);
  pod.containers.push_back(c);
  return pod;
}

class ManagerSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-pub-XXXXXX";
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
    // Two GPUs per NUMA node, one unhealthy (not allocatable), one on both.
    plugin_ = StartGpuPlugin(root_ + "/dp", {{"gpu0", true, {0}},
                                             {"gpu1", true, {0}},
                                             {"gpu2", true, {1}},
                                             {"gpu3", false, {1}},
                                             {"gpu4", true, {0, 1}}});
    ASSERT_NE(plugin_, nullptr);
  }
  void TearDown() override {
    if (server_) server_->Stop();
    if (manager_) manager_->Stop();
    if (plugin_) plugin_->Stop();
    std::filesystem::remove_all(root_);
  }

  std::vector<ActivePod> ActivePods() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ActivePod> out;
    for (const auto& p : pods_) out.push_back(devicemanager::ActivePodOf(p));
    return out;
  }
  void Admit(const Pod& pod) {
    Status s = manager_->Allocate(pod, "main");
    ASSERT_TRUE(s.ok()) << s;
    std::lock_guard<std::mutex> lock(mu_);
    pods_.push_back(pod);
  }

  std::string root_;
  std::unique_ptr<Manager> manager_;
  std::unique_ptr<plugin::PluginServer> plugin_;
  std::unique_ptr<devicemanager::PodResourcesServer> server_;
  std::mutex mu_;
  std::vector<Pod> pods_;
};

TEST_F(ManagerSourceTest, ReadsAllocatableAndHeldDevicesWithoutASocket) {
  ManagerSource source(manager_.get(), [this] { return ActivePods(); });
  StatusOr<kube::NodeDevices> before = source.Read();
  ASSERT_TRUE(before.ok()) << before.status();
  // Healthy devices only; the first NUMA node of a device on two wins.
  EXPECT_THAT(before->allocatable.at(kSourceGpu),
              ElementsAre(Pair("gpu0", 0), Pair("gpu1", 0), Pair("gpu2", 1), Pair("gpu4", 0)));
  EXPECT_TRUE(before->in_use.empty());
  EXPECT_TRUE(before->holders.empty());

  ASSERT_NO_FATAL_FAILURE(Admit(GpuPod("u1", 2)));
  StatusOr<kube::NodeDevices> after = source.Read();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->in_use.count(kSourceGpu), 1u);
  EXPECT_EQ(after->in_use.at(kSourceGpu).size(), 2u);
  std::vector<devicemanager::ContainerDevices> held = manager_->GetDevices("u1", "main");
  for (const auto& d : held) {
    for (const auto& id : d.device_ids) EXPECT_EQ(after->in_use.at(kSourceGpu).count(id), 1u);
  }
  EXPECT_THAT(after->holders, ElementsAre(Pair("ml", "train-u1")));
  // Without active pods nothing is in use, whatever the Manager recorded.
  ManagerSource no_pods(manager_.get(), nullptr);
  StatusOr<kube::NodeDevices> none = no_pods.Read();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->in_use.empty());
  EXPECT_TRUE(none->holders.empty());
}

TEST_F(ManagerSourceTest, SaysWhatThePodResourcesSocketSays) {
  ASSERT_NO_FATAL_FAILURE(Admit(GpuPod("u1", 1)));
  ASSERT_NO_FATAL_FAILURE(Admit(GpuPod("u2", 2)));
  devicemanager::PodResourcesServer::Options o;
  o.socket_path = root_ + "/pod-resources/kubelet.sock";
  o.manager = manager_.get();
  o.active_pods = [this] { return ActivePods(); };
  auto server = devicemanager::PodResourcesServer::Start(std::move(o));
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  auto client = devicemanager::PodResourcesClient::Connect(
      {.socket_path = root_ + "/pod-resources/kubelet.sock", .timeout = 10s});
  ASSERT_TRUE(client.ok()) << client.status();
  PodResourcesSource over_socket(std::move(*client));
  ManagerSource in_process(manager_.get(), [this] { return ActivePods(); });
  StatusOr<kube::NodeDevices> a = over_socket.Read();
  StatusOr<kube::NodeDevices> b = in_process.Read();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->allocatable, b->allocatable);
  EXPECT_EQ(a->in_use, b->in_use);
  EXPECT_EQ(b->in_use.at(kSourceGpu).size(), 3u);
  EXPECT_EQ(a->holders, b->holders);
  EXPECT_THAT(b->holders, ElementsAre(Pair("ml", "train-u1"), Pair("ml", "train-u2")));
}

TEST(NodeDevicesOfTest, HoldersArePodsWithAtLeastOneDevice) {
  using devicemanager::ContainerResources;
  using devicemanager::PodResources;
  std::vector<PodResources> pods = {
      // Two containers, the second holding a device of another resource.
      {"ml", "both", {{"init", {}}, {"main", {{"vendor.com/npu", {"n0"}, std::nullopt}}}}},
      // A resource entry without ids holds nothing.
      {"ml", "empty-ids", {{"main", {{kSourceGpu, {}, 0}}}}},
      {"ml", "no-containers", {}},
      {"ml", "no-devices", {{"main", {}}, {"side", {}}}},
      {"default", "gpu", {{"main", {{kSourceGpu, {"gpu0", "gpu1"}, 0}}}}},
      // The same pod listed twice (a server's repeat) is one holder.
      {"default", "gpu", {{"main", {{kSourceGpu, {"gpu1"}, 0}}}}},
  };
  kube::NodeDevices d = NodeDevicesOf({}, pods);
  EXPECT_THAT(d.holders, ElementsAre(Pair("default", "gpu"), Pair("ml", "both")));
  EXPECT_THAT(d.in_use.at(kSourceGpu), ElementsAre("gpu0", "gpu1"));
  EXPECT_TRUE(NodeDevicesOf({}, {}).holders.empty());
}

}  // namespace
}  // namespace kdm::publish
