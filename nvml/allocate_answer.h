// kdm::nvml::AllocateAnswerBuilder: what the NVML GPU plugin answers to
// Allocate for one container, in plain C++ (the plugin turns it into the wire
// message), in the shapes NVIDIA's k8s-device-plugin answers. Given the
// plugin's GPUs (UUID, NVML index and minor number):
//  - the ids handed to the container runtime are the UUIDs, or with
//    DeviceIdStrategy::kIndex the GPUs' NVML indices ("0", "3"), in the
//    order asked (the ids the kubelet sees stay UUIDs either way);
//  - DeviceListStrategies say how they are handed over, any mix of:
//    envvar: env NVIDIA_VISIBLE_DEVICES=<id,id,...>;
//    volume_mounts: env NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices
//      and one mount per GPU, host path /dev/null, container path
//      /var/run/nvidia-container-devices/<id> (it wins over envvar's value);
//    cdi_annotations: one annotation <prefix>nvidia-device-plugin_<response
//      id> = "<kind>=<id>,<kind>=<id>,..." (prefix default "cdi.k8s.io/");
//    cdi_cri: the CDI names <kind>=<id> in the answer's CDI devices field;
//  - device nodes (NVIDIA's "device specs", with pass_device_specs):
//    /dev/nvidia<minor> per GPU, then /dev/nvidiactl, /dev/nvidia-uvm and
//    /dev/nvidia-uvm-tools, each of those three only when it exists under
//    `dev_root` (`--dev-root`, default "/": a plugin in a container sees the
//    host's /dev under a mount). The container path is /dev/...; the host
//    path is the same under `host_dev_root` (NVIDIA_DEV_ROOT, default "/":
//    a driver container keeps its nodes under /run/nvidia/driver/dev);
//  - when every strategy is a CDI one, the answer has no env, mount or
//    device node at all: the CDI spec carries them (NVIDIA's rule).
//
// Thread-safety: immutable after construction; Answer may be called from any
// thread (it only stats files, through kdm::Env, and calls response_id).
//
// Example:
//   AllocateAnswerBuilder b({{"GPU-1a2b...", 0, 0}}, {.dev_root = "/host"});
//   StatusOr<AllocateAnswer> a = b.Answer({"GPU-1a2b..."});
#ifndef KDM_NVML_ALLOCATE_ANSWER_H_
#define KDM_NVML_ALLOCATE_ANSWER_H_

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/base/status.h"

namespace kdm::nvml {

inline constexpr char kVisibleDevicesEnv[] = "NVIDIA_VISIBLE_DEVICES";
// The control nodes every CUDA container needs besides its GPUs' nodes.
inline constexpr const char* kNvidiaControlNodes[] = {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                                      "/dev/nvidia-uvm-tools"};
// volume-mounts: NVIDIA's container toolkit reads the device list from the
// names of the mounts under this directory.
inline constexpr char kDeviceListMountRoot[] = "/var/run/nvidia-container-devices";
inline constexpr char kDeviceListMountHostPath[] = "/dev/null";
// cdi-annotations: the key is <prefix><plugin>_<response id>.
inline constexpr char kDefaultCdiAnnotationPrefix[] = "cdi.k8s.io/";
inline constexpr char kCdiAnnotationPlugin[] = "nvidia-device-plugin";

// DEVICE_ID_STRATEGY: what names a GPU toward the container runtime.
enum class DeviceIdStrategy { kUuid, kIndex };

// DEVICE_LIST_STRATEGY: how the ids reach the container runtime.
struct DeviceListStrategies {
  bool envvar = true;
  bool volume_mounts = false;
  bool cdi_annotations = false;
  bool cdi_cri = false;

  bool AnyCdi() const { return cdi_annotations || cdi_cri; }
  bool OnlyCdi() const { return !envvar && !volume_mounts; }
};

// "uuid" or "index"; INVALID_ARGUMENT naming the value otherwise.
StatusOr<DeviceIdStrategy> ParseDeviceIdStrategy(std::string_view text);
// A comma-separated list of envvar, volume-mounts, cdi-annotations and
// cdi-cri (at least one; repeats allowed, as NVIDIA's). INVALID_ARGUMENT
// naming the first unknown or empty entry.
StatusOr<DeviceListStrategies> ParseDeviceListStrategies(std::string_view text);
// "envvar,cdi-cri": the set in the flag's own words.
std::string DeviceListStrategiesName(const DeviceListStrategies& s);
// A CDI annotation prefix: a DNS-1123 subdomain followed by '/'
// ("cdi.k8s.io/"). INVALID_ARGUMENT saying what is wrong otherwise.
Status CheckCdiAnnotationPrefix(std::string_view prefix);

// One GPU as Allocate needs it.
struct GpuNode {
  std::string uuid;
  unsigned minor = 0;  // /dev/nvidia<minor>
  int index = 0;       // NVML's index, the id under DeviceIdStrategy::kIndex
};

struct DeviceNode {
  std::string container_path;  // /dev/nvidia0
  std::string host_path;       // <host_dev_root>/dev/nvidia0
};

struct ContainerMount {
  std::string container_path;
  std::string host_path;
};

struct AllocateAnswer {
  std::map<std::string, std::string> envs;
  std::vector<ContainerMount> mounts;
  // Permissions "rw".
  std::vector<DeviceNode> device_nodes;
  std::map<std::string, std::string> annotations;
  std::vector<std::string> cdi_devices;
};

struct AllocateAnswerOptions {
  // Where the host's /dev is seen (the control nodes are looked for at
  // <dev_root>/dev/...). Default "/".
  std::string dev_root = "/";
  // Where the device nodes are on the host: the host path of /dev/x is
  // <host_dev_root>/dev/x. Default "/".
  std::string host_dev_root = "/";
  DeviceIdStrategy id_strategy = DeviceIdStrategy::kUuid;
  DeviceListStrategies list{};
  // Device nodes in the answer (off: only what the list strategies add).
  bool pass_device_specs = true;
  // The CDI kind "<vendor>/<class>".
  std::string cdi_kind = "nvidia.com/gpu";
  std::string cdi_annotation_prefix = kDefaultCdiAnnotationPrefix;
  // The annotation key's response id, one per answer. Empty: a random
  // UUID (version 4), as NVIDIA's plugin.
  std::function<std::string()> response_id = nullptr;
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
  std::map<std::string, GpuNode> gpus_;
  AllocateAnswerOptions options_;
};

}  // namespace kdm::nvml

#endif  // KDM_NVML_ALLOCATE_ANSWER_H_
