// NvmlPlugin in process, on the fake libnvidia-ml.so.1 (test/nvml/): its
// GetPreferredAllocation answers equal the fake GPU plugin's on the preset the
// node describes (must-include and available included), its Allocate answers,
// and a health event replacing the device set at once.
#include "kdm/nvml/nvml_plugin.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kdm/fakes/gpu_plugin.h"
#include "kdm/test/nvml/fake_nvml/fake_sysfs.h"
#include "kdm/test/wait_until.h"

namespace kdm::nvml {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NvmlPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-np-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    node_ = std::string(KDM_FAKE_NVML_NODES) + "/dgx1-v100.json";
    nlohmann::json doc = nlohmann::json::parse(std::ifstream(node_));
    for (const auto& g : doc["gpus"]) uuids_.push_back(g["uuid"].get<std::string>());
    events_ = root_ + "/events";
    std::ofstream(events_).flush();
    ASSERT_EQ(test::WriteFakeSysfs(node_, root_ + "/sys"), "");
    fs::create_directories(root_ + "/dev");
    std::ofstream(root_ + "/dev/nvidiactl").flush();
    ::setenv("KDM_FAKE_NVML_NODE", node_.c_str(), 1);
    ::setenv("KDM_FAKE_NVML_EVENTS", events_.c_str(), 1);
  }
  void TearDown() override {
    if (plugin_) plugin_->Stop();
    plugin_.reset();
    if (fake_) fake_->Stop();
    fake_.reset();
    ::unsetenv("KDM_FAKE_NVML_NODE");
    ::unsetenv("KDM_FAKE_NVML_EVENTS");
    fs::remove_all(root_);
  }

  NvmlPluginConfig Config() {
    NvmlPluginConfig c;
    c.plugin_dir = root_ + "/dp";
    c.library_path = KDM_FAKE_NVML_LIBRARY;
    c.sysfs_root = root_ + "/sys";
    c.dev_root = root_;
    c.register_with_kubelet = false;
    c.health_wait_timeout = std::chrono::milliseconds(20);
    return c;
  }
  void CreatePlugin(NvmlPluginConfig c) {
    StatusOr<std::unique_ptr<NvmlPlugin>> p = NvmlPlugin::Create(std::move(c));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    plugin_ = std::move(*p);
  }
  void CreateFake(topology::Policy policy) {
    fakes::PluginConfig c;
    c.resource_name = "nvidia.com/gpu";
    c.plugin_dir = root_ + "/fake-dp";
    c.preset = "dgx1-v100";
    c.policy = policy;
    c.register_with_kubelet = false;
    StatusOr<std::unique_ptr<fakes::FakeDevicePlugin>> f = fakes::FakeDevicePlugin::Create(c);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fake_ = std::move(*f);
  }
  // The preset's ids for node UUIDs and back (GPU i of one is GPU i of the other).
  std::string Uuid(const std::string& preset_id) {
    return uuids_[*fake_->topology().IndexOf(preset_id)];
  }
  std::string PresetId(const std::string& uuid) {
    auto it = std::find(uuids_.begin(), uuids_.end(), uuid);
    return fake_->topology().devices()[it - uuids_.begin()].id;
  }
  void Inject(const std::string& line) { std::ofstream(events_, std::ios::app) << line << "\n"; }

  std::string root_, node_, events_;
  std::vector<std::string> uuids_;
  std::unique_ptr<NvmlPlugin> plugin_;
  std::unique_ptr<fakes::FakeDevicePlugin> fake_;
};

TEST_F(NvmlPluginTest, DevicesAreTheUuidsWithTheirNumaNodes) {
  CreatePlugin(Config());
  std::vector<plugin::Device> devices = plugin_->server().Devices();
  ASSERT_EQ(devices.size(), 8u);
  for (size_t i = 0; i < devices.size(); ++i) {
    EXPECT_EQ(devices[i].id, uuids_[i]);
    EXPECT_TRUE(devices[i].healthy);
    EXPECT_THAT(devices[i].numa_nodes, ElementsAre(i < 4 ? 0 : 1)) << i;
  }
}

