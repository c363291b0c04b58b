// `kdm publish` end to end: `--dry-run` against a real `kdm kubelet` with a
// `kdm plugin` serving the dgx1-v100 preset, read through the kubelet's
// pod-resources socket; admitting and deleting a pod changes `available`;
// the annotation decodes with the library's strict decoder. Bad flags (an
// unknown preset, a bad RESOURCE=SOURCE, an ids file with the wrong row
// count, path tricks) are clear errors with exit 2 (usage) or 1 (runtime).
// Writing to an API server is publish_apiserver_e2e_test.cc's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/test/e2e/kubelet_fixture.h"
#include "kdm/topology/presets.h"

namespace kdm::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class PublishE2eTest : public KubeletE2eTest {
 protected:
  std::string Socket() const { return root_ + "/pod-resources/kubelet.sock"; }

  // Runs `kdm publish` with `args` after the common ones; returns the exit
  // code, stdout in out_ and stderr in err_.
  int Publish(std::vector<std::string> args, bool common = true) {
    std::vector<std::string> all = {"publish"};
    if (common) {
      all.insert(all.end(), {"--node-name", "gpu-node-7", "--pod-resources-socket", Socket()});
    }
    all.insert(all.end(), args.begin(), args.end());
    const std::string n = std::to_string(runs_++);
    Process p(all, root_ + "/publish" + n + ".out", root_ + "/publish" + n + ".err");
    std::optional<int> code = p.Wait();
    out_ = p.Out();
    err_ = p.Err();
    return code.value_or(-1);
  }
  k8s::DevicesAnnotation DryRun(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--topology", "nvidia.com/gpu=preset:dgx1-v100", "--dry-run"};
    args.insert(args.end(), extra.begin(), extra.end());
    EXPECT_EQ(Publish(args), 0) << err_;
    StatusOr<k8s::DevicesAnnotation> a = k8s::DecodeDevicesAnnotation(out_);
    EXPECT_TRUE(a.ok()) << a.status() << "\n" << out_;
    return a.ok() ? *a : k8s::DevicesAnnotation{};
  }
  void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

  int runs_ = 0;
  std::string out_, err_;
};

TEST_F(PublishE2eTest, DryRunShowsTheDemoNodeAndAdmissionsChangeAvailable) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();

  k8s::DevicesAnnotation a = DryRun({"--attributes",
                                     "nvidia.com/gpu=model=Tesla V100-SXM2-16GB,memory_mib=16160,"
                                     "driver=535.161.08,cuda=12.2,arch=7.0,brand=tesla"});
  EXPECT_EQ(a.node, "gpu-node-7");
  EXPECT_EQ(out_.find('\n'), out_.size() - 1) << "one line";
  ASSERT_EQ(a.resources.count(kGpu), 1u) << out_;
  const k8s::ResourceDevices& gpu = a.resources[kGpu];
  ASSERT_EQ(gpu.devices.size(), 8u);
  EXPECT_EQ(gpu.devices[0].id, "GPU0");
  EXPECT_EQ(gpu.devices[0].numa, 0);
  EXPECT_EQ(gpu.devices[7].numa, 1);
  EXPECT_EQ(gpu.available.size(), 8u);
  ASSERT_TRUE(gpu.topology.has_value());
  EXPECT_EQ(*gpu.topology, *topology::Preset("dgx1-v100"));
  ASSERT_TRUE(gpu.attributes.has_value());
  EXPECT_EQ(gpu.attributes->cuda, "12.2");
  EXPECT_EQ(gpu.attributes->memory_mib, 16160);
  EXPECT_THAT(out_, HasSubstr(R"("matrix":[["X","NV1","NV1","NV2","NV2","SYS","SYS","SYS"])"));
  // No pod holds a GPU: `pods` is there, empty; no --plugin-policy, no policy.
  EXPECT_EQ(a.pods, std::vector<uint64_t>{}) << out_;
  EXPECT_EQ(gpu.policy, std::nullopt) << out_;

  // Admit a 2-GPU pod: the packed policy gives it an NV2 pair, which leaves
  // `available`.
  WriteFileAtomically(Manifests() + "/train.yaml", PodYaml("train", 2));
  std::vector<std::string> held = Gpus(WaitPhase("default_train", "Admitted"));
  ASSERT_EQ(held.size(), 2u);
  a = DryRun({"--plugin-policy", "nvidia.com/gpu=packed"});
  EXPECT_EQ(a.pods, std::vector<uint64_t>{k8s::PodFingerprint("default", "train")}) << out_;
  const k8s::ResourceDevices& after = a.resources[kGpu];
  EXPECT_EQ(after.policy, topology::Policy::kPacked) << out_;
  EXPECT_EQ(after.devices.size(), 8u);
  ASSERT_EQ(after.available.size(), 6u) << out_;
  for (const std::string& id : held) {
    EXPECT_EQ(std::count(after.available.begin(), after.available.end(), id), 0) << id;
  }
  EXPECT_FALSE(after.attributes.has_value());

  // Delete it: everything is available again.
  fs::remove(Manifests() + "/train.yaml");
  ASSERT_TRUE(WaitUntil([&] { return DryRun().resources[kGpu].available.size() == 8; }, kWaitBound))
      << out_;
}

