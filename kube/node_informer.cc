#include "kdm/kube/node_informer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "kdm/base/log_value.h"
#include "kdm/base/sync.h"
#include "kdm/k8s/devices_annotation.h"

namespace kdm::kube {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr size_t kMaxLoggedBytes = 256;

std::string StringAt(const json& object, const char* a, const char* b) {
  auto outer = object.find(a);
  if (outer == object.end() || !outer->is_object()) return "";
  auto inner = outer->find(b);
  if (inner == outer->end() || !inner->is_string()) return "";
  return inner->get<std::string>();
}

// The wanted annotations of `metadata` (an object), each copied once with
// room for the annotation reader's padding.
void ReadAnnotations(const json& metadata, const std::vector<std::string>& keys, NodeObject* node) {
  if (keys.empty()) return;
  auto annotations = metadata.find("annotations");
  if (annotations == metadata.end() || annotations->is_null()) return;
  if (!annotations->is_object()) {
    node->annotations_error = "metadata.annotations: must be an object";
    return;
  }
  for (const std::string& key : keys) {
    auto value = annotations->find(key);
    if (value == annotations->end()) continue;
    if (!value->is_string()) {
      node->annotations_error = "metadata.annotations['" + key + "']: must be a string";
      continue;
    }
    const std::string& text = value->get_ref<const std::string&>();
    std::string copy;
    copy.reserve(text.size() + k8s::DecodePadding());
    copy.assign(text);
    node->annotations.emplace(key, std::move(copy));
  }
}

StatusOr<NodeObject> ToNode(const json& object, const std::vector<std::string>& annotation_keys) {
  if (!object.is_object()) return InvalidArgumentError("the object is not a JSON object");
  NodeObject node;
  node.name = StringAt(object, "metadata", "name");
  if (node.name.empty()) return InvalidArgumentError("the object has no metadata.name");
  node.resource_version = StringAt(object, "metadata", "resourceVersion");
  // A name was found: metadata is there and an object.
  ReadAnnotations(*object.find("metadata"), annotation_keys, &node);
  return node;
}

// What one watch line asked for.
enum class LineOutcome { kContinue, kRelistGone, kRelistError };

class NodeInformerImpl final : public NodeInformer {
 public:
  explicit NodeInformerImpl(Options options)
      : options_(std::move(options)), clock_(options_.clock ? options_.clock : NewRealClock()) {}
  ~NodeInformerImpl() override { Stop(); }

  void StartThread() {
    thread_ = std::thread([this] { Run(); });
  }

  void Stop() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    stop_wakeup_.Wake();
    cancel_.Cancel();
    MutexLock join_lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

