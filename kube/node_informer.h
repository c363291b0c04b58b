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
// from the last version seen.
//
// Back-off, as client-go's reflector: every LIST after the first (after a
// 410, a failed LIST, an event that made no sense) and every watch after a
// failed one or a short one (ended by the server in under a second with no
// line at all) waits first: initial_backoff, doubling up to max_backoff,
// each wait plus up to backoff_jitter of it again (capped at max_backoff);
// the doubling starts over after backoff_reset without a wait. The waits
// sleep on Options::clock, so a FakeClock's Advance() is what ends a
// back-off in tests. Each wait is logged (event=node_informer_backoff with
// the reason and the counts so far). A server that answers every watch with
// 410, or ends every watch at once, thus gets about 4 LISTs or watches in
// the first 10 seconds, 2 a minute after that.
//
// A watch event or a LIST item nested deeper than kMaxNodeJsonDepth is
// refused (logged, rate-limited, naming where and quoting its start) and
// skipped: the informer goes on with the next event or item, from the last
// good version. See docs/kube.md.
//
// Thread-safety: callbacks run on the informer's thread, one at a time, in
// stream order; they must not call Stop(). Stop() and stats() may be called
// from any thread. Stop() cancels the request in flight at once and joins the
// thread: it is bounded by the callback running at the time.
//
// The loop is the one behind every informer of kdm::kube (PodInformer's
// too, kube/pod_informer.h); its options and counts are ListWatchOptions
// and ListWatchStats (kube/list_watch.h).
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
#include "kdm/kube/list_watch.h"
#include "kdm/kube/node_decode.h"

namespace kdm::kube {

class NodeInformer {
 public:
  struct Options : ListWatchOptions {
    std::string path = "/api/v1/nodes";
    // The annotations to hand over in NodeObject::annotations; others are
    // skipped unread. Empty: none.
    std::vector<std::string> annotation_keys;
    // The whole set, after each LIST: replaces what the caller knew.
    std::function<void(std::vector<NodeObject> nodes)> on_list;
    // One change seen by the watch.
    std::function<void(NodeEventType type, const NodeObject& node)> on_event;
  };

  using Stats = ListWatchStats;

  // Starts the thread. Errors: INVALID_ARGUMENT without a client or callbacks.
  static StatusOr<std::unique_ptr<NodeInformer>> Start(Options options);

  virtual ~NodeInformer() = default;
  // Ends the request in flight and joins the thread. Idempotent.
  virtual void Stop() = 0;
  virtual Stats stats() const = 0;
};

}  // namespace kdm::kube

#endif  // KDM_KUBE_NODE_INFORMER_H_
