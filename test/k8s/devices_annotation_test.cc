#include "kdm/k8s/devices_annotation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

namespace kdm::k8s {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// dgx1-v100 with its GPU<i> ids renamed to UUID-like ids.
topology::Topology RenamedDgx1() {
  StatusOr<topology::Topology> t = topology::Preset("dgx1-v100");
  EXPECT_TRUE(t.ok());
  std::vector<topology::DeviceInfo> infos = t->devices();
  std::vector<std::vector<topology::Link>> links(t->size());
  for (int i = 0; i < t->size(); ++i) {
    infos[i].id = "GPU-" + std::to_string(i);
    for (int j = 0; j < t->size(); ++j) links[i].push_back(t->LinkBetween(i, j));
  }
  return *topology::Topology::Create(infos, links);
}

DeviceAttributes H100() {
  return DeviceAttributes{"NVIDIA H100 80GB HBM3", 81559, "550.54.15", "12.4", "9.0", "nvidia"};
}

DevicesAnnotation Example() {
  topology::Topology t = RenamedDgx1();
  ResourceInput in;
  for (int i = 0; i < 8; ++i) in.allocatable["GPU-" + std::to_string(i)] = std::nullopt;
  in.in_use = {"GPU-1", "GPU-6"};
  in.topology = &t;
  in.attributes = H100();
  DevicesAnnotation a;
  a.node = "gpu-node-7";
  a.updated = "2026-11-24T23:00:00Z";
  a.resources["nvidia.com/gpu"] = BuildResourceDevices(in);
  ResourceInput plain;
  plain.allocatable = {{"b", 1}, {"a", 0}};
  a.resources["example.com/fpga"] = BuildResourceDevices(plain);
  return a;
}

std::string DecodeError(const std::string& text) {
  StatusOr<DevicesAnnotation> a = DecodeDevicesAnnotation(text);
  EXPECT_FALSE(a.ok()) << text;
  return a.ok() ? "" : a.status().message();
}

// A valid document with one resource whose body is `resource`.
std::string WithResource(const json& resource) {
  json doc = {{"version", 1}, {"node", "n"}, {"resources", {{"r.io/x", resource}}}};
  return doc.dump();
}

TEST(AnnotationTest, BuildFollowsTheTopologyAndMarksInUse) {
  DevicesAnnotation a = Example();
  const ResourceDevices& gpu = a.resources["nvidia.com/gpu"];
  ASSERT_EQ(gpu.devices.size(), 8u);
  EXPECT_EQ(gpu.devices[0], (PublishedDevice{"GPU-0", 0}));  // NUMA from the topology
  EXPECT_EQ(gpu.devices[7], (PublishedDevice{"GPU-7", 1}));
  EXPECT_THAT(gpu.available, ElementsAre("GPU-0", "GPU-2", "GPU-3", "GPU-4", "GPU-5", "GPU-7"));
  ASSERT_TRUE(gpu.topology.has_value());
  EXPECT_EQ(*gpu.topology, RenamedDgx1());
  const ResourceDevices& fpga = a.resources["example.com/fpga"];
  EXPECT_THAT(fpga.devices, ElementsAre(PublishedDevice{"a", 0}, PublishedDevice{"b", 1}));
  EXPECT_FALSE(fpga.topology.has_value());
}

TEST(AnnotationTest, UnhealthyDevicesLeaveTheMatrix) {
  topology::Topology t = RenamedDgx1();
  ResourceInput in;
  in.allocatable = {{"GPU-5", 1}, {"GPU-2", std::nullopt}, {"GPU-0", std::nullopt}};
  in.in_use = {"GPU-3"};  // held, but unhealthy: not allocatable, not listed
  in.topology = &t;
  ResourceDevices r = BuildResourceDevices(in);
  EXPECT_THAT(r.devices, ElementsAre(PublishedDevice{"GPU-0", 0}, PublishedDevice{"GPU-2", 0},
                                     PublishedDevice{"GPU-5", 1}));
  EXPECT_THAT(r.available, ElementsAre("GPU-0", "GPU-2", "GPU-5"));
  ASSERT_TRUE(r.topology.has_value());
  ASSERT_EQ(r.topology->size(), 3);
  EXPECT_EQ(r.topology->LinkBetween(0, 2), t.LinkBetween(0, 5));
  EXPECT_EQ(r.topology->LinkBetween(1, 2), t.LinkBetween(2, 5));
}

TEST(AnnotationTest, DeviceMissingFromTopologyDropsTheMatrixWithAWarning) {
  topology::Topology t = RenamedDgx1();
  ResourceInput in;
  in.allocatable = {{"GPU-0", 0}, {"GPU-x", 0}};
  in.topology = &t;
  std::string warning;
  ResourceDevices r = BuildResourceDevices(in, &warning);
  EXPECT_FALSE(r.topology.has_value());
  EXPECT_EQ(r.devices.size(), 2u);
  EXPECT_THAT(warning, HasSubstr("'GPU-x' is allocatable but not in the topology"));
}

TEST(AnnotationTest, EncodeIsDeterministicAndOrdered) {
  std::string value = EncodeDevicesAnnotation(Example());
  EXPECT_EQ(value, EncodeDevicesAnnotation(Example()));
  EXPECT_EQ(value.find('\n'), std::string::npos);
  // Fixed key order.
  EXPECT_EQ(value.rfind(R"({"version":1,"node":"gpu-node-7","updated":"2026-11-24T23:00:00Z",)"
                        R"("resources":{"example.com/fpga":{"devices":[{"id":"a","numa":0},)",
                        0),
            0u)
      << value;
  EXPECT_THAT(value, HasSubstr(R"("attributes":{"model":"NVIDIA H100 80GB HBM3",)"
                               R"("memory_mib":81559,"driver":"550.54.15","cuda":"12.4",)"
                               R"("arch":"9.0","brand":"nvidia"}})"));
  EXPECT_THAT(value, HasSubstr(R"("matrix":[["X","NV1","NV1","NV2","NV2","SYS","SYS","SYS"],)"));
  EXPECT_LT(value.size(), 4096u);
}

TEST(AnnotationTest, RoundTrip) {
  DevicesAnnotation a = Example();
  StatusOr<DevicesAnnotation> back = DecodeDevicesAnnotation(EncodeDevicesAnnotation(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, a);
  // A bare annotation too.
  DevicesAnnotation empty;
  empty.node = "n";
  back = DecodeDevicesAnnotation(EncodeDevicesAnnotation(empty));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, empty);
}

TEST(AnnotationTest, DecodeIgnoresUnknownKeys) {
  json doc = json::parse(EncodeDevicesAnnotation(Example()));
  doc["future"] = {{"x", 1}};
  doc["resources"]["nvidia.com/gpu"]["shares"] = 4;
  doc["resources"]["nvidia.com/gpu"]["attributes"]["ecc"] = true;
  doc["resources"]["nvidia.com/gpu"]["devices"][0]["serial"] = "123";
  StatusOr<DevicesAnnotation> back = DecodeDevicesAnnotation(doc.dump());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, Example());
}

