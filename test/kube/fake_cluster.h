// kdm::kube::test::FakeCluster: a small stateful kube-apiserver for tests,
// served by a TestApiServer (it is the server's handler). It keeps Nodes
// and Pods under one global resourceVersion and answers what kdm's agents
// and a scheduler loop use (docs/extender.md, SPEC 7 and 8):
//   GET   /api/v1/nodes[?watch=1&resourceVersion=RV]   NodeList / watch
//   GET   /api/v1/nodes/NAME                            Node
//   PATCH /api/v1/nodes/NAME   merge patch (RFC 7386) of metadata.annotations
//   GET   /api/v1/pods, /api/v1/namespaces/NS/pods      PodList / watch, with
//         fieldSelector=f=v,f!=v,... over spec.nodeName, status.phase,
//         metadata.namespace, metadata.name (URL-decoded; other fields: 400)
//   POST  /api/v1/namespaces/NS/pods/NAME/binding       the default binder's
//         Binding: 201; 404 unknown pod, 409 already bound, 400 bad body
// A watch replays every event after its resourceVersion (410 Gone once that
// is older than the kept history), then streams new ones; any number may
// be open at once. A watch with a field selector sees a pod that leaves the
// selection as DELETED and one that enters it as ADDED, as the real server.
//
// Thread-safety: every method may be called from any thread. Callbacks
// (on_bound) run on the server's thread, outside the lock, and must not
// block for long.
//
// Example:
//   FakeCluster cluster({.on_bound = [](const BoundPod& p) { ... }});
//   server->SetHandler(cluster.Handler());
//   cluster.AddNode("gpu-a", {{"nvidia.com/gpu", "8"}});
//   cluster.CreatePod("ml", "train", "uid-1", R"({"containers":[...]})");
#ifndef KDM_TEST_KUBE_FAKE_CLUSTER_H_
#define KDM_TEST_KUBE_FAKE_CLUSTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/test/kube/test_api_server.h"

namespace kdm::kube::test {

// One term of a field selector: `field=value` or `field!=value`.
struct FieldTerm {
  std::string field;
  std::string value;
  bool negated = false;
};

// Parses a URL-decoded fieldSelector ("" selects everything).
// INVALID_ARGUMENT naming the term for a term without '=' or with a field
// other than spec.nodeName, status.phase, metadata.namespace, metadata.name.
StatusOr<std::vector<FieldTerm>> ParsePodFieldSelector(const std::string& text);

// Percent-decodes a query value ('+' is a space). INVALID_ARGUMENT for a
// '%' not followed by two hex digits.
StatusOr<std::string> UrlDecode(const std::string& text);

struct BoundPod {
  std::string namespace_name;
  std::string name;
  std::string uid;
  std::string node;
  nlohmann::json spec;  // as created, with nodeName set
};

class FakeCluster {
 public:
  struct Options {
    // Called after a binding is recorded (and its MODIFIED event sent).
    std::function<void(const BoundPod&)> on_bound;
    // Events kept for watches that start from an older resourceVersion.
    size_t max_history = 100'000;
  };

  explicit FakeCluster(Options options);
  // Ends every open watch.
  ~FakeCluster();
  FakeCluster(const FakeCluster&) = delete;
  FakeCluster& operator=(const FakeCluster&) = delete;

  // For TestApiServer::SetHandler. The cluster must outlive the server's use.
  TestApiServer::Handler Handler();
  Reply Serve(const RecordedRequest& request);

  // A Node with `allocatable` (resource -> quantity) in its status.
  // ALREADY_EXISTS for a known name.
  Status AddNode(const std::string& name, const std::map<std::string, std::string>& allocatable);
  // An unbound Pending pod with `spec_json` (a JSON object) as its spec.
  // ALREADY_EXISTS for a known namespace/name, INVALID_ARGUMENT for a spec
  // that is not a JSON object.
  Status CreatePod(const std::string& namespace_name, const std::string& name,
                   const std::string& uid, const std::string& spec_json);
  // NOT_FOUND for an unknown pod.
  Status DeletePod(const std::string& namespace_name, const std::string& name);
  Status SetPhase(const std::string& namespace_name, const std::string& name,
                  const std::string& phase);
  // Binds as POST .../binding does (on_bound included). NOT_FOUND, ABORTED
  // (already bound).
  Status Bind(const std::string& namespace_name, const std::string& name, const std::string& node);

  // The node's annotation `key` ("" when absent or no such node).
  std::string NodeAnnotation(const std::string& node, const std::string& key) const;
  // The pod's spec.nodeName (nullopt: no such pod; "": unbound).
  std::optional<std::string> PodNode(const std::string& namespace_name,
                                     const std::string& name) const;
  uint64_t resource_version() const;
  // Bindings recorded (API and Bind()).
  uint64_t bindings() const;
  // Watches opened, per collection ("nodes", "pods").
  size_t WatchesOpened(const std::string& collection) const;
  // Watches kept: those whose connection had not gone at the last change
  // (a watcher is dropped then, so no events queue up for nobody).
  size_t OpenWatches() const;

 private:
  struct Event {
    uint64_t rv = 0;
    bool pod = false;
    std::string type;           // ADDED, MODIFIED, DELETED
    nlohmann::json old_object;  // null for ADDED
    nlohmann::json object;
  };
  struct Watcher {
    bool pod = false;
    std::string namespace_name;  // "" = all
    std::vector<FieldTerm> selector;
    std::shared_ptr<WatchFeed> feed;
  };

  Reply ServeNodes(const RecordedRequest& request, const std::string& rest);
  Reply ServePods(const RecordedRequest& request, const std::string& namespace_name,
                  const std::string& rest);
  Reply List(bool pod, const std::string& namespace_name, const std::vector<FieldTerm>& selector)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Reply Watch(Watcher watcher, const std::map<std::string, std::string>& query)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StatusOr<BoundPod> BindLocked(const std::string& namespace_name, const std::string& name,
                                const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordLocked(bool pod, std::string type, nlohmann::json old_object, nlohmann::json object)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The watch line for `event` as `watcher` sees it ("" when not at all).
  static std::string LineFor(const Watcher& watcher, const Event& event);

  const Options options_;
  mutable Mutex mu_;
  uint64_t rv_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t bindings_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, nlohmann::json> nodes_ ABSL_GUARDED_BY(mu_);
  // "namespace/name" -> the Pod object.
  std::map<std::string, nlohmann::json> pods_ ABSL_GUARDED_BY(mu_);
  std::deque<Event> history_ ABSL_GUARDED_BY(mu_);
  // The newest event dropped from history_: a watch must start at or after it.
  uint64_t oldest_rv_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> watches_opened_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kdm::kube::test

#endif  // KDM_TEST_KUBE_FAKE_CLUSTER_H_
