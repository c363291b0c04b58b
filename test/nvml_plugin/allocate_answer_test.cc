#include "kdm/nvml/allocate_answer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace kdm::nvml {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

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
    return {{"GPU-aaaa", 3}, {"GPU-bbbb", 0}, {"GPU-cccc", 7}};
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
  EXPECT_THAT(a->device_nodes, ElementsAre("/dev/nvidia7", "/dev/nvidia3", "/dev/nvidiactl",
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
  EXPECT_THAT(a->device_nodes, ElementsAre("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                           "/dev/nvidia-uvm-tools"));
}

TEST_F(AllocateAnswerTest, NoControlNodesUnderAnEmptyOrMissingRoot) {
  for (const std::string& dev_root : {root_, root_ + "/missing"}) {
    AllocateAnswerBuilder b(Gpus(), {.dev_root = dev_root});
    StatusOr<AllocateAnswer> a = b.Answer({"GPU-bbbb"});
    ASSERT_TRUE(a.ok()) << dev_root;
    EXPECT_THAT(a->device_nodes, ElementsAre("/dev/nvidia0")) << dev_root;
  }
}

TEST_F(AllocateAnswerTest, CdiNamesWithCdi) {
  AllocateAnswerBuilder b(Gpus(), {.dev_root = root_, .cdi = true});
  StatusOr<AllocateAnswer> a = b.Answer({"GPU-aaaa", "GPU-bbbb"});
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->cdi_devices, ElementsAre("nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb"));
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

}  // namespace
}  // namespace kdm::nvml
