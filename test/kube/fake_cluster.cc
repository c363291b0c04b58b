#include "kdm/test/kube/fake_cluster.h"

#include <utility>

namespace kdm::kube::test {
namespace {

using json = nlohmann::json;

Reply StatusReply(int code, const std::string& reason, const std::string& message) {
  json s = {{"kind", "Status"},   {"apiVersion", "v1"}, {"status", "Failure"},
            {"message", message}, {"reason", reason},   {"code", code}};
  return {.status = code, .body = s.dump()};
}

std::map<std::string, std::string> SplitQuery(const std::string& query) {
  std::map<std::string, std::string> out;
  size_t start = 0;
  while (start <= query.size() && !query.empty()) {
    size_t end = query.find('&', start);
    if (end == std::string::npos) end = query.size();
    std::string term = query.substr(start, end - start);
    size_t eq = term.find('=');
    if (!term.empty()) {
      out[term.substr(0, eq)] = eq == std::string::npos ? "" : term.substr(eq + 1);
    }
    start = end + 1;
  }
  return out;
}

// The value of a selectable field ("" when absent, as the API server reads
// an unset spec.nodeName).
std::string FieldOf(const json& pod, const std::string& field) {
  const size_t dot = field.find('.');
  const json& outer = pod.contains(field.substr(0, dot)) ? pod[field.substr(0, dot)] : json();
  if (!outer.is_object()) return "";
  auto it = outer.find(field.substr(dot + 1));
  return it != outer.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

StatusOr<std::string> UrlDecode(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%') {
      if (i + 2 >= text.size() || !std::isxdigit(static_cast<unsigned char>(text[i + 1])) ||
          !std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
        return InvalidArgumentError("bad percent-encoding at byte " + std::to_string(i));
      }
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

StatusOr<std::vector<FieldTerm>> ParsePodFieldSelector(const std::string& text) {
  std::vector<FieldTerm> terms;
  if (text.empty()) return terms;
  size_t start = 0;
  while (true) {
    size_t end = text.find(',', start);
    std::string term =
        text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    FieldTerm t;
    size_t eq = term.find("!=");
    if (eq != std::string::npos) {
      t.negated = true;
      t.field = term.substr(0, eq);
      t.value = term.substr(eq + 2);
    } else if ((eq = term.find('=')) != std::string::npos) {
      t.field = term.substr(0, eq);
      t.value = term.substr(eq + (term.compare(eq, 2, "==") == 0 ? 2 : 1));
    } else {
      return InvalidArgumentError("fieldSelector: term \"" + term + "\" has no = or !=");
    }
    if (t.field != "spec.nodeName" && t.field != "status.phase" &&
        t.field != "metadata.namespace" && t.field != "metadata.name") {
      return InvalidArgumentError("fieldSelector: \"" + t.field +
                                  "\" is not a supported field selector for pods");
    }
    terms.push_back(std::move(t));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return terms;
}

FakeCluster::FakeCluster(Options options) : options_(std::move(options)) {}

FakeCluster::~FakeCluster() {
  MutexLock lock(&mu_);
  for (auto& w : watchers_) w.feed->End();
}

TestApiServer::Handler FakeCluster::Handler() {
  return [this](const RecordedRequest& r) { return Serve(r); };
}

Status FakeCluster::AddNode(const std::string& name,
                            const std::map<std::string, std::string>& allocatable) {
  MutexLock lock(&mu_);
  if (nodes_.count(name)) return AlreadyExistsError("node " + name + " exists");
  json node = {{"kind", "Node"},
               {"apiVersion", "v1"},
               {"metadata", {{"name", name}, {"annotations", json::object()}}},
               {"status", {{"allocatable", allocatable}, {"capacity", allocatable}}}};
  RecordLocked(false, "ADDED", nullptr, node);
  return OkStatus();
}

Status FakeCluster::CreatePod(const std::string& namespace_name, const std::string& name,
                              const std::string& uid, const std::string& spec_json) {
  json spec = json::parse(spec_json, nullptr, /*allow_exceptions=*/false);
  if (!spec.is_object()) return InvalidArgumentError("pod spec is not a JSON object");
  MutexLock lock(&mu_);
  const std::string key = namespace_name + "/" + name;
  if (pods_.count(key)) return AlreadyExistsError("pod " + key + " exists");
  spec.erase("nodeName");
  json pod = {{"kind", "Pod"},
              {"apiVersion", "v1"},
              {"metadata", {{"name", name}, {"namespace", namespace_name}, {"uid", uid}}},
              {"spec", spec},
              {"status", {{"phase", "Pending"}}}};
  RecordLocked(true, "ADDED", nullptr, pod);
  return OkStatus();
}

Status FakeCluster::DeletePod(const std::string& namespace_name, const std::string& name) {
  MutexLock lock(&mu_);
  const std::string key = namespace_name + "/" + name;
  if (!pods_.count(key)) return NotFoundError("pod " + key + " not found");
  RecordLocked(true, "DELETED", pods_[key], pods_[key]);
  return OkStatus();
}

Status FakeCluster::SetPhase(const std::string& namespace_name, const std::string& name,
                             const std::string& phase) {
  MutexLock lock(&mu_);
  const std::string key = namespace_name + "/" + name;
  if (!pods_.count(key)) return NotFoundError("pod " + key + " not found");
  json pod = pods_[key];
  pod["status"]["phase"] = phase;
  RecordLocked(true, "MODIFIED", pods_[key], pod);
  return OkStatus();
}

Status FakeCluster::Bind(const std::string& namespace_name, const std::string& name,
                         const std::string& node) {
  StatusOr<BoundPod> bound = InternalError("not bound");
  {
    MutexLock lock(&mu_);
    bound = BindLocked(namespace_name, name, node);
  }
  if (!bound.ok()) return bound.status();
  if (options_.on_bound) options_.on_bound(*bound);
  return OkStatus();
}

StatusOr<BoundPod> FakeCluster::BindLocked(const std::string& namespace_name,
                                           const std::string& name, const std::string& node) {
  const std::string key = namespace_name + "/" + name;
  auto it = pods_.find(key);
  if (it == pods_.end()) return NotFoundError("pods \"" + name + "\" not found");
  if (!FieldOf(it->second, "spec.nodeName").empty()) {
    return AbortedError("pod " + name + " is already assigned to node \"" +
                        FieldOf(it->second, "spec.nodeName") + "\"");
  }
  json pod = it->second;
  pod["spec"]["nodeName"] = node;
  pod["status"]["conditions"] = json::array({{{"type", "PodScheduled"}, {"status", "True"}}});
  RecordLocked(true, "MODIFIED", it->second, pod);
  ++bindings_;
  return BoundPod{.namespace_name = namespace_name,
                  .name = name,
                  .uid = pod["metadata"].value("uid", ""),
                  .node = node,
                  .spec = pod["spec"]};
}

void FakeCluster::RecordLocked(bool pod, std::string type, json old_object, json object) {
  const uint64_t rv = ++rv_;
  object["metadata"]["resourceVersion"] = std::to_string(rv);
  const std::string key =
      pod ? FieldOf(object, "metadata.namespace") + "/" + FieldOf(object, "metadata.name")
          : FieldOf(object, "metadata.name");
  auto& table = pod ? pods_ : nodes_;
  if (type == "DELETED") {
    table.erase(key);
  } else {
    table[key] = object;
  }
  Event e{.rv = rv,
          .pod = pod,
          .type = std::move(type),
          .old_object = std::move(old_object),
          .object = std::move(object)};
  std::erase_if(watchers_, [](const Watcher& w) { return w.feed->detached(); });
  for (const auto& w : watchers_) {
    std::string line = LineFor(w, e);
    if (!line.empty()) w.feed->Send(std::move(line));
  }
  history_.push_back(std::move(e));
  while (history_.size() > options_.max_history) {
    oldest_rv_ = history_.front().rv;
    history_.pop_front();
  }
}

std::string FakeCluster::LineFor(const Watcher& w, const Event& e) {
  if (w.pod != e.pod) return "";
  auto selected = [&](const json& o) {
    if (o.is_null()) return false;
    if (!w.namespace_name.empty() && FieldOf(o, "metadata.namespace") != w.namespace_name) {
      return false;
    }
    for (const auto& t : w.selector) {
      if ((FieldOf(o, t.field) == t.value) == t.negated) return false;
    }
    return true;
  };
  const bool now = e.type != "DELETED" && selected(e.object);
  const bool before = e.type == "ADDED" ? false : selected(e.old_object);
  std::string type;
  if (e.type == "DELETED") {
    if (!before) return "";
    type = "DELETED";
  } else if (now && before) {
    type = "MODIFIED";
  } else if (now) {
    type = "ADDED";
  } else if (before) {
    type = "DELETED";  // left the selection
  } else {
    return "";
  }
  return json{{"type", type}, {"object", e.object}}.dump() + "\n";
}

Reply FakeCluster::Serve(const RecordedRequest& r) {
  const std::string nodes = "/api/v1/nodes";
  if (r.path == nodes || r.path.rfind(nodes + "/", 0) == 0) {
    return ServeNodes(r, r.path.substr(nodes.size()));
  }
  if (r.path == "/api/v1/pods") return ServePods(r, "", "");
  const std::string ns_prefix = "/api/v1/namespaces/";
  if (r.path.rfind(ns_prefix, 0) == 0) {
    std::string rest = r.path.substr(ns_prefix.size());
    size_t slash = rest.find('/');
    if (slash != std::string::npos && rest.compare(slash, 5, "/pods") == 0) {
      return ServePods(r, rest.substr(0, slash), rest.substr(slash + 5));
    }
  }
  return StatusReply(404, "NotFound", "the server could not find the requested resource");
}

Reply FakeCluster::ServeNodes(const RecordedRequest& r, const std::string& rest) {
  auto query = SplitQuery(r.query);
  MutexLock lock(&mu_);
  if (rest.empty()) {
    if (r.method != "GET") return StatusReply(405, "MethodNotAllowed", r.method + " nodes");
    if (query.count("watch") && query["watch"] != "0" && query["watch"] != "false") {
      return Watch(Watcher{.pod = false}, query);
    }
    return List(false, "", {});
  }
  const std::string name = rest.substr(1);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return StatusReply(404, "NotFound", "nodes \"" + name + "\" not found");
  if (r.method == "GET") return {.body = it->second.dump()};
  if (r.method != "PATCH") return StatusReply(405, "MethodNotAllowed", r.method + " node");
  auto type = r.headers.find("content-type");
  if (type == r.headers.end() || type->second.rfind("application/merge-patch+json", 0) != 0) {
    return StatusReply(415, "UnsupportedMediaType", "PATCH needs application/merge-patch+json");
  }
  json patch = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!patch.is_object()) return StatusReply(400, "BadRequest", "the patch is not a JSON object");
  for (const auto& [key, value] : patch.items()) {
    if (key != "metadata" || !value.is_object()) {
      return StatusReply(400, "BadRequest", "only metadata.annotations may be patched");
    }
    for (const auto& [mkey, mvalue] : value.items()) {
      if (mkey != "annotations" || !mvalue.is_object()) {
        return StatusReply(400, "BadRequest", "only metadata.annotations may be patched");
      }
      for (const auto& [akey, avalue] : mvalue.items()) {
        if (!avalue.is_string() && !avalue.is_null()) {
          return StatusReply(400, "BadRequest", "annotation " + akey + ": not a string");
        }
      }
    }
  }
  json node = it->second;
  node.merge_patch(patch);
  RecordLocked(false, "MODIFIED", it->second, node);
  return {.body = nodes_[name].dump()};
}

Reply FakeCluster::ServePods(const RecordedRequest& r, const std::string& namespace_name,
                             const std::string& rest) {
  if (rest.empty()) {
    if (r.method != "GET") return StatusReply(405, "MethodNotAllowed", r.method + " pods");
    auto query = SplitQuery(r.query);
    StatusOr<std::string> decoded = UrlDecode(query["fieldSelector"]);
    if (!decoded.ok())
      return StatusReply(400, "BadRequest", "fieldSelector: " + decoded.status().message());
    StatusOr<std::vector<FieldTerm>> selector = ParsePodFieldSelector(*decoded);
    if (!selector.ok()) return StatusReply(400, "BadRequest", selector.status().message());
    MutexLock lock(&mu_);
    if (query.count("watch") && query["watch"] != "0" && query["watch"] != "false") {
      return Watch(Watcher{.pod = true, .namespace_name = namespace_name, .selector = *selector},
                   query);
    }
    return List(true, namespace_name, *selector);
  }
  // "/NAME/binding"
  const size_t slash = rest.find('/', 1);
  if (namespace_name.empty() || slash == std::string::npos || rest.substr(slash) != "/binding") {
    return StatusReply(404, "NotFound", "the server could not find the requested resource");
  }
  if (r.method != "POST") return StatusReply(405, "MethodNotAllowed", r.method + " binding");
  const std::string name = rest.substr(1, slash - 1);
  json b = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!b.is_object() || b.value("kind", "") != "Binding" || !b["target"].is_object() ||
      !b["target"]["name"].is_string() || b["target"]["name"].get<std::string>().empty()) {
    return StatusReply(400, "BadRequest",
                       "the body is not a Binding with target.name (kind Binding, target a Node)");
  }
  if (b["metadata"].is_object() && b["metadata"].contains("name") &&
      b["metadata"]["name"] != name) {
    return StatusReply(400, "BadRequest", "metadata.name does not match the pod in the path");
  }
  StatusOr<BoundPod> bound = InternalError("not bound");
  {
    MutexLock lock(&mu_);
    bound = BindLocked(namespace_name, name, b["target"]["name"].get<std::string>());
  }
  if (!bound.ok()) {
    if (bound.status().code() == StatusCode::kNotFound) {
      return StatusReply(404, "NotFound", bound.status().message());
    }
    return StatusReply(409, "Conflict", bound.status().message());
  }
  if (options_.on_bound) options_.on_bound(*bound);
  return {.status = 201,
          .body = json{{"kind", "Status"}, {"status", "Success"}, {"code", 201}}.dump()};
}

Reply FakeCluster::List(bool pod, const std::string& namespace_name,
                        const std::vector<FieldTerm>& selector) {
  Watcher w{.pod = pod, .namespace_name = namespace_name, .selector = selector};
  json items = json::array();
  for (const auto& [key, object] : pod ? pods_ : nodes_) {
    Event probe{.pod = pod, .type = "ADDED", .object = object};
    if (!LineFor(w, probe).empty()) items.push_back(object);
  }
  json list = {{"kind", pod ? "PodList" : "NodeList"},
               {"apiVersion", "v1"},
               {"metadata", {{"resourceVersion", std::to_string(rv_)}}},
               {"items", std::move(items)}};
  return {.body = list.dump()};
}

Reply FakeCluster::Watch(Watcher w, const std::map<std::string, std::string>& query) {
  w.feed = std::make_shared<WatchFeed>();
  ++watches_opened_[w.pod ? "pods" : "nodes"];
  auto rv_it = query.find("resourceVersion");
  const std::string rv_text = rv_it == query.end() ? "" : rv_it->second;
  if (rv_text.empty() || rv_text == "0") {
    // "Any version": the current objects as ADDED, then what follows.
    for (const auto& [key, object] : w.pod ? pods_ : nodes_) {
      std::string line = LineFor(w, Event{.pod = w.pod, .type = "ADDED", .object = object});
      if (!line.empty()) w.feed->Send(std::move(line));
    }
  } else {
    uint64_t from = 0;
    try {
      size_t used = 0;
      from = std::stoull(rv_text, &used);
      if (used != rv_text.size()) throw std::invalid_argument(rv_text);
    } catch (const std::exception&) {
      return StatusReply(400, "BadRequest", "resourceVersion: not a number: " + rv_text);
    }
    if (from < oldest_rv_) {
      w.feed->Send(json{{"type", "ERROR"},
                        {"object",
                         {{"kind", "Status"},
                          {"status", "Failure"},
                          {"code", 410},
                          {"reason", "Expired"},
                          {"message", "too old resource version"}}}}
                       .dump() +
                   "\n");
      w.feed->End();
      return {.feed = w.feed};
    }
    for (const auto& e : history_) {
      if (e.rv <= from) continue;
      std::string line = LineFor(w, e);
      if (!line.empty()) w.feed->Send(std::move(line));
    }
  }
  watchers_.push_back(w);
  return {.feed = w.feed};
}

std::string FakeCluster::NodeAnnotation(const std::string& node, const std::string& key) const {
  MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return "";
  const json& a = it->second["metadata"]["annotations"];
  auto v = a.find(key);
  return v != a.end() && v->is_string() ? v->get<std::string>() : "";
}

std::optional<std::string> FakeCluster::PodNode(const std::string& namespace_name,
                                                const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = pods_.find(namespace_name + "/" + name);
  if (it == pods_.end()) return std::nullopt;
  return FieldOf(it->second, "spec.nodeName");
}

uint64_t FakeCluster::resource_version() const {
  MutexLock lock(&mu_);
  return rv_;
}

uint64_t FakeCluster::bindings() const {
  MutexLock lock(&mu_);
  return bindings_;
}

size_t FakeCluster::OpenWatches() const {
  MutexLock lock(&mu_);
  return watchers_.size();
}

size_t FakeCluster::WatchesOpened(const std::string& collection) const {
  MutexLock lock(&mu_);
  auto it = watches_opened_.find(collection);
  return it == watches_opened_.end() ? 0 : it->second;
}

}  // namespace kdm::kube::test