TEST(AnnotationTest, DecodeTheSpecExample) {
  const std::string text =
      R"({"version": 1, "node": "gpu-node-7", "updated": "2026-11-24T23:00:00Z",
 "resources": {
   "nvidia.com/gpu": {
     "devices":   [{"id": "GPU-a1", "numa": 0}, {"id": "GPU-b2", "numa": 1}],
     "available": ["GPU-b2"],
     "matrix":    [["X", "NV2"], ["NV2", "X"]],
     "pcie":      [["X", "SYS"], ["SYS", "X"]],
     "attributes": {"model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                    "driver": "550.54.15", "cuda": "12.4", "arch": "9.0", "brand": "nvidia"}}}})";
  StatusOr<DevicesAnnotation> a = DecodeDevicesAnnotation(text);
  ASSERT_TRUE(a.ok()) << a.status();
  const ResourceDevices& r = a->resources.at("nvidia.com/gpu");
  EXPECT_THAT(r.available, ElementsAre("GPU-b2"));
  ASSERT_TRUE(r.topology.has_value());
  EXPECT_EQ(r.topology->LinkBetween(0, 1), (topology::Link{2, topology::PcieLink::kSys}));
  EXPECT_EQ(r.attributes, H100());
  EXPECT_EQ(a->resources.at("nvidia.com/gpu").devices[1], (PublishedDevice{"GPU-b2", 1}));
}

TEST(AnnotationTest, DecodeBadInputNamesTheField) {
  EXPECT_THAT(DecodeError(""), HasSubstr("not JSON"));
  EXPECT_THAT(DecodeError(R"({"version":1,"node":"n","resources":{)"), HasSubstr("not JSON"));
  EXPECT_THAT(DecodeError("[]"), HasSubstr("top level: must be an object"));
  EXPECT_THAT(DecodeError(R"({"node":"n","resources":{}})"), HasSubstr("missing key 'version'"));
  EXPECT_THAT(DecodeError(R"({"version":"1","node":"n","resources":{}})"),
              HasSubstr("version: must be an integer"));
  EXPECT_THAT(DecodeError(R"({"version":2,"node":"n","resources":{}})"),
              HasSubstr("unsupported version 2"));
  EXPECT_THAT(DecodeError(R"({"version":1,"node":7,"resources":{}})"),
              HasSubstr("node: must be a string"));
  EXPECT_THAT(DecodeError(R"({"version":1,"node":"n"})"), HasSubstr("missing key 'resources'"));
  EXPECT_THAT(DecodeError(R"({"version":1,"node":"n","resources":[]})"),
              HasSubstr("resources: must be an object"));
  EXPECT_THAT(DecodeError(WithResource(json::array())),
              HasSubstr("resources['r.io/x']: must be an object"));
  EXPECT_THAT(DecodeError(WithResource({{"available", json::array()}})),
              HasSubstr("resources['r.io/x']: missing key 'devices'"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", json::array()}})),
              HasSubstr("missing key 'available'"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", {{{"id", 5}}}}, {"available", json::array()}})),
              HasSubstr("resources['r.io/x'].devices[0].id: must be a string"));
  EXPECT_THAT(
      DecodeError(WithResource({{"devices", {{{"id", ""}}}}, {"available", json::array()}})),
      HasSubstr("devices[0].id: must hold 1 to 253 bytes"));
  EXPECT_THAT(DecodeError(WithResource(
                  {{"devices", {{{"id", "a"}}, {{"id", "a"}}}}, {"available", json::array()}})),
              HasSubstr("devices[1].id: duplicate device 'a'"));
  EXPECT_THAT(DecodeError(WithResource(
                  {{"devices", {{{"id", "a"}, {"numa", -1}}}}, {"available", json::array()}})),
              HasSubstr("devices[0].numa: must be a non-negative integer or null"));
  EXPECT_THAT(DecodeError(WithResource(
                  {{"devices", {{{"id", "a"}, {"numa", "0"}}}}, {"available", json::array()}})),
              HasSubstr("devices[0].numa"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", {{{"id", "a"}}}}, {"available", {"b"}}})),
              HasSubstr("available[0]: device 'b' is not in devices"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", {{{"id", "a"}}}}, {"available", {"a", "a"}}})),
              HasSubstr("available[1]: duplicate device 'a'"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", {{{"id", "a"}}}}, {"available", {1}}})),
              HasSubstr("available[0]: must be a string"));
  EXPECT_THAT(
      DecodeError(WithResource(
          {{"devices", {{{"id", "a"}}, {{"id", "b"}}}},
           {"available", json::array()},
           {"matrix", json::array({json::array({"X", "NV1"}), json::array({"NV2", "X"})})}})),
      HasSubstr("symmetric"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", {{{"id", "a"}}, {{"id", "b"}}}},
                                        {"available", json::array()},
                                        {"matrix", {{"X"}}}})),
              HasSubstr("resources['r.io/x'].matrix: has 1 rows for 2 devices"));
  EXPECT_THAT(DecodeError(WithResource(
                  {{"devices", {{{"id", "a"}}}}, {"available", json::array()}, {"pcie", {{"X"}}}})),
              HasSubstr("'pcie' without 'matrix'"));
  EXPECT_THAT(DecodeError(WithResource(
                  {{"devices", json::array()}, {"available", json::array()}, {"matrix", 1}})),
              HasSubstr("resources['r.io/x'].matrix: must be an array of rows"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", {{{"id", "a"}}}},
                                        {"available", json::array()},
                                        {"matrix", json::array({json::array({"X"})})},
                                        {"pcie", json::array({"X"})}})),
              HasSubstr("resources['r.io/x'].pcie[0]: must be an array"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", json::array()},
                                        {"available", json::array()},
                                        {"attributes", {{"memory_mib", "80GB"}}}})),
              HasSubstr("attributes.memory_mib: must be a non-negative integer"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", json::array()},
                                        {"available", json::array()},
                                        {"attributes", {{"cuda", 12.4}}}})),
              HasSubstr("attributes.cuda: must be a string"));
  EXPECT_THAT(DecodeError(WithResource({{"devices", json::array()},
                                        {"available", json::array()},
                                        {"attributes", {{"cuda", "twelve"}}}})),
              HasSubstr("attribute 'cuda': not a version: 'twelve'"));
  EXPECT_THAT(DecodeError(std::string("{\"version\":1}\0", 14)), HasSubstr("NUL byte"));
}

