#include "publish_flags.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "cli_common.h"
#include "duration_flag.h"
#include "kdm/base/env.h"
#include "kdm/base/log_value.h"
#include "kdm/k8s/names.h"
#include "kdm/nvml/discovery.h"
#include "kdm/nvml/library.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

namespace kdm::cli {
namespace {

// The largest --ids file read (a few hundred GPUs are a few KiB).
constexpr uint64_t kMaxIdsFileBytes = 1 << 20;

std::string Show(const std::string& s) { return QuoteLogValue(s, kMaxLogValueBytes); }

// Splits "RESOURCE=REST" and checks the resource name.
std::optional<PublishFailure> SplitResource(const std::string& flag, const std::string& value,
                                            std::string* resource, std::string* rest) {
  size_t eq = value.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == value.size()) {
    return PublishFailure{kPublishUsageError, flag + " " + Show(value) + ": expected RESOURCE=" +
                                                  (flag == "--ids" ? "FILE" : "SOURCE")};
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

// Parses the CSV of `nvidia-smi --query-gpu=index,uuid --format=csv,noheader`
// ("0, GPU-8f6c..."): row index -> device id, for `rows` rows.
StatusOr<std::vector<std::string>> ParseIdsCsv(const std::string& text, int rows) {
  std::vector<std::optional<std::string>> ids(rows);
  int count = 0;
  size_t start = 0;
  int line_no = 0;
  auto trim = [](std::string s) {
    size_t a = s.find_first_not_of(" \t\r");
    size_t b = s.find_last_not_of(" \t\r");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  };
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    start = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    if (trim(line).empty()) continue;
    const std::string at = "line " + std::to_string(line_no) + ": ";
    size_t comma = line.find(',');
    if (comma == std::string::npos) {
      return InvalidArgumentError(at + "expected INDEX, UUID, got " + Show(line));
    }
    std::string index_text = trim(line.substr(0, comma));
    std::string id = trim(line.substr(comma + 1));
    if (index_text.empty() || index_text.size() > 6 ||
        index_text.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgumentError(at + "index " + Show(index_text) + " is not a number");
    }
    int index = std::stoi(index_text);
    if (index >= rows) {
      return InvalidArgumentError(at + "index " + index_text + " is past the topology's " +
                                  std::to_string(rows) + " devices");
    }
    bool printable = std::all_of(id.begin(), id.end(), [](char c) {
      return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7f;
    });
    if (id.empty() || id.size() > k8s::kMaxNameBytes || !printable) {
      return InvalidArgumentError(at + "bad device id " + Show(id) +
                                  " (1 to 253 printable bytes, no blank)");
    }
    if (ids[index]) return InvalidArgumentError(at + "index " + index_text + " given twice");
    ids[index] = id;
    ++count;
  }
  if (count != rows) {
    return InvalidArgumentError(std::to_string(count) + " rows, the topology has " +
                                std::to_string(rows) + " devices");
  }
  std::vector<std::string> out;
  for (auto& id : ids) out.push_back(*id);
  return out;
}

// The topology with its device ids replaced, row by row.
StatusOr<topology::Topology> Rename(const topology::Topology& t,
                                    const std::vector<std::string>& ids) {
  std::vector<topology::DeviceInfo> infos = t.devices();
  std::vector<std::vector<topology::Link>> links(t.size());
  for (int i = 0; i < t.size(); ++i) {
    infos[i].id = ids[i];
    for (int j = 0; j < t.size(); ++j) links[i].push_back(t.LinkBetween(i, j));
  }
  return topology::Topology::Create(std::move(infos), std::move(links));
}

// What NVML says of the node's GPUs: their topology (device ids are the
// UUIDs, as NVIDIA's plugin and `kdm plugin --nvml` name them) and the
// attributes of the first GPU (a node's GPUs are one model).
struct NvmlResource {
  topology::Topology topology;
  k8s::DeviceAttributes attributes;
  std::vector<std::string> warnings;
};

StatusOr<NvmlResource> ReadNvml(const nvml::Library* library, const PublishLoopFlags& flags) {
  nvml::DiscoveryOptions options;
  if (!flags.sysfs_root.empty()) options.sysfs_root = flags.sysfs_root;
  KDM_ASSIGN_OR_RETURN(nvml::NodeInfo node, nvml::Discover(*library, options));
  KDM_ASSIGN_OR_RETURN(nvml::NvmlTopology t, nvml::DiscoverTopology(*library, node));
  NvmlResource out{std::move(t.topology), {}, std::move(t.ignored)};
  if (node.gpus.empty()) return out;
  // Discovery already put each value through the attribute checks.
  out.attributes = node.gpus.front().attributes;
  for (const std::string& w : node.gpus.front().attribute_warnings) out.warnings.push_back(w);
  return out;
}

// Loads every --topology (with its --ids).
std::optional<PublishFailure> LoadTopologies(
    const PublishLoopFlags& flags, std::map<std::string, topology::Topology>* out,
    std::map<std::string, k8s::DeviceAttributes>* nvml_attributes,
    std::vector<std::string>* warnings) {
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
    StatusOr<topology::Topology> t = InvalidArgumentError("");
    if (source == "nvml") {
      // A machine without NVML is a usage error (exit 2), as for `kdm plugin
      // --nvml` and `kdm topo --nvml`: the one line says what is missing.
      StatusOr<std::unique_ptr<nvml::Library>> library = nvml::Library::Load(flags.nvml_library);
      if (!library.ok()) {
        return PublishFailure{library.status().code() == StatusCode::kNotFound
                                  ? kPublishUsageError
                                  : kPublishRuntimeError,
                              "--topology " + Show(value) + ": " + library.status().message()};
      }
      StatusOr<NvmlResource> n = ReadNvml(library->get(), flags);
      if (!n.ok()) {
        return PublishFailure{kPublishRuntimeError,
                              "--topology " + Show(value) + ": " + n.status().message()};
      }
      for (const std::string& line : n->warnings) warnings->push_back(resource + ": " + line);
      (*nvml_attributes)[resource] = n->attributes;
      t = std::move(n->topology);
    } else if (source.rfind("preset:", 0) == 0) {
      t = topology::Preset(source.substr(7));
      if (!t.ok()) {
        return PublishFailure{kPublishUsageError,
                              "--topology " + Show(value) + ": " + t.status().message()};
      }
    } else {
      auto abs = AbsolutePathFlag("--topology", source);
      if (!abs.ok()) return PublishFailure{kPublishUsageError, abs.status().message()};
      t = topology::LoadTopologyFile(*abs);
      if (!t.ok()) {
        return PublishFailure{kPublishRuntimeError,
                              "--topology " + resource + ": " + t.status().message()};
      }
    }
    if (auto it = ids_files.find(resource); it != ids_files.end()) {
      StatusOr<std::string> text = Env::Default()->ReadFile(it->second, kMaxIdsFileBytes);
      if (!text.ok()) {
        return PublishFailure{kPublishRuntimeError,
                              "--ids " + resource + ": " + text.status().message()};
      }
      StatusOr<std::vector<std::string>> ids = ParseIdsCsv(*text, t->size());
      if (!ids.ok()) {
        return PublishFailure{kPublishRuntimeError, "--ids " + resource + ": " + it->second + ": " +
                                                        ids.status().message()};
      }
      StatusOr<topology::Topology> renamed = Rename(*t, *ids);
      if (!renamed.ok()) {
        return PublishFailure{kPublishRuntimeError, "--ids " + resource + ": " + it->second + ": " +
                                                        renamed.status().message()};
      }
      t = std::move(renamed);
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

}  // namespace

StatusOr<kube::NodeDevices> PodResourcesSource::Read() {
  kube::NodeDevices out;
  KDM_ASSIGN_OR_RETURN(std::vector<devicemanager::ContainerDevices> allocatable,
                       client_->GetAllocatableResources());
  for (const auto& d : allocatable) {
    auto& ids = out.allocatable[d.resource_name];
    std::optional<int> numa;
    if (d.numa_node && *d.numa_node >= 0 && *d.numa_node <= 1 << 20) {
      numa = static_cast<int>(*d.numa_node);
    }
    for (const std::string& id : d.device_ids) {
      // A device on several NUMA nodes is listed once per node: the first wins.
      ids.emplace(id, numa);
    }
  }
  KDM_ASSIGN_OR_RETURN(std::vector<devicemanager::PodResources> pods, client_->List());
  for (const auto& pod : pods) {
    for (const auto& c : pod.containers) {
      for (const auto& d : c.devices) {
        out.in_use[d.resource_name].insert(d.device_ids.begin(), d.device_ids.end());
      }
    }
  }
  return out;
}

bool PublishLoopFlags::any_given() const {
  const PublishLoopFlags defaults;
  return !node_name.empty() || !topologies.empty() || !ids.empty() || !nvml_library.empty() ||
         !sysfs_root.empty() || kube.given() || interval != defaults.interval ||
         min_write_interval != defaults.min_write_interval || resync != defaults.resync ||
         timeout != defaults.timeout;
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
      ->capture_default_str();
  cmd->add_option("--min-write-interval", flags->min_write_interval,
                  "At most one write per this interval (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--resync", flags->resync, "Rewrite an unchanged value this long after the last")
      ->capture_default_str();
  cmd->add_option("--timeout", flags->timeout,
                  "Deadline of each pod-resources call and of each write to the API server")
      ->capture_default_str();
}

std::optional<PublishFailure> LoadPublishFlags(const PublishLoopFlags& flags,
                                               const std::vector<std::string>& attribute_values,
                                               ClientFlags client, PublishSetup* out) {
  auto usage = [](std::string m) { return PublishFailure{kPublishUsageError, std::move(m)}; };
  if (flags.node_name.empty()) return usage("--node-name is required");
  if (!k8s::IsDns1123Subdomain(flags.node_name)) {
    return usage("--node-name " + Show(flags.node_name) +
                 " is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most "
                 "253 characters)");
  }
  if (Status s = CheckKubeClientFlags(flags.kube, client != ClientFlags::kOptional); !s.ok()) {
    const bool missing = !flags.kube.given();
    return usage(s.message() + (missing && client == ClientFlags::kRequiredUnlessDryRun
                                    ? " (or --dry-run)"
                                    : ""));
  }
  for (const auto& [name, text, field] :
       std::vector<std::tuple<std::string, std::string, std::chrono::milliseconds*>>{
           {"--interval", flags.interval, &out->interval},
           {"--min-write-interval", flags.min_write_interval, &out->min_write_interval},
           {"--resync", flags.resync, &out->resync},
           {"--timeout", flags.timeout, &out->timeout}}) {
    auto d = ParseDurationFlag(text);
    if (!d.ok()) return usage(name + ": " + d.status().message());
    if (d->count() <= 0 && name != "--min-write-interval") {
      return usage(name + ": must be more than 0");
    }
    *field = *d;
  }
  auto attributes = ParseResourceAttributes(attribute_values);
  if (!attributes.ok()) return usage(attributes.status().message());
  std::map<std::string, k8s::DeviceAttributes> nvml_attributes;
  if (auto f = LoadTopologies(flags, &out->topologies, &nvml_attributes, &out->warnings)) return f;
  if ((!flags.nvml_library.empty() || !flags.sysfs_root.empty()) && nvml_attributes.empty()) {
    return usage("--nvml-library and --sysfs-root need a --topology RESOURCE=nvml");
  }
  out->node = flags.node_name;
  out->attributes = *std::move(attributes);
  // --attributes wins over NVML, resource by resource.
  for (auto& [resource, a] : nvml_attributes) {
    if (!a.empty()) out->attributes.emplace(resource, std::move(a));
  }
  return std::nullopt;
}

std::unique_ptr<PublishLoop> PublishLoop::Start(PublishSetup setup,
                                                std::unique_ptr<kube::DeviceSource> source,
                                                std::unique_ptr<kube::Client> client) {
  std::unique_ptr<PublishLoop> loop(new PublishLoop());
  loop->client_ = std::move(client);
  loop->writer_ = std::make_unique<kube::NodeAnnotationWriter>(loop->client_.get(), setup.timeout);
  loop->source_ = std::move(source);
  kube::Publisher::Options options;
  options.node = setup.node;
  options.topologies = std::move(setup.topologies);
  options.attributes = std::move(setup.attributes);
  options.interval = setup.interval;
  options.min_write_interval = setup.min_write_interval;
  options.resync = setup.resync;
  loop->publisher_ = std::make_unique<kube::Publisher>(std::move(options), loop->source_.get(),
                                                       loop->writer_.get());
  kube::Publisher* publisher = loop->publisher_.get();
  loop->thread_ = std::thread([publisher] { publisher->Run(); });
  return loop;
}

void PublishLoop::Stop() {
  if (publisher_) publisher_->Stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kdm::cli
