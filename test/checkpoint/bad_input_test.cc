// Bad files for every opener: a clear error in OpenResult::recovered, an
// empty and usable fresh store, and the bad file moved aside with a UTC
// timestamp, byte for byte, never deleted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <regex>

#include "kdm/checkpoint/kubelet_json.h"
#include "kdm/checkpoint/kubelet_json_store.h"
#include "kdm/checkpoint/sqlite_store.h"
#include "test_util.h"

namespace kdm::checkpoint {
namespace {

using testing::Entry;
using testing::Exists;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, 8);
  }
  return out;
}

// Writes a valid SQLite checkpoint with `pods` pods and closes it (the WAL
// is folded into the main file on close).
void WriteSqliteCheckpoint(const std::string& path, int pods) {
  StatusOr<OpenResult> r = OpenSqliteStore({.path = path, .synchronous_full = false});
  ASSERT_TRUE(r.ok()) << r.status();
  CheckpointData data;
  for (int i = 0; i < pods; ++i) {
    data.entries.push_back(Entry("pod-" + std::to_string(i), "main", "vendor.com/gpu",
                                 {{0, {"gpu-" + std::to_string(i)}}}, std::string(200, 'x')));
  }
  data.registered_devices["vendor.com/gpu"] = {"gpu-0"};
  ASSERT_TRUE(r->store->Replace(data).ok());
}

void Exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err != nullptr ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

// Opens a bad file and checks the whole recovery contract.
void ExpectQuarantined(StatusOr<OpenResult> r, const std::string& path, const std::string& original,
                       const std::string& want_in_error) {
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->recovered.code(), StatusCode::kDataLoss) << r->recovered;
  EXPECT_THAT(r->recovered.message(), HasSubstr(want_in_error));
  EXPECT_THAT(r->recovered.message(), HasSubstr("moved aside to " + r->quarantined_path));
  EXPECT_THAT(
      r->quarantined_path,
      MatchesRegex(std::regex_replace(path, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                   R"(\.corrupt-[0-9]{8}T[0-9]{6}Z(\.[0-9]+)?)"));
  ASSERT_TRUE(Exists(r->quarantined_path));
  // Compared as a bool: a failure must not print megabytes of binary.
  std::string moved = ReadFile(r->quarantined_path);
  EXPECT_EQ(moved.size(), original.size());
  EXPECT_TRUE(moved == original) << "the quarantined file differs from the bad file";
  StatusOr<CheckpointData> data = r->store->Load();
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, CheckpointData{});
  Change c;
  c.upserts = {Entry("p", "c", "r/x", {{0, {"a"}}})};
  EXPECT_TRUE(r->store->Apply(c).ok());
}

TEST(SqliteBadInput, TruncatedDatabase) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  WriteSqliteCheckpoint(path, 300);
  std::string whole = ReadFile(path);
  ASSERT_GT(whole.size(), 16u * 4096u);
  std::string half = whole.substr(0, whole.size() / 2);
  WriteFile(path, half);
  ExpectQuarantined(OpenSqliteStore({.path = path}), path, half, path);
}

TEST(SqliteBadInput, TruncatedInsideTheHeader) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  WriteSqliteCheckpoint(path, 3);
  std::string head = ReadFile(path).substr(0, 50);
  WriteFile(path, head);
  ExpectQuarantined(OpenSqliteStore({.path = path}), path, head,
                    "is not a database: 50 bytes, shorter than a SQLite header (truncated?)");
}

TEST(SqliteBadInput, RandomBytes) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  std::string junk = RandomBytes(8192, 1);
  WriteFile(path, junk);
  ExpectQuarantined(OpenSqliteStore({.path = path}), path, junk,
                    "is not a database: it does not start with the SQLite header");
}

TEST(SqliteBadInput, ValidHeaderFollowedByGarbage) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  WriteSqliteCheckpoint(path, 50);
  std::string bytes = ReadFile(path);
  std::string junk = RandomBytes(bytes.size() - 4096, 2);
  bytes.replace(4096, junk.size(), junk);  // keep page 1, trash the rest
  WriteFile(path, bytes);
  ExpectQuarantined(OpenSqliteStore({.path = path}), path, bytes, path);
}

TEST(SqliteBadInput, NewerSchemaVersion) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  WriteSqliteCheckpoint(path, 2);
  Exec(path, "UPDATE schema_version SET version = 99");
  std::string bytes = ReadFile(path);
  ExpectQuarantined(OpenSqliteStore({.path = path}), path, bytes,
                    "schema version 99, newer than this kdm supports (1)");
}

TEST(SqliteBadInput, ForeignDatabase) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  Exec(path, "CREATE TABLE photos (id INTEGER); INSERT INTO photos VALUES (1)");
  std::string bytes = ReadFile(path);
  ExpectQuarantined(OpenSqliteStore({.path = path}), path, bytes,
                    "not a kdm checkpoint database (no schema_version table; "
                    "tables: photos)");
}

TEST(SqliteBadInput, RowThatDoesNotDecode) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  WriteSqliteCheckpoint(path, 2);
  Exec(path, "UPDATE pod_devices SET device_ids = 'not json' WHERE pod_uid = 'pod-1'");
  std::string bytes = ReadFile(path);
  ExpectQuarantined(OpenSqliteStore({.path = path}), path, bytes,
                    "pod_devices row (pod-1, main, vendor.com/gpu)");
}

