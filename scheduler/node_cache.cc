#include "kdm/scheduler/node_cache.h"

#include <spdlog/spdlog.h>

#include <optional>
#include <utility>
#include <vector>

#include "kdm/base/log_value.h"

namespace kdm::scheduler {

std::shared_ptr<const CachedNode> NodeCache::Read(const kube::NodeObject& node) {
  auto out = std::make_shared<CachedNode>();
  out->name = node.name;
  Status s =
      node.annotations_error.empty() ? OkStatus() : InvalidArgumentError(node.annotations_error);
  auto a = node.annotations.find(k8s::kDevicesAnnotationKey);
  if (s.ok() && a != node.annotations.end()) {
    // The informer left room for the reader's padding: read in place.
    const std::string& text = a->second;
    StatusOr<k8s::NodeDevices> d =
        k8s::DecodeNodeDevices(text, topologies_, text.capacity() - text.size());
    {
      MutexLock lock(&mu_);
      ++annotation_decodes_;
    }
    if (d.ok()) {
      out->devices = std::move(*d);
    } else {
      s = d.status();
    }
  }
  if (!s.ok()) out->error = std::string(s.message());
  LogUnreadable(node.name, out->error);
  return out;
}

void NodeCache::LogUnreadable(const std::string& node, const std::string& error) {
  // One line per node per change, but a node whose annotation flaps gets a
  // few lines per window, then a count (the key: the name, cut; past
  // kMaxLogKeys names, the rest share one budget).
  const auto now = LogRateLimiter::Clock::now();
  std::optional<int64_t> suppressed;
  std::vector<std::pair<std::string, int64_t>> ended;
  {
    MutexLock lock(&log_mu_);
    if (!error.empty()) {
      suppressed = unreadable_log_.Admit(std::string_view(node).substr(0, k8s::kMaxNameBytes), now);
    }
    ended = unreadable_log_.Flush(now);
  }
  if (suppressed) {
    spdlog::warn("event=annotation_unreadable node={} error={} suppressed={}",
                 QuoteLogValue(node, kMaxLogValueBytes), QuoteLogValue(error, kMaxLogValueBytes),
                 *suppressed);
  }
  for (const auto& [key, n] : ended) {
    spdlog::warn("event=annotation_unreadable_suppressed node={} suppressed={}",
                 QuoteLogValue(key, kMaxLogValueBytes), n);
  }
}

void NodeCache::Replace(const std::vector<kube::NodeObject>& nodes) {
  NodeMap fresh;
  fresh.reserve(nodes.size());
  uint64_t errors = 0;
  for (const kube::NodeObject& n : nodes) {
    auto c = Read(n);
    if (!c->error.empty()) ++errors;
    fresh[n.name] = std::move(c);
  }
  MutexLock lock(&mu_);
  nodes_ = std::move(fresh);
  annotation_errors_ += errors;
  synced_ = true;
}

bool NodeCache::synced() const {
  MutexLock lock(&mu_);
  return synced_;
}

void NodeCache::Apply(kube::NodeEventType type, const kube::NodeObject& node) {
  if (type == kube::NodeEventType::kDeleted) {
    {
      MutexLock lock(&mu_);
      auto it = nodes_.find(node.name);
      if (it != nodes_.end()) nodes_.erase(it);
    }
    if (assumptions_ != nullptr) assumptions_->NodeGone(node.name);
    return;
  }
  auto c = Read(node);
  MutexLock lock(&mu_);
  if (!c->error.empty()) ++annotation_errors_;
  nodes_[node.name] = std::move(c);
}

std::shared_ptr<const CachedNode> NodeCache::Find(std::string_view name) const {
  MutexLock lock(&mu_);
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const CachedNode>> NodeCache::FindAll(
    const std::vector<std::string>& names) const {
  std::vector<std::shared_ptr<const CachedNode>> out(names.size());
  MutexLock lock(&mu_);
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = nodes_.find(std::string_view(names[i]));
    if (it != nodes_.end()) out[i] = it->second;
  }
  return out;
}

size_t NodeCache::size() const {
  MutexLock lock(&mu_);
  return nodes_.size();
}

uint64_t NodeCache::annotation_errors() const {
  MutexLock lock(&mu_);
  return annotation_errors_;
}

uint64_t NodeCache::annotation_decodes() const {
  MutexLock lock(&mu_);
  return annotation_decodes_;
}

Status NodeCache::Start(kube::Client* client, kube::NodeInformer::Options options) {
  if (informer_) return FailedPreconditionError("the node cache is already started");
  options.client = client;
  options.annotation_keys = {std::string(k8s::kDevicesAnnotationKey)};
  options.on_list = [this](std::vector<kube::NodeObject> nodes) { Replace(nodes); };
  options.on_event = [this](kube::NodeEventType t, const kube::NodeObject& n) { Apply(t, n); };
  KDM_ASSIGN_OR_RETURN(informer_, kube::NodeInformer::Start(std::move(options)));
  return OkStatus();
}

void NodeCache::Stop() {
  if (informer_) informer_->Stop();
}

std::optional<kube::NodeInformer::Stats> NodeCache::informer_stats() const {
  if (!informer_) return std::nullopt;
  return informer_->stats();
}

}  // namespace kdm::scheduler
