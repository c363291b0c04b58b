// How every kdm gRPC server on a unix socket ends: the device manager's
// registration and pod-resources servers and `kdm conform`'s recording
// registrar. Installed (it names grpc::Server) for the same reason as
// grpc_status.h: conformance/ builds against the installed headers alone.
//
// Thread-safety: call once per server, from its owner.
//
// Example:
//   void Stop() {
//     if (std::exchange(stopped_, true)) return;
//     pluginapi::StopUnixServer(server_.get(), socket_path_, std::chrono::seconds(1));
//   }
#ifndef KDM_PLUGINAPI_GRPC_SERVER_H_
#define KDM_PLUGINAPI_GRPC_SERVER_H_

#include <grpcpp/server.h>

#include <chrono>
#include <string>

namespace kdm::pluginapi {

// Stops `server`: new calls are refused at once, calls in flight get `grace`
// to finish and are then cancelled, and the call returns when every handler
// has returned (grpc::Server::Shutdown, then Wait). Then removes the socket
// file at `socket_path`, so that a peer dialing it fails fast instead of
// finding a dead socket. A null `server` only removes the file.
void StopUnixServer(grpc::Server* server, const std::string& socket_path,
                    std::chrono::milliseconds grace);

}  // namespace kdm::pluginapi

#endif  // KDM_PLUGINAPI_GRPC_SERVER_H_
