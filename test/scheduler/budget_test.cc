// The scoring budget (issue 28, item 6): one budget per request, a node's
// share of it, the packed policy's packings under one deadline per node, and
// Stop(). Time is a FakeClock that moves by a fixed step at every reading,
// so "how many nodes fit" is a count, not a race.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "kdm/base/clock.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/metrics.h"
#include "kdm/scheduler/scorer.h"
#include "kdm/test/sanitizer_bounds.h"
#include "scheduler_test_util.h"

namespace kdm::scheduler {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// Every Now() is `step` later than the one before.
class SteppingClock : public FakeClock {
 public:
  explicit SteppingClock(Duration step) : step_(step) {}
  TimePoint Now() const override {
    const_cast<SteppingClock*>(this)->Advance(step_);
    return FakeClock::Now();
  }

 private:
  const Duration step_;
};

topology::Topology RandomLinks(int n, std::mt19937& rng) {
  std::vector<topology::DeviceInfo> devices;
  for (int i = 0; i < n; ++i) devices.push_back({"D" + std::to_string(i), i, i % 2});
  std::vector<std::vector<topology::Link>> links(n, std::vector<topology::Link>(n));
  std::uniform_int_distribution<int> nv(0, 6), pcie(0, 5);
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      links[i][j] = links[j][i] =
          topology::Link{nv(rng) * 2, static_cast<topology::PcieLink>(pcie(rng))};
    }
  }
  return *topology::Topology::Create(devices, links);
}

