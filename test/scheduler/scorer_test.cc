// The scheduler core: filter verdicts, best-set and packed scores against
// brute force, the packed property, and the 0..10 conversion. (Effective
// requests and the annotation reader are k8s/'s: test/k8s.)
#include "kdm/scheduler/scorer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/scheduler/extender.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/node_score.h"
#include "kdm/topology/presets.h"
#include "scheduler_test_util.h"

namespace kdm::scheduler {
namespace {

using test::kGpu;
using test::MakeAnnotation;
using ::testing::HasSubstr;

PodRequest Pod(int gpus, std::vector<ContainerRequirements> reqs = {}) {
  PodRequest p;
  p.name = "ml/train";
  p.resources[kGpu] = gpus;
  p.requirements = std::move(reqs);
  return p;
}

TEST(ScorerFilter, FailsTooFewFreeAndUnmetRequirementsPassesUnknown) {
  auto t = *topology::Preset("dgx1-v100");
  k8s::TopologyCache cache;
  auto node = *k8s::DecodeNodeDevices(
      MakeAnnotation("n", t, {2}, k8s::DeviceAttributes{.cuda = "11.8"}), &cache);
  Scorer scorer({.policy = ScorePolicy::kBestSet});
  Verdict v = scorer.Filter(Pod(2), &node);
  EXPECT_EQ(v.kind, Verdict::Kind::kFailed);
  EXPECT_EQ(v.reason, "kdm: 1 nvidia.com/gpu free, pod needs 2");
  EXPECT_EQ(scorer.Filter(Pod(1), &node).kind, Verdict::Kind::kPass);
  EXPECT_EQ(scorer.Filter(Pod(2), nullptr).kind, Verdict::Kind::kPass);
  PodRequest other;
  other.resources["example.com/fpga"] = 4;
  EXPECT_EQ(scorer.Filter(other, &node).kind, Verdict::Kind::kPass);

  auto set = k8s::ParseRequirementEnv({{"NVIDIA_REQUIRE_CUDA", "cuda>=12.2"}});
  ASSERT_TRUE(set.ok());
  Verdict u = scorer.Filter(Pod(1, {{"main", *set, {kGpu}}}), &node);
  EXPECT_EQ(u.kind, Verdict::Kind::kUnresolvable);
  EXPECT_THAT(u.reason, HasSubstr("cuda 11.8 does not satisfy cuda>=12.2"));
  EXPECT_THAT(u.reason, HasSubstr("kdm: container main"));
}

// A random symmetric topology of n devices.
topology::Topology RandomTopology(int n, std::mt19937& rng) {
  std::vector<topology::DeviceInfo> devices;
  for (int i = 0; i < n; ++i) devices.push_back({"D" + std::to_string(i), i, i % 2});
  std::vector<std::vector<topology::Link>> links(n, std::vector<topology::Link>(n));
  std::uniform_int_distribution<int> nv(0, 4), pcie(0, 6);
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      topology::Link l{nv(rng) == 4 ? nv(rng) * 2 : 0, static_cast<topology::PcieLink>(pcie(rng))};
      links[i][j] = links[j][i] = l;
    }
  }
  return *topology::Topology::Create(devices, links);
}

// Every k-subset of `set`, as index lists.
void ForEachSubset(const std::vector<int>& set, int k,
                   const std::function<void(const std::vector<int>&)>& f) {
  std::vector<int> pick;
  std::function<void(size_t)> rec = [&](size_t i) {
    if (static_cast<int>(pick.size()) == k) return f(pick);
    if (i == set.size()) return;
    pick.push_back(set[i]);
    rec(i + 1);
    pick.pop_back();
    rec(i + 1);
  };
  rec(0);
}

