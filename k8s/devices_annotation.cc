#include "kdm/k8s/devices_annotation.h"

#include <simdjson.h>

#include <algorithm>
#include <ctime>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "kdm/topology/parse.h"

namespace kdm::k8s {
namespace {

namespace od = simdjson::ondemand;

Status BadField(const std::string& where, const std::string& what) {
  return InvalidArgumentError("kdm.io/devices: " + where + ": " + what);
}

std::string ResourceKey(std::string_view resource) {
  return "resources[" + ShowValue(resource) + "]";
}

// ---------------------------------------------------------------- reading

// One resource as read: views into the parser's buffers, every check done
// except the cells (checked when turned into links).
struct RawResource {
  std::vector<std::string_view> ids;
  std::vector<std::optional<int>> numa;
  std::vector<int> available;  // positions in `ids`, as written
  bool has_matrix = false;
  bool has_pcie = false;
  std::string_view matrix;  // raw JSON text of the cells
  std::string_view pcie;
  std::optional<DeviceAttributes> attributes;
  std::optional<topology::Policy> policy;
};

struct RawAnnotation {
  // The copy of the text that was read, when it had no padding: the raw
  // cells point into it.
  simdjson::padded_string copy;
  // Views into the parser's buffers, valid until it reads again.
  std::string_view node;
  std::string_view updated;
  std::optional<std::vector<uint64_t>> pods;  // sorted
  std::map<std::string, RawResource, std::less<>> resources;
};

// Errors inside resource `resource`: the path is built only when one is
// returned (the success path builds no strings).
Status BadIn(std::string_view resource, const std::string& path, const std::string& what) {
  return BadField(ResourceKey(resource) + path, what);
}

std::string Index(size_t i) { return "[" + std::to_string(i) + "]"; }

Status ReadDevices(od::value v, std::string_view resource, RawResource* r) {
  od::array a;
  if (v.get_array().get(a)) return BadIn(resource, ".devices", "must be an array");
  r->ids.clear();
  r->numa.clear();
  for (auto item : a) {
    const size_t i = r->ids.size();
    od::object d;
    if (item.get_object().get(d))
      return BadIn(resource, ".devices" + Index(i), "must be an object");
    std::optional<std::string_view> id;
    std::optional<int> numa;
    for (auto f : d) {
      std::string_view key;
      if (f.unescaped_key().get(key)) return BadIn(resource, ".devices" + Index(i), "not JSON");
      if (key == "id") {
        std::string_view s;
        if (f.value().get_string().get(s)) {
          return BadIn(resource, ".devices" + Index(i) + ".id", "must be a string");
        }
        id = s;
      } else if (key == "numa") {
        od::value nv;
        if (f.value().get(nv)) return BadIn(resource, ".devices" + Index(i) + ".numa", "not JSON");
        // is_null() is an error (not false) for a token that starts like
        // null and is not: taken as a bool, that error would throw.
        bool is_null = false;
        if (nv.is_null().get(is_null)) {
          return BadIn(resource, ".devices" + Index(i) + ".numa",
                       "must be a non-negative integer or null");
        }
        if (is_null) {
          numa.reset();
          continue;
        }
        int64_t n = 0;
        if (nv.get_int64().get(n) || n < 0 || n > std::numeric_limits<int>::max()) {
          return BadIn(resource, ".devices" + Index(i) + ".numa",
                       "must be a non-negative integer or null");
        }
        numa = static_cast<int>(n);
      }
    }
    if (!id) return BadIn(resource, ".devices" + Index(i), "missing key 'id'");
    if (id->empty() || id->size() > kMaxNameBytes) {
      return BadIn(resource, ".devices" + Index(i) + ".id",
                   "must hold 1 to " + std::to_string(kMaxNameBytes) + " bytes");
    }
    r->ids.push_back(*id);
    r->numa.push_back(numa);
  }
  return OkStatus();
}

// The position of every id; a duplicate is an error.
class IdIndex {
 public:
  Status Build(const std::vector<std::string_view>& ids, std::string_view resource) {
    ids_ = &ids;
    if (ids.size() > kLinearMax) {
      by_id_.reserve(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!by_id_.emplace(ids[i], static_cast<int>(i)).second) return Duplicate(resource, i);
      }
      return OkStatus();
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (ids[j] == ids[i]) return Duplicate(resource, i);
      }
    }
    return OkStatus();
  }
  std::optional<int> Find(std::string_view id) const {
    if (ids_->size() > kLinearMax) {
      auto it = by_id_.find(id);
      if (it == by_id_.end()) return std::nullopt;
      return it->second;
    }
    for (size_t i = 0; i < ids_->size(); ++i) {
      if ((*ids_)[i] == id) return static_cast<int>(i);
    }
    return std::nullopt;
  }

