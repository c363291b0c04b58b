#include "kdm/scheduler/node_devices.h"

#include <simdjson.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "kdm/kube/annotation.h"

namespace kdm::scheduler {
namespace {

namespace od = simdjson::ondemand;

Status Bad(const std::string& where, const std::string& what) {
  return InvalidArgumentError("kdm.io/devices" + (where.empty() ? "" : "." + where) + ": " + what);
}

struct RawResource {
  std::vector<std::string_view> ids;
  std::vector<std::string_view> available;
  std::string_view matrix;
  std::string_view pcie;
  bool has_matrix = false;
  std::map<std::string, std::string> attributes;
};

Status ReadStringArray(od::value v, const std::string& where, std::vector<std::string_view>* out) {
  od::array a;
  if (v.get_array().get(a)) return Bad(where, "must be an array of strings");
  for (auto item : a) {
    std::string_view s;
    if (item.get_string().get(s)) return Bad(where, "must be an array of strings");
    out->push_back(s);
  }
  return OkStatus();
}

Status ReadDevices(od::value v, const std::string& where, std::vector<std::string_view>* ids) {
  od::array a;
  if (v.get_array().get(a)) return Bad(where, "must be an array of objects");
  for (auto item : a) {
    const std::string at = where + "[" + std::to_string(ids->size()) + "]";
    od::object d;
    if (item.get_object().get(d)) return Bad(at, "must be an object");
    std::string_view id;
    bool found = false;
    for (auto f : d) {
      std::string_view key;
      if (f.unescaped_key().get(key)) return Bad(at, "bad key");
      if (key != "id") continue;
      if (f.value().get_string().get(id)) return Bad(at + ".id", "must be a string");
      found = true;
    }
    if (!found || id.empty()) return Bad(at + ".id", "missing");
    ids->push_back(id);
  }
  return OkStatus();
}

Status ReadAttributes(od::value v, const std::string& where,
                      std::map<std::string, std::string>* out) {
  od::object o;
  if (v.get_object().get(o)) return Bad(where, "must be an object");
  for (auto f : o) {
    std::string_view key;
    if (f.unescaped_key().get(key)) return Bad(where, "bad key");
    if (key != "cuda" && key != "driver" && key != "arch" && key != "brand") continue;
    std::string_view s;
    if (f.value().get_string().get(s))
      return Bad(where + "." + std::string(key), "must be a string");
    (*out)[std::string(key)] = std::string(s);
  }
  return OkStatus();
}

Status ReadResource(od::value v, const std::string& where, RawResource* r) {
  od::object o;
  if (v.get_object().get(o)) return Bad(where, "must be an object");
  for (auto f : o) {
    std::string_view key;
    if (f.unescaped_key().get(key)) return Bad(where, "bad key");
    if (key == "devices") {
      KDM_RETURN_IF_ERROR(ReadDevices(f.value(), where + ".devices", &r->ids));
    } else if (key == "available") {
      KDM_RETURN_IF_ERROR(ReadStringArray(f.value(), where + ".available", &r->available));
    } else if (key == "matrix" || key == "pcie") {
      std::string_view raw;
      od::array cells;
      if (f.value().get_array().get(cells) || cells.raw_json().get(raw)) {
        return Bad(where + "." + std::string(key), "bad JSON");
      }
      (key == "matrix" ? r->matrix : r->pcie) = raw;
      if (key == "matrix") r->has_matrix = true;
    } else if (key == "attributes") {
      KDM_RETURN_IF_ERROR(ReadAttributes(f.value(), where + ".attributes", &r->attributes));
    }
  }
  return OkStatus();
}

}  // namespace

uint64_t TopologyCache::Hash(std::string_view matrix, std::string_view pcie) {
  // The library's string hash (eight bytes a step; byte-at-a-time FNV cost a
  // tenth of a 5,000-node request), the two texts' hashes combined.
  const uint64_t m = std::hash<std::string_view>{}(matrix);
  const uint64_t p = std::hash<std::string_view>{}(pcie);
  return m ^ (p + 0x9e3779b97f4a7c15ull + (m << 6) + (m >> 2));
}

std::shared_ptr<const SharedTopology> TopologyCache::Find(std::string_view matrix,
                                                          std::string_view pcie) const {
  const uint64_t h = Hash(matrix, pcie);
  MutexLock lock(&mu_);
  auto [begin, end] = by_cells_.equal_range(h);
  for (auto it = begin; it != end; ++it) {
    if (it->second.matrix == matrix && it->second.pcie == pcie) return it->second.topology;
  }
  return nullptr;
}

std::shared_ptr<const SharedTopology> TopologyCache::Insert(std::string_view matrix,
                                                            std::string_view pcie,
                                                            topology::Topology t) {
  const uint64_t h = Hash(matrix, pcie);
  MutexLock lock(&mu_);
  auto [begin, end] = by_cells_.equal_range(h);
  for (auto it = begin; it != end; ++it) {
    if (it->second.matrix == matrix && it->second.pcie == pcie) return it->second.topology;
  }
  if (by_cells_.size() >= max_entries_) {
    return std::make_shared<const SharedTopology>(SharedTopology{0, std::move(t)});
  }
  auto shared = std::make_shared<const SharedTopology>(SharedTopology{next_id_++, std::move(t)});
  by_cells_.emplace(h, Entry{std::string(matrix), std::string(pcie), shared});
  return shared;
}

size_t TopologyCache::size() const {
  MutexLock lock(&mu_);
  return by_cells_.size();
}

StatusOr<NodeDevices> ReadNodeDevices(std::string_view annotation, TopologyCache* topologies,
                                      size_t readable_padding) {
  if (annotation.size() > kube::kMaxAnnotationBytes) {
    return OutOfRangeError("kdm.io/devices: " + std::to_string(annotation.size()) +
                           " bytes, more than the " + std::to_string(kube::kMaxAnnotationBytes) +
                           " an annotation may hold");
  }
  simdjson::padded_string copy;
  simdjson::padded_string_view view;
  if (readable_padding >= simdjson::SIMDJSON_PADDING) {
    view = simdjson::padded_string_view(annotation.data(), annotation.size(),
                                        annotation.size() + readable_padding);
  } else {
    copy = simdjson::padded_string(annotation);
    view = copy;
  }
  thread_local od::parser parser;
  od::document doc;
  if (auto e = parser.iterate(view).get(doc); e) {
    return Bad("", std::string("not JSON: ") + simdjson::error_message(e));
  }
  od::object root;
  if (doc.get_object().get(root)) return Bad("", "not a JSON object");
  bool version_ok = false;
  std::map<std::string, RawResource> raw;
  for (auto f : root) {
    std::string_view key;
    if (f.unescaped_key().get(key)) return Bad("", "not JSON");
    if (key == "version") {
      int64_t version = 0;
      if (f.value().get_int64().get(version) || version != kube::kDevicesAnnotationVersion) {
        return Bad("version", "must be " + std::to_string(kube::kDevicesAnnotationVersion));
      }
      version_ok = true;
    } else if (key == "resources") {
      od::object res;
      if (f.value().get_object().get(res)) return Bad("resources", "must be an object");
      for (auto rf : res) {
        std::string_view name;
        if (rf.unescaped_key().get(name)) return Bad("resources", "bad key");
        std::string n(name);
        const std::string where = "resources['" + n + "']";
        KDM_RETURN_IF_ERROR(ReadResource(rf.value(), where, &raw[n]));
      }
    } else {
      // Unknown keys, and keys the extender does not need, are skipped.
      od::value v;
      if (f.value().get(v)) return Bad("", "not JSON");
    }
  }
  if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS)
    return Bad("", "not JSON: text after the document");
  if (!version_ok) return Bad("version", "missing");