// Best pairing of `set` (brute force).
int64_t BrutePairs(const topology::Topology& t, std::vector<int> set) {
  if (set.size() < 2) return 0;
  int64_t best = 0;
  const int a = set[0];
  std::vector<int> rest(set.begin() + 1, set.end());
  if (set.size() % 2 == 1) best = BrutePairs(t, rest);  // a is the one left over
  for (size_t j = 0; j < rest.size(); ++j) {
    std::vector<int> r2 = rest;
    r2.erase(r2.begin() + j);
    best = std::max(best, t.PairScore(a, rest[j]) + BrutePairs(t, r2));
  }
  return best;
}

TEST(ScorerScore, BestSetAndPackedMatchBruteForceOnSmallNodes) {
  std::mt19937 rng(20);
  for (int round = 0; round < 60; ++round) {
    const int n = 2 + round % 6;
    topology::Topology t = RandomTopology(n, rng);
    std::vector<int> avail;
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 != 0) avail.push_back(i);
    }
    if (avail.empty()) avail.push_back(0);
    const int k = 1 + static_cast<int>(rng() % avail.size());
    // best-set: the best k-subset's score, normalised as the KEP does.
    int64_t best = 0;
    ForEachSubset(avail, k,
                  [&](const std::vector<int>& s) { best = std::max(best, t.SetScore(s)); });
    const double pairs = k * (k - 1) / 2.0;
    const double expect_best = k == 1 ? 100.0 : std::min(100.0, best * 100.0 / (pairs * 1800));
    auto got = topology::NodeScore(t, avail, k);
    ASSERT_TRUE(got.ok());
    EXPECT_NEAR(*got, expect_best, 1e-9) << "round " << round;
    // packed: the subset that keeps the best pairing of the rest.
    int64_t kept = -1;
    ForEachSubset(avail, k, [&](const std::vector<int>& s) {
      std::vector<int> rest;
      std::set_difference(avail.begin(), avail.end(), s.begin(), s.end(), std::back_inserter(rest));
      kept = std::max(kept, BrutePairs(t, rest));
    });
    const double loss = static_cast<double>(BrutePairs(t, avail) - kept);
    const double expect_packed = std::clamp(100.0 - loss * 100.0 / (k * 1800.0), 0.0, 100.0);
    auto packed = BestPackedScore(t, avail, k);
    ASSERT_TRUE(packed.ok());
    EXPECT_NEAR(*packed, expect_packed, 1e-9) << "round " << round;

    // Through the Scorer (memo included), twice.
    k8s::TopologyCache cache;
    std::string a = MakeAnnotation("n", t, avail);
    auto node = k8s::DecodeNodeDevices(a, &cache);
    ASSERT_TRUE(node.ok()) << node.status().message();
    Scorer best_set({.policy = ScorePolicy::kBestSet});
    Scorer packed_scorer({.policy = ScorePolicy::kPacked});
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(best_set.Score(Pod(k), &*node), expect_best, 1e-9);
      EXPECT_NEAR(packed_scorer.Score(Pod(k), &*node), expect_packed, 1e-9);
    }
    EXPECT_EQ(best_set.stats().memo_hits, 1u);
    EXPECT_EQ(best_set.stats().memo_misses, 1u);
  }
}

