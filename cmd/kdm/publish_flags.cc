#include "publish_flags.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "cli_common.h"
#include "duration_flag.h"
#include "kdm/base/log_value.h"
#include "kdm/k8s/names.h"
#include "kdm/publish/topology_sources.h"

namespace kdm::cli {
namespace {

std::string Show(const std::string& s) { return QuoteLogValue(s, kMaxLogValueBytes); }

// Splits "RESOURCE=REST" and checks the resource name.
std::optional<PublishFailure> SplitResource(const std::string& flag, const std::string& value,
                                            std::string* resource, std::string* rest) {
  size_t eq = value.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == value.size()) {
    return PublishFailure{kPublishUsageError, flag + " " + Show(value) + ": expected RESOURCE=" +
                                                  (flag == "--ids"             ? "FILE"
                                                   : flag == "--plugin-policy" ? "POLICY"
                                                                               : "SOURCE")};
  }
  *resource = value.substr(0, eq);
  *rest = value.substr(eq + 1);
  if (!k8s::IsExtendedResourceName(*resource)) {
    return PublishFailure{kPublishUsageError,
                          flag + " " + Show(value) + ": " + Show(*resource) +
                              " is not an extended resource name (domain/name)"};
  }
  return std::nullopt;
}

// Loads every --topology (with its --ids).
std::optional<PublishFailure> LoadTopologies(
    const PublishLoopFlags& flags, std::map<std::string, topology::Topology>* out,
    std::map<std::string, k8s::DeviceAttributes>* nvml_attributes,
    std::vector<std::string>* warnings,
    std::map<std::string, std::map<std::string, int>>* gpu_indexes) {
  std::map<std::string, std::string> ids_files;
  for (const std::string& value : flags.ids) {
    std::string resource, file;
    if (auto f = SplitResource("--ids", value, &resource, &file)) return f;
    if (ids_files.count(resource)) {
      return PublishFailure{kPublishUsageError, "--ids: resource " + resource + " given twice"};
    }
    auto abs = AbsolutePathFlag("--ids", file);
    if (!abs.ok()) return PublishFailure{kPublishUsageError, abs.status().message()};
    ids_files[resource] = *abs;
  }
  for (const std::string& value : flags.topologies) {
    std::string resource, source;
    if (auto f = SplitResource("--topology", value, &resource, &source)) return f;
    if (out->count(resource)) {
      return PublishFailure{kPublishUsageError,
                            "--topology: resource " + resource + " given twice"};
    }
    publish::TopologySource parsed = publish::ParseTopologySource(source);
    if (parsed.kind == publish::TopologySource::Kind::kFile) {
      auto abs = AbsolutePathFlag("--topology", source);
      if (!abs.ok()) return PublishFailure{kPublishUsageError, abs.status().message()};
      parsed.name = *abs;
    }
    bool usage = false;
    StatusOr<publish::LoadedTopology> loaded = publish::LoadTopology(
        parsed, {.library = flags.nvml_library, .sysfs_root = flags.sysfs_root}, &usage);
    if (!loaded.ok()) {
      // A file's error names the resource; a preset's or NVML's the value.
      return PublishFailure{
          usage ? kPublishUsageError : kPublishRuntimeError,
          "--topology " +
              (parsed.kind == publish::TopologySource::Kind::kFile ? resource : Show(value)) +
              ": " + loaded.status().message()};
    }
    for (const std::string& line : loaded->warnings) warnings->push_back(resource + ": " + line);
    if (loaded->nvml_attributes) (*nvml_attributes)[resource] = *loaded->nvml_attributes;
    if (!loaded->nvml_indexes.empty()) (*gpu_indexes)[resource] = loaded->nvml_indexes;
    StatusOr<topology::Topology> t = std::move(loaded->topology);
    if (auto it = ids_files.find(resource); it != ids_files.end()) {
      t = publish::ApplyIdsFile(*t, it->second);
      if (!t.ok()) {
        return PublishFailure{kPublishRuntimeError,
                              "--ids " + resource + ": " + t.status().message()};
      }
    }
    out->emplace(resource, *std::move(t));
  }
  for (const auto& [resource, _] : ids_files) {
    if (!out->count(resource)) {
      return PublishFailure{kPublishUsageError,
                            "--ids " + resource + ": no --topology for this resource"};
    }
  }
  return std::nullopt;
}

// Parses every --plugin-policy RESOURCE=POLICY.
std::optional<PublishFailure> ParsePluginPolicies(const std::vector<std::string>& values,
                                                  std::map<std::string, topology::Policy>* out) {
  for (const std::string& value : values) {
    std::string resource, name;
    if (auto f = SplitResource("--plugin-policy", value, &resource, &name)) return f;
    if (out->count(resource)) {
      return PublishFailure{kPublishUsageError,
                            "--plugin-policy: resource " + resource + " given twice"};
    }
    StatusOr<topology::Policy> policy = topology::ParsePolicy(name);
    if (!policy.ok()) {
      return PublishFailure{kPublishUsageError, "--plugin-policy " + Show(value) + ": " +
                                                    Show(name) +
                                                    " is not a policy (packed, best-set or "
                                                    "first-fit)"};
    }
    out->emplace(resource, *policy);
  }
  return std::nullopt;
}

// --node-name, the client flags, the durations (into out->options),
// --plugin-policy (into out->options.policies) and --attributes' shape.
std::optional<PublishFailure> CheckDurationsAndNames(
    const PublishLoopFlags& flags, const std::vector<std::string>& attribute_values,
    ClientFlags client, PublishSetup* out) {
  auto usage = [](std::string m) { return PublishFailure{kPublishUsageError, std::move(m)}; };
  if (flags.node_name.empty()) return usage("--node-name is required");
  if (!k8s::IsDns1123Subdomain(flags.node_name)) {
    return usage("--node-name " + Show(flags.node_name) +
                 " is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most "
                 "253 characters)");
  }
  // Without --kubeconfig or --in-cluster, the loading rules find the
  // config when the client is made (kube_flags.h).
  (void)client;
  if (Status s = CheckKubeClientFlags(flags.kube); !s.ok()) return usage(s.message());
  for (const auto& [name, text, field] :
       std::vector<std::tuple<std::string, std::string, std::chrono::milliseconds*>>{
           {"--interval", flags.interval, &out->options.interval},
           {"--min-write-interval", flags.min_write_interval, &out->options.min_write_interval},
           {"--resync", flags.resync, &out->options.resync},
           {"--timeout", flags.timeout, &out->options.timeout}}) {
    auto d = ParseDurationFlag(text);
    if (!d.ok()) return usage(name + ": " + d.status().message());
    if (d->count() <= 0 && name != "--min-write-interval") {
      return usage(name + ": must be more than 0");
    }
    *field = *d;
  }
  if (auto f = ParsePluginPolicies(flags.plugin_policies, &out->options.policies)) return f;
  auto attributes = ParseResourceAttributes(attribute_values);
  if (!attributes.ok()) return usage(attributes.status().message());
  return std::nullopt;
}

}  // namespace