TEST(AnnotationTest, DecodeTakesAModelInAnyUtf8) {
  std::string model = "NVIDIA GeForce RTX\u2122 4090";
  StatusOr<DevicesAnnotation> a = DecodeDevicesAnnotation(
      WithResource({{"devices", json::array()},
                    {"available", json::array()},
                    {"attributes", {{"model", json::parse("\"" + model + "\"")}}}}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->resources.at("r.io/x").attributes->model, "NVIDIA GeForce RTX\xe2\x84\xa2 4090");
  EXPECT_THAT(DecodeError(WithResource({{"devices", json::array()},
                                        {"available", json::array()},
                                        {"attributes", {{"model", std::string(300, 'm')}}}})),
              HasSubstr("attributes.model: longer than 256 bytes"));
}

TEST(AnnotationTest, DecodeRefusesHugeValues) {
  std::string huge = WithResource({{"devices", json::array()},
                                   {"available", json::array()},
                                   {"pad", std::string(kMaxAnnotationBytes, 'x')}});
  StatusOr<DevicesAnnotation> a = DecodeDevicesAnnotation(huge);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(a.status().message(), HasSubstr("the limit is 262144"));
  // Deep nesting inside the limit, as an unknown key or where the matrix
  // goes, is refused or ignored without recursing (built as text: a
  // json value that deep could not even be copied).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string head = R"({"version":1,"node":"n","resources":{"r.io/x":{"devices":[],)"
                           R"("available":[],)";
  StatusOr<DevicesAnnotation> ignored = DecodeDevicesAnnotation(head + R"("pad":)" + deep + "}}}");
  EXPECT_TRUE(ignored.ok()) << ignored.status();
  EXPECT_THAT(DecodeError(head + R"("matrix":)" + deep + "}}}"),
              HasSubstr("resources['r.io/x'].matrix[0][0]: must be a string"));
  EXPECT_THAT(DecodeError(head + R"("matrix":[],"pcie":)" + deep + "}}}"),
              HasSubstr("resources['r.io/x'].pcie[0][0]: must be a string"));
}

TEST(AttributesTest, Parse) {
  StatusOr<DeviceAttributes> a = ParseAttributes(
      "model=NVIDIA H100 80GB HBM3,memory_mib=81559,driver=550.54.15,cuda=12.4,arch=9.0,"
      "brand=nvidia");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, H100());
  for (std::string_view key : kAttributeKeys) EXPECT_TRUE(a->Get(key).has_value()) << key;
  EXPECT_EQ(a->Get(kAttrMemoryMib), "81559");
  a = ParseAttributes("cuda=12.4");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (DeviceAttributes{.cuda = "12.4"}));
  EXPECT_EQ(a->Get(kAttrCuda), "12.4");
  EXPECT_EQ(a->Get(kAttrDriver), std::nullopt);
}

TEST(AttributesTest, BadInput) {
  auto error = [](std::string_view text) {
    StatusOr<DeviceAttributes> a = ParseAttributes(text);
    EXPECT_FALSE(a.ok()) << text;
    return a.ok() ? std::string() : a.status().message();
  };
  EXPECT_THAT(error(""), HasSubstr("attribute item '' is not KEY=VALUE"));
  EXPECT_THAT(error("cuda"), HasSubstr("'cuda' is not KEY=VALUE"));
  EXPECT_THAT(error("cuda=12.4,"), HasSubstr("'' is not KEY=VALUE"));
  EXPECT_THAT(error("cdua=12.4"), HasSubstr("unknown attribute 'cdua'"));
  EXPECT_THAT(error("cuda=12.4,cuda=12.5"), HasSubstr("attribute 'cuda' twice"));
  EXPECT_THAT(error("cuda=twelve"), HasSubstr("attribute 'cuda': not a version: 'twelve'"));
  EXPECT_THAT(error("driver="), HasSubstr("attribute 'driver': an empty value"));
  EXPECT_THAT(error("arch=9.0."), HasSubstr("attribute 'arch': an empty version part"));
  EXPECT_THAT(error("brand=a b"), HasSubstr("attribute 'brand': not a brand name"));
  EXPECT_THAT(error("memory_mib=80GB"), HasSubstr("memory_mib': not a whole number"));
  EXPECT_THAT(error("memory_mib=-1"), HasSubstr("memory_mib': not a whole number"));
  EXPECT_THAT(error("memory_mib=99999999999999999999"), HasSubstr("not a whole number"));
  EXPECT_THAT(error("model=" + std::string(300, 'm')), HasSubstr("longer than 256 bytes"));
  EXPECT_THAT(error("model=a\nb"), HasSubstr("control or non-ASCII byte"));
}

TEST(AnnotationTest, FormatRfc3339) {
  EXPECT_EQ(FormatRfc3339(std::chrono::system_clock::time_point(std::chrono::seconds(0))),
            "1970-01-01T00:00:00Z");
  EXPECT_EQ(FormatRfc3339(std::chrono::system_clock::time_point(std::chrono::seconds(1795561200) +
                                                                std::chrono::milliseconds(999))),
            "2026-11-24T23:00:00Z");
}

// ------------------------------------------------- the extender's view

