// The host backend of gpu::device: host memory standing in for HBM where no
// GPU exists. Pool slabs are 256-byte aligned host memory (pages are touched
// only when bytes land there); allocations are counted against the HBM budget
// (the budget is the point: engines see the same refusals as on a GPU); pin()
// only records the range; each stream is a worker thread that runs
// its copies (memcpy) and checksums in submission order, so copies complete
// asynchronously and events complete when the worker reaches them, as on a
// CUDA stream; notify() runs its function on the stream's worker, and
// checksums are computed there too. An unbacked host device
// (device_options::backed = false) only counts: its buffers all point at one
// PROT_NONE page, so a stray access faults instead of corrupting memory, and
// copies and checksums fail.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include <sys/mman.h>
#include <unistd.h>

#include "gpu/checksum.hpp"
#include "gpu/device.hpp"

namespace dualpath::gpu {

namespace {

constexpr size_t host_alignment = 256; // cudaMalloc's guarantee

/// One stream: a FIFO of tasks run by one worker thread.
class host_stream {
public:
  /// Starts the worker, which runs `on_start` (when set) first; a failed
  /// hook leaves it stopped and start_error() names why.
  explicit host_stream(const std::function<caf::error()>& on_start) {
    std::promise<caf::error> started;
    auto ready = started.get_future();
    worker_ = std::thread{[this, &on_start, &started] {
      auto err = on_start ? on_start() : caf::error{};
      bool ok = !err;
      if (!ok) {
        std::lock_guard<std::mutex> guard{mtx_};
        stopping_ = true;
      }
      started.set_value(std::move(err)); // both references end here
      if (ok)
        run();
    }};
    start_error_ = ready.get();
  }

  const caf::error& start_error() const {
    return start_error_;
  }

  ~host_stream() {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join(); // run() drains the queue before it returns
  }

  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      tasks_.push_back(std::move(task));
      ++pending_;
    }
    cv_.notify_all();
  }

  /// Blocks until every task submitted so far has run.
  void drain() {
    std::unique_lock<std::mutex> guard{mtx_};
    idle_.wait(guard, [this] { return pending_ == 0; });
  }

private:
  void run() {
    std::unique_lock<std::mutex> guard{mtx_};
    for (;;) {
      cv_.wait(guard, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty())
        return; // stopping and drained
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      guard.unlock();
      task();
      guard.lock();
      if (--pending_ == 0)
        idle_.notify_all();
    }
  }

  std::mutex mtx_;
  std::condition_variable cv_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> tasks_;
  size_t pending_ = 0;
  bool stopping_ = false;
  caf::error start_error_;
  std::thread worker_; // last: starts after the members above exist
};

/// One event: complete when `done >= recorded`. Shared with the stream tasks
/// that complete it, so destroying a pending event is safe.
struct host_event_state {
  std::mutex mtx;
  std::condition_variable cv;
  uint64_t recorded = 0;
  uint64_t done = 0;
};

using host_event = std::shared_ptr<host_event_state>;

class host_device final : public device {
public:
  host_device(uint64_t budget, std::byte* guard, const device_options& opts)
      : device(budget, opts, guard == nullptr),
        guard_(guard),
        thread_start_(opts.thread_start) {
    caps_.kind = backend_kind::host;
    caps_.name = guard_ ? "host accounting (no memory)" : "host memory";
    caps_.real_device = false;
    caps_.host_addressable = guard_ == nullptr;
    caps_.batched_copy = opts.batch_copy == batch_copy_use::probe;
    caps_.device_checksum = false;
    caps_.total_memory = budget;
  }

  static caf::expected<std::shared_ptr<device>>
  create(uint64_t budget, std::byte* guard, const device_options& opts) {
    auto dev = std::make_shared<host_device>(budget, guard, opts);
    if (auto err = dev->reserve_pool())
      return err;
    return std::shared_ptr<device>{std::move(dev)};
  }

