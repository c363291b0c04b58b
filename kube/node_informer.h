// kube::NodeInformer: keeps a caller's view of the cluster's Node objects up
// to date with LIST + WATCH, as client-go's informers do.
//
// One thread, owned by the informer: LIST `/api/v1/nodes` (the full set and
// its resourceVersion, handed to on_list), then WATCH from that version
// (`?watch=1&resourceVersion=RV&allowWatchBookmarks=true`), a chunked
// stream of one JSON event per line: ADDED / MODIFIED / DELETED go to
// on_event, BOOKMARK only moves the version on, ERROR with code 410 (Gone:
// the version is too old) means LIST again. A watch that ends (the server's
// timeout, a dropped connection, no byte for idle_timeout) is started again
// from the last version seen; a failed LIST or watch backs off (doubling,
// with the client's own retries inside each request), sleeping on
// Options::clock, so a FakeClock's Advance() is what ends a back-off in
// tests. See docs/kube.md.
//
// Thread-safety: callbacks run on the informer's thread, one at a time, in
// stream order; they must not call Stop(). Stop() and stats() may be called
// from any thread. Stop() cancels the request in flight at once and joins the
// thread: it is bounded by the callback running at the time.
//
// Example:
//   NodeInformer::Options o;
//   o.client = client.get();
//   o.annotation_keys = {"kdm.io/devices"};
//   o.on_list = [&](std::vector<NodeObject> all) { cache.Replace(std::move(all)); };
//   o.on_event = [&](NodeEventType t, const NodeObject& n) { cache.Apply(t, n); };
//   KDM_ASSIGN_OR_RETURN(auto informer, NodeInformer::Start(std::move(o)));
#ifndef KDM_KUBE_NODE_INFORMER_H_
#define KDM_KUBE_NODE_INFORMER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kdm/base/clock.h"
#include "kdm/base/status.h"
#include "kdm/kube/client.h"

namespace kdm::kube {

// One Node as the informer parsed it, once: its name, resourceVersion and
// the annotations its user asked for (Options::annotation_keys). No JSON
// text is kept or handed over: a user never parses a node again.
struct NodeObject {
  std::string name;
  std::string resource_version;
  // Each wanted annotation the node has, by key. Each value has
  // k8s::DecodePadding() bytes of spare capacity, so that
  // k8s::DecodeNodeDevices reads it in place.
  std::map<std::string, std::string, std::less<>> annotations;
  // Non-empty when the node's annotations could not be read: "metadata.
  // annotations: must be an object", or "metadata.annotations['KEY']: must
  // be a string" for a wanted KEY. The node is still handed over (a bad
  // annotation is its user's to report, not a reason to LIST again).
  std::string annotations_error;
};

enum class NodeEventType { kAdded, kModified, kDeleted };

class NodeInformer {
 public:
  struct Options {
    // Not owned; must outlive the informer.
    Client* client = nullptr;
    std::string path = "/api/v1/nodes";
    // Bounds the LIST and the start of each watch.
    std::chrono::milliseconds request_timeout{30'000};
    // A watch with no byte (not even a bookmark) for this long is restarted.
    std::chrono::milliseconds idle_timeout{300'000};
    // Back-off after a failed LIST or watch: initial, doubling, at most max.
    std::chrono::milliseconds initial_backoff{500};
    std::chrono::milliseconds max_backoff{30'000};
    // The annotations to hand over in NodeObject::annotations; others are
    // skipped unread. Empty: none.
    std::vector<std::string> annotation_keys;
    // The time seam of the back-off waits (the client has its own, for its
    // retries). Null is taken as NewRealClock() too.
    std::shared_ptr<kdm::Clock> clock = NewRealClock();
    // The whole set, after each LIST: replaces what the caller knew.
    std::function<void(std::vector<NodeObject> nodes)> on_list;
    // One change seen by the watch.
    std::function<void(NodeEventType type, const NodeObject& node)> on_event;
  };

  struct Stats {
    uint64_t lists = 0;
    uint64_t watches = 0;
    uint64_t events = 0;
    uint64_t bookmarks = 0;
    uint64_t relists_after_gone = 0;
    uint64_t errors = 0;
    std::string resource_version;
    std::string last_error;
  };

  // Starts the thread. Errors: INVALID_ARGUMENT without a client or callbacks.
  static StatusOr<std::unique_ptr<NodeInformer>> Start(Options options);

  virtual ~NodeInformer() = default;
  // Ends the request in flight and joins the thread. Idempotent.
  virtual void Stop() = 0;
  virtual Stats stats() const = 0;
};

}  // namespace kdm::kube

#endif  // KDM_KUBE_NODE_INFORMER_H_
