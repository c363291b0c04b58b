#include "kdm/topology/parse.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

namespace kdm::topology {
namespace {

// One matrix cell: the diagonal marker, or a link.
struct Cell {
  bool diagonal = false;
  Link link;
};

// Parses "X", "NV<n>", a PCIe name or "-". nullopt for anything else.
std::optional<Cell> ParseCell(std::string_view s) {
  if (s == "X") return Cell{true, {}};
  if (s == "-") return Cell{false, {}};
  if (s.size() > 2 && s.substr(0, 2) == "NV") {
    std::string_view digits = s.substr(2);
    int n = 0;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec != std::errc() || ptr != digits.data() + digits.size() || n < 1 || n > kMaxNvlinks) {
      return std::nullopt;
    }
    return Cell{false, {n, PcieLink::kNone}};
  }
  if (auto p = ParsePcieLink(s)) return Cell{false, {0, *p}};
  return std::nullopt;
}

std::string Quote(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 40)) {
    out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  }
  if (s.size() > 40) out += "...";
  return out + "'";
}

std::string CellName(const Cell& c) {
  if (c.diagonal) return "X";
  if (c.link.nvlinks > 0) return "NV" + std::to_string(c.link.nvlinks);
  return std::string(PcieLinkName(c.link.pcie));
}

std::vector<std::string_view> SplitWhitespace(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    size_t start = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "GPU0", "GPU15".
bool IsGpuLabel(std::string_view s) {
  return s.size() > 3 && s.substr(0, 3) == "GPU" && AllDigits(s.substr(3));
}

// A matrix label: letters, digits and '_', ending in a digit ("GPU0", "NIC1",
// "mlx5_0").
bool IsMatrixLabel(std::string_view s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0])) ||
      !std::isdigit(static_cast<unsigned char>(s.back()))) {
    return false;
  }
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

std::optional<int> ParseInt(std::string_view s) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

enum class ExtraColumn { kCpuAffinity, kNumaAffinity, kGpuNumaId, kOther };

// Builds links from a matrix of cells, checking the diagonal and symmetry.
// `name(i, j)` describes a cell for error messages.
template <typename NameFn>
StatusOr<std::vector<std::vector<Link>>> CheckedLinks(const std::vector<std::vector<Cell>>& cells,
                                                      NameFn name) {
  const size_t n = cells.size();
  std::vector<std::vector<Link>> links(n, std::vector<Link>(n));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const Cell& c = cells[i][j];
      if (i == j && !c.diagonal) {
        return InvalidArgumentError(name(i, j) + " is on the diagonal and must be 'X', got " +
                                    Quote(CellName(c)));
      }
      if (i != j && c.diagonal) {
        return InvalidArgumentError(name(i, j) + " is 'X' off the diagonal");
      }
      if (i < j && !(c.link == cells[j][i].link)) {
        return InvalidArgumentError(name(i, j) + " is " + Quote(CellName(c)) + " but " +
                                    name(j, i) + " is " + Quote(CellName(cells[j][i])) +
                                    " (the matrix must be symmetric)");
      }
      links[i][j] = c.link;
    }
  }
  return links;
}

}  // namespace

