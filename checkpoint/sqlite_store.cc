#include "kdm/checkpoint/sqlite_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/checkpoint/quarantine.h"
#include "kdm/checkpoint/sqlite_db.h"

namespace kdm::checkpoint {
namespace {

using internal::SqliteDb;
using internal::SqliteStatement;

// Forward migrations: kMigrations[v] takes a database from schema version v
// to v + 1. Version 0 is an empty file. Never edit a shipped entry; append.
const char* const kMigrations[] = {
    // 0 -> 1: the initial schema.
    R"sql(
CREATE TABLE schema_version (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  version INTEGER NOT NULL
);
CREATE TABLE meta (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE pod_devices (
  pod_uid TEXT NOT NULL,
  container_name TEXT NOT NULL,
  resource_name TEXT NOT NULL,
  device_ids TEXT NOT NULL,
  alloc_response BLOB NOT NULL,
  PRIMARY KEY (pod_uid, container_name, resource_name)
) WITHOUT ROWID;
CREATE TABLE registered_devices (
  resource_name TEXT PRIMARY KEY,
  device_ids TEXT NOT NULL
) WITHOUT ROWID;
)sql",
};
static_assert(std::size(kMigrations) == kSqliteSchemaVersion);

constexpr char kBootIdKey[] = "boot_id";

std::string EncodeDevicesPerNuma(const DevicesPerNuma& devices) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [numa, ids] : devices) j[std::to_string(numa)] = ids;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string EncodeIds(const std::vector<std::string>& ids) {
  return nlohmann::json(ids).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

StatusOr<std::vector<std::string>> DecodeIds(const nlohmann::json& j) {
  if (!j.is_array()) return DataLossError("expected a JSON array of device ids");
  std::vector<std::string> out;
  for (const auto& id : j) {
    if (!id.is_string()) return DataLossError("expected a device id string");
    out.push_back(id.get<std::string>());
  }
  return out;
}

StatusOr<DevicesPerNuma> DecodeDevicesPerNuma(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return DataLossError("device_ids is not a JSON object");
  DevicesPerNuma out;
  for (const auto& [key, value] : j.items()) {
    int64_t numa = 0;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), numa);
    if (ec != std::errc() || end != key.data() + key.size()) {
      return DataLossError("device_ids key \"" + key + "\" is not a NUMA node number");
    }
    KDM_ASSIGN_OR_RETURN(out[numa], DecodeIds(value));
  }
  return out;
}

// The SQLite file header: a file that does not start with it is rejected
// before SQLite opens it (SQLite would delete a -wal/-shm beside it).
constexpr char kSqliteMagic[] = "SQLite format 3";  // plus its NUL: 16 bytes
constexpr size_t kSqliteHeaderSize = 100;

// OK for a missing or empty file (a fresh database) or one with a SQLite
// header; DATA_LOSS otherwise.
Status CheckHeader(const std::string& path, bool* empty) {
  *empty = true;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return OkStatus();
    return ErrnoToStatus(errno, "open " + path);
  }
  char header[kSqliteHeaderSize];
  size_t got = 0;
  while (got < sizeof(header)) {
    ssize_t n = ::read(fd, header + got, sizeof(header) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "read " + path);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got == 0) return OkStatus();
  *empty = false;
  if (got < kSqliteHeaderSize) {
    return DataLossError(path + " is not a database: " + std::to_string(got) +
                         " bytes, shorter than a SQLite header (truncated?)");
  }
  if (std::memcmp(header, kSqliteMagic, sizeof(kSqliteMagic)) != 0) {
    return DataLossError(path + " is not a database: it does not start with the SQLite header");
  }
  return OkStatus();
}

Status CheckIntegrity(SqliteDb& db, const std::string& path) {
  KDM_ASSIGN_OR_RETURN(SqliteStatement check, db.Prepare("PRAGMA integrity_check(10)"));
  std::vector<std::string> problems;
  while (true) {
    KDM_ASSIGN_OR_RETURN(bool row, check.Step());
    if (!row) break;
    std::string line = check.ColumnText(0);
    if (line != "ok") problems.push_back(std::move(line));
  }
  if (problems.empty()) return OkStatus();
  std::string message = "integrity check of " + path + " failed:";
  for (const std::string& p : problems) message += " " + p + ";";
  message.pop_back();
  return DataLossError(std::move(message));
}

