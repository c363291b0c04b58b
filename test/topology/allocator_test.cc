#include "kdm/topology/allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "fixtures.h"
#include "kdm/topology/presets.h"

namespace kdm::topology {
namespace {

using testing::Build;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<int> Range(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

AllocateOptions Patient() {
  AllocateOptions o;
  o.budget = std::chrono::minutes(10);  // exactness tests must never time out
  return o;
}

// Allocates `sizes` one after the other from what is left, as a node does.
std::vector<std::vector<int>> Sequence(const Topology& t, const std::vector<int>& sizes,
                                       Policy policy = Policy::kPacked) {
  std::vector<int> left = Range(t.size());
  std::vector<std::vector<int>> out;
  for (int size : sizes) {
    auto a = Allocate(t, left, {}, size, policy, Patient());
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return out;
    EXPECT_TRUE(a->optimal);
    out.push_back(a->chosen);
    std::vector<int> rest;
    for (int d : left) {
      if (std::find(a->chosen.begin(), a->chosen.end(), d) == a->chosen.end()) rest.push_back(d);
    }
    left = rest;
  }
  // Nothing is left for one more device.
  auto more = Allocate(t, left, {}, 1, policy);
  if (left.empty()) {
    EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  }
  return out;
}

using Sets = std::vector<std::vector<int>>;

// ---- the de-facto standard's pinned answers ---------------------------------

TEST(PackedPinnedTest, Rtx8000Sequences) {
  Topology t = testing::Rtx8000x4();
  EXPECT_EQ(Sequence(t, {1, 1, 1, 1}), (Sets{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(Sequence(t, {2, 2}), (Sets{{0, 3}, {1, 2}}));
  EXPECT_EQ(Sequence(t, {4}), (Sets{{0, 1, 2, 3}}));
}

TEST(PackedPinnedTest, Dgx1PascalSequences) {
  Topology t = testing::Dgx1Pascal();
  EXPECT_EQ(Sequence(t, {1, 1, 1, 1, 1, 1, 1, 1}), (Sets{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(Sequence(t, {2, 2, 2, 2}), (Sets{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(Sequence(t, {4, 4}), (Sets{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(Sequence(t, {8}), (Sets{Range(8)}));
}

TEST(PackedPinnedTest, Dgx1VoltaSequences) {
  Topology t = testing::Dgx1Volta();
  EXPECT_EQ(Sequence(t, {1, 1, 1, 1, 1, 1, 1, 1}), (Sets{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(Sequence(t, {2, 2, 2, 2}), (Sets{{0, 3}, {1, 2}, {4, 7}, {5, 6}}));
  EXPECT_EQ(Sequence(t, {4, 4}), (Sets{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(Sequence(t, {8}), (Sets{Range(8)}));
}

// The same answers on the presets, which add NUMA nodes to the fixtures.
TEST(PackedPinnedTest, PresetsGiveTheSameSequences) {
  EXPECT_EQ(Sequence(*Preset("rtx-4x-bridged"), {2, 2}), (Sets{{0, 3}, {1, 2}}));
  EXPECT_EQ(Sequence(*Preset("dgx1-p100"), {2, 2, 2, 2}), (Sets{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(Sequence(*Preset("dgx1-v100"), {2, 2, 2, 2}), (Sets{{0, 3}, {1, 2}, {4, 7}, {5, 6}}));
  EXPECT_EQ(Sequence(*Preset("dgx1-v100"), {4, 4}), (Sets{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

struct PolicyCase {
  const char* name;
  std::vector<int> available;
  std::vector<int> must_include;
  int size;
  std::vector<int> want;  // empty: an error
};

TEST(PackedPinnedTest, Dgx1VoltaRequests) {
  Topology t = testing::Dgx1Volta();
  const std::vector<PolicyCase> cases = {
      {"single NVLink, prefer same switch", {0, 2, 4, 5}, {}, 2, {4, 5}},
      {"single NVLink, prefer same socket", {0, 4, 5, 6}, {}, 2, {5, 6}},
      {"dual NVLink same socket", {0, 3, 1}, {}, 2, {0, 3}},
      {"dual NVLink across sockets", {0, 1, 4}, {}, 2, {0, 4}},
      {"must include, size 1", Range(8), {4}, 1, {4}},
      {"must include, size 2", Range(8), {4}, 2, {4, 7}},
      {"must include, size 4", Range(8), {4}, 4, {4, 5, 6, 7}},
      {"must include the full set", Range(8), {0, 2, 4, 6}, 4, {0, 2, 4, 6}},
      {"must include an unavailable device", {1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3}, 4, {}},
      {"must include more than size", Range(8), {1, 2, 3, 4, 5, 6}, 4, {}},
      {"must include more than available", {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5, 6}, 1, {}},
  };
  for (const PolicyCase& c : cases) {
    auto a = Allocate(t, c.available, c.must_include, c.size, Policy::kPacked, Patient());
    if (c.want.empty()) {
      EXPECT_FALSE(a.ok()) << c.name;
    } else {
      ASSERT_TRUE(a.ok()) << c.name << ": " << a.status();
      EXPECT_EQ(a->chosen, c.want) << c.name;
    }
  }
}

TEST(PackedPinnedTest, BestGroupIsFoundWherever14DevicesPutIt) {
  std::vector<std::tuple<int, int, int>> nv;
  for (int i = 0; i < 12; i += 2) nv.push_back({i, i + 1, 2});
  nv.push_back({12, 13, 4});
  Topology t = Build(14, nv, {});
  auto a = Allocate(t, Range(14), {}, 2, Policy::kPacked, Patient());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->chosen, ElementsAre(12, 13));
  EXPECT_EQ(a->score, 400);
  EXPECT_EQ(a->packed_score, 6 * 200 + 400);
}

// The first answer on DGX-1 V100 is a tie between two packings of 920:
// {0,3}{1,2}{4,7}{5,6} (every pair NV2+PHB, 230) and {0,4}{1,5}{2,3}{6,7}
// (210, 210, 250, 250). The weakest-group rule picks the first; the own score
// alone would have picked {2,3}.
TEST(PackedTieBreakTest, WeakestGroupDecidesBeforeOwnScore) {
  Topology t = testing::Dgx1Volta();
  auto a = Allocate(t, Range(8), {}, 2, Policy::kPacked, Patient());
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->chosen, ElementsAre(0, 3));
  EXPECT_EQ(a->score, 230);
  EXPECT_EQ(a->packed_score, 920);
  auto best = Allocate(t, Range(8), {}, 2, Policy::kBestSet, Patient());
  ASSERT_TRUE(best.ok());
  EXPECT_THAT(best->chosen, ElementsAre(2, 3));
  EXPECT_EQ(best->score, 250);
  EXPECT_EQ(best->packed_score, 920);
}

TEST(PackedTieBreakTest, FewerNumaNodesThenLowestIndices) {
  // Four devices, no links at all: every set ties on score.
  std::vector<DeviceInfo> d = {{"a", 0, 0}, {"b", 1, 1}, {"c", 2, 0}, {"d", 3, 1}};
  auto t = Topology::Create(d, std::vector<std::vector<Link>>(4, std::vector<Link>(4)));
  ASSERT_TRUE(t.ok());
  for (Policy p : {Policy::kPacked, Policy::kBestSet}) {
    auto a = Allocate(*t, Range(4), {}, 2, p, Patient());
    ASSERT_TRUE(a.ok());
    EXPECT_THAT(a->chosen, ElementsAre(0, 2)) << PolicyName(p);
  }
  auto f = Allocate(*t, Range(4), {}, 2, Policy::kFirstFit);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(f->chosen, ElementsAre(0, 1));
}

// go-gpuallocator can return a padded set (a device short) when no set has a
// link: never here.
TEST(PackedRegressionTest, NoLinksStillGivesAFullSet) {
  auto t = Topology::Create({{"a", 0, {}}, {"b", 1, {}}, {"c", 2, {}}},
                            std::vector<std::vector<Link>>(3, std::vector<Link>(3)));
  ASSERT_TRUE(t.ok());
  for (Policy p : {Policy::kPacked, Policy::kBestSet, Policy::kFirstFit}) {
    auto a = Allocate(*t, Range(3), {}, 2, p);
    ASSERT_TRUE(a.ok());
    EXPECT_THAT(a->chosen, ElementsAre(0, 1)) << PolicyName(p);
    EXPECT_EQ(a->score, 0);
  }
}

TEST(AllocateTest, OrderOfAvailableDoesNotMatter) {
  Topology t = *Preset("dgx1-v100");
  std::vector<int> shuffled = {7, 2, 5, 0, 3, 6, 1, 4};
  for (int size = 1; size <= 8; ++size) {
    for (Policy p : {Policy::kPacked, Policy::kBestSet, Policy::kFirstFit}) {
      auto a = Allocate(t, Range(8), {}, size, p, Patient());
      auto b = Allocate(t, shuffled, {}, size, p, Patient());
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->chosen, b->chosen);
      EXPECT_EQ(a->packed_score, b->packed_score);
    }
  }
}

TEST(AllocateTest, FirstFitTakesMustIncludeThenLowestIndices) {
  Topology t = *Preset("dgx1-v100");
  auto a = Allocate(t, {1, 3, 5, 6, 7}, {6}, 3, Policy::kFirstFit);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->chosen, ElementsAre(1, 3, 6));
  EXPECT_EQ(a->score, t.SetScore({1, 3, 6}));
  EXPECT_TRUE(a->optimal);
}

TEST(AllocateTest, ParsePolicy) {
  EXPECT_EQ(*ParsePolicy("packed"), Policy::kPacked);
  EXPECT_EQ(*ParsePolicy("best-set"), Policy::kBestSet);
  EXPECT_EQ(*ParsePolicy("first-fit"), Policy::kFirstFit);
  auto bad = ParsePolicy("fastest");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'fastest'"));
  for (Policy p : {Policy::kPacked, Policy::kBestSet, Policy::kFirstFit}) {
    EXPECT_EQ(*ParsePolicy(PolicyName(p)), p);
  }
}

// ---- bad input -------------------------------------------------------------

TEST(AllocateBadInputTest, EachErrorNamesWhatWasWrong) {
  Topology t = *Preset("dgx1-v100");
  struct Case {
    std::vector<int> available, must;
    int size;
    StatusCode code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {Range(8), {}, 0, StatusCode::kInvalidArgument, "size must be at least 1, got 0"},
      {Range(8), {}, -3, StatusCode::kInvalidArgument, "got -3"},
      {Range(8), {}, 9, StatusCode::kResourceExhausted, "size 9 is above the 8 available"},
      {Range(8), {}, 1 << 30, StatusCode::kResourceExhausted, "available devices"},
      {{0, 1, 9}, {}, 1, StatusCode::kInvalidArgument, "index 9 is outside the topology"},
      {{0, -1}, {}, 1, StatusCode::kInvalidArgument, "index -1 is outside"},
      {{0, 1, 1}, {}, 1, StatusCode::kInvalidArgument, "1 ('GPU1') is listed twice in available"},
      {{0, 1},
       {5},
       1,
       StatusCode::kInvalidArgument,
       "must-include device 5 ('GPU5') is not in available"},
      {{0, 1}, {12}, 1, StatusCode::kInvalidArgument, "must-include device index 12"},
      {{0, 1}, {1, 1}, 2, StatusCode::kInvalidArgument, "listed twice in must-include"},
      {{0, 1, 2}, {0, 1, 2}, 2, StatusCode::kInvalidArgument, "3 must-include devices do not fit"},
      {{}, {}, 1, StatusCode::kResourceExhausted, "above the 0 available"},
  };
  for (const Case& c : cases) {
    for (Policy p : {Policy::kPacked, Policy::kBestSet, Policy::kFirstFit}) {
      auto a = Allocate(t, c.available, c.must, c.size, p);
      ASSERT_FALSE(a.ok()) << c.says;
      EXPECT_EQ(a.status().code(), c.code) << a.status();
      EXPECT_THAT(a.status().message(), HasSubstr(c.says));
    }
  }
}

TEST(AllocateIdsTest, MapsIdsBothWays) {
  Topology t = *Preset("dgx1-v100");
  std::vector<std::string> all;
  for (int i = 0; i < 8; ++i) all.push_back("GPU" + std::to_string(i));
  auto ids = AllocateIds(t, all, {"GPU4"}, 2, Policy::kPacked);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre("GPU4", "GPU7"));
  auto unknown = AllocateIds(t, {"GPU0", "GPU-nope"}, {}, 1, Policy::kPacked);
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("available device id 'GPU-nope'"));
  auto unknown_must = AllocateIds(t, {"GPU0"}, {"x"}, 1, Policy::kPacked);
  ASSERT_FALSE(unknown_must.ok());
  EXPECT_THAT(unknown_must.status().message(), HasSubstr("must-include device id 'x'"));
  auto outside = AllocateIds(t, {"GPU0", "GPU1"}, {"GPU2"}, 1, Policy::kPacked);
  ASSERT_FALSE(outside.ok());
  EXPECT_THAT(outside.status().message(), HasSubstr("'GPU2') is not in available"));
}

// ---- budget and large inputs -------------------------------------------------

Topology FourDgx1Volta() {
  // 32 devices: four DGX-1 V100 blocks joined by SYS.
  Topology v = testing::Dgx1Volta();
  std::vector<DeviceInfo> d;
  for (int i = 0; i < 32; ++i) d.push_back({"GPU" + std::to_string(i), i, i / 8});
  std::vector<std::vector<Link>> links(32, std::vector<Link>(32, Link{0, PcieLink::kSys}));
  for (int i = 0; i < 32; ++i) {
    links[i][i] = Link{};
    for (int j = 0; j < 32; ++j) {
      if (i != j && i / 8 == j / 8) links[i][j] = v.LinkBetween(i % 8, j % 8);
    }
  }
  return std::move(Topology::Create(d, links)).value();
}

void ExpectValid(const Allocation& a, const std::vector<int>& available,
                 const std::vector<int>& must, int size, const Topology& t) {
  EXPECT_EQ(static_cast<int>(a.chosen.size()), size);
  EXPECT_TRUE(std::is_sorted(a.chosen.begin(), a.chosen.end()));
  EXPECT_EQ(std::set<int>(a.chosen.begin(), a.chosen.end()).size(), a.chosen.size());
  for (int c : a.chosen) {
    EXPECT_NE(std::find(available.begin(), available.end(), c), available.end());
  }
  for (int m : must) EXPECT_NE(std::find(a.chosen.begin(), a.chosen.end(), m), a.chosen.end());
  EXPECT_EQ(a.score, t.SetScore(a.chosen));
  EXPECT_GE(a.packed_score, a.score);
}

TEST(AllocateBudgetTest, ExhaustedBudgetGivesAValidSetMarkedNotOptimal) {
  Topology t = FourDgx1Volta();
  AllocateOptions none;
  none.budget = std::chrono::milliseconds(0);
  for (Policy p : {Policy::kPacked, Policy::kBestSet}) {
    for (int size : {2, 3, 8, 16}) {
      auto a = Allocate(t, Range(32), {5}, size, p, none);
      ASSERT_TRUE(a.ok()) << a.status();
      ExpectValid(*a, Range(32), {5}, size, t);
      EXPECT_FALSE(a->optimal) << PolicyName(p) << " size " << size;
    }
  }
}

TEST(AllocateBudgetTest, GreedyFallbackFindsTheObviousBlock) {
  Topology t = FourDgx1Volta();
  AllocateOptions none;
  none.budget = std::chrono::milliseconds(0);
  auto a = Allocate(t, Range(32), {9}, 8, Policy::kPacked, none);
  ASSERT_TRUE(a.ok());
  EXPECT_THAT(a->chosen, ElementsAreArray({8, 9, 10, 11, 12, 13, 14, 15}));
}

TEST(AllocateBudgetTest, MoreThan64DevicesUseTheGreedySearch) {
  const int n = 80;  // e.g. time-sliced replicas
  std::vector<DeviceInfo> d;
  for (int i = 0; i < n; ++i) d.push_back({"r" + std::to_string(i), i, i / 40});
  std::vector<std::vector<Link>> links(n, std::vector<Link>(n, Link{0, PcieLink::kSys}));
  for (int i = 0; i < n; ++i) {
    links[i][i] = Link{};
    for (int j = 0; j < n; ++j) {
      if (i != j && i / 10 == j / 10) links[i][j] = Link{4, PcieLink::kPix};
    }
  }
  Topology t = std::move(Topology::Create(d, links)).value();
  for (Policy p : {Policy::kPacked, Policy::kBestSet, Policy::kFirstFit}) {
    auto a = Allocate(t, Range(n), {33}, 4, p);
    ASSERT_TRUE(a.ok()) << a.status();
    ExpectValid(*a, Range(n), {33}, 4, t);
    EXPECT_FALSE(a->optimal);
    if (p != Policy::kFirstFit) {
      EXPECT_EQ(a->score, 6 * 450) << PolicyName(p);
    }
  }
}

TEST(AllocateBudgetTest, SixteenDevicesFinishExactly) {
  Topology t = *Preset("dgx2-16");
  for (int size = 1; size <= 16; ++size) {
    auto a = Allocate(t, Range(16), {}, size, Policy::kPacked, Patient());
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(a->optimal) << size;
    ExpectValid(*a, Range(16), {}, size, t);
  }
}

// ---- exactness against brute force -------------------------------------------

struct Pack {
  int64_t sum = -1;
  int64_t min_full = 0;
};

bool Better(const Pack& a, const Pack& b) {
  return a.sum != b.sum ? a.sum > b.sum : a.min_full > b.min_full;
}

// Every way to split `items` into groups of `size` plus one group of the
// remainder: the best (total, weakest full group).
Pack BruteRest(const Topology& t, std::vector<int> items, int size) {
  if (items.empty()) return {0, std::numeric_limits<int64_t>::max()};
  Pack best;
  const int first = items[0];
  std::vector<int> others(items.begin() + 1, items.end());
  std::vector<int> group_sizes;
  if (static_cast<int>(items.size()) >= size) group_sizes.push_back(size);
  if (items.size() % size != 0) group_sizes.push_back(static_cast<int>(items.size() % size));
  for (int g : group_sizes) {
    const int k = g - 1;
    std::vector<char> pick(others.size(), 0);
    std::fill(pick.begin(), pick.begin() + k, 1);
    do {
      std::vector<int> group = {first}, rest;
      for (size_t i = 0; i < others.size(); ++i) (pick[i] ? group : rest).push_back(others[i]);
      int64_t own = t.SetScore(group);
      Pack r = BruteRest(t, rest, size);
      Pack cand{own + r.sum, g == size ? std::min(own, r.min_full) : r.min_full};
      if (Better(cand, best)) best = cand;
    } while (std::prev_permutation(pick.begin(), pick.end()));
  }
  return best;
}

int Numa(const Topology& t, const std::vector<int>& set) {
  std::set<int> nodes;
  for (int d : set) {
    if (t.Device(d).numa) nodes.insert(*t.Device(d).numa);
  }
  return static_cast<int>(nodes.size());
}

// The answer by definition: every candidate set, ranked by the policy's keys.
Allocation Brute(const Topology& t, std::vector<int> available, const std::vector<int>& must,
                 int size, Policy policy) {
  std::sort(available.begin(), available.end());
  Allocation best;
  std::vector<int64_t> best_key;
  std::vector<char> pick(available.size(), 0);
  std::fill(pick.begin(), pick.begin() + size, 1);
  do {  // lexicographic order of sets
    std::vector<int> set, rest;
    for (size_t i = 0; i < available.size(); ++i) (pick[i] ? set : rest).push_back(available[i]);
    bool has_must = std::all_of(must.begin(), must.end(), [&](int m) {
      return std::find(set.begin(), set.end(), m) != set.end();
    });
    if (!has_must) continue;
    int64_t own = t.SetScore(set);
    Pack r = BruteRest(t, rest, size);
    std::vector<int64_t> key;
    if (policy == Policy::kPacked) {
      key = {own + r.sum, std::min(own, r.min_full), own, -Numa(t, set)};
    } else {
      key = {own, r.sum, -Numa(t, set)};
    }
    if (best_key.empty() || key > best_key) {
      best_key = key;
      best.chosen = set;
      best.score = own;
      best.packed_score = own + r.sum;
    }
  } while (std::prev_permutation(pick.begin(), pick.end()));
  return best;
}

Topology RandomTopology(std::mt19937& rng, int n, bool tie_heavy) {
  std::vector<DeviceInfo> d;
  std::uniform_int_distribution<int> numa(-1, 2);
  for (int i = 0; i < n; ++i) {
    int node = numa(rng);
    d.push_back({"d" + std::to_string(i), i, node < 0 ? std::nullopt : std::optional<int>(node)});
  }
  const std::vector<int> nv =
      tie_heavy ? std::vector<int>{0, 1} : std::vector<int>{0, 0, 0, 1, 2, 4, 12};
  const std::vector<PcieLink> pcie =
      tie_heavy
          ? std::vector<PcieLink>{PcieLink::kSys, PcieLink::kPix}
          : std::vector<PcieLink>{PcieLink::kNone, PcieLink::kSys, PcieLink::kNode, PcieLink::kPhb,
                                  PcieLink::kPxb,  PcieLink::kPix, PcieLink::kPsb};
  std::vector<std::vector<Link>> links(n, std::vector<Link>(n));
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      Link l{nv[rng() % nv.size()], pcie[rng() % pcie.size()]};
      links[a][b] = links[b][a] = l;
    }
  }
  return std::move(Topology::Create(d, links)).value();
}

void CheckAgainstBruteForce(Policy policy, bool tie_heavy, uint32_t seed, int trials,
                            int min_devices = 2, int max_devices = 10, bool all_available = false) {
  std::mt19937 rng(seed);
  int compared = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const int n = min_devices + static_cast<int>(rng() % (max_devices - min_devices + 1));
    Topology t = RandomTopology(rng, n, tie_heavy);
    std::vector<int> available;
    for (int i = 0; i < n; ++i) {
      if (all_available || rng() % 4 != 0) available.push_back(i);
    }
    if (available.empty()) available.push_back(static_cast<int>(rng() % n));
    std::shuffle(available.begin(), available.end(), rng);
    std::vector<int> must;
    for (int d : available) {
      if (rng() % 5 == 0) must.push_back(d);
    }
    for (int size = std::max<int>(1, static_cast<int>(must.size()));
         size <= static_cast<int>(available.size()); ++size) {
      auto got = Allocate(t, available, must, size, policy, Patient());
      ASSERT_TRUE(got.ok()) << got.status();
      Allocation want = Brute(t, available, must, size, policy);
      SCOPED_TRACE("trial " + std::to_string(trial) + " n " + std::to_string(n) + " size " +
                   std::to_string(size));
      EXPECT_EQ(got->chosen, want.chosen);
      EXPECT_EQ(got->score, want.score);
      EXPECT_EQ(got->packed_score, want.packed_score);
      EXPECT_TRUE(got->optimal);
      ++compared;
    }
  }
  EXPECT_GT(compared, trials);
}

TEST(AllocateExactnessTest, PackedMatchesBruteForce) {
  CheckAgainstBruteForce(Policy::kPacked, false, 1, 400);
}
TEST(AllocateExactnessTest, PackedMatchesBruteForceWithManyTies) {
  CheckAgainstBruteForce(Policy::kPacked, true, 2, 400);
}
TEST(AllocateExactnessTest, BestSetMatchesBruteForce) {
  CheckAgainstBruteForce(Policy::kBestSet, false, 3, 400);
}
TEST(AllocateExactnessTest, BestSetMatchesBruteForceWithManyTies) {
  CheckAgainstBruteForce(Policy::kBestSet, true, 4, 400);
}

// Twelve devices reach every bound of the packing search (some only start at
// ten devices).
TEST(AllocateExactnessTest, PackedMatchesBruteForceOnTwelveDevices) {
  CheckAgainstBruteForce(Policy::kPacked, false, 6, 3, 12, 12, true);
  CheckAgainstBruteForce(Policy::kPacked, true, 7, 3, 11, 11, true);
  CheckAgainstBruteForce(Policy::kBestSet, false, 8, 2, 12, 12, true);
}

// Stateful: allocate, then again from what is left, on the 8-GPU fixtures,
// every mix of sizes, checked against brute force at each step.
TEST(AllocateExactnessTest, StatefulSequencesOnFixtures) {
  std::mt19937 rng(5);
  for (const Topology& t : {testing::Rtx8000x4(), testing::Dgx1Pascal(), testing::Dgx1Volta(),
                            *Preset("pcie-8gpu"), *Preset("dgx-a100")}) {
    for (int round = 0; round < 20; ++round) {
      for (Policy p : {Policy::kPacked, Policy::kBestSet}) {
        std::vector<int> left = Range(t.size());
        while (!left.empty()) {
          int size = 1 + static_cast<int>(rng() % left.size());
          auto got = Allocate(t, left, {}, size, p, Patient());
          ASSERT_TRUE(got.ok());
          Allocation want = Brute(t, left, {}, size, p);
          ASSERT_EQ(got->chosen, want.chosen) << PolicyName(p);
          ASSERT_EQ(got->packed_score, want.packed_score);
          std::vector<int> rest;
          for (int d : left) {
            if (!std::binary_search(got->chosen.begin(), got->chosen.end(), d)) rest.push_back(d);
          }
          left = rest;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kdm::topology
