// MergeRunOptions: each merge rule of the run options on its own, without a
// Manager (the Manager's tests cover that it calls the merge).
#include "kdm/devicemanager/run_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kdm::devicemanager {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

constexpr char kA[] = "vendor.com/a";
constexpr char kB[] = "vendor.com/b";
constexpr char kC[] = "vendor.com/c";

v1beta1::ContainerAllocateResponse Env(const std::string& key, const std::string& value) {
  v1beta1::ContainerAllocateResponse r;
  (*r.mutable_envs())[key] = value;
  return r;
}

v1beta1::ContainerAllocateResponse MountOf(const std::string& container_path,
                                           const std::string& host_path, bool read_only) {
  v1beta1::ContainerAllocateResponse r;
  v1beta1::Mount* m = r.add_mounts();
  m->set_container_path(container_path);
  m->set_host_path(host_path);
  m->set_read_only(read_only);
  return r;
}

v1beta1::ContainerAllocateResponse DeviceOf(const std::string& container_path,
                                            const std::string& host_path,
                                            const std::string& permissions) {
  v1beta1::ContainerAllocateResponse r;
  v1beta1::DeviceSpec* d = r.add_devices();
  d->set_container_path(container_path);
  d->set_host_path(host_path);
  d->set_permissions(permissions);
  return r;
}

v1beta1::ContainerAllocateResponse Annotation(const std::string& key, const std::string& value) {
  v1beta1::ContainerAllocateResponse r;
  (*r.mutable_annotations())[key] = value;
  return r;
}

v1beta1::ContainerAllocateResponse Cdi(const std::vector<std::string>& names) {
  v1beta1::ContainerAllocateResponse r;
  for (const std::string& name : names) r.add_cdi_devices()->set_name(name);
  return r;
}

TEST(MergeRunOptionsTest, NoResponsesMergeToNothing) {
  std::vector<RunOptionsConflict> conflicts;
  RunContainerOptions run = MergeRunOptions({}, &conflicts);
  EXPECT_THAT(run.envs, IsEmpty());
  EXPECT_THAT(run.mounts, IsEmpty());
  EXPECT_THAT(run.devices, IsEmpty());
  EXPECT_THAT(run.annotations, IsEmpty());
  EXPECT_THAT(run.cdi_devices, IsEmpty());
  EXPECT_THAT(run.conflicts, IsEmpty());
  EXPECT_THAT(conflicts, IsEmpty());
}

TEST(MergeRunOptionsTest, DistinctValuesOfEveryKindAreAllKept) {
  v1beta1::ContainerAllocateResponse a = Env("A", "1");
  a.MergeFrom(MountOf("/a", "/host/a", true));
  a.MergeFrom(DeviceOf("/dev/a", "/dev/host-a", "rw"));
  a.MergeFrom(Annotation("a", "x"));
  v1beta1::ContainerAllocateResponse b = Env("B", "2");
  b.MergeFrom(MountOf("/b", "/host/b", false));
  b.MergeFrom(Annotation("b", "y"));
  RunContainerOptions run = MergeRunOptions({{kA, a}, {kB, b}});
  EXPECT_THAT(run.envs, ElementsAre(Pair("A", "1"), Pair("B", "2")));
  EXPECT_THAT(run.mounts, ElementsAre(Mount{"/a", "/host/a", true}, Mount{"/b", "/host/b", false}));
  EXPECT_THAT(run.devices, ElementsAre(DeviceSpec{"/dev/a", "/dev/host-a", "rw"}));
  EXPECT_THAT(run.annotations, ElementsAre(Pair("a", "x"), Pair("b", "y")));
  EXPECT_THAT(run.conflicts, IsEmpty());
}

TEST(MergeRunOptionsTest, EnvConflictKeepsTheFirstResourcesValue) {
  std::vector<RunOptionsConflict> conflicts;
  RunContainerOptions run = MergeRunOptions({{kA, Env("X", "1")}, {kB, Env("X", "2")}}, &conflicts);
  EXPECT_THAT(run.envs, ElementsAre(Pair("X", "1")));
  EXPECT_THAT(run.conflicts,
              ElementsAre("env \"X\": vendor.com/b's value ignored, vendor.com/a's kept"));
  EXPECT_THAT(conflicts, ElementsAre(RunOptionsConflict{"env \"X\"", kA, kB}));
}

TEST(MergeRunOptionsTest, TheSameEnvValueTwiceIsNoConflict) {
  RunContainerOptions run = MergeRunOptions({{kA, Env("X", "1")}, {kB, Env("X", "1")}});
  EXPECT_THAT(run.envs, ElementsAre(Pair("X", "1")));
  EXPECT_THAT(run.conflicts, IsEmpty());
}

TEST(MergeRunOptionsTest, ResourcesMergeInNameOrderWhateverTheInputOrder) {
  // c first, a last: a's value still wins, and the conflicts name it.
  std::vector<RunOptionsConflict> conflicts;
  RunContainerOptions run =
      MergeRunOptions({{kC, Env("X", "3")}, {kB, Env("X", "2")}, {kA, Env("X", "1")}}, &conflicts);
  EXPECT_THAT(run.envs, ElementsAre(Pair("X", "1")));
  EXPECT_THAT(conflicts, ElementsAre(RunOptionsConflict{"env \"X\"", kA, kB},
                                     RunOptionsConflict{"env \"X\"", kA, kC}));
  EXPECT_THAT(run.conflicts,
              ElementsAre("env \"X\": vendor.com/b's value ignored, vendor.com/a's kept",
                          "env \"X\": vendor.com/c's value ignored, vendor.com/a's kept"));
}

