// kdm::nvml::AllocateAnswerBuilder: what the NVML GPU plugin answers to
// Allocate for one container, in plain C++ (the plugin turns it into the wire
// message). Given the plugin's GPUs (UUID and minor number) and a device root:
//  - env NVIDIA_VISIBLE_DEVICES=<uuid,uuid,...>, in the order asked;
//  - device nodes /dev/nvidia<minor> for each GPU, then /dev/nvidiactl,
//    /dev/nvidia-uvm and /dev/nvidia-uvm-tools, each of those three only when
//    it exists under the device root (`--dev-root`, default "/": a plugin in a
//    container sees the host's /dev under a mount). The paths in the answer
//    are the host's (/dev/...), never prefixed with the root;
//  - with CDI, the names nvidia.com/gpu=<uuid> (the CDI kind is the resource
//    name).
//
// Thread-safety: immutable after construction; Answer may be called from any
// thread (it only stats files, through kdm::Env).
//
// Example:
//   AllocateAnswerBuilder b({{"GPU-1a2b...", 0}}, {.dev_root = "/host"});
//   StatusOr<AllocateAnswer> a = b.Answer({"GPU-1a2b..."});
#ifndef KDM_NVML_ALLOCATE_ANSWER_H_
#define KDM_NVML_ALLOCATE_ANSWER_H_

#include <map>
#include <string>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/base/status.h"

namespace kdm::nvml {

inline constexpr char kVisibleDevicesEnv[] = "NVIDIA_VISIBLE_DEVICES";
// The control nodes every CUDA container needs besides its GPUs' nodes.
inline constexpr const char* kNvidiaControlNodes[] = {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                                      "/dev/nvidia-uvm-tools"};

// One GPU as Allocate needs it.
struct GpuNode {
  std::string uuid;
  unsigned minor = 0;  // /dev/nvidia<minor>
};

struct AllocateAnswer {
  std::map<std::string, std::string> envs;
  // Host paths, mounted at the same path in the container, permissions "rw".
  std::vector<std::string> device_nodes;
  std::vector<std::string> cdi_devices;
};

struct AllocateAnswerOptions {
  // Where the host's /dev is seen (the control nodes are looked for at
  // <dev_root>/dev/...). Default "/".
  std::string dev_root = "/";
  bool cdi = false;
  // The CDI kind "<vendor>/<class>".
  std::string cdi_kind = "nvidia.com/gpu";
  // The OS seam the control nodes are looked up through. Not owned.
  Env* env = Env::Default();
};

class AllocateAnswerBuilder {
 public:
  AllocateAnswerBuilder(std::vector<GpuNode> gpus, AllocateAnswerOptions options);

  // The answer for `ids` (GPU UUIDs). INVALID_ARGUMENT for no id or an id
  // listed twice, NOT_FOUND naming an id that is not one of the GPUs.
  StatusOr<AllocateAnswer> Answer(const std::vector<std::string>& ids) const;

 private:
  std::map<std::string, unsigned> minors_;
  AllocateAnswerOptions options_;
};

}  // namespace kdm::nvml

#endif  // KDM_NVML_ALLOCATE_ANSWER_H_
