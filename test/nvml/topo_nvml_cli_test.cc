// `kdm topo --nvml` end to end: the built kdm binary, the fake
// libnvidia-ml.so.1 (KDM_FAKE_NVML_NODE) and a fake sysfs tree.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "fake_nvml/fake_sysfs.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"
#include "nvml_test_util.h"

namespace kdm::nvml {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

class TopoNvmlCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("KDM_BINARY_DIR");
    ASSERT_NE(bin, nullptr) << "KDM_BINARY_DIR is set by ctest";
    kdm_ = std::string(bin) + "/bin/kdm";
    sysfs_ = dir_.path() + "/sys";
  }

  // Runs `kdm <args>` with the fake reading `node` (shell words we control).
  CliRun Kdm(const std::string& node, const std::string& args) {
    const std::string out = dir_.path() + "/stdout";
    const std::string err = dir_.path() + "/stderr";
    const std::string cmd = "env KDM_FAKE_NVML_NODE='" + node + "' '" + kdm_ + "' " + args + " >'" +
                            out + "' 2>'" + err + "'";
    int status = std::system(cmd.c_str());
    CliRun r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Read(out);
    r.err = Read(err);
    return r;
  }
  // `kdm topo --nvml --nvml-library <fake> --sysfs-root <sysfs> <args>` on a
  // preset's node description.
  CliRun Topo(const std::string& preset, const std::string& args) {
    const std::string node = Node(preset);
    EXPECT_EQ(test::WriteFakeSysfs(node, sysfs_), "");
    return Kdm(node, "topo --nvml --nvml-library '" + std::string(test::kFakeLibrary) +
                         "' --sysfs-root '" + sysfs_ + "' " + args);
  }
  static std::string Node(const std::string& preset) {
    return std::string(test::kNodesDir) + "/" + preset + ".json";
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // The GPUs of a node description.
  static nlohmann::json Gpus(const std::string& preset) {
    std::ifstream in(Node(preset));
    return nlohmann::json::parse(in)["gpus"];
  }

  test::TempDir dir_;
  std::string kdm_;
  std::string sysfs_;
};

TEST_F(TopoNvmlCliTest, PrintsTheMatrixWithAffinitiesThenTheAttributes) {
  CliRun r = Topo("dgx-a100", "");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out, StartsWith("\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU "
                                "Affinity\tNUMA Affinity\n"
                                "GPU0\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t0-63,"
                                "128-191\t0\n"));
  EXPECT_THAT(r.out, HasSubstr("GPU7\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X "
                               "\t64-127,192-255\t1\n"));
  EXPECT_THAT(r.out, HasSubstr("\nDriver 550.54.15, CUDA 12.4\n"));
  const nlohmann::json gpus = Gpus("dgx-a100");
  EXPECT_THAT(r.out, HasSubstr("GPU7\t" + gpus[7]["uuid"].get<std::string>() +
                               "\tmodel=\"NVIDIA A100-SXM4-80GB\" memory_mib=81920 arch=8.0 "
                               "brand=nvidia driver=550.54.15 cuda=12.4 minor=7 "
                               "pci_bus_id=00000000:BD:00.0 numa=1\n"));
  // The matrix part reads back as nvidia-smi text.
  auto t = topology::ParseNvidiaSmiTopo(r.out.substr(0, r.out.find("\nDriver")));
  ASSERT_TRUE(t.ok()) << t.status();
  auto preset = topology::Preset("dgx-a100");
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t->Device(i).numa, preset->Device(i).numa);
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(t->LinkBetween(i, j).nvlinks, preset->LinkBetween(i, j).nvlinks);
    }
  }
}

TEST_F(TopoNvmlCliTest, PcieOnlyAndBridgedNodesPrintTheirRelations) {
  CliRun r = Topo("pcie-8gpu", "");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU0\t X \tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t0-31\t0\n"));
  r = Topo("rtx-4x-bridged", "");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU0\t X \tNODE\tSYS\tNV2\t0-15\t0\n"));
  EXPECT_THAT(r.out, HasSubstr("brand=quadrortx"));
}

