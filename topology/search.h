// Private to kdm::topology: the search behind Allocate and NodeScore.
//
// Devices are renumbered 0..n-1 in the order of the sorted available list
// ("local positions"), so a set of them is a 64-bit mask when n <= 64.
//
// Packing (the packed objective). Best(mask) is the best packing of the
// devices in `mask` into groups of `size_`, where one smaller group holds
// |mask| mod size_ of them. The group holding the lowest device of the mask is
// enumerated, so each packing is seen once (no permutations of groups), and
// the value of what remains is memoised. A packing is valued by its total
// score, then by its weakest full group (max-min), compared in that order.
//
// Choosing the group (packed). Without must_include, Walk() visits every state
// on a best packing of everything, reading the memo, and keeps the best full
// group met; with must_include, every set holding it is scored.
//
// Best set. Branch and bound over sets holding must_include, in index order;
// a subtree is cut when an admissible bound (the score so far, plus for each
// place left the best candidate's links to the set and half its best links to
// the other places) is below the best score found. Ties are explored, so the
// tie-breaks stay exact.
//
// Budget. Every 256 steps the clock is read; past the deadline the search
// stops, the greedy set is used and `optimal` is false.
//
// Thread-safety: one Search per call; not shared.
#ifndef KDM_TOPOLOGY_SEARCH_H_
#define KDM_TOPOLOGY_SEARCH_H_

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kdm/topology/topology.h"

namespace kdm::topology::internal {

struct Result {
  std::vector<int> chosen;  // device indices of the topology
  int64_t score = 0;
  int64_t packed_score = 0;
  bool optimal = true;
};

class Search {
 public:
  // REQUIRES: arguments validated as Allocate does.
  Search(const Topology& topology, const std::vector<int>& available,
         const std::vector<int>& must_include, int size,
         std::chrono::steady_clock::time_point deadline);

  Result Packed();
  Result BestSet();
  Result FirstFit();

 private:
  struct Pack {
    int64_t sum = 0;
    int64_t min_full = 0;  // weakest full group; max int64 when none
  };
  static bool Better(const Pack& a, const Pack& b) {
    return a.sum != b.sum ? a.sum > b.sum : a.min_full > b.min_full;
  }
  // One level of Best(): the devices of the mask and the group being built.
  struct Frame {
    uint64_t mask = 0;
    int pos[64];
    int m = 0;
    int members[64];
    int count = 0;
    bool full = false;
    int64_t hsum = 0;  // sum of h_ over the mask
    bool rem = false;  // the mask holds the remainder and more than a group
    int64_t sub = 0;   // Slack(mask, d_) when rem
    int64_t bsum = 0;  // sum of b_ over the mask
    int64_t bsub = 0;  // Slack(mask, e_) when rem
    Pack best{-1, 0};
  };

  bool Tick();
  void InitFrame(Frame& f, uint64_t mask) const;
  // An upper bound on the total of the packing that puts a group (score,
  // sums of h_ and b_ over its members) first in f's mask, in units of
  // 1 / (2 x scale_), so that no division is needed: the total is an integer,
  // so comparing the unrounded bound with an integer total cuts as much.
  int64_t GroupBound(const Frame& f, int64_t score, int64_t hs, int64_t bs) const;
  // Visits every state on a best packing of the mask (by total, then weakest
  // full group, against target_pack_) and offers each full group met to
  // ConsiderPackedGroup.
  void Walk(uint64_t mask);
  void WalkGroups(Frame& f, int start, int need, uint64_t gmask, int64_t gscore, int64_t ghsum,
                  int64_t gbsum, const Pack& here);
  // Keeps the group if it beats the best: own score, fewer NUMA nodes, lower
  // indices.
  void ConsiderPackedGroup(uint64_t g, int64_t own);
  Pack Best(uint64_t mask);
  // Best()'s memo when n_ <= kFlatMemoBits: every mask unsolved. Out of line
  // so that the fill loop's code placement does not move with every change
  // to Best() (a 1 MiB fill whose speed depended on it).
  [[gnu::noinline]] void AllocateFlatMemo();
  void EnumGroups(Frame& f, int start, int need, uint64_t gmask, int64_t gscore, int64_t ghsum,
                  int64_t gbsum);
  // The one step both group walks take: adds each device f.pos[i] that can
  // still start a group of `need` more (i from `start` on) to f's members,
  // calls visit(i, device, what it adds to the group's score), takes it out.
  // Stops when the budget has run out.
  template <typename Visit>
  void ForEachNextMember(Frame& f, int start, int need, Visit&& visit);
  // The first step of both group walks: fills f for `mask`, then calls
  // start(need, low) once for each kind of group that can hold the mask's
  // lowest device `low` (already f's first member), with f.full set: a full
  // group (need = size_ - 1 more members), and the smaller remainder group
  // when one is still left in the mask.
  template <typename Start>
  void ForEachFirstGroup(Frame& f, uint64_t mask, Start&& start);
  // An upper bound on Best(mask).sum: every device links to at most size_-1
  // others in its group (h_), and the r0_ devices of the remainder group to
  // at most r0_-1 (h_ - d_), so half of: the sum of h_ over the mask, less
  // the r0_ smallest d_ when the mask still holds the remainder.
  int64_t UpperBound(uint64_t mask) const;
  // The sum of the r0_ smallest v[c] over the mask.
  int64_t Slack(uint64_t mask, const std::vector<int64_t>& v) const;
  // The best score of a group of `g` devices holding device c (branch and
  // bound; an upper bound if the budget runs out).
  int64_t BestGroupWith(int c, int g);
  void BestGroupDfs(int c, int start, int need, int64_t own, std::vector<int64_t>& gain,
                    std::vector<char>& in, int64_t& best);
  // Fills top_, h_, d_ and, when `group_bound` (the packed policy, where it
  // pays), b_ and e_; otherwise b_ and e_ are set so that they never bind.
  void ComputeTop(bool group_bound);

