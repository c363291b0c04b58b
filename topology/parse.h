// Reading and writing topologies: the text of `nvidia-smi topo -m`, kdm's JSON
// format, and a file loader that detects which one it holds.
//
// Text: the GPU rows and columns of the matrix are read; `X` marks the
// diagonal, `NV#` bonded NVLinks, `SYS` (or the older `SOC`), `NODE`, `PHB`,
// `PXB`, `PIX`, `PSB` the PCIe relation and `-` a pair with no known link. NIC
// rows and columns are skipped, the `CPU Affinity`, `NUMA Affinity` and
// `GPU NUMA ID` columns are recognised (NUMA Affinity gives each GPU's NUMA
// node), everything from `Legend:` on is ignored, spaces and tabs are both
// separators. Device ids are the row labels ("GPU0", ...).
//
// JSON:
//   {"devices": [{"id": "GPU-0", "numa": 0}, ...],      (optional)
//    "matrix": [["X", "NV1", ...], ...],                 (nvidia-smi cells)
//    "pcie":   [["X", "PIX", ...], ...]}                 (optional)
// `pcie` gives the PCIe relation beneath pairs whose `matrix` cell is `NV#`;
// where `matrix` already names a PCIe relation, `pcie` must agree or be "-".
// Without `devices` the ids are "0" ... "n-1" and no NUMA node is known.
//
// Every error is INVALID_ARGUMENT (NOT_FOUND for a missing file) and names the
// line, row and column, or the JSON path, that was wrong.
//
// Thread-safety: free functions without shared state; safe from any thread.
//
// Example:
//   kdm::StatusOr<Topology> t = LoadTopologyFile("/tmp/topo.txt");
//   if (!t.ok()) { std::cerr << t.status() << "\n"; return 1; }
//   std::cout << RenderNvidiaSmi(*t);
#ifndef KDM_TOPOLOGY_PARSE_H_
#define KDM_TOPOLOGY_PARSE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/topology/topology.h"

namespace kdm::topology {

// The largest topology file LoadTopologyFile reads.
inline constexpr uint64_t kMaxTopologyFileBytes = 4 << 20;

StatusOr<Topology> ParseNvidiaSmiTopo(std::string_view text);
StatusOr<Topology> ParseTopologyJson(std::string_view text);
// JSON when the first non-blank character is '{' or '[', nvidia-smi text
// otherwise.
StatusOr<Topology> ParseTopology(std::string_view text);
// Reads and parses a file. NOT_FOUND when it does not exist; INVALID_ARGUMENT
// when it is not a regular file, is larger than kMaxTopologyFileBytes or does
// not parse. Messages start with the path.
StatusOr<Topology> LoadTopologyFile(const std::string& path);

// The matrix as `nvidia-smi topo -m` prints it (GPU<i> labels, NV# cells where
// a pair has NVLinks, the PCIe relation otherwise, a NUMA Affinity column and
// a legend). ParseNvidiaSmiTopo reads it back; ids and the PCIe relation
// beneath NVLink cells are not part of the text format.
std::string RenderNvidiaSmi(const Topology& topology);
// The same with a `CPU Affinity` column before `NUMA Affinity`, as
// nvidia-smi prints on a real node: cpu_affinity[i] is device i's CPU list
// ("0-55,112-167"; "" prints N/A). ParseNvidiaSmiTopo skips the column.
// REQUIRES: cpu_affinity.size() == topology.size().
std::string RenderNvidiaSmi(const Topology& topology, const std::vector<std::string>& cpu_affinity);
// kdm's JSON format (devices with ids and NUMA nodes, matrix, pcie);
// ParseTopologyJson reads it back to an equal Topology.
std::string RenderTopologyJson(const Topology& topology);

// The cells of kdm's JSON format, with no JSON text in between: what
// RenderTopologyJson writes as `matrix` (X, NV#, a PCIe name or -) and
// `pcie` (the PCIe relation beneath every pair), row by row.
using CellGrid = std::vector<std::vector<std::string>>;
using CellGridView = std::vector<std::vector<std::string_view>>;
struct TopologyCells {
  CellGrid matrix;
  CellGrid pcie;
};
TopologyCells RenderCells(const Topology& topology);
CellGridView CellViews(const CellGrid& grid);

// The links of n = matrix.size() devices from their cells, checked as
// ParseTopologyJson checks them: 1..kMaxDevices rows, n x n, known cells,
// X on the diagonal only, symmetric, `pcie` (when has_pcie) agreeing with
// `matrix`. Topology::Create(devices, links) makes the topology.
// INVALID_ARGUMENT naming "matrix[i][j]", "pcie[i][j]" or "cell [i][j]".
StatusOr<std::vector<std::vector<Link>>> LinksFromCells(const CellGridView& matrix,
                                                        const CellGridView& pcie, bool has_pcie);

}  // namespace kdm::topology

#endif  // KDM_TOPOLOGY_PARSE_H_
