#include "kdm/kube/annotation.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "kdm/kube/requirements.h"
#include "kdm/topology/parse.h"

namespace kdm::kube {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// A name from outside input, shown in an error: printable ASCII, cut.
std::string Show(std::string_view s) {
  constexpr size_t kMaxShown = 64;
  std::string out;
  for (char c : s.substr(0, kMaxShown)) {
    auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f && c != '\'') ? c : '?';
  }
  if (s.size() > kMaxShown) out += "...";
  return "'" + out + "'";
}

bool Printable(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
}

Status CheckAttributeValue(std::string_view key, std::string_view value) {
  std::string where = "attribute '" + std::string(key) + "': ";
  if (value.empty()) return InvalidArgumentError(where + "an empty value");
  if (value.size() > kMaxAttributeBytes) {
    return InvalidArgumentError(where + "longer than " + std::to_string(kMaxAttributeBytes) +
                                " bytes");
  }
  if (key == "cuda" || key == "driver" || key == "arch") {
    StatusOr<int> self = CompareVersions(value, value);
    if (!self.ok()) return InvalidArgumentError(where + self.status().message());
  } else if (key == "brand") {
    if (!std::all_of(value.begin(), value.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
        })) {
      return InvalidArgumentError(where + "not a brand name: " + Show(value));
    }
  } else if (!Printable(value)) {
    return InvalidArgumentError(where + "holds a control or non-ASCII byte: " + Show(value));
  }
  return OkStatus();
}

StatusOr<int64_t> ParseMib(std::string_view value) {
  if (value.empty() || value.size() > 15 ||
      !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgumentError("attribute 'memory_mib': not a whole number of MiB: " +
                                Show(value));
  }
  return std::stoll(std::string(value));
}

// The cells of a topology, as kdm's topology JSON writes them. The ids are
// replaced by numbers first: they are not part of the cells, and an id that
// is not UTF-8 would make the JSON writer throw.
std::pair<json, json> Cells(const topology::Topology& t) {
  std::vector<topology::DeviceInfo> infos;
  std::vector<std::vector<topology::Link>> links(t.size());
  for (int i = 0; i < t.size(); ++i) {
    infos.push_back({std::to_string(i), i, std::nullopt});
    for (int j = 0; j < t.size(); ++j) links[i].push_back(t.LinkBetween(i, j));
  }
  StatusOr<topology::Topology> plain = topology::Topology::Create(infos, links);
  if (!plain.ok()) return {json::array(), json::array()};  // cannot happen: t is valid
  json doc = json::parse(topology::RenderTopologyJson(*plain));
  return {doc["matrix"], doc["pcie"]};
}

std::string Key(const std::string& resource) { return "resources[" + Show(resource) + "]"; }

Status Bad(const std::string& where, const std::string& what) {
  return InvalidArgumentError("kdm.io/devices: " + where + ": " + what);
}

StatusOr<std::string> GetString(const json& obj, const char* key, const std::string& where,
                                bool required) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) return Bad(where, std::string("missing key '") + key + "'");
    return std::string();
  }
  if (!it->is_string()) return Bad(where + "." + key, "must be a string");
  return it->get<std::string>();
}

StatusOr<DeviceAttributes> DecodeAttributes(const json& a, const std::string& where) {
  if (!a.is_object()) return Bad(where, "must be an object");
  DeviceAttributes out;
  for (const char* key : {"model", "driver", "cuda", "arch", "brand"}) {
    auto it = a.find(key);
    if (it == a.end()) continue;
    if (!it->is_string()) return Bad(where + "." + key, "must be a string");
    std::string v = it->get<std::string>();
    // Another writer may name a model in any UTF-8; the rest must have the
    // shape the requirement checks compare.
    if (std::string_view(key) == "model") {
      if (v.size() > kMaxAttributeBytes) {
        return Bad(where + ".model",
                   "longer than " + std::to_string(kMaxAttributeBytes) + " bytes");
      }
    } else if (Status s = CheckAttributeValue(key, v); !s.ok()) {
      return Bad(where, s.message());
    }
    std::string k = key;
    (k == "model"    ? out.model
     : k == "driver" ? out.driver
     : k == "cuda"   ? out.cuda
     : k == "arch"   ? out.arch
                     : out.brand) = std::move(v);
  }
  if (auto it = a.find("memory_mib"); it != a.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Bad(where + ".memory_mib", "must be a non-negative integer");
    }
    out.memory_mib = it->get<int64_t>();
  }
  return out;
}