std::vector<int> AllDevices(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

double BudgetMetric(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  double sum = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

TEST(ScoreBudgetTest, NodeShareIsAFractionOfTheRequestAndShrinksToWhatIsLeft) {
  FakeClock clock;
  ScoreBudget budget(milliseconds(1000), &clock);
  EXPECT_EQ(budget.Spent(), "");
  EXPECT_EQ(budget.NodeBudget(), milliseconds(50));  // min(1000 / 20, 50 ms)
  ScoreBudget small(milliseconds(100), &clock);
  EXPECT_EQ(small.NodeBudget(), milliseconds(5));
  clock.Advance(milliseconds(980));
  EXPECT_EQ(budget.NodeBudget(), milliseconds(20));
  clock.Advance(milliseconds(20));
  EXPECT_EQ(budget.Spent(), "request_budget");
  EXPECT_EQ(budget.NodeBudget(), milliseconds(0));
  std::atomic<bool> stop{true};
  ScoreBudget stopped(milliseconds(1000), &clock, &stop);
  EXPECT_EQ(stopped.Spent(), "stopping");
}

// The packed policy on 32 free GPUs with random links, a pod of 2: C(32,2)
// packings used to get 50 ms each (27.7 s); now they share one deadline.
TEST(ScoreBudgetTest, PackedScoreKeepsOneDeadlineForAllItsPackings) {
  std::mt19937 rng(32);
  topology::Topology t = RandomLinks(32, rng);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<double> s = BestPackedScore(t, AllDevices(32), 2, start + milliseconds(100));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.status().message(), HasSubstr("packings weighed before the deadline"));
  EXPECT_LT(took, 1.0 * ::kdm::test::kSanitizerTimeScale);
  // A small node fits easily.
  topology::Topology small = RandomLinks(6, rng);
  EXPECT_TRUE(
      BestPackedScore(small, AllDevices(6), 2, std::chrono::steady_clock::now() + milliseconds(500))
          .ok());
}

class BudgetExtenderTest : public ::testing::Test {
 protected:
  std::string Nodes(int n, int gpus, std::mt19937& rng) {
    std::vector<std::string> nodes;
    for (int i = 0; i < n; ++i) {
      topology::Topology t = RandomLinks(gpus, rng);
      nodes.push_back(
          test::MakeNode("n" + std::to_string(i),
                         test::MakeAnnotation("n" + std::to_string(i), t, AllDevices(gpus))));
    }
    return test::MakeArgs(test::MakePod(2), nodes);
  }
  std::unique_ptr<ExtenderMetrics> metrics_ = ExtenderMetrics::Create();
};

// Each clock reading costs 10 ms of a 100 ms budget: the first nodes are
// scored, the rest get 0 and are counted; every node is in the answer.
TEST_F(BudgetExtenderTest, NodesPastTheRequestBudgetScoreZeroAndAreCounted) {
  SteppingClock clock(milliseconds(10));
  Extender extender({.policy = ScorePolicy::kBestSet,
                     .metrics = metrics_.get(),
                     .request_budget = milliseconds(100),
                     .clock = &clock});
  std::mt19937 rng(1);
  HttpAnswer a = extender.Prioritize(Nodes(30, 8, rng));
  ASSERT_EQ(a.status, 200) << a.body;
  auto list = nlohmann::json::parse(a.body);
  ASSERT_EQ(list.size(), 30u);
  int scored = 0;
  for (const auto& e : list) scored += e["Score"].get<int>() > 0;
  const double unscored = BudgetMetric(
      metrics_->Text(),
      "kdm_extender_unscored_nodes_total{reason=\"request_budget\",verb=\"prioritize\"}");
  EXPECT_GT(scored, 0);
  EXPECT_GE(unscored, 20);
  EXPECT_LE(scored + unscored, 30);
  // Filter: the nodes past the budget pass unjudged.
  HttpAnswer f = extender.Filter(Nodes(30, 8, rng));
  ASSERT_EQ(f.status, 200);
  EXPECT_EQ(nlohmann::json::parse(f.body)["Nodes"]["items"].size(), 30u) << f.body.substr(0, 300);
  EXPECT_GE(
      BudgetMetric(metrics_->Text(),
                   "kdm_extender_unscored_nodes_total{reason=\"request_budget\",verb=\"filter\"}"),
      20);
}

// The packed policy with one hostile node: it costs at most its share (1/20
// of the budget), gets 0 and is counted; the honest node beside it is scored.
TEST_F(BudgetExtenderTest, HostilePackedNodeCostsAtMostItsShare) {
  Extender extender({.policy = ScorePolicy::kPacked,
                     .metrics = metrics_.get(),
                     .request_budget = milliseconds(1000)});
  std::mt19937 rng(2);
  topology::Topology hostile = RandomLinks(32, rng), honest = RandomLinks(4, rng);
  const std::string body =
      test::MakeArgs(test::MakePod(2),
                     {test::MakeNode("hostile", test::MakeAnnotation("h", hostile, AllDevices(32))),
                      test::MakeNode("honest", test::MakeAnnotation("o", honest, AllDevices(4)))});
  const auto start = std::chrono::steady_clock::now();
  HttpAnswer a = extender.Prioritize(body);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(a.status, 200) << a.body;
  auto list = nlohmann::json::parse(a.body);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]["Score"], 0);
  EXPECT_GT(list[1]["Score"], 0);
  EXPECT_LT(took, 0.5 * ::kdm::test::kSanitizerTimeScale);  // 50 ms of share, not 27.7 s
  EXPECT_EQ(
      BudgetMetric(metrics_->Text(),
                   "kdm_extender_unscored_nodes_total{reason=\"node_budget\",verb=\"prioritize\"}"),
      1);
}

TEST_F(BudgetExtenderTest, AfterStopEveryNodeIsPassedUnscored) {
  Extender extender({.policy = ScorePolicy::kBestSet, .metrics = metrics_.get()});
  extender.Stop();
  std::mt19937 rng(3);
  HttpAnswer a = extender.Prioritize(Nodes(5, 8, rng));
  ASSERT_EQ(a.status, 200);
  for (const auto& e : nlohmann::json::parse(a.body)) EXPECT_EQ(e["Score"], 0);
  EXPECT_EQ(
      BudgetMetric(metrics_->Text(),
                   "kdm_extender_unscored_nodes_total{reason=\"stopping\",verb=\"prioritize\"}"),
      5);
}

}  // namespace
}  // namespace kdm::scheduler