StatusOr<Topology> ParseNvidiaSmiTopo(std::string_view text) {
  const std::string_view kWhat = "nvidia-smi topo: ";
  std::vector<std::string_view> lines;
  {
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos) end = text.size();
      lines.push_back(text.substr(start, end - start));
      start = end + 1;
    }
  }
  // The header is the first line whose first word is a GPU label.
  size_t header = lines.size();
  for (size_t i = 0; i < lines.size(); ++i) {
    auto words = SplitWhitespace(lines[i]);
    if (!words.empty() && words[0] == "Legend:") break;
    if (!words.empty() && IsGpuLabel(words[0])) {
      header = i;
      break;
    }
  }
  if (header == lines.size()) {
    return InvalidArgumentError(std::string(kWhat) +
                                "no header line with GPU columns (expected a "
                                "line starting with 'GPU0')");
  }
  auto head = SplitWhitespace(lines[header]);
  std::vector<std::string> columns;
  size_t w = 0;
  while (w < head.size() && IsMatrixLabel(head[w])) columns.emplace_back(head[w++]);
  std::vector<ExtraColumn> extras;
  while (w < head.size()) {
    auto is = [&](std::initializer_list<std::string_view> seq) {
      size_t k = 0;
      for (std::string_view s : seq) {
        if (w + k >= head.size() || head[w + k] != s) return false;
        ++k;
      }
      return true;
    };
    if (is({"CPU", "Affinity"})) {
      extras.push_back(ExtraColumn::kCpuAffinity);
      w += 2;
    } else if (is({"NUMA", "Affinity"})) {
      extras.push_back(ExtraColumn::kNumaAffinity);
      w += 2;
    } else if (is({"GPU", "NUMA", "ID"})) {
      extras.push_back(ExtraColumn::kGpuNumaId);
      w += 3;
    } else {
      extras.push_back(ExtraColumn::kOther);
      w += 1;
    }
  }
  std::map<std::string, size_t> column_of;
  std::vector<size_t> gpu_columns;  // positions in `columns` of the GPUs
  for (size_t c = 0; c < columns.size(); ++c) {
    if (!column_of.emplace(columns[c], c).second) {
      return InvalidArgumentError(std::string(kWhat) + "line " + std::to_string(header + 1) +
                                  ": column " + columns[c] + " appears twice in the header");
    }
    if (IsGpuLabel(columns[c])) gpu_columns.push_back(c);
  }
  const size_t n = gpu_columns.size();

  // Rows, keyed by label: the cells under each GPU column and the NUMA node.
  std::map<std::string, std::pair<std::vector<Cell>, std::optional<int>>> rows;
  for (size_t li = header + 1; li < lines.size(); ++li) {
    auto words = SplitWhitespace(lines[li]);
    if (words.empty()) continue;
    if (words[0] == "Legend:" || words[0] == "Legend") break;
    std::string where = std::string(kWhat) + "line " + std::to_string(li + 1);
    std::string label(words[0]);
    if (!column_of.count(label)) {
      return InvalidArgumentError(where + ": row " + Quote(label) +
                                  " is not a column of the header");
    }
    where += " (row " + label + ")";
    if (words.size() < columns.size() + 1) {
      return InvalidArgumentError(where + ": " + std::to_string(words.size() - 1) +
                                  " cells, expected " + std::to_string(columns.size()));
    }
    if (!IsGpuLabel(label)) continue;  // NIC rows: skipped.
    if (rows.count(label)) return InvalidArgumentError(where + ": row appears twice");
    std::vector<Cell> cells;
    for (size_t g : gpu_columns) {
      std::string_view s = words[1 + g];
      auto cell = ParseCell(s);
      if (!cell) {
        return InvalidArgumentError(where + ", column " + columns[g] + ": unknown cell " +
                                    Quote(s));
      }
      cells.push_back(*cell);
    }
    std::optional<int> numa;
    for (size_t e = 0; e < extras.size(); ++e) {
      size_t pos = 1 + columns.size() + e;
      if (pos >= words.size()) break;
      if (extras[e] == ExtraColumn::kNumaAffinity) {
        if (auto v = ParseInt(words[pos]); v && *v >= 0) numa = *v;
      }
    }
    rows[label] = {std::move(cells), numa};
  }
  if (n == 0) {
    return InvalidArgumentError(std::string(kWhat) + "the header names no GPU column");
  }
  std::vector<DeviceInfo> devices;
  std::vector<std::vector<Cell>> cells;
  for (size_t i = 0; i < n; ++i) {
    const std::string& label = columns[gpu_columns[i]];
    auto it = rows.find(label);
    if (it == rows.end()) {
      return InvalidArgumentError(std::string(kWhat) + "column " + label + " has no row");
    }
    devices.push_back({label, static_cast<int>(i), it->second.second});
    cells.push_back(it->second.first);
  }
  auto name = [&](size_t i, size_t j) {
    return "row " + devices[i].id + ", column " + devices[j].id;
  };
  auto links = CheckedLinks(cells, name);
  if (!links.ok()) return links.status().WithPrefix(kWhat.substr(0, kWhat.size() - 2));
  auto t = Topology::Create(std::move(devices), std::move(*links));
  if (!t.ok()) return t.status().WithPrefix(kWhat.substr(0, kWhat.size() - 2));
  return t;
}

