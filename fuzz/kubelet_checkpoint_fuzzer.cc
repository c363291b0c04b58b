// Fuzz target: the kubelet checkpoint codec (checkpoint/kubelet_json.h),
// `kubelet_internal_checkpoint` as the kubelet writes it.
//
// Properties:
// - every accepted file decodes without checksum verification, and with it
//   exactly when its checksum equals KubeletChecksum of its Data;
// - a decoded checkpoint re-encodes, the encoding verifies and decodes to
//   the same CheckpointData, and encoding that again gives the same bytes;
// - the encoding's Data is what ToKubeletData says the kubelet would write;
// - Base64Decode(Base64Encode(x)) == x for the decoded allocate responses.
// Rejections carry a message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kdm/checkpoint/kubelet_json.h"

namespace ckpt = kdm::checkpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  kdm::StatusOr<ckpt::KubeletFile> file = ckpt::ParseKubeletCheckpoint(json);
  kdm::StatusOr<ckpt::CheckpointData> unverified =
      ckpt::DecodeKubeletCheckpoint(json, /*verify_checksum=*/false);
  if (!file.ok()) {
    FUZZ_CHECK(!file.status().message().empty(), "an error without a message");
    FUZZ_CHECK(!unverified.ok(), "Decode accepts what Parse refuses: " << file.status());
    return 0;
  }
  FUZZ_CHECK(json.find('\0') == std::string_view::npos, "accepted a text with a NUL byte");
  FUZZ_CHECK(unverified.ok(), "Parse accepts what Decode refuses: " << unverified.status());
  FUZZ_CHECK(*unverified == ckpt::FromKubeletData(file->data), "Decode != FromKubeletData(Parse)");

  const bool checksum_matches = file->checksum == ckpt::KubeletChecksum(file->data);
  kdm::StatusOr<ckpt::CheckpointData> verified = ckpt::DecodeKubeletCheckpoint(json);
  FUZZ_CHECK(verified.ok() == checksum_matches,
             "checksum " << file->checksum << " vs computed " << ckpt::KubeletChecksum(file->data)
                         << " but verified decode says " << verified.status());
  if (verified.ok()) FUZZ_CHECK(*verified == *unverified, "verification changed the data");

  for (const ckpt::PodDevicesEntry& e : unverified->entries) {
    kdm::StatusOr<std::string> raw = ckpt::Base64Decode(ckpt::Base64Encode(e.alloc_response));
    FUZZ_CHECK(raw.ok() && *raw == e.alloc_response, "base64 round trip");
  }

  std::string encoded = ckpt::EncodeKubeletCheckpoint(*unverified);
  kdm::StatusOr<ckpt::KubeletFile> reparsed = ckpt::ParseKubeletCheckpoint(encoded);
  FUZZ_CHECK(reparsed.ok(), "the encoding does not parse: " << reparsed.status() << "\n"
                                                            << encoded);
  FUZZ_CHECK(reparsed->checksum == ckpt::KubeletChecksum(reparsed->data),
             "the encoding's checksum does not verify:\n"
                 << encoded);
  FUZZ_CHECK(reparsed->data == ckpt::ToKubeletData(*unverified),
             "the encoding's Data is not ToKubeletData:\n"
                 << encoded);
  kdm::StatusOr<ckpt::CheckpointData> decoded = ckpt::DecodeKubeletCheckpoint(encoded);
  FUZZ_CHECK(decoded.ok(), "the encoding does not decode: " << decoded.status());
  FUZZ_CHECK(ckpt::EncodeKubeletCheckpoint(*decoded) == encoded, "encoding is not a fixed point:\n"
                                                                     << encoded);
  return 0;
}
