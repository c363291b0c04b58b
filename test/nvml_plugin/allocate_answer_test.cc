#include "kdm/nvml/allocate_answer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace kdm::nvml {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;

std::vector<std::string> ContainerPaths(const AllocateAnswer& a) {
  std::vector<std::string> out;
  for (const DeviceNode& n : a.device_nodes) out.push_back(n.container_path);
  return out;
}

class AllocateAnswerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-aa-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    fs::create_directories(root_ + "/dev");
  }
  void TearDown() override { fs::remove_all(root_); }
  void Touch(const std::string& rel) { std::ofstream(root_ + rel) << ""; }

  std::vector<GpuNode> Gpus() const {
    // Minors need not equal indices.
    // Minors need not equal indices either.
    return {{"GPU-aaaa", 3, 1}, {"GPU-bbbb", 0, 0}, {"GPU-cccc", 7, 2}};
  }

  std::string root_;
};

TEST_F(AllocateAnswerTest, UuidsInOrderMinorsAndOnlyThePresentControlNodes) {
  Touch("/dev/nvidiactl");
  Touch("/dev/nvidia-uvm-tools");
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_});
  StatusOr<AllocateAnswer> a = b.Answer({"GPU-cccc", "GPU-aaaa"});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->envs,
            (std::map<std::string, std::string>{{"NVIDIA_VISIBLE_DEVICES", "GPU-cccc,GPU-aaaa"}}));
  EXPECT_THAT(ContainerPaths(*a), ElementsAre("/dev/nvidia7", "/dev/nvidia3", "/dev/nvidiactl",
                                              "/dev/nvidia-uvm-tools"));
  EXPECT_THAT(a->cdi_devices, IsEmpty());
}

TEST_F(AllocateAnswerTest, AllControlNodesWhenAllArePresent) {
  Touch("/dev/nvidiactl");
  Touch("/dev/nvidia-uvm");
  Touch("/dev/nvidia-uvm-tools");
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_ + "/"});
  StatusOr<AllocateAnswer> a = b.Answer({"GPU-bbbb"});
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(ContainerPaths(*a), ElementsAre("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                              "/dev/nvidia-uvm-tools"));
}

TEST_F(AllocateAnswerTest, NoControlNodesUnderAnEmptyOrMissingRoot) {
  for (const std::string& dev_root : {root_, root_ + "/missing"}) {
    AllocateAnswerBuilder b(Gpus(), {.dev_root = dev_root});
    StatusOr<AllocateAnswer> a = b.Answer({"GPU-bbbb"});
    ASSERT_TRUE(a.ok()) << dev_root;
    EXPECT_THAT(ContainerPaths(*a), ElementsAre("/dev/nvidia0")) << dev_root;
  }
}

TEST_F(AllocateAnswerTest, CdiNamesWithCdi) {
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_, .list = {.cdi_cri = true}});
  StatusOr<AllocateAnswer> a = b.Answer({"GPU-aaaa", "GPU-bbbb"});
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->cdi_devices, ElementsAre("nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb"));
  // cdi-cri beside envvar (what --cdi was): the env and nodes stay.
  EXPECT_EQ(a->envs.at("NVIDIA_VISIBLE_DEVICES"), "GPU-aaaa,GPU-bbbb");
  EXPECT_THAT(ContainerPaths(*a), ElementsAre("/dev/nvidia3", "/dev/nvidia0"));
  EXPECT_THAT(a->annotations, IsEmpty());
}

TEST_F(AllocateAnswerTest, UnknownDuplicateAndNoIdsAreErrorsNamingTheId) {
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_});
  StatusOr<AllocateAnswer> unknown = b.Answer({"GPU-aaaa", "GPU-nope"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.status().message(), "device \"GPU-nope\" is not a GPU of this plugin");
  StatusOr<AllocateAnswer> twice = b.Answer({"GPU-aaaa", "GPU-aaaa"});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.status().message(), "device \"GPU-aaaa\" is listed twice");
  StatusOr<AllocateAnswer> none = b.Answer({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  // A path-like id is just an unknown id.
  StatusOr<AllocateAnswer> path = b.Answer({"../../dev/nvidiactl"});
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), StatusCode::kNotFound);
}