 private:
  static constexpr size_t kLinearMax = 32;
  Status Duplicate(std::string_view resource, size_t i) const {
    return BadIn(resource, ".devices" + Index(i) + ".id",
                 "duplicate device " + ShowValue((*ids_)[i]));
  }
  const std::vector<std::string_view>* ids_ = nullptr;
  std::unordered_map<std::string_view, int> by_id_;
};

Status ReadAvailable(od::value v, std::string_view resource, std::vector<std::string_view>* out) {
  od::array a;
  if (v.get_array().get(a)) return BadIn(resource, ".available", "must be an array");
  out->clear();
  for (auto item : a) {
    std::string_view s;
    if (item.get_string().get(s)) {
      return BadIn(resource, ".available" + Index(out->size()), "must be a string");
    }
    out->push_back(s);
  }
  return OkStatus();
}

Status ReadAttributes(od::value v, std::string_view resource, DeviceAttributes* out) {
  od::object o;
  if (v.get_object().get(o)) return BadIn(resource, ".attributes", "must be an object");
  *out = DeviceAttributes();
  for (auto f : o) {
    std::string_view key;
    if (f.unescaped_key().get(key)) return BadIn(resource, ".attributes", "not JSON");
    if (key == kAttrMemoryMib) {
      int64_t n = 0;
      if (f.value().get_int64().get(n) || n < 0) {
        return BadIn(resource, ".attributes.memory_mib", "must be a non-negative integer");
      }
      out->memory_mib = n;
      continue;
    }
    std::optional<std::string>* field = out->Field(key);
    if (field == nullptr) continue;  // a key this reader does not know
    std::string_view s;
    if (f.value().get_string().get(s)) {
      return BadIn(resource, ".attributes." + std::string(key), "must be a string");
    }
    // Another writer may name a model in any UTF-8; the rest must have the
    // shape the requirement checks compare.
    if (key == kAttrModel) {
      if (s.size() > kMaxAttributeBytes) {
        return BadIn(resource, ".attributes.model",
                     "longer than " + std::to_string(kMaxAttributeBytes) + " bytes");
      }
    } else if (Status st = CheckAttributeValue(key, s); !st.ok()) {
      return BadIn(resource, ".attributes", std::string(st.message()));
    }
    field->emplace(s);
  }
  return OkStatus();
}

// `policy`: a string; a name this reader does not know (a newer writer's
// policy) leaves it unset.
Status ReadPolicy(od::value v, std::string_view resource, std::optional<topology::Policy>* out) {
  std::string_view s;
  if (v.get_string().get(s)) return BadIn(resource, ".policy", "must be a string");
  StatusOr<topology::Policy> p = topology::ParsePolicy(s);
  if (p.ok()) {
    *out = *p;
  } else {
    out->reset();
  }
  return OkStatus();
}

// One fingerprint's text: exactly 16 lowercase hex digits.
std::optional<uint64_t> ParseFingerprint(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    uint64_t digit = 0;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return std::nullopt;
    }
    v = (v << 4) | digit;
  }
  return v;
}

// `pods`: fingerprints in any order, sorted on return; a duplicate is
// refused at the index where it repeats an earlier entry.
Status ReadPods(od::value v, std::vector<uint64_t>* out) {
  od::array a;
  if (v.get_array().get(a)) return BadField("pods", "must be an array");
  out->clear();
  for (auto item : a) {
    const size_t i = out->size();
    if (i == kMaxAnnotationPods) {
      return BadField("pods", "more than " + std::to_string(kMaxAnnotationPods) + " entries");
    }
    std::string_view s;
    if (item.get_string().get(s)) return BadField("pods" + Index(i), "must be a string");
    std::optional<uint64_t> f = ParseFingerprint(s);
    if (!f) return BadField("pods" + Index(i), "must be 16 lowercase hex digits");
    out->push_back(*f);
  }
  // Sorted with the positions: the first repeat is the smallest second
  // position among equal values.
  std::vector<std::pair<uint64_t, uint32_t>> sorted;
  sorted.reserve(out->size());
  for (size_t i = 0; i < out->size(); ++i) sorted.emplace_back((*out)[i], static_cast<uint32_t>(i));
  std::sort(sorted.begin(), sorted.end());
  std::optional<uint32_t> repeat;
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].first == sorted[i - 1].first && (!repeat || sorted[i].second < *repeat)) {
      repeat = sorted[i].second;
    }
  }
  if (repeat) {
    return BadField("pods" + Index(*repeat),
                    "duplicate pod " + FormatPodFingerprint((*out)[*repeat]));
  }
  for (size_t i = 0; i < sorted.size(); ++i) (*out)[i] = sorted[i].first;
  return OkStatus();
}

