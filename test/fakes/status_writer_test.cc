// Status files of the fake kubelet: exact keys, the kubelet's texts, and
// atomic replacement.
#include "kdm/fakes/status_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace kdm::fakes {
namespace {

using nlohmann::json;

std::vector<std::string> Keys(const json& j) {
  std::vector<std::string> out;
  for (const auto& [k, v] : j.items()) out.push_back(k);
  return out;
}

TEST(StatusWriterTest, AdmittedPodHasExactlyTheIssueKeys) {
  PodStatus s;
  s.phase = kPhaseAdmitted;
  ContainerStatus c;
  c.name = "main";
  c.devices["nvidia.com/gpu"] = {"GPU0", "GPU1"};
  c.run.envs["NVIDIA_VISIBLE_DEVICES"] = "GPU0,GPU1";
  c.run.mounts.push_back({"/usr/lib/x", "/host/lib/x", true});
  c.run.devices.push_back({"/dev/nvidia0", "/dev/nvidia0", "rw"});
  c.run.annotations["a"] = "b";
  c.run.cdi_devices = {"nvidia.com/gpu=GPU0"};
  s.containers.push_back(c);
  json j = json::parse(RenderPodStatus(s));
  EXPECT_THAT(Keys(j), ::testing::UnorderedElementsAre("phase", "reason", "message", "containers"));
  EXPECT_EQ(j["phase"], "Admitted");
  EXPECT_EQ(j["reason"], "");
  ASSERT_EQ(j["containers"].size(), 1u);
  const json& jc = j["containers"][0];
  EXPECT_THAT(Keys(jc), ::testing::UnorderedElementsAre("name", "devices", "envs", "mounts",
                                                        "device_specs", "annotations",
                                                        "cdi_devices"));
  EXPECT_EQ(jc["devices"]["nvidia.com/gpu"], json({"GPU0", "GPU1"}));
  EXPECT_EQ(jc["envs"]["NVIDIA_VISIBLE_DEVICES"], "GPU0,GPU1");
  EXPECT_EQ(jc["mounts"][0], json({{"container_path", "/usr/lib/x"},
                                   {"host_path", "/host/lib/x"},
                                   {"read_only", true}}));
  EXPECT_EQ(jc["device_specs"][0], json({{"container_path", "/dev/nvidia0"},
                                         {"host_path", "/dev/nvidia0"},
                                         {"permissions", "rw"}}));
  EXPECT_EQ(jc["annotations"]["a"], "b");
  EXPECT_EQ(jc["cdi_devices"], json({"nvidia.com/gpu=GPU0"}));
}

TEST(StatusWriterTest, RejectedPodUsesTheKubeletsReasonAndMessage) {
  PodStatus s;
  s.phase = kPhaseRejected;
  s.reason = kReasonUnexpectedAdmissionError;
  s.message = AdmissionFailureMessage(
      "requested number of devices unavailable for nvidia.com/gpu. Requested: 4, Available: 2");
  json j = json::parse(RenderPodStatus(s));
  EXPECT_EQ(j["phase"], "Rejected");
  EXPECT_EQ(j["reason"], "UnexpectedAdmissionError");
  EXPECT_EQ(j["message"],
            "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
            "Requested: 4, Available: 2, which is unexpected");
  EXPECT_EQ(j["containers"], json::array());
}

TEST(StatusWriterTest, FileNames) {
  EXPECT_EQ(PodStatusFileName("default", "train"), "default_train.json");
  EXPECT_EQ(ManifestStatusFileName("bad.yaml"), "manifest_bad.yaml.json");
}

TEST(StatusWriterTest, NodeStatusReportsCapacityAllocatablePluginsAndDeleted) {
  NodeStatus n;
  n.capacity.resources["nvidia.com/gpu"] = {8, 7};
  n.capacity.resources["example.com/fpga"] = {4, 0};
  n.capacity.resources["example.com/nic"] = {0, 0};
  n.capacity.deleted = {"example.com/old"};
  n.registrations = 3;
  json j = json::parse(RenderNodeStatus(n));
  EXPECT_THAT(Keys(j), ::testing::UnorderedElementsAre("capacity", "allocatable", "plugins",
                                                       "deleted_resources", "registrations"));
  EXPECT_EQ(j["capacity"]["nvidia.com/gpu"], 8);
  EXPECT_EQ(j["allocatable"]["nvidia.com/gpu"], 7);
  EXPECT_EQ(j["capacity"]["example.com/fpga"], 4);
  EXPECT_EQ(j["allocatable"]["example.com/fpga"], 0);
  ASSERT_EQ(j["plugins"].size(), 3u);
  EXPECT_EQ(j["plugins"][0], json({{"resource", "example.com/fpga"}, {"state", "Unhealthy"},
                                   {"devices", 4}, {"healthy", 0}}));
  EXPECT_EQ(j["plugins"][1]["state"], "Pending");
  EXPECT_EQ(j["plugins"][2]["state"], "Healthy");
  EXPECT_EQ(j["deleted_resources"], json({"example.com/old"}));
  EXPECT_EQ(j["registrations"], 3);
}

TEST(StatusWriterTest, WriteReplacesAtomicallyAndLeavesNoTemporaryFile) {
  char tmpl[] = "/tmp/kdm-status-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string path = dir + "/default_a.json";
  ASSERT_TRUE(WriteFileAtomically(path, "one\n").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "two\n").ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "two\n");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(e.path().filename(), "default_a.json");
  }
  EXPECT_EQ(files, 1);
  Status bad = WriteFileAtomically(dir + "/missing/x.json", "x");
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), ::testing::HasSubstr(dir + "/missing/x.json"));
  std::filesystem::remove_all(dir);
}

