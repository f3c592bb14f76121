#include "actors/bulk/bulk_post.hpp"

#include <atomic>
#include <memory>

namespace dualpath::actors {

namespace {

// Who handles the completion: decided once by compare-and-swap.
struct post_race {
  enum : int { posting = 0, early = 1, returned = 2 };
  std::atomic<int> state{posting};
  transport::bulk::completion result;
};

} // namespace

std::optional<transport::bulk::completion>
post_or_complete(transport::bulk::backend& backend, transport::bulk::batch b,
                 std::function<void(transport::bulk::completion)> later) {
  auto race = std::make_shared<post_race>();
  backend.post(std::move(b), [race, later = std::move(later)](
                                 transport::bulk::completion c) {
    race->result = std::move(c);
    int expected = post_race::posting;
    if (race->state.compare_exchange_strong(expected, post_race::early))
      return; // post() has not returned yet: the caller takes it
    later(std::move(race->result));
  });
  int expected = post_race::posting;
  if (race->state.compare_exchange_strong(expected, post_race::returned))
    return std::nullopt; // the sink calls `later`
  return std::move(race->result);
}

} // namespace dualpath::actors
