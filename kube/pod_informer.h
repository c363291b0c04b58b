// kube::PodInformer: keeps a caller's view of the cluster's bound,
// non-terminal Pods up to date with LIST + WATCH, for the scheduler
// extender's assumed allocations (it must see every binding, from any
// scheduler).
//
// The loop, its bounds, back-off, refusals, stats and thread-safety are
// NodeInformer's (kube/node_informer.h; one implementation behind both);
// only the objects differ: each Pod is read once into a PodObject
// (kube/pod_decode.h: identity, spec.nodeName, status.phase, deletion and
// the containers' limits and requests as a k8s::Pod). Its log events are
// event=pod_informer_error, pod_informer_refused and pod_informer_backoff.
//
// The default path, kBoundPodsPath, asks the API server only for pods that
// are bound (spec.nodeName != "") and have not ended (status.phase not
// Succeeded nor Failed). A pod that ends or is deleted leaves that set: the
// watch sends it as DELETED (a pod leaving a field selector's set is
// DELETED to the watcher), with its last state.
//
// Thread-safety: callbacks run on the informer's thread, one at a time, in
// stream order; they must not call Stop(). Stop() and stats() may be called
// from any thread.
//
// Example:
//   PodInformer::Options o;
//   o.client = client.get();
//   o.on_list = [&](std::vector<PodObject> all) { assumed.Replace(std::move(all)); };
//   o.on_event = [&](PodEventType t, const PodObject& p) { assumed.Apply(t, p); };
//   KDM_ASSIGN_OR_RETURN(auto informer, PodInformer::Start(std::move(o)));
#ifndef KDM_KUBE_POD_INFORMER_H_
#define KDM_KUBE_POD_INFORMER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/kube/client.h"
#include "kdm/kube/list_watch.h"
#include "kdm/kube/pod_decode.h"

namespace kdm::kube {

// GET /api/v1/pods?fieldSelector=spec.nodeName!=,status.phase!=Succeeded,
// status.phase!=Failed, percent-encoded: every bound pod that has not ended.
inline constexpr char kBoundPodsPath[] =
    "/api/v1/pods?fieldSelector=spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded%2C"
    "status.phase%21%3DFailed";

class PodInformer {
 public:
  struct Options : ListWatchOptions {
    std::string path = kBoundPodsPath;
    // The whole set, after each LIST: replaces what the caller knew.
    std::function<void(std::vector<PodObject> pods)> on_list;
    // One change seen by the watch.
    std::function<void(PodEventType type, const PodObject& pod)> on_event;
  };

  using Stats = ListWatchStats;

  // Starts the thread. Errors: INVALID_ARGUMENT without a client or callbacks.
  static StatusOr<std::unique_ptr<PodInformer>> Start(Options options);

  virtual ~PodInformer() = default;
  // Ends the request in flight and joins the thread. Idempotent.
  virtual void Stop() = 0;
  virtual Stats stats() const = 0;
};

}  // namespace kdm::kube

#endif  // KDM_KUBE_POD_INFORMER_H_