// The annotation of node `node` with dgx1-v100's devices (ids GPU-<i>), the
// ones at `available` free.
std::string Dgx1Annotation(const std::string& node, const std::vector<int>& available,
                           std::optional<DeviceAttributes> attributes = {},
                           bool with_matrix = true) {
  topology::Topology t = RenamedDgx1();
  ResourceInput in;
  for (const auto& d : t.devices()) in.allocatable[d.id] = d.numa;
  for (const auto& d : t.devices()) in.in_use.insert(d.id);
  for (int i : available) in.in_use.erase(t.Device(i).id);
  in.topology = with_matrix ? &t : nullptr;
  in.attributes = std::move(attributes);
  DevicesAnnotation a{.node = node, .updated = "2026-11-24T23:00:00Z"};
  a.resources["nvidia.com/gpu"] = BuildResourceDevices(in);
  return EncodeDevicesAnnotation(a);
}

// `text` with the first `from` replaced by `to`.
std::string Replaced(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(DecodeNodeDevicesTest, ReadsFreePositionsTopologyAndAttributes) {
  topology::Topology t = RenamedDgx1();
  TopologyCache cache;
  StatusOr<NodeDevices> d =
      DecodeNodeDevices(Dgx1Annotation("n1", {1, 3, 6}, DeviceAttributes{.cuda = "12.4"}), &cache);
  ASSERT_TRUE(d.ok()) << d.status();
  const ResourceView& v = d->resources.at("nvidia.com/gpu");
  EXPECT_EQ(v.device_count, 8);
  EXPECT_EQ(v.available, (std::vector<int>{1, 3, 6}));
  ASSERT_NE(v.topology, nullptr);
  EXPECT_EQ(v.topology->topology.PairScore(0, 3), t.PairScore(0, 3));
  EXPECT_EQ(v.attributes, (DeviceAttributes{.cuda = "12.4"}));
  // A second node with the same matrix and NUMA nodes shares the topology.
  StatusOr<NodeDevices> d2 = DecodeNodeDevices(Dgx1Annotation("n2", {0}), &cache);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->resources.at("nvidia.com/gpu").topology.get(), v.topology.get());
  EXPECT_EQ(cache.size(), 1u);
  // Without a matrix: counts only.
  StatusOr<NodeDevices> d3 = DecodeNodeDevices(Dgx1Annotation("n3", {0, 1}, {}, false), &cache);
  ASSERT_TRUE(d3.ok());
  EXPECT_EQ(d3->resources.at("nvidia.com/gpu").topology, nullptr);
  EXPECT_EQ(d3->resources.at("nvidia.com/gpu").available.size(), 2u);
}

TEST(DecodeNodeDevicesTest, OtherNumaNodesAreAnotherTopology) {
  // The search prefers sets on few NUMA nodes: a node whose GPUs sit on
  // other NUMA nodes must not be scored on the first node's.
  TopologyCache cache;
  const std::string a = Dgx1Annotation("n1", {0, 1});
  std::string b = a;
  for (size_t at = b.find("\"numa\":0"); at != std::string::npos; at = b.find("\"numa\":0")) {
    b.replace(at, 8, "\"numa\":1");
  }
  ASSERT_NE(a, b);
  StatusOr<NodeDevices> da = DecodeNodeDevices(a, &cache);
  StatusOr<NodeDevices> db = DecodeNodeDevices(b, &cache);
  ASSERT_TRUE(da.ok() && db.ok());
  const SharedTopology& ta = *da->resources.at("nvidia.com/gpu").topology;
  const SharedTopology& tb = *db->resources.at("nvidia.com/gpu").topology;
  EXPECT_NE(&ta, &tb);
  EXPECT_EQ(tb.topology.Device(0).numa, 1);
  EXPECT_EQ(cache.size(), 2u);
}

// The same document gets the same verdict from both outputs, whatever the
// cache holds: empty, warm with a good node of the same matrix, or full.
// (Issue 27: a bad annotation read after a good one of the same matrix used
// to be accepted by a reader that skipped the checks.)
TEST(DecodeNodeDevicesTest, VerdictDoesNotDependOnReadOrderOrCache) {
  const std::string good = Dgx1Annotation("good", {0, 1, 2}, DeviceAttributes{.cuda = "12.4"});
  struct Case {
    std::string text;
    std::string expect;
  };
  std::vector<Case> cases = {
      {Replaced(good, "\"cuda\":\"12.4\"", "\"cuda\":\"twelve\""),
       "attributes: attribute 'cuda': not a version: 'twelve'"},
      {Replaced(good, "{\"id\":\"GPU-1\"", "{\"id\":\"GPU-0\""),
       "devices[1].id: duplicate device 'GPU-0'"},
      {Replaced(good, "{\"id\":\"GPU-2\",\"numa\":0", "{\"id\":\"GPU-2\",\"numa\":-1"),
       "devices[2].numa: must be a non-negative integer or null"},
      {Replaced(good, "{\"id\":\"GPU-3\"", "{\"id\":\"\""), "devices[3].id: must hold 1 to 253"},
      {Replaced(good, "\"node\":\"good\"", "\"node\":7"), "node: must be a string"},
      {Replaced(good, "\"updated\":\"2026-11-24T23:00:00Z\"", "\"updated\":[]"),
       "updated: must be a string"},
  };
  for (const Case& c : cases) {
    ASSERT_NE(c.text, good);
    // The full decoder's verdict.
    EXPECT_THAT(DecodeError(c.text), HasSubstr(c.expect));
    // Read first, into an empty cache.
    TopologyCache empty;
    StatusOr<NodeDevices> first = DecodeNodeDevices(c.text, &empty);
    ASSERT_FALSE(first.ok()) << c.expect;
    EXPECT_THAT(first.status().message(), HasSubstr(c.expect));
    // Read after a good node with the same matrix.
    TopologyCache warm;
    ASSERT_TRUE(DecodeNodeDevices(good, &warm).ok());
    ASSERT_EQ(warm.size(), 1u);
    StatusOr<NodeDevices> after = DecodeNodeDevices(c.text, &warm);
    ASSERT_FALSE(after.ok()) << c.expect;
    EXPECT_EQ(after.status(), first.status());
    // With the cache full.
    TopologyCache full(1);
    ASSERT_TRUE(DecodeNodeDevices(Dgx1Annotation("other", {0}, {}, true), &full).ok());
    StatusOr<NodeDevices> when_full = DecodeNodeDevices(c.text, &full);
    ASSERT_FALSE(when_full.ok()) << c.expect;
    EXPECT_EQ(when_full.status(), first.status());
  }
}