// Issue 16: a kill -9 between mkostemp and rename left ".<name>.tmp-XXXXXX"
// in status/ for good. Only that pattern is removed.
TEST(StatusWriterTest, RemoveStaleTempFilesRemovesOnlyTheWritersOwnTempFiles) {
  char tmpl[] = "/tmp/kdm-status-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::vector<std::string> stale = {dir + "/.default_a.json.tmp-Ab12Cd",
                                          dir + "/.node.json.tmp-zZ09xy"};
  const std::vector<std::string> kept = {
      dir + "/default_a.json",           dir + "/.default_a.json.tmp-short",
      dir + "/default_a.json.tmp-Ab12Cd", dir + "/.default_a.json.tmp-Ab1-Cd",
      dir + "/.tmp-Ab12Cd",               dir + "/notes.txt"};
  for (const auto& f : stale) std::ofstream(f) << "partial";
  for (const auto& f : kept) std::ofstream(f) << "keep";
  std::filesystem::create_directory(dir + "/.sub.json.tmp-Ab12Cd");  // not a file
  EXPECT_THAT(RemoveStaleTempFiles(dir), ::testing::UnorderedElementsAreArray(stale));
  for (const auto& f : stale) EXPECT_FALSE(std::filesystem::exists(f)) << f;
  for (const auto& f : kept) EXPECT_TRUE(std::filesystem::exists(f)) << f;
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/.sub.json.tmp-Ab12Cd"));
  EXPECT_TRUE(RemoveStaleTempFiles(dir).empty());
  // A name made the way WriteFileAtomically makes it matches the pattern.
  std::string made = dir + "/.default_a.json.tmp-XXXXXX";
  int fd = ::mkostemp(made.data(), O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_THAT(RemoveStaleTempFiles(dir), ::testing::ElementsAre(made));
  EXPECT_TRUE(RemoveStaleTempFiles(dir + "/missing").empty());
  std::filesystem::remove_all(dir);
}

TEST(StatusWriterTest, AdmittedStatusFilesWithDevicesCountsOnlyPodsHoldingDevices) {
  char tmpl[] = "/tmp/kdm-status-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  PodStatus with;
  with.phase = kPhaseAdmitted;
  with.containers.push_back({"main", {{"vendor.com/gpu", {"gpu0"}}}, {}});
  PodStatus without;
  without.phase = kPhaseAdmitted;
  without.containers.push_back({"main", {}, {}});
  PodStatus rejected;
  rejected.phase = kPhaseRejected;
  rejected.reason = kReasonInvalidManifest;
  ASSERT_TRUE(WriteFileAtomically(dir + "/default_b.json", RenderPodStatus(with)).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/default_a.json", RenderPodStatus(with)).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/default_c.json", RenderPodStatus(without)).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/default_d.json", RenderPodStatus(rejected)).ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/node.json", RenderNodeStatus({})).ok());
  std::ofstream(dir + "/default_e.json") << "{not json";
  std::ofstream(dir + "/default_f.json") << R"({"phase": 7, "containers": 3})";
  EXPECT_THAT(AdmittedStatusFilesWithDevices(dir),
              ::testing::ElementsAre("default_a.json", "default_b.json"));
  EXPECT_TRUE(AdmittedStatusFilesWithDevices(dir + "/missing").empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kdm::fakes