CellGridView CellViews(const std::vector<std::vector<std::string>>& grid) {
  CellGridView out;
  out.reserve(grid.size());
  for (const auto& row : grid) out.emplace_back(row.begin(), row.end());
  return out;
}

StatusOr<std::vector<std::vector<Link>>> LinksFromCells(const CellGridView& matrix,
                                                        const CellGridView& pcie, bool has_pcie) {
  const size_t n = matrix.size();
  if (n == 0) return InvalidArgumentError("matrix is empty");
  if (n > static_cast<size_t>(kMaxDevices)) {
    return InvalidArgumentError("matrix has " + std::to_string(n) + " rows, above the limit of " +
                                std::to_string(kMaxDevices));
  }
  for (const auto* grid : {&matrix, &pcie}) {
    if (grid == &pcie && !has_pcie) continue;
    const char* key = grid == &matrix ? "matrix" : "pcie";
    if (grid->size() != n) {
      return InvalidArgumentError(std::string(key) + " has " + std::to_string(grid->size()) +
                                  " rows, expected " + std::to_string(n));
    }
    for (size_t i = 0; i < n; ++i) {
      if ((*grid)[i].size() != n) {
        return InvalidArgumentError(std::string(key) + "[" + std::to_string(i) + "] has " +
                                    std::to_string((*grid)[i].size()) + " cells, expected " +
                                    std::to_string(n) + " (the matrix must be square)");
      }
    }
  }
  std::vector<std::vector<Cell>> cells(n, std::vector<Cell>(n));
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      auto c = ParseCell(matrix[i][j]);
      if (!c) {
        return InvalidArgumentError("matrix[" + std::to_string(i) + "][" + std::to_string(j) +
                                    "]: unknown cell " + Quote(matrix[i][j]) +
                                    " (expected X, NV#, SYS, NODE, PHB, PXB, PIX, PSB or -)");
      }
      cells[i][j] = *c;
    }
  }
  if (has_pcie) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        std::string at = "pcie[" + std::to_string(i) + "][" + std::to_string(j) + "]";
        auto c = ParseCell(pcie[i][j]);
        if (!c || c->link.nvlinks > 0) {
          return InvalidArgumentError(at + ": unknown cell " + Quote(pcie[i][j]) +
                                      " (expected X, SYS, NODE, PHB, PXB, PIX, PSB or -)");
        }
        if (i == j) {
          if (!c->diagonal && pcie[i][j] != "-") {
            return InvalidArgumentError(at + " is on the diagonal and must be 'X' or '-'");
          }
          continue;
        }
        if (c->diagonal) return InvalidArgumentError(at + " is 'X' off the diagonal");
        PcieLink p = c->link.pcie;
        if (p == PcieLink::kNone) continue;
        Cell& cell = cells[i][j];
        if (cell.link.nvlinks == 0 && cell.link.pcie != PcieLink::kNone && cell.link.pcie != p) {
          return InvalidArgumentError(at + " is " + Quote(pcie[i][j]) + " but matrix[" +
                                      std::to_string(i) + "][" + std::to_string(j) + "] is " +
                                      Quote(matrix[i][j]));
        }
        cell.link.pcie = p;
      }
    }
  }
  auto name = [](size_t i, size_t j) {
    return "cell [" + std::to_string(i) + "][" + std::to_string(j) + "]";
  };
  return CheckedLinks(cells, name);
}

