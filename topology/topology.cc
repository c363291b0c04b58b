#include "kdm/topology/topology.h"

#include <utility>

namespace kdm::topology {

int PcieScore(PcieLink link) {
  switch (link) {
    case PcieLink::kNone:
      return 0;
    case PcieLink::kSys:
      return 10;
    case PcieLink::kNode:
      return 20;
    case PcieLink::kPhb:
      return 30;
    case PcieLink::kPxb:
      return 40;
    case PcieLink::kPix:
      return 50;
    case PcieLink::kPsb:
      return 60;
  }
  return 0;
}

std::string_view PcieLinkName(PcieLink link) {
  switch (link) {
    case PcieLink::kNone:
      return "-";
    case PcieLink::kSys:
      return "SYS";
    case PcieLink::kNode:
      return "NODE";
    case PcieLink::kPhb:
      return "PHB";
    case PcieLink::kPxb:
      return "PXB";
    case PcieLink::kPix:
      return "PIX";
    case PcieLink::kPsb:
      return "PSB";
  }
  return "-";
}

std::optional<PcieLink> ParsePcieLink(std::string_view name) {
  if (name == "SYS" || name == "SOC") return PcieLink::kSys;
  if (name == "NODE") return PcieLink::kNode;
  if (name == "PHB") return PcieLink::kPhb;
  if (name == "PXB") return PcieLink::kPxb;
  if (name == "PIX") return PcieLink::kPix;
  if (name == "PSB") return PcieLink::kPsb;
  return std::nullopt;
}

int LinkScore(const Link& link) { return kNvlinkScore * link.nvlinks + PcieScore(link.pcie); }

namespace {

std::string Describe(const Link& link) {
  std::string out;
  if (link.nvlinks != 0) out = "NV" + std::to_string(link.nvlinks);
  if (link.pcie != PcieLink::kNone || out.empty()) {
    if (!out.empty()) out += "+";
    out += PcieLinkName(link.pcie);
  }
  return out;
}

}  // namespace

StatusOr<Topology> Topology::Create(std::vector<DeviceInfo> devices,
                                    std::vector<std::vector<Link>> links) {
  const size_t n = devices.size();
  if (n == 0) return InvalidArgumentError("topology has no devices");
  if (n > static_cast<size_t>(kMaxDevices)) {
    return InvalidArgumentError("topology has " + std::to_string(n) +
                                " devices, above the limit of " + std::to_string(kMaxDevices));
  }
  Topology t;
  for (size_t i = 0; i < n; ++i) {
    const DeviceInfo& d = devices[i];
    if (d.id.empty()) {
      return InvalidArgumentError("device at position " + std::to_string(i) + " has an empty id");
    }
    if (d.index != static_cast<int>(i)) {
      return InvalidArgumentError("device '" + d.id + "' at position " + std::to_string(i) +
                                  " has index " + std::to_string(d.index));
    }
    auto [it, inserted] = t.index_by_id_.emplace(d.id, static_cast<int>(i));
    if (!inserted) {
      return InvalidArgumentError("duplicate device id '" + d.id + "' at positions " +
                                  std::to_string(it->second) + " and " + std::to_string(i));
    }
  }
  if (links.size() != n) {
    return InvalidArgumentError("link matrix has " + std::to_string(links.size()) + " rows for " +
                                std::to_string(n) + " devices");
  }
  for (size_t i = 0; i < n; ++i) {
    if (links[i].size() != n) {
      return InvalidArgumentError("link matrix row " + std::to_string(i) + " ('" + devices[i].id +
                                  "') has " + std::to_string(links[i].size()) +
                                  " columns, expected " + std::to_string(n));
    }
  }
  auto where = [&](size_t i, size_t j) {
    return "link (" + std::to_string(i) + ", " + std::to_string(j) + ") ('" + devices[i].id +
           "', '" + devices[j].id + "')";
  };
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const Link& l = links[i][j];
      if (i == j && !(l == Link{})) {
        return InvalidArgumentError(where(i, j) +
                                    " is on the diagonal and must be empty, "
                                    "got " +
                                    Describe(l));
      }
      if (l.nvlinks < 0 || l.nvlinks > kMaxNvlinks) {
        return InvalidArgumentError(where(i, j) + " has " + std::to_string(l.nvlinks) +
                                    " NVLinks, outside [0, " + std::to_string(kMaxNvlinks) + "]");
      }
      if (!(l == links[j][i])) {
        return InvalidArgumentError(where(i, j) + " is " + Describe(l) + " but " + where(j, i) +
                                    " is " + Describe(links[j][i]) +
                                    " (the matrix must be symmetric)");
      }
    }
  }
  t.devices_ = std::move(devices);
  t.links_.reserve(n * n);
  t.scores_.reserve(n * n);
  for (auto& row : links) {
    for (const Link& l : row) {
      t.links_.push_back(l);
      t.scores_.push_back(LinkScore(l));
    }
  }
  return t;
}

int64_t Topology::SetScore(const std::vector<int>& indices) const {
  int64_t sum = 0;
  for (size_t a = 0; a < indices.size(); ++a) {
    for (size_t b = a + 1; b < indices.size(); ++b) {
      sum += PairScore(indices[a], indices[b]);
    }
  }
  return sum;
}

std::optional<int> Topology::IndexOf(std::string_view id) const {
  auto it = index_by_id_.find(std::string(id));
  if (it == index_by_id_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kdm::topology
