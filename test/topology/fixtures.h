// Test fixtures: the link matrices of NVIDIA go-gpuallocator's public test
// nodes (4x RTX 8000 bridged, DGX-1 P100, DGX-1 V100), rebuilt from the facts
// (which pairs have how many NVLinks, which PCIe relation), with no NUMA
// nodes, as in those fixtures.
#ifndef KDM_TEST_TOPOLOGY_FIXTURES_H_
#define KDM_TEST_TOPOLOGY_FIXTURES_H_

#include <tuple>
#include <vector>

#include "kdm/topology/topology.h"

namespace kdm::topology::testing {

inline Topology Build(int n, const std::vector<std::tuple<int, int, int>>& nvlinks,
                      const std::vector<std::tuple<int, int, PcieLink>>& pcie) {
  std::vector<DeviceInfo> devices;
  for (int i = 0; i < n; ++i) devices.push_back({"GPU" + std::to_string(i), i, std::nullopt});
  std::vector<std::vector<Link>> links(n, std::vector<Link>(n));
  for (auto [a, b, k] : nvlinks) {
    links[a][b].nvlinks = links[b][a].nvlinks = k;
  }
  for (auto [a, b, p] : pcie) {
    links[a][b].pcie = links[b][a].pcie = p;
  }
  return std::move(Topology::Create(devices, links)).value();
}

// 0-3 and 1-2 bridged with two NVLinks (no PCIe relation recorded for them);
// 0-1 and 2-3 on one CPU, 0-2 and 1-3 across CPUs.
inline Topology Rtx8000x4() {
  return Build(4, {{0, 3, 2}, {1, 2, 2}},
               {{0, 1, PcieLink::kNode},
                {2, 3, PcieLink::kNode},
                {0, 2, PcieLink::kSys},
                {1, 3, PcieLink::kSys}});
}

inline std::vector<std::tuple<int, int, PcieLink>> Dgx1Pcie(std::pair<int, int> pix1,
                                                            std::pair<int, int> pix2) {
  std::vector<std::tuple<int, int, PcieLink>> out;
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      if (a / 4 != b / 4) {
        out.push_back({a, b, PcieLink::kSys});
        continue;
      }
      std::pair<int, int> p{a % 4, b % 4};
      out.push_back({a, b, (p == pix1 || p == pix2) ? PcieLink::kPix : PcieLink::kPhb});
    }
  }
  return out;
}

inline Topology Dgx1Pascal() {
  std::vector<std::tuple<int, int, int>> nv;
  for (auto [a, b] : std::vector<std::pair<int, int>>{{0, 1},
                                                      {0, 2},
                                                      {0, 3},
                                                      {0, 4},
                                                      {1, 2},
                                                      {1, 3},
                                                      {1, 5},
                                                      {2, 3},
                                                      {2, 6},
                                                      {3, 7},
                                                      {4, 5},
                                                      {4, 6},
                                                      {4, 7},
                                                      {5, 6},
                                                      {5, 7},
                                                      {6, 7}}) {
    nv.push_back({a, b, 1});
  }
  return Build(8, nv, Dgx1Pcie({0, 2}, {1, 3}));
}

inline Topology Dgx1Volta() {
  return Build(8,
               {{0, 1, 1},
                {0, 2, 1},
                {0, 3, 2},
                {0, 4, 2},
                {1, 2, 2},
                {1, 3, 1},
                {1, 5, 2},
                {2, 3, 2},
                {2, 6, 1},
                {3, 7, 1},
                {4, 5, 1},
                {4, 6, 1},
                {4, 7, 2},
                {5, 6, 2},
                {5, 7, 1},
                {6, 7, 2}},
               Dgx1Pcie({0, 1}, {2, 3}));
}

}  // namespace kdm::topology::testing

#endif  // KDM_TEST_TOPOLOGY_FIXTURES_H_
