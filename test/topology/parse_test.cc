#include "kdm/topology/parse.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kdm/topology/presets.h"

namespace kdm::topology {
namespace {

using ::testing::HasSubstr;

// A current driver's layout: NIC rows and columns, three affinity columns,
// tabs, a legend and a NIC legend.
constexpr char kA100WithNics[] =
    "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV4\tNV4\tNV4\tPXB\tSYS\t0-31\t0\t\tN/A\n"
    "GPU1\tNV4\t X \tNV4\tNV4\tPXB\tSYS\t0-31\t0\t\tN/A\n"
    "GPU2\tNV4\tNV4\t X \tNV4\tSYS\tPXB\t32-63\t1\t\tN/A\n"
    "GPU3\tNV4\tNV4\tNV4\t X \tSYS\tPXB\t32-63\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tSYS\tSYS\t X \tSYS\t\t\t\t\n"
    "NIC1\tSYS\tSYS\tPXB\tPXB\tSYS\t X \t\t\t\t\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = PCIe and the SMP link between NUMA nodes\n"
    "  NV#  = a bonded set of # NVLinks\n"
    "\n"
    "NIC Legend:\n"
    "\n"
    "  NIC0: mlx5_0\n"
    "  NIC1: mlx5_1\n";

// An old driver's layout: spaces, SOC for SYS, no NUMA column.
constexpr char kOldPascal[] =
    "        GPU0    GPU1    GPU2    GPU3    CPU Affinity\n"
    "GPU0     X      PIX     SOC     SOC     0-11\n"
    "GPU1    PIX      X      SOC     SOC     0-11\n"
    "GPU2    SOC     SOC      X      PHB     12-23\n"
    "GPU3    SOC     SOC     PHB      X      12-23\n"
    "\n"
    "Legend:\n"
    "  X   = Self\n";

// DGX-1 V100 as its driver prints it, with mlx5 columns named directly.
constexpr char kDgx1V100[] =
    "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tmlx5_0\tmlx5_2\tCPU Affinity\n"
    "GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS\tSYS\tSYS\tPIX\tSYS\t0-19,40-59\n"
    "GPU1\tNV1\t X \tNV2\tNV1\tSYS\tNV2\tSYS\tSYS\tPIX\tSYS\t0-19,40-59\n"
    "GPU2\tNV1\tNV2\t X \tNV2\tSYS\tSYS\tNV1\tSYS\tPHB\tSYS\t0-19,40-59\n"
    "GPU3\tNV2\tNV1\tNV2\t X \tSYS\tSYS\tSYS\tNV1\tPHB\tSYS\t0-19,40-59\n"
    "GPU4\tNV2\tSYS\tSYS\tSYS\t X \tNV1\tNV1\tNV2\tSYS\tPIX\t20-39,60-79\n"
    "GPU5\tSYS\tNV2\tSYS\tSYS\tNV1\t X \tNV2\tNV1\tSYS\tPIX\t20-39,60-79\n"
    "GPU6\tSYS\tSYS\tNV1\tSYS\tNV1\tNV2\t X \tNV2\tSYS\tPHB\t20-39,60-79\n"
    "GPU7\tSYS\tSYS\tSYS\tNV1\tNV2\tNV1\tNV2\t X \tSYS\tPHB\t20-39,60-79\n"
    "mlx5_0\tPIX\tPIX\tPHB\tPHB\tSYS\tSYS\tSYS\tSYS\t X \tSYS\t\n"
    "mlx5_2\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tPHB\tPHB\tSYS\t X \t\n";

TEST(ParseNvidiaSmiTest, CurrentLayoutWithNicsAndNuma) {
  auto t = ParseNvidiaSmiTopo(kA100WithNics);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 4);  // NICs are not GPUs
  EXPECT_EQ(t->Device(0).id, "GPU0");
  EXPECT_EQ(t->Device(0).numa, 0);
  EXPECT_EQ(t->Device(3).numa, 1);
  EXPECT_EQ(t->LinkBetween(1, 2), (Link{4, PcieLink::kNone}));
  EXPECT_EQ(t->PairScore(0, 3), 400);
}

TEST(ParseNvidiaSmiTest, OldLayoutWithSocAndNoNuma) {
  auto t = ParseTopology(kOldPascal);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 4);
  EXPECT_EQ(t->LinkBetween(0, 2), (Link{0, PcieLink::kSys}));
  EXPECT_EQ(t->LinkBetween(2, 3), (Link{0, PcieLink::kPhb}));
  EXPECT_EQ(t->Device(1).numa, std::nullopt);
}