Status ReadCellsText(od::value v, std::string_view resource, const char* key,
                     std::string_view* raw) {
  od::array cells;
  if (v.get_array().get(cells)) {
    return BadIn(resource, std::string(".") + key, "must be an array of rows");
  }
  if (cells.raw_json().get(*raw)) return BadIn(resource, std::string(".") + key, "not JSON");
  return OkStatus();
}

Status ReadResource(od::value v, std::string_view resource, RawResource* r) {
  od::object o;
  if (v.get_object().get(o)) return BadIn(resource, "", "must be an object");
  bool has_devices = false;
  bool has_available = false;
  std::vector<std::string_view> available;
  for (auto f : o) {
    std::string_view key;
    if (f.unescaped_key().get(key)) return BadIn(resource, "", "not JSON");
    if (key == "devices") {
      KDM_RETURN_IF_ERROR(ReadDevices(f.value(), resource, r));
      has_devices = true;
    } else if (key == "available") {
      KDM_RETURN_IF_ERROR(ReadAvailable(f.value(), resource, &available));
      has_available = true;
    } else if (key == "matrix") {
      KDM_RETURN_IF_ERROR(ReadCellsText(f.value(), resource, "matrix", &r->matrix));
      r->has_matrix = true;
    } else if (key == "pcie") {
      KDM_RETURN_IF_ERROR(ReadCellsText(f.value(), resource, "pcie", &r->pcie));
      r->has_pcie = true;
    } else if (key == "attributes") {
      r->attributes.emplace();
      KDM_RETURN_IF_ERROR(ReadAttributes(f.value(), resource, &*r->attributes));
    } else if (key == "policy") {
      KDM_RETURN_IF_ERROR(ReadPolicy(f.value(), resource, &r->policy));
    }
  }
  if (!has_devices) return BadIn(resource, "", "missing key 'devices'");
  if (!has_available) return BadIn(resource, "", "missing key 'available'");
  if (r->has_pcie && !r->has_matrix) return BadIn(resource, "", "'pcie' without 'matrix'");
  IdIndex index;
  KDM_RETURN_IF_ERROR(index.Build(r->ids, resource));
  std::vector<char> seen(r->ids.size(), 0);
  r->available.reserve(available.size());
  for (size_t i = 0; i < available.size(); ++i) {
    std::optional<int> pos = index.Find(available[i]);
    if (!pos) {
      return BadIn(resource, ".available" + Index(i),
                   "device " + ShowValue(available[i]) + " is not in devices");
    }
    if (seen[*pos]) {
      return BadIn(resource, ".available" + Index(i),
                   "duplicate device " + ShowValue(available[i]));
    }
    seen[*pos] = 1;
    r->available.push_back(*pos);
  }
  return OkStatus();
}

