// `kdm conform` end to end: the built binary against `kdm plugin` processes
// (healthy, and broken with --fault), its exit codes, its report lines and
// its JUnit file. Every wait is bounded; nothing asserts on time.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "kdm/test/e2e/e2e_util.h"

extern char** environ;

namespace kdm {
namespace {

namespace fs = std::filesystem;
using kdm::e2e::KdmBinary;
using kdm::e2e::Process;
using kdm::e2e::ReadFile;
using kdm::e2e::WaitUntil;
using ::testing::HasSubstr;

constexpr char kConformFpga[] = "example.com/fpga";

size_t CountOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

class ConformE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-cf-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    plugin_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  void StartPlugin(std::vector<std::string> extra) {
    std::vector<std::string> args = {"plugin",     "--root",  root_, "--resource",
                                     kConformFpga, "--count", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    plugin_ = std::make_unique<Process>(args, root_ + "/plugin.out", root_ + "/plugin.err");
    ASSERT_TRUE(plugin_->started());
  }

  // Runs `kdm conform` to completion; returns its exit code (-1: it hung).
  int Conform(const std::vector<std::string>& args, std::string* out, std::string* err) {
    std::vector<std::string> all = {"conform"};
    all.insert(all.end(), args.begin(), args.end());
    Process p(all, root_ + "/conform.out", root_ + "/conform.err");
    if (!p.started()) return -1;
    std::optional<int> code = p.Wait();
    *out = p.Out();
    *err = p.Err();
    return code.value_or(-1);
  }

  std::string root_;
  std::unique_ptr<Process> plugin_;
};

// docs/conformance.md's trigger for `kdm plugin --health-file FILE`: the
// device, as JSON, into the file.
std::string HealthFileTrigger(const std::string& file) {
  return "printf '{\"%s\":\"Unhealthy\"}' \"$KDM_DEVICE_ID\" > '" + file + "'; :";
}

TEST_F(ConformE2eTest, HealthyPluginPassesWithJUnit) {
  const std::string health = root_ + "/health.json";
  StartPlugin({"--cdi", "--pre-start", "--health-file", health});
  std::string out, err, junit = root_ + "/junit.xml";
  int code = Conform({"--root", root_, "--resource", kConformFpga, "--timeout", "10s", "--junit",
                      junit, "--health-trigger", HealthFileTrigger(health)},
                     &out, &err);
  EXPECT_EQ(code, 0) << out << err;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"((^|\n)\d+ passed, 0 failed, \d+ skipped\n$)")))
      << out;
  EXPECT_THAT(out, HasSubstr("27 passed, 0 failed, 0 skipped"));
  EXPECT_TRUE(std::regex_search(out, std::regex(R"((^|\n)PASS  reg\.version +version)"))) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"((^|\n)PASS  health\.reconnect +2 of 2 health changes reached)")))
      << out;
  std::string xml = ReadFile(junit);
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"kdm-conform\""));
  EXPECT_EQ(CountOf(xml, "<testcase "), 27u) << xml;
  EXPECT_EQ(CountOf(xml, "<failure "), 0u) << xml;
  EXPECT_THAT(xml, HasSubstr("</testsuite>"));
}

TEST_F(ConformE2eTest, BadPermissionsFaultFailsThatCheck) {
  StartPlugin({"--fault", "alloc-bad-permissions"});
  std::string out, err, junit = root_ + "/junit.xml";
  int code =
      Conform({"--root", root_, "--resource", kConformFpga, "--timeout", "5s", "--junit", junit},
              &out, &err);
  EXPECT_EQ(code, 1) << out << err;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"((^|\n)FAIL  alloc\.permissions +.*rwx)")))
      << out;
  EXPECT_THAT(out, HasSubstr(" passed, 1 failed, "));
  std::string xml = ReadFile(junit);
  EXPECT_EQ(CountOf(xml, "<testcase "), 27u) << xml;
  EXPECT_EQ(CountOf(xml, "<failure "), 1u) << xml;
  EXPECT_THAT(xml, HasSubstr("name=\"alloc.permissions\""));
}

// NVIDIA's v0.13 stale streams, as `kdm plugin --fault health-stale-streams`:
// the change on the open stream arrives, the ones after 3 cancelled streams
// are lost, and conform says so.
TEST_F(ConformE2eTest, StaleStreamsFaultFailsHealthReconnectOnly) {
  const std::string health = root_ + "/health.json";
  StartPlugin({"--fault", "health-stale-streams", "--health-file", health});
  std::string out, err;
  int code = Conform({"--root", root_, "--resource", kConformFpga, "--timeout", "2s", "--only",
                      "health.trigger,lw.stream-drop,health.reconnect", "--health-trigger",
                      HealthFileTrigger(health)},
                     &out, &err);
  EXPECT_EQ(code, 1) << out << err;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"((^|\n)PASS  health\.trigger )"))) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"((^|\n)FAIL  health\.reconnect +0 of 2 health changes reached the )"
                      R"(stream opened after 3 cancelled streams)")))
      << out;
  EXPECT_THAT(out, HasSubstr("2 passed, 1 failed, 0 skipped"));
}

// Bad --health-trigger values are usage errors naming the flag.
TEST_F(ConformE2eTest, BadHealthTriggersAreUsageErrors) {
  for (const std::string& bad : {std::string(""), std::string("  "), std::string(5000, 'x')}) {
    std::string out, err;
    int code =
        Conform({"--root", root_, "--resource", kConformFpga, "--health-trigger", bad}, &out, &err);
    EXPECT_EQ(code, 2) << bad.size() << ": " << err;
    EXPECT_THAT(err, HasSubstr("--health-trigger")) << err;
    EXPECT_TRUE(out.empty()) << out;
  }
}