StatusOr<Topology> ParseTopologyJson(std::string_view text) {
  using nlohmann::json;
  const std::string kWhat = "topology JSON: ";
  // nlohmann's parser takes a NUL byte for the end of the input: refuse it
  // rather than ignore what follows.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return InvalidArgumentError(kWhat + "a NUL byte at offset " + std::to_string(nul));
  }
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return InvalidArgumentError(kWhat + e.what());
  }
  if (!doc.is_object()) return InvalidArgumentError(kWhat + "the top level must be an object");
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (it.key() != "devices" && it.key() != "matrix" && it.key() != "pcie") {
      return InvalidArgumentError(kWhat + "unknown key " + Quote(it.key()) +
                                  " (expected devices, matrix, pcie)");
    }
  }
  if (!doc.contains("matrix")) return InvalidArgumentError(kWhat + "missing key 'matrix'");

  auto read_matrix = [&](const char* key,
                         size_t want) -> StatusOr<std::vector<std::vector<std::string>>> {
    const json& m = doc[key];
    if (!m.is_array()) return InvalidArgumentError(kWhat + key + " must be an array of rows");
    if (m.size() != want) {
      return InvalidArgumentError(kWhat + key + " has " + std::to_string(m.size()) +
                                  " rows, expected " + std::to_string(want));
    }
    std::vector<std::vector<std::string>> out;
    for (size_t i = 0; i < m.size(); ++i) {
      const json& row = m[i];
      std::string at = kWhat + key + "[" + std::to_string(i) + "]";
      if (!row.is_array()) return InvalidArgumentError(at + " must be an array of cells");
      if (row.size() != want) {
        return InvalidArgumentError(at + " has " + std::to_string(row.size()) +
                                    " cells, expected " + std::to_string(want) +
                                    " (the matrix must be square)");
      }
      out.emplace_back();
      for (size_t j = 0; j < row.size(); ++j) {
        if (!row[j].is_string()) {
          return InvalidArgumentError(at + "[" + std::to_string(j) + "] must be a string");
        }
        out.back().push_back(row[j].get<std::string>());
      }
    }
    return out;
  };

  const json& m = doc["matrix"];
  if (!m.is_array()) return InvalidArgumentError(kWhat + "matrix must be an array of rows");
  const size_t n = m.size();
  if (n == 0) return InvalidArgumentError(kWhat + "matrix is empty");
  if (n > static_cast<size_t>(kMaxDevices)) {
    return InvalidArgumentError(kWhat + "matrix has " + std::to_string(n) +
                                " rows, above the limit of " + std::to_string(kMaxDevices));
  }
  KDM_ASSIGN_OR_RETURN(auto matrix, read_matrix("matrix", n));

  std::vector<DeviceInfo> devices;
  if (doc.contains("devices")) {
    const json& d = doc["devices"];
    if (!d.is_array()) return InvalidArgumentError(kWhat + "devices must be an array");
    if (d.size() != n) {
      return InvalidArgumentError(kWhat + "devices has " + std::to_string(d.size()) +
                                  " entries but matrix has " + std::to_string(n) + " rows");
    }
    for (size_t i = 0; i < n; ++i) {
      std::string at = kWhat + "devices[" + std::to_string(i) + "]";
      if (!d[i].is_object()) return InvalidArgumentError(at + " must be an object");
      DeviceInfo info;
      info.index = static_cast<int>(i);
      for (auto it = d[i].begin(); it != d[i].end(); ++it) {
        if (it.key() == "id") {
          if (!it->is_string()) return InvalidArgumentError(at + ".id must be a string");
          info.id = it->get<std::string>();
        } else if (it.key() == "numa") {
          if (it->is_null()) continue;
          if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1 << 20) {
            return InvalidArgumentError(at + ".numa must be a non-negative integer or null");
          }
          info.numa = it->get<int>();
        } else {
          return InvalidArgumentError(at + ": unknown key " + Quote(it.key()) +
                                      " (expected id, numa)");
        }
      }
      if (info.id.empty()) return InvalidArgumentError(at + ".id is missing or empty");
      devices.push_back(std::move(info));
    }
  } else {
    for (size_t i = 0; i < n; ++i) devices.push_back({std::to_string(i), static_cast<int>(i), {}});
  }

  std::optional<std::vector<std::vector<std::string>>> pcie;
  if (doc.contains("pcie")) {
    KDM_ASSIGN_OR_RETURN(pcie, read_matrix("pcie", n));
  }
  auto links =
      LinksFromCells(CellViews(matrix), pcie ? CellViews(*pcie) : CellGridView{}, pcie.has_value());
  if (!links.ok()) return links.status().WithPrefix("topology JSON");
  auto t = Topology::Create(std::move(devices), std::move(*links));
  if (!t.ok()) return t.status().WithPrefix("topology JSON");
  return t;
}

StatusOr<Topology> ParseTopology(std::string_view text) {
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (c == '{' || c == '[') return ParseTopologyJson(text);
    break;
  }
  return ParseNvidiaSmiTopo(text);
}

