// kdm::conformance::Runner against the healthy fake plugin
// (fakes::FakeDevicePlugin) in-process, over real unix sockets in a short
// private directory: every check passes (prestart/pref SKIP only when the
// plugin does not offer them), --plugin-socket mode, --only, setup errors.
#include "kdm/conformance/runner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include "kdm/fakes/gpu_plugin.h"
#include "kdm/test/pluginapi/fake_registration_server.h"

namespace kdm::conformance {
namespace {

using kdm::testing::TempSocketDir;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr char kFpga[] = "example.com/fpga";
constexpr char kGpu[] = "nvidia.com/gpu";

fakes::PluginConfig Config(const std::string& root, const std::string& resource) {
  fakes::PluginConfig c;
  c.resource_name = resource;
  c.plugin_dir = root + "/device-plugins";
  c.register_backoff_initial = 10ms;
  c.register_backoff_max = 50ms;
  c.watch_interval = 20ms;
  return c;
}

std::unique_ptr<fakes::FakeDevicePlugin> StartPlugin(fakes::PluginConfig c) {
  std::filesystem::create_directories(c.plugin_dir);
  auto p = fakes::FakeDevicePlugin::Create(std::move(c));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  Status s = (*p)->Start();
  EXPECT_TRUE(s.ok()) << s;
  return std::move(*p);
}

Runner::Options Options(const std::string& root, const std::string& resource) {
  Runner::Options o;
  o.root = root;
  o.resource = resource;
  o.timeout = 10s;  // only a bound: the healthy plugin answers at once
  o.snapshot_window = 300ms;
  return o;
}

std::string Text(const Report& r) { return RenderText(r); }

// Every check ran, in catalogue order; those in `skipped` SKIP, the rest PASS.
void ExpectVerdicts(const Report& report, const std::set<std::string>& skipped) {
  ASSERT_EQ(report.results.size(), Catalogue().size()) << Text(report);
  for (size_t i = 0; i < report.results.size(); ++i) {
    const CheckResult& r = report.results[i];
    EXPECT_EQ(r.info.id, Catalogue()[i].id);
    Verdict want = skipped.contains(r.info.id) ? Verdict::kSkip : Verdict::kPass;
    EXPECT_EQ(r.verdict, want) << r.info.id << ": " << r.reason << "\n" << Text(report);
    EXPECT_FALSE(r.reason.empty()) << r.info.id;
  }
}

TEST(RunnerTest, HealthyCountPluginWithCdiAndPreStartPassesEveryCheck) {
  TempSocketDir dir;
  fakes::PluginConfig c = Config(dir.path(), kFpga);
  c.count = 8;
  c.cdi = true;
  c.pre_start = true;
  auto plugin = StartPlugin(std::move(c));
  ASSERT_NE(plugin, nullptr);
  Runner::Options o = Options(dir.path(), kFpga);
  o.snapshot_window = 1s;
  StatusOr<Report> report = Runner::Run(o);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectVerdicts(*report, {});
  EXPECT_EQ(SummaryLine(*report), "25 passed, 0 failed, 0 skipped");
  EXPECT_THAT(report->Find("alloc.cdi-names")->reason, HasSubstr("CDI device names"));
  // reg.restart made it register again (the plugin counts it once the
  // Register call has returned to it, which may be after the Runner is done).
  EXPECT_TRUE(plugin->server().WaitForRegistrationCount(2, 10s));
  plugin->Stop();
}

TEST(RunnerTest, HealthyPresetPluginWithoutPreferredOrPreStartSkipsOnlyThose) {
  TempSocketDir dir;
  fakes::PluginConfig c = Config(dir.path(), kGpu);
  c.preset = "dgx1-v100";
  c.policy = std::nullopt;
  auto plugin = StartPlugin(std::move(c));
  ASSERT_NE(plugin, nullptr);
  StatusOr<Report> report = Runner::Run(Options(dir.path(), kGpu));
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectVerdicts(*report, {"pref.size", "pref.subset", "pref.must-include", "pref.no-duplicates",
                           "pref.deterministic", "pref.deadline", "prestart.answered"});
  EXPECT_THAT(report->Find("pref.size")->reason, HasSubstr("not offered"));
  EXPECT_THAT(report->Find("prestart.answered")->reason, HasSubstr("not required"));
  // The preset's NUMA nodes were seen and judged.
  EXPECT_THAT(report->Find("lw.numa")->reason, HasSubstr("8 NUMA node ids"));
  plugin->Stop();
}

TEST(RunnerTest, HealthyPresetPluginWithPreferredPassesThePrefChecks) {
  TempSocketDir dir;
  fakes::PluginConfig c = Config(dir.path(), kGpu);
  c.preset = "dgx1-v100";
  c.policy = topology::Policy::kBestSet;
  auto plugin = StartPlugin(std::move(c));
  ASSERT_NE(plugin, nullptr);
  StatusOr<Report> report = Runner::Run(Options(dir.path(), kGpu));
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectVerdicts(*report, {"prestart.answered"});
  plugin->Stop();
}

TEST(RunnerTest, PluginSocketModeSkipsRegistrationChecks) {
  TempSocketDir dir;
  fakes::PluginConfig c = Config(dir.path(), kFpga);
  c.count = 4;
  c.pre_start = true;
  c.register_with_kubelet = false;
  auto plugin = StartPlugin(std::move(c));
  ASSERT_NE(plugin, nullptr);
  Runner::Options o;
  o.plugin_socket = plugin->server().SocketPath();
  o.resource = kFpga;
  o.timeout = 10s;
  o.snapshot_window = 300ms;
  StatusOr<Report> report = Runner::Run(o);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectVerdicts(*report, {"reg.version", "reg.resource-name", "reg.endpoint", "reg.options-match",
                           "reg.restart"});
  EXPECT_EQ(report->Find("reg.version")->reason, "no registration: --plugin-socket");
  plugin->Stop();
}

TEST(RunnerTest, OnlyRunsTheNamedChecksInCatalogueOrder) {
  TempSocketDir dir;
  fakes::PluginConfig c = Config(dir.path(), kFpga);
  c.count = 2;
  auto plugin = StartPlugin(std::move(c));
  ASSERT_NE(plugin, nullptr);
  Runner::Options o = Options(dir.path(), kFpga);
  o.only = {"alloc.permissions", "lw.health"};  // out of order on purpose
  StatusOr<Report> report = Runner::Run(o);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->results.size(), 2u) << Text(*report);
  EXPECT_EQ(report->results[0].info.id, "lw.health");
  EXPECT_EQ(report->results[1].info.id, "alloc.permissions");
  EXPECT_EQ(report->failed(), 0) << Text(*report);
  EXPECT_EQ(report->skipped(), 0) << Text(*report);
  plugin->Stop();
}

TEST(RunnerTest, NoPluginIsASetupErrorWithinTheBound) {
  TempSocketDir dir;
  Runner::Options o = Options(dir.path(), kFpga);
  o.timeout = 300ms;
  auto start = std::chrono::steady_clock::now();
  StatusOr<Report> report = Runner::Run(o);
  // Bounded, not fast: generous slack for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(report.status().message(), HasSubstr("no plugin registered on " + dir.path() +
                                                   "/device-plugins/kubelet.sock within 300ms"));
  // The directory was made for the plugin, mode 0750, and kubelet.sock removed again.
  struct stat st;
  ASSERT_EQ(::stat((dir.path() + "/device-plugins").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/device-plugins/kubelet.sock"));
}

TEST(RunnerTest, PluginSocketThatIsNotThereOrNotASocket) {
  TempSocketDir dir;
  Runner::Options o;
  o.resource = kFpga;
  o.timeout = 300ms;
  o.plugin_socket = dir.path() + "/missing.sock";
  StatusOr<Report> report = Runner::Run(o);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(report.status().message(), HasSubstr(dir.path() + "/missing.sock"));
  o.plugin_socket = dir.path();  // a directory
  report = Runner::Run(o);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr("not a unix socket"));
}