TEST_F(ConformE2eTest, OnlyAndAnUnwritableJUnitPath) {
  StartPlugin({});
  std::string out, err;
  std::string junit = root_ + "/no-such-dir/junit.xml";
  int code = Conform({"--root", root_, "--resource", kConformFpga, "--only",
                      "lw.health,alloc.paths", "--junit", junit},
                     &out, &err);
  EXPECT_EQ(code, 3) << out << err;
  EXPECT_THAT(out, HasSubstr("2 passed, 0 failed, 0 skipped"));  // still printed
  EXPECT_THAT(err, HasSubstr(junit));
  EXPECT_FALSE(fs::exists(junit));
}

TEST_F(ConformE2eTest, UsageErrorsExit2) {
  std::string out, err;
  const std::vector<std::vector<std::string>> cases = {
      {"--root", root_},             // no --resource
      {"--resource", kConformFpga},  // no target
      {"--root", root_, "--plugin-socket", root_ + "/p.sock", "--resource", kConformFpga},  // both
      {"--root", root_, "--resource", kConformFpga, "--timeout", "ten"},
      {"--root", root_, "--resource", kConformFpga, "--timeout", "0s"},
      {"--root", root_, "--resource", kConformFpga, "--only", "lw.health,no.such"},
      {"--root", root_, "--resource", "not a resource"},
      {"--root", root_, "--resource", kConformFpga, "--bogus"},
      {"--root", root_, "--resource", kConformFpga, "stray"},
  };
  for (const auto& args : cases) {
    std::string line;
    for (const auto& a : args) line += a + " ";
    EXPECT_EQ(Conform(args, &out, &err), 2) << line << "\n" << out << err;
    EXPECT_THAT(err, HasSubstr("kdm conform")) << line;
    EXPECT_EQ(out, "") << line;
  }
  Conform({"--root", root_, "--resource", kConformFpga, "--only", "no.such"}, &out, &err);
  EXPECT_THAT(err, HasSubstr("known: reg.version"));
}

// docs/sdk.md's example plugin, built from examples/fpga_plugin.cc.
std::string SdkExamplePlugin() {
  const char* dir = std::getenv("KDM_BINARY_DIR");
  return std::string(dir && *dir ? dir : KDM_TEST_BINARY_DIR) + "/bin/fpga_plugin";
}

// Issue 30, item 3: docs/sdk.md's example plugin failed alloc.unknown-id (the
// SDK passed ids it never listed to its Allocate function). The example, as
// the doc shows it, passes every check; `kdm conform --root` makes the
// plugin directory mode 0750; SIGTERM stops the plugin and removes its socket.
TEST_F(ConformE2eTest, SdkExamplePluginAsTheDocShowsItPassesEveryCheck) {
  const std::string source =
      ReadFile(std::string(KDM_TEST_SOURCE_DIR) + "/examples/fpga_plugin.cc");
  ASSERT_FALSE(source.empty());
  EXPECT_NE(ReadFile(std::string(KDM_TEST_SOURCE_DIR) + "/docs/sdk.md").find(source),
            std::string::npos)
      << "docs/sdk.md does not show examples/fpga_plugin.cc as it is";

  // conform first: the plugin needs the directory, which conform creates.
  Process conform({"conform", "--root", root_, "--resource", kConformFpga, "--timeout", "10s"},
                  root_ + "/conform.out", root_ + "/conform.err");
  ASSERT_TRUE(conform.started());
  const std::string dir = root_ + "/device-plugins";
  ASSERT_TRUE(WaitUntil([&] { return fs::exists(dir + "/kubelet.sock"); }, kdm::e2e::kWaitBound))
      << conform.Err();
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms(0750));
  Process plugin(SdkExamplePlugin(), {dir}, root_ + "/fpga.log");
  ASSERT_TRUE(plugin.started());
  EXPECT_EQ(conform.Wait(), 0) << conform.Out() << conform.Err() << plugin.Log();
  const std::string out = conform.Out();
  EXPECT_THAT(out, HasSubstr(" passed, 0 failed, ")) << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex(R"((^|\n)PASS  alloc\.unknown-id +.*NOT_FOUND.*"kdm-conform-unknown" is )"
                      R"(not a device of example\.com/fpga)")))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex(R"((^|\n)PASS  reg\.restart )"))) << out;
  const std::string socket = dir + "/example.com_fpga.sock";
  EXPECT_TRUE(fs::exists(socket)) << plugin.Log();
  plugin.Signal(SIGTERM);
  EXPECT_EQ(plugin.Wait(), 0) << plugin.Log();
  EXPECT_FALSE(fs::exists(socket));
}

TEST_F(ConformE2eTest, NoPluginExits3) {
  std::string out, err;
  EXPECT_EQ(
      Conform({"--root", root_, "--resource", kConformFpga, "--timeout", "300ms"}, &out, &err), 3)
      << out << err;
  EXPECT_THAT(err, HasSubstr("no plugin registered"));
  EXPECT_EQ(Conform({"--plugin-socket", root_ + "/missing.sock", "--resource", kConformFpga,
                     "--timeout", "300ms"},
                    &out, &err),
            3)
      << out << err;
  EXPECT_THAT(err, HasSubstr(root_ + "/missing.sock"));
}

}  // namespace
}  // namespace kdm