  Stats stats() const override {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  bool Stopping() {
    MutexLock lock(&mu_);
    return stopping_;
  }

  // Waits `d` on the clock or until Stop(); true when stopping.
  bool Sleep(milliseconds d) {
    clock_->SleepFor(d, stop_wakeup_);
    return Stopping();
  }

  void Failed(const Status& s) {
    spdlog::warn("event=node_informer_error error={}",
                 QuoteLogValue(s.ToString(), kMaxLoggedBytes));
    MutexLock lock(&mu_);
    ++stats_.errors;
    stats_.last_error = s.ToString();
  }

  std::string WatchPath(const std::string& rv) const {
    const char sep = options_.path.find('?') == std::string::npos ? '?' : '&';
    return options_.path + sep + "watch=1&resourceVersion=" + rv + "&allowWatchBookmarks=true";
  }

  // LIST: the set and its version, handed to on_list.
  StatusOr<std::string> List() {
    StatusOr<Client::Response> r =
        options_.client->Send("GET", options_.path, "", options_.request_timeout, &cancel_);
    if (!r.ok()) return r.status();
    Status http = Client::StatusForResponse("GET", options_.path, *r);
    if (!http.ok()) return http;
    json list = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (!list.is_object()) return DataLossError("GET " + options_.path + ": not a JSON object");
    std::string rv = StringAt(list, "metadata", "resourceVersion");
    if (rv.empty()) {
      return DataLossError("GET " + options_.path + ": no metadata.resourceVersion in the list");
    }
    std::vector<NodeObject> nodes;
    auto items = list.find("items");
    if (items != list.end() && !items->is_null()) {
      if (!items->is_array()) return DataLossError("GET " + options_.path + ": items: not a list");
      for (size_t i = 0; i < items->size(); ++i) {
        StatusOr<NodeObject> node = ToNode((*items)[i], options_.annotation_keys);
        if (!node.ok()) {
          return DataLossError("GET " + options_.path + ": items[" + std::to_string(i) +
                               "]: " + node.status().message());
        }
        nodes.push_back(std::move(*node));
      }
    }
    {
      MutexLock lock(&mu_);
      ++stats_.lists;
      stats_.resource_version = rv;
    }
    if (options_.on_list) options_.on_list(std::move(nodes));
    return rv;
  }

  LineOutcome OnLine(std::string_view line, std::string& rv) {
    json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    auto bad = [&](const std::string& why) {
      Failed(DataLossError("watch " + options_.path + ": " + why + ": " +
                           QuoteLogValue(line, kMaxLoggedBytes)));
      return LineOutcome::kRelistError;
    };
    if (!event.is_object()) return bad("not a JSON object");
    auto type_it = event.find("type");
    auto object_it = event.find("object");
    if (type_it == event.end() || !type_it->is_string()) return bad("no type");
    if (object_it == event.end() || !object_it->is_object()) return bad("no object");
    const std::string type = type_it->get<std::string>();
    if (type == "ERROR") {
      auto code = object_it->find("code");
      if (code != object_it->end() && code->is_number_integer() && code->get<int>() == 410) {
        return LineOutcome::kRelistGone;
      }
      auto message = object_it->find("message");
      return bad("ERROR event" + (message != object_it->end() && message->is_string()
                                      ? " (" + message->get<std::string>() + ")"
                                      : std::string()));
    }
    if (type == "BOOKMARK") {
      std::string v = StringAt(*object_it, "metadata", "resourceVersion");
      if (v.empty()) return bad("BOOKMARK without metadata.resourceVersion");
      rv = v;
      MutexLock lock(&mu_);
      ++stats_.bookmarks;
      stats_.resource_version = rv;
      return LineOutcome::kContinue;
    }
    NodeEventType t;
    if (type == "ADDED") {
      t = NodeEventType::kAdded;
    } else if (type == "MODIFIED") {
      t = NodeEventType::kModified;
    } else if (type == "DELETED") {
      t = NodeEventType::kDeleted;
    } else {
      return bad("unknown event type");
    }
    StatusOr<NodeObject> node = ToNode(*object_it, options_.annotation_keys);
    if (!node.ok()) return bad(node.status().message());
    if (!node->resource_version.empty()) rv = node->resource_version;
    {
      MutexLock lock(&mu_);
      ++stats_.events;
      stats_.resource_version = rv;
    }
    if (options_.on_event) options_.on_event(t, *node);
    return LineOutcome::kContinue;
  }

  void Run() {
    milliseconds backoff = options_.initial_backoff;
    auto back_off = [&] {
      bool stop = Sleep(backoff);
      backoff = std::min(backoff * 2, options_.max_backoff);
      return stop;
    };
    while (!Stopping()) {
      StatusOr<std::string> listed = List();
      if (!listed.ok()) {
        if (Stopping()) return;
        Failed(listed.status());
        if (back_off()) return;
        continue;
      }
      std::string rv = *listed;
      // Watch from rv until a relist is needed.
      while (!Stopping()) {
        LineOutcome outcome = LineOutcome::kContinue;
        {
          MutexLock lock(&mu_);
          ++stats_.watches;
        }
        const std::string path = WatchPath(rv);
        Status s = options_.client->Stream(
            path, options_.request_timeout, options_.idle_timeout,
            [&](std::string_view line) {
              outcome = OnLine(line, rv);
              return outcome == LineOutcome::kContinue;
            },
            &cancel_);
        if (Stopping()) return;
        if (outcome == LineOutcome::kRelistGone ||
            s.code() == StatusCode::kFailedPrecondition) {  // 410 on the request itself
          MutexLock lock(&mu_);
          ++stats_.relists_after_gone;
          break;
        }
        if (outcome == LineOutcome::kRelistError) {
          if (back_off()) return;
          break;
        }
        if (s.ok()) {
          backoff = options_.initial_backoff;  // the server ended it; go on at once
          continue;
        }
        Failed(s);
        if (back_off()) return;
      }
    }
  }

  const Options options_;
  const std::shared_ptr<kdm::Clock> clock_;
  Cancellation cancel_;
  Wakeup stop_wakeup_;  // Stop() wakes it: ends a back-off at once
  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  Mutex join_mu_;
  std::thread thread_;
};

}  // namespace

StatusOr<std::unique_ptr<NodeInformer>> NodeInformer::Start(Options options) {
  if (options.client == nullptr) return InvalidArgumentError("node informer: no client");
  if (!options.on_list || !options.on_event) {
    return InvalidArgumentError("node informer: on_list and on_event are required");
  }
  if (options.initial_backoff.count() <= 0) options.initial_backoff = milliseconds(1);
  if (options.max_backoff < options.initial_backoff) options.max_backoff = options.initial_backoff;
  auto informer = std::make_unique<NodeInformerImpl>(std::move(options));
  informer->StartThread();
  return std::unique_ptr<NodeInformer>(std::move(informer));
}

}  // namespace kdm::kube
