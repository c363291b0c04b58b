// The SQLite checkpoint store, kdm's default: one database file, one
// transaction per Change, touching only the rows the Change names, so the
// cost of an allocation change does not grow with the number of pods.
//
// Durability: WAL journal and, by default, synchronous=FULL: once Apply()
// returned OK the change survives a kill -9 or a power cut; a change whose
// Apply() did not return is either wholly there or wholly absent.
//
// Opening: the schema version is checked (older schemas are migrated
// forward), `PRAGMA integrity_check` must pass and every row must decode. A
// file that fails any of these (corrupt, truncated, not SQLite, a newer
// schema, a foreign database) is moved aside to
// "<path>.corrupt-<UTC yyyymmddThhmmssZ>" (with its -wal and -shm), never
// deleted, and a fresh empty store is returned with the reason in
// OpenResult::recovered. Errors that say nothing about the file's content
// (directory not writable, file locked, disk full) are returned as errors.
//
// Thread-safety: a store is not thread-safe (see Store). Several processes
// may open the same file; SQLite serialises their writes.
//
// Example:
//   SqliteOptions options{.path = "/var/lib/kdm/state/checkpoint.db"};
//   KDM_ASSIGN_OR_RETURN(OpenResult opened, OpenSqliteStore(options));
//   if (!opened.recovered.ok()) LOG(WARNING) << opened.recovered;
//   KDM_RETURN_IF_ERROR(opened.store->Apply(change));
#ifndef KDM_CHECKPOINT_SQLITE_STORE_H_
#define KDM_CHECKPOINT_SQLITE_STORE_H_

#include <string>

#include "kdm/base/env.h"
#include "kdm/base/status.h"
#include "kdm/checkpoint/store.h"

namespace kdm::checkpoint {

struct SqliteOptions {
  // The database file; its directory must exist.
  std::string path;
  // synchronous=FULL (true) or NORMAL (false: a power cut may lose the last
  // changes, never consistency).
  bool synchronous_full = true;
  // Create the file when missing (else NOT_FOUND).
  bool create_if_missing = true;
  // Move a bad file aside and start empty (else return DATA_LOSS and leave
  // the file where it is, e.g. for a read-only `kdm checkpoint show`).
  bool quarantine_corrupt = true;
  // The OS seam of the checks around the file (is it there, is it a
  // directory) and of its quarantine; SQLite itself reads and writes the
  // real file. Not owned; must outlive the call.
  Env* env = Env::Default();
};

// The schema version this build writes; a file with a higher version is
// treated as unreadable.
inline constexpr int kSqliteSchemaVersion = 1;

// Opens the store (see the header comment for what happens to a bad file).
// Errors: NOT_FOUND (missing and !create_if_missing), FAILED_PRECONDITION
// (path is a directory), PERMISSION_DENIED (not writable), UNAVAILABLE
// (cannot open, locked, I/O error), DATA_LOSS (bad file and
// !quarantine_corrupt).
StatusOr<OpenResult> OpenSqliteStore(const SqliteOptions& options);

}  // namespace kdm::checkpoint

#endif  // KDM_CHECKPOINT_SQLITE_STORE_H_