bool PublishLoopFlags::any_given() const {
  const PublishLoopFlags defaults;
  return !node_name.empty() || !topologies.empty() || !ids.empty() || !plugin_policies.empty() ||
         !nvml_library.empty() || !sysfs_root.empty() || kube.given() ||
         interval != defaults.interval || min_write_interval != defaults.min_write_interval ||
         resync != defaults.resync || timeout != defaults.timeout;
}

void AddPublishLoopFlags(CLI::App* cmd, PublishLoopFlags* flags) {
  cmd->add_option("--node-name", flags->node_name, "The Node object to annotate")
      ->type_name("NODE");
  cmd->add_option("--topology", flags->topologies,
                  "RESOURCE=SOURCE: the links of RESOURCE's devices; SOURCE is preset:NAME, a "
                  "file (nvidia-smi topo -m text or kdm's JSON) or nvml (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--ids", flags->ids,
                  "RESOURCE=FILE: device ids of the topology's rows, the CSV of `nvidia-smi "
                  "--query-gpu=index,uuid --format=csv,noheader` (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--plugin-policy", flags->plugin_policies,
                  "RESOURCE=POLICY: the policy (packed, best-set or first-fit) the node's device "
                  "plugin of RESOURCE allocates with, published for the extender (repeatable; "
                  "default: none said)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--nvml-library", flags->nvml_library,
                  "The NVML library for --topology RESOURCE=nvml (default: libnvidia-ml.so.1 "
                  "from the loader's path)")
      ->type_name("PATH");
  cmd->add_option("--sysfs-root", flags->sysfs_root,
                  "Where sysfs is mounted, for the NUMA nodes of --topology RESOURCE=nvml "
                  "(default /sys)")
      ->type_name("DIR");
  AddKubeClientFlags(cmd, &flags->kube);
  cmd->add_option("--interval", flags->interval, "How often the node's devices are read")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--min-write-interval", flags->min_write_interval,
                  "At most one write per this interval (0: no limit)")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--resync", flags->resync, "Rewrite an unchanged value this long after the last")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--timeout", flags->timeout,
                  "Deadline of each pod-resources call and of each write to the API server")
      ->capture_default_str()
      ->type_name("DURATION");
}

