// The writer's cap on the kdm.io/devices annotation (issue 28, item 12):
// k8s::EncodeDevicesAnnotationWithin never returns a value over the API
// server's 256 KiB, refusing a big matrix from its size alone; and
// publish::CheckAnnotationFits, which `kdm publish` and `kdm kubelet
// --publish` run at start, says whether a node's topologies can be published.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/publish/topology_sources.h"
#include "kdm/topology/presets.h"

namespace kdm::publish {
namespace {

using ::testing::HasSubstr;

// `n` GPUs with UUID-long ids, every pair linked through the system.
topology::Topology SysTopology(int n) {
  std::vector<topology::DeviceInfo> devices;
  std::vector<std::vector<topology::Link>> links(n);
  for (int i = 0; i < n; ++i) {
    char id[64];
    std::snprintf(id, sizeof id, "GPU-%08x-0000-4000-8000-%012x", i, i);
    devices.push_back({id, i, i % 2});
    for (int j = 0; j < n; ++j) {
      links[i].push_back(i == j ? topology::Link{} : topology::Link{0, topology::PcieLink::kSys});
    }
  }
  StatusOr<topology::Topology> t = topology::Topology::Create(devices, links);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

k8s::DevicesAnnotation AllFree(const topology::Topology& t) {
  k8s::DevicesAnnotation a;
  a.node = "gpu-node-7";
  a.updated = "2026-11-27T19:00:00Z";
  k8s::ResourceDevices& r = a.resources["nvidia.com/gpu"];
  for (const topology::DeviceInfo& d : t.devices()) {
    r.devices.push_back({d.id, d.numa});
    r.available.push_back(d.id);
  }
  r.topology = t;
  return a;
}

TEST(AnnotationSizeTest, AValueWithinTheLimitIsTheEncodersOwn) {
  k8s::DevicesAnnotation a = AllFree(*topology::Preset("dgx1-v100"));
  StatusOr<std::string> v = k8s::EncodeDevicesAnnotationWithin(a);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, k8s::EncodeDevicesAnnotation(a));
  // The limit is the caller's: one byte less than the value is refused,
  // with its exact size.
  StatusOr<std::string> tight = k8s::EncodeDevicesAnnotationWithin(a, v->size() - 1);
  ASSERT_FALSE(tight.ok());
  EXPECT_EQ(tight.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(tight.status().message(),
              HasSubstr("the value would be " + std::to_string(v->size()) +
                        " bytes, over the "
                        "limit of " +
                        std::to_string(v->size() - 1) + " bytes"));
  EXPECT_TRUE(k8s::EncodeDevicesAnnotationWithin(a, v->size()).ok());
}

TEST(AnnotationSizeTest, A256GpuMatrixIsRefusedBeforeItIsRendered) {
  k8s::DevicesAnnotation a = AllFree(SysTopology(256));
  // Today's encoder makes about 800 KB of it.
  ASSERT_GT(k8s::EncodeDevicesAnnotation(a).size(), 3 * k8s::kMaxAnnotationBytes);
  StatusOr<std::string> v = k8s::EncodeDevicesAnnotationWithin(a);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kOutOfRange);
  // "at least": refused from the lower bound, before any cell was rendered.
  EXPECT_THAT(v.status().message(), HasSubstr("the value would be at least "));
  EXPECT_THAT(v.status().message(), HasSubstr("over the limit of 262144 bytes (256 KiB"));
}

TEST(AnnotationSizeTest, ManyDevicesWithoutAMatrixAreRefusedToo) {
  k8s::DevicesAnnotation a = AllFree(SysTopology(8));
  k8s::ResourceDevices& r = a.resources["nvidia.com/gpu"];
  r.topology.reset();
  r.devices.clear();
  r.available.clear();
  for (int i = 0; i < 2000; ++i) {
    std::string id = "device-" + std::to_string(i) + std::string(100, 'x');
    r.devices.push_back({id, 0});
    r.available.push_back(id);
  }
  StatusOr<std::string> v = k8s::EncodeDevicesAnnotationWithin(a);
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(v.status().message(), HasSubstr("262144 bytes"));
}

TEST(AnnotationSizeTest, CheckAnnotationFitsTheNodesTopologies) {
  std::map<std::string, topology::Topology> topologies;
  topologies.emplace("nvidia.com/gpu", *topology::Preset("dgx-a100"));
  EXPECT_TRUE(CheckAnnotationFits("gpu-node-7", topologies, {}).ok());
  // 128 GPUs fit (about 200 KB); 256 do not, and neither do two resources
  // of 128 that fit alone.
  topologies.clear();
  topologies.emplace("nvidia.com/gpu", SysTopology(128));
  EXPECT_TRUE(CheckAnnotationFits("gpu-node-7", topologies, {}).ok());
  topologies.emplace("example.com/gpu", SysTopology(128));
  Status both = CheckAnnotationFits("gpu-node-7", topologies, {});
  EXPECT_EQ(both.code(), StatusCode::kOutOfRange) << both;
  topologies.clear();
  topologies.emplace("nvidia.com/gpu", SysTopology(256));
  Status big = CheckAnnotationFits("gpu-node-7", topologies, {});
  EXPECT_EQ(big.code(), StatusCode::kOutOfRange) << big;
  EXPECT_THAT(big.message(), HasSubstr("256 KiB"));
}

}  // namespace
}  // namespace kdm::publish
