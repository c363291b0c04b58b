#include "kdm/checkpoint/paths.h"

#include "kdm/base/env.h"
#include "kdm/checkpoint/kubelet_json_store.h"
#include "kdm/checkpoint/quarantine.h"
#include "kdm/checkpoint/sqlite_store.h"

namespace kdm::checkpoint {

StatusOr<StoreKind> ParseStoreKind(std::string_view name) {
  if (name == "sqlite") return StoreKind::kSqlite;
  if (name == "kubelet-json") return StoreKind::kKubeletJson;
  return InvalidArgumentError("unknown checkpoint kind \"" + std::string(name) +
                              "\" (want sqlite or kubelet-json)");
}

std::string_view StoreKindName(StoreKind kind) {
  return kind == StoreKind::kSqlite ? "sqlite" : "kubelet-json";
}

std::string StateDir(const std::string& root) {
  if (!root.empty() && root.back() == '/') return root + kStateDirName;
  return root + "/" + kStateDirName;
}

std::string CheckpointPath(const std::string& root, StoreKind kind) {
  return StateDir(root) + "/" +
         (kind == StoreKind::kSqlite ? kSqliteFileName : kKubeletCheckpointFileName);
}

StatusOr<OpenResult> OpenStoreForRoot(const std::string& root, StoreKind kind,
                                      const RootOpenOptions& options) {
  if (root.empty()) return InvalidArgumentError("empty root directory");
  const std::string path = CheckpointPath(root, kind);
  if (options.create_if_missing) {
    KDM_RETURN_IF_ERROR(options.env->CreateDirectories(StateDir(root), 0755));
  } else if (!internal::PathExists(*options.env, path)) {
    return NotFoundError("no " + std::string(StoreKindName(kind)) + " checkpoint at " + path);
  }
  if (kind == StoreKind::kSqlite) {
    return OpenSqliteStore({.path = path,
                            .synchronous_full = options.synchronous_full,
                            .create_if_missing = options.create_if_missing,
                            .quarantine_corrupt = options.quarantine_corrupt,
                            .env = options.env});
  }
  return OpenKubeletJsonStore(KubeletJsonOptions{.path = path,
                                                 .create_if_missing = options.create_if_missing,
                                                 .quarantine_corrupt = options.quarantine_corrupt,
                                                 .env = options.env});
}

}  // namespace kdm::checkpoint
