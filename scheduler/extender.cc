#include "kdm/scheduler/extender.h"

#include <spdlog/spdlog.h>

#include <optional>
#include <utility>
#include <vector>

#include "kdm/base/log_value.h"
#include "kdm/scheduler/extender_json.h"

namespace kdm::scheduler {
namespace {

// The nodes of one request, each with what is known of its devices.
struct Nodes {
  std::vector<std::string> names;
  std::vector<const k8s::NodeDevices*> devices;  // null: no opinion
  std::vector<std::optional<k8s::NodeDevices>> read;
  std::vector<std::shared_ptr<const CachedNode>> cached;
  // Views less the node's assumed pods (null where none apply).
  std::vector<std::shared_ptr<const k8s::NodeDevices>> adjusted;
  // Annotations in the body that did not read: their count, the first.
  uint64_t unreadable = 0;
  std::string first_unreadable;
};

}  // namespace

Extender::Extender(Options options)
    : options_(options),
      own_topologies_(options.topologies ? nullptr : std::make_unique<k8s::TopologyCache>()),
      topologies_(options.topologies ? options.topologies : own_topologies_.get()),
      scorer_(Scorer::Options{.policy = options.policy}) {}

namespace {

Nodes Collect(const ExtenderArgs& args, k8s::TopologyCache* topologies, const NodeCache* cache,
              ExtenderMetrics* metrics, Assumptions* assumptions) {
  Nodes out;
  uint64_t& errors = out.unreadable;
  std::string& first_error = out.first_unreadable;
  if (args.nodes) {
    const size_t n = args.nodes->size();
    out.names.reserve(n);
    out.read.resize(n);
    out.devices.assign(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      const NodeItem& item = (*args.nodes)[i];
      out.names.push_back(item.name);
      if (!item.annotation) continue;
      StatusOr<k8s::NodeDevices> d = k8s::DecodeNodeDevices(
          *item.annotation, topologies, item.annotation->capacity() - item.annotation->size());
      if (!d.ok()) {
        if (errors++ == 0) first_error = item.name + ": " + std::string(d.status().message());
        continue;
      }
      out.read[i] = std::move(*d);
      out.devices[i] = &*out.read[i];
    }
  } else {
    uint64_t found = 0, unknown = 0;
    const size_t n = args.node_names->size();
    out.names = *args.node_names;
    out.cached = cache != nullptr ? cache->FindAll(out.names)
                                  : std::vector<std::shared_ptr<const CachedNode>>(n);
    out.devices.assign(n, nullptr);
    for (size_t i = 0; i < n && cache != nullptr; ++i) {
      if (!out.cached[i]) {
        ++unknown;
        continue;
      }
      ++found;
      if (out.cached[i]->devices) out.devices[i] = &*out.cached[i]->devices;
    }
    if (cache == nullptr) unknown = n;
    if (metrics) {
      metrics->NodeCache(found, unknown);
      if (cache) metrics->CachedNodes(cache->size());
    }
  }
  if (errors > 0 && metrics) metrics->AnnotationErrors(errors);
  if (assumptions != nullptr && assumptions->enabled()) {
    // A cached node's view is memoised while the node is unchanged.
    out.adjusted =
        assumptions->Views(out.names, out.devices, out.cached.empty() ? nullptr : &out.cached);
    for (size_t i = 0; i < out.names.size(); ++i) {
      if (out.adjusted[i]) out.devices[i] = out.adjusted[i].get();
    }
  }
  return out;
}

}  // namespace

void Extender::LogUnreadable(const std::string& pod, uint64_t errors,
                             const std::string& first_error) {
  // Every request of a client that sends a bad annotation has one: a few
  // lines a second, each with the count of those left out since the last.
  const auto now = LogRateLimiter::Clock::now();
  std::optional<int64_t> suppressed;
  std::vector<std::pair<std::string, int64_t>> ended;
  {
    MutexLock lock(&log_mu_);
    if (errors > 0) suppressed = unreadable_log_.Admit("annotation_unreadable", now);
    ended = unreadable_log_.Flush(now);
  }
  if (errors > 0 && !suppressed && options_.metrics) {
    options_.metrics->LogSuppressed("annotation_unreadable", 1);
  }
  if (suppressed) {
    spdlog::warn("event=annotation_unreadable pod={} nodes={} first={} suppressed={}",
                 QuoteLogValue(pod, kMaxLogValueBytes), errors,
                 QuoteLogValue(first_error, kMaxLogValueBytes), *suppressed);
  }
  for (const auto& [event, n] : ended) {
    spdlog::warn("event=annotation_unreadable_suppressed suppressed={}", n);
  }
}

void Extender::NoteNodeNamesWithoutCache(std::string_view verb, size_t nodes) {
  if (options_.metrics) options_.metrics->NodeNamesWithoutCache(verb);
  // Once per process: the cause is the command line, not the request.
  if (node_names_without_cache_said_.exchange(true)) return;
  spdlog::warn(
      "event=node_names_without_cache verb={} nodes={} detail={}", verb, nodes,
      QuoteLogValue("kube-scheduler sent node names only (nodeCacheCapable: true) but this "
                    "extender has no node cache: every node gets no opinion (filter passes it, "
                    "prioritize scores it 0); give --kubeconfig or --in-cluster, or set "
                    "nodeCacheCapable: false"));
}

HttpAnswer Extender::Filter(const std::string& body) {
  StatusOr<ExtenderArgs> args = DecodeExtenderArgs(body);
  if (!args.ok()) return {400, EncodeError(args.status().message())};
  if (!args->nodes && args->node_names && options_.cache == nullptr) {
    NoteNodeNamesWithoutCache("filter", args->node_names ? args->node_names->size() : 0);
  }
  Assumptions* const assumptions = options_.assumptions;
  if (assumptions != nullptr) {
    // The pod before this one may still be binding: its devices count.
    assumptions->WaitForBinds(args->pod.uid);
    RememberPod(args->pod);
  }
  Nodes nodes = Collect(*args, topologies_, options_.cache, options_.metrics, assumptions);
  LogUnreadable(args->pod.name, nodes.unreadable, nodes.first_unreadable);
  const ScoreBudget budget(options_.request_budget, options_.clock, &stopping_);
  std::string_view spent;
  uint64_t unjudged = 0, passed = 0;
  FilterAnswer answer;
  if (args->nodes) answer.nodes.emplace();
  if (args->node_names || !args->nodes) answer.node_names.emplace();
  for (size_t i = 0; i < nodes.names.size(); ++i) {
    if (spent.empty()) spent = budget.Spent();
    // Out of time: the rest pass unjudged.
    Verdict v = spent.empty() ? scorer_.Filter(args->pod, nodes.devices[i]) : Verdict{};
    if (!spent.empty()) ++unjudged;
    switch (v.kind) {
      case Verdict::Kind::kPass:
        ++passed;
        if (answer.nodes) answer.nodes->push_back((*args->nodes)[i].raw);
        if (answer.node_names) answer.node_names->push_back(nodes.names[i]);
        break;
      case Verdict::Kind::kFailed:
        answer.failed[nodes.names[i]] = std::move(v.reason);
        break;
      case Verdict::Kind::kUnresolvable:
        answer.unresolvable[nodes.names[i]] = std::move(v.reason);
        break;
    }
  }
  if (options_.metrics) {
    options_.metrics->Nodes("filter", nodes.names.size());
    if (unjudged > 0) options_.metrics->Unscored("filter", spent, unjudged);
  }
  if (assumptions != nullptr && passed > 0 && !args->pod.resources.empty()) {
    assumptions->InCycle(args->pod.uid);
  }
  return {200, EncodeFilterAnswer(answer)};
}

HttpAnswer Extender::Prioritize(const std::string& body) {
  StatusOr<ExtenderArgs> args = DecodeExtenderArgs(body);
  if (!args.ok()) return {400, EncodeError(args.status().message())};
  if (!args->nodes && args->node_names && options_.cache == nullptr) {
    NoteNodeNamesWithoutCache("prioritize", args->node_names ? args->node_names->size() : 0);
  }
  Nodes nodes = Collect(*args, topologies_, options_.cache, options_.metrics, options_.assumptions);
  LogUnreadable(args->pod.name, nodes.unreadable, nodes.first_unreadable);
  const ScoreBudget budget(options_.request_budget, options_.clock, &stopping_);
  std::string_view spent;
  uint64_t unscored = 0, late = 0;
  Scorer::Stats counts;
  std::vector<double> raw(nodes.names.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (spent.empty()) spent = budget.Spent();
    if (!spent.empty()) {
      ++unscored;  // out of time: the rest score 0
      continue;
    }
    bool out_of_time = false;
    raw[i] = scorer_.Score(args->pod, nodes.devices[i], &counts, &budget, &out_of_time);
    if (out_of_time) ++late;
  }
  std::vector<int> scores = Scorer::ExtenderScores(raw);
  std::vector<std::pair<std::string, int>> list;
  list.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) list.emplace_back(std::move(nodes.names[i]), scores[i]);
  if (options_.metrics) {
    options_.metrics->Nodes("prioritize", raw.size());
    options_.metrics->Memo(counts.memo_hits, counts.memo_misses);
    if (unscored > 0) options_.metrics->Unscored("prioritize", spent, unscored);
    if (late > 0) options_.metrics->Unscored("prioritize", "node_budget", late);
  }
  return {200, EncodePriorityList(list)};
}

