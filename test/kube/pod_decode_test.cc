// kube::DecodePodWatchLine / kube::DecodePodList: a good pod (init
// containers, a sidecar, limits and requests), bookmarks, 410 and other
// ERRORs, nesting refused and skipped, pods without uid, name or namespace,
// wrong types, garbage, every truncation, a bad quantity (the pod handed
// over with `error`) and a huge one (the error kept short).
#include "kdm/kube/pod_decode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kdm/k8s/pod.h"

namespace kdm::kube {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A bound pod with a plain init container, a sidecar and two app
// containers; `extra_limit` is added to the last container's limits.
std::string GoodPodJson(const std::string& uid = "u-1", const std::string& rv = "41",
                        const std::string& extra_limit = "") {
  return R"({"kind":"Pod","apiVersion":"v1","metadata":{"name":"train-0","namespace":"ml",)"
         R"("uid":")" +
         uid + R"(","resourceVersion":")" + rv +
         R"(","labels":{"app":"train"}},"spec":{"nodeName":"gpu-7","initContainers":[)"
         R"({"name":"fetch","image":"x","resources":{"limits":{"nvidia.com/gpu":"1"}}},)"
         R"({"name":"proxy","restartPolicy":"Always","resources":{"limits":)"
         R"({"nvidia.com/gpu":"2000m"},"requests":{"nvidia.com/gpu":"2"}}}],)"
         R"("containers":[{"name":"main","resources":{"limits":{"nvidia.com/gpu":"2",)"
         R"("cpu":"500m","memory":"1Gi"},"requests":{"cpu":"250m"}}},)"
         R"({"name":"side","env":[{"name":"A","value":"b"}],"resources":{"limits":{)" +
         extra_limit + R"("example.com/fpga":"1"}}}]},"status":{"phase":"Running"}})";
}

std::string PodLine(const std::string& type, const std::string& object) {
  return R"({"type":")" + type + R"(","object":)" + object + "}";
}

bool IsDevice(const std::string& r) { return r.find('/') != std::string::npos; }

TEST(PodDecodeTest, GoodPodIsReadOnce) {
  StatusOr<PodWatchEvent> e = DecodePodWatchLine(PodLine("ADDED", GoodPodJson()));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->kind, PodWatchEvent::Kind::kPod);
  EXPECT_EQ(e->type, PodEventType::kAdded);
  EXPECT_EQ(e->resource_version, "41");
  const PodObject& p = e->pod;
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.uid, "u-1");
  EXPECT_EQ(p.namespace_name, "ml");
  EXPECT_EQ(p.name, "train-0");
  EXPECT_EQ(p.node_name, "gpu-7");
  EXPECT_EQ(p.phase, "Running");
  EXPECT_EQ(p.resource_version, "41");
  EXPECT_FALSE(p.deleting);
  EXPECT_EQ(p.pod.uid, "u-1");
  EXPECT_EQ(p.pod.namespace_name, "ml");
  EXPECT_EQ(p.pod.name, "train-0");
  ASSERT_EQ(p.pod.init_containers.size(), 2u);
  EXPECT_EQ(p.pod.init_containers[0].name, "fetch");
  EXPECT_FALSE(p.pod.init_containers[0].restartable);
  EXPECT_EQ(p.pod.init_containers[1].name, "proxy");
  EXPECT_TRUE(p.pod.init_containers[1].restartable);
  EXPECT_EQ(p.pod.init_containers[1].limits.at("nvidia.com/gpu"), k8s::Quantity::FromInt(2));
  EXPECT_EQ(p.pod.init_containers[1].requests.at("nvidia.com/gpu"), k8s::Quantity::FromInt(2));
  ASSERT_EQ(p.pod.containers.size(), 2u);
  const k8s::Container& main = p.pod.containers[0];
  EXPECT_EQ(main.name, "main");
  EXPECT_FALSE(main.restartable);
  EXPECT_EQ(main.limits.size(), 3u);  // every resource, not only devices
  EXPECT_EQ(main.limits.at("cpu").ToString(), "500m");
  EXPECT_EQ(main.limits.at("memory").FloorUnits(), int64_t{1} << 30);
  EXPECT_EQ(main.requests.at("cpu").ToString(), "250m");
  EXPECT_TRUE(p.pod.containers[1].env.empty());  // not read
  // The pod is what k8s::EffectiveDeviceRequests reads: app 2 + sidecar 2.
  StatusOr<std::map<std::string, int64_t>> want = k8s::EffectiveDeviceRequests(p.pod, IsDevice);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(want->at("nvidia.com/gpu"), 4);
  EXPECT_EQ(want->at("example.com/fpga"), 1);
}