TEST(ParseNvidiaSmiTest, Dgx1V100MatchesThePresetLinks) {
  auto t = ParseNvidiaSmiTopo(kDgx1V100);
  ASSERT_TRUE(t.ok()) << t.status();
  Topology preset = *Preset("dgx1-v100");
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(t->LinkBetween(i, j).nvlinks, preset.LinkBetween(i, j).nvlinks);
    }
  }
}

TEST(ParseNvidiaSmiTest, ToleratesSpacesTabsCarriageReturnsAndPreamble) {
  auto t = ParseNvidiaSmiTopo(
      "$ nvidia-smi topo -m\r\n"
      "  \t GPU0 \t\t GPU1   NUMA Affinity\r\n"
      "GPU0    X  \t NV18    3\r\n"
      "\r\n"
      "GPU1 NV18   X   \t 3   \r\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->LinkBetween(0, 1).nvlinks, 18);
  EXPECT_EQ(t->Device(1).numa, 3);
}

TEST(ParseNvidiaSmiTest, BadInputNamesTheRowAndColumn) {
  struct Case {
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", "no header line"},
      {"hello world\nthis is not a topology\n", "no header line"},
      {"\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNVX\t X \n",
       "line 2 (row GPU0), column GPU1: unknown cell 'NVX'"},
      {"\tGPU0\tGPU1\nGPU0\t X \tNV0\nGPU1\tNV0\t X \n", "unknown cell 'NV0'"},
      {"\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV2\t X \n",
       "row GPU0, column GPU1 is 'NV1' but row GPU1, column GPU0 is 'NV2'"},
      {"\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\tPIX\n",
       "row GPU1, column GPU1 is on the diagonal and must be 'X'"},
      {"\tGPU0\tGPU1\nGPU0\t X \tX\nGPU1\tX\t X \n",
       "row GPU0, column GPU1 is 'X' off the diagonal"},
      {"\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tSYS\nGPU1\tPIX\t X \n",
       "line 3 (row GPU1): 2 cells, expected 3"},
      {"\tGPU0\tGPU1\nGPU0\t X \tPIX\n", "column GPU1 has no row"},
      {"\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU0\t X \tPIX\nGPU1\tPIX\t X \n", "row appears twice"},
      {"\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU7\tPIX\t X \n",
       "row 'GPU7' is not a column of the header"},
      {"\tGPU0\tGPU0\nGPU0\t X \tPIX\n", "column GPU0 appears twice"},
  };
  for (const Case& c : cases) {
    auto t = ParseNvidiaSmiTopo(c.text);
    ASSERT_FALSE(t.ok()) << c.says;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(c.says));
    EXPECT_THAT(t.status().message(), HasSubstr("nvidia-smi topo"));
  }
}

TEST(ParseJsonTest, DevicesMatrixAndPcieBeneathNvlinks) {
  auto t = ParseTopology(R"({
    "devices": [{"id": "GPU-a", "numa": 0}, {"id": "GPU-b", "numa": null}, {"id": "GPU-c"}],
    "matrix": [["X", "NV2", "SYS"], ["NV2", "X", "PIX"], ["SYS", "PIX", "X"]],
    "pcie":   [["X", "PXB", "SYS"], ["PXB", "X", "-"], ["SYS", "-", "X"]]
  })");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Device(0).id, "GPU-a");
  EXPECT_EQ(t->Device(0).numa, 0);
  EXPECT_EQ(t->Device(1).numa, std::nullopt);
  EXPECT_EQ(t->LinkBetween(0, 1), (Link{2, PcieLink::kPxb}));
  EXPECT_EQ(t->PairScore(0, 1), 240);
  EXPECT_EQ(t->LinkBetween(1, 2), (Link{0, PcieLink::kPix}));
  EXPECT_EQ(t->IndexOf("GPU-c"), 2);
}

