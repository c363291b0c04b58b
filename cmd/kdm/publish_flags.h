// What `kdm publish` and `kdm kubelet --publish` share (docs/publish.md):
// the flags of the publish loop, their checks, and their mapping onto the
// publish library (kdm/publish/: topology sources, ids files, NVML, the
// DeviceSources and the loop's thread owner). The commands add only what is
// theirs: publish its --pod-resources-socket and --dry-run, the kubelet
// --publish; both have their own --attributes (the kubelet's also feeds
// requirement checks).
//
// Example:
//   PublishLoopFlags flags;  AddPublishLoopFlags(cmd, &flags);
//   PublishSetup setup;
//   if (auto f = LoadPublishFlags(flags, attribute_values, ClientFlags::kRequired, &setup)) ...
//   KDM_ASSIGN_OR_RETURN(auto client, MakeKubeClient(flags.kube));
//   auto loop = publish::PublishLoop::Start(std::move(setup.options), std::move(source),
//                                           std::move(client));
#ifndef KDM_CMD_KDM_PUBLISH_FLAGS_H_
#define KDM_CMD_KDM_PUBLISH_FLAGS_H_

#include <CLI/CLI.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/publish/publish_loop.h"
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
  std::vector<std::string> topologies;       // RESOURCE=SOURCE (repeatable)
  std::vector<std::string> ids;              // RESOURCE=FILE (repeatable)
  std::vector<std::string> plugin_policies;  // RESOURCE=POLICY (repeatable)
  std::string nvml_library;                  // for SOURCE nvml; empty: the loader's
  std::string sysfs_root;                    // for SOURCE nvml's NUMA nodes; empty: /sys
  KubeClientFlags kube;
  std::string interval = "1s";
  std::string min_write_interval = "1s";
  std::string resync = "5m";
  std::string timeout = "5s";

  // True when any flag above was given (a kubelet without --publish refuses them).
  bool any_given() const;
};

// Adds --node-name, --topology, --ids, --plugin-policy, --nvml-library, --sysfs-root,
// --kubeconfig, --context, --in-cluster, --interval, --min-write-interval, --resync and --timeout.
void AddPublishLoopFlags(CLI::App* cmd, PublishLoopFlags* flags);

// Everything the loop runs with, checked and loaded.
struct PublishSetup {
  // node, topologies, attributes (--attributes, plus NVML's for an nvml
  // resource without --attributes), policies (--plugin-policy) and the
  // durations.
  publish::PublishOptions options;
  // Lines to print as warnings (NVML attributes that could not be published).
  std::vector<std::string> warnings;
  // Resource -> GPU UUID -> NVML index, for each --topology RESOURCE=nvml.
  std::map<std::string, std::map<std::string, int>> gpu_indexes;
};

// Checks the flags (and the --attributes values of the command) and loads
// the topologies, ids files and NVML. `client`: whether the command needs
// an API server client (`kdm publish --dry-run` does not); without
// --kubeconfig or --in-cluster the loading rules find its config later
// (kube_flags.h), so only conflicting client flags are an error here.
enum class ClientFlags { kOptional, kRequiredUnlessDryRun, kRequired };

// The pure part of LoadPublishFlags (what `kdm --dry-run publish` and
// `kdm --dry-run kubelet --publish` check): --node-name, the client flags,
// the durations, every RESOURCE=VALUE's shape and duplicates, a --topology
// preset's name, --plugin-policy, --attributes, and --nvml-library /
// --sysfs-root without a RESOURCE=nvml. Reads no file, NVML nor network.
std::optional<PublishFailure> CheckPublishFlags(const PublishLoopFlags& flags,
                                                const std::vector<std::string>& attribute_values,
                                                ClientFlags client);

// CheckPublishFlags, then loads the topologies, ids files and NVML.
std::optional<PublishFailure> LoadPublishFlags(const PublishLoopFlags& flags,
                                               const std::vector<std::string>& attribute_values,
                                               ClientFlags client, PublishSetup* out);

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_PUBLISH_FLAGS_H_
