// kdm::devicemanager::PodResourcesClient: a small client of the kubelet's
// pod-resources v1 API (List, GetAllocatableResources) on a unix socket, as
// served by PodResourcesServer or by a real kubelet
// (/var/lib/kubelet/pod-resources/kubelet.sock). `kdm get` is built on it.
//
// Every call has a deadline (Options::timeout); a server that does not
// answer in time gives DEADLINE_EXCEEDED, one that is not there
// UNAVAILABLE, each prefixed "<method> on <socket> failed". Answers are
// returned as kdm types: one ContainerDevices per resource per NUMA node, as
// Manager::GetDevices reports them (a wire entry with several NUMA nodes
// becomes one entry per node, each with all its ids).
//
// Thread-safety: the calls may be made from any thread concurrently.
//
// Example:
//   auto client = kdm::devicemanager::PodResourcesClient::Connect(
//       {.socket_path = root + "/pod-resources/kubelet.sock"});
//   if (!client.ok()) return Fail(client.status());
//   auto pods = (*client)->List();
//   if (!pods.ok()) return Fail(pods.status());
//   for (const auto& pod : *pods) Print(pod.namespace_name, pod.name);
#ifndef KDM_DEVICEMANAGER_POD_RESOURCES_CLIENT_H_
#define KDM_DEVICEMANAGER_POD_RESOURCES_CLIENT_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/pod_resources.h"

namespace kdm::devicemanager {

// One container of a List answer.
class PodResourcesClient {
 public:
  struct Options {
    // The server's unix socket: absolute or relative, at most 107 bytes
    // once absolute.
    std::string socket_path;
    // Deadline of each call. Positive.
    std::chrono::milliseconds timeout{std::chrono::seconds(5)};
  };

  // Checks the options and that `socket_path` is a unix socket now; does not
  // dial (the first call does). Errors: INVALID_ARGUMENT (an unusable path,
  // a timeout that is not positive), NOT_FOUND `pod-resources socket <path>
  // does not exist`, FAILED_PRECONDITION `pod-resources socket <path> is not
  // a socket`.
  static StatusOr<std::unique_ptr<PodResourcesClient>> Connect(Options options);

  virtual ~PodResourcesClient() = default;

  // The pods the server reports, with their containers and devices. Errors:
  // the RPC's, prefixed "List on <socket> failed".
  virtual StatusOr<std::vector<PodResources>> List() = 0;

  // The devices the server reports as allocatable (healthy, free or not).
  // Errors: the RPC's, prefixed "GetAllocatableResources on <socket> failed".
  virtual StatusOr<std::vector<ContainerDevices>> GetAllocatableResources() = 0;

  // The socket path given to Connect.
  virtual const std::string& socket_path() const = 0;
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_POD_RESOURCES_CLIENT_H_
