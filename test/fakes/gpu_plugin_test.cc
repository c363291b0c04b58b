// The fake device plugin (kdm::fakes::FakeDevicePlugin) over real unix
// sockets, against the small fake kubelet of test/pluginapi.
#include "kdm/fakes/gpu_plugin.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "kdm/test/pluginapi/fake_registration_server.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

namespace kdm::fakes {
namespace {

using kdm::testing::FakeRegistrationServer;
using kdm::testing::TempSocketDir;
using namespace std::chrono_literals;

constexpr char kGpu[] = "nvidia.com/gpu";

PluginConfig GpuConfig(const std::string& dir, const std::string& preset = "dgx1-v100") {
  PluginConfig c;
  c.resource_name = kGpu;
  c.plugin_dir = dir;
  c.preset = preset;
  c.register_backoff_initial = 10ms;
  c.register_backoff_max = 50ms;
  c.watch_interval = 20ms;
  return c;
}

std::unique_ptr<FakeDevicePlugin> MustCreate(PluginConfig c) {
  auto p = FakeDevicePlugin::Create(std::move(c));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

std::unique_ptr<v1beta1::DevicePlugin::Stub> Dial(const std::string& socket) {
  return v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
}

template <typename Repeated>
std::vector<std::string> Strings(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

// A plugin started against a fake kubelet in a private directory.
class RunningPlugin {
 public:
  explicit RunningPlugin(std::function<void(PluginConfig&)> tweak = nullptr,
                         const std::string& preset = "dgx1-v100")
      : kubelet_(dir_.path()) {
    EXPECT_TRUE(kubelet_.Start());
    PluginConfig c = GpuConfig(dir_.path(), preset);
    if (tweak) tweak(c);
    plugin_ = MustCreate(std::move(c));
    if (plugin_) {
      Status s = plugin_->Start();
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_TRUE(plugin_->server().WaitForRegistrationCount(1, 10s));
      stub_ = Dial(plugin_->server().SocketPath());
    }
  }
  ~RunningPlugin() {
    if (plugin_) plugin_->Stop();
    kubelet_.Stop();
  }

  FakeDevicePlugin& plugin() { return *plugin_; }
  FakeRegistrationServer& kubelet() { return kubelet_; }
  v1beta1::DevicePlugin::Stub& stub() { return *stub_; }

  grpc::Status Allocate(const std::vector<std::string>& ids, v1beta1::AllocateResponse* out) {
    v1beta1::AllocateRequest req;
    auto* c = req.add_container_requests();
    for (const auto& id : ids) c->add_devices_ids(id);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    return stub_->Allocate(&ctx, req, out);
  }

  grpc::Status Preferred(const std::vector<std::string>& available,
                         const std::vector<std::string>& must, int size,
                         std::vector<std::string>* chosen) {
    v1beta1::PreferredAllocationRequest req;
    auto* c = req.add_container_requests();
    for (const auto& id : available) c->add_available_deviceids(id);
    for (const auto& id : must) c->add_must_include_deviceids(id);
    c->set_allocation_size(size);
    v1beta1::PreferredAllocationResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    grpc::Status s = stub_->GetPreferredAllocation(&ctx, req, &resp);
    if (s.ok() && resp.container_responses_size() == 1) {
      *chosen = Strings(resp.container_responses(0).deviceids());
    }
    return s;
  }

 private:
  TempSocketDir dir_;
  FakeRegistrationServer kubelet_;
  std::unique_ptr<FakeDevicePlugin> plugin_;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub_;
};

TEST(GpuPluginTest, PresetDevicesKeepTopologyIdsAndNuma) {
  RunningPlugin rp;
  auto preset = topology::Preset("dgx1-v100");
  ASSERT_TRUE(preset.ok());
  auto snaps = rp.kubelet().WaitForSnapshots(1);
  ASSERT_FALSE(snaps.empty());
  const auto& snap = snaps.back();
  ASSERT_EQ(snap.devices_size(), preset->size());
  for (int i = 0; i < preset->size(); ++i) {
    const auto& d = snap.devices(i);
    EXPECT_EQ(d.id(), preset->Device(i).id);
    EXPECT_EQ(d.health(), "Healthy");
    ASSERT_TRUE(preset->Device(i).numa.has_value());
    ASSERT_EQ(d.topology().nodes_size(), 1);
    EXPECT_EQ(d.topology().nodes(0).id(), *preset->Device(i).numa);
  }
  auto reqs = rp.kubelet().Requests();
  ASSERT_FALSE(reqs.empty());
  EXPECT_EQ(reqs[0].resource_name(), kGpu);
  EXPECT_EQ(reqs[0].version(), "v1beta1");
  EXPECT_EQ(reqs[0].endpoint(), plugin::DefaultSocketName(kGpu));
  auto options = rp.kubelet().DialedOptions();
  ASSERT_FALSE(options.empty());
  EXPECT_TRUE(options[0].get_preferred_allocation_available());
  EXPECT_FALSE(options[0].pre_start_required());
  EXPECT_EQ(rp.plugin().visible_devices_env(), "NVIDIA_VISIBLE_DEVICES");
  EXPECT_TRUE(rp.plugin().gpu());
}

TEST(GpuPluginTest, AllocateAnswersNvidiaNodesAndEnv) {
  RunningPlugin rp;
  v1beta1::AllocateResponse resp;
  grpc::Status s = rp.Allocate({"GPU1", "GPU3"}, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.container_responses_size(), 1);
  const auto& r = resp.container_responses(0);
  ASSERT_EQ(r.envs().count("NVIDIA_VISIBLE_DEVICES"), 1u);
  EXPECT_EQ(r.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU1,GPU3");
  std::vector<std::string> paths;
  for (const auto& d : r.devices()) {
    paths.push_back(d.container_path());
    EXPECT_EQ(d.host_path(), d.container_path());
    EXPECT_EQ(d.permissions(), "rw");
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl",
                                             "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}));
  EXPECT_EQ(r.cdi_devices_size(), 0);
  EXPECT_EQ(r.mounts_size(), 0);
}

TEST(GpuPluginTest, AllocateUnknownIdIsNotFoundNamingTheId) {
  RunningPlugin rp;
  v1beta1::AllocateResponse resp;
  grpc::Status s = rp.Allocate({"GPU0", "GPU99"}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("GPU99"), std::string::npos) << s.error_message();
}

TEST(GpuPluginTest, AllocateDuplicateOrEmptyRequestIsInvalid) {
  RunningPlugin rp;
  v1beta1::AllocateResponse resp;
  grpc::Status dup = rp.Allocate({"GPU2", "GPU2"}, &resp);
  EXPECT_EQ(dup.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(dup.error_message().find("GPU2"), std::string::npos);
  grpc::Status empty = rp.Allocate({}, &resp);
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(GpuPluginTest, CdiNamesFromResourceName) {
  RunningPlugin rp([](PluginConfig& c) { c.cdi = true; });
  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(rp.Allocate({"GPU0", "GPU5"}, &resp).ok());
  const auto& r = resp.container_responses(0);
  ASSERT_EQ(r.cdi_devices_size(), 2);
  EXPECT_EQ(r.cdi_devices(0).name(), "nvidia.com/gpu=GPU0");
  EXPECT_EQ(r.cdi_devices(1).name(), "nvidia.com/gpu=GPU5");
  EXPECT_EQ(r.envs().at("NVIDIA_VISIBLE_DEVICES"), "GPU0,GPU5");
}

// Every preferred answer is exactly what the topology allocator returns.
TEST(GpuPluginTest, PreferredAnswersEqualAllocateIdsForEveryPolicy) {
  auto preset = topology::Preset("dgx1-v100");
  ASSERT_TRUE(preset.ok());
  std::vector<std::string> all;
  for (const auto& d : preset->devices()) all.push_back(d.id);
  struct Case {
    std::vector<std::string> available;
    std::vector<std::string> must;
    int size;
  };
  std::vector<Case> cases;
  for (int size = 1; size <= 8; ++size) cases.push_back({all, {}, size});
  cases.push_back({{"GPU1", "GPU2", "GPU4", "GPU5", "GPU6", "GPU7"}, {}, 2});
  cases.push_back({{"GPU0", "GPU2", "GPU3", "GPU5", "GPU6"}, {"GPU5"}, 3});
  cases.push_back({all, {"GPU7", "GPU0"}, 4});
  for (topology::Policy policy :
       {topology::Policy::kPacked, topology::Policy::kBestSet, topology::Policy::kFirstFit}) {
    SCOPED_TRACE(std::string(topology::PolicyName(policy)));
    RunningPlugin rp([policy](PluginConfig& c) { c.policy = policy; });
    for (const Case& c : cases) {
      auto want = topology::AllocateIds(*preset, c.available, c.must, c.size, policy);
      ASSERT_TRUE(want.ok()) << want.status();
      std::vector<std::string> got;
      grpc::Status s = rp.Preferred(c.available, c.must, c.size, &got);
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(got, *want) << "size " << c.size;
    }
  }
}

TEST(GpuPluginTest, PreferredImpossibleRequestIsAnErrorNamingTheNumbers) {
  RunningPlugin rp;
  std::vector<std::string> got;
  grpc::Status s = rp.Preferred({"GPU0", "GPU1"}, {}, 3, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  grpc::Status unknown = rp.Preferred({"GPU0", "GPU42"}, {}, 1, &got);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(unknown.error_message().find("GPU42"), std::string::npos);
}

TEST(GpuPluginTest, PolicyNoneDoesNotOfferPreferredAllocation) {
  RunningPlugin rp([](PluginConfig& c) { c.policy = std::nullopt; });
  auto options = rp.kubelet().DialedOptions();
  ASSERT_FALSE(options.empty());
  EXPECT_FALSE(options[0].get_preferred_allocation_available());
  auto direct = rp.plugin().PreferredAllocation(v1beta1::ContainerPreferredAllocationRequest());
  EXPECT_EQ(direct.status().code(), StatusCode::kFailedPrecondition);
}

TEST(GpuPluginTest, PreStartIsOfferedAndAnswered) {
  RunningPlugin rp([](PluginConfig& c) { c.pre_start = true; });
  auto options = rp.kubelet().DialedOptions();
  ASSERT_FALSE(options.empty());
  EXPECT_TRUE(options[0].pre_start_required());
  v1beta1::PreStartContainerRequest req;
  req.add_devices_ids("GPU4");
  v1beta1::PreStartContainerResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  EXPECT_TRUE(rp.stub().PreStartContainer(&ctx, req, &resp).ok());
}

TEST(GpuPluginTest, CountMakesGenericDevicesWithResourceNames) {
  RunningPlugin rp([](PluginConfig& c) {
    c.resource_name = "example.com/fpga";
    c.preset.clear();
    c.count = 4;
  });
  EXPECT_FALSE(rp.plugin().gpu());
  EXPECT_EQ(rp.plugin().visible_devices_env(), "FPGA_VISIBLE_DEVICES");
  auto snaps = rp.kubelet().WaitForSnapshots(1);
  ASSERT_FALSE(snaps.empty());
  std::vector<std::string> ids;
  for (const auto& d : snaps.back().devices()) {
    ids.push_back(d.id());
    EXPECT_EQ(d.topology().nodes_size(), 0);
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"fpga-0", "fpga-1", "fpga-2", "fpga-3"}));
  EXPECT_EQ(rp.kubelet().Requests().at(0).endpoint(), "example.com_fpga.sock");

  v1beta1::AllocateResponse resp;
  ASSERT_TRUE(rp.Allocate({"fpga-2", "fpga-0"}, &resp).ok());
  const auto& r = resp.container_responses(0);
  EXPECT_EQ(r.envs().at("FPGA_VISIBLE_DEVICES"), "fpga-2,fpga-0");
  ASSERT_EQ(r.devices_size(), 2);
  EXPECT_EQ(r.devices(0).container_path(), "/dev/fpga2");
  EXPECT_EQ(r.devices(1).container_path(), "/dev/fpga0");

  // No links: every policy reduces to the lowest indices.
  std::vector<std::string> got;
  ASSERT_TRUE(rp.Preferred({"fpga-3", "fpga-1", "fpga-2"}, {"fpga-3"}, 2, &got).ok());
  EXPECT_EQ(got, (std::vector<std::string>{"fpga-1", "fpga-3"}));
}

TEST(GpuPluginTest, GenericEnvNameIsSanitized) {
  TempSocketDir dir;
  PluginConfig c = GpuConfig(dir.path());
  c.preset.clear();
  c.count = 2;
  c.resource_name = "vendor.io/smart-nic.v2";
  auto p = MustCreate(std::move(c));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->visible_devices_env(), "SMART_NIC_V2_VISIBLE_DEVICES");
  EXPECT_EQ(p->topology().Device(1).id, "smart-nic.v2-1");
}

TEST(GpuPluginTest, TopologyFileKeepsItsIds) {
  TempSocketDir dir;
  auto preset = topology::Preset("hgx-h100");
  ASSERT_TRUE(preset.ok());
  std::string file = dir.path() + "/topo.json";
  std::ofstream(file) << topology::RenderTopologyJson(*preset);
  PluginConfig c = GpuConfig(dir.path());
  c.preset.clear();
  c.topology_file = file;
  auto p = MustCreate(std::move(c));
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->gpu());
  EXPECT_EQ(p->topology(), *preset);
  v1beta1::ContainerAllocateRequest req;
  req.add_devices_ids(preset->Device(7).id);
  auto r = p->Allocate(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices(0).container_path(), "/dev/nvidia7");
}

TEST(GpuPluginTest, ApplyHealthPushesSnapshotAndReportsUnknownIds) {
  RunningPlugin rp;
  HealthUpdate u = rp.plugin().ApplyHealth({{"GPU3", false}, {"GPU9", false}, {"GPU1", true}});
  EXPECT_EQ(u.healthy, 7);
  EXPECT_EQ(u.unhealthy, 1);
  EXPECT_EQ(u.unknown_ids, std::vector<std::string>{"GPU9"});
  auto snap = rp.kubelet().WaitForSnapshot([](const v1beta1::ListAndWatchResponse& s) {
    for (const auto& d : s.devices()) {
      if (d.id() == "GPU3" && d.health() == "Unhealthy") return true;
    }
    return false;
  });
  ASSERT_TRUE(snap.has_value());
  int unhealthy = 0;
  for (const auto& d : snap->devices()) unhealthy += d.health() != "Healthy";
  EXPECT_EQ(unhealthy, 1);
  // A device the map no longer names is healthy again: the next snapshot.
  size_t seen = rp.kubelet().WaitForSnapshots(0).size();
  rp.plugin().ApplyHealth({});
  auto snaps = rp.kubelet().WaitForSnapshots(seen + 1);
  ASSERT_GT(snaps.size(), seen);
  for (const auto& d : snaps.back().devices()) EXPECT_EQ(d.health(), "Healthy") << d.id();
  for (const auto& d : rp.plugin().server().Devices()) EXPECT_TRUE(d.healthy) << d.id;
}

// Bad configs, each with a clear error naming what was wrong.
TEST(GpuPluginTest, CreateRejectsBadConfigs) {
  TempSocketDir dir;
  struct Case {
    std::string name;
    std::function<void(PluginConfig&)> tweak;
    StatusCode code;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"empty resource", [](PluginConfig& c) { c.resource_name.clear(); },
       StatusCode::kInvalidArgument, "the ResourceName \"\" is invalid"},
      {"resource without vendor", [](PluginConfig& c) { c.resource_name = "gpu"; },
       StatusCode::kInvalidArgument, "\"gpu\""},
      {"resource with two slashes", [](PluginConfig& c) { c.resource_name = "a/b/c"; },
       StatusCode::kInvalidArgument, "a/b/c"},
      {"resource in the kubernetes.io domain",
       [](PluginConfig& c) { c.resource_name = "kubernetes.io/gpu"; }, StatusCode::kInvalidArgument,
       "the ResourceName \"kubernetes.io/gpu\" is invalid"},
      {"no source", [](PluginConfig& c) { c.preset.clear(); }, StatusCode::kInvalidArgument,
       "no device source"},
      {"two sources", [](PluginConfig& c) { c.count = 2; }, StatusCode::kInvalidArgument,
       "more than one device source"},
      {"count zero",
       [](PluginConfig& c) {
         c.preset.clear();
         c.count = 0;
       },
       StatusCode::kInvalidArgument, "--count 0"},
      {"count huge",
       [](PluginConfig& c) {
         c.preset.clear();
         c.count = 5000;
       },
       StatusCode::kInvalidArgument, "--count 5000"},
      {"unknown preset", [](PluginConfig& c) { c.preset = "dgx-9000"; }, StatusCode::kNotFound,
       "dgx-9000"},
      {"missing topology file",
       [&](PluginConfig& c) {
         c.preset.clear();
         c.topology_file = dir.path() + "/nope.json";
       },
       StatusCode::kNotFound, "nope.json"},
      {"long plugin dir",
       [&](PluginConfig& c) { c.plugin_dir = dir.path() + "/" + std::string(120, 'd'); },
       StatusCode::kInvalidArgument, "unix socket"},
      {"socket name with slash", [](PluginConfig& c) { c.socket_name = "../x.sock"; },
       StatusCode::kInvalidArgument, "plain file name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PluginConfig config = GpuConfig(dir.path());
    c.tweak(config);
    auto p = FakeDevicePlugin::Create(std::move(config));
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), c.code) << p.status();
    EXPECT_NE(p.status().message().find(c.needle), std::string::npos) << p.status();
  }
}

TEST(GpuPluginTest, GarbageTopologyFileNamesTheFile) {
  TempSocketDir dir;
  std::string file = dir.path() + "/garbage.txt";
  std::ofstream(file) << "\x01\x02 this is not a topology {{{";
  PluginConfig c = GpuConfig(dir.path());
  c.preset.clear();
  c.topology_file = file;
  auto p = FakeDevicePlugin::Create(std::move(c));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find(file), std::string::npos) << p.status();
}

TEST(GpuPluginTest, ParsePreferredPolicy) {
  EXPECT_EQ(*ParsePreferredPolicy("packed"), PreferredPolicy(topology::Policy::kPacked));
  EXPECT_EQ(*ParsePreferredPolicy("best-set"), PreferredPolicy(topology::Policy::kBestSet));
  EXPECT_EQ(*ParsePreferredPolicy("first-fit"), PreferredPolicy(topology::Policy::kFirstFit));
  EXPECT_EQ(*ParsePreferredPolicy("none"), PreferredPolicy(std::nullopt));
  auto bad = ParsePreferredPolicy("greedy");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"greedy\""), std::string::npos);
}

}  // namespace
}  // namespace kdm::fakes
