// The extender applies the Kubernetes rules of k8s/ exactly as the node
// does (issue 27): the verdict on an annotation does not depend on the order
// nodes are read in or on the topology cache; a pod's request is read with
// the full quantity grammar and the device manager's request rules, and its
// sums never wrap. Every test here failed on the code before k8s/ (a second
// annotation reader, digits-only quantities, an unchecked int64 sum).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kdm/devicemanager/ledger.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/extender_json.h"
#include "scheduler_test_util.h"

namespace kdm::scheduler {
namespace {

using nlohmann::json;
using test::kGpu;
using test::MakeAnnotation;
using test::MakeArgs;
using test::MakeNode;
using ::testing::HasSubstr;

struct FilterResult {
  std::vector<std::string> passed;
  std::map<std::string, std::string> failed;
  std::map<std::string, std::string> unresolvable;
};

FilterResult RunFilter(Extender& extender, const std::string& pod,
                       const std::vector<std::string>& nodes) {
  HttpAnswer a = extender.Filter(MakeArgs(pod, nodes));
  EXPECT_EQ(a.status, 200) << a.body;
  FilterResult out;
  json doc = json::parse(a.body, nullptr, false);
  if (doc.is_discarded()) {
    ADD_FAILURE() << a.body;
    return out;
  }
  for (const json& n : doc["Nodes"]["items"]) {
    out.passed.push_back(n["metadata"]["name"].get<std::string>());
  }
  for (auto& [k, v] : doc["FailedNodes"].items()) out.failed[k] = v.get<std::string>();
  for (auto& [k, v] : doc["FailedAndUnresolvableNodes"].items()) {
    out.unresolvable[k] = v.get<std::string>();
  }
  return out;
}

std::string ReplaceOnce(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// A pod whose containers ask for the given limits (and requests, when set)
// of nvidia.com/gpu, written as JSON strings.
std::string PodWith(const std::vector<std::pair<std::string, std::string>>& limit_request,
                    const std::map<std::string, std::string>& env = {}) {
  json pod = {{"metadata", {{"name", "p"}, {"namespace", "ml"}}},
              {"spec", {{"containers", json::array()}}}};
  int i = 0;
  for (const auto& [limit, request] : limit_request) {
    json c = {{"name", "c" + std::to_string(i++)}, {"resources", json::object()}};
    if (!limit.empty()) c["resources"]["limits"][kGpu] = limit;
    if (!request.empty()) c["resources"]["requests"][kGpu] = request;
    for (const auto& [k, v] : env) c["env"].push_back({{"name", k}, {"value", v}});
    pod["spec"]["containers"].push_back(c);
  }
  return pod.dump();
}

TEST(ExtenderRulesTest, AnAnnotationsVerdictDoesNotDependOnReadOrder) {
  auto t = *topology::Preset("dgx1-v100");
  const std::string good =
      MakeAnnotation("good", t, {0, 1, 2, 3}, k8s::DeviceAttributes{.cuda = "12.4"});
  // The same matrix, a cuda that is not a version: the annotation does not
  // read, so the node gets no opinion (it passes) wherever it is read.
  const std::string bad =
      ReplaceOnce(MakeAnnotation("bad", t, {0, 1, 2, 3}, k8s::DeviceAttributes{.cuda = "12.4"}),
                  "\"cuda\":\"12.4\"", "\"cuda\":\"twelve\"");
  const std::string pod = test::MakePod(2, {{"NVIDIA_REQUIRE_CUDA", "cuda>=12.0"}});
  const std::string good_node = MakeNode("good", good);
  const std::string bad_node = MakeNode("bad", bad);
  for (const auto& order :
       std::vector<std::vector<std::string>>{{good_node, bad_node}, {bad_node, good_node}}) {
    Extender extender({.policy = ScorePolicy::kBestSet});
    FilterResult r = RunFilter(extender, pod, order);
    EXPECT_THAT(r.passed, ::testing::UnorderedElementsAre("good", "bad"));
    EXPECT_TRUE(r.unresolvable.empty()) << r.unresolvable.begin()->second;
    // Again on the same extender: its cache now holds the matrix.
    r = RunFilter(extender, pod, {good_node, bad_node});
    EXPECT_THAT(r.passed, ::testing::UnorderedElementsAre("good", "bad"));
    EXPECT_TRUE(r.unresolvable.empty());
  }
  // With the topology cache full.
  k8s::TopologyCache full(1);
  ASSERT_TRUE(
      k8s::DecodeNodeDevices(MakeAnnotation("x", *topology::Preset("dgx-a100"), {0}), &full).ok());
  Extender extender({.policy = ScorePolicy::kBestSet, .topologies = &full});
  FilterResult r = RunFilter(extender, pod, {good_node, bad_node});
  EXPECT_THAT(r.passed, ::testing::UnorderedElementsAre("good", "bad"));
  EXPECT_TRUE(r.unresolvable.empty());
}

TEST(ExtenderRulesTest, HugeRequestsFailTheNodeAndNeverWrap) {
  auto t = *topology::Preset("dgx1-v100");
  const std::vector<std::string> nodes = {MakeNode("gpu", MakeAnnotation("gpu", t, {0, 1})),
                                          MakeNode("plain", std::nullopt)};
  std::vector<std::pair<std::string, std::string>> ten(10, {"999999999999999999", ""});
  for (const auto& containers : std::vector<std::vector<std::pair<std::string, std::string>>>{
           ten,
           {{"9223372036854775807", ""}, {"9223372036854775807", ""}},
           {{"1000000000000000000", "1000000000000000000"}}}) {
    Extender extender({.policy = ScorePolicy::kBestSet});
    FilterResult r = RunFilter(extender, PodWith(containers), nodes);
    ASSERT_EQ(r.unresolvable.count("gpu"), 1u) << containers[0].first;
    EXPECT_THAT(r.unresolvable["gpu"], HasSubstr("kdm: pod refused: container \"c0\" resource "
                                                 "\"nvidia.com/gpu\""));
    EXPECT_THAT(r.unresolvable["gpu"], HasSubstr("is too large for a device count"));
    // A node without the annotation has no opinion to give.
    EXPECT_THAT(r.passed, ::testing::ElementsAre("plain"));
    // No score either.
    HttpAnswer p = extender.Prioritize(MakeArgs(PodWith(containers), nodes));
    EXPECT_EQ(p.status, 200);
    EXPECT_THAT(p.body, HasSubstr("{\"Host\":\"gpu\",\"Score\":0}"));
  }
}

TEST(ExtenderRulesTest, QuantitiesAreReadAsTheLedgerReadsThem) {
  auto t = *topology::Preset("dgx1-v100");
  const std::vector<std::string> nodes = {MakeNode("gpu", MakeAnnotation("gpu", t, {0, 1, 2}))};
  for (const auto& [text, count] :
       std::map<std::string, std::string>{{"2k", "2000"}, {"1e3", "1000"}, {"4000m", "4"}}) {
    Extender extender({.policy = ScorePolicy::kBestSet});
    FilterResult r = RunFilter(extender, PodWith({{text, ""}}), nodes);
    ASSERT_EQ(r.failed.count("gpu"), 1u) << text;
    EXPECT_EQ(r.failed["gpu"], "kdm: 3 nvidia.com/gpu free, pod needs " + count) << text;
  }
  // Fractions are refused as the device manager refuses them.
  Extender extender({.policy = ScorePolicy::kBestSet});
  FilterResult r = RunFilter(extender, PodWith({{"1500m", ""}}), nodes);
  EXPECT_THAT(r.unresolvable["gpu"], HasSubstr("is not a whole number"));
  // What is not a quantity at all is a bad request, naming the field.
  HttpAnswer bad = extender.Filter(MakeArgs(PodWith({{"2x", ""}}), nodes));
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("Pod.spec.containers[0].resources.limits['nvidia.com/gpu']"));
}

TEST(ExtenderRulesTest, LimitsAndRequestsAsTheLedgerHandlesThem) {
  auto t = *topology::Preset("dgx1-v100");
  const std::vector<std::string> nodes = {MakeNode("gpu", MakeAnnotation("gpu", t, {0, 1, 2}))};
  Extender extender({.policy = ScorePolicy::kBestSet});
  // A limit without a request is the request.
  FilterResult r = RunFilter(extender, PodWith({{"2", ""}}), nodes);
  EXPECT_THAT(r.passed, ::testing::ElementsAre("gpu"));
  r = RunFilter(extender, PodWith({{"4", ""}}), nodes);
  EXPECT_EQ(r.failed["gpu"], "kdm: 3 nvidia.com/gpu free, pod needs 4");
  // A request that differs from its limit: the kubelet refuses the pod.
  r = RunFilter(extender, PodWith({{"1", "2"}}), nodes);
  EXPECT_EQ(r.unresolvable["gpu"],
            "kdm: pod refused: container \"c0\" requests 2 of resource \"nvidia.com/gpu\" but "
            "its limit is 1; devices need request == limit");
  // A request without a limit, likewise.
  r = RunFilter(extender, PodWith({{"", "1"}}), nodes);
  EXPECT_THAT(r.unresolvable["gpu"], HasSubstr("without a limit"));
  // Equal values in other spellings are equal.
  r = RunFilter(extender, PodWith({{"2", "2000m"}}), nodes);
  EXPECT_THAT(r.passed, ::testing::ElementsAre("gpu"));
}

// For random pods (init, sidecar and app containers, limits and requests in
// several spellings), the Ledger's effective request and the extender's are
// the same: equal counts, or both refusing.
TEST(ExtenderRulesTest, LedgerAndExtenderAgreeOnRandomPods) {
  devicemanager::Ledger ledger;
  std::vector<devicemanager::LedgerDevice> gpus;
  for (int i = 0; i < 8; ++i) gpus.push_back({"gpu" + std::to_string(i), true, {}});
  ASSERT_TRUE(ledger.SetDevices(kGpu, gpus).ok());
  ASSERT_TRUE(ledger.SetDevices("example.com/fpga", {{"f0", true, {}}}).ok());
  const std::vector<std::string> spellings = {"0",   "1",   "2",  "3", "1000m",      "2k",
                                              "1e1", "1.5", "-1", "4", "2147483647", "2147483648"};
  std::mt19937 rng(27);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int refused = 0, agreed = 0;
  for (int round = 0; round < 2000; ++round) {
    devicemanager::Pod pod;
    pod.uid = "u" + std::to_string(round);
    json spec = {{"containers", json::array()}, {"initContainers", json::array()}};
    const int inits = static_cast<int>(pick(4));
    const int apps = 1 + static_cast<int>(pick(3));
    for (int i = 0; i < inits + apps; ++i) {
      const bool init = i < inits;
      devicemanager::Container c;
      c.name = "c" + std::to_string(i);
      c.restartable = init && pick(2) == 0;
      json jc = {{"name", c.name}, {"resources", json::object()}};
      if (c.restartable) jc["restartPolicy"] = "Always";
      for (const std::string& resource : {std::string(kGpu), std::string("example.com/fpga")}) {
        const size_t shape = pick(8);  // mostly limit only or equal, sometimes odd
        if (shape == 7) continue;
        const std::string limit = spellings[pick(spellings.size() - 3)];
        std::string request = shape < 3 ? "" : limit;
        if (shape == 6) request = spellings[pick(spellings.size())];
        const bool no_limit = shape == 5 && pick(4) == 0;
        if (!no_limit) {
          c.limits[resource] = *k8s::Quantity::Parse(limit);
          jc["resources"]["limits"][resource] = limit;
        }
        if (!request.empty()) {
          c.requests[resource] = *k8s::Quantity::Parse(request);
          jc["resources"]["requests"][resource] = request;
        }
      }
      (init ? pod.init_containers : pod.containers).push_back(c);
      spec[init ? "initContainers" : "containers"].push_back(jc);
    }
    const std::string body = json({{"Pod", {{"metadata", {{"name", "p"}}}, {"spec", spec}}},
                                   {"NodeNames", json::array({"n"})}})
                                 .dump();
    StatusOr<ExtenderArgs> args = DecodeExtenderArgs(body);
    ASSERT_TRUE(args.ok()) << args.status() << "\n" << body;
    StatusOr<std::map<std::string, int64_t>> want = ledger.PodRequests(pod);
    if (!want.ok()) {
      EXPECT_EQ(args->pod.refused, want.status().message()) << body;
      ++refused;
      continue;
    }
    EXPECT_EQ(args->pod.refused, "") << body;
    std::map<std::string, int64_t> got(args->pod.resources.begin(), args->pod.resources.end());
    EXPECT_EQ(got, *want) << body;
    ++agreed;
  }
  // Both kinds were exercised.
  EXPECT_GT(refused, 100);
  EXPECT_GT(agreed, 100);
}

}  // namespace
}  // namespace kdm::scheduler
