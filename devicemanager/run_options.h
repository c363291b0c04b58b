// kdm::devicemanager::MergeRunOptions: how the allocate responses of every
// device resource of one container become the container's run options
// (RunContainerOptions, manager.h). Private header (not installed).
//
// The Manager calls it from GetContainerAllocation with the responses its
// checkpoint recorded; it is pure so that every rule below is tested on its
// own (test/devicemanager/run_options_test.cc).
//
// The rules (docs/kubelet-rules.md#run-options):
//   - resources are merged in resource-name order, whatever order they come in;
//   - envs by name and annotations by key: the first resource's value is
//     kept; a different value from a later one is a conflict, the same value
//     is not;
//   - mounts and device specs by container path, the same way (a conflict
//     when any field differs); the result is sorted by container path;
//   - CDI devices de-duplicated by name, in merge order (never a conflict).
// Each conflict is one line in RunContainerOptions::conflicts, e.g.
// `env "X": vendor.com/b's value ignored, vendor.com/a's kept`.
//
// Thread-safety: a pure function.
//
// Example:
//   std::vector<RunOptionsConflict> conflicts;
//   RunContainerOptions run = MergeRunOptions(
//       {{"vendor.com/gpu", gpu_response}, {"vendor.com/nic", nic_response}}, &conflicts);
#ifndef KDM_DEVICEMANAGER_RUN_OPTIONS_H_
#define KDM_DEVICEMANAGER_RUN_OPTIONS_H_

#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"
#include "kdm/devicemanager/manager.h"

namespace kdm::devicemanager {

// One resource's allocate response for the container.
struct ResourceRunOptions {
  std::string resource_name;
  v1beta1::ContainerAllocateResponse response;
};

// One value two resources set differently, for the caller's log: `what`
// (e.g. `env "X"`), the resource whose value was kept and the one ignored.
struct RunOptionsConflict {
  std::string what;
  std::string kept_by;
  std::string ignored_from;
  friend bool operator==(const RunOptionsConflict&, const RunOptionsConflict&) = default;
};

// The merged run options of `responses` (rules above). When `conflicts` is
// not null, each conflict is also appended there, in the order of
// RunContainerOptions::conflicts.
RunContainerOptions MergeRunOptions(std::vector<ResourceRunOptions> responses,
                                    std::vector<RunOptionsConflict>* conflicts = nullptr);

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_RUN_OPTIONS_H_
