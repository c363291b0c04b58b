#include "kdm/base/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace kdm {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CodesMatchGrpcNumbers) {
  EXPECT_EQ(static_cast<int>(StatusCode::kInvalidArgument), 3);
  EXPECT_EQ(static_cast<int>(StatusCode::kDeadlineExceeded), 4);
  EXPECT_EQ(static_cast<int>(StatusCode::kNotFound), 5);
  EXPECT_EQ(static_cast<int>(StatusCode::kResourceExhausted), 8);
  EXPECT_EQ(static_cast<int>(StatusCode::kFailedPrecondition), 9);
  EXPECT_EQ(static_cast<int>(StatusCode::kUnavailable), 14);
  EXPECT_EQ(static_cast<int>(StatusCode::kUnauthenticated), 16);
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = InvalidArgumentError("bad id \"x\"");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: bad id \"x\"");
  EXPECT_EQ(s.WithPrefix("topology.json").message(), "topology.json: bad id \"x\"");
  EXPECT_TRUE(OkStatus().WithPrefix("p").ok());
}

TEST(StatusOrTest, HoldsValueOrError) {
  StatusOr<int> v = 7;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
  StatusOr<int> e = NotFoundError("missing");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

TEST(StatusOrTest, OkStatusWithoutValueBecomesInternal) {
  StatusOr<int> e = OkStatus();
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInternal);
}

TEST(StatusOrTest, MoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(3);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> taken = std::move(p).value();
  EXPECT_EQ(*taken, 3);
}

Status FailIfNegative(int x) {
  if (x < 0) return OutOfRangeError("negative");
  return OkStatus();
}
StatusOr<int> Twice(int x) {
  KDM_RETURN_IF_ERROR(FailIfNegative(x));
  return 2 * x;
}
StatusOr<int> Quad(int x) {
  KDM_ASSIGN_OR_RETURN(int t, Twice(x));
  return 2 * t;
}

TEST(StatusMacrosTest, PropagateErrors) {
  EXPECT_EQ(*Quad(3), 12);
  EXPECT_EQ(Quad(-1).status().code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace kdm