StatusOr<RawAnnotation> ReadAnnotation(std::string_view text, size_t readable_padding) {
  if (text.size() > kMaxAnnotationBytes) {
    return OutOfRangeError("kdm.io/devices: " + std::to_string(text.size()) +
                           " bytes, the limit is " + std::to_string(kMaxAnnotationBytes));
  }
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return InvalidArgumentError("kdm.io/devices: a NUL byte at offset " + std::to_string(nul));
  }
  RawAnnotation out;
  simdjson::padded_string_view view;
  if (readable_padding >= simdjson::SIMDJSON_PADDING) {
    view = simdjson::padded_string_view(text.data(), text.size(), text.size() + readable_padding);
  } else {
    out.copy = simdjson::padded_string(text);
    view = out.copy;
  }
  thread_local od::parser parser;
  od::document doc;
  if (auto e = parser.iterate(view).get(doc); e) {
    return InvalidArgumentError(std::string("kdm.io/devices: not JSON: ") +
                                simdjson::error_message(e));
  }
  od::json_type type;
  if (auto e = doc.type().get(type); e) {
    return InvalidArgumentError(std::string("kdm.io/devices: not JSON: ") +
                                simdjson::error_message(e));
  }
  if (type != od::json_type::object) return BadField("top level", "must be an object");
  od::object root;
  if (auto e = doc.get_object().get(root); e) {
    return InvalidArgumentError(std::string("kdm.io/devices: not JSON: ") +
                                simdjson::error_message(e));
  }
  bool has_version = false;
  bool has_node = false;
  bool has_resources = false;
  for (auto f : root) {
    std::string_view key;
    if (auto e = f.unescaped_key().get(key); e) {
      return InvalidArgumentError(std::string("kdm.io/devices: not JSON: ") +
                                  simdjson::error_message(e));
    }
    if (key == "version") {
      od::number_type type;
      od::value v;
      if (f.value().get(v) || v.get_number_type().get(type) ||
          type == od::number_type::floating_point_number) {
        return BadField("version", "must be an integer");
      }
      int64_t version = 0;
      if (v.get_int64().get(version) || version != kDevicesAnnotationVersion) {
        std::string_view raw = v.raw_json_token();
        raw = raw.substr(0, std::min(raw.find_first_of(" \t\r\n"), size_t{32}));
        return BadField("version", "unsupported version " + std::string(raw) +
                                       " (this reader knows " +
                                       std::to_string(kDevicesAnnotationVersion) + ")");
      }
      has_version = true;
    } else if (key == "node" || key == "updated") {
      std::string_view s;
      if (f.value().get_string().get(s)) return BadField(std::string(key), "must be a string");
      (key == "node" ? out.node : out.updated) = s;
      if (key == "node") has_node = true;
    } else if (key == "pods") {
      out.pods.emplace();
      KDM_RETURN_IF_ERROR(ReadPods(f.value(), &*out.pods));
    } else if (key == "resources") {
      od::object res;
      if (f.value().get_object().get(res)) return BadField("resources", "must be an object");
      out.resources.clear();
      for (auto rf : res) {
        std::string_view name;
        if (rf.unescaped_key().get(name)) return BadField("resources", "not JSON");
        if (name.empty() || name.size() > kMaxNameBytes) {
          return BadIn(
              name, "",
              "a resource name must hold 1 to " + std::to_string(kMaxNameBytes) + " bytes");
        }
        RawResource& r = out.resources[std::string(name)];
        r = RawResource();
        KDM_RETURN_IF_ERROR(ReadResource(rf.value(), name, &r));
      }
      has_resources = true;
    }
  }
  if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS) {
    return InvalidArgumentError("kdm.io/devices: not JSON: text after the document");
  }
  if (!has_version) return BadField("top level", "missing key 'version'");
  if (!has_node) return BadField("top level", "missing key 'node'");
  if (!has_resources) return BadField("top level", "missing key 'resources'");
  return out;
}

// The rows of string cells in `raw` (a JSON array read before).
Status ParseCells(std::string_view raw, const std::string& where, od::parser* parser,
                  simdjson::padded_string* buffer, topology::CellGridView* out) {
  *buffer = simdjson::padded_string(raw);
  od::document doc;
  od::array rows;
  if (parser->iterate(*buffer).get(doc) || doc.get_array().get(rows)) {
    return BadField(where, "must be an array of rows");
  }
  out->clear();
  for (auto row : rows) {
    const std::string at = where + "[" + std::to_string(out->size()) + "]";
    od::array cells;
    if (row.get_array().get(cells)) return BadField(at, "must be an array");
    out->emplace_back();
    for (auto cell : cells) {
      std::string_view s;
      if (cell.get_string().get(s)) {
        return BadField(at + "[" + std::to_string(out->back().size()) + "]", "must be a string");
      }
      out->back().push_back(s);
    }
  }
  return OkStatus();
}

