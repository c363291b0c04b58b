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
#include "kdm/fakes/health_file.h"
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
// Without a health trigger (these runs) the health.* checks SKIP too.
void ExpectVerdicts(const Report& report, std::set<std::string> skipped,
                    bool health_trigger = false) {
  if (!health_trigger) skipped.insert({"health.trigger", "health.reconnect"});
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
  EXPECT_EQ(SummaryLine(*report), "25 passed, 0 failed, 2 skipped");
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
  // Returns (the 300 ms bound ends the wait for a registration; the test's
  // ctest limit catches a run that would not).
  StatusOr<Report> report = Runner::Run(o);
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
  o = good;
  o.health_trigger = std::string("echo a\0b", 8);
  refused(o, "--health-trigger must be a shell command of at most 4096 bytes without NUL bytes");
  o.health_trigger = std::string(4097, 'x');
  refused(o, "--health-trigger must be");
  o.health_trigger = std::string(4096, 'x');
  EXPECT_TRUE(Runner::CheckOptions(o).ok());
  o = good;
  o.health_reconnects = 0;
  refused(o, "health reconnects must be between 1 and 100");
  o.health_reconnects = 101;
  refused(o, "health reconnects");
}

// --- health.trigger and health.reconnect ------------------------------------

// A --health-trigger that adds its device ($1) to the Unhealthy ones of the
// health file `path` (written whole, then renamed into place).
std::string MarkUnhealthy(const std::string& path) {
  return "f='" + path + "'; echo \"$1\" >> \"$f.ids\"; " +
         "{ printf '{'; s=''; while read -r id; do printf '%s\"%s\":\"Unhealthy\"' \"$s\" " +
         "\"$id\"; s=','; done < \"$f.ids\"; printf '}'; } > \"$f.tmp\" && mv \"$f.tmp\" " +
         "\"$f\"; :";
}

// A healthy plugin whose health follows a file, as `kdm plugin --health-file`.
class HealthFilePlugin {
 public:
  explicit HealthFilePlugin(const std::string& root) : health_(root + "/health.json") {
    fakes::PluginConfig c = Config(root, kFpga);
    c.count = 8;
    plugin_ = StartPlugin(std::move(c));
    if (plugin_ == nullptr) return;
    fakes::FakeDevicePlugin* p = plugin_.get();
    auto w = fakes::HealthFileWatcher::Create(
        health_, [p](const fakes::HealthMap& h) { p->ApplyHealth(h); }, [](const Status&) {});
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return;
    watcher_ = std::move(*w);
    EXPECT_TRUE(watcher_->Start().ok());
  }
  ~HealthFilePlugin() {
    if (watcher_) watcher_->Stop();
    if (plugin_) plugin_->Stop();
  }
  bool ok() const { return watcher_ != nullptr; }
  const std::string& health() const { return health_; }
  int Unhealthy() const {
    int n = 0;
    for (const plugin::Device& d : plugin_->server().Devices()) n += d.healthy ? 0 : 1;
    return n;
  }

 private:
  const std::string health_;
  std::unique_ptr<fakes::FakeDevicePlugin> plugin_;
  std::unique_ptr<fakes::HealthFileWatcher> watcher_;
};

TEST(RunnerHealthTest, ATriggeredDeviceReachesTheOpenStreamAndTheStreamAfterReconnects) {
  TempSocketDir dir;
  HealthFilePlugin p(dir.path());
  ASSERT_TRUE(p.ok());
  Runner::Options o = Options(dir.path(), kFpga);
  o.health_trigger = MarkUnhealthy(p.health());
  StatusOr<Report> report = Runner::Run(o);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectVerdicts(*report, {"prestart.answered"}, /*health_trigger=*/true);
  EXPECT_THAT(report->Find("health.trigger")->reason,
              HasSubstr("reported Unhealthy on the open stream"));
  EXPECT_EQ(report->Find("health.reconnect")->reason,
            "2 of 2 health changes reached the stream opened after 3 cancelled streams");
  // One device by health.trigger, two by health.reconnect.
  EXPECT_EQ(p.Unhealthy(), 3);
}

// The trigger's own failures are the check's FAIL, naming the device and
// what the command did; health.reconnect then SKIPs.
TEST(RunnerHealthTest, ATriggerThatFailsHangsOrDoesNothingFailsSayingWhat) {
  struct Case {
    std::string trigger;
    std::string reason;
  };
  for (const Case& c : std::vector<Case>{
           {"echo 'no such device' >&2; exit 4; :", "exited 4: no such device"},
           {"sleep 60; :", "ran past --timeout 1s and was killed"},
           {"true", "was not reported Unhealthy on the open stream within 1s of the trigger"}}) {
    SCOPED_TRACE(c.trigger);
    TempSocketDir dir;
    HealthFilePlugin p(dir.path());
    ASSERT_TRUE(p.ok());
    Runner::Options o = Options(dir.path(), kFpga);
    o.timeout = 1s;
    o.only = {"health.trigger", "health.reconnect"};
    o.health_trigger = c.trigger;
    StatusOr<Report> report = Runner::Run(o);
    ASSERT_TRUE(report.ok()) << report.status();
    const CheckResult* trigger = report->Find("health.trigger");
    ASSERT_NE(trigger, nullptr);
    EXPECT_EQ(trigger->verdict, Verdict::kFail);
    EXPECT_THAT(trigger->reason, HasSubstr(c.reason));
    EXPECT_EQ(report->Find("health.reconnect")->verdict, Verdict::kSkip);
    EXPECT_THAT(report->Find("health.reconnect")->reason, HasSubstr("health.trigger did not pass"));
  }
}

}  // namespace
}  // namespace kdm::conformance