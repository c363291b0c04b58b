// kdm's shared filesystem helpers (base/file_system.h): JoinPath and
// EnsureDirectory, in a private directory under /tmp.
#include "kdm/base/file_system.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kdm {
namespace {

using ::testing::HasSubstr;

class FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-fs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void MakeFile(const std::string& path) { std::ofstream(path) << ""; }
  std::string dir_;
};

TEST_F(FileSystemTest, EnsureDirectoryCreatesParentsWithTheMode) {
  std::string d = dir_ + "/a/b/c";
  ASSERT_TRUE(EnsureDirectory(d, 0750).ok());
  struct stat st;
  ASSERT_EQ(stat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  EXPECT_TRUE(EnsureDirectory(d, 0750).ok());  // existing: fine
  MakeFile(dir_ + "/file");
  EXPECT_THAT(EnsureDirectory(dir_ + "/file", 0750).message(), HasSubstr("is not a directory"));
  EXPECT_EQ(EnsureDirectory("", 0750).code(), StatusCode::kInvalidArgument);
}

TEST_F(FileSystemTest, EnsureDirectoryNamesTheBlockedPart) {
  MakeFile(dir_ + "/file");
  Status s = EnsureDirectory(dir_ + "/file/below", 0750);
  // ENOTDIR: FAILED_PRECONDITION by the one errno policy (was INTERNAL).
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("cannot create directory " + dir_ + "/file/below"));
  EXPECT_THAT(s.message(), HasSubstr("Not a directory"));
}

TEST(JoinPathTest, ExactlyOneSlash) {
  EXPECT_EQ(JoinPath("/a", "b"), "/a/b");
  EXPECT_EQ(JoinPath("/a/", "b"), "/a/b");
  EXPECT_EQ(JoinPath("/a//", "b"), "/a/b");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
}

}  // namespace
}  // namespace kdm