TEST(ParseJsonTest, WithoutDevicesIdsAreIndices) {
  auto t = ParseTopologyJson(R"({"matrix": [["X", "-"], ["-", "X"]]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Device(1).id, "1");
  EXPECT_EQ(t->PairScore(0, 1), 0);
}

TEST(ParseJsonTest, BadInputNamesThePath) {
  struct Case {
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"{", "parse error"},
      {"{\"matrix\": [[\"X\"]]} trailing", "parse error"},
      {"[1, 2]", "top level must be an object"},
      {R"({"matrix": [["X"]], "pcei": []})", "unknown key 'pcei'"},
      {R"({"devices": []})", "missing key 'matrix'"},
      {R"({"matrix": []})", "matrix is empty"},
      {R"({"matrix": "X"})", "matrix must be an array"},
      {R"({"matrix": [["X", "PIX"], ["PIX"]]})", "matrix[1] has 1 cells, expected 2"},
      {R"({"matrix": [["X", "PIX"], "PIX"]})", "matrix[1] must be an array"},
      {R"({"matrix": [["X", 3], ["PIX", "X"]]})", "matrix[0][1] must be a string"},
      {R"({"matrix": [["X", "FAST"], ["FAST", "X"]]})", "matrix[0][1]: unknown cell 'FAST'"},
      {R"({"matrix": [["X", "NV1"], ["NV2", "X"]]})",
       "cell [0][1] is 'NV1' but cell [1][0] is 'NV2'"},
      {R"({"matrix": [["PIX", "PIX"], ["PIX", "X"]]})", "cell [0][0] is on the diagonal"},
      {R"({"devices": [{"id": "a"}], "matrix": [["X", "PIX"], ["PIX", "X"]]})",
       "devices has 1 entries but matrix has 2 rows"},
      {R"({"devices": [{"id": "a"}, {"id": "a"}], "matrix": [["X", "PIX"], ["PIX", "X"]]})",
       "duplicate device id 'a'"},
      {R"({"devices": [{"id": "a"}, {"numa": 1}], "matrix": [["X", "PIX"], ["PIX", "X"]]})",
       "devices[1].id is missing or empty"},
      {R"({"devices": [{"id": "a", "numa": -1}, {"id": "b"}], "matrix": [["X", "-"], ["-", "X"]]})",
       "devices[0].numa must be a non-negative integer"},
      {R"({"devices": [{"id": "a", "uuid": 1}, {"id": "b"}], "matrix": [["X", "-"], ["-", "X"]]})",
       "devices[0]: unknown key 'uuid'"},
      {R"({"matrix": [["X", "NV1"], ["NV1", "X"]], "pcie": [["X", "NV1"], ["NV1", "X"]]})",
       "pcie[0][1]: unknown cell 'NV1'"},
      {R"({"matrix": [["X", "PIX"], ["PIX", "X"]], "pcie": [["X", "SYS"], ["SYS", "X"]]})",
       "pcie[0][1] is 'SYS' but matrix[0][1] is 'PIX'"},
      {R"({"matrix": [["X", "NV1"], ["NV1", "X"]], "pcie": [["X", "PIX"], ["SYS", "X"]]})",
       "cell [0][1] is 'NV1' but cell [1][0] is 'NV1'"},
      {R"({"matrix": [["X", "NV1"], ["NV1", "X"]], "pcie": [["X", "PIX"]]})",
       "pcie has 1 rows, expected 2"},
  };
  for (const Case& c : cases) {
    auto t = ParseTopology(c.text);
    ASSERT_FALSE(t.ok()) << c.says;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status();
    EXPECT_THAT(t.status().message(), HasSubstr(c.says));
    EXPECT_THAT(t.status().message(), HasSubstr("topology JSON"));
  }
}