TEST(DecodeNodeDevicesTest, RefusesBadDocumentsNamingTheField) {
  const std::string good = Dgx1Annotation("n1", {1, 3});
  TopologyCache cache;
  struct Case {
    std::string text;
    std::string expect;
  };
  std::vector<Case> cases = {
      {"", "not JSON"},
      {"garbage", "not JSON"},
      {good.substr(0, good.size() / 2), "JSON"},
      {"[1,2]", "top level: must be an object"},
      {"{\"version\":2,\"node\":\"n\",\"resources\":{}}", "unsupported version 2"},
      {"{\"version\":\"1\",\"node\":\"n\",\"resources\":{}}", "version: must be an integer"},
      {"{\"node\":\"n\",\"resources\":{}}", "missing key 'version'"},
      {"{\"version\":1,\"node\":\"n\",\"resources\":[]}", "resources: must be an object"},
      {"{\"version\":1,\"node\":\"n\",\"resources\":{\"nvidia.com/gpu\":{\"devices\":[{\"id\":"
       "\"a\"}],\"available\":[\"b\"]}}}",
       "available[0]: device 'b' is not in devices"},
      {"{\"version\":1,\"node\":\"n\",\"resources\":{\"nvidia.com/gpu\":{\"devices\":[{\"id\":"
       "\"a\"}],\"available\":[\"a\",\"a\"]}}}",
       "available[1]: duplicate device 'a'"},
      {"{\"version\":1,\"node\":\"n\",\"resources\":{\"nvidia.com/gpu\":{\"devices\":[{\"id\":7}],"
       "\"available\":[]}}}",
       "devices[0].id: must be a string"},
      {good + "x", "JSON"},
      {Replaced(good, "\"matrix\":[[\"X\"", "\"matrix\":[[\"Q\""),
       "matrix[0][0]: unknown cell 'Q'"},
      {std::string(300 * 1024, ' '), "the limit is"},
  };
  for (const Case& c : cases) {
    StatusOr<NodeDevices> d = DecodeNodeDevices(c.text, &cache);
    ASSERT_FALSE(d.ok()) << c.text.substr(0, 80);
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(c.expect)) << c.text.substr(0, 80);
    // The same verdict as the full decoder.
    EXPECT_EQ(DecodeDevicesAnnotation(c.text).status(), d.status()) << c.text.substr(0, 80);
  }
  EXPECT_TRUE(DecodeNodeDevices(good, &cache).ok());
}

// ------------------------------------------------- the topology cache

// An 8-GPU annotation (dgx1-v100's links) whose pair 0-1 has `nvlinks`
// NVLinks: one distinct matrix per value, 1 to 64.
std::string VariantAnnotation(int nvlinks) {
  topology::Topology t = RenamedDgx1();
  std::vector<std::vector<topology::Link>> links(t.size());
  for (int i = 0; i < t.size(); ++i) {
    for (int j = 0; j < t.size(); ++j) links[i].push_back(t.LinkBetween(i, j));
  }
  links[0][1].nvlinks = links[1][0].nvlinks = nvlinks;
  topology::Topology v = *topology::Topology::Create(t.devices(), links);
  ResourceInput in;
  for (const auto& d : v.devices()) in.allocatable[d.id] = d.numa;
  in.topology = &v;
  DevicesAnnotation a{.node = "n" + std::to_string(nvlinks), .updated = "2026-11-24T23:00:00Z"};
  a.resources["nvidia.com/gpu"] = BuildResourceDevices(in);
  return EncodeDevicesAnnotation(a);
}

std::shared_ptr<const SharedTopology> ReadTopology(const std::string& text, TopologyCache* cache) {
  StatusOr<NodeDevices> d = DecodeNodeDevices(text, cache);
  EXPECT_TRUE(d.ok()) << d.status();
  if (!d.ok()) return nullptr;
  return d->resources.at("nvidia.com/gpu").topology;
}

// The bytes one VariantAnnotation entry counts (the variants differ by a
// byte or two of matrix text).
size_t VariantEntryBytes() {
  TopologyCache probe;
  ReadTopology(VariantAnnotation(1), &probe);
  return probe.stats().bytes;
}

// Issue 28: the cache kept up to 4,096 topologies whatever their size
// (about 1.2 MB for a 248-GPU matrix: 1,000 of them took the extender to
// 1.13 GB). It is bounded in bytes, evicting.
TEST(TopologyCacheTest, KeepsItsBytesWithinTheBudgetAndCountsEvictions) {
  const size_t entry = VariantEntryBytes();
  ASSERT_GT(entry, 0u);
  TopologyCache cache(3 * entry + entry / 2);
  for (int v = 1; v <= 20; ++v) {
    ReadTopology(VariantAnnotation(v), &cache);
    const TopologyCache::Stats s = cache.stats();
    EXPECT_LE(s.bytes, s.max_bytes) << v;
    EXPECT_LE(s.entries, 3u) << v;
  }
  const TopologyCache::Stats s = cache.stats();
  EXPECT_EQ(s.entries, 3u);
  EXPECT_EQ(s.evictions, 17u);
  EXPECT_EQ(s.not_kept, 0u);
}

TEST(TopologyCacheTest, EvictsTheLeastRecentlyUsed) {
  const size_t entry = VariantEntryBytes();
  TopologyCache cache(3 * entry + entry / 2);
  auto a = ReadTopology(VariantAnnotation(1), &cache);
  auto b = ReadTopology(VariantAnnotation(2), &cache);
  auto c = ReadTopology(VariantAnnotation(3), &cache);
  ASSERT_TRUE(a && b && c);
  // A is used again: B is now the least recently used.
  EXPECT_EQ(ReadTopology(VariantAnnotation(1), &cache), a);
  auto d = ReadTopology(VariantAnnotation(4), &cache);
  EXPECT_EQ(cache.stats().evictions, 1u);
  // A, C and D are kept (the same objects), B is not.
  EXPECT_EQ(ReadTopology(VariantAnnotation(1), &cache), a);
  EXPECT_EQ(ReadTopology(VariantAnnotation(3), &cache), c);
  EXPECT_EQ(ReadTopology(VariantAnnotation(4), &cache), d);
  EXPECT_EQ(cache.stats().evictions, 1u);
  auto b2 = ReadTopology(VariantAnnotation(2), &cache);
  EXPECT_NE(b2, b);
  EXPECT_EQ(cache.stats().evictions, 2u);  // A, the least recently used then
}