// The topology of one resource from its cells: device ids `ids` (or the
// positions when null) and NUMA nodes `numa`.
StatusOr<topology::Topology> TopologyFromCells(const RawResource& r, const std::string& where,
                                               bool real_ids) {
  thread_local od::parser matrix_parser;
  thread_local od::parser pcie_parser;
  simdjson::padded_string matrix_buffer, pcie_buffer;
  topology::CellGridView matrix, pcie;
  KDM_RETURN_IF_ERROR(
      ParseCells(r.matrix, where + ".matrix", &matrix_parser, &matrix_buffer, &matrix));
  if (r.has_pcie) {
    KDM_RETURN_IF_ERROR(ParseCells(r.pcie, where + ".pcie", &pcie_parser, &pcie_buffer, &pcie));
  }
  if (matrix.size() != r.ids.size()) {
    return BadField(where + ".matrix", "has " + std::to_string(matrix.size()) + " rows for " +
                                           std::to_string(r.ids.size()) + " devices");
  }
  StatusOr<std::vector<std::vector<topology::Link>>> links =
      topology::LinksFromCells(matrix, pcie, r.has_pcie);
  if (!links.ok()) return BadField(where, std::string(links.status().message()));
  std::vector<topology::DeviceInfo> infos;
  infos.reserve(r.ids.size());
  for (size_t i = 0; i < r.ids.size(); ++i) {
    infos.push_back(
        {real_ids ? std::string(r.ids[i]) : std::to_string(i), static_cast<int>(i), r.numa[i]});
  }
  StatusOr<topology::Topology> t = topology::Topology::Create(std::move(infos), std::move(*links));
  if (!t.ok()) return BadField(where, std::string(t.status().message()));
  return t;
}

}  // namespace

// ---------------------------------------------------------------- building