TEST_F(TopoNvmlCliTest, JsonHoldsTheTopologyAndTheAttributes) {
  CliRun r = Topo("hgx-h100", "--json");
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << r.out;
  auto t = topology::ParseTopologyJson(doc["topology"].dump());
  ASSERT_TRUE(t.ok()) << t.status();
  auto preset = topology::Preset("hgx-h100");
  const nlohmann::json gpus = Gpus("hgx-h100");
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t->Device(i).id, gpus[i]["uuid"]);
    EXPECT_EQ(t->Device(i).numa, preset->Device(i).numa);
    for (int j = 0; j < 8; ++j) EXPECT_EQ(t->LinkBetween(i, j), preset->LinkBetween(i, j));
  }
  EXPECT_EQ(doc["driver_version"], "550.54.15");
  EXPECT_EQ(doc["cuda_driver_version"], "12.4");
  ASSERT_EQ(doc["gpus"].size(), 8u);
  EXPECT_EQ(doc["gpus"][3]["uuid"], gpus[3]["uuid"]);
  EXPECT_EQ(doc["gpus"][3]["pci_bus_id"], "00000000:5D:00.0");
  EXPECT_EQ(doc["gpus"][3]["numa"], 0);
  EXPECT_EQ(doc["gpus"][3]["cpu_affinity"], "0-55,112-167");
  EXPECT_EQ(doc["gpus"][3]["attributes"], nlohmann::json({{"model", "NVIDIA H100 80GB HBM3"},
                                                          {"memory_mib", 81559},
                                                          {"driver", "550.54.15"},
                                                          {"cuda", "12.4"},
                                                          {"arch", "9.0"},
                                                          {"brand", "nvidia"}}));
  EXPECT_EQ(doc["ignored_links"], nlohmann::json::array());
}

TEST_F(TopoNvmlCliTest, SizeAnswersAsThePresetDoesWithUuids) {
  for (const std::string preset : {"dgx1-v100", "rtx-4x-bridged", "dgx2-16"}) {
    const nlohmann::json gpus = Gpus(preset);
    CliRun nvml = Topo(preset, "--size 2 --json");
    ASSERT_EQ(nvml.code, 0) << nvml.err;
    CliRun want = Kdm(Node(preset), "topo --preset " + preset + " --size 2 --json");
    ASSERT_EQ(want.code, 0) << want.err;
    nlohmann::json a = nlohmann::json::parse(nvml.out);
    nlohmann::json b = nlohmann::json::parse(want.out);
    EXPECT_EQ(a["chosen"], b["chosen"]) << preset;
    EXPECT_EQ(a["score"], b["score"]) << preset;
    ASSERT_EQ(a["ids"].size(), 2u);
    EXPECT_EQ(a["ids"][0], gpus[a["chosen"][0].get<int>()]["uuid"]) << preset;
  }
}

TEST_F(TopoNvmlCliTest, SizeTakesUuidsForAvailableAndMustInclude) {
  const nlohmann::json gpus = Gpus("dgx1-v100");
  const std::string gpu4 = gpus[4]["uuid"];
  CliRun r = Topo("dgx1-v100", "--size 2 --available 1,2,4-7 --must-include " + gpu4 + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  CliRun want = Kdm(Node("dgx1-v100"),
                    "topo --preset dgx1-v100 --size 2 --available 1,2,4-7 --must-include GPU4 "
                    "--json");
  nlohmann::json a = nlohmann::json::parse(r.out);
  EXPECT_EQ(a["chosen"], nlohmann::json::parse(want.out)["chosen"]);
  EXPECT_EQ(a["ids"][0], gpu4);
  r = Topo("dgx1-v100", "--size 2 --must-include GPU-not-here");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("--must-include: device id 'GPU-not-here' is not in the topology"));
  r = Topo("dgx1-v100", "--size 99");
  EXPECT_EQ(r.code, 1) << r.err;
}

TEST_F(TopoNvmlCliTest, MissingLibraryIsExitTwoWithOneLine) {
  CliRun r = Kdm(Node("dgx-a100"), "topo --nvml --nvml-library /nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, StartsWith("NVML not found: /nonexistent/libnvidia-ml.so.1: "));
  EXPECT_THAT(r.err, EndsWith("; is the NVIDIA driver installed?\n"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = Kdm(Node("dgx-a100"), "topo --nvml --size 2 --nvml-library /nonexistent/lib.so");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, StartsWith("NVML not found: "));
}

TEST_F(TopoNvmlCliTest, MissingFunctionAndInitFailureAreRuntimeErrors) {
  CliRun r = Kdm(Node("dgx-a100"), "topo --nvml --nvml-library '" +
                                       std::string(KDM_NVML_MISSING_SYMBOL_LIBRARY) + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("lacks nvmlShutdown"));
  std::string node = dir_.Write("init.json", test::TwoGpuNode(R"( "fail": {"init": 9},)"));
  r = Kdm(node, "topo --nvml --nvml-library '" + std::string(test::kFakeLibrary) + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "kdm topo: nvmlInit_v2: Driver Not Loaded (NVML error 9)\n");
}

TEST_F(TopoNvmlCliTest, CudaFallbackAndDiscoveryErrors) {
  std::string lib = " --nvml-library '" + std::string(test::kFakeLibrary) + "'";
  std::string node = dir_.Write("cuda.json", test::TwoGpuNode(R"( "fail": {"cuda_v2": 12},)"));
  CliRun r = Kdm(node, "topo --nvml" + lib);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Driver 550.54.15, CUDA 12.4\n"));
  node = dir_.Write("pci.json", test::TwoGpuNode("", R"(, "fail": {"pci": 15})"));
  r = Kdm(node, "topo --nvml" + lib);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "kdm topo: nvmlDeviceGetPciInfo_v3(GPU 0 \"GPU-aaaa\"): GPU is lost (NVML error 15)\n");
  node = dir_.Write("state.json", test::TwoGpuNode("", R"(, "fail": {"nvlink_state": 4})"));
  r = Kdm(node, "topo --nvml" + lib);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "kdm topo: GPU \"GPU-aaaa\" link 0: nvmlDeviceGetNvLinkState answered 4\n");
}