StatusOr<Topology> LoadTopologyFile(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    return NotFoundError("topology file '" + path + "' does not exist");
  }
  if (!fs::is_regular_file(st)) {
    return InvalidArgumentError("topology file '" + path + "' is not a regular file");
  }
  uintmax_t bytes = fs::file_size(path, ec);
  if (ec) {
    return InvalidArgumentError("topology file '" + path +
                                "': cannot read its size: " + ec.message());
  }
  if (bytes > kMaxTopologyFileBytes) {
    return InvalidArgumentError("topology file '" + path + "' is " + std::to_string(bytes) +
                                " bytes, above the limit of " +
                                std::to_string(kMaxTopologyFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError("topology file '" + path + "' cannot be opened");
  std::string text;
  text.resize(bytes);
  in.read(text.data(), static_cast<std::streamsize>(bytes));
  text.resize(static_cast<size_t>(in.gcount()));
  auto t = ParseTopology(text);
  if (!t.ok()) return t.status().WithPrefix("topology file '" + path + "'");
  return t;
}

namespace {

std::string CellText(const Topology& t, int i, int j) {
  if (i == j) return " X ";
  const Link& l = t.LinkBetween(i, j);
  if (l.nvlinks > 0) return "NV" + std::to_string(l.nvlinks);
  return std::string(PcieLinkName(l.pcie));
}

}  // namespace

std::string RenderNvidiaSmi(const Topology& t) { return RenderNvidiaSmi(t, {}); }

std::string RenderNvidiaSmi(const Topology& t, const std::vector<std::string>& cpu_affinity) {
  std::ostringstream out;
  const int n = t.size();
  const bool cpus = !cpu_affinity.empty();
  for (int j = 0; j < n; ++j) out << "\tGPU" << j;
  out << (cpus ? "\tCPU Affinity" : "") << "\tNUMA Affinity\n";
  for (int i = 0; i < n; ++i) {
    out << "GPU" << i;
    for (int j = 0; j < n; ++j) out << "\t" << CellText(t, i, j);
    if (cpus) {
      const std::string& c = i < static_cast<int>(cpu_affinity.size()) ? cpu_affinity[i] : "";
      out << "\t" << (c.empty() ? "N/A" : c);
    }
    out << "\t";
    if (t.Device(i).numa) {
      out << *t.Device(i).numa;
    } else {
      out << "N/A";
    }
    out << "\n";
  }
  out << "\nLegend:\n\n"
         "  X    = the device itself\n"
         "  SYS  = through PCIe and the link between NUMA nodes (score 10)\n"
         "  NODE = through PCIe and between host bridges of one NUMA node (20)\n"
         "  PHB  = through PCIe and one host bridge (30)\n"
         "  PXB  = through several PCIe bridges, no host bridge (40)\n"
         "  PIX  = through at most one PCIe bridge (50)\n"
         "  PSB  = on one board, through its PCIe switch (60)\n"
         "  NV#  = a bonded set of # NVLinks (100 each)\n"
         "  -    = no known link (0)\n";
  return out.str();
}

TopologyCells RenderCells(const Topology& t) {
  const int n = t.size();
  TopologyCells out;
  out.matrix.assign(n, std::vector<std::string>(n));
  out.pcie.assign(n, std::vector<std::string>(n));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) {
        out.matrix[i][j] = "X";
        out.pcie[i][j] = "X";
        continue;
      }
      const Link& l = t.LinkBetween(i, j);
      out.matrix[i][j] =
          l.nvlinks > 0 ? "NV" + std::to_string(l.nvlinks) : std::string(PcieLinkName(l.pcie));
      out.pcie[i][j] = std::string(PcieLinkName(l.pcie));
    }
  }
  return out;
}

std::string RenderTopologyJson(const Topology& t) {
  using nlohmann::json;
  const int n = t.size();
  json doc;
  doc["devices"] = json::array();

  for (int i = 0; i < n; ++i) {
    json d = {{"id", t.Device(i).id}};
    d["numa"] = t.Device(i).numa ? json(*t.Device(i).numa) : json(nullptr);
    doc["devices"].push_back(d);
  }
  TopologyCells cells = RenderCells(t);
  doc["matrix"] = cells.matrix;
  doc["pcie"] = cells.pcie;
  return doc.dump() + "\n";
}

}  // namespace kdm::topology
