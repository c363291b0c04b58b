// Private to kdm::checkpoint: a small RAII wrapper over the SQLite C API
// (sqlite3 and sqlite3_stmt), returning kdm::Status instead of result codes.
//
// Error codes: SQLITE_CORRUPT and SQLITE_NOTADB become DATA_LOSS (the file is
// bad: quarantine it); SQLITE_CANTOPEN, SQLITE_PERM and SQLITE_READONLY
// PERMISSION_DENIED or UNAVAILABLE; SQLITE_BUSY/LOCKED UNAVAILABLE;
// SQLITE_FULL RESOURCE_EXHAUSTED; anything else INTERNAL.
//
// Thread-safety: not thread-safe; one owner per connection.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(SqliteDb db, SqliteDb::Open(path, /*create=*/true));
//   KDM_ASSIGN_OR_RETURN(SqliteStatement st, db.Prepare("SELECT 1"));
//   KDM_ASSIGN_OR_RETURN(bool row, st.Step());
#ifndef KDM_CHECKPOINT_SQLITE_DB_H_
#define KDM_CHECKPOINT_SQLITE_DB_H_

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kdm/base/status.h"

namespace kdm::checkpoint::internal {

// Maps a SQLite result code to a Status naming `what` and SQLite's message.
Status SqliteError(sqlite3* db, int rc, std::string_view what);

class SqliteStatement {
 public:
  SqliteStatement() = default;

  Status BindText(int index, std::string_view value);
  Status BindBlob(int index, std::string_view value);
  Status BindInt64(int index, int64_t value);

  // Runs one step: true when a row is available, false when done.
  StatusOr<bool> Step();
  // Runs to completion, ignoring rows, then resets the statement (bindings
  // are cleared).
  Status Run();
  // Resets for re-execution and clears bindings.
  void Reset();

  int ColumnCount() const;
  bool ColumnIsNull(int index) const;
  int64_t ColumnInt64(int index) const;
  std::string ColumnText(int index) const;
  std::string ColumnBlob(int index) const;

 private:
  friend class SqliteDb;
  struct Finalizer {
    void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
  };
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}

  sqlite3* db_ = nullptr;
  std::unique_ptr<sqlite3_stmt, Finalizer> stmt_;
};

class SqliteDb {
 public:
  SqliteDb() = default;

  // Opens (or, with `create`, creates) the database file at `path`;
  // `read_only` opens it for reading only (never with `create`).
  static StatusOr<SqliteDb> Open(const std::string& path, bool create, bool read_only = false);

  // Runs one or more statements without results.
  Status Exec(std::string_view sql);
  StatusOr<SqliteStatement> Prepare(std::string_view sql);

  // Closes the connection now (statements must be gone). Idempotent.
  void Close();

  sqlite3* get() const { return db_.get(); }

 private:
  struct Closer {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  std::unique_ptr<sqlite3, Closer> db_;
};

}  // namespace kdm::checkpoint::internal

#endif  // KDM_CHECKPOINT_SQLITE_DB_H_