TEST(PodDecodeTest, EventTypesDeletionAndUnboundPods) {
  StatusOr<PodWatchEvent> m = DecodePodWatchLine(PodLine("MODIFIED", GoodPodJson()));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->type, PodEventType::kModified);
  StatusOr<PodWatchEvent> d = DecodePodWatchLine(PodLine(
      "DELETED", R"({"metadata":{"name":"a","namespace":"n","uid":"u","resourceVersion":"9",)"
                 R"("deletionTimestamp":"2026-11-27T22:00:00Z"},"status":{"phase":"Failed"}})"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type, PodEventType::kDeleted);
  EXPECT_TRUE(d->pod.deleting);
  EXPECT_EQ(d->pod.phase, "Failed");
  EXPECT_EQ(d->pod.node_name, "");  // no spec at all: unbound, no containers
  EXPECT_TRUE(d->pod.pod.containers.empty());
  EXPECT_EQ(d->pod.error, "");
}

TEST(PodDecodeTest, BookmarkGoneAndOtherErrors) {
  StatusOr<PodWatchEvent> b =
      DecodePodWatchLine(R"({"type":"BOOKMARK","object":{"kind":"Pod","metadata":)"
                         R"({"resourceVersion":"77"}}})");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->kind, PodWatchEvent::Kind::kBookmark);
  EXPECT_EQ(b->resource_version, "77");
  StatusOr<PodWatchEvent> g = DecodePodWatchLine(
      R"({"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}})");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->kind, PodWatchEvent::Kind::kGone);
  StatusOr<PodWatchEvent> other = DecodePodWatchLine(
      R"({"type":"ERROR","object":{"kind":"Status","code":500,"message":"etcd down"}})");
  EXPECT_EQ(other.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(other.status().message(), StartsWith("ERROR event (etcd down)"));
  EXPECT_THAT(
      DecodePodWatchLine(R"({"type":"BOOKMARK","object":{"metadata":{}}})").status().message(),
      StartsWith("BOOKMARK without metadata.resourceVersion"));
  EXPECT_THAT(DecodePodWatchLine(PodLine("RENAMED", GoodPodJson())).status().message(),
              StartsWith("unknown event type"));
}

