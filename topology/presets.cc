#include "kdm/topology/presets.h"

#include <functional>
#include <utility>

namespace kdm::topology {
namespace {

using Matrix = std::vector<std::vector<Link>>;

Matrix Empty(int n) { return Matrix(n, std::vector<Link>(n)); }

void SetNv(Matrix& m, int a, int b, int nvlinks) {
  m[a][b].nvlinks = nvlinks;
  m[b][a].nvlinks = nvlinks;
}

void SetPcie(Matrix& m, int a, int b, PcieLink p) {
  m[a][b].pcie = p;
  m[b][a].pcie = p;
}

std::vector<DeviceInfo> Gpus(int n, const std::function<std::optional<int>(int)>& numa) {
  std::vector<DeviceInfo> out;
  for (int i = 0; i < n; ++i) out.push_back({"GPU" + std::to_string(i), i, numa(i)});
  return out;
}

// Two sockets of n/2 GPUs; GPUs 2k and 2k+1 share a PCIe switch (`pair`);
// groups of `group` GPUs share `group_link`; the rest of a socket is `socket`,
// across sockets SYS.
void TwoSocketPcie(Matrix& m, int n, PcieLink pair, int group, PcieLink group_link,
                   PcieLink socket) {
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) {
      PcieLink p = PcieLink::kSys;
      if (a / (n / 2) == b / (n / 2)) p = socket;
      if (a / group == b / group) p = group_link;
      if (a / 2 == b / 2) p = pair;
      SetPcie(m, a, b, p);
    }
  }
}

// DGX-1 (P100 and V100): two sockets of four GPUs. Within a socket GPUs
// `pix_a` share a PCIe switch (PIX) and the other pairs meet at the host
// bridge (PHB); across sockets SYS.
void Dgx1Pcie(Matrix& m, std::pair<int, int> pix_a, std::pair<int, int> pix_b) {
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      if (a / 4 != b / 4) {
        SetPcie(m, a, b, PcieLink::kSys);
        continue;
      }
      int x = a % 4, y = b % 4;
      bool pix = (x == pix_a.first && y == pix_a.second) || (x == pix_b.first && y == pix_b.second);
      SetPcie(m, a, b, pix ? PcieLink::kPix : PcieLink::kPhb);
    }
  }
}

auto HalfNuma(int n) {
  return [n](int i) -> std::optional<int> { return i < n / 2 ? 0 : 1; };
}

Topology MustCreate(std::vector<DeviceInfo> d, Matrix m) {
  // Presets are constants: a failure here is a bug caught by presets_test.
  return std::move(Topology::Create(std::move(d), std::move(m))).value();
}

Topology Dgx1P100() {
  Matrix m = Empty(8);
  // Hybrid cube-mesh: each GPU has four single NVLinks.
  const int nv[][2] = {{0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 2}, {1, 3}, {1, 5}, {2, 3},
                       {2, 6}, {3, 7}, {4, 5}, {4, 6}, {4, 7}, {5, 6}, {5, 7}, {6, 7}};
  for (auto& p : nv) SetNv(m, p[0], p[1], 1);
  Dgx1Pcie(m, {0, 2}, {1, 3});
  return MustCreate(Gpus(8, HalfNuma(8)), std::move(m));
}

Topology Dgx1V100() {
  Matrix m = Empty(8);
  // Hybrid cube-mesh with six NVLinks per GPU: some pairs are bonded twice.
  const int nv[][3] = {{0, 1, 1}, {0, 2, 1}, {0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 3, 1},
                       {1, 5, 2}, {2, 3, 2}, {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1},
                       {4, 7, 2}, {5, 6, 2}, {5, 7, 1}, {6, 7, 2}};
  for (auto& p : nv) SetNv(m, p[0], p[1], p[2]);
  Dgx1Pcie(m, {0, 1}, {2, 3});
  return MustCreate(Gpus(8, HalfNuma(8)), std::move(m));
}

Topology AllPairs(int n, int nvlinks, PcieLink pair, int group, PcieLink group_link,
                  PcieLink socket) {
  Matrix m = Empty(n);
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) SetNv(m, a, b, nvlinks);
  }
  TwoSocketPcie(m, n, pair, group, group_link, socket);
  return MustCreate(Gpus(n, HalfNuma(n)), std::move(m));
}

