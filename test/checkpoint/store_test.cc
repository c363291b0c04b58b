// Behaviour every Store shares (memory, SQLite, kubelet JSON file), checked
// against the same model, plus what is particular to each persistent store.
#include "kdm/checkpoint/store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <random>

#include "kdm/base/env.h"
#include "kdm/checkpoint/kubelet_json.h"
#include "kdm/checkpoint/kubelet_json_store.h"
#include "kdm/checkpoint/paths.h"
#include "kdm/checkpoint/sqlite_store.h"
#include "test_util.h"

namespace kdm::checkpoint {
namespace {

using testing::Entry;
using ::testing::HasSubstr;
using testing::TempDir;

enum class Kind { kMemory, kSqlite, kKubeletJson };

std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kMemory:
      return "Memory";
    case Kind::kSqlite:
      return "Sqlite";
    case Kind::kKubeletJson:
      return "KubeletJson";
  }
  return "Unknown";
}

class StoreTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override { Open(); }

  void Open() {
    store_.reset();
    switch (GetParam()) {
      case Kind::kMemory:
        store_ = NewMemoryStore();
        return;
      case Kind::kSqlite: {
        StatusOr<OpenResult> r = OpenSqliteStore({.path = dir_.File("checkpoint.db")});
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_TRUE(r->recovered.ok()) << r->recovered;
        store_ = std::move(r->store);
        return;
      }
      case Kind::kKubeletJson: {
        StatusOr<OpenResult> r = OpenKubeletJsonStore(dir_.File("kubelet_internal_checkpoint"));
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_TRUE(r->recovered.ok()) << r->recovered;
        store_ = std::move(r->store);
        return;
      }
    }
  }

  // Reopens a persistent store (the memory store keeps its state).
  void Reopen() {
    if (GetParam() != Kind::kMemory) Open();
  }

  CheckpointData Load() {
    StatusOr<CheckpointData> d = store_->Load();
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : CheckpointData{};
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreTest, StartsEmpty) { EXPECT_EQ(Load(), CheckpointData{}); }

TEST_P(StoreTest, ApplyUpsertsRemovesAndKeepsEntriesSorted) {
  Change c;
  c.upserts = {Entry("pod-b", "main", "r/gpu", {{0, {"g1"}}}),
               Entry("pod-a", "main", "r/gpu", {{-1, {"g0", "g2"}}}, std::string("\0\x01", 2)),
               Entry("pod-a", "init", "r/fpga", {{1, {"f0"}}})};
  c.registered_devices = {{"r/gpu", {"g0", "g1", "g2"}}, {"r/fpga", {"f0"}}};
  ASSERT_TRUE(store_->Apply(c).ok());
  Reopen();
  CheckpointData d = Load();
  ASSERT_EQ(d.entries.size(), 3u);
  EXPECT_EQ(d.entries[0].key(), (ContainerKey{"pod-a", "init", "r/fpga"}));
  EXPECT_EQ(d.entries[1].alloc_response, std::string("\0\x01", 2));
  EXPECT_EQ(d.entries[2].key(), (ContainerKey{"pod-b", "main", "r/gpu"}));
  EXPECT_EQ(d.registered_devices.at("r/gpu"), (std::vector<std::string>{"g0", "g1", "g2"}));

  Change remove;
  remove.removals = {{"pod-a", "init", "r/fpga"}};
  remove.removed_resources = {"r/fpga"};
  ASSERT_TRUE(store_->Apply(remove).ok());
  Reopen();
  d = Load();
  ASSERT_EQ(d.entries.size(), 2u);
  EXPECT_EQ(d.registered_devices.count("r/fpga"), 0u);
}