TEST(RenderTest, EveryPresetRoundTripsThroughTextAndJson) {
  for (const std::string& name : PresetNames()) {
    Topology t = *Preset(name);
    auto json = ParseTopology(RenderTopologyJson(t));
    ASSERT_TRUE(json.ok()) << name << ": " << json.status();
    EXPECT_EQ(*json, t) << name;

    const std::string text = RenderNvidiaSmi(t);
    auto back = ParseTopology(text);
    ASSERT_TRUE(back.ok()) << name << ": " << back.status() << "\n" << text;
    ASSERT_EQ(back->size(), t.size());
    for (int i = 0; i < t.size(); ++i) {
      EXPECT_EQ(back->Device(i), t.Device(i));
      for (int j = 0; j < t.size(); ++j) {
        const Link& l = t.LinkBetween(i, j);
        // The text shows only the NVLinks of a pair that has them.
        Link want = l.nvlinks > 0 ? Link{l.nvlinks, PcieLink::kNone} : l;
        EXPECT_EQ(back->LinkBetween(i, j), want) << name << " " << i << "," << j;
      }
    }
  }
}

TEST(RenderTest, LooksLikeNvidiaSmi) {
  const std::string text = RenderNvidiaSmi(*Preset("rtx-4x-bridged"));
  EXPECT_THAT(text, HasSubstr("\tGPU0\tGPU1\tGPU2\tGPU3\tNUMA Affinity\n"));
  EXPECT_THAT(text, HasSubstr("GPU0\t X \tNODE\tSYS\tNV2\t0\n"));
  EXPECT_THAT(text, HasSubstr("Legend:"));
}

TEST(RenderTest, CpuAffinityColumnBeforeNumaAndReadBack) {
  Topology t = *Preset("rtx-4x-bridged");
  const std::string text = RenderNvidiaSmi(t, {"0-15", "0-15", "", "16-31,48-63"});
  EXPECT_THAT(text, HasSubstr("\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\n"));
  EXPECT_THAT(text, HasSubstr("GPU0\t X \tNODE\tSYS\tNV2\t0-15\t0\n"));
  EXPECT_THAT(text, HasSubstr("GPU2\tSYS\tNV2\t X \tNODE\tN/A\t1\n"));
  auto back = ParseTopology(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  for (int i = 0; i < t.size(); ++i) EXPECT_EQ(back->Device(i), t.Device(i));
}

class LoadFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("kdm_topo_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(LoadFileTest, ReadsTextAndJson) {
  auto text = LoadTopologyFile(Write("a.txt", kOldPascal));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->size(), 4);
  auto json = LoadTopologyFile(Write("b.json", RenderTopologyJson(*Preset("dgx2-16"))));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json, *Preset("dgx2-16"));
}

TEST_F(LoadFileTest, BadFilesGiveClearErrors) {
  auto missing = LoadTopologyFile((dir_ / "nope.txt").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.txt' does not exist"));

  auto directory = LoadTopologyFile(dir_.string());
  ASSERT_FALSE(directory.ok());
  EXPECT_THAT(directory.status().message(), HasSubstr("is not a regular file"));

  std::string huge = Write("huge.txt", "");
  std::filesystem::resize_file(huge, kMaxTopologyFileBytes + 1);
  auto big = LoadTopologyFile(huge);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(big.status().message(), HasSubstr("above the limit of 4194304"));

  auto garbage = LoadTopologyFile(Write("garbage.bin", std::string("\x00\x01\xff{{", 5)));
  ASSERT_FALSE(garbage.ok());
  EXPECT_THAT(garbage.status().message(), HasSubstr("garbage.bin'"));
  EXPECT_THAT(garbage.status().message(), HasSubstr("no header line"));

  auto truncated =
      LoadTopologyFile(Write("cut.json", RenderTopologyJson(*Preset("dgx1-v100")).substr(0, 200)));
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(), HasSubstr("parse error"));
}

// Found with the fuzz finding PodManifestRegression.JsonTextAfterNulByteIgnored
// (fuzz/regressions/topology_json/text-after-nul-byte-ignored): nlohmann's
// parser stops at a NUL byte, so `{"matrix": [["X"]]}<NUL>anything` was a
// valid topology file.
TEST(TopologyJsonRegression, TextAfterNulByteIgnored) {
  const std::string text("{\"matrix\": [[\"X\"]]}\0{garbage", 26);
  auto t = ParseTopologyJson(text);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("NUL byte at offset 19"), std::string::npos) << t.status();
  EXPECT_FALSE(ParseTopology(text).ok());
  EXPECT_TRUE(ParseTopologyJson(text.substr(0, 19)).ok());
}

}  // namespace
}  // namespace kdm::topology
