#include "kdm/kube/annotation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

namespace kdm::kube {
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
  EXPECT_THAT(
      DecodeError(WithResource({{"devices", {{{"id", "a"}}, {{"id", "b"}}}},
                                {"available", json::array()},
                                {"matrix", {{"X"}}}})),
      HasSubstr("resources['r.io/x']: topology JSON: devices has 2 entries but matrix has 1 rows"));
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
  EXPECT_EQ(a->ForRequirements(),
            (std::map<std::string, std::string>{
                {"cuda", "12.4"}, {"driver", "550.54.15"}, {"arch", "9.0"}, {"brand", "nvidia"}}));
  a = ParseAttributes("cuda=12.4");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ForRequirements(), (std::map<std::string, std::string>{{"cuda", "12.4"}}));
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

}  // namespace
}  // namespace kdm::kube
