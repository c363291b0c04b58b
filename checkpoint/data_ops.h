// Private to kdm::checkpoint: the Change semantics on a plain CheckpointData
// value, shared by the in-memory and the kubelet JSON file stores (the
// SQLite store applies the same rules row by row).
//
// Thread-safety: pure functions.
//
// Example:
//   CheckpointData next = current;
//   ApplyChange(next, change);
#ifndef KDM_CHECKPOINT_DATA_OPS_H_
#define KDM_CHECKPOINT_DATA_OPS_H_

#include "kdm/checkpoint/store.h"

namespace kdm::checkpoint::internal {

// Applies `change` in the documented order (removed_pods, removals, upserts,
// removed_resources, registered_devices).
void ApplyChange(CheckpointData& data, const Change& change);

// Sorts entries by key; of entries with the same key the last one wins (as
// when the kubelet reads a file that repeats a key).
void NormalizeEntries(CheckpointData& data);

}  // namespace kdm::checkpoint::internal

#endif  // KDM_CHECKPOINT_DATA_OPS_H_
