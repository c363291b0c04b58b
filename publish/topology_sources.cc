#include "kdm/publish/topology_sources.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "kdm/base/env.h"
#include "kdm/base/log_value.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/k8s/names.h"
#include "kdm/nvml/discovery.h"
#include "kdm/nvml/library.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

namespace kdm::publish {
namespace {

// The largest ids file read (a few hundred GPUs are a few KiB).
constexpr uint64_t kMaxIdsFileBytes = 1 << 20;

std::string ShowIdsValue(const std::string& s) { return QuoteLogValue(s, kMaxLogValueBytes); }

std::string TrimBlanks(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r");
  size_t b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
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

StatusOr<LoadedTopology> ReadNvml(const nvml::Library& library, const NvmlOptions& options) {
  nvml::DiscoveryOptions discovery;
  if (!options.sysfs_root.empty()) discovery.sysfs_root = options.sysfs_root;
  KDM_ASSIGN_OR_RETURN(nvml::NodeInfo node, nvml::Discover(library, discovery));
  KDM_ASSIGN_OR_RETURN(nvml::NvmlTopology t, nvml::DiscoverTopology(library, node));
  LoadedTopology out{std::move(t.topology), k8s::DeviceAttributes{}, std::move(t.ignored), {}};
  for (const nvml::GpuInfo& gpu : node.gpus) out.nvml_indexes[gpu.uuid] = gpu.index;
  if (node.gpus.empty()) return out;
  // Discovery already put each value through the attribute checks.
  out.nvml_attributes = node.gpus.front().attributes;
  for (const std::string& w : node.gpus.front().attribute_warnings) out.warnings.push_back(w);
  return out;
}

}  // namespace

TopologySource ParseTopologySource(const std::string& source) {
  if (source == "nvml") return {TopologySource::Kind::kNvml, ""};
  if (source.rfind("preset:", 0) == 0) return {TopologySource::Kind::kPreset, source.substr(7)};
  return {TopologySource::Kind::kFile, source};
}

StatusOr<LoadedTopology> LoadTopology(const TopologySource& source, const NvmlOptions& nvml,
                                      bool* usage) {
  *usage = false;
  switch (source.kind) {
    case TopologySource::Kind::kNvml: {
      // A machine without NVML is the user's to fix, as for `kdm plugin
      // --nvml` and `kdm topo --nvml`: the message says what is missing.
      StatusOr<std::unique_ptr<nvml::Library>> library = nvml::Library::Load(nvml.library);
      if (!library.ok()) {
        *usage = library.status().code() == StatusCode::kNotFound;
        return library.status();
      }
      return ReadNvml(**library, nvml);
    }
    case TopologySource::Kind::kPreset: {
      StatusOr<topology::Topology> t = topology::Preset(source.name);
      if (!t.ok()) {
        *usage = true;
        return t.status();
      }
      return LoadedTopology{*std::move(t), std::nullopt, {}, {}};
    }
    case TopologySource::Kind::kFile:
      break;
  }
  KDM_ASSIGN_OR_RETURN(topology::Topology t, topology::LoadTopologyFile(source.name));
  return LoadedTopology{std::move(t), std::nullopt, {}, {}};
}

StatusOr<std::vector<std::string>> ParseIdsCsv(const std::string& text, int rows) {
  std::vector<std::optional<std::string>> ids(rows);
  int count = 0;
  size_t start = 0;
  int line_no = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    start = nl == std::string::npos ? text.size() : nl + 1;
    ++line_no;
    if (TrimBlanks(line).empty()) continue;
    const std::string at = "line " + std::to_string(line_no) + ": ";
    size_t comma = line.find(',');
    if (comma == std::string::npos) {
      return InvalidArgumentError(at + "expected INDEX, UUID, got " + ShowIdsValue(line));
    }
    std::string index_text = TrimBlanks(line.substr(0, comma));
    std::string id = TrimBlanks(line.substr(comma + 1));
    if (index_text.empty() || index_text.size() > 6 ||
        index_text.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgumentError(at + "index " + ShowIdsValue(index_text) + " is not a number");
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
      return InvalidArgumentError(at + "bad device id " + ShowIdsValue(id) +
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

StatusOr<topology::Topology> ApplyIdsFile(const topology::Topology& t, const std::string& path) {
  KDM_ASSIGN_OR_RETURN(std::string text, Env::Default()->ReadFile(path, kMaxIdsFileBytes));
  StatusOr<std::vector<std::string>> ids = ParseIdsCsv(text, t.size());
  if (!ids.ok()) return ids.status().WithPrefix(path);
  StatusOr<topology::Topology> renamed = Rename(t, *ids);
  if (!renamed.ok()) return renamed.status().WithPrefix(path);
  return renamed;
}

Status CheckAnnotationFits(const std::string& node,
                           const std::map<std::string, topology::Topology>& topologies,
                           const std::map<std::string, k8s::DeviceAttributes>& attributes) {
  k8s::DevicesAnnotation a;
  a.node = node;
  a.updated = "2006-01-02T15:04:05Z";  // as long as any time written
  for (const auto& [resource, t] : topologies) {
    k8s::ResourceDevices& r = a.resources[resource];
    for (const topology::DeviceInfo& d : t.devices()) {
      r.devices.push_back({d.id, d.numa});
      r.available.push_back(d.id);
    }
    r.topology = t;
  }
  for (const auto& [resource, attrs] : attributes) a.resources[resource].attributes = attrs;
  StatusOr<std::string> value = k8s::EncodeDevicesAnnotationWithin(a);
  return value.ok() ? OkStatus() : value.status();
}

}  // namespace kdm::publish
