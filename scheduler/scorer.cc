#include "kdm/scheduler/scorer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kdm/topology/allocator.h"
#include "kdm/topology/node_score.h"

namespace kdm::scheduler {
namespace {

// What one search may take before `deadline`: 0..kMaxSearchBudget.
std::chrono::milliseconds SearchBudget(std::chrono::steady_clock::time_point deadline) {
  const auto now = std::chrono::steady_clock::now();
  if (deadline <= now) return std::chrono::milliseconds(0);
  if (deadline - now >= kMaxSearchBudget) return kMaxSearchBudget;
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
}

// V(S): the best total score of S split into pairs.
StatusOr<int64_t> PairPacking(const topology::Topology& t, const std::vector<int>& set,
                              std::chrono::steady_clock::time_point deadline) {
  if (set.size() < 2) return int64_t{0};
  KDM_ASSIGN_OR_RETURN(topology::Allocation a,
                       topology::Allocate(t, set, {}, 2, topology::Policy::kPacked,
                                          {.budget = SearchBudget(deadline)}));
  return a.packed_score;
}

Status PackedDeadlineExceeded(int64_t done, int64_t total) {
  return DeadlineExceededError("packed score: " + std::to_string(done) + " of " +
                               std::to_string(total) + " packings weighed before the deadline");
}

// n choose k, or limit + 1 when larger than limit.
int64_t Choose(int n, int k, int64_t limit) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  int64_t c = 1;
  for (int i = 1; i <= k; ++i) {
    c = c * (n - k + i) / i;
    if (c > limit) return limit + 1;
  }
  return c;
}

}  // namespace

StatusOr<ScorePolicy> ParseScorePolicy(std::string_view name) {
  if (name == "best-set") return ScorePolicy::kBestSet;
  if (name == "packed") return ScorePolicy::kPacked;
  return InvalidArgumentError("unknown policy '" + std::string(name) +
                              "' (expected best-set or packed)");
}

std::string_view ScorePolicyName(ScorePolicy policy) {
  return policy == ScorePolicy::kPacked ? "packed" : "best-set";
}

StatusOr<double> BestPackedScore(const topology::Topology& topology,
                                 const std::vector<int>& available, int size,
                                 std::chrono::steady_clock::time_point deadline) {
  if (size < 1) return InvalidArgumentError("size " + std::to_string(size) + " is below 1");
  const int m = static_cast<int>(available.size());
  if (size > m) {
    return ResourceExhaustedError("size " + std::to_string(size) + " is above the " +
                                  std::to_string(m) + " available devices");
  }
  auto late = [&] { return std::chrono::steady_clock::now() > deadline; };
  KDM_ASSIGN_OR_RETURN(int64_t whole, PairPacking(topology, available, deadline));
  int64_t kept = -1;
  const int64_t subsets = Choose(m, size, kMaxPackedSubsets);
  int64_t weighed = 0;
  if (late()) return PackedDeadlineExceeded(weighed, subsets);
  if (subsets <= kMaxPackedSubsets) {
    // Every size-subset C, as a selection mask over `available`.
    std::vector<char> pick(m, 0);
    std::fill(pick.end() - size, pick.end(), 1);
    std::vector<int> rest;
    do {
      rest.clear();
      for (int i = 0; i < m; ++i) {
        if (!pick[i]) rest.push_back(available[i]);
      }
      KDM_ASSIGN_OR_RETURN(int64_t v, PairPacking(topology, rest, deadline));
      kept = std::max(kept, v);
      ++weighed;
      if (late()) return PackedDeadlineExceeded(weighed, subsets);
    } while (std::next_permutation(pick.begin(), pick.end()));
  } else {
    KDM_ASSIGN_OR_RETURN(
        topology::Allocation a,
        topology::Allocate(topology, available, {}, size, topology::Policy::kPacked,
                           {.budget = SearchBudget(deadline)}));
    std::vector<int> rest;
    std::set_difference(available.begin(), available.end(), a.chosen.begin(), a.chosen.end(),
                        std::back_inserter(rest));
    KDM_ASSIGN_OR_RETURN(kept, PairPacking(topology, rest, deadline));
    if (late()) return PackedDeadlineExceeded(1, 1);
  }
  const double loss = static_cast<double>(whole - kept);
  const double score = 100.0 - loss * 100.0 / (size * double{topology::kNodeScorePairUnit});
  return std::clamp(score, 0.0, 100.0);
}