TEST_F(PublishE2eTest, IdsFileMapsTextTopologyRowsToDeviceIds) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();
  // The preset as `nvidia-smi topo -m` prints it, rows GPU0..GPU7; the ids
  // file names them in another order to prove the mapping is by index.
  {
    Process show({"topo", "show", "--preset", "dgx1-v100"}, root_ + "/topo.txt", root_ + "/t.err");
    ASSERT_EQ(show.Wait(), 0) << show.Err();
  }
  std::string csv;
  for (int i = 7; i >= 0; --i) csv += std::to_string(i) + ", GPU" + std::to_string(i) + "\n";
  WriteText(root_ + "/ids.csv", csv);
  ASSERT_EQ(Publish({"--topology", "nvidia.com/gpu=" + root_ + "/topo.txt", "--ids",
                     "nvidia.com/gpu=" + root_ + "/ids.csv", "--dry-run"}),
            0)
      << err_;
  auto a = k8s::DecodeDevicesAnnotation(out_);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->resources[kGpu].topology.has_value()) << err_;
  EXPECT_EQ(a->resources[kGpu].devices[3].id, "GPU3");
  EXPECT_EQ(a->resources[kGpu].topology->LinkBetween(0, 3).nvlinks, 2);

  // Without --ids the text rows are GPU0.. too here; with ids that do not
  // match the plugin's, the matrix is dropped with a warning.
  std::string other;
  for (int i = 0; i < 8; ++i) other += std::to_string(i) + ", GPU-uuid-" + std::to_string(i) + "\n";
  WriteText(root_ + "/other.csv", other);
  ASSERT_EQ(Publish({"--topology", "nvidia.com/gpu=" + root_ + "/topo.txt", "--ids",
                     "nvidia.com/gpu=" + root_ + "/other.csv", "--dry-run"}),
            0)
      << err_;
  EXPECT_THAT(err_, HasSubstr("warning: nvidia.com/gpu: device 'GPU0' is allocatable but not in "
                              "the topology: published without a matrix"));
  EXPECT_THAT(out_, Not(HasSubstr("\"matrix\"")));
}