TEST(TopologyCacheTest, AnEvictedTopologyIsRebuiltEqualUnderANewId) {
  const size_t entry = VariantEntryBytes();
  TopologyCache cache(entry + entry / 2);  // room for one
  auto first = ReadTopology(VariantAnnotation(5), &cache);
  ASSERT_NE(first, nullptr);
  ReadTopology(VariantAnnotation(6), &cache);
  EXPECT_EQ(cache.stats().evictions, 1u);
  auto again = ReadTopology(VariantAnnotation(5), &cache);
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->id, first->id);  // score memos of the old one never apply to it
  EXPECT_NE(again->id, 0u);
  EXPECT_TRUE(again->topology == first->topology);
  EXPECT_EQ(again->topology.PairScore(0, 1), first->topology.PairScore(0, 1));
  EXPECT_EQ(again->topology.LinkBetween(0, 1).nvlinks, 5);
  // The reader still held the evicted one: it is intact.
  EXPECT_EQ(first->topology.LinkBetween(0, 1).nvlinks, 5);
}

TEST(TopologyCacheTest, ATopologyAboveTheWholeBudgetIsNotKept) {
  TopologyCache tiny(1);
  auto t = ReadTopology(VariantAnnotation(7), &tiny);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->id, 0u);
  EXPECT_EQ(t->topology.LinkBetween(0, 1).nvlinks, 7);
  const TopologyCache::Stats s = tiny.stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.bytes, 0u);
  EXPECT_EQ(s.not_kept, 1u);
}

// The estimate counts what the entry really holds: the key texts and the
// Topology's n x n link and score matrices (128 GPUs of SYS cells, matrix
// and pcie: about 200 KB of annotation).
TEST(TopologyCacheTest, AnEntrysBytesCountItsMatricesAndKeyText) {
  constexpr int kGpus = 128;
  std::vector<topology::DeviceInfo> infos;
  std::vector<std::vector<topology::Link>> links(kGpus, std::vector<topology::Link>(kGpus));
  for (int i = 0; i < kGpus; ++i) {
    infos.push_back({"GPU-" + std::to_string(i), i, i % 2});
    for (int j = 0; j < kGpus; ++j) {
      if (i != j) links[i][j] = {0, topology::PcieLink::kSys};
    }
  }
  topology::Topology t = *topology::Topology::Create(infos, links);
  const size_t matrices = size_t{kGpus} * kGpus * (sizeof(topology::Link) + sizeof(int));
  EXPECT_GE(EstimateTopologyBytes(t), matrices);
  EXPECT_LE(EstimateTopologyBytes(t), matrices + kGpus * 256);
  ResourceInput in;
  for (const auto& d : t.devices()) in.allocatable[d.id] = d.numa;
  in.topology = &t;
  DevicesAnnotation a{.node = "big", .updated = "2026-11-24T23:00:00Z"};
  a.resources["nvidia.com/gpu"] = BuildResourceDevices(in);
  const std::string text = EncodeDevicesAnnotation(a);
  ASSERT_LE(text.size(), kMaxAnnotationBytes);
  const json doc = json::parse(text);
  const size_t cells = doc["resources"]["nvidia.com/gpu"]["matrix"].dump().size() +
                       doc["resources"]["nvidia.com/gpu"]["pcie"].dump().size();
  TopologyCache cache;
  ReadTopology(text, &cache);
  const TopologyCache::Stats s = cache.stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_GE(s.bytes, matrices + cells);
  EXPECT_LE(s.bytes, 2 * (matrices + cells));
}

// ------------------------------------------------- deep nesting (issue 28)

