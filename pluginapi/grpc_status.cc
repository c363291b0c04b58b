#include "kdm/pluginapi/grpc_status.h"

#include <string>

namespace kdm::pluginapi {

namespace {

// Both enums number their codes 0..16; anything else (a corrupt or future
// code) is UNKNOWN.
constexpr int kLastCode = static_cast<int>(StatusCode::kUnauthenticated);
static_assert(kLastCode == static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
static_assert(static_cast<int>(StatusCode::kInvalidArgument) ==
              static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
static_assert(static_cast<int>(StatusCode::kResourceExhausted) ==
              static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
static_assert(static_cast<int>(StatusCode::kUnavailable) ==
              static_cast<int>(grpc::StatusCode::UNAVAILABLE));

bool IsKnownCode(int code) { return code >= 0 && code <= kLastCode; }

}  // namespace

grpc::Status ToGrpcStatus(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(s.code());
  return grpc::Status(
      IsKnownCode(code) ? static_cast<grpc::StatusCode>(code) : grpc::StatusCode::UNKNOWN,
      s.message());
}

Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return OkStatus();
  const int code = static_cast<int>(s.error_code());
  return Status(IsKnownCode(code) ? static_cast<StatusCode>(code) : StatusCode::kUnknown,
                s.error_message());
}

Status FromGrpcStatus(const grpc::Status& s, std::string_view what) {
  return FromGrpcStatus(s).WithPrefix(what);
}

}  // namespace kdm::pluginapi
