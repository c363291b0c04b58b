// `kdm checkpoint show|export|import`, driving the built binary
// ($KDM_BINARY_DIR/bin/kdm) as a user would.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "kdm/checkpoint/kubelet_json.h"
#include "kdm/checkpoint/paths.h"
#include "test_util.h"

namespace kdm::checkpoint {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;
using testing::TempDir;
using testing::TestdataCheckpoints;
using testing::TestdataDir;
using testing::WriteFile;

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string KdmBinary() {
  const char* dir = std::getenv("KDM_BINARY_DIR");
  return std::string(dir != nullptr ? dir : KDM_TEST_BINARY_DIR) + "/bin/kdm";
}

class CheckpointCli : public ::testing::Test {
 protected:
  Result Kdm(std::vector<std::string> args) {
    args.insert(args.begin(), KdmBinary());
    std::string out_path = tmp_.File("stdout"), err_path = tmp_.File("stderr");
    pid_t pid = ::fork();
    if (pid == 0) {
      int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(out, 1);
      ::dup2(err, 2);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    Result r;
    int status = 0;
    ::waitpid(pid, &status, 0);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = ReadFile(out_path);
    r.err = ReadFile(err_path);
    return r;
  }

  std::string Root() const { return root_.path(); }
  std::string Vector(const std::string& name) const { return TestdataDir() + "/" + name + ".json"; }

  // The store's state as `show -o json` prints it.
  nlohmann::json Show(const std::string& kind = "sqlite") {
    Result r = Kdm({"checkpoint", "show", "--root", Root(), "--checkpoint", kind, "-o", "json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    j.erase("store");
    return j;
  }

  TempDir root_;
  TempDir tmp_;
};

TEST_F(CheckpointCli, ImportThenExportGivesBackTheSameEntriesForEveryVector) {
  for (std::string kind : {"sqlite", "kubelet-json"}) {
    for (const std::string& name : TestdataCheckpoints()) {
      SCOPED_TRACE(kind + std::string(" ") + name);
      Result imp =
          Kdm({"checkpoint", "import", "--root", Root(), "--checkpoint", kind, Vector(name)});
      ASSERT_EQ(imp.exit_code, 0) << imp.err;
      EXPECT_THAT(imp.err, HasSubstr("imported"));
      std::string out = tmp_.File("exported");
      Result exp = Kdm({"checkpoint", "export", "--root", Root(), "--checkpoint", kind, out});
      ASSERT_EQ(exp.exit_code, 0) << exp.err;
      // The export verifies (a kubelet accepts it) and holds the same data.
      StatusOr<CheckpointData> original = DecodeKubeletCheckpoint(ReadFile(Vector(name)));
      StatusOr<CheckpointData> exported = DecodeKubeletCheckpoint(ReadFile(out));
      ASSERT_TRUE(original.ok()) << original.status();
      ASSERT_TRUE(exported.ok()) << exported.status();
      EXPECT_EQ(exported->entries, original->entries);
      EXPECT_EQ(exported->registered_devices, original->registered_devices);
      // The vectors are canonical: the export is byte-identical.
      std::string want = ReadFile(Vector(name));
      while (!want.empty() && want.back() == '\n') want.pop_back();
      EXPECT_EQ(ReadFile(out), want);
    }
  }
}

TEST_F(CheckpointCli, ExportToStdout) {
  ASSERT_EQ(Kdm({"checkpoint", "import", "--root", Root(), Vector("one-pod")}).exit_code, 0);
  Result r = Kdm({"checkpoint", "export", "--root", Root(), "-"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(r.out);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->entries.size(), 1u);
}

TEST_F(CheckpointCli, ShowPrintsPodsContainersResourcesAndDevices) {
  ASSERT_EQ(Kdm({"checkpoint", "import", "--root", Root(), Vector("multi")}).exit_code, 0);
  Result r = Kdm({"checkpoint", "show", "--root", Root()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("sqlite:" + CheckpointPath(Root(), StoreKind::kSqlite)));
  EXPECT_THAT(r.out, HasSubstr("pod uid-a"));
  EXPECT_THAT(r.out, HasSubstr("container main  resource nvidia.com/gpu  "
                               "devices numa=0:GPU-1 numa=1:GPU-5,GPU-4"));
  EXPECT_THAT(r.out, HasSubstr("devices numa=none:fpga-1"));
  EXPECT_THAT(r.out, HasSubstr("example.com/fpga: fpga-1 fpga-2"));

  nlohmann::json j = Show();
  ASSERT_EQ(j["entries"].size(), 3u);
  EXPECT_EQ(j["entries"][1]["device_ids"]["1"], nlohmann::json({"GPU-5", "GPU-4"}));
  EXPECT_EQ(j["entries"][1]["alloc_response"], "IgA=");
  EXPECT_EQ(j["registered_devices"]["nvidia.com/gpu"].size(), 5u);
}

TEST_F(CheckpointCli, BadFilesFailClearlyAndLeaveTheStoreUnchanged) {
  ASSERT_EQ(Kdm({"checkpoint", "import", "--root", Root(), Vector("multi")}).exit_code, 0);
  nlohmann::json before = Show();

  std::string valid = ReadFile(Vector("one-pod"));
  std::string bad_sum = valid;
  bad_sum.replace(bad_sum.find("4138818769"), 10, "1234");
  std::string bad_b64 = valid;
  bad_b64.replace(bad_b64.find("ChsK"), 4, "Ch$K");
  std::string wrong_type = valid;
  wrong_type.replace(wrong_type.find("\"cuda\""), 6, "[1]");
  struct {
    const char* name;
    std::string content;  // empty: use `path` as is
    std::string path;
    std::string want;
  } cases[] = {
      {"bad checksum", bad_sum, "",
       "checksum mismatch: the file says 1234, its data hashes to 4138818769"},
      {"bad base64", bad_b64, "", "Data.PodDeviceEntries[0].AllocResp: invalid base64 at byte 2"},
      {"wrong type", wrong_type, "",
       "Data.PodDeviceEntries[0].ContainerName: expected a string, got array"},
      {"truncated", valid.substr(0, 40), "", "not valid JSON"},
      {"missing", "", tmp_.File("does-not-exist"), "does-not-exist: No such file or directory"},
      {"directory", "", tmp_.path(), "is not a regular file"},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = c.path;
    if (path.empty()) {
      path = tmp_.File("bad.json");
      WriteFile(path, c.content);
    }
    Result r = Kdm({"checkpoint", "import", "--root", Root(), path});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr(c.want));
    EXPECT_EQ(Show(), before);
  }
  // The checksum hint, and --no-verify accepting what only fails the checksum.
  WriteFile(tmp_.File("bad.json"), bad_sum);
  Result hinted = Kdm({"checkpoint", "import", "--root", Root(), tmp_.File("bad.json")});
  EXPECT_THAT(hinted.err, HasSubstr("--no-verify"));
  Result forced =
      Kdm({"checkpoint", "import", "--root", Root(), "--no-verify", tmp_.File("bad.json")});
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_EQ(Show()["entries"].size(), 1u);
  // --no-verify does not accept a file that does not decode.
  WriteFile(tmp_.File("bad.json"), bad_b64);
  EXPECT_EQ(Kdm({"checkpoint", "import", "--root", Root(), "--no-verify", tmp_.File("bad.json")})
                .exit_code,
            1);
}

TEST_F(CheckpointCli, ShowAndExportOfAMissingOrCorruptStoreAreRuntimeErrors) {
  Result missing = Kdm({"checkpoint", "show", "--root", Root()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err,
              HasSubstr("no sqlite checkpoint at " + CheckpointPath(Root(), StoreKind::kSqlite)));
  Result exp = Kdm({"checkpoint", "export", "--root", Root(), "--checkpoint", "kubelet-json", "-"});
  EXPECT_EQ(exp.exit_code, 1);
  EXPECT_THAT(exp.err, HasSubstr("no kubelet-json checkpoint"));

  ASSERT_EQ(::mkdir((Root() + "/state").c_str(), 0755), 0);
  std::string db = CheckpointPath(Root(), StoreKind::kSqlite);
  WriteFile(db, std::string(5000, 'z'));
  Result corrupt = Kdm({"checkpoint", "show", "--root", Root()});
  EXPECT_EQ(corrupt.exit_code, 1);
  EXPECT_THAT(corrupt.err,
              HasSubstr("is not a database: it does not start with the SQLite header"));
  EXPECT_EQ(ReadFile(db), std::string(5000, 'z'));  // show moves nothing

  // import starts over: the bad file is moved aside and reported.
  Result imp = Kdm({"checkpoint", "import", "--root", Root(), Vector("one-pod")});
  EXPECT_EQ(imp.exit_code, 0) << imp.err;
  EXPECT_THAT(imp.err, HasSubstr("warning:"));
  EXPECT_THAT(imp.err, HasSubstr("moved aside to " + db + ".corrupt-"));
  EXPECT_EQ(testing::ListWithPrefix(Root() + "/state", "checkpoint.db.corrupt-").size(), 1u);
}

TEST_F(CheckpointCli, ExportFailureIsARuntimeError) {
  ASSERT_EQ(Kdm({"checkpoint", "import", "--root", Root(), Vector("one-pod")}).exit_code, 0);
  Result r = Kdm({"checkpoint", "export", "--root", Root(), tmp_.File("no/such/dir/out")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no/such/dir/out"));
}

TEST_F(CheckpointCli, UsageErrorsExitWith2) {
  struct {
    std::vector<std::string> args;
    const char* want;
  } const cases[] = {
      {{"checkpoint", "show"}, "--root is required"},
      {{"checkpoint", "show", "--root", "/x", "--checkpoint", "yaml"},
       "want sqlite or kubelet-json"},
      {{"checkpoint", "show", "--root", "/x", "-o", "xml"}, "-o must be text or json"},
      {{"checkpoint", "export", "--root", "/x"}, "the output FILE is required"},
      {{"checkpoint", "import", "--root", "/x"}, "the kubelet checkpoint FILE is required"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.want);
    Result r = Kdm(c.args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr(c.want));
  }
  // Flags CLI11 itself rejects: not a success and not a runtime error.
  Result unknown = Kdm({"checkpoint", "show", "--root", "/x", "--bogus"});
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.exit_code, 1);
}

}  // namespace
}  // namespace kdm::checkpoint
