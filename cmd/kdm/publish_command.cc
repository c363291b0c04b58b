// `kdm publish`: the node's devices, free devices and topology as the
// kdm.io/devices annotation (docs/publish.md), read from a pod-resources
// socket (a real kubelet's or `kdm kubelet`'s). `--dry-run` prints the
// annotation once and exits; otherwise kube::Publisher polls and writes it to
// the Node object through the API server client.
//
// Exit codes: 0 ok (--dry-run printed), 1 runtime error (the socket cannot
// be read, a topology or ids file cannot be read or parsed), 2 usage (bad or
// missing flags; no API server client to write with yet).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "duration_flag.h"
#include "kdm/base/env.h"
#include "kdm/base/log_value.h"
#include "kdm/devicemanager/pod_resources_client.h"
#include "kdm/kube/annotation.h"
#include "kdm/kube/publisher.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

namespace kdm::cli {
namespace {

constexpr int kOk = 0;
constexpr int kRuntimeError = 1;
constexpr int kUsageError = 2;

// The largest --ids file read (a few hundred GPUs are a few KiB).
constexpr uint64_t kMaxIdsFileBytes = 1 << 20;

struct PublishFlags {
  std::string node_name;
  std::string socket;
  std::vector<std::string> topologies;  // RESOURCE=SOURCE (repeatable)
  std::vector<std::string> attributes;  // RESOURCE=KEY=VALUE,... (repeatable)
  std::vector<std::string> ids;         // RESOURCE=FILE (repeatable)
  std::string kubeconfig;
  bool in_cluster = false;
  bool dry_run = false;
  std::string interval = "1s";
  std::string min_write_interval = "1s";
  std::string resync = "5m";
  std::string timeout = "5s";
  int verbosity = 0;
};

// A flag error (exit 2) or a runtime error (exit 1), with its message.
struct Failure {
  int code;
  std::string message;
};

std::string Show(const std::string& s) { return QuoteLogValue(s, kMaxLogValueBytes); }

// Splits "RESOURCE=REST" and checks the resource name.
std::optional<Failure> SplitResource(const std::string& flag, const std::string& value,
                                     std::string* resource, std::string* rest) {
  size_t eq = value.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == value.size()) {
    return Failure{kUsageError, flag + " " + Show(value) +
                                    ": expected RESOURCE=" + (flag == "--ids" ? "FILE" : "SOURCE")};
  }
  *resource = value.substr(0, eq);
  *rest = value.substr(eq + 1);
  if (!pluginapi::IsExtendedResourceName(*resource)) {
    return Failure{kUsageError, flag + " " + Show(value) + ": " + Show(*resource) +
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
    if (id.empty() || id.size() > kube::kMaxNameBytes || !printable) {
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

// Loads every --topology (with its --ids).
std::optional<Failure> LoadTopologies(const PublishFlags& flags,
                                      std::map<std::string, topology::Topology>* out) {
  std::map<std::string, std::string> ids_files;
  for (const std::string& value : flags.ids) {
    std::string resource, file;
    if (auto f = SplitResource("--ids", value, &resource, &file)) return f;
    if (ids_files.count(resource)) {
      return Failure{kUsageError, "--ids: resource " + resource + " given twice"};
    }
    auto abs = AbsolutePathFlag("--ids", file);
    if (!abs.ok()) return Failure{kUsageError, abs.status().message()};
    ids_files[resource] = *abs;
  }
  for (const std::string& value : flags.topologies) {
    std::string resource, source;
    if (auto f = SplitResource("--topology", value, &resource, &source)) return f;
    if (out->count(resource)) {
      return Failure{kUsageError, "--topology: resource " + resource + " given twice"};
    }
    StatusOr<topology::Topology> t = InvalidArgumentError("");
    if (source == "nvml") {
      return Failure{kRuntimeError, "--topology " + Show(value) +
                                        ": nvml is not built into this kdm (NVML support is not "
                                        "there yet); use preset:NAME or a file"};
    } else if (source.rfind("preset:", 0) == 0) {
      t = topology::Preset(source.substr(7));
      if (!t.ok()) {
        return Failure{kUsageError, "--topology " + Show(value) + ": " + t.status().message()};
      }
    } else {
      auto abs = AbsolutePathFlag("--topology", source);
      if (!abs.ok()) return Failure{kUsageError, abs.status().message()};
      t = topology::LoadTopologyFile(*abs);
      if (!t.ok()) {
        return Failure{kRuntimeError, "--topology " + resource + ": " + t.status().message()};
      }
    }
    if (auto it = ids_files.find(resource); it != ids_files.end()) {
      StatusOr<std::string> text = Env::Default()->ReadFile(it->second, kMaxIdsFileBytes);
      if (!text.ok()) {
        return Failure{kRuntimeError, "--ids " + resource + ": " + text.status().message()};
      }
      StatusOr<std::vector<std::string>> ids = ParseIdsCsv(*text, t->size());
      if (!ids.ok()) {
        return Failure{kRuntimeError,
                       "--ids " + resource + ": " + it->second + ": " + ids.status().message()};
      }
      StatusOr<topology::Topology> renamed = Rename(*t, *ids);
      if (!renamed.ok()) {
        return Failure{kRuntimeError,
                       "--ids " + resource + ": " + it->second + ": " + renamed.status().message()};
      }
      t = std::move(renamed);
    }
    out->emplace(resource, *std::move(t));
  }
  for (const auto& [resource, _] : ids_files) {
    if (!out->count(resource)) {
      return Failure{kUsageError, "--ids " + resource + ": no --topology for this resource"};
    }
  }
  return std::nullopt;
}

// Reads the node through the pod-resources API.
class PodResourcesSource final : public kube::DeviceSource {
 public:
  explicit PodResourcesSource(std::unique_ptr<devicemanager::PodResourcesClient> client)
      : client_(std::move(client)) {}

  StatusOr<kube::NodeDevices> Read() override {
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

 private:
  std::unique_ptr<devicemanager::PodResourcesClient> client_;
};

// The API server writer comes with the kube-apiserver client.
StatusOr<std::unique_ptr<kube::AnnotationWriter>> MakeApiServerWriter(const PublishFlags&) {
  return UnimplementedError(
      "writing to the API server is not built into this kdm yet (the kube-apiserver client is "
      "still to come); use --dry-run to print the annotation");
}

int RunPublish(const PublishFlags& flags) {
  SetUpStderrLogging("publish", flags.verbosity >= 1 ? spdlog::level::debug : spdlog::level::info);
  auto fail = [](const Failure& f) {
    std::cerr << "kdm publish: " << f.message << "\n";
    return f.code;
  };
  auto usage = [&](const std::string& m) { return fail({kUsageError, m}); };
  if (flags.node_name.empty()) return usage("--node-name is required");
  if (!pluginapi::IsDns1123Subdomain(flags.node_name)) {
    return usage("--node-name " + Show(flags.node_name) +
                 " is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most "
                 "253 characters)");
  }
  if (flags.socket.empty()) return usage("--pod-resources-socket is required");
  if (!flags.kubeconfig.empty() && flags.in_cluster) {
    return usage("--kubeconfig and --in-cluster: give one, not both");
  }
  if (!flags.dry_run && flags.kubeconfig.empty() && !flags.in_cluster) {
    return usage("one of --kubeconfig FILE or --in-cluster is required (or --dry-run)");
  }
  std::map<std::string, std::chrono::milliseconds> durations;
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"--interval", flags.interval},
           {"--min-write-interval", flags.min_write_interval},
           {"--resync", flags.resync},
           {"--timeout", flags.timeout}}) {
    auto d = ParseDurationFlag(text);
    if (!d.ok()) return usage(name + ": " + d.status().message());
    if (d->count() <= 0 && name != "--min-write-interval") {
      return usage(name + ": must be more than 0");
    }
    durations[name] = *d;
  }
  if (flags.verbosity < 0) return usage("-v: must be 0 or more");
  auto socket = AbsolutePathFlag("--pod-resources-socket", flags.socket);
  if (!socket.ok()) return usage(socket.status().message());
  if (Status s = CheckSocketPathFlag("--pod-resources-socket", *socket); !s.ok()) {
    return usage(s.message());
  }
  auto attributes = ParseResourceAttributes(flags.attributes);
  if (!attributes.ok()) return usage(attributes.status().message());
  std::map<std::string, topology::Topology> topologies;
  if (auto f = LoadTopologies(flags, &topologies)) return fail(*f);

  auto client = devicemanager::PodResourcesClient::Connect(
      {.socket_path = *socket, .timeout = durations["--timeout"]});
  if (!client.ok()) return fail({kRuntimeError, client.status().message()});
  PodResourcesSource source(std::move(*client));

  if (flags.dry_run) {
    StatusOr<kube::NodeDevices> devices = source.Read();
    if (!devices.ok()) return fail({kRuntimeError, devices.status().message()});
    std::vector<std::string> warnings;
    kube::DevicesAnnotation a = kube::BuildDevicesAnnotation(
        flags.node_name, kube::FormatRfc3339(std::chrono::system_clock::now()), *devices,
        topologies, *attributes, &warnings);
    for (const std::string& w : warnings) std::cerr << "kdm publish: warning: " << w << "\n";
    std::cout << kube::EncodeDevicesAnnotation(a) << "\n";
    return kOk;
  }

  auto writer = MakeApiServerWriter(flags);
  if (!writer.ok()) return usage(writer.status().message());

  // Block the stop signals before the loop's thread exists; only sigwait
  // below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  kube::Publisher::Options options;
  options.node = flags.node_name;
  options.topologies = std::move(topologies);
  options.attributes = std::move(*attributes);
  options.interval = durations["--interval"];
  options.min_write_interval = durations["--min-write-interval"];
  options.resync = durations["--resync"];
  kube::Publisher publisher(std::move(options), &source, writer->get(), kube::RealPublishClock());
  std::thread loop([&publisher] { publisher.Run(); });
  int signal = 0;
  sigwait(&stop_signals, &signal);
  spdlog::info("event=publish_stopping signal={}", signal);
  publisher.Stop();
  loop.join();
  return kOk;
}

}  // namespace

void AddPublishCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<PublishFlags>();
  auto* cmd = app.add_subcommand(
      "publish",
      "Publish the node's devices, free devices and topology as the kdm.io/devices annotation");
  cmd->add_option("--node-name", flags->node_name, "The Node object to annotate")
      ->type_name("NODE");
  cmd->add_option("--pod-resources-socket", flags->socket,
                  "The kubelet's pod-resources socket (e.g. "
                  "/var/lib/kubelet/pod-resources/kubelet.sock, or DIR/pod-resources/kubelet.sock "
                  "of `kdm kubelet --root DIR`)")
      ->type_name("PATH");
  cmd->add_option("--topology", flags->topologies,
                  "RESOURCE=SOURCE: the links of RESOURCE's devices; SOURCE is preset:NAME, a "
                  "file (nvidia-smi topo -m text or kdm's JSON) or nvml (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--attributes", flags->attributes,
                  "RESOURCE=KEY=VALUE,...: what is known of RESOURCE's devices (model, "
                  "memory_mib, driver, cuda, arch, brand) (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--ids", flags->ids,
                  "RESOURCE=FILE: device ids of the topology's rows, the CSV of `nvidia-smi "
                  "--query-gpu=index,uuid --format=csv,noheader` (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--kubeconfig", flags->kubeconfig, "Reach the API server with this kubeconfig")
      ->type_name("FILE");
  cmd->add_flag("--in-cluster", flags->in_cluster,
                "Reach the API server as a pod (service account token and CA)");
  cmd->add_flag("--dry-run", flags->dry_run, "Print the annotation JSON once and exit");
  cmd->add_option("--interval", flags->interval, "How often the socket is polled")
      ->capture_default_str();
  cmd->add_option("--min-write-interval", flags->min_write_interval,
                  "At most one write per this interval")
      ->capture_default_str();
  cmd->add_option("--resync", flags->resync, "Rewrite an unchanged value this long after the last")
      ->capture_default_str();
  cmd->add_option("--timeout", flags->timeout, "Deadline of each pod-resources call")
      ->capture_default_str();
  cmd->add_option("-v", flags->verbosity, "Log verbosity: 0 info, 1 debug")->capture_default_str();
  cmd->callback([flags, &exit_code] { exit_code = RunPublish(*flags); });
}

}  // namespace kdm::cli
