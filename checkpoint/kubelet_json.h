// The kubelet's own checkpoint format, `kubelet_internal_checkpoint`
// (docs/checkpoint.md#the-kubelets-format): decode, encode and the checksum,
// byte for byte as the kubelet's Go code does it, so that a node can move from
// a kubelet to kdm and back.
//
//   {"Data":{"PodDeviceEntries":[{"PodUID":…,"ContainerName":…,
//     "ResourceName":…,"DeviceIDs":{"<numa>":[ids…]},"AllocResp":"<base64>"}],
//     "RegisteredDevices":{"<resource>":[ids…]}},"Checksum":<uint64>}
//
// The checksum is FNV-32a over the go-spew "%#v" rendering (sorted keys) of
// the Data value, in which `null` and empty differ (`<nil>` vs `[]`/`map[]`).
// So decoding goes through KubeletData, which keeps every null, and the
// checksum is verified on that; CheckpointData (what the stores hold) drops
// the difference. The encoder writes what the kubelet itself writes (entries
// `null` when there are none, every other list and map non-null) and always
// produces a file whose checksum verifies.
//
// Thread-safety: pure functions.
//
// Example:
//   StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(text);
//   if (!data.ok()) return data.status();  // names the field or both checksums
//   std::string again = EncodeKubeletCheckpoint(*data);
#ifndef KDM_CHECKPOINT_KUBELET_JSON_H_
#define KDM_CHECKPOINT_KUBELET_JSON_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/checkpoint/store.h"

namespace kdm::checkpoint {

// One PodDevicesEntry as the JSON holds it; std::nullopt is JSON `null` (or a
// missing field, which Go decodes the same way).
struct KubeletEntry {
  std::string pod_uid;
  std::string container_name;
  std::string resource_name;
  std::optional<std::map<int64_t, std::optional<std::vector<std::string>>>> device_ids;
  std::optional<std::string> alloc_response;  // decoded bytes

  friend bool operator==(const KubeletEntry&, const KubeletEntry&) = default;
};

// The Data value of the file, nulls kept, entries in file order.
struct KubeletData {
  std::optional<std::vector<KubeletEntry>> entries;
  std::optional<std::map<std::string, std::optional<std::vector<std::string>>>> registered_devices;

  friend bool operator==(const KubeletData&, const KubeletData&) = default;
};

struct KubeletFile {
  KubeletData data;
  uint64_t checksum = 0;
};

// Parses the file. Errors (INVALID_ARGUMENT) name the JSON position or the
// field, e.g. `Data.PodDeviceEntries[2].AllocResp: invalid base64 at byte 5`.
// The checksum is not verified here.
StatusOr<KubeletFile> ParseKubeletCheckpoint(std::string_view json);

// The exact text the kubelet hashes: go-spew "%#v", sorted keys.
std::string RenderKubeletData(const KubeletData& data);

// FNV-32a (32-bit) of `bytes`.
uint32_t Fnv32a(std::string_view bytes);

// Fnv32a(RenderKubeletData(data)).
uint32_t KubeletChecksum(const KubeletData& data);

// The Data the kubelet would write for `data` (entries null when empty,
// everything else non-null).
KubeletData ToKubeletData(const CheckpointData& data);

// Nulls become empty; entries keep file order (repeated keys are kept); the
// boot id is empty (the format has none).
CheckpointData FromKubeletData(const KubeletData& data);

// Parses and, with `verify_checksum`, verifies the checksum (DATA_LOSS naming
// both values on a mismatch).
StatusOr<CheckpointData> DecodeKubeletCheckpoint(std::string_view json,
                                                 bool verify_checksum = true);

// The file as the kubelet's Go encoder writes it (field order, map keys
// sorted as strings, HTML-safe escaping, standard base64 with padding), with
// a checksum that verifies. Strings that are not valid UTF-8 are written with
// U+FFFD in place of each bad byte, as Go does, and hashed that way.
std::string EncodeKubeletCheckpoint(const CheckpointData& data);

// Standard base64 with padding (RFC 4648 §4).
std::string Base64Encode(std::string_view bytes);
// Decodes standard base64 with padding, skipping '\r' and '\n' as Go does.
// INVALID_ARGUMENT naming the offending byte offset.
StatusOr<std::string> Base64Decode(std::string_view text);

}  // namespace kdm::checkpoint

#endif  // KDM_CHECKPOINT_KUBELET_JSON_H_