TEST_F(NvmlPluginTest, PreferredAllocationEqualsTheFakeGpuPluginsOnThePreset) {
  for (topology::Policy policy : {topology::Policy::kPacked, topology::Policy::kBestSet}) {
    NvmlPluginConfig c = Config();
    c.policy = policy;
    CreatePlugin(c);
    CreateFake(policy);
    struct Req {
      std::vector<int> available;
      std::vector<int> must;
      int size;
    };
    const std::vector<Req> reqs = {
        {{0, 1, 2, 3, 4, 5, 6, 7}, {}, 1},
        {{0, 1, 2, 3, 4, 5, 6, 7}, {}, 2},
        {{0, 1, 2, 3, 4, 5, 6, 7}, {}, 4},
        {{1, 2, 5, 6, 7}, {}, 3},
        {{0, 1, 2, 3, 4, 5, 6, 7}, {6}, 2},
        {{0, 2, 3, 4, 7}, {4, 2}, 4},
        {{0, 1, 2, 3, 4, 5, 6, 7}, {}, 8},
        {{0, 1}, {}, 3},      // too large: an error on both
        {{0, 1, 2}, {5}, 2},  // must-include not available
    };
    for (const Req& r : reqs) {
      v1beta1::ContainerPreferredAllocationRequest ours, theirs;
      for (int i : r.available) {
        ours.add_available_deviceids(uuids_[i]);
        theirs.add_available_deviceids(fake_->topology().devices()[i].id);
      }
      for (int i : r.must) {
        ours.add_must_include_deviceids(uuids_[i]);
        theirs.add_must_include_deviceids(fake_->topology().devices()[i].id);
      }
      ours.set_allocation_size(r.size);
      theirs.set_allocation_size(r.size);
      auto got = plugin_->PreferredAllocation(ours);
      auto want = fake_->PreferredAllocation(theirs);
      ASSERT_EQ(got.ok(), want.ok()) << r.size;
      if (!want.ok()) {
        EXPECT_EQ(got.status().code(), want.status().code());
        continue;
      }
      std::vector<std::string> translated;
      for (const std::string& id : want->deviceids()) translated.push_back(Uuid(id));
      EXPECT_EQ(std::vector<std::string>(got->deviceids().begin(), got->deviceids().end()),
                translated)
          << topology::PolicyName(policy) << " size " << r.size;
    }
    plugin_->Stop();
    plugin_.reset();
    fake_->Stop();
    fake_.reset();
  }
}

TEST_F(NvmlPluginTest, AllocateAnswersUuidsNodesAndCdiNames) {
  NvmlPluginConfig c = Config();
  c.cdi = true;
  CreatePlugin(c);
  v1beta1::ContainerAllocateRequest req;
  req.add_devices_ids(uuids_[6]);
  req.add_devices_ids(uuids_[1]);
  auto r = plugin_->Allocate(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->envs().at("NVIDIA_VISIBLE_DEVICES"), uuids_[6] + "," + uuids_[1]);
  std::vector<std::string> paths;
  for (const auto& d : r->devices()) {
    EXPECT_EQ(d.host_path(), d.container_path());
    EXPECT_EQ(d.permissions(), "rw");
    paths.push_back(d.host_path());
  }
  EXPECT_THAT(paths, ElementsAre("/dev/nvidia6", "/dev/nvidia1", "/dev/nvidiactl"));
  ASSERT_EQ(r->cdi_devices_size(), 2);
  EXPECT_EQ(r->cdi_devices(0).name(), "nvidia.com/gpu=" + uuids_[6]);

  v1beta1::ContainerAllocateRequest bad;
  bad.add_devices_ids("GPU-not-here");
  auto e = plugin_->Allocate(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(e.status().message(), HasSubstr("\"GPU-not-here\""));
}

TEST_F(NvmlPluginTest, AHealthEventReplacesTheDeviceSetAtOnce) {
  fs::create_directories(root_ + "/dp");
  CreatePlugin(Config());
  Status started = plugin_->Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  Inject("xid " + uuids_[2] + " 43");
  Inject("xid " + uuids_[3] + " 79");
  ASSERT_TRUE(kdm::test::WaitUntil([&] {
    for (const plugin::Device& d : plugin_->server().Devices()) {
      if (d.id == uuids_[3]) return !d.healthy;
    }
    return false;
  }));
  for (const plugin::Device& d : plugin_->server().Devices()) {
    EXPECT_EQ(d.healthy, d.id != uuids_[3]) << d.id;
  }
}

TEST_F(NvmlPluginTest, ARestartedPluginDoesNotSeeTheXidsOfItsPredecessor) {
  // The fake delivers only events injected after a set's registration, as
  // NVML does: seven Xids that made the first plugin drop seven GPUs leave a
  // restarted plugin with all eight; a new Xid reaches it.
  fs::create_directories(root_ + "/dp");
  CreatePlugin(Config());
  Status started = plugin_->Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  for (int i = 0; i < 7; ++i) Inject("xid " + uuids_[i] + " 79");
  auto unhealthy = [&] {
    size_t n = 0;
    for (const plugin::Device& d : plugin_->server().Devices()) n += d.healthy ? 0 : 1;
    return n;
  };
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return unhealthy() == 7; }));
  plugin_->Stop();
  plugin_.reset();

  CreatePlugin(Config());
  started = plugin_->Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  EXPECT_EQ(unhealthy(), 0u);
  // Events are read in order: once GPU 7 is unhealthy, the seven earlier
  // lines were passed over, never delivered.
  Inject("xid " + uuids_[7] + " 79");
  ASSERT_TRUE(kdm::test::WaitUntil([&] { return unhealthy() == 1; }));
  for (const plugin::Device& d : plugin_->server().Devices()) {
    EXPECT_EQ(d.healthy, d.id != uuids_[7]) << d.id;
  }
  EXPECT_EQ(plugin_->health_monitor()->EventsSeenForTest(), 1u);
}

