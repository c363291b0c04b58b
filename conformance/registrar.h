// kdm::conformance::Registrar: the recording kubelet side of registration
// for `kdm conform`. Private header (names gRPC types only in registrar.cc).
//
// It serves v1beta1.Registration on <plugin dir>/kubelet.sock, answers every
// Register with OK (it records, it does not judge: the checks judge) and
// keeps every request with the time it arrived. Restart() is the kubelet
// restart signal (docs/kubelet-rules.md#kubelet-restart): stop serving,
// remove kubelet.sock, serve again on a new socket file.
//
// Thread-safety: Register calls arrive on gRPC threads; Registrations() and
// WaitForCount() may be called from any thread; Start/Restart/Stop from the
// owner thread only.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(auto registrar, Registrar::Start(dir));
//   if (!registrar->WaitForCount(1, 10s)) return DeadlineExceededError(...);
//   v1beta1::RegisterRequest first = registrar->Registrations()[0].request;
#ifndef KDM_CONFORMANCE_REGISTRAR_H_
#define KDM_CONFORMANCE_REGISTRAR_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"
#include "kdm/base/status.h"

namespace kdm::conformance {

class Registrar {
 public:
  struct Registration {
    v1beta1::RegisterRequest request;
    std::chrono::steady_clock::time_point at;
  };

  // Creates `plugin_dir` (mode 0750) when missing, removes a stale
  // kubelet.sock and serves there. Errors name the path: the directory
  // cannot be made, the socket path is too long, the server cannot bind.
  static StatusOr<std::unique_ptr<Registrar>> Start(const std::string& plugin_dir);

  ~Registrar();
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  // Stops serving, removes kubelet.sock and serves again (recorded
  // registrations are kept). Errors as Start's.
  Status Restart();

  // Stops serving and removes kubelet.sock. Idempotent.
  void Stop();

  // Every Register request so far, in arrival order.
  std::vector<Registration> Registrations() const;

  // Waits until at least `count` requests were recorded or `timeout`
  // passes; returns whether they were.
  bool WaitForCount(size_t count, std::chrono::milliseconds timeout) const;

  const std::string& socket_path() const { return socket_path_; }

 private:
  class Service;
  explicit Registrar(std::string socket_path);
  Status Serve();

  const std::string socket_path_;
  std::unique_ptr<Service> service_;
  struct Server;
  std::unique_ptr<Server> server_;
};

}  // namespace kdm::conformance

#endif  // KDM_CONFORMANCE_REGISTRAR_H_
