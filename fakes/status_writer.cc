#include "kdm/fakes/status_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "kdm/base/log_value.h"

namespace kdm::fakes {
namespace {

using nlohmann::ordered_json;

Status Errno(int err, const std::string& what, const std::string& path) {
  return UnavailableError(what + " " + path + ": " + std::strerror(err));
}

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(errno, "cannot write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return OkStatus();
}

constexpr std::string_view kTempInfix = ".tmp-";
constexpr size_t kTempRandomChars = 6;  // mkostemp's XXXXXX

// ".<name>.tmp-XXXXXX" as WriteFileAtomically makes it.
bool IsTempFileName(std::string_view name) {
  if (name.size() < 1 + 1 + kTempInfix.size() + kTempRandomChars || name.front() != '.') {
    return false;
  }
  std::string_view random = name.substr(name.size() - kTempRandomChars);
  std::string_view before = name.substr(0, name.size() - kTempRandomChars);
  return before.ends_with(kTempInfix) &&
         std::all_of(random.begin(), random.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
         });
}

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
  size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  // A dot-file name so that a reader globbing "*.json" never sees it.
  std::string tmp = dir + "/." + name + ".tmp-XXXXXX";
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return Errno(errno, "cannot create a temporary file for", path);
  Status s = WriteAll(fd, contents, tmp);
  if (s.ok() && ::fchmod(fd, 0644) != 0) s = Errno(errno, "cannot chmod", tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno(errno, "cannot fsync", tmp);
  if (::close(fd) != 0 && s.ok()) s = Errno(errno, "cannot close", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = Errno(errno, "cannot rename onto", path);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    int rc = ::fsync(dfd);
    int err = errno;
    ::close(dfd);
    if (rc != 0) return Errno(err, "cannot fsync directory", dir);
  }
  return OkStatus();
}

std::vector<std::string> RemoveStaleTempFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    spdlog::warn("event=stale_temp_files_not_checked dir={} error={}", QuoteLogValue(dir),
                 QuoteLogValue(ec.message()));
    return removed;
  }
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path& path = it->path();
    if (!IsTempFileName(path.filename().string())) continue;
    // symlink_status: a symlink with that name is not ours to follow.
    std::error_code type_ec;
    if (!fs::is_regular_file(fs::symlink_status(path, type_ec))) continue;
    if (::unlink(path.c_str()) != 0) {
      spdlog::warn("event=stale_temp_file_not_removed path={} error={}",
                   QuoteLogValue(path.string()), QuoteLogValue(std::strerror(errno)));
      continue;
    }
    spdlog::info("event=stale_temp_file_removed path={}", QuoteLogValue(path.string()));
    removed.push_back(path.string());
  }
  return removed;
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