TEST_F(NvmlPluginTest, AGpuThatCannotRegisterStaysHealthyAndEccOffRegistersXidsOnly) {
  // GPU 0 refuses nvmlDeviceRegisterEvents; GPU 1 has ECC off (Xid only).
  nlohmann::json doc = nlohmann::json::parse(std::ifstream(node_));
  doc["gpus"][0]["fail"] = {{"register_events", 3}};
  doc["gpus"][1]["supported_events"] = {"xid"};
  const std::string custom = root_ + "/node.json";
  std::ofstream(custom) << doc.dump();
  ::setenv("KDM_FAKE_NVML_NODE", custom.c_str(), 1);
  fs::create_directories(root_ + "/dp");
  CreatePlugin(Config());
  Status started = plugin_->Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  ASSERT_NE(plugin_->health_monitor(), nullptr);
  EXPECT_THAT(plugin_->health_monitor()->Unmonitored(), ElementsAre(uuids_[0]));
  // An Xid on the unmonitored GPU is never delivered; ECC on GPU 1 is not
  // registered; an Xid on GPU 1 is. Events are read in order, so once GPU 1
  // is unhealthy the earlier lines were consumed.
  Inject("xid " + uuids_[0] + " 79");
  Inject("ecc " + uuids_[2]);
  ASSERT_TRUE(kdm::test::WaitUntil([&] {
    for (const plugin::Device& d : plugin_->server().Devices()) {
      if (d.id == uuids_[2]) return !d.healthy;
    }
    return false;
  }));
  Inject("ecc " + uuids_[1]);
  Inject("xid " + uuids_[1] + " 48");
  ASSERT_TRUE(kdm::test::WaitUntil([&] {
    for (const plugin::Device& d : plugin_->server().Devices()) {
      if (d.id == uuids_[1]) return !d.healthy;
    }
    return false;
  }));
  for (const plugin::Device& d : plugin_->server().Devices()) {
    EXPECT_EQ(d.healthy, d.id != uuids_[1] && d.id != uuids_[2]) << d.id;
  }
  std::map<std::string, bool> health = plugin_->health_monitor()->Health();
  EXPECT_TRUE(health[uuids_[0]]);
  EXPECT_EQ(plugin_->health_monitor()->EventsSeenForTest(), 2u);  // ECC of 2, Xid of 1
}

TEST_F(NvmlPluginTest, AMissingLibraryIsNotFoundWithTheDriverHint) {
  NvmlPluginConfig c = Config();
  c.library_path = root_ + "/nope/libnvidia-ml.so.1";
  StatusOr<std::unique_ptr<NvmlPlugin>> p = NvmlPlugin::Create(std::move(c));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("NVML not found: "));
  EXPECT_THAT(p.status().message(), HasSubstr("is the NVIDIA driver installed?"));
}

}  // namespace
}  // namespace kdm::nvml
