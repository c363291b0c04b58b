// The fault matrix: for every `kdm plugin --fault NAME` mode
// (fakes::FaultyPlugin), the Runner reports exactly the intended check as
// FAIL and every other check as PASS or SKIP. Together with the healthy
// runs of runner_test.cc this shows that each check can fail and fails only
// for what it claims to check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "kdm/conformance/runner.h"
#include "kdm/fakes/faulty_plugin.h"
#include "kdm/fakes/health_file.h"
#include "kdm/test/pluginapi/fake_registration_server.h"

namespace kdm::conformance {
namespace {

using kdm::testing::TempSocketDir;
using namespace std::chrono_literals;

constexpr char kResource[] = "example.com/fpga";

// The catalogue's table: which check each fault breaks.
const std::map<std::string, std::string>& BrokenCheck() {
  static const std::map<std::string, std::string> kTable = {
      {"reg-bad-version", "reg.version"},
      {"reg-bad-resource-name", "reg.resource-name"},
      {"reg-endpoint-path", "reg.endpoint"},
      {"reg-options-mismatch", "reg.options-match"},
      {"lw-no-snapshot", "lw.first-snapshot"},
      {"lw-duplicate-ids", "lw.ids"},
      {"lw-bad-health", "lw.health"},
      {"lw-negative-numa", "lw.numa"},
      {"health-not-sent", "health.trigger"},
      {"lw-delta-updates", "lw.full-snapshots"},
      {"alloc-two-responses", "alloc.one-response"},
      {"alloc-accept-unknown", "alloc.unknown-id"},
      {"alloc-relative-path", "alloc.paths"},
      {"alloc-bad-permissions", "alloc.permissions"},
      {"alloc-bad-env", "alloc.env-names"},
      {"alloc-bad-cdi", "alloc.cdi-names"},
      {"alloc-not-concurrent", "alloc.concurrent"},
      {"pref-wrong-size", "pref.size"},
      {"pref-not-subset", "pref.subset"},
      {"pref-drop-must-include", "pref.must-include"},
      {"pref-duplicates", "pref.no-duplicates"},
      {"pref-random", "pref.deterministic"},
      {"pref-slow", "pref.deadline"},
      {"prestart-unimplemented", "prestart.answered"},
      {"lw-drop-breaks", "lw.stream-drop"},
      {"health-stale-streams", "health.reconnect"},
      {"no-reregister", "reg.restart"},
  };
  return kTable;
}

// A --health-trigger that adds its device ($1) to the Unhealthy ones of the
// health file `path` (written whole, then renamed into place).
std::string UnhealthyTrigger(const std::string& path) {
  return "f='" + path + "'; echo \"$1\" >> \"$f.ids\"; " +
         "{ printf '{'; s=''; while read -r id; do printf '%s\"%s\":\"Unhealthy\"' \"$s\" " +
         "\"$id\"; s=','; done < \"$f.ids\"; printf '}'; } > \"$f.tmp\" && mv \"$f.tmp\" " +
         "\"$f\"; :";
}

TEST(FaultMatrixTest, EveryFaultHasACheckAndEveryCheckAFault) {
  std::set<std::string> faults(fakes::FaultNames().begin(), fakes::FaultNames().end());
  std::set<std::string> table_faults, table_checks;
  for (const auto& [fault, check] : BrokenCheck()) {
    table_faults.insert(fault);
    table_checks.insert(check);
    EXPECT_NE(FindCheck(check), nullptr) << check;
  }
  EXPECT_EQ(faults, table_faults);
  std::set<std::string> checks;
  for (const CheckInfo& c : Catalogue()) checks.insert(c.id);
  EXPECT_EQ(checks, table_checks);
}

class FaultMatrixTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FaultMatrixTest, BreaksExactlyItsCheck) {
  const std::string fault = GetParam();
  auto it = BrokenCheck().find(fault);
  ASSERT_NE(it, BrokenCheck().end()) << "no expected check for fault " << fault;
  const std::string& broken = it->second;

  TempSocketDir dir;
  fakes::PluginConfig c;
  c.resource_name = kResource;
  c.plugin_dir = dir.path() + "/device-plugins";
  c.count = 8;
  c.cdi = true;
  c.pre_start = true;
  c.register_backoff_initial = 10ms;
  c.register_backoff_max = 50ms;
  c.watch_interval = 20ms;
  std::filesystem::create_directories(c.plugin_dir);
  auto plugin = fakes::FaultyPlugin::Create(c, fault);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  // The health trigger marks its device in a health file that the plugin
  // follows (as `kdm plugin --fault F --health-file FILE` does).
  const std::string health = dir.path() + "/health.json";
  fakes::FaultyPlugin* p = plugin->get();
  auto watcher = fakes::HealthFileWatcher::Create(
      health, [p](const fakes::HealthMap& h) { p->ApplyHealth(h); }, [](const Status&) {});
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  ASSERT_TRUE((*watcher)->Start().ok());
  ASSERT_TRUE((*plugin)->Start().ok());

  Runner::Options o;
  o.root = dir.path();
  o.resource = kResource;
  // Faults that hang cost this much. It also bounds the first snapshot
  // (min(timeout, 5 s)): 2 s was missed once under ThreadSanitizer on a busy
  // 2-core machine, so the healthy parts get the runner's full 5 s.
  o.timeout = 5s;
  o.snapshot_window = 500ms;  // > the 200 ms of lw-delta-updates
  o.health_trigger = UnhealthyTrigger(health);
  StatusOr<Report> report = Runner::Run(o);
  (*watcher)->Stop();
  (*plugin)->Stop();
  ASSERT_TRUE(report.ok()) << report.status();
  std::string text = RenderText(*report);
  ASSERT_EQ(report->results.size(), Catalogue().size()) << text;
  for (const CheckResult& r : report->results) {
    if (r.info.id == broken) {
      EXPECT_EQ(r.verdict, Verdict::kFail) << fault << " should break " << broken << "\n" << text;
    } else {
      EXPECT_NE(r.verdict, Verdict::kFail) << fault << " should break only " << broken << ", but "
                                           << r.info.id << " failed: " << r.reason << "\n"
                                           << text;
    }
  }
  EXPECT_EQ(report->failed(), 1) << text;
}

INSTANTIATE_TEST_SUITE_P(AllFaults, FaultMatrixTest, ::testing::ValuesIn(fakes::FaultNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (char ch : info.param) name += ch == '-' ? '_' : ch;
                           return name;
                         });

}  // namespace
}  // namespace kdm::conformance
