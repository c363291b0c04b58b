#include "kdm/topology/search.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <set>

namespace kdm::topology::internal {
namespace {

constexpr int64_t kNoGroup = std::numeric_limits<int64_t>::max();
// Up to this many devices the memo is a flat array of 2^n entries.
constexpr int kFlatMemoBits = 18;
// From this many devices on, the best-group bound is worth computing.
constexpr int kBestGroupBoundMin = 10;
// Seeds tried by the greedy fallback when must_include is empty.
constexpr int kGreedySeeds = 32;

}  // namespace

Search::Search(const Topology& topology, const std::vector<int>& available,
               const std::vector<int>& must_include, int size,
               std::chrono::steady_clock::time_point deadline)
    : dev_(available), size_(size), deadline_(deadline) {
  std::sort(dev_.begin(), dev_.end());
  n_ = static_cast<int>(dev_.size());
  w_.resize(static_cast<size_t>(n_) * n_);
  for (int a = 0; a < n_; ++a) {
    for (int b = 0; b < n_; ++b) w_[a * n_ + b] = topology.PairScore(dev_[a], dev_[b]);
    const auto& numa = topology.Device(dev_[a]).numa;
    numa_.push_back(numa ? *numa : -1);
  }
  std::vector<char> is_must(n_, 0);
  for (int d : must_include) {
    int local = static_cast<int>(std::lower_bound(dev_.begin(), dev_.end(), d) - dev_.begin());
    is_must[local] = 1;
  }
  for (int i = 0; i < n_; ++i) (is_must[i] ? must_ : free_).push_back(i);
  exact_ = n_ <= 64;
  full_ = n_ >= 64 ? ~uint64_t{0} : (uint64_t{1} << n_) - 1;
}

bool Search::Tick() {
  if (!expired_ && (++ticks_ & 255) == 0 && std::chrono::steady_clock::now() > deadline_) {
    expired_ = true;
  }
  return expired_;
}

void Search::ComputeTop(bool group_bound) {
  // top_[c][k]: the sum of c's k best links to other available devices.
  top_.assign(static_cast<size_t>(n_) * n_, 0);
  h_.assign(n_, 0);
  std::vector<int32_t> row;
  for (int c = 0; c < n_; ++c) {
    row.clear();
    for (int x = 0; x < n_; ++x) {
      if (x != c) row.push_back(w_[c * n_ + x]);
    }
    std::sort(row.begin(), row.end(), std::greater<>());
    for (int k = 1; k < n_; ++k) top_[c * n_ + k] = top_[c * n_ + k - 1] + row[k - 1];
    h_[c] = top_[c * n_ + (size_ - 1)];
  }
  r0_ = n_ % size_;
  d_.assign(n_, 0);
  if (r0_ > 0) {
    for (int c = 0; c < n_; ++c) d_[c] = h_[c] - top_[c * n_ + (r0_ - 1)];
  }
  scale_ = static_cast<int64_t>(size_) * std::max(r0_, 1);
  b_.assign(n_, 0);
  e_.assign(n_, 0);
  for (int c = 0; c < n_; ++c) {
    if (!group_bound || 2 * size_ > n_ || n_ < kBestGroupBoundMin) {
      // One full group at most, or so few devices that the search is
      // cheaper than this bound: make it never the smaller one.
      b_[c] = h_[c] * scale_;
      e_[c] = d_[c] * scale_;
      continue;
    }
    b_[c] = BestGroupWith(c, size_) * (scale_ / size_);
    e_[c] = r0_ > 0 ? b_[c] - BestGroupWith(c, r0_) * (scale_ / r0_) : 0;
  }
}

int64_t Search::BestGroupWith(int c, int g) {
  if (g <= 1) return 0;
  std::vector<int64_t> gain(w_.begin() + c * n_, w_.begin() + (c + 1) * n_);
  std::vector<char> in(n_, 0);
  in[c] = 1;
  int64_t best = -1;
  BestGroupDfs(c, 0, g - 1, 0, gain, in, best);
  if (expired_ || best < 0) {
    // Not finished: the link bound is always valid.
    int64_t links = top_[c * n_ + (g - 1)];
    for (int x = 0; x < n_; ++x) links = std::max(links, top_[x * n_ + (g - 1)]);
    return links * g / 2 + 1;
  }
  return best;
}

void Search::BestGroupDfs(int c, int start, int need, int64_t own, std::vector<int64_t>& gain,
                          std::vector<char>& in, int64_t& best) {
  if (Tick()) return;
  if (need == 0) {
    best = std::max(best, own);
    return;
  }
  if (best >= 0) {
    scratch_.clear();
    for (int x = start; x < n_; ++x) {
      if (!in[x]) scratch_.push_back(2 * gain[x] + top_[x * n_ + (need - 1)]);
    }
    if (static_cast<int>(scratch_.size()) < need) return;
    std::nth_element(scratch_.begin(), scratch_.begin() + (need - 1), scratch_.end(),
                     std::greater<>());
    int64_t bound = 2 * own;
    for (int k = 0; k < need; ++k) bound += scratch_[k];
    if (bound <= 2 * best) return;
  }
  for (int x = start; x < n_; ++x) {
    if (in[x]) continue;
    const int64_t add = gain[x];
    in[x] = 1;
    for (int y = 0; y < n_; ++y) gain[y] += w_[x * n_ + y];
    BestGroupDfs(c, x + 1, need - 1, own + add, gain, in, best);
    for (int y = 0; y < n_; ++y) gain[y] -= w_[x * n_ + y];
    in[x] = 0;
    if (expired_) return;
  }
}

int64_t Search::Slack(uint64_t mask, const std::vector<int64_t>& v) const {
  const int r = std::min(r0_, std::popcount(mask));
  if (r <= 4) {
    // Keep the r smallest in a small sorted array.
    int64_t low[4];
    int have = 0;
    for (uint64_t b = mask; b != 0; b &= b - 1) {
      const int64_t x = v[std::countr_zero(b)];
      if (have == r && x >= low[r - 1]) continue;
      int i = have < r ? have++ : r - 1;
      while (i > 0 && low[i - 1] > x) {
        low[i] = low[i - 1];
        --i;
      }
      low[i] = x;
    }
    int64_t sum = 0;
    for (int i = 0; i < have; ++i) sum += low[i];
    return sum;
  }
  int64_t vals[64];
  int k = 0;
  for (uint64_t b = mask; b != 0; b &= b - 1) vals[k++] = v[std::countr_zero(b)];
  std::nth_element(vals, vals + r, vals + k);
  int64_t sum = 0;
  for (int i = 0; i < r; ++i) sum += vals[i];
  return sum;
}

int64_t Search::UpperBound(uint64_t mask) const {
  int64_t hsum = 0;
  int64_t bsum = 0;
  for (uint64_t b = mask; b != 0; b &= b - 1) {
    hsum += h_[std::countr_zero(b)];
    bsum += b_[std::countr_zero(b)];
  }
  if (std::popcount(mask) % size_ != 0) {
    hsum -= Slack(mask, d_);
    bsum -= Slack(mask, e_);
  }
  return std::min(hsum / 2, bsum / scale_);
}
void Search::InitFrame(Frame& f, uint64_t mask) const {
  f.mask = mask;
  const int k = std::popcount(mask);
  const int low = std::countr_zero(mask);
  for (uint64_t rest = mask & (mask - 1); rest != 0; rest &= rest - 1) {
    f.pos[f.m++] = std::countr_zero(rest);
  }
  f.members[0] = low;
  f.count = 1;
  for (uint64_t b = mask; b != 0; b &= b - 1) {
    f.hsum += h_[std::countr_zero(b)];
    f.bsum += b_[std::countr_zero(b)];
  }
  // What a full group leaves still holds the remainder; its slack is at least
  // the mask's (fewer devices to choose the smallest from).
  if (k % size_ != 0 && k > size_) {
    f.rem = true;
    f.sub = Slack(mask, d_);
    f.bsub = Slack(mask, e_);
  }
}

int64_t Search::GroupBound(const Frame& f, int64_t score, int64_t hs, int64_t bs) const {
  const bool rem = f.full && f.rem;  // what the group leaves still holds the remainder
  const int64_t hub = (f.hsum - hs - (rem ? f.sub : 0)) * scale_;
  const int64_t bub = (f.bsum - bs - (rem ? f.bsub : 0)) * 2;
  return score * 2 * scale_ + std::min(hub, bub);
}

template <typename Start>
void Search::ForEachFirstGroup(Frame& f, uint64_t mask, Start&& start) {
  InitFrame(f, mask);
  const int k = std::popcount(mask);
  const int low = f.members[0];
  if (k >= size_) {
    f.full = true;
    start(size_ - 1, low);
  }
  if (k % size_ != 0) {
    f.full = false;
    start(k % size_ - 1, low);
  }
}

void Search::AllocateFlatMemo() { flat_.assign(size_t{1} << n_, Pack{-1, 0}); }

Search::Pack Search::Best(uint64_t mask) {
  if (mask == 0) return {0, kNoGroup};
  if (expired_) return {0, kNoGroup};
  if (n_ <= kFlatMemoBits) {
    if (flat_.empty()) AllocateFlatMemo();
    if (flat_[mask].sum >= 0) return flat_[mask];
  } else if (auto it = hashed_.find(mask); it != hashed_.end()) {
    return it->second;
  }
  Frame f;
  ForEachFirstGroup(f, mask, [&](int need, int low) {
    EnumGroups(f, 0, need, uint64_t{1} << low, 0, h_[low], b_[low]);
  });
  if (expired_) return {0, kNoGroup};
  if (n_ <= kFlatMemoBits) {
    flat_[mask] = f.best;
  } else {
    hashed_.emplace(mask, f.best);
  }
  return f.best;
}

template <typename Visit>
void Search::ForEachNextMember(Frame& f, int start, int need, Visit&& visit) {
  for (int i = start; i <= f.m - need; ++i) {
    if (expired_) return;
    const int p = f.pos[i];
    const int32_t* row = &w_[p * n_];
    int64_t add = 0;
    for (int q = 0; q < f.count; ++q) add += row[f.members[q]];
    f.members[f.count++] = p;
    visit(i, p, add);
    --f.count;
  }
}

void Search::EnumGroups(Frame& f, int start, int need, uint64_t gmask, int64_t gscore,
                        int64_t ghsum, int64_t gbsum) {
  const int64_t unit = 2 * scale_;
  auto bound = [&](int64_t score, int64_t hs, int64_t bs) { return GroupBound(f, score, hs, bs); };
  auto finish = [&](uint64_t g, int64_t score) {
    Pack rest = Best(f.mask & ~g);
    Pack cand{score + rest.sum, f.full ? std::min(score, rest.min_full) : rest.min_full};
    if (Better(cand, f.best)) f.best = cand;
  };
  if (need == 0) {
    if (Tick()) return;
    // A group that cannot reach the best total so far is not worth solving
    // what it leaves (strictly below: an equal total may still win on the
    // weakest group).
    if (f.best.sum >= 0 && bound(gscore, ghsum, gbsum) < f.best.sum * unit) return;
    finish(gmask, gscore);
    return;
  }
  if (need == 1) {
    // The last member: try the most promising first, so that the rest are
    // cut by the bound. The value of the state does not depend on the order.
    struct Option {
      int64_t ub;
      int64_t score;
      int p;
    };
    Option options[64];
    int count = 0;
    for (int i = start; i < f.m; ++i) {
      const int p = f.pos[i];
      const int32_t* row = &w_[p * n_];
      int64_t add = 0;
      for (int q = 0; q < f.count; ++q) add += row[f.members[q]];
      options[count++] = {bound(gscore + add, ghsum + h_[p], gbsum + b_[p]), gscore + add, p};
    }
    // Selection rather than a sort: the bound usually cuts after a few.
    for (int left = count; left > 0; --left) {
      if (Tick()) return;
      int top = 0;
      for (int i = 1; i < left; ++i) {
        if (options[i].ub > options[top].ub) top = i;
      }
      const Option o = options[top];
      options[top] = options[left - 1];
      if (f.best.sum >= 0 && o.ub < f.best.sum * unit) return;
      finish(gmask | (uint64_t{1} << o.p), o.score);
    }
    return;
  }
  ForEachNextMember(f, start, need, [&](int i, int p, int64_t add) {
    EnumGroups(f, i + 1, need - 1, gmask | (uint64_t{1} << p), gscore + add, ghsum + h_[p],
               gbsum + b_[p]);
  });
}

int Search::NumaCount(const std::vector<int>& local) const {
  int seen[64];
  int count = 0;
  for (int p : local) {
    int node = numa_[p];
    if (node < 0) continue;
    if (std::find(seen, seen + count, node) == seen + count && count < 64) seen[count++] = node;
  }
  return count;
}

int64_t Search::LocalScore(const std::vector<int>& local) const {
  int64_t s = 0;
  for (size_t a = 0; a < local.size(); ++a) {
    for (size_t b = a + 1; b < local.size(); ++b) s += w_[local[a] * n_ + local[b]];
  }
  return s;
}

uint64_t Search::MaskOf(const std::vector<int>& local) const {
  uint64_t m = 0;
  for (int p : local) m |= uint64_t{1} << p;
  return m;
}

void Search::AddMember(int c) {
  stack_.push_back(c);
  const int32_t* row = &w_[c * n_];
  for (int x = 0; x < n_; ++x) gain_[x] += row[x];
}

void Search::RemoveMember(int c) {
  stack_.pop_back();
  const int32_t* row = &w_[c * n_];
  for (int x = 0; x < n_; ++x) gain_[x] -= row[x];
}

// ---- packed --------------------------------------------------------------

void Search::PackedDfs(size_t start, int need, uint64_t gmask, int64_t own) {
  if (need == 0) {
    if (Tick()) return;
    const uint64_t rest_mask = full_ & ~gmask;
    if (have_best_ && own + UpperBound(rest_mask) < best_pack_.sum) return;
    Pack rest = Best(rest_mask);
    if (expired_) return;
    Pack total{own + rest.sum, std::min(own, rest.min_full)};
    bool better = !have_best_ || Better(total, best_pack_);
    if (!better && !Better(best_pack_, total)) {
      if (own != best_own_) {
        better = own > best_own_;
      } else {
        // Sets are visited in lexicographic order: on a full tie the earlier
        // (lower indices) stays.
        better = NumaCount(stack_) < best_numa_;
      }
    }
    if (better) {
      have_best_ = true;
      best_ = stack_;
      best_own_ = own;
      best_pack_ = total;
      best_numa_ = NumaCount(stack_);
    }
    return;
  }
  for (size_t i = start; i + need <= free_.size(); ++i) {
    if (expired_) return;
    const int c = free_[i];
    const int64_t add = gain_[c];
    AddMember(c);
    PackedDfs(i + 1, need - 1, gmask | (uint64_t{1} << c), own + add);
    RemoveMember(c);
  }
}

void Search::Walk(uint64_t mask) {
  if (mask == 0 || expired_) return;
  if (n_ <= kFlatMemoBits) {
    if (walked_flat_.empty()) walked_flat_.assign(size_t{1} << n_, 0);
    if (walked_flat_[mask]) return;
    walked_flat_[mask] = 1;
  } else if (!walked_.insert(mask).second) {
    return;
  }
  const Pack here = Best(mask);
  Frame f;
  ForEachFirstGroup(f, mask, [&](int need, int low) {
    WalkGroups(f, 0, need, uint64_t{1} << low, 0, h_[low], b_[low], here);
  });
}

void Search::WalkGroups(Frame& f, int start, int need, uint64_t gmask, int64_t gscore,
                        int64_t ghsum, int64_t gbsum, const Pack& here) {
  if (expired_) return;
  if (need == 0) {
    if (Tick()) return;
    // Groups the packing search cut are cut here too (same bound, and the
    // best total is at least what it was then), so no new state is solved.
    if (GroupBound(f, gscore, ghsum, gbsum) < here.sum * 2 * scale_) return;
    const uint64_t rest_mask = f.mask & ~gmask;
    const Pack rest = Best(rest_mask);
    if (gscore + rest.sum != here.sum) return;
    if (rest.min_full < target_pack_.min_full) return;
    if (f.full && gscore < target_pack_.min_full) return;
    if (f.full) ConsiderPackedGroup(gmask, gscore);
    Walk(rest_mask);
    return;
  }
  ForEachNextMember(f, start, need, [&](int i, int p, int64_t add) {
    WalkGroups(f, i + 1, need - 1, gmask | (uint64_t{1} << p), gscore + add, ghsum + h_[p],
               gbsum + b_[p], here);
  });
}

void Search::ConsiderPackedGroup(uint64_t g, int64_t own) {
  std::vector<int> local;
  for (uint64_t b = g; b != 0; b &= b - 1) local.push_back(std::countr_zero(b));
  const int numa = NumaCount(local);
  bool better = !have_best_ || own > best_own_;
  if (have_best_ && own == best_own_) {
    const uint64_t diff = g ^ best_mask_;
    better = numa < best_numa_ || (numa == best_numa_ && diff != 0 && (g & (diff & -diff)) != 0);
  }
  if (better) {
    have_best_ = true;
    best_mask_ = g;
    best_ = local;
    best_own_ = own;
    best_numa_ = numa;
  }
}

Result Search::Packed() {
  if (!exact_) return Finish(GreedyGroup(), -1, false);
  ComputeTop(/*group_bound=*/true);
  if (must_.empty()) {
    // Without must_include the answer is a full group of some best packing
    // of everything: walk the best packings through the memo and keep the
    // best of their full groups.
    target_pack_ = Best(full_);
    Walk(full_);
    if (expired_ || !have_best_) return Finish(GreedyGroup(), -1, false);
    Result r = Finish(best_, best_own_, true);
    r.packed_score = target_pack_.sum;
    return r;
  }
  gain_.assign(n_, 0);
  int64_t own = 0;
  for (int c : must_) {
    own += gain_[c];
    AddMember(c);
  }
  PackedDfs(0, size_ - static_cast<int>(must_.size()), MaskOf(must_), own);
  if (expired_ || !have_best_) return Finish(GreedyGroup(), -1, false);
  Result r = Finish(best_, best_own_, true);
  r.packed_score = best_pack_.sum;
  return r;
}

// ---- best set --------------------------------------------------------------

void Search::BestSetDfs(size_t start, int need, uint64_t gmask, int64_t own) {
  if (Tick()) return;
  if (need == 0) {
    if (!have_best_ || own > best_own_) {
      have_best_ = true;
      best_ = stack_;
      best_own_ = own;
      best_rest_ = -1;
      return;
    }
    if (own < best_own_) return;
    // A tie on the own score: the packed score of what remains decides, then
    // fewer NUMA nodes; sets come in lexicographic order, so on a full tie the
    // earlier (lower indices) stays.
    if (best_rest_ < 0) best_rest_ = Best(full_ & ~MaskOf(best_)).sum;
    const int64_t rest = Best(full_ & ~gmask).sum;
    if (expired_) return;
    if (rest > best_rest_ || (rest == best_rest_ && NumaCount(stack_) < NumaCount(best_))) {
      best_ = stack_;
      best_rest_ = rest;
    }
    return;
  }
  if (have_best_) {
    // Admissible bound, doubled to stay in integers.
    scratch_.clear();
    for (size_t i = start; i < free_.size(); ++i) {
      const int c = free_[i];
      scratch_.push_back(2 * gain_[c] + top_[c * n_ + (need - 1)]);
    }
    std::nth_element(scratch_.begin(), scratch_.begin() + (need - 1), scratch_.end(),
                     std::greater<>());
    int64_t bound = 2 * own;
    for (int k = 0; k < need; ++k) bound += scratch_[k];
    if (bound < 2 * best_own_) return;
  }
  for (size_t i = start; i + need <= free_.size(); ++i) {
    if (expired_) return;
    const int c = free_[i];
    const int64_t add = gain_[c];
    AddMember(c);
    BestSetDfs(i + 1, need - 1, gmask | (uint64_t{1} << c), own + add);
    RemoveMember(c);
  }
}

Result Search::BestSet() {
  if (!exact_) return Finish(GreedyGroup(), -1, false);
  ComputeTop(/*group_bound=*/false);
  gain_.assign(n_, 0);
  int64_t own = 0;
  for (int c : must_) {
    own += gain_[c];
    AddMember(c);
  }
  BestSetDfs(0, size_ - static_cast<int>(must_.size()), MaskOf(must_), own);
  if (!have_best_) return Finish(GreedyGroup(), -1, false);
  if (expired_) return Finish(best_, best_own_, false);
  return Finish(best_, best_own_, true);
}

// ---- first fit ---------------------------------------------------------------

Result Search::FirstFit() {
  if (exact_) ComputeTop(/*group_bound=*/false);
  std::vector<int> set = must_;
  for (size_t i = 0; static_cast<int>(set.size()) < size_; ++i) set.push_back(free_[i]);
  std::sort(set.begin(), set.end());
  return Finish(set, -1, true);
}

// ---- greedy fallback and results -----------------------------------------------

std::vector<int> Search::GreedyGroup() const {
  std::vector<std::vector<int>> seeds;
  if (!must_.empty()) {
    seeds.push_back(must_);
  } else {
    for (int i = 0; i < n_ && i < kGreedySeeds; ++i) seeds.push_back({i});
  }
  std::vector<int> best;
  int64_t best_score = -1;
  std::vector<int64_t> gain(n_);
  std::vector<char> in(n_);
  for (const auto& seed : seeds) {
    std::fill(gain.begin(), gain.end(), 0);
    std::fill(in.begin(), in.end(), 0);
    std::vector<int> set;
    int64_t score = 0;
    auto add = [&](int c) {
      score += gain[c];
      set.push_back(c);
      in[c] = 1;
      for (int x = 0; x < n_; ++x) gain[x] += w_[c * n_ + x];
    };
    for (int c : seed) add(c);
    while (static_cast<int>(set.size()) < size_) {
      int pick = -1;
      for (int x = 0; x < n_; ++x) {
        if (!in[x] && (pick < 0 || gain[x] > gain[pick])) pick = x;
      }
      add(pick);
    }
    if (score > best_score) {
      best_score = score;
      best = set;
    }
  }
  std::sort(best.begin(), best.end());
  return best;
}

int64_t Search::GreedyPack(std::vector<char> in_rest) const {
  int64_t total = 0;
  int left = static_cast<int>(std::count(in_rest.begin(), in_rest.end(), 1));
  std::vector<int64_t> gain(n_);
  while (left > 0) {
    const int group = std::min(left, size_);
    std::fill(gain.begin(), gain.end(), 0);
    int c = static_cast<int>(std::find(in_rest.begin(), in_rest.end(), 1) - in_rest.begin());
    for (int taken = 0; taken < group; ++taken) {
      total += gain[c];
      in_rest[c] = 0;
      --left;
      for (int x = 0; x < n_; ++x) gain[x] += w_[c * n_ + x];
      int next = -1;
      for (int x = 0; x < n_; ++x) {
        if (in_rest[x] && (next < 0 || gain[x] > gain[next])) next = x;
      }
      c = next;
    }
  }
  return total;
}

Result Search::Finish(const std::vector<int>& local, int64_t own, bool optimal) {
  Result r;
  r.score = own >= 0 ? own : LocalScore(local);
  r.optimal = optimal && !expired_;
  for (int p : local) r.chosen.push_back(dev_[p]);
  std::sort(r.chosen.begin(), r.chosen.end());
  // The packed score of the chosen set: exact when the search has time left,
  // greedy otherwise.
  int64_t rest = -1;
  if (exact_ && !expired_) {
    Pack p = Best(full_ & ~MaskOf(local));
    if (!expired_) rest = p.sum;
  }
  if (rest < 0) {
    std::vector<char> in_rest(n_, 1);
    for (int p : local) in_rest[p] = 0;
    rest = GreedyPack(in_rest);
    r.optimal = false;
  }
  r.packed_score = r.score + rest;
  return r;
}

}  // namespace kdm::topology::internal
