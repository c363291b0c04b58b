#include "kdm/checkpoint/kubelet_json_store.h"

#include <utility>

#include "kdm/base/env.h"
#include "kdm/checkpoint/data_ops.h"
#include "kdm/checkpoint/kubelet_json.h"
#include "kdm/checkpoint/quarantine.h"

namespace kdm::checkpoint {
namespace {

constexpr char kBootIdSuffix[] = ".boot-id";
constexpr size_t kMaxBootIdSize = 256;
// Read whole before the check above: a bigger file is corrupt all the same.
constexpr uint64_t kMaxBootIdFileBytes = 1 << 20;
// Private to the node agent's user (0600); the temporary file is named after
// the writer's pid, so that opening the store can remove a dead writer's.
constexpr AtomicWriteOptions kCheckpointWrite{.mode = 0600, .naming = TempFileNaming::kWriterPid};

class KubeletJsonStore final : public Store {
 public:
  KubeletJsonStore(std::string path, CheckpointData data, Env* env)
      : path_(std::move(path)), data_(std::move(data)), env_(env) {}

  StatusOr<CheckpointData> Load() override { return data_; }

  Status Apply(const Change& change) override {
    if (change.empty()) return OkStatus();
    CheckpointData next = data_;
    internal::ApplyChange(next, change);
    internal::NormalizeEntries(next);
    KDM_RETURN_IF_ERROR(Write(next));
    data_ = std::move(next);
    return OkStatus();
  }

  Status Replace(const CheckpointData& data) override {
    CheckpointData next = data;
    internal::NormalizeEntries(next);
    KDM_RETURN_IF_ERROR(Write(next));
    if (next.boot_id != data_.boot_id) KDM_RETURN_IF_ERROR(WriteBootId(next.boot_id));
    data_ = std::move(next);
    return OkStatus();
  }

  Status SetBootId(const std::string& boot_id) override {
    KDM_RETURN_IF_ERROR(WriteBootId(boot_id));
    data_.boot_id = boot_id;
    return OkStatus();
  }

  std::string Describe() const override { return "kubelet-json:" + path_; }

 private:
  Status Write(const CheckpointData& data) {
    return env_->WriteFileAtomically(path_, EncodeKubeletCheckpoint(data), kCheckpointWrite)
        .WithPrefix("write checkpoint");
  }

  Status WriteBootId(const std::string& boot_id) {
    return env_->WriteFileAtomically(path_ + kBootIdSuffix, boot_id, kCheckpointWrite)
        .WithPrefix("write boot id");
  }

  std::string path_;
  CheckpointData data_;
  Env* const env_;
};

// The boot id sidecar: empty when missing; DATA_LOSS when it cannot be a
// boot id.
StatusOr<std::string> ReadBootIdSidecar(Env& env, const std::string& path) {
  StatusOr<std::string> text = env.ReadFile(path, kMaxBootIdFileBytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::string();
    // Too big to be a boot id: corrupt, like any other non-boot-id content.
    if (text.status().code() == StatusCode::kOutOfRange) {
      return DataLossError("boot id file " + text.status().message() + ", more than a boot id");
    }
    return text.status();
  }
  std::string id = std::move(*text);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  if (id.size() > kMaxBootIdSize) {
    return DataLossError("boot id file " + path + " holds " + std::to_string(id.size()) +
                         " bytes, more than a boot id");
  }
  for (char c : id) {
    if (c < 0x21 || c > 0x7e)
      return DataLossError("boot id file " + path + " is not printable text");
  }
  return id;
}

// Reads and decodes the file: DATA_LOSS-worthy content errors are returned
// with `*content_error` set.
StatusOr<CheckpointData> ReadCheckpoint(const KubeletJsonOptions& options, bool* content_error) {
  *content_error = false;
  StatusOr<std::string> text =
      options.env->ReadFile(options.path, internal::kMaxCheckpointFileBytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound && options.create_if_missing) {
      return CheckpointData{};
    }
    if (text.status().code() == StatusCode::kNotFound) {
      return NotFoundError("no kubelet checkpoint file at " + options.path);
    }
    return text.status();
  }
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(*text);
  if (!data.ok()) {
    *content_error = true;
    return DataLossError(options.path + ": " + data.status().message());
  }
  internal::NormalizeEntries(*data);
  return data;
}

}  // namespace

StatusOr<OpenResult> OpenKubeletJsonStore(const KubeletJsonOptions& options) {
  if (options.path.empty()) return InvalidArgumentError("empty kubelet checkpoint path");
  if (options.env == nullptr) return InvalidArgumentError("KubeletJsonOptions.env is null");
  if (internal::IsDirectory(*options.env, options.path)) {
    return FailedPreconditionError("kubelet checkpoint " + options.path + " is a directory");
  }
  OpenResult result;
  // A kill -9 during Apply() or SetBootId() leaves "<file>.tmp-<pid>".
  for (const std::string& written : {options.path, options.path + kBootIdSuffix}) {
    StatusOr<std::vector<std::string>> removed =
        options.env->RemoveStaleTempFiles(written, TempFileNaming::kWriterPid);
    if (!removed.ok()) continue;  // the read below reports an unusable directory
    result.removed_temp_files.insert(result.removed_temp_files.end(), removed->begin(),
                                     removed->end());
  }
  bool content_error = false;
  StatusOr<CheckpointData> data = ReadCheckpoint(options, &content_error);
  if (!data.ok()) {
    if (!content_error || !options.quarantine_corrupt) return data.status();
    KDM_ASSIGN_OR_RETURN(result.quarantined_path,
                         internal::QuarantineFile(*options.env, options.path, {}));
    result.recovered =
        DataLossError(data.status().message() + "; moved aside to " + result.quarantined_path +
                      ", starting with an empty checkpoint");
    data = CheckpointData{};
  }
  const std::string boot_path = options.path + kBootIdSuffix;
  StatusOr<std::string> boot_id = ReadBootIdSidecar(*options.env, boot_path);
  if (!boot_id.ok()) {
    if (boot_id.status().code() != StatusCode::kDataLoss || !options.quarantine_corrupt) {
      return boot_id.status();
    }
    KDM_ASSIGN_OR_RETURN(std::string moved, internal::QuarantineFile(*options.env, boot_path, {}));
    std::string note = boot_id.status().message() + "; moved aside to " + moved;
    result.recovered = result.recovered.ok()
                           ? DataLossError(note)
                           : DataLossError(result.recovered.message() + "; " + note);
    boot_id = std::string();
  }
  data->boot_id = *boot_id;
  result.store = std::make_unique<KubeletJsonStore>(options.path, std::move(*data), options.env);
  return result;
}

StatusOr<OpenResult> OpenKubeletJsonStore(const std::string& path) {
  return OpenKubeletJsonStore(KubeletJsonOptions{.path = path});
}

StatusOr<CheckpointData> ReadKubeletCheckpointFile(const std::string& path, bool verify_checksum,
                                                   Env* env) {
  KDM_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path, internal::kMaxCheckpointFileBytes));
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(text, verify_checksum);
  if (!data.ok()) return data.status().WithPrefix(path);
  return data;
}

Status WriteKubeletCheckpointFile(const std::string& path, const CheckpointData& data, Env* env) {
  return env->WriteFileAtomically(path, EncodeKubeletCheckpoint(data), kCheckpointWrite);
}

}  // namespace kdm::checkpoint