ResourceDevices BuildResourceDevices(const ResourceInput& input, std::string* warning) {
  ResourceDevices out;
  out.attributes = input.attributes;
  std::vector<int> rows;  // topology indices of the published devices
  bool use_topology = input.topology != nullptr;
  if (use_topology) {
    for (const auto& [id, numa] : input.allocatable) {
      if (!input.topology->IndexOf(id)) {
        if (warning) {
          *warning = "device " + ShowValue(id) +
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

uint64_t PodFingerprint(std::string_view namespace_name, std::string_view name) {
  constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ull;
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t h = kOffsetBasis;
  auto add = [&h](std::string_view bytes) {
    for (char c : bytes) {
      h ^= static_cast<uint64_t>(static_cast<unsigned char>(c));
      h *= kPrime;
    }
  };
  add(namespace_name);
  add("/");
  add(name);
  return h;
}

std::string FormatPodFingerprint(uint64_t fingerprint) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<size_t>(i)] = kDigits[fingerprint & 0xf];
    fingerprint >>= 4;
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

// ---------------------------------------------------------------- writing

std::string EncodeDevicesAnnotation(const DevicesAnnotation& a) {
  using nlohmann::ordered_json;
  ordered_json doc;
  doc["version"] = a.version;
  doc["node"] = a.node;
  doc["updated"] = a.updated;
  if (a.pods) {
    ordered_json pods = ordered_json::array();
    for (uint64_t p : *a.pods) pods.push_back(FormatPodFingerprint(p));
    doc["pods"] = std::move(pods);
  }
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
    if (r.policy) res["policy"] = std::string(topology::PolicyName(*r.policy));
    if (r.topology) {
      topology::TopologyCells cells = topology::RenderCells(*r.topology);
      res["matrix"] = cells.matrix;
      res["pcie"] = cells.pcie;
    }
    if (r.attributes && !r.attributes->empty()) {
      ordered_json attrs = ordered_json::object();
      for (std::string_view key : kAttributeKeys) {
        if (key == kAttrMemoryMib) {
          if (r.attributes->memory_mib) attrs[std::string(key)] = *r.attributes->memory_mib;
        } else if (const std::optional<std::string>* v = r.attributes->Field(key); *v) {
          attrs[std::string(key)] = **v;
        }
      }
      res["attributes"] = std::move(attrs);
    }
    doc["resources"][name] = std::move(res);
  }
  // Replace rather than throw on invalid UTF-8 in a name from outside.
  return doc.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

StatusOr<std::string> EncodeDevicesAnnotationWithin(const DevicesAnnotation& a, size_t max_bytes) {
  auto too_large = [max_bytes](const std::string& size) {
    return OutOfRangeError("kdm.io/devices: the value would be " + size +
                           " bytes, over the limit of " + std::to_string(max_bytes) + " bytes (" +
                           std::to_string(max_bytes / 1024) +
                           " KiB, the API server's bound on all annotations of a Node together)");
  };
  // Each device is at least {"id":"ID","numa":0}, each free one "ID", each
  // cell of `matrix` and `pcie` "X" and a separator: escaping only grows.
  // Each pod is "0123456789abcdef" and a separator.
  uint64_t least = a.node.size() + a.updated.size();
  if (a.pods) least += 18 * static_cast<uint64_t>(a.pods->size());
  if (least > max_bytes) return too_large("at least " + std::to_string(least));
  for (const auto& [name, r] : a.resources) {
    least += name.size();
    if (r.policy) least += 10 + topology::PolicyName(*r.policy).size();
    for (const PublishedDevice& d : r.devices) least += 18 + d.id.size();
    for (const std::string& id : r.available) least += 3 + id.size();
    if (r.topology) {
      const uint64_t n = r.topology->size();
      least += 2 * (4 * n * n);
    }
    if (least > max_bytes) return too_large("at least " + std::to_string(least));
  }
  std::string value = EncodeDevicesAnnotation(a);
  if (value.size() > max_bytes) return too_large(std::to_string(value.size()));
  return value;
}

// ---------------------------------------------------------------- decoding

StatusOr<DevicesAnnotation> DecodeDevicesAnnotation(std::string_view text) {
  KDM_ASSIGN_OR_RETURN(RawAnnotation raw, ReadAnnotation(text, 0));
  DevicesAnnotation out;
  out.node = std::string(raw.node);
  out.updated = std::string(raw.updated);
  out.pods = std::move(raw.pods);
  for (auto& [name, r] : raw.resources) {
    ResourceDevices res;
    res.policy = r.policy;
    for (size_t i = 0; i < r.ids.size(); ++i)
      res.devices.push_back({std::string(r.ids[i]), r.numa[i]});
    for (int pos : r.available) res.available.emplace_back(r.ids[pos]);
    if (r.has_matrix) {
      KDM_ASSIGN_OR_RETURN(res.topology, TopologyFromCells(r, ResourceKey(name), true));
    }
    res.attributes = std::move(r.attributes);
    out.resources.emplace(name, std::move(res));
  }
  return out;
}

uint64_t TopologyCache::Hash(std::string_view matrix, std::string_view pcie,
                             const std::vector<std::optional<int>>& numa) {
  // The library's string hash (eight bytes a step), the parts combined.
  auto mix = [](uint64_t h, uint64_t v) {
    return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  };
  uint64_t h = std::hash<std::string_view>{}(matrix);
  h = mix(h, std::hash<std::string_view>{}(pcie));
  for (const std::optional<int>& n : numa) h = mix(h, n ? static_cast<uint64_t>(*n) + 1 : 0);
  return h;
}

size_t EstimateTopologyBytes(const topology::Topology& t) {
  const size_t n = static_cast<size_t>(t.size());
  // The link and score matrices, row-major n x n.
  size_t bytes = n * n * (sizeof(topology::Link) + sizeof(int));
  // The device list, each id's heap text beyond the small-string buffer.
  bytes += n * sizeof(topology::DeviceInfo);
  for (const topology::DeviceInfo& d : t.devices()) {
    if (d.id.size() >= sizeof(std::string)) bytes += d.id.size() + 1;
  }
  // The id index: one node per device (its key, its value, the next
  // pointer and the cached hash) and about one bucket pointer per device;
  // its keys are copies of the ids.
  bytes += n * (sizeof(std::pair<const std::string, int>) + 2 * sizeof(void*) + sizeof(void*));
  for (const topology::DeviceInfo& d : t.devices()) {
    if (d.id.size() >= sizeof(std::string)) bytes += d.id.size() + 1;
  }
  return bytes;
}

namespace {

// What an entry holds on the heap besides its bookkeeping: its key texts,
// its NUMA nodes and the topology's contents.
size_t EntryPayloadBytes(std::string_view matrix, std::string_view pcie, size_t devices,
                         const topology::Topology& t) {
  return matrix.size() + pcie.size() + devices * sizeof(std::optional<int>) +
         EstimateTopologyBytes(t);
}

}  // namespace

TopologyCache::List::iterator TopologyCache::FindLocked(
    uint64_t hash, std::string_view matrix, std::string_view pcie,
    const std::vector<std::optional<int>>& numa) {
  auto [begin, end] = by_hash_.equal_range(hash);
  for (auto it = begin; it != end; ++it) {
    const Entry& e = *it->second;
    if (e.matrix == matrix && e.pcie == pcie && e.numa == numa) return it->second;
  }
  return lru_.end();
}

void TopologyCache::EvictOldestLocked() {
  const Entry& oldest = lru_.back();
  auto [begin, end] = by_hash_.equal_range(oldest.hash);
  for (auto it = begin; it != end; ++it) {
    if (&*it->second == &oldest) {
      by_hash_.erase(it);
      break;
    }
  }
  bytes_ -= oldest.bytes;
  ++evictions_;
  lru_.pop_back();
}

std::shared_ptr<const SharedTopology> TopologyCache::Find(
    std::string_view matrix, std::string_view pcie, const std::vector<std::optional<int>>& numa) {
  const uint64_t h = Hash(matrix, pcie, numa);
  MutexLock lock(&mu_);
  auto it = FindLocked(h, matrix, pcie, numa);
  if (it == lru_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it);
  return it->topology;
}

std::shared_ptr<const SharedTopology> TopologyCache::Insert(
    std::string_view matrix, std::string_view pcie, const std::vector<std::optional<int>>& numa,
    topology::Topology t) {
  const uint64_t h = Hash(matrix, pcie, numa);
  // Estimated (and the key copied) before the lock: only the list work is
  // done under it.
  // The bookkeeping: the list node (two pointers and the Entry), the index
  // node (its next pointer, cached hash and value, and a bucket), the
  // shared object with its control block (two counts and a vtable).
  constexpr size_t kBookkeeping = 2 * sizeof(void*) + sizeof(Entry) + 3 * sizeof(void*) +
                                  sizeof(std::pair<const uint64_t, List::iterator>) +
                                  3 * sizeof(void*) + sizeof(SharedTopology);
  const size_t bytes = EntryPayloadBytes(matrix, pcie, numa.size(), t) + kBookkeeping;
  if (bytes > max_bytes_) {
    MutexLock lock(&mu_);
    ++not_kept_;
    return std::make_shared<const SharedTopology>(SharedTopology{0, std::move(t)});
  }
  Entry entry{h, std::string(matrix), std::string(pcie), numa, nullptr, bytes};
  MutexLock lock(&mu_);
  if (auto it = FindLocked(h, matrix, pcie, numa); it != lru_.end()) {
    lru_.splice(lru_.begin(), lru_, it);
    return it->topology;
  }
  while (!lru_.empty() && bytes_ + bytes > max_bytes_) EvictOldestLocked();
  entry.topology = std::make_shared<const SharedTopology>(SharedTopology{next_id_++, std::move(t)});
  lru_.push_front(std::move(entry));
  by_hash_.emplace(h, lru_.begin());
  bytes_ += bytes;
  return lru_.front().topology;
}

size_t TopologyCache::size() const {
  MutexLock lock(&mu_);
  return lru_.size();
}

TopologyCache::Stats TopologyCache::stats() const {
  MutexLock lock(&mu_);
  return Stats{.entries = lru_.size(),
               .bytes = bytes_,
               .max_bytes = max_bytes_,
               .evictions = evictions_,
               .not_kept = not_kept_};
}

size_t DecodePadding() { return simdjson::SIMDJSON_PADDING; }

StatusOr<NodeDevices> DecodeNodeDevices(std::string_view text, TopologyCache* topologies,
                                        size_t readable_padding) {
  KDM_ASSIGN_OR_RETURN(RawAnnotation raw, ReadAnnotation(text, readable_padding));
  NodeDevices out;
  out.pods = std::move(raw.pods);
  for (auto& [name, r] : raw.resources) {
    ResourceView view;
    view.device_count = static_cast<int>(r.ids.size());
    view.policy = r.policy;
    view.available = std::move(r.available);
    std::sort(view.available.begin(), view.available.end());
    if (r.attributes) view.attributes = std::move(*r.attributes);
    if (r.has_matrix) {
      std::string_view pcie = r.has_pcie ? r.pcie : std::string_view();
      view.topology = topologies->Find(r.matrix, pcie, r.numa);
      if (view.topology == nullptr) {
        KDM_ASSIGN_OR_RETURN(topology::Topology t, TopologyFromCells(r, ResourceKey(name), false));
        view.topology = topologies->Insert(r.matrix, pcie, r.numa, std::move(t));
      } else if (view.topology->topology.size() != view.device_count) {
        return BadField(ResourceKey(name) + ".matrix",
                        "has " + std::to_string(view.topology->topology.size()) + " rows for " +
                            std::to_string(view.device_count) + " devices");
      }
    }
    out.resources.emplace(name, std::move(view));
  }
  return out;
}

}  // namespace kdm::k8s
