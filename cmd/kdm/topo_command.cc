// `kdm topo`: explains the best device set for a request on a topology, beside
// what first-fit would pick; `kdm topo presets` lists the built-in machines;
// `kdm topo show` prints a topology as `nvidia-smi topo -m` would.
// `kdm topo --nvml` reads the node's own GPUs through NVML (docs/nvml.md):
// without --size it prints their matrix and attributes, with --size it
// answers as the NVIDIA GPU plugin's GetPreferredAllocation would.
//
// Exit codes: 0 success; 1 a runtime error (a file that cannot be read or
// parsed, an id or index the topology does not know, an impossible request,
// an NVML call that fails); 2 bad usage (missing or conflicting flags, a
// malformed number or list, an unknown preset or policy) and a machine
// without NVML (one line: `NVML not found: ...; is the NVIDIA driver
// installed?`).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "duration_flag.h"
#include "kdm/base/log_value.h"
#include "kdm/k8s/attributes.h"
#include "kdm/nvml/discovery.h"
#include "kdm/nvml/library.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"
#include "kdm/topology/topology.h"

namespace kdm::cli {
namespace {

using topology::Allocation;
using topology::Topology;

// An error with the exit code it maps to. A bare one is printed as it is,
// without the command's prefix or the usage hint.
struct Failure {
  int code;
  std::string message;
  bool bare = false;
};

int TopoFail(const Failure& f) {
  if (f.bare) {
    std::cerr << f.message << "\n";
    return f.code;
  }
  std::cerr << "kdm topo: " << f.message << "\n";
  if (f.code == kUsageError) std::cerr << "Run 'kdm topo --help' for usage.\n";
  return f.code;
}

std::optional<int> ParseNonNegative(std::string_view s) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// A value from the driver (a UUID, a bus id, a version) in the table: as it is
// when it is one word of printable ASCII, else quoted with its control bytes
// escaped (QuoteLogValue), so a UUID holding a newline or an escape sequence
// neither starts a line of its own nor reaches the terminal raw.
std::string TableText(const std::string& s) {
  bool plain = std::all_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7f && c != '"' && c != '\\';
  });
  return plain ? s : QuoteLogValue(s, kMaxLogValueBytes);
}

struct Source {
  std::string preset;
  std::string file;
  bool nvml = false;
  std::string nvml_library;  // empty: libnvidia-ml.so.1 through the loader's path
  std::string sysfs_root;    // empty: /sys
};

// What NVML told about the node, beside the topology.
struct NvmlFacts {
  nvml::NodeInfo node;
  std::vector<std::string> ignored;
};

// The node's topology from NVML.
std::variant<Topology, Failure> LoadNvml(const Source& src, std::string* label, NvmlFacts* facts) {
  auto library = nvml::Library::Load(src.nvml_library);
  if (!library.ok()) {
    const std::string& m = library.status().message();
    if (m.rfind("NVML not found: ", 0) == 0) return Failure{kUsageError, m, /*bare=*/true};
    return Failure{kRuntimeError, m};
  }
  nvml::DiscoveryOptions options;
  if (!src.sysfs_root.empty()) options.sysfs_root = src.sysfs_root;
  auto node = nvml::Discover(**library, options);
  if (!node.ok()) return Failure{kRuntimeError, node.status().message()};
  auto t = nvml::DiscoverTopology(**library, *node);
  if (!t.ok()) return Failure{kRuntimeError, t.status().message()};
  for (const std::string& line : t->ignored) {
    std::cerr << "kdm topo: warning: " << line << "\n";
  }
  *label = "NVML (" + (*library)->path() + ")";
  if (facts != nullptr) *facts = NvmlFacts{std::move(*node), t->ignored};
  return std::move(t->topology);
}

