// kdm::devicemanager::PodResourcesServer: the kubelet's pod-resources v1 API
// (List, GetAllocatableResources, Get) on a unix socket, answered from a
// Manager and the node agent's list of active pods
// (docs/wire-contract.md#pod-resources-api-v1).
//
// Rules (the kubelet's): List reports every active pod with its app
// containers and restartable init containers (sidecars); plain init
// containers are left out. Each container lists its devices as one
// ContainerDevices per resource per NUMA node (a device without topology
// appears once, with no topology). GetAllocatableResources reports the
// healthy devices only. Get on a pod the agent does not know answers
// NOT_FOUND with "pod <name> in namespace <namespace> not found".
//
// Thread-safety: Start() and Stop() may be called from any thread; the RPCs
// run on gRPC's threads and call the Manager's query methods and the
// active_pods callback concurrently (both must be thread-safe).
//
// Example:
//   kdm::devicemanager::PodResourcesServer::Options options;
//   options.socket_path = root + "/pod-resources/kubelet.sock";
//   options.manager = manager.get();
//   options.active_pods = [&] { return agent.ActivePods(); };
//   auto server = kdm::devicemanager::PodResourcesServer::Start(std::move(options));
//   if (!server.ok()) return Fail(server.status());
//   ...
//   (*server)->Stop();
#ifndef KDM_DEVICEMANAGER_POD_RESOURCES_SERVER_H_
#define KDM_DEVICEMANAGER_POD_RESOURCES_SERVER_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/pod.h"
#include "kdm/devicemanager/pod_resources.h"

namespace kdm::devicemanager {

class PodResourcesServer {
 public:
  struct Options {
    // Unix socket path; its parent directory is created 0750 when missing. A
    // relative path is made absolute by Start, against the working directory.
    std::string socket_path;
    // REQUIRES: not null; outlives the server.
    Manager* manager = nullptr;
    // The agent's active pods. Null: no pod is active.
    std::function<std::vector<ActivePod>()> active_pods;

    // Bounds on what clients can make the server hold (any process that can
    // open the socket is a client). Without them 5,000 idle connections took
    // the agent's RSS from 22 to 208 MB, and kept it.
    //
    // A connection without an RPC for this long is closed (HTTP/2 GOAWAY; a
    // gRPC client reconnects on its next call). Zero: never.
    std::chrono::milliseconds max_connection_idle{std::chrono::minutes(2)};
    // The memory gRPC may take for this server's connections and calls.
    // Near it, gRPC drops new connections as they are accepted and reclaims
    // idle connections' buffers, so the memory stays bounded while the
    // connections already open keep working. At least 1 MiB.
    size_t max_memory_bytes = 32 << 20;
    // Threads running RPCs (gRPC's sync server starts one per call in
    // flight); a call beyond them is answered RESOURCE_EXHAUSTED. At least 4.
    int max_threads = 16;
  };

  // Creates the parent directory (0750), removes a stale socket, serves the
  // API and makes the socket 0600. Errors: INVALID_ARGUMENT (empty path or
  // one longer than a unix socket path allows once absolute, null manager, a
  // bound out of range), UNAVAILABLE/INTERNAL naming the path when the
  // directory or socket cannot be made or served.
  static StatusOr<std::unique_ptr<PodResourcesServer>> Start(Options options);

  // Stops if running.
  virtual ~PodResourcesServer() = default;

  // Stops serving (in-flight RPCs finish) and removes the socket. Idempotent.
  virtual void Stop() = 0;

  // The socket path served (absolute).
  virtual const std::string& socket_path() const = 0;
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_POD_RESOURCES_SERVER_H_
