#include "kdm/fakes/status_writer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "kdm/base/env.h"
#include "kdm/base/log_value.h"

namespace kdm::fakes {
namespace {

using nlohmann::ordered_json;

}  // namespace

std::string AdmissionFailureMessage(std::string_view error) {
  return "Allocate failed due to " + std::string(error) + ", which is unexpected";
}

std::string RenderPodStatus(const PodStatus& status) {
  ordered_json root = ordered_json::object();
  root["phase"] = status.phase;
  root["reason"] = status.reason;
  root["message"] = status.message;
  ordered_json containers = ordered_json::array();
  for (const ContainerStatus& c : status.containers) {
    ordered_json j = ordered_json::object();
    j["name"] = c.name;
    j["devices"] = ordered_json::object();
    for (const auto& [resource, ids] : c.devices) j["devices"][resource] = ids;
    j["envs"] = ordered_json::object();
    for (const auto& [k, v] : c.run.envs) j["envs"][k] = v;
    j["mounts"] = ordered_json::array();
    for (const auto& m : c.run.mounts) {
      j["mounts"].push_back({{"container_path", m.container_path},
                             {"host_path", m.host_path},
                             {"read_only", m.read_only}});
    }
    j["device_specs"] = ordered_json::array();
    for (const auto& d : c.run.devices) {
      j["device_specs"].push_back({{"container_path", d.container_path},
                                   {"host_path", d.host_path},
                                   {"permissions", d.permissions}});
    }
    j["annotations"] = ordered_json::object();
    for (const auto& [k, v] : c.run.annotations) j["annotations"][k] = v;
    j["cdi_devices"] = c.run.cdi_devices;
    containers.push_back(std::move(j));
  }
  root["containers"] = std::move(containers);
  return root.dump(2) + "\n";
}

std::string PodStatusFileName(std::string_view namespace_name, std::string_view name) {
  return std::string(namespace_name) + "_" + std::string(name) + ".json";
}

std::string ManifestStatusFileName(std::string_view manifest_file_name) {
  return "manifest_" + std::string(manifest_file_name) + ".json";
}

std::string RenderNodeStatus(const NodeStatus& status) {
  ordered_json root = ordered_json::object();
  root["capacity"] = ordered_json::object();
  root["allocatable"] = ordered_json::object();
  root["plugins"] = ordered_json::array();
  for (const auto& [resource, amounts] : status.capacity.resources) {
    root["capacity"][resource] = amounts.capacity;
    root["allocatable"][resource] = amounts.allocatable;
    const char* state = amounts.allocatable > 0  ? "Healthy"
                        : amounts.capacity > 0 ? "Unhealthy"
                                               : "Pending";
    root["plugins"].push_back({{"resource", resource},
                               {"state", state},
                               {"devices", amounts.capacity},
                               {"healthy", amounts.allocatable}});
  }
  root["deleted_resources"] = status.capacity.deleted;
  root["registrations"] = status.registrations;
  return root.dump(2) + "\n";
}

Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  // A dot-file temporary, so that a reader globbing "*.json" never sees it.
  return Env::Default()->WriteFileAtomically(
      path, contents, {.mode = 0644, .naming = TempFileNaming::kHiddenRandom});
}

std::vector<std::string> RemoveStaleTempFiles(const std::string& dir) {
  StatusOr<std::vector<std::string>> removed =
      Env::Default()->RemoveStaleTempFiles(dir, TempFileNaming::kHiddenRandom);
  if (!removed.ok()) {
    spdlog::warn("event=stale_temp_files_not_checked dir={} error={}", QuoteLogValue(dir),
                 QuoteLogValue(removed.status().message()));
    return {};
  }
  for (const std::string& path : *removed) {
    spdlog::info("event=stale_temp_file_removed path={}", QuoteLogValue(path));
  }
  return std::move(*removed);
}

std::vector<std::string> AdmittedStatusFilesWithDevices(const std::string& dir) {
  namespace fs = std::filesystem;
  constexpr uintmax_t kMaxStatusFileBytes = 1 << 20;
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "node.json" || name.front() == '.' || !name.ends_with(".json")) continue;
    std::error_code file_ec;
    if (!it->is_regular_file(file_ec) || it->file_size(file_ec) > kMaxStatusFileBytes ||
        file_ec) {
      continue;
    }
    std::ifstream in(it->path());
    nlohmann::json status = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!status.is_object()) continue;
    auto phase = status.find("phase");
    if (phase == status.end() || !phase->is_string() || *phase != kPhaseAdmitted) continue;
    auto containers = status.find("containers");
    if (containers == status.end() || !containers->is_array()) continue;
    bool holds_devices = std::any_of(containers->begin(), containers->end(), [](const auto& c) {
      if (!c.is_object()) return false;
      auto devices = c.find("devices");
      if (devices == c.end() || !devices->is_object()) return false;
      return std::any_of(devices->begin(), devices->end(),
                         [](const auto& ids) { return ids.is_array() && !ids.empty(); });
    });
    if (holds_devices) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kdm::fakes
