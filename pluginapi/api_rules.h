// The rules of the device plugin API v1beta1, in one place: the API version,
// the resource name check (on k8s/names.h's rule), the plugin endpoint (socket file name) and the
// device id length. The kubelet side (registration in devicemanager, the
// fake kubelet's pod manifests and flags in fakes, `kdm conform`) and the
// plugin side (the SDK, `kdm plugin`) all call these, so that no two parts
// of kdm can disagree on what is valid. Error texts that the kubelet itself
// sends (version, resource name) are the kubelet's, word for word.
//
// Thread-safety: free functions without shared state; safe from any thread.
// CheckPluginEndpoint reads the filesystem (lstat), nothing else does I/O.
//
// Example:
//   KDM_RETURN_IF_ERROR(kdm::pluginapi::ValidateVersion(request.version()));
//   KDM_RETURN_IF_ERROR(kdm::pluginapi::ValidateResourceName(request.resource_name()));
//   KDM_ASSIGN_OR_RETURN(std::string socket,
//                        kdm::pluginapi::CheckPluginEndpoint(dir, request.endpoint()));
#ifndef KDM_PLUGINAPI_API_RULES_H_
#define KDM_PLUGINAPI_API_RULES_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "kdm/base/status.h"

namespace kdm::pluginapi {

// --- API version ------------------------------------------------------------

// OK for pluginapi::kVersion ("v1beta1"); else INVALID_ARGUMENT with the
// kubelet's text: `requested API version "<v>" is not supported by kubelet.
// Supported version is "v1beta1"`.
Status ValidateVersion(std::string_view version);

// --- Kubernetes names -------------------------------------------------------

// OK when k8s::IsExtendedResourceName(name) (kdm/k8s/names.h, the home of
// the Kubernetes name rules); else INVALID_ARGUMENT with the
// kubelet's text: `the ResourceName "<name>" is invalid`.
Status ValidateResourceName(std::string_view name);

// --- Plugin endpoint --------------------------------------------------------

// Longest plugin socket file name (NAME_MAX).
inline constexpr std::size_t kMaxEndpointNameLength = 255;

// The rules for RegisterRequest.endpoint that need no filesystem: a plain
// file name, not empty, no '/', no NUL, not ".", no "..", at most
// kMaxEndpointNameLength bytes. A plugin choosing its socket name (the SDK,
// `kdm plugin --socket-name`) checks the same rules the kubelet side does.
// On failure INVALID_ARGUMENT `invalid endpoint "<shown>": <why>`, where
// <shown> is the name with NUL bytes written "\0" and cut to 64 bytes
// ("..." appended when cut).
Status CheckEndpointName(std::string_view endpoint);

// The kubelet side's whole endpoint check: CheckEndpointName,
// then dir + "/" + endpoint, made absolute, must fit a unix socket path and
// name an existing unix socket directly inside `dir`. A symlink is refused
// whatever it points to (checked with lstat), and so is a directory, a
// regular file, a FIFO or a device. Returns the socket's absolute path;
// errors as CheckEndpointName's (`invalid endpoint "<shown>": <why>`):
// NOT_FOUND when no such name exists in `dir`, INVALID_ARGUMENT otherwise.
StatusOr<std::string> CheckPluginEndpoint(const std::string& dir, std::string_view endpoint);

// --- Devices ----------------------------------------------------------------

// Longest device id (Device.ID), as the API documents it: Kubernetes'
// v1beta1 api.proto says of Device.ID "Max length of this field is 63
// characters". That is the contract a plugin is written against, so it is
// the rule here, and `kdm conform` holds plugins to it (check lw.ids). The
// kubelet itself never enforces it, so kdm's device manager, which must
// accept every plugin a kubelet accepts, refuses only ids beyond its own
// memory bound (devicemanager's SnapshotLimits::max_id_bytes, 253 bytes),
// not beyond this.
inline constexpr std::size_t kMaxDeviceIdLength = 63;

}  // namespace kdm::pluginapi

#endif  // KDM_PLUGINAPI_API_RULES_H_
