// kdm::conformance validators: the pure rules the checks of `kdm conform`
// apply to what a device plugin answers (docs/wire-contract.md#field-rules,
// docs/kubelet-rules.md, docs/promises.md#validated-preferred-answers).
//
// Each returns OK, or INVALID_ARGUMENT whose message says what was wrong
// and quotes the offending value (the reason printed next to FAIL).
// Registration rules (API version, extended resource name, endpoint) are
// not here: the checks use the wire layer's (pluginapi/api_rules.h), the
// ones the device manager applies.
//
// Thread-safety: free functions without state; safe from any thread.
//
// Example:
//   if (Status s = CheckPermissions(spec.permissions()); !s.ok()) Fail(s.message());
#ifndef KDM_CONFORMANCE_VALIDATORS_H_
#define KDM_CONFORMANCE_VALIDATORS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::conformance {

// The ids of one ListAndWatch message: each non-empty, at most
// pluginapi::kMaxDeviceIdLength (63, the API's documented limit) bytes,
// none listed twice.
Status CheckDeviceIds(const std::vector<std::string>& ids);

// Exactly "Healthy" or "Unhealthy".
Status CheckHealth(std::string_view health);

// A NUMA node id >= 0.
Status CheckNumaNode(int64_t node);

// An absolute path ('/' first) without a ".." component. `what` names the
// field in the message, e.g. "device spec host_path".
Status CheckAbsolutePath(std::string_view path, std::string_view what);

// Cgroup device permissions: non-empty, only 'r', 'w', 'm', none twice.
Status CheckPermissions(std::string_view permissions);

// A Kubernetes env var name: [-._a-zA-Z][-._a-zA-Z0-9]*.
Status CheckEnvName(std::string_view name);

// A fully qualified CDI device name "vendor/class=name": vendor a DNS-like
// name (dot-separated labels of [A-Za-z0-9-], each starting and ending with
// a letter or digit), class [A-Za-z0-9][A-Za-z0-9_.-]*, name non-empty
// [A-Za-z0-9_.:-]+.
Status CheckCdiName(std::string_view name);

}  // namespace kdm::conformance

#endif  // KDM_CONFORMANCE_VALIDATORS_H_
