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
#include "kdm/kube/node_decode.h"

namespace kdm::kube {

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
    // Back-off before a LIST again or after a failed or short watch
    // (client-go's reflector: 800 ms doubling to 30 s, reset after 2 min).
    std::chrono::milliseconds initial_backoff{800};
    std::chrono::milliseconds max_backoff{30'000};
    std::chrono::milliseconds backoff_reset{120'000};
    // Each wait is lengthened by a random part of it, up to this fraction.
    double backoff_jitter = 0.5;
    // A watch the server ends sooner than this without sending a line is
    // "short": the next one waits a back-off.
    std::chrono::milliseconds short_watch{1000};
    // Seed of the jitter; 0 picks one at random.
    uint64_t jitter_seed = 0;
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
    // Waits before a LIST or watch (the back-off above), and short watches.
    uint64_t backoffs = 0;
    uint64_t short_watches = 0;
    // Watch events and LIST items refused for their nesting (and skipped).
    uint64_t refused = 0;
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