TEST_P(StoreTest, ApplyFollowsTheDocumentedOrder) {
  Change first;
  first.upserts = {Entry("p", "c", "r/x", {{0, {"old"}}})};
  first.registered_devices = {{"r/x", {"a"}}};
  ASSERT_TRUE(store_->Apply(first).ok());
  // removed_pods before upserts, removed_resources before registered_devices:
  // the same change re-adds what it removed.
  Change c;
  c.removed_pods = {"p"};
  c.upserts = {Entry("p", "c2", "r/x", {{0, {"new"}}})};
  c.removed_resources = {"r/x"};
  c.registered_devices = {{"r/x", {"b"}}};
  ASSERT_TRUE(store_->Apply(c).ok());
  Reopen();
  CheckpointData d = Load();
  ASSERT_EQ(d.entries.size(), 1u);
  EXPECT_EQ(d.entries[0].container_name, "c2");
  EXPECT_EQ(d.registered_devices.at("r/x"), std::vector<std::string>{"b"});
}

TEST_P(StoreTest, RandomChangesMatchTheModelAcrossReopens) {
  std::mt19937 rng(42);
  CheckpointData model;
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  for (int step = 0; step < 300; ++step) {
    Change c;
    int ops = 1 + pick(3);
    for (int i = 0; i < ops; ++i) {
      std::string pod = "pod-" + std::to_string(pick(8));
      switch (pick(5)) {
        case 0:
          c.removed_pods.push_back(pod);
          break;
        case 1:
          c.removals.push_back({pod, "c" + std::to_string(pick(2)), "r/gpu"});
          break;
        case 2:
        case 3: {
          DevicesPerNuma ids;
          int numa = pick(3) - 1;
          ids[numa] = {"dev-" + std::to_string(pick(100))};
          c.upserts.push_back(Entry(pod, "c" + std::to_string(pick(2)), "r/gpu", ids,
                                    std::string(static_cast<size_t>(pick(5)), '\0')));
          break;
        }
        default:
          if (pick(2) == 0) {
            c.removed_resources.push_back("r/" + std::to_string(pick(3)));
          } else {
            c.registered_devices["r/" + std::to_string(pick(3))] = {"d" + std::to_string(pick(9))};
          }
      }
    }
    ASSERT_TRUE(store_->Apply(c).ok());
    std::unique_ptr<Store> m = NewMemoryStore();
    ASSERT_TRUE(m->Replace(model).ok());
    ASSERT_TRUE(m->Apply(c).ok());
    model = *m->Load();
    if (step % 50 == 49) Reopen();
    ASSERT_EQ(Load(), model) << "after step " << step;
  }
}

TEST_P(StoreTest, ReplaceReplacesEverythingAndTheLastRepeatedKeyWins) {
  Change c;
  c.upserts = {Entry("old", "c", "r/x", {{0, {"a"}}})};
  c.registered_devices = {{"r/old", {"z"}}};
  ASSERT_TRUE(store_->Apply(c).ok());
  CheckpointData next;
  next.entries = {Entry("p", "c", "r/x", {{0, {"first"}}}), Entry("a", "c", "r/x", {{0, {"b"}}}),
                  Entry("p", "c", "r/x", {{0, {"second"}}})};
  next.registered_devices = {{"r/x", {"b", "second"}}};
  next.boot_id = "boot-2";
  ASSERT_TRUE(store_->Replace(next).ok());
  Reopen();
  CheckpointData d = Load();
  ASSERT_EQ(d.entries.size(), 2u);
  EXPECT_EQ(d.entries[0].pod_uid, "a");
  EXPECT_EQ(d.entries[1].device_ids.at(0), std::vector<std::string>{"second"});
  EXPECT_EQ(d.registered_devices, next.registered_devices);
  EXPECT_EQ(d.boot_id, "boot-2");
}

TEST_P(StoreTest, BootIdIsKeptAcrossReopens) {
  ASSERT_TRUE(store_->SetBootId("8f3c-boot").ok());
  Change c;
  c.upserts = {Entry("p", "c", "r/x", {{0, {"a"}}})};
  ASSERT_TRUE(store_->Apply(c).ok());
  Reopen();
  EXPECT_EQ(Load().boot_id, "8f3c-boot");
  ASSERT_TRUE(store_->SetBootId("next-boot").ok());
  Reopen();
  EXPECT_EQ(Load().boot_id, "next-boot");
}

