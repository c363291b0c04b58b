// The extender's decisions (docs/extender.md, "Scoring"): which nodes can
// run a pod (filter) and how well (prioritize), from each node's
// k8s::NodeDevices.
//
// - A pod's request per resource is its effective request
//   (k8s::EffectiveDeviceRequests, the rule the device manager's Ledger
//   applies). A pod the kubelet would refuse (a request != its limit, a
//   fractional or too large count) fails unresolvably on every node that
//   publishes one of its resources, with the rule's message.
// - Filter: a node whose requested resource has fewer free devices than the
//   request fails ("kdm: 1 nvidia.com/gpu free, pod needs 2"); a node whose
//   attributes fail a container's NVIDIA_REQUIRE_* fails unresolvably. A node
//   without the annotation, or without a requested resource in it, passes.
// - Score (0..100 per node): the mean over the requested resources that have
//   a topology of the policy's resource score; 0 when there is none.
//   best-set: topology::NodeScore. packed: BestPackedScore below. The default
//   is kDefaultScorePolicy (packed, topology::kDefaultPolicy).
// - ExtenderScores: the scheduler's 0..10, score x 10 / max (integer
//   division, on scores kept to 1/1000); all 0 when the max is 0.
//
// Scores are memoised per (topology, free set, size): nodes of one model
// share a topology, so a request over thousands of nodes computes each
// distinct case once.
//
// Time (ScoreBudget): a request has one budget for all its nodes. A node's
// searches together get at most NodeBudget() of it, min(1/20 of the budget,
// 50 ms, what is left), so a hostile node never costs more than that share.
// A best-set search that reaches its node's limit answers with the best set
// found (topology::NodeScore); a packed score whose packings do not all fit
// in it is no score: the node gets 0 and `out_of_time`. Nothing late is
// memoised.
//
// Thread-safety: Scorer's methods may be called from any thread.
#ifndef KDM_SCHEDULER_SCORER_H_
#define KDM_SCHEDULER_SCORER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kdm/base/clock.h"
#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/k8s/requirements.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/topology.h"

namespace kdm::scheduler {

enum class ScorePolicy { kBestSet, kPacked };

// The extender's ranking when none is named: topology's default policy, the
// one an unconfigured kdm plugin allocates with (first-fit is no ranking).
static_assert(topology::kDefaultPolicy != topology::Policy::kFirstFit);
inline constexpr ScorePolicy kDefaultScorePolicy =
    topology::kDefaultPolicy == topology::Policy::kPacked ? ScorePolicy::kPacked
                                                          : ScorePolicy::kBestSet;

// "best-set" or "packed"; INVALID_ARGUMENT naming the word otherwise.
StatusOr<ScorePolicy> ParseScorePolicy(std::string_view name);
std::string_view ScorePolicyName(ScorePolicy policy);

// The NVIDIA_REQUIRE_* of a container that requests some resources.
struct ContainerRequirements {
  std::string container;
  k8s::RequirementSet requirements;
  std::vector<std::string> resources;
};

struct PodRequest {
  std::string name;  // "namespace/name", for messages
  // metadata.uid, namespace and name ("" when the request has none).
  std::string uid;
  std::string namespace_name = "default";
  std::string pod_name;
  std::map<std::string, int64_t, std::less<>> resources;
  std::vector<ContainerRequirements> requirements;  // non-empty sets only
  // Set when the device request rules refuse the pod: why, and every
  // extended resource its containers name.
  std::string refused;
  std::set<std::string, std::less<>> refused_resources;
};

// A packed score of 0..100 for placing `size` devices on a node whose free
// devices are `available`: with V(S) the best total score of S split into
// pairs (kdm's packed objective with groups of 2), the pod's devices C are
// the `size`-subset of `available` that keeps V(available \ C) highest, and
// the score is 100 - (V(available) - V(available \ C)) x 100 / (size x
// kNodeScorePairUnit), clamped to 0..100. Exhaustive over the subsets when
// there are at most kMaxPackedSubsets of them; otherwise C is
// topology::Allocate's packed choice. Every search together ends by
// `deadline` (each gets at most kMaxSearchBudget): DEADLINE_EXCEEDED when
// the steady clock passes it before the last one is done. Other errors as
// topology::Allocate.
inline constexpr int64_t kMaxPackedSubsets = 4096;
inline constexpr std::chrono::milliseconds kMaxSearchBudget{50};
StatusOr<double> BestPackedScore(
    const topology::Topology& topology, const std::vector<int>& available, int size,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());

// The time one request may spend judging and scoring its nodes, from its
// construction; `stop` (may be null) ends it at once when set. Reads `clock`
// (null: the steady clock). Not thread-safe; one per request.
class ScoreBudget {
 public:
  // A node's share of the budget: at most 1/kNodeShare of it.
  static constexpr int kNodeShare = 20;

  ScoreBudget(Clock::Duration total, const Clock* clock = nullptr,
              const std::atomic<bool>* stop = nullptr);
  // "" while time is left; else why not: "stopping" or "request_budget".
  std::string_view Spent() const;
  // What the next node may take: min(total / kNodeShare, kMaxSearchBudget,
  // what is left), never below 0.
  Clock::Duration NodeBudget() const;

 private:
  Clock::TimePoint Now() const;
  const Clock* clock_;
  const std::atomic<bool>* stop_;
  const Clock::Duration node_cap_;
  const Clock::TimePoint deadline_;
};

struct Verdict {
  enum class Kind { kPass, kFailed, kUnresolvable };
  Kind kind = Kind::kPass;
  std::string reason;
};

class Scorer {
 public:
  struct Options {
    ScorePolicy policy = kDefaultScorePolicy;
    // Memo entries kept; the memo is emptied when full.
    size_t max_memo_entries = 1 << 20;
  };
  struct Stats {
    uint64_t memo_hits = 0;
    uint64_t memo_misses = 0;
  };

  explicit Scorer(Options options) : options_(options) {}

  // `node` null: the node has no (readable) annotation.
  Verdict Filter(const PodRequest& pod, const k8s::NodeDevices* node) const;
  // 0..100; 0 without an opinion. Adds this call's memo hits and misses to
  // `counts` when given. With a budget the node's searches take at most its
  // NodeBudget(); a packed score that does not fit is 0 and sets
  // `*out_of_time` (when given).
  double Score(const PodRequest& pod, const k8s::NodeDevices* node, Stats* counts = nullptr,
               const ScoreBudget* budget = nullptr, bool* out_of_time = nullptr);
  // The scheduler's 0..10 for each score.
  static std::vector<int> ExtenderScores(const std::vector<double>& scores);

  ScorePolicy policy() const { return options_.policy; }
  Stats stats() const;

 private:
  struct Key {
    uint64_t topology = 0;
    uint64_t free = 0;
    int size = 0;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t h = k.topology * 0x9E3779B97F4A7C15ull ^ k.free;
      h ^= static_cast<uint64_t>(k.size) << 56;
      return static_cast<size_t>(h * 0xBF58476D1CE4E5B9ull);
    }
  };
  double ResourceScore(const k8s::ResourceView& view, int size, Stats* counts,
                       std::chrono::steady_clock::time_point deadline, bool* out_of_time);

  const Options options_;
  mutable Mutex mu_;
  std::unordered_map<Key, double, KeyHash> memo_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_SCORER_H_
