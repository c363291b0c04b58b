// The one conversion between kdm::Status and grpc::Status, both ways.
// Installed (with grpc_server.h, the only installed headers that name gRPC
// types) for conformance/, which builds against the installed headers; every
// kdm module that speaks gRPC uses it: servers answering an RPC with a
// kdm::Status (registration, the SDK, the fake plugins) and clients turning
// an RPC's outcome into one (the device manager's endpoints, the SDK's and
// the fake plugins' registration, `kdm get`, `kdm conform`).
//
// The two code enums have the same numbers (kdm::StatusCode is defined
// that way), so a code crosses unchanged. What does not fit the other side
// is normalised, never trusted: a code outside 0..16 becomes UNKNOWN (the
// message kept), and an OK status drops its message (a kdm::Status must not
// be OK with a message, and gRPC ignores one).
//
// Thread-safety: pure functions.
//
// Example:
//   grpc::Status Register(...) override { return pluginapi::ToGrpcStatus(Handle(*request)); }
//   grpc::Status s = stub->Allocate(&ctx, request, &response);
//   if (!s.ok()) return pluginapi::FromGrpcStatus(s, "Allocate of " + resource);
#ifndef KDM_PLUGINAPI_GRPC_STATUS_H_
#define KDM_PLUGINAPI_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string_view>

#include "kdm/base/status.h"

namespace kdm::pluginapi {

// The gRPC status carrying `s`'s code and message (OK for OK).
grpc::Status ToGrpcStatus(const Status& s);

// The kdm::Status carrying `s`'s code and message (OK for OK).
Status FromGrpcStatus(const grpc::Status& s);

// As FromGrpcStatus(s), with the message "<what>: <gRPC message>" when `s`
// is not OK, e.g. "Allocate of vendor.com/gpu: Deadline Exceeded".
Status FromGrpcStatus(const grpc::Status& s, std::string_view what);

}  // namespace kdm::pluginapi

#endif  // KDM_PLUGINAPI_GRPC_STATUS_H_
