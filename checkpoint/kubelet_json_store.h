// A Store backed by one file in the kubelet's own `kubelet_internal_checkpoint`
// format (see kubelet_json.h): what a real kubelet reads and writes.
//
// Every Apply() rewrites the whole file (temporary file, fsync, rename,
// fsync of the directory), so its cost grows with the number of pods; it
// exists for moving between kdm and a kubelet and as the benchmark's
// baseline. The format has no boot id: SetBootId() keeps it in a small
// sidecar file "<path>.boot-id" (written the same atomic way).
//
// Opening: temporary files a killed writer left beside the file
// ("<path>.tmp-<pid>", "<path>.boot-id.tmp-<pid>", the pid no longer
// running) are removed and listed in OpenResult::removed_temp_files. A
// missing file is an empty state. A file that does not decode or
// whose checksum does not verify is moved aside to
// "<path>.corrupt-<UTC yyyymmddThhmmssZ>" (never deleted) and a fresh, empty
// store is returned with the reason in OpenResult::recovered. Errors that
// say nothing about the content (unreadable, a directory) are returned.
//
// Thread-safety: not thread-safe (see Store). One writer process per file.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(OpenResult opened,
//                        OpenKubeletJsonStore("/var/lib/kubelet/device-plugins/"
//                                             "kubelet_internal_checkpoint"));
//   KDM_RETURN_IF_ERROR(opened.store->Apply(change));
#ifndef KDM_CHECKPOINT_KUBELET_JSON_STORE_H_
#define KDM_CHECKPOINT_KUBELET_JSON_STORE_H_

#include <string>

#include "kdm/base/env.h"
#include "kdm/base/status.h"
#include "kdm/checkpoint/store.h"

namespace kdm::checkpoint {

struct KubeletJsonOptions {
  // The checkpoint file; its directory must exist.
  std::string path;
  // A missing file is an empty state (else NOT_FOUND).
  bool create_if_missing = true;
  // Move a bad file aside and start empty (else return its error and leave
  // the file where it is).
  bool quarantine_corrupt = true;
  // The OS seam: every read, write, cleanup and quarantine of the file and
  // its boot id sidecar (an in-memory Env works). Not owned; must outlive
  // the store.
  Env* env = Env::Default();
};

// Opens the store. Errors: NOT_FOUND (missing and !create_if_missing),
// FAILED_PRECONDITION (path is a directory), PERMISSION_DENIED/UNAVAILABLE
// (cannot read), and, with !quarantine_corrupt, the decode error.
StatusOr<OpenResult> OpenKubeletJsonStore(const KubeletJsonOptions& options);

// Same, with default options.
StatusOr<OpenResult> OpenKubeletJsonStore(const std::string& path);

// Reads and decodes one kubelet checkpoint file (e.g. for import), verifying
// its checksum unless told not to. Errors name the file: NOT_FOUND,
// FAILED_PRECONDITION (not a regular file), INVALID_ARGUMENT (bad content),
// DATA_LOSS (checksum mismatch). Entries keep file order.
StatusOr<CheckpointData> ReadKubeletCheckpointFile(const std::string& path,
                                                   bool verify_checksum = true,
                                                   Env* env = Env::Default());

// Writes `data` as a kubelet checkpoint file atomically (temporary file,
// fsync, rename, fsync of the directory). On error `path` is unchanged.
Status WriteKubeletCheckpointFile(const std::string& path, const CheckpointData& data,
                                  Env* env = Env::Default());

}  // namespace kdm::checkpoint

#endif  // KDM_CHECKPOINT_KUBELET_JSON_STORE_H_
