// kube::ListWatchOptions / kube::ListWatchStats: what every informer of
// kdm::kube shares (NodeInformer, PodInformer): the client, the request
// bounds, the back-off of client-go's reflector and its time seam, and the
// counts each informer keeps. The loop itself is one implementation behind
// both (see docs/kube.md, "LIST + WATCH").
//
// Thread-safety: plain values.
#ifndef KDM_KUBE_LIST_WATCH_H_
#define KDM_KUBE_LIST_WATCH_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kdm/base/clock.h"
#include "kdm/kube/client.h"

namespace kdm::kube {

struct ListWatchOptions {
  // Not owned; must outlive the informer.
  Client* client = nullptr;
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
  // The time seam of the back-off waits (the client has its own, for its
  // retries). Null is taken as NewRealClock() too.
  std::shared_ptr<kdm::Clock> clock = NewRealClock();
};

struct ListWatchStats {
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

}  // namespace kdm::kube

#endif  // KDM_KUBE_LIST_WATCH_H_
