// `kdm get` against a real `kdm kubelet` with `kdm plugin` processes (issue
// 30 item 5): every pod the agent knows with STATUS and REASON (admitted,
// rejected, pending), every device with its health (one made unhealthy with
// `kdm plugin --health-file`), -o wide and -o json, `kdm get pod NAME`, -w
// printing a change and ending on SIGINT, and bad input (an unknown kind,
// pod or device, a bad -o, a broken status file). Every wait is a bounded
// poll on a file or the output of a process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kdm/test/e2e/e2e_util.h"
#include "kdm/test/e2e/kubelet_fixture.h"

namespace kdm {
namespace {

namespace fs = std::filesystem;
using kdm::e2e::Gpus;
using kdm::e2e::kFpga;
using kdm::e2e::kGpu;
using kdm::e2e::KubeletE2eTest;
using kdm::e2e::kWaitBound;
using kdm::e2e::PodYaml;
using kdm::e2e::Process;
using kdm::e2e::ReadFile;
using kdm::e2e::WaitUntil;
using kdm::e2e::WriteFileAtomically;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct GetResult {
  int exit_code = -1;
  std::string out, err;
};

std::vector<std::string> GetLines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) out.push_back(line);
  return out;
}

std::vector<std::string> Cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream s(line);
  for (std::string cell; s >> cell;) out.push_back(cell);
  return out;
}

// Whether some line's cells are `cells`.
bool HasRow(const std::string& text, const std::vector<std::string>& cells) {
  for (const std::string& line : GetLines(text)) {
    if (Cells(line) == cells) return true;
  }
  return false;
}

// The first line whose cells start with `prefix`, or "".
std::string RowStartingWith(const std::string& text, const std::vector<std::string>& prefix) {
  for (const std::string& line : GetLines(text)) {
    std::vector<std::string> cells = Cells(line);
    if (cells.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), cells.begin())) {
      return line;
    }
  }
  return "";
}

class GetAgentE2eTest : public KubeletE2eTest {
 protected:
  GetResult Get(std::vector<std::string> args) {
    args.insert(args.begin(), "get");
    const std::string out = root_ + "/get.out", err = root_ + "/get.err";
    Process p(args, out, err);
    GetResult r;
    std::optional<int> code = p.Wait();
    r.exit_code = code ? *code : -1;
    r.out = ReadFile(out);
    r.err = ReadFile(err);
    return r;
  }

  // An agent with 8 GPUs (GPU3 made unhealthy through the health file) and
  // 4 FPGAs whose plugin holds large GetPreferredAllocation calls until the
  // agent's 3 s deadline; default/a holds 2 GPUs, default/b (7 GPUs) is
  // rejected.
  void StartNodeWithPods() {
    StartKubelet({"--rpc-timeout", "3s"});
    StartGpuPlugin();
    StartPlugin({"--resource", kFpga, "--count", "4", "--fault", "pref-slow"});
    ASSERT_TRUE(
        WaitUntil([&] { return Allocatable(kGpu, 8) && Allocatable(kFpga, 4); }, kWaitBound))
        << kubelet_->Log();
    {
      std::ofstream(root_ + "/health.json.tmp") << R"({"GPU3": "Unhealthy"})";
      fs::rename(root_ + "/health.json.tmp", root_ + "/health.json");
    }
    ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 7); }, kWaitBound)) << kubelet_->Log();
    WriteFileAtomically(Manifests() + "/a.yaml", PodYaml("a", 2));
    a_gpus_ = Gpus(WaitPhase("default_a", "Admitted"));
    ASSERT_EQ(a_gpus_.size(), 2u);
    WriteFileAtomically(Manifests() + "/b.yaml", PodYaml("b", 7));
    WaitPhase("default_b", "Rejected");
    // node.json lists every device once the agent has seen GPU3 go.
    ASSERT_TRUE(WaitUntil(
        [&] {
          json node = Node();
          if (!node.contains("devices")) return false;
          for (const auto& d : node["devices"]) {
            if (d["id"] == "GPU3" && d["healthy"] == false) return true;
          }
          return false;
        },
        kWaitBound))
        << Node().dump();
  }

  // The NUMA column of a device, from node.json.
  std::string Numa(const std::string& id) {
    const json node = Node();  // kept alive: the loop walks into it
    for (const auto& d : node.value("devices", json::array())) {
      if (d["id"] != id) continue;
      std::string out;
      for (const auto& n : d["numa_nodes"]) {
        out += (out.empty() ? "" : ",") + std::to_string(n.get<int>());
      }
      return out.empty() ? "-" : out;
    }
    return "?";
  }

  std::vector<std::string> a_gpus_;
};

