#include "kdm/scheduler/assumptions.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "kdm/base/log_value.h"
#include "kdm/topology/allocator.h"

namespace kdm::scheduler {
namespace {

constexpr std::string_view kReflected = "reflected";
constexpr std::string_view kDeleted = "deleted";
constexpr std::string_view kExpired = "expired";
constexpr std::string_view kNodeDeleted = "node_deleted";
constexpr std::string_view kBindFailed = "bind_failed";

}  // namespace

std::vector<int> PredictDevices(const k8s::ResourceView& view, const std::vector<int>& free,
                                int64_t count) {
  if (count <= 0) return {};
  if (static_cast<int64_t>(free.size()) <= count) return free;
  const int size = static_cast<int>(count);
  if (view.topology) {
    const topology::Policy policy = view.policy.value_or(topology::kDefaultPolicy);
    StatusOr<topology::Allocation> a =
        topology::Allocate(view.topology->topology, free, {}, size, policy);
    if (a.ok()) return std::move(a->chosen);
  }
  return std::vector<int>(free.begin(), free.begin() + size);
}

Assumptions::Assumptions(Options options) : options_(options) {}

Clock::TimePoint Assumptions::Now() const {
  return options_.clock ? options_.clock->Now() : std::chrono::steady_clock::now();
}

void Assumptions::Count(std::string_view reason) {
  if (reason == kReflected) ++stats_.reflected;
  if (reason == kDeleted) ++stats_.deleted;
  if (reason == kExpired) ++stats_.expired;
  if (reason == kNodeDeleted) ++stats_.node_deleted;
  if (reason == kBindFailed) ++stats_.bind_failed;
  if (options_.metrics) options_.metrics->AssumptionEnded(reason);
}

void Assumptions::EndLocked(Entry& e, std::string_view reason) {
  if (e.state != State::kAssumed) return;
  e.state = State::kEnded;
  --stats_.assumed;
  auto n = nodes_.find(std::string_view(e.pod.node));
  if (n != nodes_.end()) {
    n->second.assumed.erase(e.order);
    ++n->second.generation;
    if (n->second.assumed.empty()) {
      nodes_.erase(n);
      names_index_stale_ = true;
    }
  }
  Count(reason);
  if (options_.metrics) options_.metrics->AssumedPods(stats_.assumed);
  spdlog::debug("event=assumption_ended pod={} node={} reason={}",
                QuoteLogValue(e.pod.namespace_name + "/" + e.pod.name, 256),
                QuoteLogValue(e.pod.node, 256), reason);
}

void Assumptions::EraseLocked(std::string_view uid, std::string_view reason) {
  if (in_cycle_.erase(std::string(uid)) > 0) binds_changed_.SignalAll();
  auto it = pods_.find(std::string(uid));
  if (it == pods_.end()) return;
  EndLocked(it->second, reason);
  pods_.erase(it);
}

void Assumptions::SweepLocked(Clock::TimePoint now) {
  while (!deadlines_.empty() && deadlines_.front().at <= now) {
    Deadline d = std::move(deadlines_.front());
    deadlines_.pop_front();
    auto it = pods_.find(d.uid);
    if (it == pods_.end() || it->second.seq != d.seq) continue;
    Entry& e = it->second;
    if (e.state == State::kAssumed) {
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - e.since).count();
      expired_lines_.push_back(
          "pod=" + QuoteLogValue(e.pod.namespace_name + "/" + e.pod.name, 256) +
          " node=" + QuoteLogValue(e.pod.node, 256) + " waited_ms=" + std::to_string(waited));
      EndLocked(e, kExpired);
    }
    // A pod only /bind told of is forgotten; one the informer reports is
    // remembered until it is gone, so its next status change is no new
    // assumption.
    if (!e.from_watch) pods_.erase(it);
  }
}

void Assumptions::FlushLogs() {
  std::vector<std::string> lines;
  {
    MutexLock lock(&mu_);
    lines.swap(expired_lines_);
  }
  const auto now = LogRateLimiter::Clock::now();
  MutexLock lock(&log_mu_);
  for (const std::string& line : lines) {
    if (std::optional<int64_t> suppressed = expiry_log_.Admit("assumption_expired", now)) {
      spdlog::warn("event=assumption_expired {} suppressed={}", line, *suppressed);
    } else if (options_.metrics) {
      options_.metrics->LogSuppressed("assumption_expired", 1);
    }
  }
  for (const auto& [event, n] : expiry_log_.Flush(now)) {
    spdlog::warn("event=assumption_expired_suppressed suppressed={}", n);
  }
}

void Assumptions::Sweep() {
  {
    MutexLock lock(&mu_);
    SweepLocked(Now());
  }
  FlushLogs();
}