std::optional<PublishFailure> CheckPublishFlags(const PublishLoopFlags& flags,
                                                const std::vector<std::string>& attribute_values,
                                                ClientFlags client) {
  PublishSetup scratch;
  if (auto f = CheckDurationsAndNames(flags, attribute_values, client, &scratch)) return f;
  std::set<std::string> ids, topologies;
  bool nvml = false;
  for (const std::string& value : flags.ids) {
    std::string resource, file;
    if (auto f = SplitResource("--ids", value, &resource, &file)) return f;
    if (!ids.insert(resource).second) {
      return PublishFailure{kPublishUsageError, "--ids: resource " + resource + " given twice"};
    }
  }
  for (const std::string& value : flags.topologies) {
    std::string resource, source;
    if (auto f = SplitResource("--topology", value, &resource, &source)) return f;
    if (!topologies.insert(resource).second) {
      return PublishFailure{kPublishUsageError,
                            "--topology: resource " + resource + " given twice"};
    }
    publish::TopologySource parsed = publish::ParseTopologySource(source);
    if (parsed.kind == publish::TopologySource::Kind::kNvml) nvml = true;
    if (parsed.kind == publish::TopologySource::Kind::kPreset) {
      bool usage = false;
      StatusOr<publish::LoadedTopology> preset = publish::LoadTopology(parsed, {}, &usage);
      if (!preset.ok()) {
        return PublishFailure{usage ? kPublishUsageError : kPublishRuntimeError,
                              "--topology " + Show(value) + ": " + preset.status().message()};
      }
    }
  }
  for (const std::string& resource : ids) {
    if (!topologies.count(resource)) {
      return PublishFailure{kPublishUsageError,
                            "--ids " + resource + ": no --topology for this resource"};
    }
  }
  if ((!flags.nvml_library.empty() || !flags.sysfs_root.empty()) && !nvml) {
    return PublishFailure{kPublishUsageError,
                          "--nvml-library and --sysfs-root need a --topology RESOURCE=nvml"};
  }
  return std::nullopt;
}

std::optional<PublishFailure> LoadPublishFlags(const PublishLoopFlags& flags,
                                               const std::vector<std::string>& attribute_values,
                                               ClientFlags client, PublishSetup* out) {
  if (auto f = CheckPublishFlags(flags, attribute_values, client)) return f;
  if (auto f = CheckDurationsAndNames(flags, attribute_values, client, out)) return f;
  auto usage = [](std::string m) { return PublishFailure{kPublishUsageError, std::move(m)}; };
  auto attributes = ParseResourceAttributes(attribute_values);
  if (!attributes.ok()) return usage(attributes.status().message());
  std::map<std::string, k8s::DeviceAttributes> nvml_attributes;
  if (auto f = LoadTopologies(flags, &out->options.topologies, &nvml_attributes, &out->warnings,
                              &out->gpu_indexes))
    return f;
  if ((!flags.nvml_library.empty() || !flags.sysfs_root.empty()) && nvml_attributes.empty()) {
    return usage("--nvml-library and --sysfs-root need a --topology RESOURCE=nvml");
  }
  out->options.node = flags.node_name;
  out->options.attributes = *std::move(attributes);
  // --attributes wins over NVML, resource by resource.
  for (auto& [resource, a] : nvml_attributes) {
    if (!a.empty()) out->options.attributes.emplace(resource, std::move(a));
  }
  // A value the API server refuses is never built at each poll, nor sent:
  // the topologies known now decide whether the node can be published.
  if (Status fits = publish::CheckAnnotationFits(out->options.node, out->options.topologies,
                                                 out->options.attributes);
      !fits.ok()) {
    return PublishFailure{kPublishRuntimeError,
                          "--topology: " + fits.message() +
                              "; nothing is sent: publish this node without --topology (its "
                              "devices and free devices only)"};
  }
  return std::nullopt;
}

}  // namespace kdm::cli
