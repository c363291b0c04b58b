#include "kdm/nvml/allocate_answer.h"

#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <utility>

#include "kdm/base/log_value.h"
#include "kdm/k8s/names.h"

namespace kdm::nvml {
namespace {

constexpr std::string_view kDeviceListStrategyNames =
    "envvar, volume-mounts, cdi-annotations or cdi-cri";

// A version 4 UUID, as NVIDIA's plugin names each CDI annotation.
std::string RandomUuidV4() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  uint64_t hi = random();
  uint64_t lo = random();
  hi = (hi & ~uint64_t{0xF000}) | uint64_t{0x4000};            // version 4
  lo = (lo & ~(uint64_t{0xC} << 60)) | (uint64_t{0x8} << 60);  // variant 10
  char text[37];
  std::snprintf(text, sizeof text, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(hi >> 32),
                static_cast<unsigned>((hi >> 16) & 0xFFFF), static_cast<unsigned>(hi & 0xFFFF),
                static_cast<unsigned>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFULL));
  return text;
}

// Outside text in a message, on one line.
std::string QuotedOutside(std::string_view text) { return QuoteLogValue(text, kMaxLogValueBytes); }

// <root><path> with one '/' between ("/" + "/dev/x" -> "/dev/x").
std::string UnderRoot(std::string_view root, const std::string& absolute_path) {
  while (!root.empty() && root.back() == '/') root.remove_suffix(1);
  return std::string(root) + absolute_path;
}

std::string JoinComma(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

}  // namespace

StatusOr<DeviceIdStrategy> ParseDeviceIdStrategy(std::string_view text) {
  if (text == "uuid") return DeviceIdStrategy::kUuid;
  if (text == "index") return DeviceIdStrategy::kIndex;
  return InvalidArgumentError(QuotedOutside(text) + " is not uuid or index");
}

StatusOr<DeviceListStrategies> ParseDeviceListStrategies(std::string_view text) {
  DeviceListStrategies s;
  s.envvar = false;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string_view item =
        text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    if (item == "envvar") {
      s.envvar = true;
    } else if (item == "volume-mounts") {
      s.volume_mounts = true;
    } else if (item == "cdi-annotations") {
      s.cdi_annotations = true;
    } else if (item == "cdi-cri") {
      s.cdi_cri = true;
    } else if (item.empty()) {
      return InvalidArgumentError(QuotedOutside(text) + " has an empty entry (expected " +
                                  "a comma-separated list of " +
                                  std::string(kDeviceListStrategyNames) + ")");
    } else {
      return InvalidArgumentError(QuotedOutside(item) + " is not " +
                                  std::string(kDeviceListStrategyNames));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return s;
}

std::string DeviceListStrategiesName(const DeviceListStrategies& s) {
  std::vector<std::string> names;
  if (s.envvar) names.push_back("envvar");
  if (s.volume_mounts) names.push_back("volume-mounts");
  if (s.cdi_annotations) names.push_back("cdi-annotations");
  if (s.cdi_cri) names.push_back("cdi-cri");
  return JoinComma(names);
}

Status CheckCdiAnnotationPrefix(std::string_view prefix) {
  if (prefix.empty() || prefix.back() != '/') {
    return InvalidArgumentError(QuotedOutside(prefix) + " must end with '/' (e.g. cdi.k8s.io/)");
  }
  std::string_view domain = prefix.substr(0, prefix.size() - 1);
  if (!k8s::IsDns1123Subdomain(domain)) {
    return InvalidArgumentError(QuotedOutside(prefix) +
                                ": the part before '/' must be a DNS-1123 subdomain (lower "
                                "case letters, digits, '-' and '.', e.g. cdi.k8s.io/)");
  }
  return OkStatus();
}

AllocateAnswerBuilder::AllocateAnswerBuilder(std::vector<GpuNode> gpus,
                                             AllocateAnswerOptions options)
    : options_(std::move(options)) {
  for (GpuNode& g : gpus) {
    std::string uuid = g.uuid;
    gpus_[std::move(uuid)] = std::move(g);
  }
  if (options_.dev_root.empty()) options_.dev_root = "/";
  if (options_.host_dev_root.empty()) options_.host_dev_root = "/";
  if (!options_.response_id) options_.response_id = RandomUuidV4;
}

StatusOr<AllocateAnswer> AllocateAnswerBuilder::Answer(const std::vector<std::string>& ids) const {
  if (ids.empty()) return InvalidArgumentError("allocate request names no GPU");
  std::set<std::string> seen;
  // The ids the runtime gets (UUIDs or indices), in the order asked.
  std::vector<std::string> runtime_ids;
  std::vector<const GpuNode*> gpus;
  for (const std::string& id : ids) {
    auto it = gpus_.find(id);
    if (it == gpus_.end()) {
      return NotFoundError("device \"" + id + "\" is not a GPU of this plugin");
    }
    if (!seen.insert(id).second)
      return InvalidArgumentError("device \"" + id + "\" is listed twice");
    gpus.push_back(&it->second);
    runtime_ids.push_back(options_.id_strategy == DeviceIdStrategy::kIndex
                              ? std::to_string(it->second.index)
                              : it->second.uuid);
  }
  AllocateAnswer a;
  const DeviceListStrategies& list = options_.list;
  if (list.AnyCdi()) {
    std::vector<std::string> names;
    for (const std::string& id : runtime_ids) names.push_back(options_.cdi_kind + "=" + id);
    if (list.cdi_annotations) {
      a.annotations[options_.cdi_annotation_prefix + kCdiAnnotationPlugin + "_" +
                    options_.response_id()] = JoinComma(names);
    }
    if (list.cdi_cri) a.cdi_devices = names;
  }
  // Every strategy a CDI one: the CDI spec brings the nodes and the env.
  if (list.OnlyCdi()) return a;
  if (list.envvar) a.envs[kVisibleDevicesEnv] = JoinComma(runtime_ids);
  if (list.volume_mounts) {
    a.envs[kVisibleDevicesEnv] = kDeviceListMountRoot;
    for (const std::string& id : runtime_ids) {
      a.mounts.push_back({std::string(kDeviceListMountRoot) + "/" + id, kDeviceListMountHostPath});
    }
  }
  if (options_.pass_device_specs) {
    std::vector<std::string> nodes;
    for (const GpuNode* g : gpus) nodes.push_back("/dev/nvidia" + std::to_string(g->minor));
    for (const char* node : kNvidiaControlNodes) {
      if (options_.env->Stat(UnderRoot(options_.dev_root, node)).ok()) nodes.push_back(node);
    }
    for (std::string& node : nodes) {
      std::string host = UnderRoot(options_.host_dev_root, node);
      a.device_nodes.push_back({std::move(node), std::move(host)});
    }
  }
  return a;
}

}  // namespace kdm::nvml