void Assumptions::BoundLocked(const BoundPod& pod, Source source, Clock::TimePoint now) {
  auto it = pods_.find(pod.uid);
  if (it != pods_.end()) {
    Entry& e = it->second;
    if (e.pod.node == pod.node) {  // known: assumed, or ended
      if (source == Source::kWatch && !e.from_watch && e.state == State::kAssumed) {
        // First told by /bind, whose calls may overlap: its place among the
        // node's pods is where the API server recorded it, the watch's order
        // (the order the kubelet admits in).
        auto n = nodes_.find(std::string_view(e.pod.node));
        if (n != nodes_.end()) {
          n->second.assumed.erase(e.order);
          e.order = next_seq_++;
          n->second.assumed.emplace(e.order, e.pod.uid);
          ++n->second.generation;
        }
      }
      if (source == Source::kWatch) e.from_watch = true;
      return;
    }
    // Bound elsewhere than first told (a bind that failed and a new one).
    EndLocked(e, kBindFailed);
    pods_.erase(it);
  }
  if (in_cycle_.erase(pod.uid) > 0) binds_changed_.SignalAll();
  if (!enabled() || pod.requests.empty()) return;
  Entry e;
  e.pod = pod;
  e.fingerprint = k8s::PodFingerprint(pod.namespace_name, pod.name);
  e.seq = next_seq_++;
  e.order = e.seq;
  e.from_watch = source == Source::kWatch;
  e.since = now;
  auto [slot, added] = nodes_.try_emplace(pod.node);
  if (added) names_index_stale_ = true;
  NodeState& n = slot->second;
  n.assumed.emplace(e.order, pod.uid);
  ++n.generation;
  deadlines_.push_back({now + options_.timeout, pod.uid, e.seq});
  pods_.emplace(pod.uid, std::move(e));
  ++stats_.assumed;
  ++(source == Source::kWatch ? stats_.started_watch : stats_.started_bind);
  spdlog::debug("event=assumption_started pod={} node={} source={}",
                QuoteLogValue(pod.namespace_name + "/" + pod.name, 256),
                QuoteLogValue(pod.node, 256), source == Source::kWatch ? "watch" : "bind");
  if (options_.metrics) {
    options_.metrics->AssumptionStarted(source == Source::kWatch ? "watch" : "bind");
    options_.metrics->AssumedPods(stats_.assumed);
  }
}

void Assumptions::Bound(const BoundPod& pod, Source source) {
  {
    MutexLock lock(&mu_);
    const auto now = Now();
    SweepLocked(now);
    BoundLocked(pod, source, now);
  }
  FlushLogs();
}

void Assumptions::Gone(std::string_view uid) {
  {
    MutexLock lock(&mu_);
    SweepLocked(Now());
    EraseLocked(uid, kDeleted);
  }
  FlushLogs();
}

void Assumptions::BindFailed(std::string_view uid) {
  MutexLock lock(&mu_);
  EraseLocked(uid, kBindFailed);
}

void Assumptions::ReplaceBound(const std::vector<BoundPod>& pods) {
  {
    MutexLock lock(&mu_);
    const auto now = Now();
    SweepLocked(now);
    std::unordered_map<std::string, const BoundPod*> listed;
    listed.reserve(pods.size());
    for (const BoundPod& p : pods) listed.emplace(p.uid, &p);
    std::vector<std::string> gone;
    for (const auto& [uid, e] : pods_) {
      if (e.from_watch && listed.count(uid) == 0) gone.push_back(uid);
    }
    for (const std::string& uid : gone) EraseLocked(uid, kDeleted);
    for (const BoundPod& p : pods) BoundLocked(p, Source::kWatch, now);
  }
  FlushLogs();
}

void Assumptions::NodeGone(std::string_view node) {
  MutexLock lock(&mu_);
  auto n = nodes_.find(node);
  if (n == nodes_.end()) return;
  std::vector<std::string> uids;
  for (const auto& [seq, uid] : n->second.assumed) uids.push_back(uid);
  for (const std::string& uid : uids) {
    auto it = pods_.find(uid);
    if (it != pods_.end()) EndLocked(it->second, kNodeDeleted);
  }
}

template <typename Owner>
std::shared_ptr<const k8s::NodeDevices> Assumptions::ViewLocked(std::string_view node,
                                                                NodeState* found,
                                                                const k8s::NodeDevices& base,
                                                                const Owner* owner) {
  if (found == nullptr) return nullptr;
  // Pods the annotation already shows end here: counted once, by it.
  if (base.pods) {
    std::vector<std::string> reflected;
    for (const auto& [seq, uid] : found->assumed) {
      const Entry& e = pods_.at(uid);
      if (std::binary_search(base.pods->begin(), base.pods->end(), e.fingerprint)) {
        reflected.push_back(uid);
      }
    }
    if (!reflected.empty()) {
      for (const std::string& uid : reflected) EndLocked(pods_.at(uid), kReflected);
      auto n = nodes_.find(node);
      if (n == nodes_.end()) return nullptr;
      found = &n->second;
    }
  }
  NodeState& state = *found;
  const void* const owner_id = owner != nullptr ? static_cast<const void*>(owner->get()) : nullptr;
  if (owner_id != nullptr && state.memo.owner.get() == owner_id &&
      state.memo.generation == state.generation) {
    return state.memo.view;
  }
  auto view = std::make_shared<k8s::NodeDevices>(base);
  for (auto& [resource, r] : view->resources) {
    std::vector<int> free = r.available;
    for (const auto& [seq, uid] : state.assumed) {
      const Entry& e = pods_.at(uid);
      auto want = e.pod.requests.find(resource);
      if (want == e.pod.requests.end() || free.empty()) continue;
      std::vector<int> take = PredictDevices(r, free, want->second);
      std::vector<int> left;
      left.reserve(free.size());
      std::set_difference(free.begin(), free.end(), take.begin(), take.end(),
                          std::back_inserter(left));
      free = std::move(left);
    }
    r.available = std::move(free);
  }
  ++stats_.views_computed;
  std::shared_ptr<const k8s::NodeDevices> out = std::move(view);
  if (owner_id != nullptr) state.memo = NodeMemo{*owner, state.generation, out};
  return out;
}