  ~host_device() override {
    release_pool();
    if (guard_ != nullptr)
      munmap(guard_, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  }

  const device_capabilities& capabilities() const override {
    return caps_;
  }

protected:
  caf::expected<std::byte*> do_allocate(size_t bytes) override {
    if (guard_ != nullptr)
      return guard_; // counted by device::allocate, nothing held
    const size_t rounded =
        (bytes + host_alignment - 1) / host_alignment * host_alignment;
    auto ptr = std::aligned_alloc(host_alignment, rounded);
    if (ptr == nullptr)
      return caf::make_error(gpu_errc::out_of_memory,
                             "aligned_alloc of " + std::to_string(rounded)
                                 + " B failed");
    return static_cast<std::byte*>(ptr);
  }

  void do_free(std::byte* data, size_t) noexcept override {
    if (data != guard_)
      std::free(data);
  }

  caf::error do_pin(std::byte*, size_t) override {
    return caf::none; // host memory needs no registration here
  }

  void do_unpin(std::byte*) noexcept override {
    // nothing registered
  }

  caf::expected<void*> do_make_stream() override {
    auto s = std::make_unique<host_stream>(thread_start_);
    if (s->start_error())
      return caf::make_error(gpu_errc::system_error,
                             "host stream thread: "
                                 + caf::to_string(s->start_error()));
    return static_cast<void*>(s.release());
  }

  void do_destroy_stream(void* handle) noexcept override {
    delete static_cast<host_stream*>(handle);
  }

  caf::expected<void*> do_make_event() override {
    return static_cast<void*>(
        new host_event(std::make_shared<host_event_state>()));
  }

  void do_destroy_event(void* handle) noexcept override {
    delete static_cast<host_event*>(handle);
  }

  caf::error do_copy(direction, const std::vector<raw_chunk>& chunks,
                     void* stream_handle, copy_method method) override {
    if (guard_ != nullptr)
      return unbacked("copy");
    auto& s = *static_cast<host_stream*>(stream_handle);
    if (method == copy_method::batched) {
      // One submission for the list, like one cudaMemcpyBatchAsync.
      s.submit([chunks] {
        for (const auto& c : chunks)
          std::memcpy(c.dst, c.src, c.length);
      });
    } else {
      for (const auto& c : chunks)
        s.submit([c] { std::memcpy(c.dst, c.src, c.length); });
    }
    return caf::none;
  }

  caf::error do_record(void* event_handle, void* stream_handle) override {
    auto state = *static_cast<host_event*>(event_handle);
    uint64_t mark = 0;
    {
      std::lock_guard<std::mutex> guard{state->mtx};
      mark = ++state->recorded;
    }
    static_cast<host_stream*>(stream_handle)->submit([state, mark] {
      {
        std::lock_guard<std::mutex> guard{state->mtx};
        if (state->done < mark)
          state->done = mark;
      }
      state->cv.notify_all();
    });
    return caf::none;
  }

  caf::expected<bool> do_query(void* event_handle) override {
    auto& state = **static_cast<host_event*>(event_handle);
    std::lock_guard<std::mutex> guard{state.mtx};
    return state.done >= state.recorded;
  }

  caf::error do_synchronize_event(void* event_handle) override {
    auto& state = **static_cast<host_event*>(event_handle);
    std::unique_lock<std::mutex> guard{state.mtx};
    const auto target = state.recorded;
    state.cv.wait(guard, [&] { return state.done >= target; });
    return caf::none;
  }

  caf::error do_synchronize_stream(void* stream_handle) override {
    static_cast<host_stream*>(stream_handle)->drain();
    return caf::none;
  }

  caf::error do_notify(void* event_handle, void* stream_handle,
                       std::function<void()> done) override {
    // Like cudaStreamWaitEvent + cudaLaunchHostFunc: the stream's worker
    // waits for the event's current mark, then calls `done`.
    auto state = *static_cast<host_event*>(event_handle);
    uint64_t target = 0;
    {
      std::lock_guard<std::mutex> guard{state->mtx};
      target = state->recorded;
    }
    static_cast<host_stream*>(stream_handle)
        ->submit([state, target, done = std::move(done)] {
          {
            std::unique_lock<std::mutex> guard{state->mtx};
            state->cv.wait(guard, [&] { return state->done >= target; });
          }
          done();
        });
    return caf::none;
  }

  caf::error do_enqueue_checksums(const raw_grid& grid, uint64_t* out,
                                  void* stream_handle) override {
    if (guard_ != nullptr)
      return unbacked("checksum");
    static_cast<host_stream*>(stream_handle)->submit([grid, out] {
      const size_t per_row =
          (grid.row_bytes + grid.segment_bytes - 1) / grid.segment_bytes;
      for (size_t r = 0; r < grid.rows; ++r) {
        const std::byte* row = grid.base + r * grid.row_stride;
        for (size_t k = 0; k < per_row; ++k) {
          size_t first = k * grid.segment_bytes;
          size_t len = std::min(grid.segment_bytes, grid.row_bytes - first);
          out[r * per_row + k] = block_checksum(row + first, len);
        }
      }
    });
    return caf::none;
  }

  caf::expected<dmabuf> do_export_dmabuf(std::byte*, size_t) override {
    return caf::make_error(gpu_errc::unsupported,
                           "host memory is registered as host memory, not "
                           "exported as dma-buf");
  }

  caf::error do_order_remote_writes() override {
    // Host memory: a remote write whose completion was observed is visible
    // to this thread once the completion's synchronisation happened (the
    // completion's own acquire gives the ordering); this compiler-only fence
    // keeps later reads from being moved before this call. (A thread fence
    // would add nothing, and ThreadSanitizer cannot model one.)
    std::atomic_signal_fence(std::memory_order_seq_cst);
    return caf::none;
  }

  caf::expected<uint64_t> do_checksum(const std::byte* data, size_t length,
                                      void* stream_handle) override {
    if (guard_ != nullptr)
      return unbacked("checksum");
    // In stream order, after the copies submitted before.
    std::promise<uint64_t> result;
    auto future = result.get_future();
    static_cast<host_stream*>(stream_handle)->submit([&result, data, length] {
      result.set_value(block_checksum(data, length));
    });
    return future.get();
  }

private:
  static caf::error unbacked(const char* what) {
    return caf::make_error(gpu_errc::invalid_argument,
                           std::string{what}
                               + " on an accounting-only host device "
                                 "(device_options::backed = false)");
  }

  device_capabilities caps_;
  std::byte* guard_; // the one page unbacked buffers point at, or null
  std::function<caf::error()> thread_start_; // device_options::thread_start
};

} // namespace

caf::expected<std::shared_ptr<device>>
make_host_device(const device_options& opts) {
  if (opts.hbm_budget == 0)
    return caf::make_error(gpu_errc::invalid_argument,
                           "host backend needs a non-zero HBM budget");
  std::byte* guard = nullptr;
  if (!opts.backed) {
    auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p =
        mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return caf::make_error(gpu_errc::out_of_memory,
                             "mmap of the accounting device's guard page "
                             "failed");
    guard = static_cast<std::byte*>(p);
  }
  return host_device::create(opts.hbm_budget, guard, opts);
}

} // namespace dualpath::gpu
