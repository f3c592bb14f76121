#include "transport/storage/backend.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/enum_names.hpp"
#include "transport/storage/block_format.hpp"
#include "transport/storage/io_uring_backend.hpp"
#include "transport/storage/pread_backend.hpp"
#include "transport/storage/syscall.hpp"

namespace dualpath::transport::storage {

storage_backend::~storage_backend() {
  // nop
}

constexpr std::string_view io_mode_names[] = {"buffered", "direct"};

std::string to_string(io_mode x) {
  return config::name_of(x, io_mode_names, "io_mode");
}

constexpr std::string_view backend_kind_names[] = {"auto", "io_uring", "pread"};

std::string to_string(backend_kind x) {
  return config::name_of(x, backend_kind_names, "backend_kind");
}

bool from_string(std::string_view str, backend_kind& x) {
  return config::parse_name(str, backend_kind_names, x);
}

caf::expected<backend_ptr> make_backend(const backend_config& cfg) {
  if (cfg.kind != backend_kind::pread) {
    auto uring = io_uring_backend::make(cfg.queue_depth);
    if (uring)
      return backend_ptr{std::move(*uring)};
    if (cfg.kind == backend_kind::io_uring)
      return std::move(uring.error());
    // auto: io_uring is unavailable (old kernel, seccomp, disabled by
    // sysctl); the pread thread pool does the same job with threads.
  }
  return backend_ptr{pread_backend::make(cfg.queue_depth)};
}

// -- aligned_buffer -----------------------------------------------------------

void aligned_buffer::deleter::operator()(std::byte* p) const {
  if (mapped > 0)
    ::munmap(p, mapped);
  else
    std::free(p);
}

caf::expected<aligned_buffer> aligned_buffer::make(size_t len) {
  aligned_buffer result;
  auto n = align_up(len == 0 ? 1 : len, io_alignment);
  if (n >= (size_t{1} << 20)) {
    // Page-aligned, zero-filled by the kernel, resident only once touched.
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      return sys_error("mmap", std::to_string(n), errno);
    result.ptr_ = std::unique_ptr<std::byte, deleter>(
        static_cast<std::byte*>(m), deleter{n});
    result.size_ = n;
    return result;
  }
  void* p = nullptr;
  if (auto rc = ::posix_memalign(&p, io_alignment, n); rc != 0)
    return sys_error("posix_memalign", std::to_string(n), rc);
  std::memset(p, 0, n);
  result.ptr_.reset(static_cast<std::byte*>(p));
  result.size_ = n;
  return result;
}

// -- POSIX helpers
// -------------------------------------------------------------

namespace {

// Closes an fd on scope exit.
struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
};

std::atomic<uint64_t> tmp_counter{0};

std::string dir_of(const std::string& path) {
  auto pos = path.rfind('/');
  return pos == std::string::npos ? std::string{"."} : path.substr(0, pos);
}

} // namespace

caf::error posix_write_atomic(const std::string& path, const std::byte* data,
                              size_t len, durability sync) {
  caf::error err;
  // A name unique per process and call, so concurrent writers of the same
  // block never share a temporary file.
  auto tmp = path + ".tmp." + std::to_string(::getpid()) + "."
             + std::to_string(tmp_counter++);
  fd_guard fd{sys_call(
      "open", tmp,
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644),
      err)};
  if (err)
    return err;
  size_t done = 0;
  while (done < len) {
    auto n = sys_call(
        "pwrite", tmp,
        ::pwrite(fd.fd, data + done, len - done, static_cast<off_t>(done)),
        err);
    if (err) {
      if (errno == EINTR) {
        err = caf::error{};
        continue;
      }
      ::unlink(tmp.c_str());
      return err;
    }
    done += static_cast<size_t>(n);
  }
  if (sync == durability::fsync
      && sys_call("fsync", tmp, ::fsync(fd.fd), err) < 0) {
    ::unlink(tmp.c_str());
    return err;
  }
  if (sys_call("rename", path, ::rename(tmp.c_str(), path.c_str()), err) < 0) {
    ::unlink(tmp.c_str());
    return err;
  }
  if (sync == durability::fsync) {
    auto dir = dir_of(path);
    fd_guard dfd{
        sys_call("open", dir,
                 ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC), err)};
    if (err)
      return err;
    if (sys_call("fsync", dir, ::fsync(dfd.fd), err) < 0)
      return err;
  }
  return caf::none;
}

