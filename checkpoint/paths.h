// Where an agent keeps its checkpoint under its root directory, and opening
// the right store for a root:
//   <root>/state/checkpoint.db                 kind "sqlite" (the default)
//   <root>/state/kubelet_internal_checkpoint   kind "kubelet-json"
//
// Thread-safety: pure functions, except OpenStoreForRoot (file system).
//
// Example:
//   KDM_ASSIGN_OR_RETURN(StoreKind kind, ParseStoreKind(flag));
//   KDM_ASSIGN_OR_RETURN(OpenResult opened,
//                        OpenStoreForRoot("/var/lib/kdm", kind));
#ifndef KDM_CHECKPOINT_PATHS_H_
#define KDM_CHECKPOINT_PATHS_H_

#include <string>
#include <string_view>

#include "kdm/base/env.h"
#include "kdm/base/status.h"
#include "kdm/checkpoint/store.h"

namespace kdm::checkpoint {

enum class StoreKind { kSqlite, kKubeletJson };

inline constexpr char kStateDirName[] = "state";
inline constexpr char kSqliteFileName[] = "checkpoint.db";
inline constexpr char kKubeletCheckpointFileName[] = "kubelet_internal_checkpoint";

// "sqlite" or "kubelet-json"; INVALID_ARGUMENT naming the choices otherwise.
StatusOr<StoreKind> ParseStoreKind(std::string_view name);
std::string_view StoreKindName(StoreKind kind);

// <root>/state
std::string StateDir(const std::string& root);
// The checkpoint file of `kind` under `root`.
std::string CheckpointPath(const std::string& root, StoreKind kind);

struct RootOpenOptions {
  // Create <root>/state and an empty store when missing (else NOT_FOUND).
  bool create_if_missing = true;
  // Move a bad file aside and start empty (else return its error).
  bool quarantine_corrupt = true;
  // SQLite only: synchronous=FULL.
  bool synchronous_full = true;
  // The OS seam, handed to the store's options. Not owned.
  Env* env = Env::Default();
};

// Opens the store of `kind` under `root` (see OpenSqliteStore and
// OpenKubeletJsonStore for errors and recovery).
StatusOr<OpenResult> OpenStoreForRoot(const std::string& root, StoreKind kind,
                                      const RootOpenOptions& options = {});

}  // namespace kdm::checkpoint

#endif  // KDM_CHECKPOINT_PATHS_H_
