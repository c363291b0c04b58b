// Fuzz target: kdm's JSON topology reader (topology/parse.h).
//
// Properties of every accepted input:
// - the matrix is symmetric with an empty diagonal and scores are LinkScore;
// - RenderTopologyJson parses back to an equal Topology (ids, NUMA nodes,
//   NVLinks and PCIe relations), and ParseTopology detects it as JSON;
// - the nvidia-smi rendering of it parses (the two formats agree on what a
//   topology can be).
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
  for (int i = 0; i < t.size(); ++i) {
    FUZZ_CHECK(t.Device(i).index == i, "device " << i << " has index " << t.Device(i).index);
    FUZZ_CHECK(!t.Device(i).id.empty(), "device " << i << " has an empty id");
    FUZZ_CHECK(t.LinkBetween(i, i) == Link{}, "diagonal " << i << " is not empty");
    for (int j = 0; j < t.size(); ++j) {
      FUZZ_CHECK(t.LinkBetween(i, j) == t.LinkBetween(j, i),
                 "link " << i << "," << j << " is not symmetric");
      FUZZ_CHECK(t.PairScore(i, j) == (i == j ? 0 : kdm::topology::LinkScore(t.LinkBetween(i, j))),
                 "score at " << i << "," << j);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  kdm::StatusOr<Topology> t = kdm::topology::ParseTopologyJson(text);
  if (!t.ok()) {
    FUZZ_CHECK(!t.status().message().empty(), "an error without a message");
    return 0;
  }
  CheckShape(*t);
  FUZZ_CHECK(text.find('\0') == std::string_view::npos, "accepted a text with a NUL byte");

  std::string json = kdm::topology::RenderTopologyJson(*t);
  kdm::StatusOr<Topology> back = kdm::topology::ParseTopologyJson(json);
  FUZZ_CHECK(back.ok(), "the rendering does not parse: " << back.status() << "\n" << json);
  FUZZ_CHECK(*back == *t, "the rendering parses to another topology:\n" << json);
  kdm::StatusOr<Topology> detected = kdm::topology::ParseTopology(json);
  FUZZ_CHECK(detected.ok() && *detected == *t, "ParseTopology does not read the rendering");

  if (t->size() > 0) {
    std::string smi = kdm::topology::RenderNvidiaSmi(*t);
    kdm::StatusOr<Topology> from_smi = kdm::topology::ParseNvidiaSmiTopo(smi);
    FUZZ_CHECK(from_smi.ok(), "the nvidia-smi rendering does not parse: " << from_smi.status()
                                                                          << "\n"
                                                                          << smi);
    FUZZ_CHECK(from_smi->size() == t->size(), "the nvidia-smi rendering changed the size");
  }
  return 0;
}