TEST_F(GetAgentE2eTest, GetPodsShowsAdmittedAndRejectedWithStatusAndReason) {
  StartNodeWithPods();
  GetResult r = Get({"pods", "--root", root_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  std::vector<std::string> lines = GetLines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_THAT(Cells(lines[0]), ElementsAre("NAMESPACE", "NAME", "CONTAINER", "RESOURCE", "DEVICES",
                                           "NUMA", "STATUS", "REASON"));
  std::string a_numa = Numa(a_gpus_[0]);
  if (Numa(a_gpus_[1]) != a_numa) a_numa += "," + Numa(a_gpus_[1]);
  EXPECT_THAT(Cells(lines[1]), ElementsAre("default", "a", "main", kGpu,
                                           a_gpus_[0] + "," + a_gpus_[1], a_numa, "Admitted", "-"));
  EXPECT_THAT(Cells(lines[2]), ElementsAre("default", "b", "-", "-", "-", "-", "Rejected",
                                           "UnexpectedAdmissionError"));
  // Every column starts at the same offset on every line.
  for (const char* column : {"CONTAINER", "STATUS", "REASON"}) {
    const std::size_t at = lines[0].find(column);
    for (const std::string& line : lines) {
      EXPECT_NE(line[at], ' ') << line;
      EXPECT_EQ(line[at - 1], ' ') << line;
    }
  }

  // -o wide adds the message.
  r = Get({"pod", "--root", root_, "-o", "wide"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  lines = GetLines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_EQ(Cells(lines[0]).back(), "MESSAGE");
  EXPECT_THAT(lines[2], HasSubstr("UnexpectedAdmissionError  Allocate failed due to requested "
                                  "number of devices unavailable for nvidia.com/gpu. Requested: "
                                  "7, Available: 5, which is unexpected"));

  // -o json: the old keys and the new ones.
  r = Get({"pods", "--root", root_, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  ASSERT_EQ(j["pods"].size(), 2u) << r.out;
  EXPECT_EQ(j["pods"][0]["name"], "a");
  EXPECT_EQ(j["pods"][0]["status"], "Admitted");
  EXPECT_EQ(j["pods"][0]["containers"][0]["devices"][0]["device_ids"], json(a_gpus_));
  EXPECT_EQ(j["pods"][1]["name"], "b");
  EXPECT_EQ(j["pods"][1]["status"], "Rejected");
  EXPECT_EQ(j["pods"][1]["reason"], "UnexpectedAdmissionError");
  EXPECT_EQ(j["pods"][1]["containers"], json::array());
}

TEST_F(GetAgentE2eTest, GetDevicesShowsEveryDeviceWithHealthAndHolder) {
  StartNodeWithPods();
  GetResult r = Get({"devices", "--root", root_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = GetLines(r.out);
  ASSERT_EQ(lines.size(), 13u) << r.out;  // the header, 4 FPGAs, 8 GPUs
  EXPECT_THAT(Cells(lines[0]), ElementsAre("RESOURCE", "DEVICE", "NUMA", "STATE", "POD/CONTAINER"));
  EXPECT_EQ(r.out.find("not listed"), std::string::npos) << "no footnote: every device is listed";
  for (int i = 0; i < 8; ++i) {
    const std::string id = "GPU" + std::to_string(i);
    const bool held = std::find(a_gpus_.begin(), a_gpus_.end(), id) != a_gpus_.end();
    const std::string state = id == "GPU3" ? "unhealthy" : held ? "allocated" : "free";
    EXPECT_THAT(Cells(lines[5 + i]),
                ElementsAre(kGpu, id, Numa(id), state, held ? "default/a/main" : "-"))
        << r.out;
  }
  EXPECT_THAT(Cells(lines[1]), ElementsAre(kFpga, "fpga-0", "-", "free", "-")) << r.out;

  r = Get({"device", "--root", root_, "-o", "wide"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(Cells(GetLines(r.out)[0]), ElementsAre("RESOURCE", "DEVICE", "NUMA", "STATE",
                                                     "POD/CONTAINER", "HEALTH", "GPU", "MODEL"));
  // No NVML in this agent: no GPU index.
  EXPECT_THAT(Cells(RowStartingWith(r.out, {kGpu, "GPU3"})),
              ElementsAre(kGpu, "GPU3", Numa("GPU3"), "unhealthy", "-", "Unhealthy", "-", "-"));

  r = Get({"devices", "--root", root_, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  int unhealthy = 0;
  for (const auto& d : j["devices"]) {
    if (d["resource"] != kGpu) continue;
    EXPECT_EQ(d["healthy"], d["id"] != "GPU3") << d.dump();
    unhealthy += d["healthy"] == false;
  }
  EXPECT_EQ(unhealthy, 1);

  // One device by id; an unknown one is one line and exit 2.
  r = Get({"device", "GPU3", "--root", root_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(GetLines(r.out).size(), 2u) << r.out;
  r = Get({"device", "GPU99", "--root", root_});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "kdm get devices: device \"GPU99\" not found: no resource of `kdm kubelet "
            "--root " +
                root_ + "` lists it (see `kdm get devices --root " + root_ + "`)\n");
}

TEST_F(GetAgentE2eTest, GetPodNameDescribesOnePod) {
  StartNodeWithPods();
  GetResult r = Get({"pod", "a", "--root", root_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = GetLines(r.out);
  ASSERT_GE(lines.size(), 9u) << r.out;
  EXPECT_EQ(lines[0], "Name:           a");
  EXPECT_EQ(lines[1], "Namespace:      default");
  EXPECT_EQ(lines[2], "Status:         Admitted");
  EXPECT_EQ(lines[3], "Reason:         -");
  EXPECT_EQ(lines[5], "Status file:    " + StatusPath("default_a"));
  EXPECT_THAT(lines[6], ::testing::MatchesRegex("Written:        20[0-9-]+T[0-9:]+Z"));
  EXPECT_EQ(lines[7], "Containers:");
  EXPECT_EQ(lines[8], "  main:");
  EXPECT_THAT(r.out, HasSubstr("    Devices:    nvidia.com/gpu " + a_gpus_[0] + " (NUMA " +
                               Numa(a_gpus_[0]) + ")\n"));
  EXPECT_THAT(r.out, HasSubstr("NVIDIA_VISIBLE_DEVICES="));
  EXPECT_THAT(r.out, HasSubstr("/dev/nvidia"));

  // NAMESPACE/NAME and -n, and the singular's plural; JSON.
  r = Get({"pods", "default/b", "--root", root_, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["status"], "Rejected");
  EXPECT_EQ(j["reason"], "UnexpectedAdmissionError");
  EXPECT_THAT(j["message"].get<std::string>(), HasSubstr("Requested: 7"));
  EXPECT_EQ(j["containers"], json::array());
  r = Get({"pod", "a", "-n", "default", "--root", root_, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = json::parse(r.out);
  EXPECT_EQ(j["containers"][0]["devices"][kGpu], json(a_gpus_));
  EXPECT_EQ(j["containers"][0]["numa_nodes"][kGpu].size(), 2u);

  // Unknown pods, path tricks and huge names: one line naming it, exit 2.
  for (const std::string& name : {std::string("nope"), std::string("../../etc/passwd"),
                                  std::string("ml/a"), std::string(100000, 'x')}) {
    r = Get({"pod", name, "--root", root_});
    EXPECT_EQ(r.exit_code, 2) << name.substr(0, 40);
    EXPECT_EQ(GetLines(r.err).size(), 1u) << r.err;
    EXPECT_THAT(r.err, ::testing::StartsWith("kdm get pod: pod \""));
    EXPECT_THAT(r.err, HasSubstr("not found"));
    EXPECT_LT(r.err.size(), 1000u);
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(GetAgentE2eTest, WatchShowsAPendingPodBeingAdmittedAndEndsOnSigint) {
  StartNodeWithPods();
  const std::string out = root_ + "/watch.out", err = root_ + "/watch.err";
  Process watch({"get", "pods", "--root", root_, "-w"}, out, err);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return !RowStartingWith(ReadFile(out), {"default", "b"}).empty();
      },
      kWaitBound))
      << ReadFile(err);
  // 3 of 4 FPGAs: the plugin holds GetPreferredAllocation until the
  // agent's 3 s deadline, and the pod is pending meanwhile.
  WriteFileAtomically(Manifests() + "/c.yaml", R"(apiVersion: v1
kind: Pod
metadata: {name: c}
spec:
  containers:
  - name: main
    resources: {limits: {example.com/fpga: 3}}
)");
  ASSERT_TRUE(WaitUntil(
      [&] {
        // Active (listed by pod-resources, no devices yet) while admitted.
        return HasRow(ReadFile(out),
                      {"default", "c", "main", "-", "-", "-", "Pending", "Admitting"});
      },
      kWaitBound))
      << ReadFile(out) << ReadFile(err);
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const std::string& line : GetLines(ReadFile(out))) {
          std::vector<std::string> cells = Cells(line);
          if (cells.size() == 8 && cells[1] == "c" && cells[2] == "main" &&
              cells[6] == "Admitted") {
            return true;
          }
        }
        return false;
      },
      kWaitBound))
      << ReadFile(out) << ReadFile(err);
  EXPECT_EQ(ReadFile(out).find("Deleted"), std::string::npos) << "c moved, it was not deleted";
  EXPECT_EQ(WaitPhase("default_c", "Admitted")["phase"], "Admitted");

  watch.Signal(SIGINT);
  std::optional<int> code = watch.Wait();
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << ReadFile(err);
  EXPECT_EQ(ReadFile(err), "");
}

TEST_F(GetAgentE2eTest, BadInputIsOneLineAndExit2) {
  StartKubelet();
  GetResult r = Get({"nodes", "--root", root_});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "kdm get: unknown resource kind \"nodes\" (known: pods, pod, devices, device, "
            "capacity)\n");
  r = Get({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "kdm get: a resource kind is required: pods, devices or capacity\n");
  r = Get({"pods", "--root", root_, "-o", "yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(GetLines(r.err)[0], "kdm get pods: -o must be table, wide or json, not \"yaml\"");
  r = Get({"pod", "x", "--root", root_, "-o", "table\nwide"});
  EXPECT_EQ(r.exit_code, 2);

  // A status file that does not parse is named in a warning; the rest shows.
  { std::ofstream(root_ + "/status/default_junk.json") << "{\"phase\": \"Adm"; }
  WriteFileAtomically(Manifests() + "/ok.yaml", PodYaml("ok", 0));
  WaitPhase("default_ok", "Admitted");
  r = Get({"pods", "--root", root_});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kdm get pods: warning: " + root_ +
                               "/status/default_junk.json: not valid JSON"));
  EXPECT_TRUE(HasRow(r.out, {"default", "ok", "main", "-", "-", "-", "Admitted", "-"})) << r.out;
}

TEST_F(GetAgentE2eTest, StatusFilesEndWithANewline) {
  StartNodeWithPods();
  for (const std::string& file :
       {std::string("node.json"), std::string("default_a.json"), std::string("default_b.json")}) {
    const std::string text = ReadFile(root_ + "/status/" + file);
    ASSERT_FALSE(text.empty()) << file;
    EXPECT_EQ(text.back(), '\n') << file;
  }
}

}  // namespace
}  // namespace kdm
