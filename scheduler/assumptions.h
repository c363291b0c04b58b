// Assumptions: the pods the extender knows are bound to a node but that the
// node's kdm.io/devices annotation does not show yet (docs/extender.md,
// "Assumed allocations"). Between a bind and the node's next publish (half a
// second to a second by default, longer under load) the annotation's free
// set is stale; a scheduler that decides on it sends a burst of pods to the
// node that looked best before the burst. The extender judges each node on
// its published free set minus what its assumed pods will take.
//
// - Where from: Bound() is called for every bound, non-terminal pod that
//   asks extended resources, by the Pod informer (source "watch") and by
//   POST /bind (source "bind"); Gone() when the pod is deleted or ends.
// - What a pod takes: for each resource the node publishes, the devices the
//   node's plugin will choose, predicted with topology::Allocate and the
//   policy the annotation names for the resource (`policy`; without it
//   topology::kDefaultPolicy, kdm plugin's default, packed), over the free devices left by the pods
//   assumed before it, in the order the bindings were seen; without a
//   matrix, the first free devices. The kubelet admits in that order too.
// - When it ends, exactly once: the node's annotation lists the pod's
//   fingerprint (`pods`: the node now shows its devices as used: counting
//   it again would be counting it twice), the pod is deleted or ends, the
//   node is deleted, or `timeout` passes (counted, logged). A pod whose
//   assumption ended is remembered (no new assumption when its status
//   changes) until it is Gone() or a relist no longer has it; a pod known
//   only from /bind is forgotten at its timeout. So memory is bounded by
//   the live bound pods plus the binds of the last `timeout`.
// - Views are memoised per node, keyed by the base view's owner and a
//   generation that every change of the node's assumptions bumps: a request
//   over thousands of nodes costs a lookup per node; a change costs one
//   recomputation of that node, O(its assumed pods) allocations.
// - Binds in flight: kube-scheduler binds asynchronously, so the next pod's
//   filter can arrive before the last pod's binding is recorded. A pod that
//   passed the filter somewhere is "in its cycle" (InCycle()); a filter for
//   another pod first waits, at most `bind_wait`, until every such pod is
//   bound, gone or past its wait (WaitForBinds()).
//
// Thread-safety: every method may be called from any thread.
#ifndef KDM_SCHEDULER_ASSUMPTIONS_H_
#define KDM_SCHEDULER_ASSUMPTIONS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kdm/base/clock.h"
#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/sync.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/scheduler/metrics.h"

namespace kdm::scheduler {

struct CachedNode;  // node_cache.h

// A pod bound to a node, as the informer or /bind knows it.
struct BoundPod {
  std::string uid;
  std::string namespace_name;
  std::string name;
  std::string node;
  // Effective request per extended resource (k8s::EffectiveDeviceRequests);
  // only resources with a count > 0.
  std::map<std::string, int64_t> requests;
};

class Assumptions {
 public:
  struct Options {
    // How long an assumption may wait for the node's annotation.
    std::chrono::milliseconds timeout{30'000};
    // How long a filter waits for the binds of pods still in their cycle; 0:
    // never waits.
    std::chrono::milliseconds bind_wait{100};
    // Not owned; null: the steady clock. Timeouts are read on it; the
    // bind wait is real time.
    const Clock* clock = nullptr;
    // Not owned; may be null.
    ExtenderMetrics* metrics = nullptr;
  };
  struct Stats {
    uint64_t assumed = 0;  // assumptions in force now
    uint64_t known = 0;    // pods remembered (assumed, ended, in their cycle)
    uint64_t started_watch = 0;
    uint64_t started_bind = 0;
    uint64_t reflected = 0;
    uint64_t deleted = 0;
    uint64_t expired = 0;
    uint64_t node_deleted = 0;
    uint64_t bind_failed = 0;
    uint64_t views_computed = 0;  // node views built (memo misses)
  };
  enum class Source { kWatch, kBind };

  explicit Assumptions(Options options);

  // The pod is bound to pod.node. A pod already known keeps its assumption
  // (or its ended state); one bound elsewhere before starts over.
  void Bound(const BoundPod& pod, Source source);
  // The pod was deleted or ended.
  void Gone(std::string_view uid);
  // After a LIST: `pods` is every bound pod; pods the informer reported
  // before and that are not in it are Gone. Pods known only from /bind stay.
  void ReplaceBound(const std::vector<BoundPod>& pods);
  // The node was deleted: its assumptions end.
  void NodeGone(std::string_view node);
  // A bind this extender posted failed: the assumption /bind made ends.
  void BindFailed(std::string_view uid);

  // The view of `node` to judge pods on: `base` minus what the node's
  // assumed pods will take. Null when no assumption applies (use `base`).
  // `owner` keeps `base` alive and identifies it for the memo (null: not
  // memoised, e.g. a Node object from a request body).
  std::shared_ptr<const k8s::NodeDevices> View(std::string_view node, const k8s::NodeDevices& base,
                                               const std::shared_ptr<const void>& owner);

