// Pins the wire format of both protocols: every message type is filled in
// completely, serialized, and compared with bytes written out by hand from the
// field numbers and wire types of docs/wire-contract.md. Renumbering a field,
// changing its type or renaming a package/service/method fails here.
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <string>

#include "deviceplugin/v1beta1/api.pb.h"
#include "podresources/v1/api.pb.h"

namespace kdm {
namespace {

// Bytes from hex pairs, e.g. H("0a 01").
std::string H(const char* hex) {
  std::string out;
  int nibble = -1;
  for (const char* p = hex; *p; ++p) {
    int v;
    if (*p >= '0' && *p <= '9')
      v = *p - '0';
    else if (*p >= 'a' && *p <= 'f')
      v = *p - 'a' + 10;
    else
      continue;
    if (nibble < 0) {
      nibble = v;
    } else {
      out.push_back(static_cast<char>(nibble * 16 + v));
      nibble = -1;
    }
  }
  return out;
}
// Tag byte for field number f with wire type w (fields here are all < 16).
std::string Tag(int field, int wire) {
  return std::string(1, static_cast<char>(field << 3 | wire));
}
constexpr int kVarint = 0, kLen = 2;
// A length-delimited field: tag, one-byte length (all payloads < 128), payload.
std::string Len(int field, const std::string& payload) {
  EXPECT_LT(payload.size(), 128u);
  return Tag(field, kLen) + std::string(1, static_cast<char>(payload.size())) + payload;
}
std::string Varint(int field, int value) {
  EXPECT_LT(value, 128);
  return Tag(field, kVarint) + std::string(1, static_cast<char>(value));
}

template <typename M>
std::string Bytes(const M& m) {
  std::string out;
  EXPECT_TRUE(m.SerializeToString(&out));
  return out;
}

// ---------------------------------------------------------------- v1beta1 --

TEST(GoldenBytesDevicePlugin, DevicePluginOptions) {
  v1beta1::DevicePluginOptions m;
  m.set_pre_start_required(true);
  m.set_get_preferred_allocation_available(true);
  EXPECT_EQ(Bytes(m), H("08 01 10 01"));
}

TEST(GoldenBytesDevicePlugin, RegisterRequest) {
  v1beta1::RegisterRequest m;
  m.set_version("v1beta1");
  m.set_endpoint("a.sock");
  m.set_resource_name("x.io/g");
  m.mutable_options()->set_pre_start_required(true);
  m.mutable_options()->set_get_preferred_allocation_available(true);
  EXPECT_EQ(Bytes(m), H("0a 07") + "v1beta1" + H("12 06") + "a.sock" + H("1a 06") + "x.io/g" +
                          H("22 04 08 01 10 01"));
}

TEST(GoldenBytesDevicePlugin, EmptyMessagesEncodeToNothing) {
  EXPECT_EQ(Bytes(v1beta1::Empty()), "");
  EXPECT_EQ(Bytes(v1beta1::PreStartContainerResponse()), "");
}

TEST(GoldenBytesDevicePlugin, ListAndWatchResponseWithDeviceTopology) {
  v1beta1::ListAndWatchResponse m;
  v1beta1::Device* d = m.add_devices();
  d->set_id("d0");
  d->set_health("Healthy");
  d->mutable_topology()->add_nodes()->set_id(1);
  std::string numa = Varint(1, 1);      // NUMANode.ID = 1
  std::string topology = Len(1, numa);  // TopologyInfo.nodes = 1
  std::string device = Len(1, "d0") + Len(2, "Healthy") + Len(3, topology);
  EXPECT_EQ(Bytes(m), Len(1, device));  // ListAndWatchResponse.devices = 1
  // And the same bytes spelled out fully, to catch a bug in the helpers.
  EXPECT_EQ(Bytes(m), H("0a 13 0a 02") + "d0" + H("12 07") + "Healthy" + H("1a 04 0a 02 08 01"));
}

TEST(GoldenBytesDevicePlugin, PreStartContainerRequest) {
  v1beta1::PreStartContainerRequest m;
  m.add_devices_ids("d0");
  m.add_devices_ids("d1");
  EXPECT_EQ(Bytes(m), H("0a 02") + "d0" + H("0a 02") + "d1");
}

TEST(GoldenBytesDevicePlugin, PreferredAllocationRequest) {
  v1beta1::PreferredAllocationRequest m;
  auto* c = m.add_container_requests();
  c->add_available_deviceids("a");
  c->add_available_deviceids("b");
  c->add_must_include_deviceids("a");
  c->set_allocation_size(2);
  EXPECT_EQ(Bytes(m), H("0a 0b 0a 01") + "a" + H("0a 01") + "b" + H("12 01") + "a" + H("18 02"));
}

TEST(GoldenBytesDevicePlugin, PreferredAllocationResponse) {
  v1beta1::PreferredAllocationResponse m;
  auto* c = m.add_container_responses();
  c->add_deviceids("a");
  c->add_deviceids("b");
  EXPECT_EQ(Bytes(m), H("0a 06 0a 01") + "a" + H("0a 01") + "b");
}

TEST(GoldenBytesDevicePlugin, AllocateRequest) {
  v1beta1::AllocateRequest m;
  m.add_container_requests()->add_devices_ids("a");
  EXPECT_EQ(Bytes(m), H("0a 03 0a 01") + "a");
}

TEST(GoldenBytesDevicePlugin, AllocateResponseEveryField) {
  v1beta1::AllocateResponse m;
  auto* c = m.add_container_responses();
  (*c->mutable_envs())["K"] = "V";
  auto* mount = c->add_mounts();
  mount->set_container_path("/c");
  mount->set_host_path("/h");
  mount->set_read_only(true);
  auto* spec = c->add_devices();
  spec->set_container_path("/c");
  spec->set_host_path("/h");
  spec->set_permissions("rw");
  (*c->mutable_annotations())["A"] = "B";
  c->add_cdi_devices()->set_name("v.com/g=0");

  std::string mount_bytes = H("0a 02") + "/c" + H("12 02") + "/h" + H("18 01");
  std::string spec_bytes = H("0a 02") + "/c" + H("12 02") + "/h" + H("1a 02") + "rw";
  std::string cdi_bytes = H("0a 09") + "v.com/g=0";
  std::string container = H("0a 06 0a 01") + "K" + H("12 01") + "V" +  // envs = 1 (map entry)
                          H("12 0a") + mount_bytes +                   // mounts = 2
                          H("1a 0c") + spec_bytes +                    // devices = 3
                          H("22 06 0a 01") + "A" + H("12 01") + "B" +  // annotations = 4
                          H("2a 0b") + cdi_bytes;                      // cdi_devices = 5
  ASSERT_EQ(container.size(), 0x37u);
  EXPECT_EQ(Bytes(m), H("0a 37") + container);
}

// --------------------------------------------------------------------- v1 --

std::string CdTopology() { return H("1a 04 0a 02 08 01"); }

v1::ContainerDevices MakeContainerDevices() {
  v1::ContainerDevices d;
  d.set_resource_name("r");
  d.add_device_ids("a");
  d.mutable_topology()->add_nodes()->set_id(1);
  return d;
}
const std::string kContainerDevices = H("0a 01") + "r" + H("12 01") + "a" + CdTopology();

v1::ContainerMemory MakeContainerMemory() {
  v1::ContainerMemory m;
  m.set_memory_type("m");
  m.set_size(5);
  m.mutable_topology()->add_nodes()->set_id(1);
  return m;
}
const std::string kContainerMemory = H("0a 01") + "m" + H("10 05") + CdTopology();

v1::PodResources MakePodResources() {
  v1::PodResources p;
  p.set_name("p");
  p.set_namespace_("n");
  auto* c = p.add_containers();
  c->set_name("c");
  *c->add_devices() = MakeContainerDevices();
  c->add_cpu_ids(3);
  *c->add_memory() = MakeContainerMemory();
  auto* dr = c->add_dynamic_resources();
  dr->set_claim_name("c");
  dr->set_claim_namespace("n");
  auto* cr = dr->add_claim_resources();
  cr->add_cdi_devices()->set_name("c");
  cr->set_driver_name("d");
  cr->set_pool_name("p");
  cr->set_device_name("n");
  p.add_cpu_ids(4);
  *p.add_memory() = MakeContainerMemory();
  return p;
}
std::string PodResourcesBytes() {
  std::string claim =
      H("0a 03 0a 01") + "c" + H("12 01") + "d" + H("1a 01") + "p" + H("22 01") + "n";
  std::string dynamic = H("12 01") + "c" + H("1a 01") + "n" + H("22 0e") + claim;
  std::string container = H("0a 01") + "c" +                // name = 1
                          H("12 0c") + kContainerDevices +  // devices = 2
                          H("1a 01 03") +                   // cpu_ids = 3 (packed)
                          H("22 0b") + kContainerMemory +   // memory = 4
                          H("2a 16") + dynamic;             // dynamic_resources = 5
  EXPECT_EQ(container.size(), 0x39u);
  std::string pod = H("0a 01") + "p" + H("12 01") + "n" + H("1a 39") + container + H("22 01 04") +
                    H("2a 0b") + kContainerMemory;
  EXPECT_EQ(pod.size(), 0x51u);
  return pod;
}

TEST(GoldenBytesPodResources, ContainerDevicesAndMemory) {
  EXPECT_EQ(Bytes(MakeContainerDevices()), kContainerDevices);
  EXPECT_EQ(Bytes(MakeContainerMemory()), kContainerMemory);
}

TEST(GoldenBytesPodResources, ListPodResourcesResponse) {
  v1::ListPodResourcesResponse m;
  *m.add_pod_resources() = MakePodResources();
  EXPECT_EQ(Bytes(m), H("0a 51") + PodResourcesBytes());
}

TEST(GoldenBytesPodResources, AllocatableResourcesResponse) {
  v1::AllocatableResourcesResponse m;
  *m.add_devices() = MakeContainerDevices();
  m.add_cpu_ids(3);
  *m.add_memory() = MakeContainerMemory();
  EXPECT_EQ(Bytes(m),
            H("0a 0c") + kContainerDevices + H("12 01 03") + H("1a 0b") + kContainerMemory);
}

TEST(GoldenBytesPodResources, GetPodResourcesRequestAndResponse) {
  v1::GetPodResourcesRequest req;
  req.set_pod_name("p");
  req.set_pod_namespace("n");
  EXPECT_EQ(Bytes(req), H("0a 01") + "p" + H("12 01") + "n");
  v1::GetPodResourcesResponse resp;
  *resp.mutable_pod_resources() = MakePodResources();
  EXPECT_EQ(Bytes(resp), H("0a 51") + PodResourcesBytes());
}

TEST(GoldenBytesPodResources, EmptyRequests) {
  EXPECT_EQ(Bytes(v1::ListPodResourcesRequest()), "");
  EXPECT_EQ(Bytes(v1::AllocatableResourcesRequest()), "");
}

TEST(GoldenBytesPodResources, DynamicResourceFieldOneIsReserved) {
  const auto* d = v1::DynamicResource::descriptor();
  EXPECT_EQ(d->FindFieldByNumber(1), nullptr);
  ASSERT_EQ(d->reserved_range_count(), 1);
  EXPECT_EQ(d->reserved_range(0)->start, 1);
}

// ------------------------------------------------------------ method paths --

std::vector<std::string> MethodPaths(const char* service) {
  const auto* s = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  std::vector<std::string> out;
  if (s == nullptr) return out;
  for (int i = 0; i < s->method_count(); ++i) {
    const auto* m = s->method(i);
    out.push_back("/" + s->full_name() + "/" + m->name() + " (" + m->input_type()->full_name() +
                  ") returns (" + (m->server_streaming() ? "stream " : "") +
                  m->output_type()->full_name() + ")");
  }
  return out;
}

TEST(MethodPaths, Registration) {
  EXPECT_EQ(
      MethodPaths("v1beta1.Registration"),
      std::vector<std::string>{
          "/v1beta1.Registration/Register (v1beta1.RegisterRequest) returns (v1beta1.Empty)"});
}

TEST(MethodPaths, DevicePlugin) {
  EXPECT_EQ(
      MethodPaths("v1beta1.DevicePlugin"),
      (std::vector<std::string>{
          "/v1beta1.DevicePlugin/GetDevicePluginOptions (v1beta1.Empty) returns "
          "(v1beta1.DevicePluginOptions)",
          "/v1beta1.DevicePlugin/ListAndWatch (v1beta1.Empty) returns (stream "
          "v1beta1.ListAndWatchResponse)",
          "/v1beta1.DevicePlugin/GetPreferredAllocation (v1beta1.PreferredAllocationRequest) "
          "returns (v1beta1.PreferredAllocationResponse)",
          "/v1beta1.DevicePlugin/Allocate (v1beta1.AllocateRequest) returns "
          "(v1beta1.AllocateResponse)",
          "/v1beta1.DevicePlugin/PreStartContainer (v1beta1.PreStartContainerRequest) returns "
          "(v1beta1.PreStartContainerResponse)",
      }));
}

TEST(MethodPaths, PodResourcesLister) {
  EXPECT_EQ(MethodPaths("v1.PodResourcesLister"),
            (std::vector<std::string>{
                "/v1.PodResourcesLister/List (v1.ListPodResourcesRequest) returns "
                "(v1.ListPodResourcesResponse)",
                "/v1.PodResourcesLister/GetAllocatableResources (v1.AllocatableResourcesRequest) "
                "returns (v1.AllocatableResourcesResponse)",
                "/v1.PodResourcesLister/Get (v1.GetPodResourcesRequest) returns "
                "(v1.GetPodResourcesResponse)",
            }));
}

}  // namespace
}  // namespace kdm
