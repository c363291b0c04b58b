// The health file: its parser, its reader, and the watcher driving a real
// fake device plugin (change -> new ListAndWatch snapshot; a bad file keeps
// the last good state).
#include "kdm/fakes/health_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "kdm/fakes/gpu_plugin.h"
#include "kdm/test/pluginapi/fake_registration_server.h"

namespace kdm::fakes {
namespace {

using kdm::testing::FakeRegistrationServer;
using kdm::testing::TempSocketDir;
using namespace std::chrono_literals;

// Writes `text` to `path` atomically (temp file, rename), as a fault
// injector should.
void WriteAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
  }
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

void WriteInPlace(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

TEST(ParseHealthJsonTest, ReadsHealthyAndUnhealthy) {
  auto h = ParseHealthJson(R"({"GPU0": "Healthy", "GPU3": "Unhealthy"})");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(*h, (HealthMap{{"GPU0", true}, {"GPU3", false}}));
  auto empty = ParseHealthJson("{}");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(ParseHealthJsonTest, RejectsBadInputNamingWhatWasWrong) {
  struct Case {
    std::string text;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"{\"GPU0\": \"Healthy\"", "not valid JSON"},  // truncated
      {"\x01\x02\x03", "not valid JSON"},
      {"[\"GPU0\"]", "got array"},
      {"\"Healthy\"", "got string"},
      {R"({"GPU0": "healthy"})", "device \"GPU0\""},
      {R"({"GPU1": true})", "got true"},
      {R"({"GPU2": 1})", "got 1"},
      {R"({"GPU2": {"health": "Healthy"}})", "device \"GPU2\""},
      {R"({"": "Healthy"})", "empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    auto h = ParseHealthJson(c.text);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(h.status().message().find(c.needle), std::string::npos) << h.status();
  }
}

TEST(ReadHealthFileTest, MissingDirectoryAndHugeFiles) {
  TempSocketDir dir;
  auto missing = ReadHealthFile(dir.path() + "/none.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("none.json"), std::string::npos);

  auto directory = ReadHealthFile(dir.path());
  EXPECT_EQ(directory.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);

  std::string big = dir.path() + "/big.json";
  WriteInPlace(big, "{\"a\": \"Healthy\"," + std::string(kMaxHealthFileBytes, ' ') + "}");
  auto huge = ReadHealthFile(big);
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("limit"), std::string::npos) << huge.status();

  std::string bad = dir.path() + "/bad.json";
  WriteInPlace(bad, "{oops");
  auto garbage = ReadHealthFile(bad);
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(garbage.status().message().rfind(bad, 0), 0u) << garbage.status();
}

TEST(HealthFileWatcherTest, CreateAndStartRejectBadArguments) {
  auto empty = HealthFileWatcher::Create(
      "", [](const HealthMap&) {}, nullptr);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  auto dir_only = HealthFileWatcher::Create(
      "/tmp/", [](const HealthMap&) {}, nullptr);
  EXPECT_EQ(dir_only.status().code(), StatusCode::kInvalidArgument);
  auto no_callback = HealthFileWatcher::Create("/tmp/x.json", nullptr, nullptr);
  EXPECT_EQ(no_callback.status().code(), StatusCode::kInvalidArgument);

  auto w = HealthFileWatcher::Create(
      "/nonexistent-kdm-dir/h.json", [](const HealthMap&) {}, nullptr);
  ASSERT_TRUE(w.ok());
  Status s = (*w)->Start();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent-kdm-dir"), std::string::npos) << s;
  (*w)->Stop();
}

// Records what the watcher hands out.
struct Recorder {
  std::mutex mu;
  std::vector<HealthMap> states;
  std::vector<Status> errors;

  HealthFileWatcher::ChangeCallback OnChange() {
    return [this](const HealthMap& h) {
      std::lock_guard lock(mu);
      states.push_back(h);
    };
  }
  HealthFileWatcher::ErrorCallback OnError() {
    return [this](const Status& s) {
      std::lock_guard lock(mu);
      errors.push_back(s);
    };
  }
};

TEST(HealthFileWatcherTest, FollowsWritesRenamesAndRemoval) {
  TempSocketDir dir;
  std::string path = dir.path() + "/health.json";
  WriteInPlace(path, R"({"a": "Unhealthy"})");
  Recorder rec;
  auto w = HealthFileWatcher::Create(path, rec.OnChange(), rec.OnError(), 20ms);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Start().ok());
  // The file present at Start is read at once.
  EXPECT_EQ((*w)->GetStats().reads, 1);
  EXPECT_EQ((*w)->GetStats().applied, 1);

  WriteAtomically(path, R"({"a": "Healthy", "b": "Unhealthy"})");
  ASSERT_TRUE((*w)->WaitForReads(2, 10s));
  WriteInPlace(path, R"({"b": "Unhealthy"})");
  ASSERT_TRUE((*w)->WaitForReads(3, 10s));
  // Same state again: read, not applied.
  WriteAtomically(path, R"({"b": "Unhealthy"})");
  ASSERT_TRUE((*w)->WaitForReads(4, 10s));
  std::filesystem::remove(path);
  ASSERT_TRUE((*w)->WaitForReads(5, 10s));
  // An unrelated file in the same directory is not a read.
  WriteAtomically(dir.path() + "/other.json", "garbage");
  WriteAtomically(path, "{}");
  ASSERT_TRUE((*w)->WaitForReads(6, 10s));
  (*w)->Stop();

  HealthFileWatcher::Stats stats = (*w)->GetStats();
  EXPECT_EQ(stats.reads, 6);
  EXPECT_EQ(stats.applied, 4);
  EXPECT_EQ(stats.rejected, 1);
  std::lock_guard lock(rec.mu);
  ASSERT_EQ(rec.states.size(), 4u);
  EXPECT_EQ(rec.states[0], (HealthMap{{"a", false}}));
  EXPECT_EQ(rec.states[1], (HealthMap{{"a", true}, {"b", false}}));
  EXPECT_EQ(rec.states[2], (HealthMap{{"b", false}}));
  EXPECT_EQ(rec.states[3], HealthMap{});
  ASSERT_EQ(rec.errors.size(), 1u);
  EXPECT_EQ(rec.errors[0].code(), StatusCode::kNotFound);
  EXPECT_NE(rec.errors[0].message().find("removed"), std::string::npos) << rec.errors[0];
}

TEST(HealthFileWatcherTest, MissingFileAtStartIsReportedAndCreatedLater) {
  TempSocketDir dir;
  std::string path = dir.path() + "/later.json";
  Recorder rec;
  auto w = HealthFileWatcher::Create(path, rec.OnChange(), rec.OnError(), 20ms);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Start().ok());
  EXPECT_EQ((*w)->GetStats().rejected, 1);
  WriteAtomically(path, R"({"x": "Unhealthy"})");
  ASSERT_TRUE((*w)->WaitForReads(2, 10s));
  (*w)->Stop();
  (*w)->Stop();  // idempotent
  std::lock_guard lock(rec.mu);
  ASSERT_EQ(rec.states.size(), 1u);
  EXPECT_EQ(rec.states[0], (HealthMap{{"x", false}}));
}

// The watcher wired to a real plugin: each change is a new ListAndWatch
// snapshot, and a garbage file keeps the last good state.
TEST(HealthFileWatcherTest, DrivesPluginSnapshotsAndKeepsLastGoodStateOnGarbage) {
  TempSocketDir dir;
  FakeRegistrationServer kubelet(dir.path());
  ASSERT_TRUE(kubelet.Start());
  PluginConfig c;
  c.resource_name = "nvidia.com/gpu";
  c.plugin_dir = dir.path();
  c.preset = "dgx1-v100";
  c.register_backoff_initial = 10ms;
  c.watch_interval = 20ms;
  auto plugin = FakeDevicePlugin::Create(std::move(c));
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  ASSERT_TRUE((*plugin)->Start().ok());
  ASSERT_TRUE((*plugin)->server().WaitForRegistrationCount(1, 10s));
  ASSERT_FALSE(kubelet.WaitForSnapshots(1).empty());

  std::string path = dir.path() + "/health.json";
  FakeDevicePlugin* p = plugin->get();
  std::vector<HealthUpdate> updates;
  std::mutex mu;
  auto w = HealthFileWatcher::Create(
      path,
      [&](const HealthMap& h) {
        HealthUpdate u = p->ApplyHealth(h);
        std::lock_guard lock(mu);
        updates.push_back(u);
      },
      nullptr, 20ms);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Start().ok());  // no file yet: one rejected read