// `depth` nested arrays around `inner`: [[[...inner...]]].
std::string Nested(size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

// The reader (simdjson On-Demand) walks only the few levels of the keys it
// knows and skips everything else without recursion: a document nested
// 1,000 or 100,000 deep (200 KB, under the size bound) is refused with the
// field it broke, or, under a key the reader does not know, skipped; never
// a crash. Both outputs agree.
TEST(DecodeNodeDevicesTest, DeeplyNestedDocumentsAreRefusedOrSkippedWithoutRecursion) {
  for (size_t depth : {size_t{1000}, size_t{100000}}) {
    SCOPED_TRACE(depth);
    const std::string head = "{\"version\":1,\"node\":\"n\",";
    struct Case {
      std::string text;
      std::string expect;  // empty: accepted
    };
    const std::vector<Case> cases = {
        {Nested(depth), "top level: must be an object"},
        {head + "\"resources\":" + Nested(depth) + "}", "resources: must be an object"},
        {head + "\"resources\":{\"nvidia.com/gpu\":{\"devices\":" + Nested(depth) + "}}}",
         "devices[0]: must be an object"},
        {head +
             "\"resources\":{\"nvidia.com/gpu\":{\"devices\":[{\"id\":\"a\"}],"
             "\"available\":[],\"matrix\":" +
             Nested(depth, "\"X\"") + "}}}",
         "matrix"},
        {head +
             "\"resources\":{\"nvidia.com/gpu\":{\"devices\":[],\"available\":[],"
             "\"attributes\":{\"cuda\":" +
             Nested(depth) + "}}}}",
         "attributes.cuda: must be a string"},
        // Unclosed: not JSON.
        {head + "\"resources\":" + std::string(depth, '['), "kdm.io/devices: "},
        // Under keys the reader does not know: skipped.
        {head + "\"x\":" + Nested(depth) + ",\"resources\":{}}", ""},
        {head +
             "\"resources\":{\"nvidia.com/gpu\":{\"devices\":[],\"available\":[],"
             "\"future\":" +
             Nested(depth) + "}}}",
         ""},
    };
    for (const Case& c : cases) {
      ASSERT_LE(c.text.size(), kMaxAnnotationBytes);
      TopologyCache cache;
      StatusOr<NodeDevices> view = DecodeNodeDevices(c.text, &cache);
      StatusOr<DevicesAnnotation> full = DecodeDevicesAnnotation(c.text);
      if (c.expect.empty()) {
        EXPECT_TRUE(view.ok()) << view.status();
        EXPECT_TRUE(full.ok()) << full.status();
        continue;
      }
      ASSERT_FALSE(view.ok()) << c.expect;
      EXPECT_EQ(view.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(view.status().message()), HasSubstr(c.expect));
      EXPECT_EQ(full.status(), view.status());
    }
  }
}

// A token that starts like null and is not one was an error taken as a bool:
// simdjson threw and the process (the extender, reading a Node) aborted.
TEST(AnnotationTest, ABrokenNullIsRefusedNotThrown) {
  for (const std::string numa : {"nulx", "nul\"x\"l", "n", "nullnull"}) {
    const std::string text = R"({"version":1,"node":"n","resources":{"r.io/x":{"devices":)"
                             R"([{"id":"a","numa":)" +
                             numa + R"(}],"available":[]}}})";
    StatusOr<DevicesAnnotation> full = DecodeDevicesAnnotation(text);
    ASSERT_FALSE(full.ok()) << text;
    EXPECT_EQ(full.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(std::string(full.status().message()), HasSubstr("kdm.io/devices: ")) << text;
    TopologyCache cache;
    EXPECT_EQ(DecodeNodeDevices(text, &cache).status(), full.status()) << text;
  }
}

// ------------------------------------------------- pods and policy

TEST(PodFingerprintTest, IsFnv1a64OverNamespaceSlashName) {
  // FNV-1a's published vectors, through the separator: "" + "/" + "" is "/".
  EXPECT_EQ(PodFingerprint("", ""), 0xaf63a24c860189feull);
  EXPECT_EQ(PodFingerprint("foo", "bar"), 0x571d17d6ef2def0dull);
  // docs/publish.md's vector.
  EXPECT_EQ(PodFingerprint("default", "pod-a"), 0x1cc7008e3498d9b4ull);
  EXPECT_EQ(FormatPodFingerprint(PodFingerprint("default", "pod-a")), "1cc7008e3498d9b4");
  // Bytes, not chars: UTF-8 above 0x7f is not sign-extended.
  EXPECT_EQ(PodFingerprint("ns", "caf\xc3\xa9"), 0x16ab894ea137fddfull);
  // The separator is part of the input ("ab/" and "a/b" differ); a
  // namespace never holds a '/', so no two pods share the hashed text.
  EXPECT_NE(PodFingerprint("ab", ""), PodFingerprint("a", "b"));
  EXPECT_EQ(FormatPodFingerprint(0), "0000000000000000");
  EXPECT_EQ(FormatPodFingerprint(0xffffffffffffffffull), "ffffffffffffffff");
  EXPECT_EQ(FormatPodFingerprint(0xabcull), "0000000000000abc");
}

DevicesAnnotation ExampleWithPodsAndPolicy() {
  DevicesAnnotation a = Example();
  a.pods =
      std::vector<uint64_t>{PodFingerprint("default", "pod-a"), PodFingerprint("default", "pod-b")};
  std::sort(a.pods->begin(), a.pods->end());
  a.resources["nvidia.com/gpu"].policy = topology::Policy::kBestSet;
  return a;
}

TEST(AnnotationTest, PodsAndPolicyAreWrittenInPlaceAndRoundTrip) {
  DevicesAnnotation a = ExampleWithPodsAndPolicy();
  std::string value = EncodeDevicesAnnotation(a);
  EXPECT_EQ(value, EncodeDevicesAnnotation(ExampleWithPodsAndPolicy()));
  EXPECT_EQ(value.rfind(R"({"version":1,"node":"gpu-node-7","updated":"2026-11-24T23:00:00Z",)"
                        R"("pods":["1cc7008e3498d9b4","1cc7038e3498decd"],"resources":{)",
                        0),
            0u)
      << value;
  EXPECT_THAT(value, HasSubstr(R"("available":["GPU-0","GPU-2","GPU-3","GPU-4","GPU-5","GPU-7"],)"
                               R"("policy":"best-set","matrix":)"));
  // Only the resource that says it.
  EXPECT_EQ(value.find("\"policy\""), value.rfind("\"policy\""));
  StatusOr<DevicesAnnotation> back = DecodeDevicesAnnotation(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, a);
  TopologyCache cache;
  StatusOr<NodeDevices> view = DecodeNodeDevices(value, &cache);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->pods, a.pods);
  EXPECT_EQ(view->resources.at("nvidia.com/gpu").policy, topology::Policy::kBestSet);
  EXPECT_EQ(view->resources.at("example.com/fpga").policy, std::nullopt);
  // An empty list is written and read as empty, not as absent.
  a.pods = std::vector<uint64_t>{};
  value = EncodeDevicesAnnotation(a);
  EXPECT_THAT(value, HasSubstr(R"("updated":"2026-11-24T23:00:00Z","pods":[],"resources")"));
  back = DecodeDevicesAnnotation(value);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pods, std::vector<uint64_t>{});
  // Every policy name.
  for (topology::Policy p :
       {topology::Policy::kPacked, topology::Policy::kBestSet, topology::Policy::kFirstFit}) {
    a.resources["example.com/fpga"].policy = p;
    back = DecodeDevicesAnnotation(EncodeDevicesAnnotation(a));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->resources.at("example.com/fpga").policy, p);
  }
}

TEST(AnnotationTest, DocumentsWithoutPodsOrPolicyReadAsNone) {
  const std::string old = EncodeDevicesAnnotation(Example());
  EXPECT_EQ(old.find("\"pods\""), std::string::npos);
  EXPECT_EQ(old.find("\"policy\""), std::string::npos);
  StatusOr<DevicesAnnotation> back = DecodeDevicesAnnotation(old);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pods, std::nullopt);
  EXPECT_EQ(back->resources.at("nvidia.com/gpu").policy, std::nullopt);
  TopologyCache cache;
  StatusOr<NodeDevices> view = DecodeNodeDevices(old, &cache);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->pods, std::nullopt);
  EXPECT_EQ(view->resources.at("nvidia.com/gpu").policy, std::nullopt);
}

