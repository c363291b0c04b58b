// The scheduler core: effective requests, reading annotations, filter
// verdicts, best-set and packed scores against brute force, the packed
// property, and the 0..10 conversion.
#include "kdm/scheduler/scorer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "kdm/scheduler/node_devices.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/node_score.h"
#include "kdm/topology/presets.h"
#include "scheduler_test_util.h"

namespace kdm::scheduler {
namespace {

using test::kGpu;
using test::MakeAnnotation;
using ::testing::HasSubstr;

TEST(EffectiveRequest, SumsAppContainersAndSidecarsAndTakesTheInitPeak) {
  std::vector<ContainerAmounts> init = {
      {.amounts = {{kGpu, 1}}, .sidecar = true},   // a sidecar: runs with everything after
      {.amounts = {{kGpu, 6}}, .sidecar = false},  // plain init: 6 + the sidecar's 1
      {.amounts = {{"example.com/fpga", 3}}, .sidecar = false},
  };
  std::vector<ContainerAmounts> app = {{.amounts = {{kGpu, 2}}}, {.amounts = {{kGpu, 1}}}};
  auto r = EffectiveRequest(init, app);
  EXPECT_EQ(r.at(kGpu), 7);  // max(1 + 2 + 1, 6 + 1)
  EXPECT_EQ(r.at("example.com/fpga"), 3);
  app[0].amounts[kGpu] = 8;
  EXPECT_EQ(EffectiveRequest(init, app).at(kGpu), 10);  // 1 + 8 + 1
  EXPECT_TRUE(EffectiveRequest({}, {{.amounts = {{kGpu, 0}}}}).empty());
}

TEST(ReadNodeDevices, ReadsFreePositionsTopologyAndAttributes) {
  auto t = *topology::Preset("dgx1-v100");
  TopologyCache cache;
  auto d = ReadNodeDevices(
      MakeAnnotation("n1", t, {1, 3, 6}, kube::DeviceAttributes{.cuda = "12.4"}), &cache);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const ResourceView& v = d->resources.at(kGpu);
  EXPECT_EQ(v.device_count, 8);
  EXPECT_EQ(v.available, (std::vector<int>{1, 3, 6}));
  ASSERT_NE(v.topology, nullptr);
  EXPECT_EQ(v.topology->topology.PairScore(0, 3), t.PairScore(0, 3));
  EXPECT_EQ(v.attributes.at("cuda"), "12.4");
  // A second node with the same matrix shares the topology.
  auto d2 = ReadNodeDevices(MakeAnnotation("n2", t, {0}), &cache);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->resources.at(kGpu).topology.get(), v.topology.get());
  EXPECT_EQ(cache.size(), 1u);
  // Without a matrix: counts only.
  auto d3 = ReadNodeDevices(MakeAnnotation("n3", t, {0, 1}, {}, false), &cache);
  ASSERT_TRUE(d3.ok());
  EXPECT_EQ(d3->resources.at(kGpu).topology, nullptr);
  EXPECT_EQ(d3->resources.at(kGpu).available.size(), 2u);
}

TEST(ReadNodeDevices, RefusesBadAnnotationsNamingTheField) {
  auto t = *topology::Preset("dgx1-v100");
  const std::string good = MakeAnnotation("n1", t, {1, 3});
  TopologyCache cache;
  struct Case {
    std::string text;
    std::string expect;
  };
  std::string bad_matrix = good;
  bad_matrix.replace(bad_matrix.find("\"matrix\":[[\"X\""), 14, "\"matrix\":[[\"Q\"");
  std::vector<Case> cases = {
      {"", "not JSON"},
      {"garbage", "not a JSON object"},
      {good.substr(0, good.size() / 2), "JSON"},
      {"[1,2]", "not a JSON object"},
      {"{\"version\":2,\"resources\":{}}", "version: must be 1"},
      {"{\"version\":\"1\"}", "version: must be 1"},
      {"{\"resources\":{}}", "version: missing"},
      {"{\"version\":1,\"resources\":[]}", "resources: must be an object"},
      {"{\"version\":1,\"resources\":{\"nvidia.com/gpu\":{\"devices\":[{\"id\":\"a\"}],"
       "\"available\":[\"b\"]}}}",
       "'b' is not one of the devices"},
      {"{\"version\":1,\"resources\":{\"nvidia.com/gpu\":{\"devices\":[{\"id\":\"a\"}],"
       "\"available\":[\"a\",\"a\"]}}}",
       "twice"},
      {"{\"version\":1,\"resources\":{\"nvidia.com/gpu\":{\"devices\":[{\"id\":7}]}}}",
       "devices[0].id: must be a string"},
      {"{\"version\":1,\"resources\":{\"nvidia.com/gpu\":{\"available\":\"a\"}}}",
       "available: must be an array of strings"},
      {"{\"version\":1,\"resources\":{\"nvidia.com/gpu\":{\"attributes\":{\"cuda\":12}}}}",
       "attributes.cuda: must be a string"},
      {good + "x", "JSON"},
      {bad_matrix, "matrix"},
      {std::string(300 * 1024, ' '), "more than the"},
  };
  for (const Case& c : cases) {
    auto d = ReadNodeDevices(c.text, &cache);
    ASSERT_FALSE(d.ok()) << c.text.substr(0, 80);
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(c.expect)) << c.text.substr(0, 80);
  }
  EXPECT_TRUE(ReadNodeDevices(good, &cache).ok());
}