TEST(RunnerTest, RootThatCannotHoldTheSocket) {
  TempSocketDir dir;
  Runner::Options o = Options(dir.path() + "/" + std::string(120, 'x'), kFpga);
  StatusOr<Report> report = Runner::Run(o);
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(),
              HasSubstr("longer than the 107 bytes a unix socket path allows"));
  // A regular file where the directory should be.
  std::string file = dir.path() + "/file";
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  report = Runner::Run(Options(file, kFpga));
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr(file));
}

TEST(RunnerTest, CheckOptionsRefusesBadInput) {
  Runner::Options good;
  good.root = "/tmp/x";
  good.resource = kFpga;
  EXPECT_TRUE(Runner::CheckOptions(good).ok());

  auto refused = [&](Runner::Options o, const std::string& text) {
    Status s = Runner::CheckOptions(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(s.message(), HasSubstr(text));
  };
  Runner::Options o = good;
  o.resource = "";
  refused(o, "--resource NAME is required");
  o.resource = "gpu";
  refused(o, "the ResourceName \"gpu\" is invalid");
  o.resource = "kubernetes.io/gpu";
  refused(o, "is invalid");
  o = good;
  o.root = "";
  refused(o, "exactly one of --root");
  o.plugin_socket = "/tmp/p.sock";
  EXPECT_TRUE(Runner::CheckOptions(o).ok());
  o.root = "/tmp/x";
  refused(o, "exactly one of --root");
  o = good;
  o.timeout = 0ms;
  refused(o, "--timeout must be more than 0");
  o = good;
  o.only = {"lw.health", "lw.nope"};
  refused(o, "unknown check id \"lw.nope\" (known: reg.version, reg.resource-name");
  o.only = {""};
  refused(o, "unknown check id \"\"");
  o = good;
  o.stream_drop_iterations = 0;
  refused(o, "iterations");
  o = good;
  o.snapshot_window = -1ms;
  refused(o, "window");
}

}  // namespace
}  // namespace kdm::conformance