  // View for each node of a request under one lock: out[i] for names[i]
  // and bases[i] (skipped where null), each memoised by owners[i] when
  // `owners` is given (a NodeNames request's cached nodes). A request over
  // 5,000 nodes costs one lookup per node.
  std::vector<std::shared_ptr<const k8s::NodeDevices>> Views(
      const std::vector<std::string>& names, const std::vector<const k8s::NodeDevices*>& bases,
      const std::vector<std::shared_ptr<const CachedNode>>* owners);

  // The pod passed the filter on some node: the next pod's filter waits
  // for its bind.
  void InCycle(std::string_view uid);
  // Waits until every pod in its cycle but `uid` is bound or gone, at most
  // bind_wait per pod from when its cycle began. Returns how many pods it
  // gave up on.
  uint64_t WaitForBinds(std::string_view uid);

  // Ends assumptions whose timeout has passed (also done by every call).
  void Sweep();
  Stats stats() const;
  bool enabled() const { return options_.timeout.count() > 0; }

 private:
  enum class State { kAssumed, kEnded };
  struct Entry {
    BoundPod pod;
    uint64_t fingerprint = 0;
    uint64_t seq = 0;    // identity (deadlines name it)
    uint64_t order = 0;  // where it takes devices: the order binds were seen,
                         // by the watch (the API server's order) once it did
    State state = State::kAssumed;
    bool from_watch = false;
    Clock::TimePoint since;
  };
  struct NodeMemo {
    std::shared_ptr<const void> owner;
    uint64_t generation = 0;
    std::shared_ptr<const k8s::NodeDevices> view;
  };
  struct NodeState {
    std::map<uint64_t, std::string> assumed;  // order -> uid
    uint64_t generation = 0;
    NodeMemo memo;
  };
  Clock::TimePoint Now() const;
  void EndLocked(Entry& e, std::string_view reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(std::string_view uid, std::string_view reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SweepLocked(Clock::TimePoint now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BoundLocked(const BoundPod& pod, Source source, Clock::TimePoint now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Count(std::string_view reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `owner` (may be null, or hold null): a shared_ptr keeping `base` alive
  // and naming it for the memo; copied only when a view is memoised.
  template <typename Owner>
  std::shared_ptr<const k8s::NodeDevices> ViewLocked(std::string_view node, NodeState* state,
                                                     const k8s::NodeDevices& base,
                                                     const Owner* owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state of `node` when it has assumed pods, else null: a probe of
  // names_index_ (rebuilt when the set of such nodes changed), cheaper than
  // a map lookup for the thousands of nodes of a request that have none.
  NodeState* FindNodeLocked(std::string_view node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLogs() ABSL_LOCKS_EXCLUDED(log_mu_);

  const Options options_;
  mutable Mutex mu_;
  CondVar binds_changed_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::unordered_map<std::string, Entry> pods_ ABSL_GUARDED_BY(mu_);
  // Looked up by string_view without a copy (a transparent hash).
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, NodeState, NameHash, std::equal_to<>> nodes_ ABSL_GUARDED_BY(mu_);
  // (deadline, uid, seq) in deadline order: the timeout is one constant.
  struct Deadline {
    Clock::TimePoint at;
    std::string uid;
    uint64_t seq;
  };
  std::deque<Deadline> deadlines_ ABSL_GUARDED_BY(mu_);
  // Open addressing over nodes_ by the hashes of their names (hash 0: an
  // empty slot); the states are nodes_'s (stable while in the map).
  // Hashes alone, 8 bytes a slot, so that the probes of a request's
  // thousands of names stay in cache; the entries beside them.
  std::vector<uint64_t> names_index_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<const std::string*, NodeState*>> names_entries_ ABSL_GUARDED_BY(mu_);
  bool names_index_stale_ ABSL_GUARDED_BY(mu_) = true;
  // Pods in their cycle: uid -> when the wait for its bind ends (real time).
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> in_cycle_
      ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Expiry lines waiting to be logged outside mu_.
  std::vector<std::string> expired_lines_ ABSL_GUARDED_BY(mu_);
  Mutex log_mu_;
  LogRateLimiter expiry_log_ ABSL_GUARDED_BY(log_mu_){5, std::chrono::seconds(10)};
};

// The devices of `view` (free positions) that `count` devices of a pod
// will take on the node: the node plugin's choice (topology::Allocate with
// `policy`) when there is a matrix, else the first free ones. All of them
// when fewer are free.
std::vector<int> PredictDevices(const k8s::ResourceView& view, const std::vector<int>& free,
                                int64_t count);

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_ASSUMPTIONS_H_