// The schema version of an open database: 0 for one without tables;
// DATA_LOSS for a foreign database or a version this build cannot read.
StatusOr<int64_t> ReadSchemaVersion(SqliteDb& db, const std::string& path) {
  KDM_ASSIGN_OR_RETURN(SqliteStatement tables,
                       db.Prepare("SELECT name FROM sqlite_schema WHERE type = 'table' "
                                  "ORDER BY name"));
  std::vector<std::string> names;
  while (true) {
    KDM_ASSIGN_OR_RETURN(bool row, tables.Step());
    if (!row) break;
    names.push_back(tables.ColumnText(0));
  }
  if (names.empty()) return int64_t{0};
  if (std::find(names.begin(), names.end(), "schema_version") == names.end()) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    return DataLossError(path +
                         " is not a kdm checkpoint database (no schema_version table; "
                         "tables: " +
                         list + ")");
  }
  KDM_ASSIGN_OR_RETURN(SqliteStatement read,
                       db.Prepare("SELECT version FROM schema_version WHERE id = 1"));
  KDM_ASSIGN_OR_RETURN(bool row, read.Step());
  if (!row || read.ColumnIsNull(0)) {
    return DataLossError(path + " has an empty schema_version table");
  }
  int64_t version = read.ColumnInt64(0);
  if (version > kSqliteSchemaVersion) {
    return DataLossError(path + " has schema version " + std::to_string(version) +
                         ", newer than this kdm supports (" + std::to_string(kSqliteSchemaVersion) +
                         ")");
  }
  if (version < 1) {
    return DataLossError(path + " has an invalid schema version " + std::to_string(version));
  }
  return version;
}

// Checks an existing file on a read-only connection, so that a bad file is
// not modified (no WAL switch, no checkpoint on close) before it is moved
// aside.
Status ValidateExisting(const std::string& path) {
  bool empty = true;
  KDM_RETURN_IF_ERROR(CheckHeader(path, &empty));
  if (empty) return OkStatus();
  KDM_ASSIGN_OR_RETURN(SqliteDb db, SqliteDb::Open(path, /*create=*/false, /*read_only=*/true));
  KDM_RETURN_IF_ERROR(CheckIntegrity(db, path));
  return ReadSchemaVersion(db, path).status();
}

class SqliteStore final : public Store {
 public:
  static StatusOr<std::unique_ptr<SqliteStore>> Open(const SqliteOptions& options);

  StatusOr<CheckpointData> Load() override;
  Status Apply(const Change& change) override;
  Status Replace(const CheckpointData& data) override;
  Status SetBootId(const std::string& boot_id) override;
  std::string Describe() const override { return "sqlite:" + path_; }

 private:
  explicit SqliteStore(std::string path) : path_(std::move(path)) {}
  static StatusOr<std::unique_ptr<SqliteStore>> OpenUnlabelled(const SqliteOptions& options);

  Status Configure(const SqliteOptions& options);
  Status Migrate();
  Status PrepareStatements();
  // Runs `body` inside BEGIN IMMEDIATE ... COMMIT; rolls back on any error.
  template <typename Body>
  Status InTransaction(Body&& body);
  Status Upsert(const PodDevicesEntry& entry);
  Status SetRegistered(const std::string& resource, const std::vector<std::string>& ids);
  Status WriteBootId(const std::string& boot_id);

  std::string path_;
  // Declared before the statements: they are finalized first.
  SqliteDb db_;
  SqliteStatement begin_, commit_, rollback_;
  SqliteStatement delete_pod_, delete_entry_, upsert_entry_;
  SqliteStatement delete_resource_, upsert_resource_;
  SqliteStatement set_meta_, delete_meta_;
  SqliteStatement select_entries_, select_resources_, select_meta_;
  SqliteStatement delete_all_entries_, delete_all_resources_;
};

StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const SqliteOptions& options) {
  StatusOr<std::unique_ptr<SqliteStore>> r = OpenUnlabelled(options);
  if (r.ok() || r.status().message().find(options.path) != std::string::npos) return r;
  return r.status().WithPrefix("checkpoint database " + options.path);
}

StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::OpenUnlabelled(const SqliteOptions& options) {
  if (options.path.empty()) return InvalidArgumentError("empty checkpoint database path");
  if (internal::IsDirectory(*options.env, options.path)) {
    return FailedPreconditionError("checkpoint database " + options.path + " is a directory");
  }
  if (!options.create_if_missing && !internal::PathExists(*options.env, options.path)) {
    return NotFoundError("no checkpoint database at " + options.path);
  }
  KDM_RETURN_IF_ERROR(ValidateExisting(options.path));
  std::unique_ptr<SqliteStore> store(new SqliteStore(options.path));
  KDM_ASSIGN_OR_RETURN(store->db_, SqliteDb::Open(options.path, options.create_if_missing));
  if (sqlite3_db_readonly(store->db_.get(), "main") == 1) {
    return PermissionDeniedError("checkpoint database " + options.path + " is not writable");
  }
  KDM_RETURN_IF_ERROR(store->Configure(options));
  KDM_RETURN_IF_ERROR(store->Migrate());
  KDM_RETURN_IF_ERROR(store->PrepareStatements());
  // Every row must decode: a file that opens but cannot be loaded is as bad
  // as one that does not open.
  StatusOr<CheckpointData> loaded = store->Load();
  if (!loaded.ok()) return loaded.status();
  return store;
}

