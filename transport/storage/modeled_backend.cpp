#include "transport/storage/modeled_backend.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "transport/storage/block_format.hpp"
#include "transport/storage/errors.hpp"

namespace dualpath::transport::storage {

namespace {

// What a stored "file" is reduced to: enough to rebuild its image.
struct modeled_file {
  block_header header; // layer checksums dropped (rebuilt on read)
  size_t size = 0;
};

class modeled_backend final : public storage_backend {
public:
  std::string name() const override {
    return "modeled";
  }

  uint32_t queue_depth() const override {
    return 1;
  }

  bool keeps_payload() const override {
    return false;
  }

  std::vector<read_result> read(const std::vector<read_op>& ops,
                                io_mode) override {
    std::vector<read_result> out;
    out.reserve(ops.size());
    for (auto& op : ops)
      out.push_back(read_one(op));
    return out;
  }

  caf::error write_atomic(const std::string& path, const std::byte* data,
                          size_t len, durability) override {
    auto hdr = decode_header(data, len);
    if (!hdr)
      return std::move(hdr.error());
    hdr->layer_checksums.clear();
    hdr->layer_checksums.shrink_to_fit();
    std::lock_guard<std::mutex> guard{mtx_};
    files_[path] = modeled_file{std::move(*hdr), len};
    return caf::none;
  }

  caf::expected<std::vector<std::string>>
  list(const std::string& dir) override {
    std::lock_guard<std::mutex> guard{mtx_};
    if (dirs_.count(dir) == 0)
      return caf::make_error(storage_errc::unreadable_directory,
                             "modeled storage has no directory " + dir);
    std::set<std::string> names;
    auto prefix = dir + "/";
    auto child = [&](const std::string& path) {
      auto rest = path.substr(prefix.size());
      names.insert(rest.substr(0, rest.find('/')));
    };
    for (auto i = dirs_.lower_bound(prefix);
         i != dirs_.end() && i->compare(0, prefix.size(), prefix) == 0; ++i)
      child(*i);
    for (auto i = files_.lower_bound(prefix);
         i != files_.end() && i->first.compare(0, prefix.size(), prefix) == 0;
         ++i)
      child(i->first);
    return std::vector<std::string>{names.begin(), names.end()};
  }

  caf::error make_dir(const std::string& dir) override {
    std::lock_guard<std::mutex> guard{mtx_};
    dirs_.insert(dir);
    return caf::none;
  }

private:
  read_result read_one(const read_op& op) {
    modeled_file f;
    {
      std::lock_guard<std::mutex> guard{mtx_};
      auto i = files_.find(op.path);
      if (i == files_.end())
        return caf::make_error(storage_errc::missing_block,
                               "modeled storage has no file " + op.path);
      f = i->second;
    }
    if (op.offset >= f.size)
      return size_t{0};
    auto n = std::min<size_t>(op.length, f.size - op.offset);
    kv_geometry geo{f.header.layers, f.header.tokens,
                    f.header.bytes_per_token_layer};
    // The whole image is rebuilt; a range read copies its part.
    std::vector<std::byte> image(geo.file_bytes());
    if (auto err = make_block(geo, f.header.model_id, f.header.hash,
                              f.header.parent, image.data()))
      return err;
    std::memcpy(op.buffer, image.data() + op.offset, n);
    return n;
  }

  std::mutex mtx_;
  std::map<std::string, modeled_file> files_;
  std::set<std::string> dirs_;
};

} // namespace

backend_ptr make_modeled_backend() {
  return std::make_shared<modeled_backend>();
}

} // namespace dualpath::transport::storage