  NodeDevices out;
  for (auto& [name, r] : raw) {
    const std::string where = "resources['" + name + "']";
    ResourceView view;
    view.device_count = static_cast<int>(r.ids.size());
    view.attributes = std::move(r.attributes);
    for (std::string_view id : r.available) {
      auto it = std::find(r.ids.begin(), r.ids.end(), id);
      if (it == r.ids.end()) {
        return Bad(where + ".available", "'" + std::string(id) + "' is not one of the devices");
      }
      view.available.push_back(static_cast<int>(it - r.ids.begin()));
    }
    std::sort(view.available.begin(), view.available.end());
    if (std::adjacent_find(view.available.begin(), view.available.end()) != view.available.end()) {
      return Bad(where + ".available", "lists a device twice");
    }
    if (r.has_matrix) {
      view.topology = topologies->Find(r.matrix, r.pcie);
      if (view.topology == nullptr) {
        // First time this matrix is seen: the strict decoder checks it.
        StatusOr<kube::DevicesAnnotation> strict = kube::DecodeDevicesAnnotation(annotation);
        if (!strict.ok()) return strict.status();
        auto it = strict->resources.find(name);
        if (it == strict->resources.end() || !it->second.topology) {
          return Bad(where + ".matrix", "not read by the decoder");
        }
        view.topology = topologies->Insert(r.matrix, r.pcie, std::move(*it->second.topology));
      }
      if (view.topology->topology.size() != view.device_count) {
        return Bad(where + ".matrix", "has " + std::to_string(view.topology->topology.size()) +
                                          " rows for " + std::to_string(view.device_count) +
                                          " devices");
      }
    }
    out.resources.emplace(name, std::move(view));
  }
  return out;
}

}  // namespace kdm::scheduler