// The pure checks of --preset, --topology and --nvml (exactly one; a known
// preset): what `kdm --dry-run topo` checks. nullopt when fine.
std::optional<Failure> CheckSource(const Source& src) {
  if (!src.nvml && (!src.nvml_library.empty() || !src.sysfs_root.empty())) {
    return Failure{kUsageError, "--nvml-library and --sysfs-root need --nvml"};
  }
  if (src.nvml ? (!src.preset.empty() || !src.file.empty())
               : src.preset.empty() == src.file.empty()) {
    return Failure{kUsageError, "give exactly one of --preset NAME, --topology FILE or --nvml"};
  }
  if (!src.preset.empty()) {
    if (auto t = topology::Preset(src.preset); !t.ok()) {
      return Failure{kUsageError, t.status().message()};
    }
  }
  return std::nullopt;
}

// Loads the topology named by --preset, --topology or --nvml (exactly one).
std::variant<Topology, Failure> LoadSource(const Source& src, std::string* label,
                                           NvmlFacts* facts = nullptr) {
  if (!src.nvml && (!src.nvml_library.empty() || !src.sysfs_root.empty())) {
    return Failure{kUsageError, "--nvml-library and --sysfs-root need --nvml"};
  }
  if (src.nvml) {
    if (!src.preset.empty() || !src.file.empty()) {
      return Failure{kUsageError, "give exactly one of --preset NAME, --topology FILE or --nvml"};
    }
    return LoadNvml(src, label, facts);
  }
  if (src.preset.empty() == src.file.empty()) {
    return Failure{kUsageError, "give exactly one of --preset NAME, --topology FILE or --nvml"};
  }
  if (!src.preset.empty()) {
    auto t = topology::Preset(src.preset);
    if (!t.ok()) return Failure{kUsageError, t.status().message()};
    *label = "preset " + src.preset;
    return std::move(*t);
  }
  auto t = topology::LoadTopologyFile(src.file);
  if (!t.ok()) return Failure{kRuntimeError, t.status().message()};
  *label = src.file;
  return std::move(*t);
}

// "0,1,4-7,GPU-abc": indices, ranges of indices, or device ids.
std::variant<std::vector<int>, Failure> ParseDeviceList(const Topology& t, const std::string& flag,
                                                        const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) {
      return Failure{kUsageError, flag + " '" + text + "' has an empty element"};
    }
    size_t dash = item.find('-', 1);
    if (AllDigits(item)) {
      auto v = ParseNonNegative(item);
      if (!v) return Failure{kUsageError, flag + ": '" + item + "' is not a device index"};
      if (*v >= t.size()) {
        return Failure{kRuntimeError, flag + ": device index " + item +
                                          " is outside the topology (" + std::to_string(t.size()) +
                                          " devices)"};
      }
      out.push_back(*v);
    } else if (dash != std::string::npos && AllDigits(item.substr(0, dash)) &&
               AllDigits(item.substr(dash + 1))) {
      auto lo = ParseNonNegative(item.substr(0, dash));
      auto hi = ParseNonNegative(item.substr(dash + 1));
      if (!lo || !hi || *lo > *hi) {
        return Failure{kUsageError, flag + ": '" + item + "' is not a range of indices"};
      }
      if (*hi >= t.size()) {
        return Failure{kRuntimeError, flag + ": range " + item + " goes outside the topology (" +
                                          std::to_string(t.size()) + " devices)"};
      }
      for (int i = *lo; i <= *hi; ++i) out.push_back(i);
    } else if (auto i = t.IndexOf(item)) {
      out.push_back(*i);
    } else {
      return Failure{kRuntimeError, flag + ": device id '" + item + "' is not in the topology"};
    }
  }
  return out;
}

std::string Join(const std::vector<int>& v) {
  if (v.empty()) return "none";
  std::string out;
  for (int i : v) out += (out.empty() ? "" : ",") + std::to_string(i);
  return out;
}

std::string Ids(const Topology& t, const std::vector<int>& v) {
  std::string out;
  for (int i : v) out += (out.empty() ? "" : ", ") + TableText(t.Device(i).id);
  return out;
}