Verdict Scorer::Filter(const PodRequest& pod, const k8s::NodeDevices* node) const {
  if (node == nullptr) return {};
  if (!pod.refused.empty()) {
    for (const auto& [resource, view] : node->resources) {
      if (pod.refused_resources.count(resource)) {
        return {Verdict::Kind::kUnresolvable, "kdm: pod refused: " + pod.refused};
      }
    }
    return {};
  }
  for (const ContainerRequirements& c : pod.requirements) {
    for (const std::string& r : c.resources) {
      auto it = node->resources.find(r);
      if (it == node->resources.end()) continue;
      Status met = k8s::CheckRequirements(c.requirements, it->second.attributes);
      if (!met.ok()) {
        return {Verdict::Kind::kUnresolvable,
                "kdm: container " + c.container + ": " + std::string(met.message())};
      }
    }
  }
  for (const auto& [r, n] : pod.resources) {
    auto it = node->resources.find(r);
    if (it == node->resources.end()) continue;
    const int64_t free = static_cast<int64_t>(it->second.available.size());
    if (free < n) {
      return {Verdict::Kind::kFailed,
              "kdm: " + std::to_string(free) + " " + r + " free, pod needs " + std::to_string(n)};
    }
  }
  return {};
}

ScoreBudget::ScoreBudget(Clock::Duration total, const Clock* clock, const std::atomic<bool>* stop)
    : clock_(clock),
      stop_(stop),
      node_cap_(std::min<Clock::Duration>(total / kNodeShare, kMaxSearchBudget)),
      deadline_(Now() + total) {}

Clock::TimePoint ScoreBudget::Now() const {
  return clock_ ? clock_->Now() : std::chrono::steady_clock::now();
}

std::string_view ScoreBudget::Spent() const {
  if (stop_ && stop_->load()) return "stopping";
  if (Now() >= deadline_) return "request_budget";
  return "";
}

Clock::Duration ScoreBudget::NodeBudget() const {
  const Clock::Duration left = deadline_ - Now();
  return std::clamp(left, Clock::Duration::zero(), node_cap_);
}

double Scorer::ResourceScore(const k8s::ResourceView& view, int size, Stats* counts,
                             std::chrono::steady_clock::time_point deadline, bool* out_of_time) {
  const topology::Topology& t = view.topology->topology;
  const bool memo = view.topology->id != 0 && t.size() <= 64;
  Key key;
  if (memo) {
    key.topology = view.topology->id;
    for (int i : view.available) key.free |= uint64_t{1} << i;
    key.size = size;
    MutexLock lock(&mu_);
    auto it = memo_.find(key);
    if (it != memo_.end()) {
      ++stats_.memo_hits;
      if (counts) ++counts->memo_hits;
      return it->second;
    }
    ++stats_.memo_misses;
    if (counts) ++counts->memo_misses;
  }
  StatusOr<double> s = options_.policy == ScorePolicy::kPacked
                           ? BestPackedScore(t, view.available, size, deadline)
                           : topology::NodeScore(t, view.available, size, SearchBudget(deadline));
  if (s.status().code() == StatusCode::kDeadlineExceeded) {
    *out_of_time = true;
    return 0;
  }
  double score = s.ok() ? *s : 0.0;
  if (memo) {
    MutexLock lock(&mu_);
    if (memo_.size() >= options_.max_memo_entries) memo_.clear();
    memo_.emplace(key, score);
  }
  return score;
}

double Scorer::Score(const PodRequest& pod, const k8s::NodeDevices* node, Stats* counts,
                     const ScoreBudget* budget, bool* out_of_time) {
  if (node == nullptr) return 0;
  // One deadline for every search of this node.
  const auto deadline = budget ? std::chrono::steady_clock::now() + budget->NodeBudget()
                               : std::chrono::steady_clock::time_point::max();
  bool late = false;
  double sum = 0;
  int counted = 0;
  for (const auto& [r, n] : pod.resources) {
    auto it = node->resources.find(r);
    if (it == node->resources.end() || it->second.topology == nullptr) continue;
    ++counted;
    if (static_cast<int64_t>(it->second.available.size()) < n || n > topology::kMaxDevices) {
      continue;
    }
    sum += ResourceScore(it->second, static_cast<int>(n), counts, deadline, &late);
    if (late) {
      if (out_of_time) *out_of_time = true;
      return 0;
    }
  }
  return counted == 0 ? 0.0 : sum / counted;
}

std::vector<int> Scorer::ExtenderScores(const std::vector<double>& scores) {
  std::vector<int64_t> milli(scores.size());
  int64_t max = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    milli[i] = std::llround(std::clamp(scores[i], 0.0, 100.0) * 1000);
    max = std::max(max, milli[i]);
  }
  std::vector<int> out(scores.size(), 0);
  if (max == 0) return out;
  for (size_t i = 0; i < scores.size(); ++i) out[i] = static_cast<int>(milli[i] * 10 / max);
  return out;
}

Scorer::Stats Scorer::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kdm::scheduler
