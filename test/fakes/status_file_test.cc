// Status files of the fake kubelet: exact keys, the kubelet's texts, and
// atomic replacement.
#include "kdm/fakes/status_file.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace kdm::fakes {
namespace {

using nlohmann::json;

std::vector<std::string> Keys(const json& j) {
  std::vector<std::string> out;
  for (const auto& [k, v] : j.items()) out.push_back(k);
  return out;
}

TEST(StatusFileTest, AdmittedPodHasExactlyTheIssueKeys) {
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
  EXPECT_THAT(Keys(jc),
              ::testing::UnorderedElementsAre("name", "devices", "envs", "mounts", "device_specs",
                                              "annotations", "cdi_devices"));
  EXPECT_EQ(jc["devices"]["nvidia.com/gpu"], json({"GPU0", "GPU1"}));
  EXPECT_EQ(jc["envs"]["NVIDIA_VISIBLE_DEVICES"], "GPU0,GPU1");
  EXPECT_EQ(
      jc["mounts"][0],
      json({{"container_path", "/usr/lib/x"}, {"host_path", "/host/lib/x"}, {"read_only", true}}));
  EXPECT_EQ(jc["device_specs"][0], json({{"container_path", "/dev/nvidia0"},
                                         {"host_path", "/dev/nvidia0"},
                                         {"permissions", "rw"}}));
  EXPECT_EQ(jc["annotations"]["a"], "b");
  EXPECT_EQ(jc["cdi_devices"], json({"nvidia.com/gpu=GPU0"}));
}

TEST(StatusFileTest, RejectedPodUsesTheKubeletsReasonAndMessage) {
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

TEST(StatusFileTest, FileNames) {
  EXPECT_EQ(PodStatusFileName("default", "train"), "default_train.json");
  EXPECT_EQ(ManifestStatusFileName("bad.yaml"), "manifest_bad.yaml.json");
}

TEST(StatusFileTest, NodeStatusReportsCapacityAllocatablePluginsAndDeleted) {
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
  EXPECT_EQ(j["plugins"][0], json({{"resource", "example.com/fpga"},
                                   {"state", "Unhealthy"},
                                   {"devices", 4},
                                   {"healthy", 0}}));
  EXPECT_EQ(j["plugins"][1]["state"], "Pending");
  EXPECT_EQ(j["plugins"][2]["state"], "Healthy");
  EXPECT_EQ(j["deleted_resources"], json({"example.com/old"}));
  EXPECT_EQ(j["registrations"], 3);
}

TEST(StatusFileTest, WriteReplacesAtomicallyAndLeavesNoTemporaryFile) {
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
TEST(StatusFileTest, RemoveStaleTempFilesRemovesOnlyTheWritersOwnTempFiles) {
  char tmpl[] = "/tmp/kdm-status-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::vector<std::string> stale = {dir + "/.default_a.json.tmp-Ab12Cd",
                                          dir + "/.node.json.tmp-zZ09xy"};
  const std::vector<std::string> kept = {dir + "/default_a.json",
                                         dir + "/.default_a.json.tmp-short",
                                         dir + "/default_a.json.tmp-Ab12Cd",
                                         dir + "/.default_a.json.tmp-Ab1-Cd",
                                         dir + "/.tmp-Ab12Cd",
                                         dir + "/notes.txt"};
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

TEST(StatusFileTest, AdmittedStatusFilesWithDevicesCountsOnlyPodsHoldingDevices) {
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

// ---- the parser: what the writer writes comes back; anything else is
// refused with a message naming the place.

PodStatus FullPodStatus() {
  PodStatus s;
  s.phase = kPhaseAdmitted;
  ContainerStatus init;
  init.name = "init";
  init.devices["vendor.com/gpu"] = {"gpu0"};
  s.containers.push_back(init);
  ContainerStatus c;
  c.name = "main";
  c.devices["nvidia.com/gpu"] = {"GPU0", "GPU1"};
  c.devices["example.com/nic"] = {};
  c.run.envs["NVIDIA_VISIBLE_DEVICES"] = "GPU0,GPU1";
  c.run.mounts.push_back({"/usr/lib/x", "/host/lib/x", true});
  c.run.mounts.push_back({"/data", "/host/data", false});
  c.run.devices.push_back({"/dev/nvidia0", "/dev/nvidia0", "rw"});
  c.run.annotations["a"] = "b";
  c.run.cdi_devices = {"nvidia.com/gpu=GPU0", "nvidia.com/gpu=GPU1"};
  s.containers.push_back(c);
  return s;
}

NodeStatus FullNodeStatus() {
  NodeStatus n;
  n.capacity.resources["nvidia.com/gpu"] = {8, 7};
  n.capacity.resources["example.com/fpga"] = {4, 0};
  n.capacity.resources["example.com/nic"] = {0, 0};
  n.capacity.deleted = {"example.com/old"};
  n.registrations = 3;
  return n;
}

TEST(StatusFileTest, ParsePodStatusGivesBackWhatWasRendered) {
  const PodStatus s = FullPodStatus();
  StatusOr<PodStatus> parsed = ParsePodStatus(RenderPodStatus(s));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->phase, s.phase);
  ASSERT_EQ(parsed->containers.size(), 2u);
  const ContainerStatus& c = parsed->containers[1];
  EXPECT_EQ(c.name, "main");
  EXPECT_EQ(c.devices, s.containers[1].devices);
  EXPECT_EQ(c.run.envs, s.containers[1].run.envs);
  EXPECT_EQ(c.run.mounts, s.containers[1].run.mounts);
  EXPECT_EQ(c.run.devices, s.containers[1].run.devices);
  EXPECT_EQ(c.run.annotations, s.containers[1].run.annotations);
  EXPECT_EQ(c.run.cdi_devices, s.containers[1].run.cdi_devices);
  EXPECT_EQ(RenderPodStatus(*parsed), RenderPodStatus(s));

  PodStatus rejected;
  rejected.phase = kPhaseRejected;
  rejected.reason = kReasonDuplicatePod;
  rejected.message = "b.yaml defines pod default/a, already defined by a.yaml";
  parsed = ParsePodStatus(RenderPodStatus(rejected));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->reason, rejected.reason);
  EXPECT_EQ(parsed->message, rejected.message);
  EXPECT_TRUE(parsed->containers.empty());
}

TEST(StatusFileTest, ParseNodeStatusGivesBackWhatWasRendered) {
  const NodeStatus n = FullNodeStatus();
  StatusOr<NodeStatus> parsed = ParseNodeStatus(RenderNodeStatus(n));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->capacity.resources, n.capacity.resources);
  EXPECT_EQ(parsed->capacity.deleted, n.capacity.deleted);
  EXPECT_EQ(parsed->registrations, 3);
  EXPECT_EQ(RenderNodeStatus(*parsed), RenderNodeStatus(n));
  EXPECT_TRUE(ParseNodeStatus(RenderNodeStatus({})).ok());
}

TEST(StatusFileTest, NodeDevicesAndPendingPodsRoundTrip) {
  NodeStatus n = FullNodeStatus();
  n.devices =
      std::vector<NodeDevice>{{"nvidia.com/gpu", "GPU0", true, {0}, "NVIDIA H100 80GB HBM3", 0},
                              {"nvidia.com/gpu", "GPU1", false, {}, "", 7},
                              {"example.com/fpga", "fpga-0", true, {}, "", std::nullopt}};
  n.pending_pods = std::vector<PendingPod>{{"ml", "train", kReasonWaitingForPlugins}};
  const std::string text = RenderNodeStatus(n);
  EXPECT_TRUE(text.ends_with("}\n"));
  json j = json::parse(text);
  EXPECT_EQ(j["devices"][0]["model"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j["devices"][1]["healthy"], false);
  EXPECT_EQ(j["devices"][1]["index"], 7);
  EXPECT_EQ(j["devices"][2].count("index"), 0u);  // only where the agent knows it
  EXPECT_EQ(j["pending_pods"][0]["reason"], "WaitingForPlugins");
  StatusOr<NodeStatus> parsed = ParseNodeStatus(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->devices, n.devices);
  EXPECT_EQ(parsed->pending_pods, n.pending_pods);
  EXPECT_EQ(RenderNodeStatus(*parsed), text);
}

TEST(StatusFileTest, ANodeJsonWithoutDevicesOrPendingPodsStillParses) {
  // What an agent from before these keys wrote.
  StatusOr<NodeStatus> parsed = ParseNodeStatus(RenderNodeStatus(FullNodeStatus()));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->devices.has_value());
  EXPECT_FALSE(parsed->pending_pods.has_value());
  EXPECT_EQ(json::parse(RenderNodeStatus(*parsed)).count("devices"), 0u);
}

TEST(StatusFileTest, BadDevicesAndPendingPodsAreNamed) {
  const std::string base =
      R"({"capacity": {}, "allocatable": {}, "plugins": [], "deleted_resources": [],)"
      R"( "registrations": 0, )";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("devices": {})", R"("devices" is not an array)"},
      {R"("devices": [1])", R"("devices"[0] is not an object)"},
      {R"("devices": [{"resource": "a/b", "id": "x", "healthy": "yes", "numa_nodes": [],)"
       R"( "model": ""}])",
       R"("devices"[0]["healthy"] is not a boolean)"},
      {R"("devices": [{"resource": "a/b", "id": "x", "healthy": true, "numa_nodes": [-1],)"
       R"( "model": ""}])",
       R"("devices"[0]["numa_nodes"][0] is negative)"},
      {R"("devices": [{"resource": "a/b", "id": "x", "healthy": true, "numa_nodes": []}])",
       R"("devices"[0]["model"] is missing)"},
      {R"("devices": [{"resource": "a/b", "id": "x", "healthy": true, "numa_nodes": [],)"
       R"( "model": "", "index": -1}])",
       R"("devices"[0]["index"] is negative)"},
      {R"("devices": [{"resource": "a/b", "id": "x", "healthy": true, "numa_nodes": [],)"
       R"( "model": "", "index": "0"}])",
       R"("devices"[0]["index"] is not a whole number)"},
      {R"("devices": [{"resource": "a/b", "id": "x", "healthy": true, "numa_nodes": [],)"
       R"( "model": "", "index": 99999999999}])",
       R"("devices"[0]["index"] is past 1000000)"},
      {R"("pending_pods": [{"namespace": "a", "name": 3, "reason": ""}])",
       R"("pending_pods"[0]["name"] is not a string)"},
  };
  for (const auto& [tail, want] : cases) {
    StatusOr<NodeStatus> parsed = ParseNodeStatus(base + tail + "}");
    ASSERT_FALSE(parsed.ok()) << tail;
    EXPECT_EQ(parsed.status().message(), want) << tail;
  }
}

