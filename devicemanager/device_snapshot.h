// kdm::devicemanager::ToLedgerDevices: how one ListAndWatch message becomes
// the Ledger's device snapshot. Private header (not installed).
//
// The Manager applies every ListAndWatchResponse it gets with
// ledger.SetDevices(resource, ToLedgerDevices(response)); the ListAndWatch
// fuzzer (fuzz/listandwatch_fuzzer.cc) drives the very same pair.
//
// Thread-safety: a pure function.
//
// Example:
//   StatusOr<SnapshotReport> r =
//       ledger.SetDevices("vendor.com/gpu", ToLedgerDevices(response));
#ifndef KDM_DEVICEMANAGER_DEVICE_SNAPSHOT_H_
#define KDM_DEVICEMANAGER_DEVICE_SNAPSHOT_H_

#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"
#include "kdm/devicemanager/ledger.h"

namespace kdm::devicemanager {

// One LedgerDevice per device of `response`, in order: the id as sent,
// healthy exactly when health is "Healthy", the NUMA node ids of its
// topology (none when it has no topology). Never fails: the Ledger decides
// what to do with empty, duplicate or negative values.
std::vector<LedgerDevice> ToLedgerDevices(const v1beta1::ListAndWatchResponse& response);

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_DEVICE_SNAPSHOT_H_