caf::expected<std::vector<std::string>> posix_list(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d{::opendir(dir.c_str()), ::closedir};
  if (!d) {
    auto e = errno;
    return caf::make_error(storage_errc::unreadable_directory,
                           "opendir(" + dir + "): " + std::strerror(e));
  }
  std::vector<std::string> names;
  errno = 0;
  while (auto* ent = ::readdir(d.get())) {
    std::string name = ent->d_name;
    if (name != "." && name != "..")
      names.push_back(std::move(name));
  }
  if (errno != 0) {
    auto e = errno;
    return caf::make_error(storage_errc::unreadable_directory,
                           "readdir(" + dir + "): " + std::strerror(e));
  }
  return names;
}

caf::error posix_make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST)
    return caf::none;
  return sys_error("mkdir", dir, errno);
}

posix_file_backend::posix_file_backend(std::string name, uint32_t depth)
    : name_(std::move(name)), depth_(depth) {
}

std::string posix_file_backend::name() const {
  return name_;
}

uint32_t posix_file_backend::queue_depth() const {
  return depth_;
}

caf::error posix_file_backend::write_atomic(const std::string& path,
                                            const std::byte* data, size_t len,
                                            durability sync) {
  return posix_write_atomic(path, data, len, sync);
}

caf::expected<std::vector<std::string>>
posix_file_backend::list(const std::string& dir) {
  return posix_list(dir);
}

caf::error posix_file_backend::make_dir(const std::string& dir) {
  return posix_make_dir(dir);
}

namespace {

std::string file_type_name(mode_t m) {
  if (S_ISREG(m))
    return "regular file";
  if (S_ISDIR(m))
    return "directory";
  if (S_ISFIFO(m))
    return "FIFO";
  if (S_ISSOCK(m))
    return "socket";
  if (S_ISCHR(m))
    return "character device";
  if (S_ISBLK(m))
    return "block device";
  if (S_ISLNK(m))
    return "symbolic link";
  return "special file";
}

} // namespace

caf::expected<int> posix_open_read(const std::string& path, io_mode mode) {
  // Only a regular file (or a symlink to one) is a block file. Anything else
  // (a FIFO, whose open() would wait for a writer forever; a socket; a
  // device, whose open() may have side effects) is refused before opening
  // it, and the open itself never blocks, in case the path was swapped in
  // between: the fstat() after it decides.
  caf::error err;
  struct stat st {};
  if (sys_call("stat", path, ::stat(path.c_str(), &st), err) < 0)
    return err;
  auto not_regular = [&](mode_t m) {
    return caf::make_error(storage_errc::not_regular_file,
                           path + " is a " + file_type_name(m)
                               + ", not a regular file");
  };
  if (!S_ISREG(st.st_mode))
    return not_regular(st.st_mode);
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK
              | (mode == io_mode::direct ? O_DIRECT : 0);
  auto fd = sys_call("open", path, ::open(path.c_str(), flags), err);
  if (err)
    return err;
  if (sys_call("fstat", path, ::fstat(fd, &st), err) < 0
      || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return err ? err : not_regular(st.st_mode);
  }
  // Regular files ignore O_NONBLOCK; cleared all the same so that reads
  // behave as documented for blocking descriptors.
  auto fl = sys_call("fcntl(F_GETFL)", path, ::fcntl(fd, F_GETFL), err);
  if (fl < 0
      || sys_call("fcntl(F_SETFL)", path,
                  ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK), err)
             < 0) {
    ::close(fd);
    return err;
  }
  return fd;
}

} // namespace dualpath::transport::storage