TEST(AnnotationTest, PodsAreSortedOnReadAndAnUnknownPolicyIsNone) {
  json doc = json::parse(WithResource(
      {{"devices", json::array()}, {"available", json::array()}, {"policy", "spread-v9"}}));
  doc["pods"] = {"ffffffffffffffff", "0000000000000001", "1cc7008e3498d9b4"};
  for (bool view : {false, true}) {
    std::optional<std::vector<uint64_t>> pods;
    std::optional<topology::Policy> policy = topology::Policy::kPacked;
    TopologyCache cache;
    if (view) {
      StatusOr<NodeDevices> d = DecodeNodeDevices(doc.dump(), &cache);
      ASSERT_TRUE(d.ok()) << d.status();
      pods = d->pods;
      policy = d->resources.at("r.io/x").policy;
    } else {
      StatusOr<DevicesAnnotation> d = DecodeDevicesAnnotation(doc.dump());
      ASSERT_TRUE(d.ok()) << d.status();
      pods = d->pods;
      policy = d->resources.at("r.io/x").policy;
    }
    ASSERT_TRUE(pods.has_value());
    EXPECT_THAT(*pods, ElementsAre(1u, 0x1cc7008e3498d9b4ull, 0xffffffffffffffffull));
    // A policy a newer writer knows reads as none, not as an error.
    EXPECT_EQ(policy, std::nullopt);
  }
}

TEST(AnnotationTest, BadPodsAndPolicyNameTheField) {
  auto with_pods = [](const json& pods) {
    json doc =
        json::parse(WithResource({{"devices", json::array()}, {"available", json::array()}}));
    doc["pods"] = pods;
    return doc.dump();
  };
  struct Case {
    std::string text;
    std::string expect;
  };
  std::vector<Case> cases = {
      {with_pods("1cc7008e3498d9b4"), "kdm.io/devices: pods: must be an array"},
      {with_pods(nullptr), "kdm.io/devices: pods: must be an array"},
      {with_pods(json::object({{"a", 1}})), "pods: must be an array"},
      {with_pods({"1cc7008e3498d9b4", 7}), "pods[1]: must be a string"},
      {with_pods({"1CC7008E3498D9B4"}), "pods[0]: must be 16 lowercase hex digits"},
      {with_pods({"0000000000000001", "1cc7008e3498d9b"}),
       "pods[1]: must be 16 lowercase hex digits"},
      {with_pods({"1cc7008e3498d9b40"}), "pods[0]: must be 16 lowercase hex digits"},
      {with_pods({"0x1cc7008e3498d9"}), "pods[0]: must be 16 lowercase hex digits"},
      {with_pods({"1cc7008e3498d9bg"}), "pods[0]: must be 16 lowercase hex digits"},
      {with_pods({""}), "pods[0]: must be 16 lowercase hex digits"},
      {with_pods({" 1cc7008e3498d9b"}), "pods[0]: must be 16 lowercase hex digits"},
      {with_pods({std::string(100000, 'a')}), "pods[0]: must be 16 lowercase hex digits"},
      {with_pods({"ffffffffffffffff", "0000000000000001", "0000000000000002", "0000000000000001",
                  "ffffffffffffffff"}),
       "pods[3]: duplicate pod 0000000000000001"},
      {WithResource({{"devices", json::array()}, {"available", json::array()}, {"policy", 1}}),
       "resources['r.io/x'].policy: must be a string"},
      {WithResource(
           {{"devices", json::array()}, {"available", json::array()}, {"policy", nullptr}}),
       "resources['r.io/x'].policy: must be a string"},
      {WithResource(
           {{"devices", json::array()}, {"available", json::array()}, {"policy", {"packed"}}}),
       "resources['r.io/x'].policy: must be a string"},
  };
  // A list that is still short enough for the size bound reads.
  std::vector<std::string> many;
  for (int i = 0; i < 13000; ++i)
    many.push_back(FormatPodFingerprint(PodFingerprint("ns", std::to_string(i))));
  cases.push_back({with_pods(many), ""});
  for (const Case& c : cases) {
    TopologyCache cache;
    StatusOr<NodeDevices> view = DecodeNodeDevices(c.text, &cache);
    StatusOr<DevicesAnnotation> full = DecodeDevicesAnnotation(c.text);
    if (c.expect.empty()) {
      ASSERT_TRUE(full.ok()) << full.status();
      EXPECT_EQ(full->pods->size(), many.size());
      EXPECT_TRUE(view.ok()) << view.status();
      continue;
    }
    ASSERT_FALSE(full.ok()) << c.text.substr(0, 120);
    EXPECT_EQ(full.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(full.status().message()), HasSubstr(c.expect));
    // One line, however long the value.
    EXPECT_EQ(full.status().message().find('\n'), std::string::npos);
    EXPECT_LT(full.status().message().size(), 200u);
    EXPECT_EQ(view.status(), full.status());
  }
}

TEST(AnnotationTest, SizeBoundCountsPodsAndPolicy) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{100}, size_t{5000}}) {
    DevicesAnnotation a = ExampleWithPodsAndPolicy();
    a.resources["example.com/fpga"].policy = topology::Policy::kFirstFit;
    a.pods->clear();
    for (size_t i = 0; i < n; ++i) a.pods->push_back(PodFingerprint("ns", std::to_string(i)));
    std::sort(a.pods->begin(), a.pods->end());
    const std::string value = EncodeDevicesAnnotation(a);
    // The lower bound never passes the real size: exactly the value's
    // size is enough, one byte less is not.
    StatusOr<std::string> fits = EncodeDevicesAnnotationWithin(a, value.size());
    ASSERT_TRUE(fits.ok()) << n << ": " << fits.status();
    EXPECT_EQ(*fits, value);
    EXPECT_FALSE(EncodeDevicesAnnotationWithin(a, value.size() - 1).ok());
  }
  // Pods alone past the limit are refused before anything is rendered.
  DevicesAnnotation a;
  a.node = "n";
  a.pods.emplace();
  for (uint64_t i = 0; i < 20000; ++i) a.pods->push_back(i);
  StatusOr<std::string> refused = EncodeDevicesAnnotationWithin(a);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("would be at least 360001 bytes, over the limit of 262144"));
}

}  // namespace
}  // namespace kdm::k8s