std::shared_ptr<const k8s::NodeDevices> Assumptions::View(
    std::string_view node, const k8s::NodeDevices& base, const std::shared_ptr<const void>& owner) {
  if (!enabled()) return nullptr;
  MutexLock lock(&mu_);
  SweepLocked(Now());
  auto n = nodes_.find(node);
  return ViewLocked(node, n == nodes_.end() ? nullptr : &n->second, base, &owner);
}

std::vector<std::shared_ptr<const k8s::NodeDevices>> Assumptions::Views(
    const std::vector<std::string>& names, const std::vector<const k8s::NodeDevices*>& bases,
    const std::vector<std::shared_ptr<const CachedNode>>* owners) {
  std::vector<std::shared_ptr<const k8s::NodeDevices>> out(names.size());
  if (!enabled()) return out;
  MutexLock lock(&mu_);
  SweepLocked(Now());
  if (nodes_.empty()) return out;  // nothing assumed: every view is its base
  for (size_t i = 0; i < names.size(); ++i) {
    if (bases[i] == nullptr) continue;
    NodeState* state = FindNodeLocked(names[i]);
    if (state == nullptr) continue;
    // A reflected pod may end the node's last assumption and erase it: the
    // index is rebuilt before the next lookup.
    if (owners != nullptr) {
      out[i] = ViewLocked(names[i], state, *bases[i], &(*owners)[i]);
    } else {
      out[i] = ViewLocked(names[i], state, *bases[i],
                          static_cast<std::shared_ptr<const void>*>(nullptr));
    }
  }
  return out;
}

namespace {
uint64_t NameHashOf(std::string_view s) {
  return static_cast<uint64_t>(std::hash<std::string_view>{}(s)) | 1;  // never 0: an empty slot
}
}  // namespace

Assumptions::NodeState* Assumptions::FindNodeLocked(std::string_view node) {
  if (names_index_stale_) {
    size_t slots = 16;
    while (slots < 2 * nodes_.size()) slots *= 2;
    names_index_.assign(slots, 0);
    names_entries_.assign(slots, {nullptr, nullptr});
    for (auto& [name, state] : nodes_) {
      const uint64_t h = NameHashOf(name);
      size_t i = h & (slots - 1);
      while (names_index_[i] != 0) i = (i + 1) & (slots - 1);
      names_index_[i] = h;
      names_entries_[i] = {&name, &state};
    }
    names_index_stale_ = false;
  }
  const uint64_t h = NameHashOf(node);
  const size_t mask = names_index_.size() - 1;
  for (size_t i = h & mask; names_index_[i] != 0; i = (i + 1) & mask) {
    if (names_index_[i] == h && *names_entries_[i].first == node) return names_entries_[i].second;
  }
  return nullptr;
}

void Assumptions::InCycle(std::string_view uid) {
  if (!enabled() || options_.bind_wait.count() <= 0 || uid.empty()) return;
  MutexLock lock(&mu_);
  auto known = pods_.find(std::string(uid));
  if (known != pods_.end()) return;  // already bound
  in_cycle_[std::string(uid)] = std::chrono::steady_clock::now() + options_.bind_wait;
}

uint64_t Assumptions::WaitForBinds(std::string_view uid) {
  if (!enabled() || options_.bind_wait.count() <= 0) return 0;
  uint64_t gave_up = 0;
  const auto start = std::chrono::steady_clock::now();
  bool waited = false;
  MutexLock lock(&mu_);
  in_cycle_.erase(std::string(uid));
  while (!in_cycle_.empty()) {
    const auto now = std::chrono::steady_clock::now();
    auto first = in_cycle_.begin();
    for (auto it = in_cycle_.begin(); it != in_cycle_.end(); ++it) {
      if (it->second < first->second) first = it;
    }
    if (first->second <= now) {
      in_cycle_.erase(first);
      ++gave_up;
      continue;
    }
    waited = true;
    binds_changed_.WaitWithTimeout(&mu_, absl::FromChrono(first->second - now));
  }
  if (waited && options_.metrics) {
    options_.metrics->BindWait(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), gave_up);
  }
  return gave_up;
}

Assumptions::Stats Assumptions::stats() const {
  MutexLock lock(&mu_);
  Stats s = stats_;
  s.known = pods_.size() + in_cycle_.size();
  return s;
}

}  // namespace kdm::scheduler
