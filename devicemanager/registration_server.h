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
// (the Handler's deadlines), so at most Limits::max_in_flight calls are in
// the Handler at once, each on one of at most that many worker threads of
// the server's own. A call beyond them waits for a slot in a FIFO queue
// (Limits::max_waiting calls, each for at most Limits::max_wait or until
// its own deadline) holding no thread: the service is gRPC's callback API.
// Only a call finding the queue full is answered RESOURCE_EXHAUSTED at once,
// and one that waited max_wait in vain is answered RESOURCE_EXHAUSTED then;
// neither reaches the Handler. Validation runs before the queue, so a bad
// request is answered at once and takes no slot, and a request that passes
// it may be at most kMaxQueuedRequestBytes (a real one is under 1 KiB), so
// the queue holds at most max_waiting of those.
// Why: without a cap 200 Register calls naming a plugin that never answered
// held 213 threads and 422 fds until their deadlines passed (issue 16); with
// a cap that refused at once, a burst of 100 honest plugins starting
// together was refused beyond 16 and NVIDIA's plugin exits on a failed
// Register (issue 28).
//
// Thread-safety: Start/Stop from one owner thread; the Handler runs on the
// server's worker threads, possibly concurrently, and must be thread-safe.
// Stop() answers waiting calls UNAVAILABLE and waits for running Register
// calls, so the Handler must not wait for Stop().
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

#include <chrono>
#include <cstddef>
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
  // Register calls in the Handler at once (and the server's worker
  // threads). A real node has a handful of plugins, each registering once
  // per start; a node agent restart makes them all register together. At
  // least 1.
  int max_in_flight = 16;
  // Calls waiting for one of those slots; one more is answered
  // RESOURCE_EXHAUSTED `too many Register calls (16 in flight, 256 waiting,
  // the limits); try again later`. At least 0.
  int max_waiting = 256;
  // The longest a call waits for a slot (less if its own deadline is
  // sooner); then it is answered RESOURCE_EXHAUSTED `waited 5000ms for one
  // of 16 Register slots (all held by calls in flight); try again later`.
  // Shorter than the SDK's Register deadline (10 s). Positive.
  std::chrono::milliseconds max_wait{5000};
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

  // The largest RegisterRequest that passes validation and is handled or
  // queued (INVALID_ARGUMENT beyond it): a valid one is a version, a
  // resource name, a socket name and a few flags, under 1 KiB; only unknown
  // fields make one larger.
  static constexpr std::size_t kMaxQueuedRequestBytes = 64 * 1024;

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

  // Stops serving, answers waiting calls UNAVAILABLE `registration server
  // stopping`, waits for running Register calls, joins the workers, removes
  // the socket. Idempotent.
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
