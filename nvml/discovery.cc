#include "kdm/nvml/discovery.h"

#include <array>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>

#include "kdm/base/log_value.h"

namespace kdm::nvml {
namespace {

// nvmlBrandType_t 0..16, lower-case, as NVIDIA's container toolkit spells
// them in `brand=` requirements.
constexpr std::array<std::string_view, 17> kBrandNames = {
    "unknown",   "quadro",    "tesla",  "nvs",        "grid",    "geforce",
    "titan",     "vapps",     "vpc",    "vcs",        "vws",     "cloudgaming",
    "quadrortx", "nvidiartx", "nvidia", "geforcertx", "titanrtx"};

std::string GpuWhat(const char* call, int index, const std::string& uuid) {
  std::string what = std::string(call) + "(GPU " + std::to_string(index);
  // The UUID is the driver's text: quoted, so a newline in it forges no line.
  if (!uuid.empty()) what += " " + QuoteLogValue(uuid, kMaxLogValueBytes);
  return what + ")";
}

// A small sysfs file's first line, or nullopt.
std::optional<std::string> ReadSysfsLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

std::string SysfsDevice(const std::string& root, const std::string& bus_id) {
  return root + "/bus/pci/devices/" + bus_id;
}

std::string CString(const char* buffer, size_t size) {
  size_t n = 0;
  while (n < size && buffer[n] != '\0') ++n;
  return std::string(buffer, n);
}

// Sets one attribute through its checks; an empty value (NVML did not say)
// stays unset, a value the checks refuse stays unset with a warning.
void SetAttribute(GpuInfo* gpu, std::string_view key, std::string_view value) {
  if (value.empty()) return;
  Status set = gpu->attributes.Set(key, value);
  if (!set.ok()) {
    gpu->attribute_warnings.push_back("NVML's " + std::string(key) +
                                      " is not published: " + std::string(set.message()));
  }
}

}  // namespace

std::string_view BrandName(BrandType brand) {
  if (brand < 0 || brand >= static_cast<int>(kBrandNames.size())) return kBrandNames[0];
  return kBrandNames[brand];
}

std::optional<BrandType> BrandFromName(std::string_view name) {
  for (size_t i = 0; i < kBrandNames.size(); ++i) {
    if (kBrandNames[i] == name) return static_cast<BrandType>(i);
  }
  return std::nullopt;
}

std::optional<int> ReadNumaNode(const std::string& sysfs_root, const std::string& sysfs_bus_id) {
  auto line = ReadSysfsLine(SysfsDevice(sysfs_root, sysfs_bus_id) + "/numa_node");
  if (!line) return std::nullopt;
  int v = 0;
  auto [ptr, ec] = std::from_chars(line->data(), line->data() + line->size(), v);
  if (line->empty() || ec != std::errc() || ptr != line->data() + line->size() || v < 0) {
    return std::nullopt;
  }
  return v;
}

StatusOr<NodeInfo> Discover(const Library& library, const DiscoveryOptions& options) {
  const Api& api = library.api();
  NodeInfo node;
  KDM_ASSIGN_OR_RETURN(node.driver_version, library.DriverVersion());
  KDM_ASSIGN_OR_RETURN(node.cuda_driver_version_raw, library.CudaDriverVersion());
  node.cuda_driver_version = FormatCudaVersion(node.cuda_driver_version_raw);
  unsigned count = 0;
  KDM_RETURN_IF_ERROR(library.Check(api.DeviceGetCount_v2(&count), "nvmlDeviceGetCount_v2"));
  for (unsigned i = 0; i < count; ++i) {
    GpuInfo gpu;
    gpu.index = static_cast<int>(i);
    const int index = gpu.index;
    KDM_RETURN_IF_ERROR(library.Check(api.DeviceGetHandleByIndex_v2(i, &gpu.handle),
                                      GpuWhat("nvmlDeviceGetHandleByIndex_v2", index, "")));
    char uuid[kUuidBufferSize] = {};
    KDM_RETURN_IF_ERROR(library.Check(api.DeviceGetUUID(gpu.handle, uuid, sizeof uuid),
                                      GpuWhat("nvmlDeviceGetUUID", index, "")));
    gpu.uuid = CString(uuid, sizeof uuid);
    char name[kNameBufferSize] = {};
    KDM_RETURN_IF_ERROR(library.Check(api.DeviceGetName(gpu.handle, name, sizeof name),
                                      GpuWhat("nvmlDeviceGetName", index, gpu.uuid)));
    SetAttribute(&gpu, k8s::kAttrModel, CString(name, sizeof name));
    KDM_RETURN_IF_ERROR(library.Check(api.DeviceGetMinorNumber(gpu.handle, &gpu.minor),
                                      GpuWhat("nvmlDeviceGetMinorNumber", index, gpu.uuid)));
    Memory memory{};
    KDM_RETURN_IF_ERROR(library.Check(api.DeviceGetMemoryInfo(gpu.handle, &memory),
                                      GpuWhat("nvmlDeviceGetMemoryInfo", index, gpu.uuid)));
    gpu.attributes.memory_mib = static_cast<int64_t>(memory.total / (1024 * 1024));
    int major = 0, minor = 0;
    KDM_RETURN_IF_ERROR(
        library.Check(api.DeviceGetCudaComputeCapability(gpu.handle, &major, &minor),
                      GpuWhat("nvmlDeviceGetCudaComputeCapability", index, gpu.uuid)));
    SetAttribute(&gpu, k8s::kAttrArch, std::to_string(major) + "." + std::to_string(minor));
    BrandType brand = 0;
    if (api.DeviceGetBrand == nullptr || api.DeviceGetBrand(gpu.handle, &brand) != kSuccess) {
      brand = 0;
    }
    SetAttribute(&gpu, k8s::kAttrBrand, BrandName(brand));
    PciInfo pci{};
    KDM_RETURN_IF_ERROR(library.Check(api.DeviceGetPciInfo_v3(gpu.handle, &pci),
                                      GpuWhat("nvmlDeviceGetPciInfo_v3", index, gpu.uuid)));
    gpu.pci_bus_id = CString(pci.bus_id, sizeof pci.bus_id);
    char sysfs[32];
    std::snprintf(sysfs, sizeof sysfs, "%04x:%02x:%02x.0", pci.domain & 0xffff, pci.bus & 0xff,
                  pci.device & 0xff);
    gpu.sysfs_bus_id = sysfs;
    gpu.numa = ReadNumaNode(options.sysfs_root, gpu.sysfs_bus_id);
    gpu.cpu_affinity =
        ReadSysfsLine(SysfsDevice(options.sysfs_root, gpu.sysfs_bus_id) + "/local_cpulist")
            .value_or("");
    SetAttribute(&gpu, k8s::kAttrDriver, node.driver_version);
    SetAttribute(&gpu, k8s::kAttrCuda, node.cuda_driver_version);
    node.gpus.push_back(std::move(gpu));
  }
  return node;
}

RawTopology QueryTopology(const Library& library, const NodeInfo& node) {
  const Api& api = library.api();
  RawTopology raw;
  const size_t n = node.gpus.size();
  for (const GpuInfo& gpu : node.gpus) {
    RawGpu r{.id = gpu.uuid, .bus_id = gpu.pci_bus_id, .numa = gpu.numa, .links = {}};
    for (unsigned l = 0; l < kMaxNvLinks; ++l) {
      RawLink link;
      int enabled = kFeatureDisabled;
      link.state_ret = api.DeviceGetNvLinkState(gpu.handle, l, &enabled);
      link.enabled = enabled == kFeatureEnabled;
      if (link.state_ret == kSuccess && link.enabled) {
        link.type_ret = api.DeviceGetNvLinkRemoteDeviceType(gpu.handle, l, &link.remote_type);
        if (link.type_ret == kSuccess && link.remote_type == kNvLinkDeviceTypeGpu) {
          PciInfo pci{};
          link.pci_ret = api.DeviceGetNvLinkRemotePciInfo_v2(gpu.handle, l, &pci);
          if (link.pci_ret == kSuccess) link.remote_bus_id = CString(pci.bus_id, sizeof pci.bus_id);
        }
      }
      const bool last = link.state_ret != kSuccess;
      r.links.push_back(std::move(link));
      if (last) break;
    }
    raw.gpus.push_back(std::move(r));
  }
  raw.ancestors.assign(n, std::vector<RawAncestor>(n));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      RawAncestor a;
      a.ret =
          api.DeviceGetTopologyCommonAncestor(node.gpus[i].handle, node.gpus[j].handle, &a.level);
      raw.ancestors[i][j] = a;
      raw.ancestors[j][i] = a;
    }
  }
  return raw;
}

StatusOr<NvmlTopology> DiscoverTopology(const Library& library, const NodeInfo& node) {
  return TopologyFromNvml(QueryTopology(library, node));
}

}  // namespace kdm::nvml