TEST(ScorerScore, PackedFillsBrokenPairsBeforeSplittingWholeNvlinkPairs) {
  // dgx-a100-like pairs are clearest on hgx-h100? Use a 4-GPU board of two
  // NV pairs: (0,1) and (2,3), PCIe SYS across.
  std::vector<topology::DeviceInfo> devices;
  for (int i = 0; i < 4; ++i) devices.push_back({"G" + std::to_string(i), i, i / 2});
  std::vector<std::vector<topology::Link>> links(4, std::vector<topology::Link>(4));
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      if (i == j) continue;
      links[i][j] = (i / 2 == j / 2) ? topology::Link{4, topology::PcieLink::kPix}
                                     : topology::Link{0, topology::PcieLink::kSys};
    }
  }
  auto t = *topology::Topology::Create(devices, links);
  k8s::TopologyCache cache;
  // broken: GPU 0's partner is in use; GPUs 2, 3 a whole pair.
  auto broken = *k8s::DecodeNodeDevices(MakeAnnotation("broken", t, {0, 2, 3}), &cache);
  // whole: only the whole pair (2, 3) is free.
  auto whole = *k8s::DecodeNodeDevices(MakeAnnotation("whole", t, {2, 3}), &cache);
  // empty: everything free.
  auto empty = *k8s::DecodeNodeDevices(MakeAnnotation("empty", t, {0, 1, 2, 3}), &cache);
  Scorer packed({.policy = ScorePolicy::kPacked});
  const double b = packed.Score(Pod(1), &broken);
  const double w = packed.Score(Pod(1), &whole);
  const double e = packed.Score(Pod(1), &empty);
  EXPECT_EQ(b, 100.0);  // the lone GPU 0 is used: no pair is split
  EXPECT_LT(w, b);
  EXPECT_LT(e, b);
  auto s = Scorer::ExtenderScores({b, w, e});
  EXPECT_EQ(s[0], 10);
  EXPECT_LT(s[1], 10);
  EXPECT_LT(s[2], 10);
  // best-set cannot tell them apart for one GPU.
  Scorer best({.policy = ScorePolicy::kBestSet});
  EXPECT_EQ(best.Score(Pod(1), &broken), best.Score(Pod(1), &whole));
}

TEST(ScorerScore, NoTopologyOrNoResourceScoresZero) {
  auto t = *topology::Preset("dgx1-v100");
  k8s::TopologyCache cache;
  auto counts = *k8s::DecodeNodeDevices(MakeAnnotation("n", t, {0, 1}, {}, false), &cache);
  Scorer scorer({.policy = ScorePolicy::kBestSet});
  EXPECT_EQ(scorer.Score(Pod(2), &counts), 0.0);
  EXPECT_EQ(scorer.Score(Pod(2), nullptr), 0.0);
  auto full = *k8s::DecodeNodeDevices(MakeAnnotation("n", t, {0, 1}), &cache);
  EXPECT_EQ(scorer.Score(Pod(3), &full), 0.0);  // too few free
  EXPECT_GT(scorer.Score(Pod(2), &full), 0.0);
}

TEST(ExtenderScores, ScalesToTenByTheMaxWithIntegerDivision) {
  EXPECT_EQ(Scorer::ExtenderScores({50, 100, 0, 33.3}), (std::vector<int>{5, 10, 0, 3}));
  EXPECT_EQ(Scorer::ExtenderScores({13.9, 6.95}), (std::vector<int>{10, 5}));
  EXPECT_EQ(Scorer::ExtenderScores({0, 0}), (std::vector<int>{0, 0}));
  EXPECT_TRUE(Scorer::ExtenderScores({}).empty());
}

TEST(ScorePolicy, ParsesItsNames) {
  EXPECT_EQ(*ParseScorePolicy("packed"), ScorePolicy::kPacked);
  EXPECT_EQ(*ParseScorePolicy("best-set"), ScorePolicy::kBestSet);
  auto bad = ParseScorePolicy("first-fit");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'first-fit'"));
}

// Issue 30: the extender's ranking by default is topology's default policy,
// the one kdm plugin allocates with and the extender assumes for a node that
// publishes none, so a scheduler and a node agree on what "best" is.
TEST(ScorerDefaults, TheDefaultPolicyIsTopologysDefaultPacked) {
  EXPECT_EQ(kDefaultScorePolicy, ScorePolicy::kPacked);
  EXPECT_EQ(ScorePolicyName(kDefaultScorePolicy), topology::PolicyName(topology::kDefaultPolicy));
  EXPECT_EQ(Scorer::Options{}.policy, kDefaultScorePolicy);
  EXPECT_EQ(Extender::Options{}.policy, kDefaultScorePolicy);
  EXPECT_EQ(Scorer({}).policy(), ScorePolicy::kPacked);
}

}  // namespace
}  // namespace kdm::scheduler