  auto unhealthy_ids = [](const v1beta1::ListAndWatchResponse& s) {
    std::vector<std::string> out;
    for (const auto& d : s.devices()) {
      if (d.health() != "Healthy") out.push_back(d.id());
    }
    return out;
  };

  size_t seen = kubelet.WaitForSnapshots(0).size();
  WriteAtomically(path, R"({"GPU2": "Unhealthy", "GPU6": "Unhealthy", "GPU77": "Unhealthy"})");
  auto snaps = kubelet.WaitForSnapshots(seen + 1);
  ASSERT_GT(snaps.size(), seen);
  EXPECT_EQ(unhealthy_ids(snaps.back()), (std::vector<std::string>{"GPU2", "GPU6"}));

  // Garbage: reported, ignored; the plugin keeps GPU2 and GPU6 unhealthy.
  // A read may still be answering the previous write's events, so wait for
  // the rejection itself rather than for the next read.
  WriteInPlace(path, "{\"GPU2\": \"Healthy\", truncated");
  for (int i = 0; i < 1000 && (*w)->GetStats().rejected < 2; ++i) {
    int64_t reads = (*w)->GetStats().reads;
    (*w)->WaitForReads(reads + 1, 10ms);
  }
  // (A read between the truncation and the write sees an empty file, also
  // rejected: hence at least 2.)
  EXPECT_GE((*w)->GetStats().rejected, 2);
  int unhealthy = 0;
  for (const auto& d : p->server().Devices()) unhealthy += !d.healthy;
  EXPECT_EQ(unhealthy, 2);

