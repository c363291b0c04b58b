// Constants of the device plugin API v1beta1 (docs/wire-contract.md#constants)
// shared by the kubelet side (devicemanager) and the plugin side (sdk).
//
// Thread-safety: constants only.
#ifndef KDM_PLUGINAPI_CONSTANTS_H_
#define KDM_PLUGINAPI_CONSTANTS_H_

#include <chrono>
#include <cstddef>
#include <string_view>

namespace kdm::pluginapi {

// The only API version a kubelet (and kdm) accepts in RegisterRequest.version.
inline constexpr std::string_view kVersion = "v1beta1";

// Directory where plugins put their sockets and the kubelet serves Registration.
inline constexpr std::string_view kDevicePluginPath = "/var/lib/kubelet/device-plugins/";
// File name of the registration socket inside the device-plugin directory.
inline constexpr std::string_view kKubeletSocketName = "kubelet.sock";

// Device.health values. Anything but kHealthy counts as unhealthy.
inline constexpr std::string_view kHealthy = "Healthy";
inline constexpr std::string_view kUnhealthy = "Unhealthy";

// Deadline the kubelet gives PreStartContainer (the default of
// Manager::Options::pre_start_timeout and of the fake kubelet's).
inline constexpr std::chrono::seconds kPreStartContainerTimeout{30};
// Deadline the kubelet gives dialing a plugin after Register (the default of
// Manager::Options::registration_timeout, each registration step's).
inline constexpr std::chrono::seconds kDialTimeout{10};

// Usable bytes of sockaddr_un.sun_path for a path (one byte is the NUL).
inline constexpr std::size_t kMaxUnixSocketPathLength = 107;

}  // namespace kdm::pluginapi

#endif  // KDM_PLUGINAPI_CONSTANTS_H_