struct AllocateFlags {
  Source source;
  std::string size;
  std::string available;
  std::string must_include;
  std::string policy{topology::PolicyName(topology::kDefaultPolicy)};
  std::string budget = "50ms";
  std::string budget_ms;  // the old --budget-ms MS, still taken
  bool json = false;
  int verbosity = 0;
};

int RunNvmlShow(const Source& source, bool json);

int RunAllocate(const AllocateFlags& f) {
  if (f.size.empty() && f.source.nvml && f.available.empty() && f.must_include.empty()) {
    if (auto e = CheckSource(f.source)) return TopoFail(*e);
    if (DryRun()) return kOk;
    return RunNvmlShow(f.source, f.json);
  }
  if (f.size.empty()) return TopoFail({kUsageError, "--size N is required"});
  auto size = ParseNonNegative(f.size);
  if (!size) return TopoFail({kUsageError, "--size '" + f.size + "' is not a number"});
  if (*size < 1) return TopoFail({kUsageError, "--size must be at least 1, got " + f.size});
  auto policy = topology::ParsePolicy(f.policy);
  if (!policy.ok()) return TopoFail({kUsageError, policy.status().message()});
  StatusOr<std::chrono::milliseconds> budget = ParseDurationFlag(f.budget);
  if (!budget.ok()) return TopoFail({kUsageError, "--budget: " + budget.status().message()});
  if (!f.budget_ms.empty()) {
    auto ms = ParseNonNegative(f.budget_ms);
    if (!ms) return TopoFail({kUsageError, "--budget-ms '" + f.budget_ms + "' is not a number"});
    budget = std::chrono::milliseconds(*ms);
  }
  if (auto e = CheckSource(f.source)) return TopoFail(*e);
  if (DryRun()) return kOk;

  std::string label;
  auto loaded = LoadSource(f.source, &label);
  if (auto* e = std::get_if<Failure>(&loaded)) return TopoFail(*e);
  const Topology& t = std::get<Topology>(loaded);

  std::vector<int> available;
  if (f.available.empty()) {
    for (int i = 0; i < t.size(); ++i) available.push_back(i);
  } else {
    auto list = ParseDeviceList(t, "--available", f.available);
    if (auto* e = std::get_if<Failure>(&list)) return TopoFail(*e);
    available = std::get<std::vector<int>>(list);
  }
  std::vector<int> must;
  if (!f.must_include.empty()) {
    auto list = ParseDeviceList(t, "--must-include", f.must_include);
    if (auto* e = std::get_if<Failure>(&list)) return TopoFail(*e);
    must = std::get<std::vector<int>>(list);
  }

  topology::AllocateOptions options;
  options.budget = *budget;
  auto chosen = topology::Allocate(t, available, must, *size, *policy, options);
  if (!chosen.ok()) return TopoFail({kRuntimeError, chosen.status().message()});
  auto first_fit =
      topology::Allocate(t, available, must, *size, topology::Policy::kFirstFit, options);
  if (!first_fit.ok()) return TopoFail({kRuntimeError, first_fit.status().message()});

  if (f.json) {
    nlohmann::ordered_json out;
    out["chosen"] = chosen->chosen;
    std::vector<std::string> ids;
    for (int i : chosen->chosen) ids.push_back(t.Device(i).id);
    out["ids"] = ids;
    out["score"] = chosen->score;
    out["packed_score"] = chosen->packed_score;
    out["optimal"] = chosen->optimal;
    out["first_fit"] = {{"chosen", first_fit->chosen}, {"score", first_fit->score}};
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::cout << "topology:   " << label << " (" << t.size() << " devices)\n"
            << "request:    " << *size << " device" << (*size == 1 ? "" : "s") << ", policy "
            << topology::PolicyName(*policy) << ", available " << Join(available)
            << ", must-include " << Join(must) << "\n"
            << "chosen:     " << Join(chosen->chosen) << " (" << Ids(t, chosen->chosen)
            << ")  score " << chosen->score << ", packed score " << chosen->packed_score
            << (chosen->optimal ? " (optimal)"
                                : " (best found within the budget, not proven optimal)")
            << "\n"
            << "first-fit:  " << Join(first_fit->chosen) << " (" << Ids(t, first_fit->chosen)
            << ")  score " << first_fit->score << ", packed score " << first_fit->packed_score
            << "\n";
  return 0;
}

int RunPresets() {
  std::cout << "NAME            GPUS  DESCRIPTION\n";
  for (const auto& p : topology::PresetInfos()) {
    std::string name = p.name;
    name.resize(std::max<size_t>(name.size(), 16), ' ');
    std::string gpus = std::to_string(p.devices);
    std::cout << name << std::string(4 - std::min<size_t>(4, gpus.size()), ' ') << gpus << "  "
              << p.description << "\n"
              << std::string(22, ' ') << "source: " << p.source << "\n";
  }
  return 0;
}

int RunShow(const Source& source, bool json) {
  if (auto e = CheckSource(source)) return TopoFail(*e);
  if (DryRun()) return kOk;
  std::string label;
  auto loaded = LoadSource(source, &label);
  if (auto* e = std::get_if<Failure>(&loaded)) return TopoFail(*e);
  const Topology& t = std::get<Topology>(loaded);
  std::cout << (json ? topology::RenderTopologyJson(t) : topology::RenderNvidiaSmi(t));
  return 0;
}

// `kdm topo --nvml` without --size: the matrix with CPU and NUMA affinity,
// then each GPU's attributes; or all of it as JSON.
int RunNvmlShow(const Source& source, bool json) {
  std::string label;
  NvmlFacts facts;
  auto loaded = LoadSource(source, &label, &facts);
  if (auto* e = std::get_if<Failure>(&loaded)) return TopoFail(*e);
  const Topology& t = std::get<Topology>(loaded);
  const nvml::NodeInfo& node = facts.node;
  if (json) {
    nlohmann::ordered_json out;
    out["topology"] = nlohmann::ordered_json::parse(topology::RenderTopologyJson(t));
    out["driver_version"] = node.driver_version;
    out["cuda_driver_version"] = node.cuda_driver_version;
    out["gpus"] = nlohmann::ordered_json::array();
    for (const nvml::GpuInfo& g : node.gpus) {
      nlohmann::ordered_json gpu;
      gpu["index"] = g.index;
      gpu["uuid"] = g.uuid;
      gpu["minor"] = g.minor;
      gpu["pci_bus_id"] = g.pci_bus_id;
      gpu["numa"] = g.numa ? nlohmann::ordered_json(*g.numa) : nlohmann::ordered_json(nullptr);
      gpu["cpu_affinity"] = g.cpu_affinity;
      // Every key, "" (0 for memory_mib) where NVML did not say.
      nlohmann::ordered_json attributes = nlohmann::ordered_json::object();
      for (std::string_view key : k8s::kAttributeKeys) {
        if (key == k8s::kAttrMemoryMib) {
          attributes[std::string(key)] = g.attributes.memory_mib.value_or(0);
        } else {
          attributes[std::string(key)] = g.attributes.Get(key).value_or("");
        }
      }
      gpu["attributes"] = std::move(attributes);
      out["gpus"].push_back(gpu);
    }
    out["ignored_links"] = facts.ignored;
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::vector<std::string> cpus;
  for (const nvml::GpuInfo& g : node.gpus) cpus.push_back(TableText(g.cpu_affinity));
  std::cout << topology::RenderNvidiaSmi(t, cpus) << "\nDriver " << TableText(node.driver_version)
            << ", CUDA " << TableText(node.cuda_driver_version) << "\n";
  for (const nvml::GpuInfo& g : node.gpus) {
    auto attr = [&g](std::string_view key) {
      return TableText(g.attributes.Get(key).value_or(""));
    };
    std::cout << "GPU" << g.index << "\t" << TableText(g.uuid) << "\tmodel="
              << QuoteLogValue(g.attributes.Get(k8s::kAttrModel).value_or(""), kMaxLogValueBytes)
              << " memory_mib=" << g.attributes.memory_mib.value_or(0)
              << " arch=" << attr(k8s::kAttrArch) << " brand=" << attr(k8s::kAttrBrand)
              << " driver=" << attr(k8s::kAttrDriver) << " cuda=" << attr(k8s::kAttrCuda)
              << " minor=" << g.minor << " pci_bus_id=" << TableText(g.pci_bus_id)
              << " numa=" << (g.numa ? std::to_string(*g.numa) : std::string("N/A")) << "\n";
  }
  return 0;
}

}  // namespace

void AddTopoCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<AllocateFlags>();
  auto* topo = app.add_subcommand(
      "topo", "Explain the best device set for a request on a topology, beside first-fit's pick");
  topo->add_option("--preset", flags->source.preset,
                   "A built-in topology (see 'kdm topo presets')");
  topo->add_option("--topology", flags->source.file,
                   "A file with `nvidia-smi topo -m` text or kdm's topology JSON");
  topo->add_option("--size", flags->size, "How many devices the request needs");
  topo->add_option(
      "--available", flags->available,
      "The free devices: indices, ranges (0-3) or ids, comma-separated (default: all)");
  topo->add_option("--must-include", flags->must_include,
                   "Devices the set must keep: indices, ranges or ids, comma-separated");
  topo->add_option("--policy", flags->policy,
                   "packed, best-set or first-fit; default " + flags->policy);
  topo->add_option("--budget", flags->budget,
                   "Search time before settling for the best set found (a duration: 50ms, 1s)")
      ->capture_default_str()
      ->type_name("DURATION");
  // The old spelling, a number of milliseconds: still taken, not shown.
  topo->add_option("--budget-ms", flags->budget_ms, "Deprecated: --budget")->group("");
  topo->add_flag("--json", flags->json, "Print the answer as JSON");
  topo->add_flag("--nvml", flags->source.nvml,
                 "Read this node's GPUs through NVML: without --size print their matrix and "
                 "attributes, with --size answer as the NVIDIA GPU plugin would");
  topo->add_option("--nvml-library", flags->source.nvml_library,
                   "The NVML library to open (default: libnvidia-ml.so.1 from the loader's path)");
  topo->add_option("--sysfs-root", flags->source.sysfs_root,
                   "Where sysfs is mounted, for GPUs' NUMA nodes (default /sys)");

  auto show_source = std::make_shared<Source>();
  auto show_json = std::make_shared<bool>(false);
  auto* presets = topo->add_subcommand("presets", "List the built-in topologies and their sources");
  auto* show = topo->add_subcommand("show", "Print a topology as `nvidia-smi topo -m` would");
  show->add_option("--preset", show_source->preset, "A built-in topology");
  show->add_option("--topology", show_source->file, "A topology file");
  show->add_flag("--json", *show_json, "Print kdm's topology JSON instead");
  AddVerbosityFlag(topo, &flags->verbosity);
  AddVerbosityFlag(presets, &flags->verbosity);
  AddVerbosityFlag(show, &flags->verbosity);
  topo->require_subcommand(0, 1);

  presets->callback([&exit_code, flags] {
    SetUpStderrLogging("kdm-topo", LogLevelFor(flags->verbosity, spdlog::level::warn));
    exit_code = DryRun() ? kOk : RunPresets();
  });
  show->callback([&exit_code, flags, show_source, show_json] {
    SetUpStderrLogging("kdm-topo", LogLevelFor(flags->verbosity, spdlog::level::warn));
    exit_code = RunShow(*show_source, *show_json);
  });
  topo->callback([&exit_code, flags, presets, show] {
    if (presets->parsed() || show->parsed()) return;
    SetUpStderrLogging("kdm-topo", LogLevelFor(flags->verbosity, spdlog::level::warn));
    exit_code = RunAllocate(*flags);
  });
}

}  // namespace kdm::cli