TEST_F(PublishE2eTest, BadFlagsAreClearErrors) {
  StartKubelet();
  WriteText(root_ + "/topo.json", "{\"matrix\": [[\"X\", \"NV1\"], [\"NV1\", \"X\"]]}");
  WriteText(root_ + "/short.csv", "0, GPU-a\n");
  WriteText(root_ + "/dup.csv", "0, GPU-a\n0, GPU-b\n");
  WriteText(root_ + "/past.csv", "0, GPU-a\n2, GPU-b\n");
  WriteText(root_ + "/same.csv", "0, GPU-a\n1, GPU-a\n");
  WriteText(root_ + "/noindex.csv", "GPU-a\nGPU-b\n");
  ASSERT_EQ(::mkfifo((root_ + "/fifo.csv").c_str(), 0600), 0);
  fs::create_directory(root_ + "/dir");
  const std::string topo = "nvidia.com/gpu=" + root_ + "/topo.json";
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--topology", "nvidia.com/gpu=preset:dgx9", "--dry-run"}, 2, "dgx9"},
      {{"--topology", "nvidia.com/gpu", "--dry-run"}, 2, "expected RESOURCE=SOURCE"},
      {{"--topology", "=preset:dgx1-v100", "--dry-run"}, 2, "expected RESOURCE=SOURCE"},
      {{"--topology", "gpu=preset:dgx1-v100", "--dry-run"}, 2, "is not an extended resource name"},
      {{"--topology", "nvidia.com/gpu=preset:dgx1-v100", "--topology",
        "nvidia.com/gpu=preset:dgx1-p100", "--dry-run"},
       2,
       "--topology: resource nvidia.com/gpu given twice"},
      {{"--topology", "nvidia.com/gpu=nvml", "--nvml-library", root_ + "/no-nvml.so", "--dry-run"},
       2,
       "no-nvml.so"},
      {{"--topology", "nvidia.com/gpu=" + root_ + "/missing.txt", "--dry-run"}, 1, "missing.txt"},
      {{"--topology", "nvidia.com/gpu=" + root_ + "/dir", "--dry-run"}, 1, "/dir"},
      {{"--topology",
        "nvidia.com/gpu=" + root_ + "/../" + fs::path(root_).filename().string() +
            "/nothing/../short.csv",
        "--dry-run"},
       1,
       "short.csv"},
      {{"--topology", topo, "--ids", "nvidia.com/gpu=" + root_ + "/short.csv", "--dry-run"},
       1,
       "short.csv: 1 rows, the topology has 2 devices"},
      {{"--topology", topo, "--ids", "nvidia.com/gpu=" + root_ + "/dup.csv", "--dry-run"},
       1,
       "line 2: index 0 given twice"},
      {{"--topology", topo, "--ids", "nvidia.com/gpu=" + root_ + "/past.csv", "--dry-run"},
       1,
       "line 2: index 2 is past the topology's 2 devices"},
      {{"--topology", topo, "--ids", "nvidia.com/gpu=" + root_ + "/same.csv", "--dry-run"},
       1,
       "GPU-a"},
      {{"--topology", topo, "--ids", "nvidia.com/gpu=" + root_ + "/noindex.csv", "--dry-run"},
       1,
       "line 1: expected INDEX, UUID"},
      {{"--topology", topo, "--ids", "nvidia.com/gpu=" + root_ + "/fifo.csv", "--dry-run"},
       1,
       "fifo.csv"},
      {{"--topology", topo, "--ids", "nvidia.com/gpu=" + root_ + "/dir", "--dry-run"}, 1, "/dir"},
      {{"--ids", "nvidia.com/gpu=" + root_ + "/short.csv", "--dry-run"},
       2,
       "no --topology for this resource"},
      {{"--plugin-policy", "nvidia.com/gpu", "--dry-run"}, 2, "expected RESOURCE=POLICY"},
      {{"--plugin-policy", "=packed", "--dry-run"}, 2, "expected RESOURCE=POLICY"},
      {{"--plugin-policy", "nvidia.com/gpu=", "--dry-run"}, 2, "expected RESOURCE=POLICY"},
      {{"--plugin-policy", "gpu=packed", "--dry-run"}, 2, "is not an extended resource name"},
      {{"--plugin-policy", "nvidia.com/gpu=Packed", "--dry-run"},
       2,
       "\"Packed\" is not a policy (packed, best-set or first-fit)"},
      {{"--plugin-policy", "nvidia.com/gpu=spread\nkdm: forged", "--dry-run"},
       2,
       "is not a policy"},
      {{"--plugin-policy", "nvidia.com/gpu=packed", "--plugin-policy", "nvidia.com/gpu=best-set",
        "--dry-run"},
       2,
       "--plugin-policy: resource nvidia.com/gpu given twice"},
      {{"--attributes", "nvidia.com/gpu=cuda=twelve", "--dry-run"}, 2, "not a version"},
      {{"--interval", "soon", "--dry-run"}, 2, "--interval"},
      {{"--resync", "0s", "--dry-run"}, 2, "--resync: must be more than 0"},
      {{"--context", "c1", "--in-cluster"}, 2, "--context and --in-cluster"},
      {{"--kubeconfig", root_ + "/kc", "--in-cluster"}, 2, "give one, not both"},
      {{"--kubeconfig", root_ + "/kc"}, 1, "--kubeconfig: kubeconfig " + root_ + "/kc"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(Publish(cases[i].args), cases[i].code) << i << ": " << err_;
    EXPECT_THAT(err_, HasSubstr("kdm publish: ")) << i;
    EXPECT_THAT(err_, HasSubstr(cases[i].message)) << i;
    EXPECT_TRUE(out_.empty()) << i << ": " << out_;
  }
  // The flags every run needs.
  EXPECT_EQ(Publish({"--dry-run"}, /*common=*/false), 2);
  EXPECT_THAT(err_, HasSubstr("--node-name is required"));
  EXPECT_EQ(Publish({"--node-name", "Bad_Node", "--pod-resources-socket", Socket(), "--dry-run"},
                    /*common=*/false),
            2);
  EXPECT_THAT(err_, HasSubstr("is not a DNS-1123 subdomain"));
  EXPECT_EQ(
      Publish({"--node-name", "n", "--pod-resources-socket", root_ + "/none.sock", "--dry-run"},
              /*common=*/false),
      1);
  EXPECT_THAT(err_, HasSubstr("none.sock does not exist"));
  EXPECT_EQ(Publish({"--node-name", "n", "--pod-resources-socket",
                     "/" + std::string(120, 'x') + "/kubelet.sock", "--dry-run"},
                    /*common=*/false),
            2);
  EXPECT_THAT(err_, HasSubstr("107 bytes"));
  EXPECT_EQ(
      Publish({"--node-name", "n", "--pod-resources-socket", root_ + "/topo.json", "--dry-run"},
              /*common=*/false),
      1);
  EXPECT_THAT(err_, HasSubstr("is not a socket"));
}

}  // namespace
}  // namespace kdm::e2e
