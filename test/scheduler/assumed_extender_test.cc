// The extender with assumed allocations: filter and prioritize judge a node
// on its published free set less its assumed pods; POST /bind assumes the
// pod (with the request its filter read) before posting the Binding, and a
// failed post ends the assumption. Bad ExtenderBindingArgs are 400s naming
// the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kdm/scheduler/assumptions.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/extender_json.h"
#include "kdm/topology/presets.h"
#include "scheduler_test_util.h"

namespace kdm::scheduler {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

std::string PodWithUid(const std::string& uid, int gpus) {
  return "{\"metadata\":{\"name\":\"p-" + uid + "\",\"namespace\":\"ml\",\"uid\":\"" + uid +
         "\"},\"spec\":{\"containers\":[{\"name\":\"main\",\"resources\":{\"limits\":{"
         "\"nvidia.com/gpu\":\"" +
         std::to_string(gpus) + "\"}}}]}}";
}

std::string BindBody(const std::string& uid, const std::string& node) {
  return "{\"PodName\":\"p-" + uid + "\",\"PodNamespace\":\"ml\",\"PodUID\":\"" + uid +
         "\",\"Node\":\"" + node + "\"}";
}

class AssumedExtenderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const topology::Topology t = *topology::Preset("dgx1-v100");
    all_free_ = test::MakeNode("n1", test::MakeAnnotation("n1", t, {0, 1, 2, 3, 4, 5, 6, 7}));
    assumptions_ = std::make_unique<Assumptions>(
        Assumptions::Options{.timeout = milliseconds(30'000), .bind_wait = milliseconds(0)});
    Extender::Options o;
    o.policy = ScorePolicy::kBestSet;  // what these tests were written for
    o.assumptions = assumptions_.get();
    o.bind = [this](const BindArgs& a) {
      binds_.push_back(a);
      return bind_result_;
    };
    extender_ = std::make_unique<Extender>(o);
  }
  json Filter(const std::string& pod) {
    HttpAnswer a = extender_->Filter(test::MakeArgs(pod, {all_free_}));
    EXPECT_EQ(a.status, 200) << a.body;
    return json::parse(a.body);
  }

  std::string all_free_;
  std::unique_ptr<Assumptions> assumptions_;
  std::unique_ptr<Extender> extender_;
  std::vector<BindArgs> binds_;
  Status bind_result_ = OkStatus();
};

TEST_F(AssumedExtenderTest, AnAssumedPodsDevicesAreNotFreeForTheNextPod) {
  assumptions_->Bound(BoundPod{.uid = "a",
                               .namespace_name = "ml",
                               .name = "p-a",
                               .node = "n1",
                               .requests = {{"nvidia.com/gpu", 7}}},
                      Assumptions::Source::kWatch);
  json f = Filter(PodWithUid("b", 2));
  EXPECT_EQ(f["FailedNodes"]["n1"], "kdm: 1 nvidia.com/gpu free, pod needs 2");
  EXPECT_TRUE(f["Nodes"]["items"].empty());
  // One GPU is still free for a one-GPU pod.
  json g = Filter(PodWithUid("c", 1));
  EXPECT_EQ(g["Nodes"]["items"].size(), 1u);
}

TEST_F(AssumedExtenderTest, BindAssumesThePodWithTheRequestItsFilterRead) {
  ASSERT_EQ(Filter(PodWithUid("a", 6))["Nodes"]["items"].size(), 1u);
  HttpAnswer b = extender_->Bind(BindBody("a", "n1"));
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(json::parse(b.body), json::parse(R"({"Error":""})"));
  ASSERT_EQ(binds_.size(), 1u);
  EXPECT_EQ(binds_[0].pod_name, "p-a");
  EXPECT_EQ(binds_[0].pod_namespace, "ml");
  EXPECT_EQ(binds_[0].pod_uid, "a");
  EXPECT_EQ(binds_[0].node, "n1");
  EXPECT_EQ(assumptions_->stats().started_bind, 1u);
  // At once: the next pod sees 2 free, not 8.
  EXPECT_EQ(Filter(PodWithUid("b", 3))["FailedNodes"]["n1"],
            "kdm: 2 nvidia.com/gpu free, pod needs 3");
}

TEST_F(AssumedExtenderTest, AFailedBindEndsItsAssumptionAndIsTheAnswersError) {
  ASSERT_EQ(Filter(PodWithUid("a", 6))["Nodes"]["items"].size(), 1u);
  bind_result_ = AbortedError("POST /api/v1/namespaces/ml/pods/p-a/binding: 409 already bound");
  HttpAnswer b = extender_->Bind(BindBody("a", "n1"));
  EXPECT_EQ(b.status, 200);
  EXPECT_THAT(json::parse(b.body)["Error"].get<std::string>(), HasSubstr("409 already bound"));
  EXPECT_EQ(assumptions_->stats().assumed, 0u);
  EXPECT_EQ(assumptions_->stats().bind_failed, 1u);
  EXPECT_EQ(Filter(PodWithUid("b", 8))["Nodes"]["items"].size(), 1u);
}

TEST_F(AssumedExtenderTest, ABindForAPodNeverFilteredIsPostedWithoutAnAssumption) {
  HttpAnswer b = extender_->Bind(BindBody("stranger", "n1"));
  EXPECT_EQ(json::parse(b.body)["Error"], "");
  EXPECT_EQ(binds_.size(), 1u);
  EXPECT_EQ(assumptions_->stats().assumed, 0u);
}

TEST_F(AssumedExtenderTest, BadBindingArgsAreRefusedNamingTheField) {
  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"", "not JSON"},
      {"[]", "must be a JSON object (ExtenderBindingArgs)"},
      {"{\"PodName\":", "not JSON"},
      {R"({"PodName":7,"PodNamespace":"ml","PodUID":"u","Node":"n1"})", "PodName"},
      {R"({"PodNamespace":"ml","PodUID":"u","Node":"n1"})", "PodName"},
      {R"({"PodName":"../../nodes/x","PodNamespace":"ml","PodUID":"u","Node":"n1"})", "PodName"},
      {R"({"PodName":"p","PodNamespace":"ml/x","PodUID":"u","Node":"n1"})", "PodNamespace"},
      {R"({"PodName":"p","PodNamespace":"ml","PodUID":"","Node":"n1"})", "PodUID"},
      {R"({"PodName":"p","PodNamespace":"ml","PodUID":"u","Node":"a%2Fb"})", "Node"},
      {R"({"PodName":"p","PodNamespace":"ml","PodUID":"u","Node":"n1"} x)", "not JSON"},
      {R"({"PodName":"p","PodNamespace":"ml","PodUID":")" + std::string(300, 'u') +
           R"(","Node":"n1"})",
       "PodUID"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 80));
    HttpAnswer a = extender_->Bind(c.body);
    EXPECT_EQ(a.status, 400);
    EXPECT_THAT(a.body, HasSubstr(c.message));
  }
  EXPECT_TRUE(binds_.empty());  // nothing bad reached the API server
}

TEST(AssumedExtenderNoClientTest, BindWithoutAnApiServerSaysWhatIsMissing) {
  Extender extender(Extender::Options{.policy = ScorePolicy::kBestSet});
  HttpAnswer a = extender.Bind(BindBody("a", "n1"));
  EXPECT_EQ(a.status, 200);
  EXPECT_THAT(json::parse(a.body)["Error"].get<std::string>(), HasSubstr("--kubeconfig"));
}

}  // namespace
}  // namespace kdm::scheduler