Status SqliteStore::Configure(const SqliteOptions& options) {
  KDM_ASSIGN_OR_RETURN(SqliteStatement wal, db_.Prepare("PRAGMA journal_mode=WAL"));
  KDM_ASSIGN_OR_RETURN(bool row, wal.Step());
  std::string mode = row ? wal.ColumnText(0) : "";
  if (mode != "wal") {
    return UnavailableError("cannot switch " + path_ + " to WAL journal (journal_mode is \"" +
                            mode + "\")");
  }
  KDM_RETURN_IF_ERROR(
      db_.Exec(options.synchronous_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
  return OkStatus();
}

Status SqliteStore::Migrate() {
  KDM_ASSIGN_OR_RETURN(int64_t version, ReadSchemaVersion(db_, path_));
  for (int64_t v = version; v < kSqliteSchemaVersion; ++v) {
    KDM_RETURN_IF_ERROR(db_.Exec("BEGIN IMMEDIATE"));
    Status s = db_.Exec(kMigrations[v]);
    if (s.ok()) {
      s = db_.Exec("INSERT OR REPLACE INTO schema_version (id, version) VALUES (1, " +
                   std::to_string(v + 1) + ")");
    }
    if (s.ok()) s = db_.Exec("COMMIT");
    if (!s.ok()) {
      (void)db_.Exec("ROLLBACK");
      return s.WithPrefix("migrate " + path_ + " to schema version " + std::to_string(v + 1));
    }
  }
  return OkStatus();
}

Status SqliteStore::PrepareStatements() {
  struct {
    SqliteStatement* stmt;
    const char* sql;
  } const all[] = {
      {&begin_, "BEGIN IMMEDIATE"},
      {&commit_, "COMMIT"},
      {&rollback_, "ROLLBACK"},
      {&delete_pod_, "DELETE FROM pod_devices WHERE pod_uid = ?1"},
      {&delete_entry_,
       "DELETE FROM pod_devices WHERE pod_uid = ?1 AND container_name = ?2 AND "
       "resource_name = ?3"},
      {&upsert_entry_,
       "INSERT OR REPLACE INTO pod_devices (pod_uid, container_name, "
       "resource_name, "
       "device_ids, alloc_response) VALUES (?1, ?2, ?3, ?4, ?5)"},
      {&delete_resource_, "DELETE FROM registered_devices WHERE resource_name = ?1"},
      {&upsert_resource_,
       "INSERT OR REPLACE INTO registered_devices (resource_name, device_ids) "
       "VALUES (?1, ?2)"},
      {&set_meta_, "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)"},
      {&delete_meta_, "DELETE FROM meta WHERE key = ?1"},
      {&select_entries_,
       "SELECT pod_uid, container_name, resource_name, device_ids, "
       "alloc_response "
       "FROM pod_devices ORDER BY pod_uid, container_name, resource_name"},
      {&select_resources_,
       "SELECT resource_name, device_ids FROM registered_devices ORDER BY "
       "resource_name"},
      {&select_meta_, "SELECT value FROM meta WHERE key = ?1"},
      {&delete_all_entries_, "DELETE FROM pod_devices"},
      {&delete_all_resources_, "DELETE FROM registered_devices"},
  };
  for (const auto& [stmt, sql] : all) {
    KDM_ASSIGN_OR_RETURN(*stmt, db_.Prepare(sql));
  }
  return OkStatus();
}

template <typename Body>
Status SqliteStore::InTransaction(Body&& body) {
  KDM_RETURN_IF_ERROR(begin_.Run());
  Status s = body();
  if (s.ok()) s = commit_.Run();
  if (!s.ok()) (void)rollback_.Run();
  return s.WithPrefix("checkpoint " + path_);
}

StatusOr<CheckpointData> SqliteStore::Load() {
  CheckpointData out;
  while (true) {
    StatusOr<bool> row = select_entries_.Step();
    if (!row.ok()) {
      select_entries_.Reset();
      return row.status();
    }
    if (!*row) break;
    PodDevicesEntry e;
    e.pod_uid = select_entries_.ColumnText(0);
    e.container_name = select_entries_.ColumnText(1);
    e.resource_name = select_entries_.ColumnText(2);
    StatusOr<DevicesPerNuma> ids = DecodeDevicesPerNuma(select_entries_.ColumnText(3));
    if (!ids.ok()) {
      select_entries_.Reset();
      return ids.status().WithPrefix(path_ + ": pod_devices row (" + e.pod_uid + ", " +
                                     e.container_name + ", " + e.resource_name + ")");
    }
    e.device_ids = std::move(*ids);
    e.alloc_response = select_entries_.ColumnBlob(4);
    out.entries.push_back(std::move(e));
  }
  select_entries_.Reset();
  while (true) {
    StatusOr<bool> row = select_resources_.Step();
    if (!row.ok()) {
      select_resources_.Reset();
      return row.status();
    }
    if (!*row) break;
    std::string resource = select_resources_.ColumnText(0);
    nlohmann::json j =
        nlohmann::json::parse(select_resources_.ColumnText(1), nullptr, /*allow_exceptions=*/false);
    StatusOr<std::vector<std::string>> ids = DecodeIds(j);
    if (!ids.ok()) {
      select_resources_.Reset();
      return ids.status().WithPrefix(path_ + ": registered_devices row " + resource);
    }
    out.registered_devices[resource] = std::move(*ids);
  }
  select_resources_.Reset();
  KDM_RETURN_IF_ERROR(select_meta_.BindText(1, kBootIdKey));
  StatusOr<bool> row = select_meta_.Step();
  if (row.ok() && *row) out.boot_id = select_meta_.ColumnText(0);
  select_meta_.Reset();
  if (!row.ok()) return row.status();
  return out;
}

Status SqliteStore::Upsert(const PodDevicesEntry& entry) {
  KDM_RETURN_IF_ERROR(upsert_entry_.BindText(1, entry.pod_uid));
  KDM_RETURN_IF_ERROR(upsert_entry_.BindText(2, entry.container_name));
  KDM_RETURN_IF_ERROR(upsert_entry_.BindText(3, entry.resource_name));
  KDM_RETURN_IF_ERROR(upsert_entry_.BindText(4, EncodeDevicesPerNuma(entry.device_ids)));
  KDM_RETURN_IF_ERROR(upsert_entry_.BindBlob(5, entry.alloc_response));
  return upsert_entry_.Run();
}

Status SqliteStore::SetRegistered(const std::string& resource,
                                  const std::vector<std::string>& ids) {
  KDM_RETURN_IF_ERROR(upsert_resource_.BindText(1, resource));
  KDM_RETURN_IF_ERROR(upsert_resource_.BindText(2, EncodeIds(ids)));
  return upsert_resource_.Run();
}

Status SqliteStore::WriteBootId(const std::string& boot_id) {
  if (boot_id.empty()) {
    KDM_RETURN_IF_ERROR(delete_meta_.BindText(1, kBootIdKey));
    return delete_meta_.Run();
  }
  KDM_RETURN_IF_ERROR(set_meta_.BindText(1, kBootIdKey));
  KDM_RETURN_IF_ERROR(set_meta_.BindText(2, boot_id));
  return set_meta_.Run();
}

Status SqliteStore::Apply(const Change& change) {
  if (change.empty()) return OkStatus();
  return InTransaction([&]() -> Status {
    for (const std::string& uid : change.removed_pods) {
      KDM_RETURN_IF_ERROR(delete_pod_.BindText(1, uid));
      KDM_RETURN_IF_ERROR(delete_pod_.Run());
    }
    for (const ContainerKey& key : change.removals) {
      KDM_RETURN_IF_ERROR(delete_entry_.BindText(1, key.pod_uid));
      KDM_RETURN_IF_ERROR(delete_entry_.BindText(2, key.container_name));
      KDM_RETURN_IF_ERROR(delete_entry_.BindText(3, key.resource_name));
      KDM_RETURN_IF_ERROR(delete_entry_.Run());
    }
    for (const PodDevicesEntry& entry : change.upserts) KDM_RETURN_IF_ERROR(Upsert(entry));
    for (const std::string& resource : change.removed_resources) {
      KDM_RETURN_IF_ERROR(delete_resource_.BindText(1, resource));
      KDM_RETURN_IF_ERROR(delete_resource_.Run());
    }
    for (const auto& [resource, ids] : change.registered_devices) {
      KDM_RETURN_IF_ERROR(SetRegistered(resource, ids));
    }
    return OkStatus();
  });
}

Status SqliteStore::Replace(const CheckpointData& data) {
  return InTransaction([&]() -> Status {
    KDM_RETURN_IF_ERROR(delete_all_entries_.Run());
    KDM_RETURN_IF_ERROR(delete_all_resources_.Run());
    // INSERT OR REPLACE: of repeated keys the last one wins.
    for (const PodDevicesEntry& entry : data.entries) KDM_RETURN_IF_ERROR(Upsert(entry));
    for (const auto& [resource, ids] : data.registered_devices) {
      KDM_RETURN_IF_ERROR(SetRegistered(resource, ids));
    }
    return WriteBootId(data.boot_id);
  });
}

Status SqliteStore::SetBootId(const std::string& boot_id) {
  return InTransaction([&] { return WriteBootId(boot_id); });
}

}  // namespace

StatusOr<OpenResult> OpenSqliteStore(const SqliteOptions& options) {
  StatusOr<std::unique_ptr<SqliteStore>> opened = SqliteStore::Open(options);
  if (opened.ok()) return OpenResult{std::move(*opened), OkStatus(), "", {}};
  if (opened.status().code() != StatusCode::kDataLoss || !options.quarantine_corrupt) {
    return opened.status();
  }
  // The failed attempt's connection is closed by now (the store was
  // destroyed), so the files can be moved.
  Status why = opened.status();
  KDM_ASSIGN_OR_RETURN(std::string moved, internal::QuarantineFile(*options.env, options.path,
                                                                   {"-wal", "-shm", "-journal"}));
  SqliteOptions fresh = options;
  fresh.create_if_missing = true;
  StatusOr<std::unique_ptr<SqliteStore>> reopened = SqliteStore::Open(fresh);
  if (!reopened.ok()) {
    return reopened.status().WithPrefix("after moving corrupt " + options.path + " to " + moved);
  }
  return OpenResult{std::move(*reopened),
                    DataLossError(why.message() + "; moved aside to " + moved +
                                  ", starting with an empty checkpoint"),
                    moved,
                    {}};
}

}  // namespace kdm::checkpoint