TEST(MergeRunOptionsTest, DuplicateMountPathKeepsTheFirstAndDifferingOnesConflict) {
  std::vector<RunOptionsConflict> conflicts;
  RunContainerOptions run = MergeRunOptions({{kA, MountOf("/data", "/host/a", true)},
                                             {kB, MountOf("/data", "/host/a", true)},
                                             {kC, MountOf("/data", "/host/a", false)}},
                                            &conflicts);
  // b's mount is the same as a's: no conflict; c's differs only in read_only.
  EXPECT_THAT(run.mounts, ElementsAre(Mount{"/data", "/host/a", true}));
  EXPECT_THAT(conflicts, ElementsAre(RunOptionsConflict{"mount \"/data\"", kA, kC}));
  EXPECT_THAT(run.conflicts,
              ElementsAre("mount \"/data\": vendor.com/c's value ignored, vendor.com/a's kept"));
}

TEST(MergeRunOptionsTest, MountsAndDevicesAreSortedByContainerPath) {
  v1beta1::ContainerAllocateResponse a = MountOf("/z", "/host/z", false);
  a.MergeFrom(DeviceOf("/dev/z", "/dev/hz", "r"));
  v1beta1::ContainerAllocateResponse b = MountOf("/m", "/host/m", false);
  b.MergeFrom(DeviceOf("/dev/a", "/dev/ha", "rwm"));
  RunContainerOptions run = MergeRunOptions({{kA, a}, {kB, b}});
  EXPECT_THAT(run.mounts,
              ElementsAre(Mount{"/m", "/host/m", false}, Mount{"/z", "/host/z", false}));
  EXPECT_THAT(run.devices, ElementsAre(DeviceSpec{"/dev/a", "/dev/ha", "rwm"},
                                       DeviceSpec{"/dev/z", "/dev/hz", "r"}));
}

TEST(MergeRunOptionsTest, DuplicateDevicePathKeepsTheFirstAndDifferingOnesConflict) {
  std::vector<RunOptionsConflict> conflicts;
  RunContainerOptions run = MergeRunOptions({{kB, DeviceOf("/dev/x", "/dev/hb", "rw")},
                                             {kA, DeviceOf("/dev/x", "/dev/ha", "rw")},
                                             {kC, DeviceOf("/dev/x", "/dev/ha", "rw")}},
                                            &conflicts);
  // a (first by name) wins; c agrees with a; b's host path differs.
  EXPECT_THAT(run.devices, ElementsAre(DeviceSpec{"/dev/x", "/dev/ha", "rw"}));
  EXPECT_THAT(conflicts, ElementsAre(RunOptionsConflict{"device \"/dev/x\"", kA, kB}));
  EXPECT_THAT(run.conflicts,
              ElementsAre("device \"/dev/x\": vendor.com/b's value ignored, vendor.com/a's kept"));
}

TEST(MergeRunOptionsTest, AnnotationConflictKeepsTheFirstResourcesValue) {
  std::vector<RunOptionsConflict> conflicts;
  RunContainerOptions run = MergeRunOptions(
      {{kA, Annotation("k", "v1")}, {kB, Annotation("k", "v2")}, {kC, Annotation("k", "v1")}},
      &conflicts);
  EXPECT_THAT(run.annotations, ElementsAre(Pair("k", "v1")));
  EXPECT_THAT(conflicts, ElementsAre(RunOptionsConflict{"annotation \"k\"", kA, kB}));
  EXPECT_THAT(run.conflicts,
              ElementsAre("annotation \"k\": vendor.com/b's value ignored, vendor.com/a's kept"));
}

TEST(MergeRunOptionsTest, CdiDevicesAreDeduplicatedInMergeOrderWithoutConflicts) {
  std::vector<RunOptionsConflict> conflicts;
  RunContainerOptions run =
      MergeRunOptions({{kB, Cdi({"vendor.com/gpu=1", "vendor.com/nic=0"})},
                       {kA, Cdi({"vendor.com/gpu=1", "vendor.com/gpu=0", "vendor.com/gpu=0"})}},
                      &conflicts);
  // a's names first (resource-name order), each name once.
  EXPECT_THAT(run.cdi_devices,
              ElementsAre("vendor.com/gpu=1", "vendor.com/gpu=0", "vendor.com/nic=0"));
  EXPECT_THAT(run.conflicts, IsEmpty());
  EXPECT_THAT(conflicts, IsEmpty());
}

TEST(MergeRunOptionsTest, ConflictsAreListedWithoutAnOutParameterToo) {
  RunContainerOptions run = MergeRunOptions({{kA, Env("X", "1")}, {kB, Env("X", "2")}});
  EXPECT_THAT(run.conflicts,
              ElementsAre("env \"X\": vendor.com/b's value ignored, vendor.com/a's kept"));
}

}  // namespace
}  // namespace kdm::devicemanager