PodRequest Pod(int gpus, std::vector<ContainerRequirements> reqs = {}) {
  PodRequest p;
  p.name = "ml/train";
  p.resources[kGpu] = gpus;
  p.requirements = std::move(reqs);
  return p;
}

TEST(ScorerFilter, FailsTooFewFreeAndUnmetRequirementsPassesUnknown) {
  auto t = *topology::Preset("dgx1-v100");
  TopologyCache cache;
  auto node =
      *ReadNodeDevices(MakeAnnotation("n", t, {2}, kube::DeviceAttributes{.cuda = "11.8"}), &cache);
  Scorer scorer({});
  Verdict v = scorer.Filter(Pod(2), &node);
  EXPECT_EQ(v.kind, Verdict::Kind::kFailed);
  EXPECT_EQ(v.reason, "kdm: 1 nvidia.com/gpu free, pod needs 2");
  EXPECT_EQ(scorer.Filter(Pod(1), &node).kind, Verdict::Kind::kPass);
  EXPECT_EQ(scorer.Filter(Pod(2), nullptr).kind, Verdict::Kind::kPass);
  PodRequest other;
  other.resources["example.com/fpga"] = 4;
  EXPECT_EQ(scorer.Filter(other, &node).kind, Verdict::Kind::kPass);

  auto set = kube::ParseRequirementEnv({{"NVIDIA_REQUIRE_CUDA", "cuda>=12.2"}});
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
    TopologyCache cache;
    std::string a = MakeAnnotation("n", t, avail);
    auto node = ReadNodeDevices(a, &cache);
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
  TopologyCache cache;
  // broken: GPU 0's partner is in use; GPUs 2, 3 a whole pair.
  auto broken = *ReadNodeDevices(MakeAnnotation("broken", t, {0, 2, 3}), &cache);
  // whole: only the whole pair (2, 3) is free.
  auto whole = *ReadNodeDevices(MakeAnnotation("whole", t, {2, 3}), &cache);
  // empty: everything free.
  auto empty = *ReadNodeDevices(MakeAnnotation("empty", t, {0, 1, 2, 3}), &cache);
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
  TopologyCache cache;
  auto counts = *ReadNodeDevices(MakeAnnotation("n", t, {0, 1}, {}, false), &cache);
  Scorer scorer({});
  EXPECT_EQ(scorer.Score(Pod(2), &counts), 0.0);
  EXPECT_EQ(scorer.Score(Pod(2), nullptr), 0.0);
  auto full = *ReadNodeDevices(MakeAnnotation("n", t, {0, 1}), &cache);
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

}  // namespace
}  // namespace kdm::scheduler