TEST_F(AllocateAnswerTest, HostPathsUnderTheHostDevRootContainerPathsUnderDev) {
  Touch("/dev/nvidiactl");
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_, .host_dev_root = "/run/nvidia/driver/"});
  StatusOr<AllocateAnswer> a = b.Answer({"GPU-cccc"});
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->device_nodes.size(), 2u);
  EXPECT_EQ(a->device_nodes[0].container_path, "/dev/nvidia7");
  EXPECT_EQ(a->device_nodes[0].host_path, "/run/nvidia/driver/dev/nvidia7");
  EXPECT_EQ(a->device_nodes[1].container_path, "/dev/nvidiactl");
  EXPECT_EQ(a->device_nodes[1].host_path, "/run/nvidia/driver/dev/nvidiactl");
  // The default host root is "/": host path == container path.
  AllocateAnswerBuilder plain(Gpus(), {.dev_root = root_});
  StatusOr<AllocateAnswer> p = plain.Answer({"GPU-cccc"});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->device_nodes[0].host_path, "/dev/nvidia7");
}

TEST_F(AllocateAnswerTest, IndexStrategyNamesGpusByNvmlIndexInTheOrderAsked) {
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_,
                                   .id_strategy = DeviceIdStrategy::kIndex,
                                   .list = {.envvar = true, .cdi_cri = true}});
  StatusOr<AllocateAnswer> a = b.Answer({"GPU-cccc", "GPU-aaaa"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->envs.at("NVIDIA_VISIBLE_DEVICES"), "2,1");
  EXPECT_THAT(a->cdi_devices, ElementsAre("nvidia.com/gpu=2", "nvidia.com/gpu=1"));
  // Device nodes follow the minors, whatever the names.
  EXPECT_THAT(ContainerPaths(*a), ElementsAre("/dev/nvidia7", "/dev/nvidia3"));
}

TEST_F(AllocateAnswerTest, VolumeMountsAsNvidiasToolkitReadsThem) {
  for (DeviceIdStrategy ids : {DeviceIdStrategy::kUuid, DeviceIdStrategy::kIndex}) {
    AllocateAnswerBuilder b(
        Gpus(),
        {.dev_root = root_, .id_strategy = ids, .list = {.envvar = false, .volume_mounts = true}});
    StatusOr<AllocateAnswer> a = b.Answer({"GPU-bbbb", "GPU-aaaa"});
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->envs, (std::map<std::string, std::string>{
                           {"NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices"}}));
    const bool uuid = ids == DeviceIdStrategy::kUuid;
    ASSERT_EQ(a->mounts.size(), 2u);
    EXPECT_EQ(a->mounts[0].host_path, "/dev/null");
    EXPECT_EQ(a->mounts[0].container_path,
              std::string("/var/run/nvidia-container-devices/") + (uuid ? "GPU-bbbb" : "0"));
    EXPECT_EQ(a->mounts[1].host_path, "/dev/null");
    EXPECT_EQ(a->mounts[1].container_path,
              std::string("/var/run/nvidia-container-devices/") + (uuid ? "GPU-aaaa" : "1"));
    EXPECT_THAT(ContainerPaths(*a), ElementsAre("/dev/nvidia0", "/dev/nvidia3"));
  }
  // With envvar too, the mount root wins the variable (NVIDIA's order).
  AllocateAnswerBuilder both(Gpus(),
                             {.dev_root = root_, .list = {.envvar = true, .volume_mounts = true}});
  StatusOr<AllocateAnswer> a = both.Answer({"GPU-bbbb"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->envs.at("NVIDIA_VISIBLE_DEVICES"), "/var/run/nvidia-container-devices");
  EXPECT_EQ(a->mounts.size(), 1u);
}