  void PackedDfs(size_t start, int need, uint64_t gmask, int64_t own);
  void BestSetDfs(size_t start, int need, uint64_t gmask, int64_t own);
  void AddMember(int c);
  void RemoveMember(int c);
  int NumaCount(const std::vector<int>& local) const;
  int64_t LocalScore(const std::vector<int>& local) const;

  // The greedy fallback: must_include grown by the best link gain.
  std::vector<int> GreedyGroup() const;
  // The total score of a greedy packing of `local` positions.
  int64_t GreedyPack(std::vector<char> in_rest) const;
  uint64_t MaskOf(const std::vector<int>& local) const;
  Result Finish(const std::vector<int>& local, int64_t own, bool optimal);

  std::vector<int> dev_;  // local position -> device index
  int n_ = 0;
  int size_ = 0;
  std::vector<int32_t> w_;  // n_ x n_ pair scores
  std::vector<int> numa_;   // -1 when unknown
  std::vector<int> must_;   // local positions, sorted
  std::vector<int> free_;   // local positions not in must_, sorted
  bool exact_ = false;      // n_ <= 64
  uint64_t full_ = 0;

  std::chrono::steady_clock::time_point deadline_;
  uint32_t ticks_ = 0;
  bool expired_ = false;

  // Memo of Best(): flat when n_ is small, hashed otherwise.
  std::vector<Pack> flat_;
  std::unordered_map<uint64_t, Pack> hashed_;

  // The DFS state of Packed() and BestSet().
  std::vector<int> stack_;
  std::vector<int64_t> gain_;  // links of each position to stack_
  std::vector<int64_t> top_;   // n_ x n_: top_[c*n_+k] = sum of c's k best links
  std::vector<int64_t> h_;     // top_[c][size_-1]
  std::vector<int64_t> d_;     // h_[c] - top_[c][r0_-1]
  int r0_ = 0;                 // n_ % size_: the size of the remainder group
  // A second bound: a group's score is at most the mean over its devices of
  // the best group each belongs to. Scaled by scale_ = size_ x max(r0_, 1)
  // to stay in integers: b_[c] = BestGroupWith(c, size_) x scale_ / size_,
  // e_[c] = b_[c] - BestGroupWith(c, r0_) x scale_ / r0_.
  std::vector<int64_t> b_;
  std::vector<int64_t> e_;
  int64_t scale_ = 1;
  Pack target_pack_;  // Packed without must_include: Best(full_)
  std::vector<char> walked_flat_;
  std::unordered_set<uint64_t> walked_;
  uint64_t best_mask_ = 0;
  std::vector<int64_t> scratch_;
  bool have_best_ = false;
  std::vector<int> best_;
  int64_t best_own_ = 0;
  Pack best_pack_;
  int best_numa_ = 0;
  int64_t best_rest_ = -1;  // BestSet: packed score of what remains, -1 unknown
};

}  // namespace kdm::topology::internal

#endif  // KDM_TOPOLOGY_SEARCH_H_