  // A good file again: GPU6 healed.
  seen = kubelet.WaitForSnapshots(0).size();
  WriteAtomically(path, R"({"GPU2": "Unhealthy"})");
  snaps = kubelet.WaitForSnapshots(seen + 1);
  ASSERT_GT(snaps.size(), seen);
  EXPECT_EQ(unhealthy_ids(snaps.back()), std::vector<std::string>{"GPU2"});

  (*w)->Stop();
  (*plugin)->Stop();
  kubelet.Stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[0].unknown_ids, std::vector<std::string>{"GPU77"});
  EXPECT_EQ(updates[0].unhealthy, 2);
  EXPECT_EQ(updates[1].unhealthy, 1);
}

// Same bug as the fuzz finding PodManifestRegression.JsonNumberOverflowUncaughtException
// (fuzz/regressions/pod_manifest/json-number-overflow-uncaught-exception): a
// number too large for a double in the health file threw out_of_range past
// the parse_error handler and terminated the fake plugin.
TEST(HealthFileRegression, JsonNumberOverflowUncaughtException) {
  for (const char* text : {"{\"GPU0\": 1e400}", "1e400", "[-1e999]"}) {
    auto health = ParseHealthJson(text);
    ASSERT_FALSE(health.ok()) << text;
    EXPECT_EQ(health.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(health.status().message().find("not valid JSON"), std::string::npos)
        << health.status();
  }
}

}  // namespace
}  // namespace kdm::fakes