TEST_P(StoreTest, EmptyChangeIsANoOp) {
  ASSERT_TRUE(store_->Apply(Change{}).ok());
  EXPECT_EQ(Load(), CheckpointData{});
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreTest,
                         ::testing::Values(Kind::kMemory, Kind::kSqlite, Kind::kKubeletJson),
                         KindName);

// Runs one query on a raw connection and returns the first column of each row.
std::vector<std::string> Query(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::vector<std::string> rows;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    ADD_FAILURE() << "cannot open " << path;
    return rows;
  }
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << sqlite3_errmsg(db);
  }
  while (st != nullptr && sqlite3_step(st) == SQLITE_ROW) {
    const unsigned char* t = sqlite3_column_text(st, 0);
    rows.emplace_back(t != nullptr ? reinterpret_cast<const char*>(t) : "");
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return rows;
}

// KubeletJsonOptions::env carries every file operation of the store: on an
// in-memory Env it opens, cleans up, writes and reads back without a disk.
TEST(KubeletJsonStore, RunsOnAnInMemoryEnv) {
  std::unique_ptr<MemoryEnv> env = NewMemoryEnv();
  ASSERT_TRUE(env->CreateDirectories("/var/lib/kubelet/device-plugins", 0750).ok());
  const std::string path = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";
  // A writer (pid 999999, gone) killed before its rename.
  ASSERT_TRUE(env->WriteFileInPlaceForTest(path + ".tmp-999999", "half").ok());
  const KubeletJsonOptions options{.path = path, .env = env.get()};
  StatusOr<OpenResult> opened = OpenKubeletJsonStore(options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_THAT(opened->removed_temp_files, ::testing::ElementsAre(path + ".tmp-999999"));
  ASSERT_TRUE(opened->store->SetBootId("mem-boot").ok());
  Change c;
  c.upserts = {Entry("p", "c", "r/x", {{0, {"a"}}})};
  ASSERT_TRUE(opened->store->Apply(c).ok());
  EXPECT_TRUE(env->Stat(path).ok());
  StatusOr<OpenResult> again = OpenKubeletJsonStore(options);
  ASSERT_TRUE(again.ok()) << again.status();
  StatusOr<CheckpointData> data = again->store->Load();
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(data->boot_id, "mem-boot");
  ASSERT_EQ(data->entries.size(), 1u);
  StatusOr<CheckpointData> file = ReadKubeletCheckpointFile(path, true, env.get());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->entries, data->entries);
  // A full disk in the Env fails the write and leaves the file as it was.
  env->FailWritesForTest(1, ResourceExhaustedError("no space left on device"));
  Change more;
  more.upserts = {Entry("q", "c", "r/x", {{0, {"b"}}})};
  EXPECT_EQ(again->store->Apply(more).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ReadKubeletCheckpointFile(path, true, env.get())->entries.size(), 1u);
}

TEST(SqliteStore, RecordsSchemaVersionAndUsesWal) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  StatusOr<OpenResult> r = OpenSqliteStore({.path = path});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->store->Describe(), "sqlite:" + path);
  EXPECT_EQ(Query(path, "SELECT version FROM schema_version"),
            std::vector<std::string>{std::to_string(kSqliteSchemaVersion)});
  EXPECT_EQ(Query(path, "PRAGMA journal_mode"), std::vector<std::string>{"wal"});
}

TEST(SqliteStore, AnEmptySqliteFileIsMigratedNotQuarantined) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  testing::WriteFile(path, "");
  StatusOr<OpenResult> r = OpenSqliteStore({.path = path});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->recovered.ok()) << r->recovered;
  EXPECT_TRUE(r->quarantined_path.empty());
  EXPECT_EQ(Query(path, "SELECT version FROM schema_version"), std::vector<std::string>{"1"});
}

