// kdm::k8s::DeviceAttributes: what a node knows about a resource's devices
// (all of them alike), the one typed struct NVML discovery fills, `kdm
// publish` and `kdm kubelet --attributes` read, the kdm.io/devices annotation
// carries and NVIDIA_REQUIRE_* checks compare against
// (docs/kubernetes-rules.md, "Device attributes"). The key names are defined
// here once.
//
// Values: cuda, driver and arch are versions (digits and dots); brand a name
// of [A-Za-z0-9._-]; model printable ASCII (the annotation also accepts a
// model in any UTF-8 from another writer); each at most kMaxAttributeBytes.
// memory_mib is a whole number of MiB.
//
// Thread-safety: values and pure functions; safe from any thread.
//
// Example:
//   kdm::StatusOr<DeviceAttributes> a = ParseAttributes("cuda=12.4,brand=tesla");
//   DeviceAttributes b;
//   KDM_RETURN_IF_ERROR(b.Set(kAttrDriver, "550.54.15"));  // checked
#ifndef KDM_K8S_ATTRIBUTES_H_
#define KDM_K8S_ATTRIBUTES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kdm/base/status.h"

namespace kdm::k8s {

inline constexpr std::string_view kAttrModel = "model";
inline constexpr std::string_view kAttrMemoryMib = "memory_mib";
inline constexpr std::string_view kAttrDriver = "driver";
inline constexpr std::string_view kAttrCuda = "cuda";
inline constexpr std::string_view kAttrArch = "arch";
inline constexpr std::string_view kAttrBrand = "brand";
// Every key, in the order the annotation writes them.
inline constexpr std::array<std::string_view, 6> kAttributeKeys = {
    kAttrModel, kAttrMemoryMib, kAttrDriver, kAttrCuda, kAttrArch, kAttrBrand};

// The longest attribute value (the model name) accepted.
inline constexpr size_t kMaxAttributeBytes = 256;

// cuda, driver and arch: the keys whose values are versions.
bool IsVersionAttribute(std::string_view key);
// One of kAttributeKeys.
bool IsAttributeKey(std::string_view key);

struct DeviceAttributes {
  std::optional<std::string> model;  // e.g. "NVIDIA H100 80GB HBM3"
  std::optional<int64_t> memory_mib;
  std::optional<std::string> driver;  // e.g. "550.54.15"
  std::optional<std::string> cuda;    // e.g. "12.4"
  std::optional<std::string> arch;    // compute capability, e.g. "9.0"
  std::optional<std::string> brand;   // e.g. "tesla", "nvidia"

  bool empty() const { return !model && !memory_mib && !driver && !cuda && !arch && !brand; }

  // The field of a string-valued key (every key but memory_mib); nullptr for
  // memory_mib and unknown keys. No checks: the decoder and Set() check.
  std::optional<std::string>* Field(std::string_view key);
  const std::optional<std::string>* Field(std::string_view key) const;

  // The value of `key` as text (memory_mib in decimal); nullopt when unset
  // or unknown.
  std::optional<std::string> Get(std::string_view key) const;

  // Sets `key` from text after CheckAttributeValue (memory_mib: a whole
  // number of MiB). INVALID_ARGUMENT naming the key and the value.
  Status Set(std::string_view key, std::string_view value);

  friend bool operator==(const DeviceAttributes&, const DeviceAttributes&) = default;
};

// OK when `value` may be published as `key` (see the top of this file);
// INVALID_ARGUMENT "attribute 'cuda': not a version: 'twelve'" otherwise.
Status CheckAttributeValue(std::string_view key, std::string_view value);

// Parses "KEY=VALUE,KEY=VALUE,..." with KEY one of kAttributeKeys (each at
// most once). Values may hold spaces but no comma. On error:
// INVALID_ARGUMENT naming the key or item ("attribute 'cuda': not a version:
// 'twelve'", "unknown attribute 'cdua' (keys: ...)").
StatusOr<DeviceAttributes> ParseAttributes(std::string_view text);

// A value from outside input, shown in an error: printable ASCII only (other
// bytes and quotes as '?'), cut to 64 bytes, in single quotes.
std::string ShowValue(std::string_view s);

}  // namespace kdm::k8s

#endif  // KDM_K8S_ATTRIBUTES_H_
