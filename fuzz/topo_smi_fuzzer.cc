// Fuzz target: the `nvidia-smi topo -m` text parser (topology/parse.h).
//
// Properties of every accepted input:
// - the matrix is square and symmetric, the diagonal is empty, NVLink counts
//   lie in [0, kMaxNvlinks], each pair's score is LinkScore of its link;
// - RenderNvidiaSmi parses back to the same devices' NVLinks, PCIe relation
//   (where no NVLink hides it) and NUMA nodes, and rendering that again
//   gives the same text (the text form is a fixed point);
// - ParseTopology (format detection) agrees when the text does not start
//   like JSON.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kdm/topology/parse.h"

namespace {

using kdm::topology::Link;
using kdm::topology::Topology;

void CheckShape(const Topology& t) {
  FUZZ_CHECK(t.size() > 0, "a parsed topology has no device");
  for (int i = 0; i < t.size(); ++i) {
    FUZZ_CHECK(t.Device(i).index == i, "device " << i << " has index " << t.Device(i).index);
    FUZZ_CHECK(t.LinkBetween(i, i) == Link{}, "diagonal " << i << " is not empty");
    FUZZ_CHECK(t.IndexOf(t.Device(i).id) == i, "IndexOf(" << t.Device(i).id << ") != " << i);
    for (int j = 0; j < t.size(); ++j) {
      const Link& a = t.LinkBetween(i, j);
      FUZZ_CHECK(a == t.LinkBetween(j, i), "link " << i << "," << j << " is not symmetric");
      FUZZ_CHECK(a.nvlinks >= 0 && a.nvlinks <= kdm::topology::kMaxNvlinks,
                 "nvlinks " << a.nvlinks << " at " << i << "," << j);
      FUZZ_CHECK(t.PairScore(i, j) == (i == j ? 0 : kdm::topology::LinkScore(a)),
                 "score at " << i << "," << j);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  kdm::StatusOr<Topology> t = kdm::topology::ParseNvidiaSmiTopo(text);
  if (!t.ok()) {
    FUZZ_CHECK(!t.status().message().empty(), "an error without a message");
    return 0;
  }
  CheckShape(*t);

  std::string rendered = kdm::topology::RenderNvidiaSmi(*t);
  kdm::StatusOr<Topology> back = kdm::topology::ParseNvidiaSmiTopo(rendered);
  FUZZ_CHECK(back.ok(), "the rendering does not parse: " << back.status() << "\n" << rendered);
  CheckShape(*back);
  FUZZ_CHECK(back->size() == t->size(), "size " << t->size() << " came back as " << back->size());
  for (int i = 0; i < t->size(); ++i) {
    FUZZ_CHECK(back->Device(i).numa == t->Device(i).numa, "NUMA node of device " << i);
    for (int j = 0; j < t->size(); ++j) {
      const Link& a = t->LinkBetween(i, j);
      const Link& b = back->LinkBetween(i, j);
      FUZZ_CHECK(a.nvlinks == b.nvlinks, "nvlinks at " << i << "," << j);
      if (a.nvlinks == 0) FUZZ_CHECK(a.pcie == b.pcie, "PCIe relation at " << i << "," << j);
    }
  }
  FUZZ_CHECK(kdm::topology::RenderNvidiaSmi(*back) == rendered, "rendering is not a fixed point:\n"
                                                                    << rendered);

  // ParseTopology's blank is isspace(): \v and \f too.
  size_t first = text.find_first_not_of(" \t\r\n\v\f");
  if (first != std::string_view::npos && text[first] != '{' && text[first] != '[') {
    kdm::StatusOr<Topology> detected = kdm::topology::ParseTopology(text);
    FUZZ_CHECK(detected.ok() && *detected == *t, "ParseTopology disagrees");
  }
  return 0;
}
