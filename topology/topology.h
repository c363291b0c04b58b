// The link model of a node: devices (GPUs) and, for every pair, the bonded
// NVLink count and the PCIe relation between them, as `nvidia-smi topo -m`
// reports them. A pair's score is 100 per NVLink plus a PCIe score (SYS 10,
// NODE 20, PHB 30, PXB 40, PIX 50, PSB 60), the scale NVIDIA's
// go-gpuallocator uses, so scores compare one to one; a set's score is the sum
// over its pairs.
//
// Thread-safety: a Topology is an immutable value once created; const methods
// may be called from any number of threads.
//
// Example:
//   std::vector<DeviceInfo> devices = {{"GPU0", 0, 0}, {"GPU1", 1, 0}};
//   std::vector<std::vector<Link>> links = {{{}, {2, PcieLink::kPix}},
//                                           {{2, PcieLink::kPix}, {}}};
//   kdm::StatusOr<Topology> t = Topology::Create(devices, links);
//   if (t.ok()) int s = t->PairScore(0, 1);  // 250
#ifndef KDM_TOPOLOGY_TOPOLOGY_H_
#define KDM_TOPOLOGY_TOPOLOGY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::topology {

// The PCIe relation of two devices, from farthest to closest. kNone means no
// PCIe relation is known (for example beneath an NVLink cell of nvidia-smi,
// which shows only the NVLinks).
enum class PcieLink { kNone, kSys, kNode, kPhb, kPxb, kPix, kPsb };

// SYS 10, NODE 20, PHB 30, PXB 40, PIX 50, PSB 60, none 0.
int PcieScore(PcieLink link);
// "SYS", "NODE", "PHB", "PXB", "PIX", "PSB"; "-" for kNone.
std::string_view PcieLinkName(PcieLink link);
// Accepts the names above and the older spelling "SOC" for SYS; nullopt for
// anything else (kNone is not parsed: "-" is handled by the cell parser).
std::optional<PcieLink> ParsePcieLink(std::string_view name);

// Points per bonded NVLink.
inline constexpr int kNvlinkScore = 100;
// The most bonded NVLinks a pair may have (NV18 on H100; room to grow).
inline constexpr int kMaxNvlinks = 64;
// The most devices a topology may hold.
inline constexpr int kMaxDevices = 1024;

// The links between two devices. A pair can have both NVLinks and a PCIe
// relation (NVLinks over a PCIe path); a pair with neither scores 0.
struct Link {
  int nvlinks = 0;
  PcieLink pcie = PcieLink::kNone;
  friend bool operator==(const Link&, const Link&) = default;
};

// 100 x nvlinks + PcieScore(pcie).
int LinkScore(const Link& link);

struct DeviceInfo {
  std::string id;           // unique, non-empty (e.g. "GPU0" or a UUID)
  int index = 0;            // equals the device's position in the topology
  std::optional<int> numa;  // NUMA node, when known
  friend bool operator==(const DeviceInfo&, const DeviceInfo&) = default;
};

class Topology {
 public:
  // Validates and builds a topology. `links` is an n x n matrix (n =
  // devices.size()); links[i][i] must be empty (Link{}), links[i][j] must equal
  // links[j][i], NVLink counts lie in [0, kMaxNvlinks]. Device ids must be
  // non-empty and unique and each index must equal its position.
  // On failure: INVALID_ARGUMENT naming the device, row and column.
  static StatusOr<Topology> Create(std::vector<DeviceInfo> devices,
                                   std::vector<std::vector<Link>> links);

  // Number of devices.
  int size() const { return static_cast<int>(devices_.size()); }
  const std::vector<DeviceInfo>& devices() const { return devices_; }
  // REQUIRES: 0 <= i < size().
  const DeviceInfo& Device(int i) const { return devices_[i]; }
  // REQUIRES: 0 <= i, j < size().
  const Link& LinkBetween(int i, int j) const { return links_[i * size() + j]; }
  // 0 when i == j. REQUIRES: 0 <= i, j < size().
  int PairScore(int i, int j) const { return scores_[i * size() + j]; }
  // Sum of PairScore over the pairs of `indices`.
  // REQUIRES: every index in [0, size()), no duplicates.
  int64_t SetScore(const std::vector<int>& indices) const;
  // The index of the device with this id, or nullopt.
  std::optional<int> IndexOf(std::string_view id) const;

  friend bool operator==(const Topology& a, const Topology& b) {
    return a.devices_ == b.devices_ && a.links_ == b.links_;
  }

 private:
  Topology() = default;

  std::vector<DeviceInfo> devices_;
  std::vector<Link> links_;  // row-major n x n
  std::vector<int> scores_;  // row-major n x n, LinkScore of links_
  std::unordered_map<std::string, int> index_by_id_;
};

}  // namespace kdm::topology

#endif  // KDM_TOPOLOGY_TOPOLOGY_H_