StatusOr<ResourceDevices> DecodeResource(const std::string& name, const json& r) {
  const std::string where = Key(name);
  if (!r.is_object()) return Bad(where, "must be an object");
  ResourceDevices out;
  auto devices = r.find("devices");
  if (devices == r.end()) return Bad(where, "missing key 'devices'");
  if (!devices->is_array()) return Bad(where + ".devices", "must be an array");
  std::set<std::string> ids;
  for (size_t i = 0; i < devices->size(); ++i) {
    const json& d = (*devices)[i];
    std::string at = where + ".devices[" + std::to_string(i) + "]";
    if (!d.is_object()) return Bad(at, "must be an object");
    KDM_ASSIGN_OR_RETURN(std::string id, GetString(d, "id", at, /*required=*/true));
    if (id.empty() || id.size() > kMaxNameBytes) {
      return Bad(at + ".id", "must hold 1 to " + std::to_string(kMaxNameBytes) + " bytes");
    }
    if (!ids.insert(id).second) return Bad(at + ".id", "duplicate device " + Show(id));
    PublishedDevice p{id, std::nullopt};
    if (auto numa = d.find("numa"); numa != d.end() && !numa->is_null()) {
      if (!numa->is_number_integer() || numa->get<int64_t>() < 0 ||
          numa->get<int64_t>() > std::numeric_limits<int>::max()) {
        return Bad(at + ".numa", "must be a non-negative integer or null");
      }
      p.numa = static_cast<int>(numa->get<int64_t>());
    }
    out.devices.push_back(std::move(p));
  }
  auto available = r.find("available");
  if (available == r.end()) return Bad(where, "missing key 'available'");
  if (!available->is_array()) return Bad(where + ".available", "must be an array");
  std::set<std::string> seen;
  for (size_t i = 0; i < available->size(); ++i) {
    const json& a = (*available)[i];
    std::string at = where + ".available[" + std::to_string(i) + "]";
    if (!a.is_string()) return Bad(at, "must be a string");
    std::string id = a.get<std::string>();
    if (!ids.count(id)) return Bad(at, "device " + Show(id) + " is not in devices");
    if (!seen.insert(id).second) return Bad(at, "duplicate device " + Show(id));
    out.available.push_back(std::move(id));
  }
  auto matrix = r.find("matrix");
  auto pcie = r.find("pcie");
  if (pcie != r.end() && matrix == r.end()) return Bad(where, "'pcie' without 'matrix'");
  // Rows of string cells, checked before anything is copied: copying a
  // JSON value recurses, and a deeply nested one from outside would take
  // the stack with it.
  for (auto cells : {matrix, pcie}) {
    if (cells == r.end()) continue;
    const std::string at = where + "." + (cells == matrix ? "matrix" : "pcie");
    if (!cells->is_array()) return Bad(at, "must be an array of rows");
    for (size_t i = 0; i < cells->size(); ++i) {
      const json& row = (*cells)[i];
      if (!row.is_array()) return Bad(at + "[" + std::to_string(i) + "]", "must be an array");
      for (size_t j = 0; j < row.size(); ++j) {
        if (!row[j].is_string()) {
          return Bad(at + "[" + std::to_string(i) + "][" + std::to_string(j) + "]",
                     "must be a string");
        }
      }
    }
  }
  if (matrix != r.end()) {
    json topo;
    topo["devices"] = json::array();
    for (const PublishedDevice& d : out.devices) {
      topo["devices"].push_back({{"id", d.id}, {"numa", d.numa ? json(*d.numa) : json(nullptr)}});
    }
    topo["matrix"] = *matrix;
    if (pcie != r.end()) topo["pcie"] = *pcie;
    StatusOr<topology::Topology> t = topology::ParseTopologyJson(topo.dump());
    if (!t.ok()) return Bad(where, t.status().message());
    out.topology = *std::move(t);
  }
  if (auto a = r.find("attributes"); a != r.end()) {
    KDM_ASSIGN_OR_RETURN(DeviceAttributes attrs, DecodeAttributes(*a, where + ".attributes"));
    out.attributes = std::move(attrs);
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> DeviceAttributes::ForRequirements() const {
  std::map<std::string, std::string> out;
  if (cuda) out["cuda"] = *cuda;
  if (driver) out["driver"] = *driver;
  if (arch) out["arch"] = *arch;
  if (brand) out["brand"] = *brand;
  return out;
}

StatusOr<DeviceAttributes> ParseAttributes(std::string_view text) {
  DeviceAttributes out;
  std::set<std::string> seen;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgumentError("attribute item " + Show(item) + " is not KEY=VALUE");
    }
    std::string key(item.substr(0, eq));
    std::string_view value = item.substr(eq + 1);
    if (key != "model" && key != "memory_mib" && key != "driver" && key != "cuda" &&
        key != "arch" && key != "brand") {
      return InvalidArgumentError("unknown attribute " + Show(key) +
                                  " (keys: model, memory_mib, driver, cuda, arch, brand)");
    }
    if (!seen.insert(key).second) return InvalidArgumentError("attribute '" + key + "' twice");
    if (key == "memory_mib") {
      KDM_ASSIGN_OR_RETURN(out.memory_mib, ParseMib(value));
    } else {
      KDM_RETURN_IF_ERROR(CheckAttributeValue(key, value));
      (key == "model"    ? out.model
       : key == "driver" ? out.driver
       : key == "cuda"   ? out.cuda
       : key == "arch"   ? out.arch
                         : out.brand) = std::string(value);
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

ResourceDevices BuildResourceDevices(const ResourceInput& input, std::string* warning) {
  ResourceDevices out;
  out.attributes = input.attributes;
  std::vector<int> rows;  // topology indices of the published devices
  bool use_topology = input.topology != nullptr;
  if (use_topology) {
    for (const auto& [id, numa] : input.allocatable) {
      if (!input.topology->IndexOf(id)) {
        if (warning) {
          *warning = "device " + Show(id) +
                     " is allocatable but not in the topology: published without a matrix";
        }
        use_topology = false;
        break;
      }
    }
  }
  if (use_topology) {
    for (const topology::DeviceInfo& d : input.topology->devices()) {
      auto it = input.allocatable.find(d.id);
      if (it == input.allocatable.end()) continue;
      out.devices.push_back({d.id, it->second ? it->second : d.numa});
      rows.push_back(d.index);
    }
    std::vector<topology::DeviceInfo> infos;
    std::vector<std::vector<topology::Link>> links;
    for (size_t i = 0; i < rows.size(); ++i) {
      infos.push_back({out.devices[i].id, static_cast<int>(i), out.devices[i].numa});
      links.emplace_back();
      for (int col : rows) links.back().push_back(input.topology->LinkBetween(rows[i], col));
    }
    // A sub-matrix of a valid topology is valid.
    if (!rows.empty()) {
      StatusOr<topology::Topology> sub = topology::Topology::Create(infos, links);
      if (sub.ok()) out.topology = *std::move(sub);
    }
  } else {
    for (const auto& [id, numa] : input.allocatable) out.devices.push_back({id, numa});
  }
  for (const PublishedDevice& d : out.devices) {
    if (!input.in_use.count(d.id)) out.available.push_back(d.id);
  }
  return out;
}

std::string FormatRfc3339(std::chrono::system_clock::time_point t) {
  std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string EncodeDevicesAnnotation(const DevicesAnnotation& a) {
  ordered_json doc;
  doc["version"] = a.version;
  doc["node"] = a.node;
  doc["updated"] = a.updated;
  doc["resources"] = ordered_json::object();
  for (const auto& [name, r] : a.resources) {
    ordered_json res;
    res["devices"] = ordered_json::array();
    for (const PublishedDevice& d : r.devices) {
      ordered_json dev;
      dev["id"] = d.id;
      dev["numa"] = d.numa ? ordered_json(*d.numa) : ordered_json(nullptr);
      res["devices"].push_back(std::move(dev));
    }
    res["available"] = r.available;
    if (r.topology) {
      auto [matrix, pcie] = Cells(*r.topology);
      res["matrix"] = matrix;
      res["pcie"] = pcie;
    }
    if (r.attributes && !r.attributes->empty()) {
      const DeviceAttributes& at = *r.attributes;
      ordered_json attrs = ordered_json::object();
      if (at.model) attrs["model"] = *at.model;
      if (at.memory_mib) attrs["memory_mib"] = *at.memory_mib;
      if (at.driver) attrs["driver"] = *at.driver;
      if (at.cuda) attrs["cuda"] = *at.cuda;
      if (at.arch) attrs["arch"] = *at.arch;
      if (at.brand) attrs["brand"] = *at.brand;
      res["attributes"] = std::move(attrs);
    }
    doc["resources"][name] = std::move(res);
  }
  // Replace rather than throw on invalid UTF-8 in a name from outside.
  return doc.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

StatusOr<DevicesAnnotation> DecodeDevicesAnnotation(std::string_view text) {
  if (text.size() > kMaxAnnotationBytes) {
    return OutOfRangeError("kdm.io/devices: " + std::to_string(text.size()) +
                           " bytes, the limit is " + std::to_string(kMaxAnnotationBytes));
  }
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return InvalidArgumentError("kdm.io/devices: a NUL byte at offset " + std::to_string(nul));
  }
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("kdm.io/devices: not JSON: ") + e.what());
  }
  if (!doc.is_object()) return Bad("top level", "must be an object");
  DevicesAnnotation out;
  auto version = doc.find("version");
  if (version == doc.end()) return Bad("top level", "missing key 'version'");
  if (!version->is_number_integer()) return Bad("version", "must be an integer");
  if (version->get<int64_t>() != kDevicesAnnotationVersion) {
    return Bad("version", "unsupported version " + version->dump() + " (this reader knows " +
                              std::to_string(kDevicesAnnotationVersion) + ")");
  }
  KDM_ASSIGN_OR_RETURN(out.node, GetString(doc, "node", "top level", /*required=*/true));
  KDM_ASSIGN_OR_RETURN(out.updated, GetString(doc, "updated", "top level", /*required=*/false));
  auto resources = doc.find("resources");
  if (resources == doc.end()) return Bad("top level", "missing key 'resources'");
  if (!resources->is_object()) return Bad("resources", "must be an object");
  for (auto it = resources->begin(); it != resources->end(); ++it) {
    if (it.key().empty() || it.key().size() > kMaxNameBytes) {
      return Bad(Key(it.key()),
                 "a resource name must hold 1 to " + std::to_string(kMaxNameBytes) + " bytes");
    }
    KDM_ASSIGN_OR_RETURN(ResourceDevices r, DecodeResource(it.key(), it.value()));
    out.resources[it.key()] = std::move(r);
  }
  return out;
}

}  // namespace kdm::kube
