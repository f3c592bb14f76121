// The storage backend interface (in the spirit of LevelDB's Env): the few
// file operations the block store needs, implemented once per backend and file
// (io_uring_backend, pread_backend) and decorated for fault injection
// (faulty_backend). Backends are chosen by config (storage.backend =
// auto|io_uring|pread); `auto` probes io_uring and falls back to pread.
//
// Thread safety: every member function of every backend may be called from
// any thread concurrently. Ownership: backends are shared (shared_ptr) by the
// stores and readers that use them; buffers passed in stay owned by callers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

namespace dualpath::transport::storage {

/// How reads reach the file: through the page cache or with O_DIRECT (then
/// offsets, lengths and buffers must be multiples of io_alignment).
enum class io_mode : uint8_t {
  buffered = 0,
  direct = 1,
};

/// Whether a write is flushed to the device (fsync of file and directory)
/// before it counts as done.
enum class durability : uint8_t {
  none = 0,
  fsync = 1,
};

/// Which backend to build.
enum class backend_kind : uint8_t {
  automatic = 0, ///< io_uring if it can be set up, else pread.
  io_uring = 1,
  pread = 2,
};

std::string to_string(io_mode x);
std::string to_string(backend_kind x);

/// Parses "auto", "io_uring" or "pread".
bool from_string(std::string_view str, backend_kind& x);

/// One read: `length` bytes at `offset` of `path` into `buffer`.
struct read_op {
  std::string path;
  uint64_t offset = 0;
  std::byte* buffer = nullptr;
  size_t length = 0;
};

/// Bytes read (fewer than requested only at the end of the file) or an error.
using read_result = caf::expected<size_t>;

class storage_backend {
public:
  virtual ~storage_backend();

  /// The backend's name ("io_uring", "pread", "faulty(io_uring)").
  virtual std::string name() const = 0;

  /// How many reads one call to read() keeps in flight at most.
  virtual uint32_t queue_depth() const = 0;

  /// Performs every read of `ops`, at most queue_depth() at a time, and
  /// returns one result per op (same order). Blocks the calling thread until
  /// all are done; errors of single ops do not affect the others.
  virtual std::vector<read_result> read(const std::vector<read_op>& ops,
                                        io_mode mode) = 0;

  /// Makes `data` the complete content of `path` atomically: a temporary file
  /// in the same directory is written (and fsynced if asked) and renamed over
  /// `path`, so readers see the old file or the whole new one. Concurrent
  /// writers of the same path are safe (the last rename wins). ENOSPC fails
  /// with disk_full.
  virtual caf::error write_atomic(const std::string& path,
                                  const std::byte* data, size_t len,
                                  durability sync) = 0;

  /// Names of the entries of directory `dir` (without "." and "..").
  /// Fails with unreadable_directory.
  virtual caf::expected<std::vector<std::string>>
  list(const std::string& dir) = 0;

  /// Creates directory `dir` if absent (its parent must exist).
  virtual caf::error make_dir(const std::string& dir) = 0;

  /// Whether the backend keeps what is written. A block_store over a backend
  /// that does not (the modeled one) keeps its blocks in its index only and
  /// regenerates their deterministic content on read (block_store.hpp), so
  /// no KV is filled, written or held per block.
  virtual bool keeps_payload() const {
    return true;
  }
};

/// A backend on the local file system that writes, lists and creates
/// directories with the POSIX helpers below (posix_write_atomic, posix_list,
/// posix_make_dir); its subclasses differ only in how they read (io_uring,
/// pread) and name the backend and its depth when constructed.
class posix_file_backend : public storage_backend {
public:
  std::string name() const override;
  uint32_t queue_depth() const override;
  caf::error write_atomic(const std::string& path, const std::byte* data,
                          size_t len, durability sync) override;
  caf::expected<std::vector<std::string>> list(const std::string& dir) override;
  caf::error make_dir(const std::string& dir) override;

protected:
  posix_file_backend(std::string name, uint32_t depth);

private:
  std::string name_;
  uint32_t depth_;
};

using backend_ptr = std::shared_ptr<storage_backend>;

/// Configuration of a backend.
struct backend_config {
  backend_kind kind = backend_kind::automatic;
  uint32_t queue_depth = 32; ///< Reads in flight (io_uring SQ size, threads).
};

/// Builds the configured backend. `automatic` returns the io_uring backend if
/// a ring can be set up and the pread backend otherwise; an explicit io_uring
/// fails with backend_unavailable when it cannot.
caf::expected<backend_ptr> make_backend(const backend_config& cfg);

/// A heap buffer aligned to io_alignment (for O_DIRECT), freed on destruction.
class aligned_buffer {
public:
  aligned_buffer() = default;

  /// Allocates `len` bytes (rounded up to io_alignment), zero-filled. From
  /// 1 MiB on the memory is an anonymous mapping whose zero pages become
  /// resident only when touched (a large pool costs what it holds).
  static caf::expected<aligned_buffer> make(size_t len);

  std::byte* data() const {
    return ptr_.get();
  }

  size_t size() const {
    return size_;
  }

private:
  struct deleter {
    deleter() noexcept : mapped(0) {
      // nop
    }
    explicit deleter(size_t bytes) noexcept : mapped(bytes) {
      // nop
    }
    size_t mapped; ///< Bytes of an anonymous mapping; 0: heap memory.
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, deleter> ptr_;
  size_t size_ = 0;
};

// -- POSIX helpers shared by the backends (defined in backend.cpp) ----------

/// tmp + write + optional fsync + rename + optional directory fsync.
caf::error posix_write_atomic(const std::string& path, const std::byte* data,
                              size_t len, durability sync);

/// readdir-based listing.
caf::expected<std::vector<std::string>> posix_list(const std::string& dir);

/// mkdir that accepts an existing directory.
caf::error posix_make_dir(const std::string& dir);

/// open(2) for reading with O_DIRECT when asked; returns the fd or an error.
/// Never blocks: anything but a regular file (or a symlink to one) is
/// refused with storage_errc::not_regular_file without being opened.
caf::expected<int> posix_open_read(const std::string& path, io_mode mode);

} // namespace dualpath::transport::storage