TEST_F(AllocateAnswerTest, CdiOnlyStrategiesAnswerNoEnvMountOrNode) {
  Touch("/dev/nvidiactl");
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_,
                                   .list = {.envvar = false, .cdi_annotations = true},
                                   .response_id = [] { return std::string("r-1"); }});
  StatusOr<AllocateAnswer> a = b.Answer({"GPU-cccc", "GPU-bbbb"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(
      a->annotations,
      (std::map<std::string, std::string>{{"cdi.k8s.io/nvidia-device-plugin_r-1",
                                           "nvidia.com/gpu=GPU-cccc,nvidia.com/gpu=GPU-bbbb"}}));
  EXPECT_THAT(a->envs, IsEmpty());
  EXPECT_THAT(a->mounts, IsEmpty());
  EXPECT_THAT(a->device_nodes, IsEmpty());
  EXPECT_THAT(a->cdi_devices, IsEmpty());
  // Both CDI strategies: the annotation and the CDI devices field.
  AllocateAnswerBuilder both(Gpus(),
                             {.dev_root = root_,
                              .list = {.envvar = false, .cdi_annotations = true, .cdi_cri = true},
                              .cdi_annotation_prefix = "cdi.example.com/",
                              .response_id = [] { return std::string("r-2"); }});
  StatusOr<AllocateAnswer> c = both.Answer({"GPU-aaaa"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->annotations,
            (std::map<std::string, std::string>{
                {"cdi.example.com/nvidia-device-plugin_r-2", "nvidia.com/gpu=GPU-aaaa"}}));
  EXPECT_THAT(c->cdi_devices, ElementsAre("nvidia.com/gpu=GPU-aaaa"));
  EXPECT_THAT(c->envs, IsEmpty());
  EXPECT_THAT(c->device_nodes, IsEmpty());
}

TEST_F(AllocateAnswerTest, TheDefaultResponseIdIsAFreshVersion4Uuid) {
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_, .list = {.cdi_annotations = true}});
  std::set<std::string> keys;
  for (int i = 0; i < 20; ++i) {
    StatusOr<AllocateAnswer> a = b.Answer({"GPU-aaaa"});
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(a->annotations.size(), 1u);
    const std::string& key = a->annotations.begin()->first;
    EXPECT_THAT(key, MatchesRegex("cdi\\.k8s\\.io/nvidia-device-plugin_[0-9a-f]{8}-[0-9a-f]{4}-"
                                  "4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"));
    // The name part of an annotation key is at most 63 characters.
    EXPECT_LE(key.size() - std::string("cdi.k8s.io/").size(), 63u);
    keys.insert(key);
  }
  EXPECT_EQ(keys.size(), 20u);
}

TEST_F(AllocateAnswerTest, WithoutDeviceSpecsOnlyTheListStrategiesAnswer) {
  Touch("/dev/nvidiactl");
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_, .pass_device_specs = false});
  StatusOr<AllocateAnswer> a = b.Answer({"GPU-aaaa"});
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->device_nodes, IsEmpty());
  EXPECT_EQ(a->envs.at("NVIDIA_VISIBLE_DEVICES"), "GPU-aaaa");
}

TEST(DeviceStrategiesTest, ParseNvidiasSpellingsAndRefuseOthersByName) {
  StatusOr<DeviceListStrategies> one = ParseDeviceListStrategies("volume-mounts");
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->envvar);
  EXPECT_TRUE(one->volume_mounts);
  StatusOr<DeviceListStrategies> all =
      ParseDeviceListStrategies("cdi-cri,envvar,cdi-annotations,volume-mounts,envvar");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(DeviceListStrategiesName(*all), "envvar,volume-mounts,cdi-annotations,cdi-cri");
  for (const char* bad :
       {"", "env", "envvar,", ",envvar", "envvar,,cdi-cri", "ENVVAR", "envvar cdi-cri", "cdi"}) {
    StatusOr<DeviceListStrategies> s = ParseDeviceListStrategies(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.status().message(),
                HasSubstr("envvar, volume-mounts, cdi-annotations or cdi-cri"))
        << bad;
  }
  EXPECT_EQ(ParseDeviceListStrategies("envvar,bogus").status().message(),
            "\"bogus\" is not envvar, volume-mounts, cdi-annotations or cdi-cri");

  EXPECT_EQ(*ParseDeviceIdStrategy("uuid"), DeviceIdStrategy::kUuid);
  EXPECT_EQ(*ParseDeviceIdStrategy("index"), DeviceIdStrategy::kIndex);
  for (const char* bad : {"", "UUID", "indices", "uuid,index"}) {
    EXPECT_FALSE(ParseDeviceIdStrategy(bad).ok()) << bad;
  }
  EXPECT_EQ(ParseDeviceIdStrategy("minor").status().message(), "\"minor\" is not uuid or index");

  EXPECT_TRUE(CheckCdiAnnotationPrefix("cdi.k8s.io/").ok());
  EXPECT_TRUE(CheckCdiAnnotationPrefix("example.com/").ok());
  for (const char* bad : {"", "/", "cdi.k8s.io", "CDI.k8s.io/", "cdi k8s/", "cdi.k8s.io//", "-cdi/",
                          "cdi.k8s.io/x"}) {
    Status s = CheckCdiAnnotationPrefix(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace kdm::nvml