TEST(SqliteStore, ChangesAreVisibleToASecondConnection) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  StatusOr<OpenResult> a = OpenSqliteStore({.path = path});
  ASSERT_TRUE(a.ok()) << a.status();
  StatusOr<OpenResult> b = OpenSqliteStore({.path = path, .synchronous_full = false});
  ASSERT_TRUE(b.ok()) << b.status();
  Change c;
  c.upserts = {Entry("p", "c", "r/x", {{0, {"a"}}})};
  ASSERT_TRUE(a->store->Apply(c).ok());
  StatusOr<CheckpointData> seen = b->store->Load();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->entries.size(), 1u);
}

TEST(SqliteStore, ErrorsThatAreNotCorruptionAreReturned) {
  TempDir dir;
  testing::WriteFile(dir.File("plain-file"), "x");
  StatusOr<OpenResult> under_file = OpenSqliteStore({.path = dir.File("plain-file/checkpoint.db")});
  ASSERT_FALSE(under_file.ok());
  EXPECT_NE(under_file.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(under_file.status().message(), HasSubstr("plain-file/checkpoint.db"));

  StatusOr<OpenResult> missing_dir =
      OpenSqliteStore({.path = dir.File("no/such/dir/checkpoint.db")});
  ASSERT_FALSE(missing_dir.ok());
  EXPECT_EQ(missing_dir.status().code(), StatusCode::kUnavailable);

  StatusOr<OpenResult> is_dir = OpenSqliteStore({.path = dir.path()});
  ASSERT_FALSE(is_dir.ok());
  EXPECT_EQ(is_dir.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(is_dir.status().message(), HasSubstr("is a directory"));

  StatusOr<OpenResult> no_create =
      OpenSqliteStore({.path = dir.File("absent.db"), .create_if_missing = false});
  ASSERT_FALSE(no_create.ok());
  EXPECT_EQ(no_create.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(testing::Exists(dir.File("absent.db")));

  EXPECT_FALSE(OpenSqliteStore({.path = ""}).ok());
}

TEST(KubeletJsonStore, WritesAFileTheKubeletAccepts) {
  TempDir dir;
  std::string path = dir.File("kubelet_internal_checkpoint");
  StatusOr<OpenResult> r = OpenKubeletJsonStore(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(testing::Exists(path));
  Change c;
  c.upserts = {Entry("p", "c", "r/x", {{0, {"a"}}, {-1, {"b"}}}, "\x0a\x00")};
  c.registered_devices = {{"r/x", {"a", "b"}}};
  ASSERT_TRUE(r->store->Apply(c).ok());
  std::string text = testing::ReadFile(path);
  StatusOr<CheckpointData> decoded = DecodeKubeletCheckpoint(text);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->entries, r->store->Load()->entries);
  EXPECT_EQ(r->store->Describe(), "kubelet-json:" + path);
  EXPECT_TRUE(testing::ListWithPrefix(dir.path(), "kubelet_internal_checkpoint.tmp").empty());
}

// Issue 16: a kill -9 between creating "<file>.tmp-<pid>" and renaming it
// left the temporary file behind for good. Opening the store removes those
// whose writer is gone, and nothing else.
TEST(KubeletJsonStore, StaleTempFilesOfDeadWritersAreRemovedAtOpen) {
  TempDir dir;
  const std::string path = dir.File("kubelet_internal_checkpoint");
  pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string gone = std::to_string(dead);
  const std::vector<std::string> stale = {path + ".tmp-" + gone, path + ".boot-id.tmp-" + gone};
  const std::vector<std::string> kept = {
      path + ".tmp-" + std::to_string(::getpid()),  // a live writer
      path + ".tmp-" + gone + "x",
      path + ".tmp-",
      path + ".tmp-0" + gone,
      dir.File("other.tmp-" + gone),
      path + ".corrupt-20260101T000000Z"};
  for (const auto& f : stale) std::ofstream(f) << "partial";
  for (const auto& f : kept) std::ofstream(f) << "keep";
  StatusOr<OpenResult> r = OpenKubeletJsonStore(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->removed_temp_files, ::testing::UnorderedElementsAreArray(stale));
  for (const auto& f : stale) EXPECT_FALSE(testing::Exists(f)) << f;
  for (const auto& f : kept) EXPECT_TRUE(testing::Exists(f)) << f;
}

TEST(KubeletJsonStore, OpensEveryTestVector) {
  for (const std::string& name : testing::TestdataCheckpoints()) {
    SCOPED_TRACE(name);
    TempDir dir;
    std::string path = dir.File("kubelet_internal_checkpoint");
    testing::WriteFile(path, testing::ReadFile(testing::TestdataDir() + "/" + name + ".json"));
    StatusOr<OpenResult> r = OpenKubeletJsonStore(path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->recovered.ok()) << r->recovered;
    EXPECT_FALSE(r->store->Load()->entries.empty());
  }
}

TEST(KubeletJsonStore, ErrorsThatAreNotCorruptionAreReturned) {
  TempDir dir;
  StatusOr<OpenResult> is_dir = OpenKubeletJsonStore(dir.path());
  ASSERT_FALSE(is_dir.ok());
  EXPECT_EQ(is_dir.status().code(), StatusCode::kFailedPrecondition);
  StatusOr<OpenResult> absent = OpenKubeletJsonStore(
      KubeletJsonOptions{.path = dir.File("absent"), .create_if_missing = false});
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);

  // A write into a directory that vanished fails and changes nothing.
  TempDir gone;
  std::string path = gone.File("sub/kubelet_internal_checkpoint");
  ASSERT_EQ(::mkdir(gone.File("sub").c_str(), 0755), 0);
  StatusOr<OpenResult> r = OpenKubeletJsonStore(path);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(::rmdir(gone.File("sub").c_str()), 0);
  Change c;
  c.upserts = {Entry("p", "c", "r/x", {{0, {"a"}}})};
  Status s = r->store->Apply(c);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("write checkpoint"));
  EXPECT_TRUE(r->store->Load()->entries.empty());
}

TEST(Paths, FileNamesUnderTheRoot) {
  EXPECT_EQ(CheckpointPath("/var/lib/kdm", StoreKind::kSqlite), "/var/lib/kdm/state/checkpoint.db");
  EXPECT_EQ(CheckpointPath("/r/", StoreKind::kKubeletJson), "/r/state/kubelet_internal_checkpoint");
  EXPECT_EQ(*ParseStoreKind("sqlite"), StoreKind::kSqlite);
  EXPECT_EQ(*ParseStoreKind("kubelet-json"), StoreKind::kKubeletJson);
  StatusOr<StoreKind> bad = ParseStoreKind("yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("want sqlite or kubelet-json"));
}

TEST(Paths, OpenStoreForRootCreatesTheStateDirectory) {
  TempDir dir;
  for (StoreKind kind : {StoreKind::kSqlite, StoreKind::kKubeletJson}) {
    std::string root = dir.File(std::string(StoreKindName(kind)));
    StatusOr<OpenResult> missing = OpenStoreForRoot(root, kind, {.create_if_missing = false});
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    StatusOr<OpenResult> r = OpenStoreForRoot(root, kind);
    ASSERT_TRUE(r.ok()) << r.status();
    Change c;
    c.upserts = {Entry("p", "c", "r/x", {{0, {"a"}}})};
    ASSERT_TRUE(r->store->Apply(c).ok());
    EXPECT_TRUE(testing::Exists(CheckpointPath(root, kind)));
  }
}

}  // namespace
}  // namespace kdm::checkpoint
