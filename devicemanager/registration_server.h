// kdm::devicemanager::RegistrationServer: the gRPC Registration service the
// device manager serves on <plugin dir>/kubelet.sock. Private header.
//
// A Register call is validated here (docs/kubelet-rules.md#registration: API
// version and extended resource name, with the kubelet's texts;
// docs/promises.md#endpoint-checks: the endpoint is a plain file name of a
// unix socket inside the plugin directory) and then handed to
// the Handler (the Manager), which dials the plugin, reads its options and
// opens ListAndWatch; the Handler's Status is the Register answer.
// The rules themselves are the wire layer's (pluginapi/api_rules.h), shared
// with the fake kubelet and `kdm conform`.
//
// Bounds: a Register call may take as long as its plugin takes to answer
// (the Handler's deadlines), so calls in flight are capped
// (Limits::max_in_flight): one more is answered RESOURCE_EXHAUSTED at once,
// without reaching the Handler, and the server's threads are capped by a
// gRPC ResourceQuota (beyond them gRPC itself answers RESOURCE_EXHAUSTED
// "Server Threadpool Exhausted"). Without the caps 200 Register calls naming
// a plugin that never answered held 213 threads and 422 fds until their
// deadlines passed.
//
// Thread-safety: Start/Stop from one owner thread; the Handler runs on gRPC
// server threads, possibly concurrently, and must be thread-safe. Stop()
// waits for running Register calls, so the Handler must not wait for Stop().
//
// Example:
//   KDM_ASSIGN_OR_RETURN(auto server, RegistrationServer::Start(dir,
//       [&](const std::string& resource, const std::string& socket) {
//         return manager.RegisterPlugin(resource, socket);
//       }));
//   ...
//   server->Stop();
#ifndef KDM_DEVICEMANAGER_REGISTRATION_SERVER_H_
#define KDM_DEVICEMANAGER_REGISTRATION_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "kdm/base/status.h"

namespace grpc {
class Server;
}

namespace kdm::devicemanager {

// RegistrationServer::Limits (at namespace scope so that it can be a
// default argument inside the class).
struct RegistrationLimits {
  // Register calls in the Handler at once; one more is answered
  // RESOURCE_EXHAUSTED `too many Register calls in flight (16, the limit);
  // try again later`. A real node has a handful of plugins, each registering
  // once per start. At least 1.
  int max_in_flight = 16;
};

class RegistrationServer {
 public:
  // Gets a validated registration: the resource name and the absolute path
  // of the plugin's socket.
  using Handler =
      std::function<Status(const std::string& resource, const std::string& socket_path)>;

  // Gets every request refused before the Handler: by validation, or
  // because too many calls are in flight.
  using RejectObserver = std::function<void(const Status& why)>;

  using Limits = RegistrationLimits;

  // Removes a stale <dir>/kubelet.sock and serves Registration there, the
  // socket made mode 0600. REQUIRES: `dir` exists. Errors: INVALID_ARGUMENT
  // for limits out of range, the socket path is too long, the server cannot
  // bind, or the socket's mode cannot be set.
  static StatusOr<std::unique_ptr<RegistrationServer>> Start(const std::string& dir,
                                                             Handler handler,
                                                             RejectObserver on_invalid = {},
                                                             Limits limits = {});

  ~RegistrationServer();
  RegistrationServer(const RegistrationServer&) = delete;
  RegistrationServer& operator=(const RegistrationServer&) = delete;

  // Stops serving, waits for running Register calls, removes the socket.
  // Idempotent.
  void Stop();

  const std::string& socket_path() const { return socket_path_; }

 private:
  class Service;
  RegistrationServer(std::string dir, std::string socket_path, Handler handler,
                     RejectObserver on_invalid, Limits limits);

  const std::string dir_;
  const std::string socket_path_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  bool stopped_ = false;
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_REGISTRATION_SERVER_H_
