#include "transport/storage/faulty_backend.hpp"

#include <cerrno>
#include <thread>

#include "transport/storage/syscall.hpp"

namespace dualpath::transport::storage {

faulty_backend::faulty_backend(backend_ptr inner, fault_plan plan)
    : inner_(std::move(inner)), plan_(std::move(plan)) {
  // nop
}

void faulty_backend::set_plan(fault_plan plan) {
  std::lock_guard<std::mutex> guard{mtx_};
  plan_ = std::move(plan);
  ops_ = 0;
}

fault_plan faulty_backend::plan() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return plan_;
}

bool faulty_backend::matches(const fault_plan& p,
                             const std::string& path) const {
  return p.path_filter.empty() || path.find(p.path_filter) != std::string::npos;
}

bool faulty_backend::count_op(const fault_plan& p) {
  std::lock_guard<std::mutex> guard{mtx_};
  return p.fail_after >= 0 && ops_++ >= p.fail_after;
}

std::string faulty_backend::name() const {
  return "faulty(" + inner_->name() + ")";
}

uint32_t faulty_backend::queue_depth() const {
  return inner_->queue_depth();
}

std::vector<read_result> faulty_backend::read(const std::vector<read_op>& ops,
                                              io_mode mode) {
  auto p = plan();
  // Decide per op before forwarding; failed ops are not forwarded.
  std::vector<read_result> results(ops.size(), read_result{size_t{0}});
  std::vector<read_op> fwd;
  std::vector<size_t> fwd_index;
  for (size_t i = 0; i < ops.size(); ++i) {
    auto op = ops[i];
    if (matches(p, op.path)) {
      if (p.delay.count() > 0)
        std::this_thread::sleep_for(p.delay); // a backend thread, not an actor
      if (count_op(p)) {
        ++injected_;
        results[i] = caf::make_error(storage_errc::injected_fault,
                                     "read(" + op.path + ")");
        continue;
      }
      if (p.truncate_at >= 0) {
        auto end = static_cast<uint64_t>(p.truncate_at);
        op.length = op.offset >= end
                        ? 0
                        : std::min<uint64_t>(op.length, end - op.offset);
      }
    }
    fwd.push_back(op);
    fwd_index.push_back(i);
  }
  auto res = inner_->read(fwd, mode);
  for (size_t k = 0; k < fwd.size(); ++k) {
    auto i = fwd_index[k];
    auto& op = fwd[k];
    if (res[k] && matches(p, op.path) && p.corrupt_offset >= 0) {
      auto at = static_cast<uint64_t>(p.corrupt_offset);
      if (at >= op.offset && at < op.offset + *res[k]) {
        op.buffer[at - op.offset] = ~op.buffer[at - op.offset];
        ++injected_;
      }
    }
    if (res[k] && matches(p, op.path) && p.truncate_at >= 0)
      ++injected_;
    results[i] = std::move(res[k]);
  }
  return results;
}

caf::error faulty_backend::write_atomic(const std::string& path,
                                        const std::byte* data, size_t len,
                                        durability sync) {
  auto p = plan();
  if (matches(p, path)) {
    if (p.delay.count() > 0)
      std::this_thread::sleep_for(p.delay);
    if (p.disk_full) {
      ++injected_;
      return sys_error("pwrite", path, ENOSPC);
    }
    if (count_op(p)) {
      ++injected_;
      return caf::make_error(storage_errc::injected_fault,
                             "write(" + path + ")");
    }
  }
  return inner_->write_atomic(path, data, len, sync);
}

caf::expected<std::vector<std::string>>
faulty_backend::list(const std::string& dir) {
  auto p = plan();
  if (p.unreadable_directories && matches(p, dir)) {
    ++injected_;
    return caf::make_error(storage_errc::unreadable_directory,
                           "opendir(" + dir
                               + "): Permission denied "
                                 "(injected)");
  }
  return inner_->list(dir);
}

caf::error faulty_backend::make_dir(const std::string& dir) {
  return inner_->make_dir(dir);
}

} // namespace dualpath::transport::storage
