// What `kdm publish` and `kdm kubelet --publish` share (docs/publish.md):
// the flags of the publish loop, their checks and loading (one function for
// both commands), the pod-resources DeviceSource, and the running loop
// (kube::Publisher writing through kube::NodeAnnotationWriter on a thread it
// owns). The commands add only what is theirs: publish its
// --pod-resources-socket and --dry-run, the kubelet --publish; both have
// their own --attributes (the kubelet's also feeds requirement checks).
//
// Example:
//   PublishLoopFlags flags;  AddPublishLoopFlags(cmd, &flags);
//   PublishSetup setup;
//   if (auto f = LoadPublishFlags(flags, attribute_values, ClientFlags::kRequired, &setup)) ...
//   KDM_ASSIGN_OR_RETURN(auto client, MakeKubeClient(flags.kube));
//   auto loop = PublishLoop::Start(std::move(setup), std::move(source), std::move(client));
#ifndef KDM_CMD_KDM_PUBLISH_FLAGS_H_
#define KDM_CMD_KDM_PUBLISH_FLAGS_H_

#include <CLI/CLI.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/devicemanager/pod_resources_client.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/kube/client.h"
#include "kdm/kube/node_annotation_writer.h"
#include "kdm/kube/publisher.h"
#include "kdm/topology/topology.h"
#include "kube_flags.h"

namespace kdm::cli {

inline constexpr int kPublishRuntimeError = 1;
inline constexpr int kPublishUsageError = 2;

// An error of a publish flag: its exit code (1 runtime, 2 usage) and the
// one-line message (without the command's prefix).
struct PublishFailure {
  int code;
  std::string message;
};

struct PublishLoopFlags {
  std::string node_name;
  std::vector<std::string> topologies;  // RESOURCE=SOURCE (repeatable)
  std::vector<std::string> ids;         // RESOURCE=FILE (repeatable)
  std::string nvml_library;             // for SOURCE nvml; empty: the loader's
  std::string sysfs_root;               // for SOURCE nvml's NUMA nodes; empty: /sys
  KubeClientFlags kube;
  std::string interval = "1s";
  std::string min_write_interval = "1s";
  std::string resync = "5m";
  std::string timeout = "5s";

  // True when any flag above was given (a kubelet without --publish refuses them).
  bool any_given() const;
};

// Adds --node-name, --topology, --ids, --nvml-library, --sysfs-root, --kubeconfig,
// --in-cluster, --interval, --min-write-interval, --resync and --timeout.
void AddPublishLoopFlags(CLI::App* cmd, PublishLoopFlags* flags);

// Everything the loop runs with, checked and loaded.
struct PublishSetup {
  std::string node;
  std::map<std::string, topology::Topology> topologies;
  // --attributes, plus NVML's for an nvml resource without --attributes.
  std::map<std::string, k8s::DeviceAttributes> attributes;
  std::chrono::milliseconds interval{0};
  std::chrono::milliseconds min_write_interval{0};
  std::chrono::milliseconds resync{0};
  std::chrono::milliseconds timeout{0};
  // Lines to print as warnings (NVML attributes that could not be published).
  std::vector<std::string> warnings;
};

// Checks the flags (and the --attributes values of the command) and loads
// the topologies, ids files and NVML. `client`: whether --kubeconfig or
// --in-cluster is required, and whether the command could do without
// (`kdm publish --dry-run`); both flags are always an error.
enum class ClientFlags { kOptional, kRequiredUnlessDryRun, kRequired };
std::optional<PublishFailure> LoadPublishFlags(const PublishLoopFlags& flags,
                                               const std::vector<std::string>& attribute_values,
                                               ClientFlags client, PublishSetup* out);

// Reads the node through a pod-resources socket: GetAllocatableResources
// (id -> NUMA node) and List (ids in use).
class PodResourcesSource final : public kube::DeviceSource {
 public:
  explicit PodResourcesSource(std::unique_ptr<devicemanager::PodResourcesClient> client)
      : client_(std::move(client)) {}
  StatusOr<kube::NodeDevices> Read() override;

 private:
  std::unique_ptr<devicemanager::PodResourcesClient> client_;
};

// The publish loop on its own thread, writing to the API server. The
// destructor stops and joins it.
class PublishLoop {
 public:
  // Starts the thread, writing through `client` (from MakeKubeClient).
  static std::unique_ptr<PublishLoop> Start(PublishSetup setup,
                                            std::unique_ptr<kube::DeviceSource> source,
                                            std::unique_ptr<kube::Client> client);
  ~PublishLoop() { Stop(); }
  PublishLoop(const PublishLoop&) = delete;
  PublishLoop& operator=(const PublishLoop&) = delete;

  // Stops the loop and joins its thread (within about one pod-resources
  // call and one write). Idempotent; from the owner's thread.
  void Stop();

 private:
  PublishLoop() = default;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<kube::NodeAnnotationWriter> writer_;
  std::unique_ptr<kube::DeviceSource> source_;
  std::unique_ptr<kube::Publisher> publisher_;
  std::thread thread_;
};

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_PUBLISH_FLAGS_H_