TEST(SqliteBadInput, HundredMegabytesOfGarbage) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  std::string junk = RandomBytes(100u << 20, 3);
  WriteFile(path, junk);
  ExpectQuarantined(OpenSqliteStore({.path = path}), path, junk,
                    "is not a database: it does not start with the SQLite header");
}

TEST(SqliteBadInput, WalAndShmMoveWithTheFile) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  std::string junk = RandomBytes(4096, 4);
  WriteFile(path, junk);
  WriteFile(path + "-wal", "wal bytes");
  WriteFile(path + "-shm", "shm bytes");
  StatusOr<OpenResult> r = OpenSqliteStore({.path = path});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadFile(r->quarantined_path + "-wal"), "wal bytes");
  EXPECT_EQ(ReadFile(r->quarantined_path + "-shm"), "shm bytes");
}

TEST(SqliteBadInput, TwoQuarantinesInOneSecondKeepBothFiles) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  std::vector<std::string> moved;
  for (int i = 0; i < 2; ++i) {
    std::string junk = RandomBytes(4096, 10 + static_cast<uint64_t>(i));
    WriteFile(path, junk);
    StatusOr<OpenResult> r = OpenSqliteStore({.path = path});
    ASSERT_TRUE(r.ok()) << r.status();
    r->store.reset();
    moved.push_back(r->quarantined_path);
    ::unlink(path.c_str());
    ::unlink((path + "-wal").c_str());
    ::unlink((path + "-shm").c_str());
  }
  ASSERT_NE(moved[0], moved[1]);
  EXPECT_TRUE(Exists(moved[0]));
  EXPECT_TRUE(Exists(moved[1]));
}

TEST(SqliteBadInput, WithoutQuarantineTheFileStaysAndTheErrorIsReturned) {
  TempDir dir;
  std::string path = dir.File("checkpoint.db");
  std::string junk = RandomBytes(4096, 5);
  WriteFile(path, junk);
  StatusOr<OpenResult> r = OpenSqliteStore({.path = path, .quarantine_corrupt = false});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("not a database"));
  EXPECT_EQ(ReadFile(path), junk);
  EXPECT_TRUE(testing::ListWithPrefix(dir.path(), "checkpoint.db.corrupt").empty());
}

std::string ValidKubeletFile() { return ReadFile(testing::TestdataDir() + "/multi.json"); }

struct JsonCase {
  const char* name;
  std::string content;
  std::string want;
};

TEST(KubeletJsonBadInput, EveryKindOfBadFileIsQuarantined) {
  std::string valid = ValidKubeletFile();
  std::string bad_sum = valid;
  bad_sum.replace(bad_sum.find("580176912"), 9, "580176913");
  std::string bad_b64 = valid;
  bad_b64.replace(bad_b64.find("\"IgA=\""), 6, "\"I*A=\"");
  std::string wrong_type = valid;
  wrong_type.replace(wrong_type.find("\"uid-b\""), 7, "42");
  const JsonCase cases[] = {
      {"bad checksum", bad_sum,
       "checksum mismatch: the file says 580176913, its data hashes to "
       "580176912"},
      {"bad base64", bad_b64, "Data.PodDeviceEntries[1].AllocResp: invalid base64 at byte 1"},
      {"wrong type", wrong_type, "Data.PodDeviceEntries[2].PodUID: expected a string, got number"},
      {"truncated", valid.substr(0, valid.size() / 2), "not valid JSON"},
      {"empty", "", "not valid JSON"},
      {"random bytes", RandomBytes(4096, 6), "not valid JSON"},
  };
  for (const JsonCase& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    std::string path = dir.File("kubelet_internal_checkpoint");
    WriteFile(path, c.content);
    ExpectQuarantined(OpenKubeletJsonStore(path), path, c.content, c.want);
    EXPECT_FALSE(Exists(path + ".boot-id"));
  }
}

TEST(KubeletJsonBadInput, HundredMegabytesOfGarbage) {
  TempDir dir;
  std::string path = dir.File("kubelet_internal_checkpoint");
  std::string junk = RandomBytes(100u << 20, 7);
  WriteFile(path, junk);
  ExpectQuarantined(OpenKubeletJsonStore(path), path, junk, "not valid JSON");
}

TEST(KubeletJsonBadInput, GarbageBootIdSidecarIsQuarantinedAndTheDataKept) {
  TempDir dir;
  std::string path = dir.File("kubelet_internal_checkpoint");
  WriteFile(path, ValidKubeletFile());
  WriteFile(path + ".boot-id", RandomBytes(4096, 8));
  StatusOr<OpenResult> r = OpenKubeletJsonStore(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->recovered.message(), HasSubstr("more than a boot id"));
  EXPECT_EQ(r->store->Load()->entries.size(), 3u);
  EXPECT_EQ(r->store->Load()->boot_id, "");
  EXPECT_EQ(
      testing::ListWithPrefix(dir.path(), "kubelet_internal_checkpoint.boot-id.corrupt-").size(),
      1u);
}

TEST(KubeletJsonBadInput, WithoutQuarantineTheFileStaysAndTheErrorIsReturned) {
  TempDir dir;
  std::string path = dir.File("kubelet_internal_checkpoint");
  WriteFile(path, "{");
  StatusOr<OpenResult> r =
      OpenKubeletJsonStore(KubeletJsonOptions{.path = path, .quarantine_corrupt = false});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path + ": not valid JSON"));
  EXPECT_EQ(ReadFile(path), "{");
}

}  // namespace
}  // namespace kdm::checkpoint
