// NodeCache: the nodes the extender knows from the API server (LIST +
// WATCH through kube::NodeInformer, which hands over each node's name and
// kdm.io/devices value, parsed once), each with that annotation already
// decoded (k8s::DecodeNodeDevices), so that requests carrying only NodeNames
// (nodeCacheCapable: true) are answered without Node objects. See
// docs/extender.md, "Node cache".
//
// An annotation that does not read is logged (event=annotation_unreadable)
// once per change of the node, at most kUnreadableLogBurst lines per node in
// kUnreadableLogWindow (a flapping node then gets `suppressed=N`).
//
// Thread-safety: Find/size from any thread; Replace/Apply are called by the
// informer's thread (or a test); Start/Stop by the owner.
//
// Example:
//   NodeCache cache(&topologies);
//   KDM_RETURN_IF_ERROR(cache.Start(client.get()));
//   std::shared_ptr<const CachedNode> n = cache.Find("gpu-node-7");
#ifndef KDM_SCHEDULER_NODE_CACHE_H_
#define KDM_SCHEDULER_NODE_CACHE_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/kube/client.h"
#include "kdm/kube/node_informer.h"
#include "kdm/scheduler/assumptions.h"

namespace kdm::scheduler {

struct CachedNode {
  std::string name;
  // Unset without an annotation, or when it did not read (then `error`).
  std::optional<k8s::NodeDevices> devices;
  std::string error;
};

class NodeCache {
 public:
  // `assumptions` (not owned; may be null) hears of deleted nodes.
  explicit NodeCache(k8s::TopologyCache* topologies, Assumptions* assumptions = nullptr)
      : topologies_(topologies), assumptions_(assumptions) {}
  ~NodeCache() { Stop(); }
  NodeCache(const NodeCache&) = delete;
  NodeCache& operator=(const NodeCache&) = delete;

  // Starts the informer on `client` (not owned; must outlive Stop()).
  // `options.client` and the callbacks are set here.
  Status Start(kube::Client* client, kube::NodeInformer::Options options);
  // With the informer's default options.
  Status Start(kube::Client* client) {
    kube::NodeInformer::Options options;
    return Start(client, std::move(options));
  }
  // Stops the informer (joins its thread). Idempotent.
  void Stop();

  void Replace(const std::vector<kube::NodeObject>& nodes);
  void Apply(kube::NodeEventType type, const kube::NodeObject& node);

  // Null when the name is unknown.
  std::shared_ptr<const CachedNode> Find(std::string_view name) const;
  // Find for each name, under one lock (a NodeNames request's thousands).
  std::vector<std::shared_ptr<const CachedNode>> FindAll(
      const std::vector<std::string>& names) const;
  size_t size() const;
  // True once the first LIST was handed over (Replace): from then on an
  // unknown name is a node the API server does not have, not one not read
  // yet. The extender is ready (/readyz) only then. Never false again.
  bool synced() const;
  // Annotations that did not read, since the start.
  uint64_t annotation_errors() const;
  // kdm.io/devices values decoded (k8s::DecodeNodeDevices), since the start:
  // one per node of a LIST and per ADDED/MODIFIED event that carries one. A
  // node's JSON is parsed once, by the informer; the cache never re-reads it.
  uint64_t annotation_decodes() const;
  std::optional<kube::NodeInformer::Stats> informer_stats() const;

  static constexpr int kUnreadableLogBurst = 3;
  static constexpr std::chrono::seconds kUnreadableLogWindow{10};
  static constexpr size_t kMaxLogKeys = 1024;

 private:
  std::shared_ptr<const CachedNode> Read(const kube::NodeObject& node);
  // Logs `node`'s error (when not empty, within the rate limit) and the
  // counts of lines left out whose window ended.
  void LogUnreadable(const std::string& node, const std::string& error);

  k8s::TopologyCache* const topologies_;
  Assumptions* const assumptions_;
  mutable Mutex mu_;
  // Looked up by string_view without a copy (a transparent hash).
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using NodeMap =
      std::unordered_map<std::string, std::shared_ptr<const CachedNode>, NameHash, std::equal_to<>>;

  NodeMap nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t annotation_errors_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t annotation_decodes_ ABSL_GUARDED_BY(mu_) = 0;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  Mutex log_mu_;
  LogRateLimiter unreadable_log_ ABSL_GUARDED_BY(log_mu_){kUnreadableLogBurst, kUnreadableLogWindow,
                                                          kMaxLogKeys};
  std::unique_ptr<kube::NodeInformer> informer_;  // owner's thread only
};

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_NODE_CACHE_H_