TEST(StatusFileTest, GarbageIsRefusedAsNotJson) {
  for (const std::string& garbage :
       {std::string(""), std::string("\x00\xff\xfe", 3), std::string("not json"),
        std::string("{\"phase\": \"Admitted\",,}"), std::string(100000, '['),
        std::string("{\"phase\": \"Adm\xff\"}")}) {
    StatusOr<PodStatus> pod = ParsePodStatus(garbage);
    ASSERT_FALSE(pod.ok());
    EXPECT_EQ(pod.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(pod.status().message(), ::testing::StartsWith("not valid JSON: "));
    StatusOr<NodeStatus> node = ParseNodeStatus(garbage);
    ASSERT_FALSE(node.ok());
    EXPECT_THAT(node.status().message(), ::testing::StartsWith("not valid JSON: "));
  }
  for (const char* not_object : {"[1, 2]", "\"Admitted\"", "42", "null"}) {
    EXPECT_EQ(ParsePodStatus(not_object).status(), InvalidArgumentError("not a JSON object"));
    EXPECT_EQ(ParseNodeStatus(not_object).status(), InvalidArgumentError("not a JSON object"));
  }
}

TEST(StatusFileTest, EveryTruncationIsRefused) {
  const std::string pod = RenderPodStatus(FullPodStatus());
  const std::string node = RenderNodeStatus(FullNodeStatus());
  // The last byte is the trailing newline; without it the file is whole.
  for (size_t n = 0; n + 1 < pod.size(); ++n) {
    EXPECT_FALSE(ParsePodStatus(pod.substr(0, n)).ok()) << n;
  }
  for (size_t n = 0; n + 1 < node.size(); ++n) {
    EXPECT_FALSE(ParseNodeStatus(node.substr(0, n)).ok()) << n;
  }
}

TEST(StatusFileTest, AFileOfAnotherSchemaIsRefusedNamingTheMissingKey) {
  const std::string pod = RenderPodStatus(FullPodStatus());
  const std::string node = RenderNodeStatus(FullNodeStatus());
  EXPECT_EQ(ParsePodStatus(node).status(), InvalidArgumentError("\"phase\" is missing"));
  EXPECT_EQ(ParseNodeStatus(pod).status(), InvalidArgumentError("\"capacity\" is missing"));
  // A future or foreign layout (there is no version key: the keys are the
  // schema).
  EXPECT_EQ(ParsePodStatus(R"({"apiVersion": "v2", "status": {"phase": "Admitted"}})").status(),
            InvalidArgumentError("\"phase\" is missing"));
  // Unknown keys beside the known ones are ignored.
  json extra = json::parse(pod);
  extra["future"] = {1, 2};
  extra["containers"][0]["future"] = "x";
  EXPECT_TRUE(ParsePodStatus(extra.dump()).ok());
}

TEST(StatusFileTest, WrongTypesAndValuesAreRefusedNamingThePlace) {
  auto pod_with = [](const std::function<void(json&)>& edit) {
    json j = json::parse(RenderPodStatus(FullPodStatus()));
    edit(j);
    return ParsePodStatus(j.dump()).status();
  };
  EXPECT_EQ(pod_with([](json& j) { j["phase"] = 7; }),
            InvalidArgumentError("\"phase\" is not a string"));
  EXPECT_EQ(pod_with([](json& j) { j["phase"] = "Running"; }),
            InvalidArgumentError("\"phase\" is \"Running\", not \"Admitted\" or \"Rejected\""));
  EXPECT_EQ(pod_with([](json& j) { j["containers"] = 3; }),
            InvalidArgumentError("\"containers\" is not an array"));
  EXPECT_EQ(pod_with([](json& j) { j["containers"][1] = "main"; }),
            InvalidArgumentError("\"containers\"[1] is not an object"));
  EXPECT_EQ(pod_with([](json& j) { j["containers"][1]["devices"]["nvidia.com/gpu"][1] = 1; }),
            InvalidArgumentError(
                "\"containers\"[1][\"devices\"][\"nvidia.com/gpu\"][1] is not a string"));
  EXPECT_EQ(pod_with([](json& j) { j["containers"][1].erase("envs"); }),
            InvalidArgumentError("\"containers\"[1][\"envs\"] is missing"));
  EXPECT_EQ(
      pod_with([](json& j) { j["containers"][1]["mounts"][0]["read_only"] = "yes"; }),
      InvalidArgumentError("\"containers\"[1][\"mounts\"][0][\"read_only\"] is not a boolean"));
  EXPECT_EQ(pod_with([](json& j) { j["containers"][1]["annotations"]["a"] = json::object(); }),
            InvalidArgumentError("\"containers\"[1][\"annotations\"][\"a\"] is not a string"));

  auto node_with = [](const std::function<void(json&)>& edit) {
    json j = json::parse(RenderNodeStatus(FullNodeStatus()));
    edit(j);
    return ParseNodeStatus(j.dump()).status();
  };
  EXPECT_EQ(node_with([](json& j) { j["capacity"] = json::array(); }),
            InvalidArgumentError("\"capacity\" is not an object"));
  EXPECT_EQ(node_with([](json& j) { j["capacity"]["nvidia.com/gpu"] = -1; }),
            InvalidArgumentError("\"capacity\"[\"nvidia.com/gpu\"] is negative"));
  EXPECT_EQ(node_with([](json& j) { j["capacity"]["nvidia.com/gpu"] = 1.5; }),
            InvalidArgumentError("\"capacity\"[\"nvidia.com/gpu\"] is not a whole number"));
  EXPECT_EQ(node_with([](json& j) { j["capacity"]["nvidia.com/gpu"] = 18446744073709551615u; }),
            InvalidArgumentError("\"capacity\"[\"nvidia.com/gpu\"] is too large"));
  EXPECT_EQ(node_with([](json& j) { j["allocatable"]["nvidia.com/gpu"] = 9; }),
            InvalidArgumentError(
                "\"allocatable\"[\"nvidia.com/gpu\"] is larger than the resource's capacity"));
  EXPECT_EQ(node_with([](json& j) { j["allocatable"]["x.io/y"] = 0; }),
            InvalidArgumentError(
                "\"allocatable\"[\"x.io/y\"] names a resource that \"capacity\" does not"));
  EXPECT_EQ(
      node_with([](json& j) { j["allocatable"].erase("example.com/nic"); }),
      InvalidArgumentError(
          "\"capacity\"[\"example.com/nic\"] names a resource that \"allocatable\" does not"));
  EXPECT_EQ(node_with([](json& j) { j["plugins"][0]["state"] = "Healthy"; }),
            InvalidArgumentError("\"plugins\"[0] (\"example.com/fpga\") disagrees with "
                                 "\"capacity\" and \"allocatable\""));
  EXPECT_EQ(node_with([](json& j) { j["deleted_resources"] = {1}; }),
            InvalidArgumentError("\"deleted_resources\"[0] is not a string"));
  EXPECT_EQ(node_with([](json& j) { j.erase("registrations"); }),
            InvalidArgumentError("\"registrations\" is missing"));
}

class StatusFileReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-status-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(StatusFileReadTest, ReadsWhatWasWrittenAndNamesThePathOfAnyProblem) {
  const std::string node = dir_ + "/node.json";
  ASSERT_TRUE(WriteFileAtomically(node, RenderNodeStatus(FullNodeStatus())).ok());
  StatusOr<NodeStatus> n = ReadNodeStatusFile(node);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->registrations, 3);
  const std::string pod = dir_ + "/default_a.json";
  ASSERT_TRUE(WriteFileAtomically(pod, RenderPodStatus(FullPodStatus())).ok());
  StatusOr<PodStatus> p = ReadPodStatusFile(pod);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->containers.size(), 2u);

  EXPECT_EQ(ReadPodStatusFile(dir_ + "/none.json").status(),
            NotFoundError(dir_ + "/none.json does not exist"));
  EXPECT_EQ(ReadPodStatusFile(node).status(),
            InvalidArgumentError(node + ": \"phase\" is missing"));
  std::ofstream(pod, std::ios::trunc) << R"({"phase": "Admitted", "reas)";
  EXPECT_THAT(ReadPodStatusFile(pod).status().message(),
              ::testing::StartsWith(pod + ": not valid JSON: "));
  EXPECT_EQ(ReadNodeStatusFile(dir_).status(), InvalidArgumentError(dir_ + ": not a regular file"));
}

TEST_F(StatusFileReadTest, AHugeFileIsRefusedWithoutReadingItAll) {
  const std::string path = dir_ + "/default_huge.json";
  {
    std::ofstream out(path);
    out << "{\"phase\": \"Admitted\", \"message\": \"";
  }
  // Sparse: a byte past the limit costs no disk.
  std::filesystem::resize_file(path, kMaxStatusFileBytes + 1);
  Status s = ReadPodStatusFile(path).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::StartsWith(path + ": larger than "));
  EXPECT_EQ(ReadNodeStatusFile(path).status(), s);
  // And it is not counted as an admitted pod.
  EXPECT_TRUE(AdmittedStatusFilesWithDevices(dir_).empty());
}

TEST_F(StatusFileReadTest, AFifoInAStatusFilesPlaceDoesNotHangTheReader) {
  const std::string path = dir_ + "/default_fifo.json";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  EXPECT_EQ(ReadPodStatusFile(path).status(), InvalidArgumentError(path + ": not a regular file"));
}

}  // namespace
}  // namespace kdm::fakes