void Extender::RememberPod(const PodRequest& pod) {
  if (pod.uid.empty() || pod.resources.empty() || !pod.refused.empty()) return;
  BoundPod p{.uid = pod.uid,
             .namespace_name = pod.namespace_name,
             .name = pod.pod_name,
             .node = "",
             .requests = {}};
  for (const auto& [resource, n] : pod.resources) {
    if (n > 0) p.requests.emplace(resource, n);
  }
  MutexLock lock(&recent_mu_);
  auto [it, inserted] = recent_.insert_or_assign(pod.uid, std::move(p));
  if (!inserted) return;
  recent_order_.push_back(pod.uid);
  while (recent_order_.size() > kRecentPods) {
    recent_.erase(recent_order_.front());
    recent_order_.pop_front();
  }
}

HttpAnswer Extender::Bind(const std::string& body) {
  StatusOr<BindArgs> args = DecodeBindingArgs(body);
  if (!args.ok()) return {400, EncodeError(args.status().message())};
  if (!options_.bind) {
    return {200, EncodeBindingResult("kdm extender: binding needs --kubeconfig or --in-cluster")};
  }
  std::optional<BoundPod> pod;
  {
    MutexLock lock(&recent_mu_);
    auto it = recent_.find(args->pod_uid);
    if (it != recent_.end()) pod = it->second;
  }
  Assumptions* const assumptions = options_.assumptions;
  if (pod && assumptions != nullptr) {
    // Assumed before the binding is posted: the next pod's filter, which
    // may come while it is, already counts it.
    if (pod->namespace_name == args->pod_namespace && pod->name == args->pod_name) {
      pod->node = args->node;
      assumptions->Bound(*pod, Assumptions::Source::kBind);
    } else {
      pod.reset();
    }
  }
  Status s = options_.bind(*args);
  if (!s.ok()) {
    if (pod && assumptions != nullptr) assumptions->BindFailed(args->pod_uid);
    return {200, EncodeBindingResult("kdm extender: " + std::string(s.message()))};
  }
  return {200, EncodeBindingResult("")};
}

}  // namespace kdm::scheduler