Topology Pcie8Gpu() {
  Matrix m = Empty(8);
  TwoSocketPcie(m, 8, PcieLink::kPix, 2, PcieLink::kPix, PcieLink::kNode);
  return MustCreate(Gpus(8, HalfNuma(8)), std::move(m));
}

Topology Rtx4xBridged() {
  Matrix m = Empty(4);
  SetNv(m, 0, 3, 2);
  SetNv(m, 1, 2, 2);
  SetPcie(m, 0, 1, PcieLink::kNode);
  SetPcie(m, 2, 3, PcieLink::kNode);
  SetPcie(m, 0, 2, PcieLink::kSys);
  SetPcie(m, 1, 3, PcieLink::kSys);
  return MustCreate(Gpus(4, HalfNuma(4)), std::move(m));
}

struct Entry {
  PresetInfo info;
  std::function<Topology()> make;
};

const std::vector<Entry>& Entries() {
  static const std::vector<Entry>* entries = new std::vector<Entry>{
      {{"dgx1-p100", 8, "DGX-1 with 8 Tesla P100: hybrid cube-mesh of single NVLinks, two sockets",
        "NVIDIA DGX-1 system architecture white paper (Pascal); go-gpuallocator "
        "test fixture NewDGX1PascalNode"},
       Dgx1P100},
      {{"dgx1-v100", 8,
        "DGX-1 with 8 Tesla V100: hybrid cube-mesh with NV1 and NV2 pairs, two sockets",
        "NVIDIA DGX-1 with Tesla V100 system architecture white paper; "
        "go-gpuallocator test fixture NewDGX1VoltaNode"},
       Dgx1V100},
      {{"dgx-a100", 8,
        "DGX A100: 8 A100 behind NVSwitch, NV12 between every pair; PCIe beneath modelled",
        "NVIDIA DGX A100 user guide (12 NVLinks per GPU to six NVSwitches); PCIe "
        "beneath: pairs share a switch (PXB), same socket NODE, across SYS"},
       [] { return AllPairs(8, 12, PcieLink::kPxb, 2, PcieLink::kPxb, PcieLink::kNode); }},
      {{"hgx-h100", 8, "HGX H100 8-GPU: NVSwitch, NV18 between every pair; PCIe beneath modelled",
        "NVIDIA HGX H100 / DGX H100 documentation (18 NVLinks per GPU); PCIe "
        "beneath: one switch per GPU pair (PIX), same socket NODE, across SYS"},
       [] { return AllPairs(8, 18, PcieLink::kPix, 2, PcieLink::kPix, PcieLink::kNode); }},
      {{"pcie-8gpu", 8, "Dual-socket PCIe server, 8 GPUs, two GPUs per PCIe switch, no NVLink",
        "common 4U GPU server layout as `nvidia-smi topo -m` shows it: PIX within "
        "a switch, NODE within a socket, SYS across sockets"},
       Pcie8Gpu},
      {{"rtx-4x-bridged", 4,
        "4x Quadro RTX 8000 in two NVLink-bridged pairs (0-3, 1-2), two sockets",
        "go-gpuallocator test fixture New4xRTX8000Node (NVLink pairs carry no "
        "PCIe relation there, as here)"},
       Rtx4xBridged},
      {{"dgx2-16", 16,
        "DGX-2: 16 V100 behind NVSwitch, NV6 between every pair; PCIe beneath modelled",
        "NVIDIA DGX-2 system architecture white paper (6 NVLinks per GPU to "
        "NVSwitches); PCIe beneath: pairs PIX, groups of four PXB, same socket "
        "NODE, across SYS"},
       [] { return AllPairs(16, 6, PcieLink::kPix, 4, PcieLink::kPxb, PcieLink::kNode); }},
  };
  return *entries;
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> out;
  for (const Entry& e : Entries()) out.push_back(e.info.name);
  return out;
}

std::vector<PresetInfo> PresetInfos() {
  std::vector<PresetInfo> out;
  for (const Entry& e : Entries()) out.push_back(e.info);
  return out;
}

StatusOr<Topology> Preset(std::string_view name) {
  std::string known;
  for (const Entry& e : Entries()) {
    if (e.info.name == name) return e.make();
    known += (known.empty() ? "" : ", ") + e.info.name;
  }
  return NotFoundError("unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace kdm::topology