TEST_F(TopoNvmlCliTest, ALinkToAHiddenGpuIsAWarning) {
  std::string lib = " --nvml-library '" + std::string(test::kFakeLibrary) + "'";
  std::string node =
      dir_.Write("hidden.json", test::TwoGpuNode("", R"(, "nvlinks": [{"gpu": 1, "count": 2},
                                            {"remote_bus_id": "0000:99:00.0", "count": 1}])"));
  // TwoGpuNode already gives GPU 0 an "nvlinks" key; the second one wins in
  // nlohmann's parser, so this node's GPU 0 has the list above.
  CliRun r = Kdm(node, "topo --nvml" + lib);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(
      r.err,
      "kdm topo: warning: GPU \"GPU-aaaa\" link 2: remote bus id \"00000000:99:00.0\" matches "
      "no GPU\n");
  EXPECT_THAT(r.out, HasSubstr("GPU0\t X \tNV2\t"));
}

TEST_F(TopoNvmlCliTest, BadNodeDescriptionsAreClearErrors) {
  std::string lib = " --nvml-library '" + std::string(test::kFakeLibrary) + "'";
  std::string full = test::TwoGpuNode();
  const std::pair<std::string, std::string> cases[] = {
      {"garbage", "\x7f\x45LF garbage"},
      {"truncated", full.substr(0, full.size() - 20)},
      {"wrong-type", R"({"driver_version": "1", "cuda_driver_version": [], "gpus": []})"},
      {"huge", R"({"driver_version": "1", "cuda_driver_version": 1, "gpus": [{"uuid": "G",
        "name": "n", "minor": 0, "memory_mib": 1e400, "pci_bus_id": "01:00.0",
        "compute_capability": "1.0"}]})"},
  };
  for (const auto& [name, text] : cases) {
    std::string node = dir_.Write(name + ".json", text);
    CliRun r = Kdm(node, "topo --nvml" + lib);
    EXPECT_EQ(r.code, 1) << name << ": " << r.err;
    EXPECT_THAT(r.err, StartsWith("kdm topo: nvmlInit_v2: fake NVML: " + node + ": ")) << name;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << name << ": " << r.err;
  }
  CliRun r = Kdm(dir_.path() + "/absent.json", "topo --nvml" + lib);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot open " + dir_.path() + "/absent.json"));
  r = Kdm(dir_.path(), "topo --nvml" + lib);  // a directory
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("fake NVML: " + dir_.path()));
}

TEST_F(TopoNvmlCliTest, FlagMisuseIsExitTwo) {
  const std::pair<std::string, std::string> cases[] = {
      {"topo --nvml --preset dgx-a100",
       "give exactly one of --preset NAME, --topology FILE or "
       "--nvml"},
      {"topo --nvml --topology x --size 1", "give exactly one of"},
      {"topo --preset dgx-a100 --size 1 --sysfs-root /sys", "--sysfs-root need --nvml"},
      {"topo --preset dgx-a100 --size 1 --nvml-library x", "--nvml-library and --sysfs-root"},
      {"topo --nvml --size zero", "--size 'zero' is not a number"},
  };
  for (const auto& [args, message] : cases) {
    CliRun r = Kdm(Node("dgx-a100"), args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
  }
}

TEST_F(TopoNvmlCliTest, MissingSysfsMeansUnknownNumaNotAnError) {
  const std::string node = Node("dgx-a100");
  CliRun r = Kdm(node, "topo --nvml --nvml-library '" + std::string(test::kFakeLibrary) +
                           "' --sysfs-root '" + dir_.path() + "/../../nowhere'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPU0\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tN/A\tN/A\n"));
}

}  // namespace
}  // namespace kdm::nvml