TEST(PodDecodeTest, PodWithoutUidNameOrNamespaceIsDataLoss) {
  struct Case {
    const char* metadata;
    const char* error;
  } cases[] = {
      {R"({"namespace":"n","uid":"u"})", "the object has no metadata.name"},
      {R"({"name":"a","uid":"u"})", "the object has no metadata.namespace"},
      {R"({"name":"a","namespace":"n"})", "the object has no metadata.uid"},
      {R"({"name":"a","namespace":"n","uid":7})", "the object has no metadata.uid"},
      {R"({"name":"","namespace":"n","uid":"u"})", "the object has no metadata.name"},
      {R"("a")", "the object has no metadata.name"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.metadata);
    StatusOr<PodWatchEvent> e =
        DecodePodWatchLine(PodLine("ADDED", std::string(R"({"metadata":)") + c.metadata + "}"));
    EXPECT_EQ(e.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(e.status().message(), StartsWith(c.error));
  }
  // In a LIST, the item is named by its index.
  StatusOr<PodList> l = DecodePodList(R"({"metadata":{"resourceVersion":"3"},"items":[)" +
                                      GoodPodJson() + R"(,{"metadata":{"name":"b"}}]})");
  EXPECT_EQ(l.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(l.status().message(), "items[1]: the object has no metadata.namespace");
}

// A pod whose containers cannot be read is handed over, identity intact,
// with `error` naming the field and no containers.
TEST(PodDecodeTest, WrongTypesAndBadQuantitiesNameTheField) {
  struct Case {
    std::string rest;  // after "metadata":{...},
    std::string error;
  } cases[] = {
      {R"("spec":{"containers":[{"name":"a"},{"name":"b","resources":{"limits":)"
       R"({"nvidia.com/gpu":"2x"}}}]})",
       R"(spec.containers[1].resources.limits['nvidia.com/gpu']: invalid quantity "2x")"},
      {R"("spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":2}}}]})",
       R"(spec.containers[0].resources.limits['nvidia.com/gpu']: must be a quantity string such as "2")"},
      {R"("spec":{"initContainers":[{"resources":{"requests":{"cpu":"1..2"}}}]})",
       R"(spec.initContainers[0].resources.requests['cpu']: invalid quantity "1..2")"},
      {R"("spec":{"containers":{"name":"a"}})", "spec.containers: must be an array"},
      {R"("spec":{"containers":["a"]})", "spec.containers[0]: must be an object"},
      {R"("spec":{"containers":[{"name":3}]})", "spec.containers[0].name: must be a string"},
      {R"("spec":{"initContainers":[{"restartPolicy":true}]})",
       "spec.initContainers[0].restartPolicy: must be a string"},
      {R"("spec":{"containers":[{"resources":[]}]})",
       "spec.containers[0].resources: must be an object"},
      {R"("spec":{"containers":[{"resources":{"limits":"2"}}]})",
       "spec.containers[0].resources.limits: must be an object"},
      {R"("spec":{"nodeName":5})", "spec.nodeName: must be a string"},
      {R"("spec":"x")", "spec: must be an object"},
      {R"("status":{"phase":1})", "status.phase: must be a string"},
      {R"("status":[])", "status: must be an object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rest);
    StatusOr<PodWatchEvent> e = DecodePodWatchLine(PodLine(
        "ADDED", R"({"metadata":{"name":"p","namespace":"n","uid":"u","resourceVersion":"5"},)" +
                     c.rest + "}"));
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_THAT(e->pod.error, StartsWith(c.error));
    EXPECT_EQ(e->pod.uid, "u");
    EXPECT_EQ(e->pod.name, "p");
    EXPECT_EQ(e->pod.namespace_name, "n");
    EXPECT_EQ(e->resource_version, "5");
    EXPECT_TRUE(e->pod.pod.containers.empty());
    EXPECT_TRUE(e->pod.pod.init_containers.empty());
  }
  // Nulls are absent values, not wrong types.
  StatusOr<PodWatchEvent> nulls = DecodePodWatchLine(PodLine(
      "ADDED", R"({"metadata":{"name":"p","namespace":"n","uid":"u"},"spec":{"nodeName":null,)"
               R"("initContainers":null,"containers":[{"name":"a","resources":{"limits":null}}]},)"
               R"("status":null})"));
  ASSERT_TRUE(nulls.ok()) << nulls.status();
  EXPECT_EQ(nulls->pod.error, "");
  EXPECT_EQ(nulls->pod.pod.containers.size(), 1u);
}

// A quantity or a resource name of a megabyte: the error stays short.
TEST(PodDecodeTest, HugeBadQuantityKeepsTheErrorShort) {
  const std::string huge(1 << 20, '9');
  StatusOr<PodWatchEvent> e = DecodePodWatchLine(PodLine(
      "ADDED", GoodPodJson("u", "1", "\"" + std::string(1 << 20, 'r') + "\":\"" + huge + "x\",")));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_THAT(e->pod.error, StartsWith("spec.containers[1].resources.limits['rrrr"));
  EXPECT_LE(e->pod.error.size(), 512u);
  EXPECT_EQ(e->pod.uid, "u");
}

TEST(PodDecodeTest, GarbageAndWrongEnvelopesAreDataLoss) {
  for (const std::string& line : std::vector<std::string>{
           "", "garbage", "[]", "null", "7", R"({"type":1,"object":{}})", R"({"type":"ADDED"})",
           R"({"type":"ADDED","object":[]})", R"({"object":{}})",
           "{\"type\":\"ADDED\",\"object\":{\"a\":\"\xff\"}}",
           std::string("{\"type\":\0\"ADDED\"}", 17)}) {
    SCOPED_TRACE(line);
    StatusOr<PodWatchEvent> e = DecodePodWatchLine(line);
    EXPECT_EQ(e.status().code(), StatusCode::kDataLoss);
  }
  EXPECT_EQ(DecodePodList("not json").status().message(), "not a JSON object");
  EXPECT_EQ(DecodePodList(R"({"items":[]})").status().message(),
            "no metadata.resourceVersion in the list");
  EXPECT_EQ(DecodePodList(R"({"metadata":{"resourceVersion":"1"},"items":{}})").status().message(),
            "items: not a list");
}

// Every proper prefix of a good event or list is refused, never half-read.
TEST(PodDecodeTest, EveryTruncationIsRefused) {
  const std::string line = PodLine("ADDED", GoodPodJson());
  for (size_t n = 0; n < line.size(); ++n) {
    StatusOr<PodWatchEvent> e = DecodePodWatchLine(std::string_view(line).substr(0, n));
    ASSERT_EQ(e.status().code(), StatusCode::kDataLoss) << n;
  }
  const std::string list =
      R"({"metadata":{"resourceVersion":"3"},"items":[)" + GoodPodJson() + "]}";
  for (size_t n = 0; n < list.size(); ++n) {
    ASSERT_FALSE(DecodePodList(std::string_view(list).substr(0, n)).ok()) << n;
  }
  StatusOr<PodList> whole = DecodePodList(list);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->pods.size(), 1u);
}

TEST(PodDecodeTest, DeepEventRefusedAndDeepListItemSkipped) {
  const std::string deep_pod =
      R"({"metadata":{"name":"deep","namespace":"n","uid":"d"},"spec":{"containers":)" +
      std::string(100'000, '[') + std::string(100'000, ']') + "}}";
  StatusOr<PodWatchEvent> e = DecodePodWatchLine(PodLine("ADDED", deep_pod));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->kind, PodWatchEvent::Kind::kRefused);
  EXPECT_THAT(e->refusal, HasSubstr("nested deeper than 64 levels at byte"));
  EXPECT_LT(e->refusal.size(), 400u);
  // An object 64 levels deep (itself the first) is read; 65 are refused.
  auto nested = [](int levels) {
    return PodLine("ADDED", R"({"metadata":{"name":"a","namespace":"n","uid":"u"},"x":)" +
                                std::string(levels, '[') + std::string(levels, ']') + "}");
  };
  EXPECT_EQ(DecodePodWatchLine(nested(kMaxPodJsonDepth - 1))->kind, PodWatchEvent::Kind::kPod);
  EXPECT_EQ(DecodePodWatchLine(nested(kMaxPodJsonDepth))->kind, PodWatchEvent::Kind::kRefused);

  StatusOr<PodList> l =
      DecodePodList(R"({"metadata":{"resourceVersion":"3"},"items":[)" + GoodPodJson("a") + "," +
                    deep_pod + "," + GoodPodJson("c") + "]}");
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->pods.size(), 2u);
  EXPECT_EQ(l->pods[0].uid, "a");
  EXPECT_EQ(l->pods[1].uid, "c");
  ASSERT_EQ(l->refused.size(), 1u);
  EXPECT_THAT(l->refused[0], StartsWith("items[1]: nested deeper than 64 levels"));
  EXPECT_EQ(l->resource_version, "3");
}

TEST(PodDecodeTest, EmptyAndNullListsAreEmpty) {
  StatusOr<PodList> l = DecodePodList(R"({"metadata":{"resourceVersion":"3"},"items":null})");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->pods.empty());
  l = DecodePodList(R"({"kind":"PodList","metadata":{"resourceVersion":"4"}})");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->resource_version, "4");
}

}  // namespace
}  // namespace kdm::kube
