#include "kdm/checkpoint/sqlite_db.h"

#include <utility>

namespace kdm::checkpoint::internal {

Status SqliteError(sqlite3* db, int rc, std::string_view what) {
  std::string message = std::string(what) + ": " + sqlite3_errstr(rc);
  if (db != nullptr) {
    const char* detail = sqlite3_errmsg(db);
    if (detail != nullptr && message.find(detail) == std::string::npos) {
      message += " (" + std::string(detail) + ")";
    }
  }
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return DataLossError(std::move(message));
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_AUTH:
      return PermissionDeniedError(std::move(message));
    case SQLITE_CANTOPEN:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_PROTOCOL:
      return UnavailableError(std::move(message));
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return ResourceExhaustedError(std::move(message));
    default:
      return InternalError(std::move(message));
  }
}

Status SqliteStatement::BindText(int index, std::string_view value) {
  int rc = sqlite3_bind_text64(stmt_.get(), index, value.data(), value.size(), SQLITE_TRANSIENT,
                               SQLITE_UTF8);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "bind");
  return OkStatus();
}

Status SqliteStatement::BindBlob(int index, std::string_view value) {
  // A zero-length blob must still be a blob, not NULL: give SQLite a valid
  // pointer.
  static const char kEmpty = 0;
  const char* data = value.empty() ? &kEmpty : value.data();
  int rc = sqlite3_bind_blob64(stmt_.get(), index, data, value.size(), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "bind");
  return OkStatus();
}

Status SqliteStatement::BindInt64(int index, int64_t value) {
  int rc = sqlite3_bind_int64(stmt_.get(), index, value);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "bind");
  return OkStatus();
}

StatusOr<bool> SqliteStatement::Step() {
  int rc = sqlite3_step(stmt_.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  Status s = SqliteError(db_, rc, std::string("step \"") + sqlite3_sql(stmt_.get()) + "\"");
  sqlite3_reset(stmt_.get());
  return s;
}

Status SqliteStatement::Run() {
  while (true) {
    StatusOr<bool> row = Step();
    if (!row.ok()) {
      Reset();
      return row.status();
    }
    if (!*row) break;
  }
  Reset();
  return OkStatus();
}

void SqliteStatement::Reset() {
  sqlite3_reset(stmt_.get());
  sqlite3_clear_bindings(stmt_.get());
}

int SqliteStatement::ColumnCount() const { return sqlite3_column_count(stmt_.get()); }

bool SqliteStatement::ColumnIsNull(int index) const {
  return sqlite3_column_type(stmt_.get(), index) == SQLITE_NULL;
}

int64_t SqliteStatement::ColumnInt64(int index) const {
  return sqlite3_column_int64(stmt_.get(), index);
}

std::string SqliteStatement::ColumnText(int index) const {
  const unsigned char* p = sqlite3_column_text(stmt_.get(), index);
  int n = sqlite3_column_bytes(stmt_.get(), index);
  if (p == nullptr) return {};
  return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
}

std::string SqliteStatement::ColumnBlob(int index) const {
  const void* p = sqlite3_column_blob(stmt_.get(), index);
  int n = sqlite3_column_bytes(stmt_.get(), index);
  if (p == nullptr) return {};
  return std::string(static_cast<const char*>(p), static_cast<size_t>(n));
}

StatusOr<SqliteDb> SqliteDb::Open(const std::string& path, bool create, bool read_only) {
  sqlite3* raw = nullptr;
  int flags = SQLITE_OPEN_NOMUTEX;
  if (read_only) {
    flags |= SQLITE_OPEN_READONLY;
  } else {
    flags |= SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
  }
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  SqliteDb db;
  db.db_.reset(raw);
  if (rc != SQLITE_OK) return SqliteError(raw, rc, "open " + path);
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, 5000);
  return db;
}

Status SqliteDb::Exec(std::string_view sql) {
  std::string owned(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_.get(), owned.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string detail = err != nullptr ? err : "";
    sqlite3_free(err);
    Status s = SqliteError(nullptr, rc, "\"" + owned + "\"");
    return Status(s.code(), s.message() + (detail.empty() ? "" : " (" + detail + ")"));
  }
  return OkStatus();
}

StatusOr<SqliteStatement> SqliteDb::Prepare(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db_.get(), sql.data(), static_cast<int>(sql.size()),
                              SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return SqliteError(db_.get(), rc, "prepare \"" + std::string(sql) + "\"");
  }
  return SqliteStatement(db_.get(), stmt);
}

void SqliteDb::Close() { db_.reset(); }

}  // namespace kdm::checkpoint::internal
