#include "kdm/nvml/topology_from_nvml.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <map>
#include <utility>

#include "kdm/base/log_value.h"

namespace kdm::nvml {
namespace {

using topology::DeviceInfo;
using topology::Link;
using topology::PcieLink;

std::optional<unsigned> Hex(std::string_view s, size_t max_digits) {
  if (s.empty() || s.size() > max_digits) return std::nullopt;
  unsigned v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// A GPU's UUID or a bus id as NVML gave it, quoted: driver text may hold a
// newline or an escape sequence, and these messages end up as log lines.
std::string NvmlText(const std::string& s) { return QuoteLogValue(s, kMaxLogValueBytes); }

std::string LinkWhat(const RawGpu& gpu, size_t link) {
  return "GPU " + NvmlText(gpu.id) + " link " + std::to_string(link);
}

// Whether an answer ends a GPU's link scan without being an error.
bool EndsScan(Return ret) { return ret == kErrorInvalidArgument || ret == kErrorNotSupported; }

}  // namespace

std::optional<std::string> CanonicalBusId(std::string_view bus_id) {
  // [domain:]bus:device.function
  size_t dot = bus_id.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  auto function = Hex(bus_id.substr(dot + 1), 1);
  std::string_view head = bus_id.substr(0, dot);
  size_t last = head.rfind(':');
  if (last == std::string_view::npos) return std::nullopt;
  auto device = Hex(head.substr(last + 1), 2);
  head = head.substr(0, last);
  size_t first = head.rfind(':');
  std::optional<unsigned> domain = 0u;
  std::optional<unsigned> bus;
  if (first == std::string_view::npos) {
    bus = Hex(head, 2);
  } else {
    bus = Hex(head.substr(first + 1), 2);
    domain = Hex(head.substr(0, first), 8);
  }
  if (!function || !device || !bus || !domain || *domain > 0xffff || *function > 7 ||
      *device > 0x1f) {
    return std::nullopt;
  }
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", *domain, *bus, *device, *function);
  return std::string(out);
}

std::optional<PcieLink> PcieFromAncestorLevel(int level) {
  switch (level) {
    case kTopologyInternal:
      return PcieLink::kPsb;
    case kTopologySingle:
      return PcieLink::kPix;
    case kTopologyMultiple:
      return PcieLink::kPxb;
    case kTopologyHostBridge:
      return PcieLink::kPhb;
    case kTopologyNode:
      return PcieLink::kNode;
    case kTopologySystem:
      return PcieLink::kSys;
    default:
      return std::nullopt;
  }
}

StatusOr<NvmlTopology> TopologyFromNvml(const RawTopology& raw) {
  const size_t n = raw.gpus.size();
  if (n == 0) return FailedPreconditionError("NVML reports no GPUs");
  if (raw.ancestors.size() != n) {
    return InvalidArgumentError("NVML topology: " + std::to_string(raw.ancestors.size()) +
                                " rows of common ancestors for " + std::to_string(n) + " GPUs");
  }
  std::map<std::string, size_t> index_by_bus;
  for (size_t i = 0; i < n; ++i) {
    auto bus = CanonicalBusId(raw.gpus[i].bus_id);
    if (!bus) {
      return InvalidArgumentError("NVML topology: GPU " + NvmlText(raw.gpus[i].id) +
                                  " has PCI bus id " + NvmlText(raw.gpus[i].bus_id) +
                                  ", which is not dddd:bb:dd.f");
    }
    if (!index_by_bus.emplace(*bus, i).second) {
      return InvalidArgumentError("NVML topology: GPUs " +
                                  NvmlText(raw.gpus[index_by_bus[*bus]].id) + " and " +
                                  NvmlText(raw.gpus[i].id) + " share PCI bus id " + *bus);
    }
  }

  std::vector<std::string> ignored;
  // direct[i][j]: links of GPU i whose far end is GPU j, as i sees them.
  std::vector<std::vector<int>> direct(n, std::vector<int>(n, 0));
  std::vector<int> switch_links(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const RawGpu& gpu = raw.gpus[i];
    for (size_t l = 0; l < gpu.links.size(); ++l) {
      const RawLink& link = gpu.links[l];
      if (EndsScan(link.state_ret)) break;
      if (link.state_ret != kSuccess) {
        return InvalidArgumentError(LinkWhat(gpu, l) + ": nvmlDeviceGetNvLinkState answered " +
                                    std::to_string(link.state_ret));
      }
      if (!link.enabled) continue;
      if (link.type_ret != kSuccess) {
        return InvalidArgumentError(LinkWhat(gpu, l) +
                                    ": nvmlDeviceGetNvLinkRemoteDeviceType answered " +
                                    std::to_string(link.type_ret));
      }
      if (link.remote_type == kNvLinkDeviceTypeSwitch) {
        ++switch_links[i];
        continue;
      }
      if (link.remote_type != kNvLinkDeviceTypeGpu) continue;
      if (link.pci_ret != kSuccess) {
        return InvalidArgumentError(LinkWhat(gpu, l) +
                                    ": nvmlDeviceGetNvLinkRemotePciInfo_v2 answered " +
                                    std::to_string(link.pci_ret));
      }
      auto bus = CanonicalBusId(link.remote_bus_id);
      auto it = bus ? index_by_bus.find(*bus) : index_by_bus.end();
      if (it == index_by_bus.end() || it->second == i) {
        ignored.push_back(LinkWhat(gpu, l) + ": remote bus id " + NvmlText(link.remote_bus_id) +
                          " " +
                          (it == index_by_bus.end() ? "matches no GPU" : "is the GPU itself"));
        continue;
      }
      ++direct[i][it->second];
    }
  }

  std::vector<DeviceInfo> devices;
  std::vector<std::vector<Link>> links(n, std::vector<Link>(n));
  for (size_t i = 0; i < n; ++i) {
    devices.push_back({raw.gpus[i].id, static_cast<int>(i), raw.gpus[i].numa});
    if (raw.ancestors[i].size() != n) {
      return InvalidArgumentError(
          "NVML topology: common-ancestor row of GPU " + NvmlText(raw.gpus[i].id) + " has " +
          std::to_string(raw.ancestors[i].size()) + " entries, not " + std::to_string(n));
    }
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      Link& cell = links[i][j];
      cell.nvlinks = std::min(direct[i][j], direct[j][i]);
      if (switch_links[i] > 0 && switch_links[j] > 0) {
        cell.nvlinks += std::min(switch_links[i], switch_links[j]);
      }
      cell.nvlinks = std::min(cell.nvlinks, topology::kMaxNvlinks);
      // The pair's PCIe relation, from the lower-indexed GPU's question, so
      // the matrix is symmetric whatever NVML answers.
      const RawAncestor& a = raw.ancestors[std::min(i, j)][std::max(i, j)];
      std::string pair = "GPUs " + NvmlText(raw.gpus[std::min(i, j)].id) + " and " +
                         NvmlText(raw.gpus[std::max(i, j)].id);
      if (a.ret == kErrorNotSupported) {
        cell.pcie = PcieLink::kNone;
      } else if (a.ret != kSuccess) {
        return InvalidArgumentError(pair + ": nvmlDeviceGetTopologyCommonAncestor answered " +
                                    std::to_string(a.ret));
      } else if (auto p = PcieFromAncestorLevel(a.level)) {
        cell.pcie = *p;
      } else {
        return InvalidArgumentError(pair + ": unknown common-ancestor level " +
                                    std::to_string(a.level));
      }
    }
  }
  KDM_ASSIGN_OR_RETURN(topology::Topology t,
                       topology::Topology::Create(std::move(devices), std::move(links)));
  return NvmlTopology{std::move(t), std::move(ignored)};
}

}  // namespace kdm::nvml
