// Runs the built kdm binary ($KDM_BINARY_DIR/bin/kdm) as a user does:
// `kdm topo`, `kdm topo presets`, `kdm topo show`, human and JSON output, and
// bad input with its exit code (1 runtime error, 2 bad usage) and message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

namespace kdm::topology {
namespace {

using ::testing::HasSubstr;

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

class TopoCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("KDM_BINARY_DIR");
    ASSERT_NE(bin, nullptr) << "KDM_BINARY_DIR is set by ctest";
    kdm_ = std::string(bin) + "/bin/kdm";
    ASSERT_TRUE(std::filesystem::exists(kdm_)) << kdm_;
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("kdm_topo_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `kdm <args>` (args are shell words we control), capturing both streams.
  CliRun Kdm(const std::string& args) {
    const std::string out = (dir_ / "stdout").string();
    const std::string err = (dir_ / "stderr").string();
    const std::string cmd = "'" + kdm_ + "' " + args + " >'" + out + "' 2>'" + err + "'";
    int status = std::system(cmd.c_str());
    CliRun r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = Read(out);
    r.err = Read(err);
    return r;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string Write(const std::string& name, const std::string& content) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << content;
    return path;
  }

  std::string kdm_;
  std::filesystem::path dir_;
};

TEST_F(TopoCliTest, HumanOutputShowsChosenSetBesideFirstFit) {
  CliRun r = Kdm("topo --preset dgx1-v100 --size 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("topology:   preset dgx1-v100 (8 devices)"));
  EXPECT_THAT(r.out, HasSubstr("policy packed"));
  EXPECT_THAT(r.out,
              HasSubstr("chosen:     0,3 (GPU0, GPU3)  score 230, packed score 920 (optimal)"));
  EXPECT_THAT(r.out, HasSubstr("first-fit:  0,1 (GPU0, GPU1)  score 150"));
  EXPECT_EQ(r.err, "");
}

TEST_F(TopoCliTest, JsonOutputHasTheDocumentedKeys) {
  CliRun r = Kdm("topo --preset dgx1-v100 --size 2 --available 1,2,4-7 --must-include GPU4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["chosen"], nlohmann::json({4, 7}));
  EXPECT_EQ(j["ids"], nlohmann::json({"GPU4", "GPU7"}));
  EXPECT_EQ(j["score"], 230);
  EXPECT_EQ(j["packed_score"], 230 + 230 + 230);
  EXPECT_EQ(j["optimal"], true);
  EXPECT_EQ(j["first_fit"]["chosen"], nlohmann::json({1, 4}));
  EXPECT_EQ(j["first_fit"]["score"], 10);
  EXPECT_EQ(j.size(), 6u);
}

TEST_F(TopoCliTest, PoliciesAndTopologyFiles) {
  std::string file = Write("v100.json", RenderTopologyJson(*Preset("dgx1-v100")));
  CliRun best = Kdm("topo --topology '" + file + "' --size 2 --policy best-set --json");
  ASSERT_EQ(best.code, 0) << best.err;
  EXPECT_EQ(nlohmann::json::parse(best.out)["chosen"], nlohmann::json({2, 3}));
  std::string text = Write("v100.txt", RenderNvidiaSmi(*Preset("dgx1-p100")));
  CliRun packed = Kdm("topo --topology '" + text + "' --size 4 --json");
  ASSERT_EQ(packed.code, 0) << packed.err;
  EXPECT_EQ(nlohmann::json::parse(packed.out)["chosen"], nlohmann::json({0, 1, 2, 3}));
  CliRun first = Kdm("topo --preset rtx-4x-bridged --size 2 --policy first-fit --json");
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_EQ(nlohmann::json::parse(first.out)["chosen"], nlohmann::json({0, 1}));
}

TEST_F(TopoCliTest, PresetsAndShow) {
  CliRun list = Kdm("topo presets");
  ASSERT_EQ(list.code, 0) << list.err;
  for (const std::string& name : PresetNames()) EXPECT_THAT(list.out, HasSubstr(name));
  EXPECT_THAT(list.out, HasSubstr("source: "));

  CliRun show = Kdm("topo show --preset dgx1-v100");
  ASSERT_EQ(show.code, 0) << show.err;
  EXPECT_THAT(show.out, HasSubstr("GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS\tSYS\tSYS\t0\n"));
  // What show prints reads back as the same NVLink matrix.
  auto back = ParseTopology(show.out);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->LinkBetween(0, 3).nvlinks, 2);

  CliRun json = Kdm("topo show --preset dgx2-16 --json");
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_EQ(*ParseTopology(json.out), *Preset("dgx2-16"));
}

TEST_F(TopoCliTest, BadInputGivesAClearErrorAndExitCode) {
  struct Case {
    std::string args;
    int code;
    std::string says;
  };
  std::string garbage = Write("garbage.txt", "this is not\na topology\n");
  std::string asym = Write("asym.json", R"({"matrix": [["X", "NV1"], ["NV2", "X"]]})");
  const std::vector<Case> cases = {
      {"topo --topology '" + (dir_ / "missing.txt").string() + "' --size 1", 1,
       "missing.txt' does not exist"},
      {"topo --topology '" + garbage + "' --size 1", 1, "no header line"},
      {"topo --topology '" + asym + "' --size 1", 1,
       "cell [0][1] is 'NV1' but cell [1][0] is 'NV2'"},
      {"topo --preset dgx1-v100 --size 0", 2, "--size must be at least 1, got 0"},
      {"topo --preset dgx1-v100 --size two", 2, "--size 'two' is not a number"},
      {"topo --preset dgx1-v100", 2, "--size N is required"},
      {"topo --preset dgx-9000 --size 1", 2, "unknown preset 'dgx-9000'"},
      {"topo --size 1", 2, "give exactly one of --preset NAME, --topology FILE or --nvml"},
      {"topo --preset dgx1-v100 --topology x --size 1", 2, "give exactly one"},
      {"topo --preset dgx1-v100 --size 1 --policy fastest", 2, "unknown policy 'fastest'"},
      {"topo --preset dgx1-v100 --size 2 --available 0,1 --must-include 5", 1,
       "must-include device 5 ('GPU5') is not in available"},
      {"topo --preset dgx1-v100 --size 3 --available 0,1", 1, "size 3 is above the 2 available"},
      {"topo --preset dgx1-v100 --size 1 --available 0,9", 1, "device index 9 is outside"},
      {"topo --preset dgx1-v100 --size 1 --available 0,,1", 2, "has an empty element"},
      {"topo --preset dgx1-v100 --size 1 --available GPU-x", 1, "device id 'GPU-x' is not in"},
      {"topo --preset dgx1-v100 --size 1 --available 5-2", 2, "'5-2' is not a range"},
      {"topo show", 2, "give exactly one"},
      {"topo show --preset nope", 2, "unknown preset 'nope'"},
  };
  for (const Case& c : cases) {
    CliRun r = Kdm(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << c.args;
    EXPECT_THAT(r.err, HasSubstr("kdm topo: ")) << c.args;
    EXPECT_EQ(r.out, "") << c.args;
  }
}

// Flags CLI11 rejects (main.cc maps every usage error to exit 2).
TEST_F(TopoCliTest, UnknownFlagOrMissingValueIsBadUsage) {
  CliRun unknown = Kdm("topo --preset dgx1-v100 --size 1 --fastest");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("--fastest"));
  CliRun no_value = Kdm("topo --preset dgx1-v100 --size");
  EXPECT_EQ(no_value.code, 2);
  EXPECT_THAT(no_value.err, HasSubstr("--size"));
}

}  // namespace
}  // namespace kdm::topology
