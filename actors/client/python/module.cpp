// The Python module `dualpath`: kv_client (actors/client/kv_client.hpp) for
// an engine's Python code. Same contracts as the C++ API, plus:
//  - KV pages are the caller's own memory, never copied: a torch tensor
//    (anything with data_ptr(), is_contiguous(), element_size(), numel() and
//    a device of type "cpu" or "cuda"), any object exposing
//    __cuda_array_interface__ (version 2 or 3: C-contiguous, writable, a
//    typestr of a whole number of bytes; device memory) or a writable
//    C-contiguous buffer (bytearray, numpy array). CUDA memory is
//    registered as device pages (kv_client::register_kv: staged through
//    pinned host memory); without a CUDA device its registration raises
//    dualpath.Error "... no CUDA device: <the driver's reason>". Malformed
//    objects raise ValueError naming what is wrong. The client keeps a
//    reference to every registered object, so the memory stays valid as
//    long as the client lives.
//  - Failures raise dualpath.Error with the rendered caf::error (category,
//    code and what was wrong); bad input to a call raises before anything
//    starts.
//  - wait_for_layer and wait release the GIL while they block, as does
//    Client.join while it waits for the deployment.
//  - Client(...) runs the embedded nodes; Client.join(...) joins a running
//    deployment (kv_client's deployment_config).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "actors/client/kv_client.hpp"
#include "actors/protocol/register.hpp"

namespace py = pybind11;
using namespace dualpath::actors::client;

namespace {

// What every failed call raises (as dualpath.Error).
struct client_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void raise(const caf::error& err) {
  throw client_error(dualpath::actors::render(err));
}

void check(const caf::error& err) {
  if (err)
    raise(err);
}

template <class T>
T value(caf::expected<T> x) {
  if (!x)
    raise(x.error());
  return std::move(*x);
}

// The memory behind a __cuda_array_interface__ (numba, cupy, torch, ...):
// https://numba.readthedocs.io/en/stable/cuda/cuda_array_interface.html
kv_layer_memory cuda_interface_memory(const py::object& obj,
                                      const std::string& where,
                                      uint64_t page_bytes) {
  auto bad = [&](const std::string& what) {
    return std::invalid_argument(where + "__cuda_array_interface__: " + what);
  };
  py::dict cai;
  try {
    cai = obj.attr("__cuda_array_interface__").cast<py::dict>();
  } catch (const py::error_already_set& e) {
    throw bad(std::string{"reading it raised: "} + e.what());
  } catch (const py::cast_error&) {
    throw bad("not a dict");
  }
  for (auto key : {"shape", "typestr", "data", "version"})
    if (!cai.contains(key))
      throw bad(std::string{"no '"} + key + "' entry");
  auto version = cai["version"].cast<int64_t>();
  if (version < 2 || version > 3)
    throw bad("version " + std::to_string(version) + " (2 or 3 understood)");
  if (cai.contains("mask") && !cai["mask"].is_none())
    throw bad("a masked array");
  // typestr: byte order, kind, bytes per item, e.g. "<f2", "|u1".
  auto typestr = cai["typestr"].cast<std::string>();
  uint64_t item = 0;
  bool typestr_ok =
      typestr.size() >= 3
      && std::string{"<>|="}.find(typestr[0]) != std::string::npos
      && std::string{"biufcmMV"}.find(typestr[1]) != std::string::npos;
  for (size_t i = 2; typestr_ok && i < typestr.size(); ++i) {
    if (typestr[i] < '0' || typestr[i] > '9' || item > 1'000'000)
      typestr_ok = false;
    else
      item = item * 10 + static_cast<uint64_t>(typestr[i] - '0');
  }
  if (!typestr_ok || item == 0)
    throw bad("typestr '" + typestr
              + "' is not <byte order><kind><bytes> (e.g. '<f2')");
  if (page_bytes % item != 0)
    throw bad("items of " + std::to_string(item)
              + " bytes do not tile a page of " + std::to_string(page_bytes)
              + " bytes");
  auto shape = cai["shape"].cast<std::vector<int64_t>>();
  uint64_t count = 1;
  for (auto dim : shape) {
    if (dim < 0)
      throw bad("negative dimension in shape");
    count *= static_cast<uint64_t>(dim);
  }
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    auto strides = cai["strides"].cast<std::vector<int64_t>>();
    if (strides.size() != shape.size())
      throw bad(std::to_string(strides.size()) + " strides for "
                + std::to_string(shape.size()) + " dimensions");
    // C-contiguous: each dimension's stride is the bytes of the dimensions
    // after it (a dimension of extent 1 may have any stride).
    int64_t expect = static_cast<int64_t>(item);
    for (size_t i = shape.size(); i-- > 0;) {
      if (shape[i] != 1 && strides[i] != expect)
        throw bad("strides are not C-contiguous (dimension " + std::to_string(i)
                  + " has stride " + std::to_string(strides[i])
                  + ", contiguous is " + std::to_string(expect) + ")");
      expect *= shape[i];
    }
  }
  auto data = cai["data"].cast<py::tuple>();
  if (data.size() != 2)
    throw bad("'data' is not a (pointer, read_only) pair");
  if (data[1].cast<bool>())
    throw bad("the memory is read-only");
  auto ptr = data[0].cast<uintptr_t>();
  if (ptr == 0)
    throw bad("a null data pointer");
  return kv_layer_memory{reinterpret_cast<void*>(ptr), count * item,
                         memory_kind::cuda};
}

// The memory of one layer: a CPU or CUDA tensor, an object with
// __cuda_array_interface__, or a writable contiguous buffer.
kv_layer_memory memory_of(const py::object& obj, size_t layer,
                          uint64_t page_bytes) {
  auto where = "layer " + std::to_string(layer) + ": ";
  if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size")) {
    auto device = py::str(obj.attr("device").attr("type")).cast<std::string>();
    if (device != "cpu" && device != "cuda")
      throw std::invalid_argument(where + "a " + device
                                  + " tensor; KV memory is host memory (CPU "
                                    "tensors) or CUDA device memory");
    if (!obj.attr("is_contiguous")().cast<bool>())
      throw std::invalid_argument(where + "the tensor is not contiguous");
    auto elem = obj.attr("element_size")().cast<uint64_t>();
    if (elem == 0 || page_bytes % elem != 0)
      throw std::invalid_argument(where + "elements of " + std::to_string(elem)
                                  + " bytes do not tile a page of "
                                  + std::to_string(page_bytes) + " bytes");
    auto bytes = obj.attr("numel")().cast<uint64_t>() * elem;
    auto ptr = obj.attr("data_ptr")().cast<uintptr_t>();
    return kv_layer_memory{reinterpret_cast<void*>(ptr), bytes,
                           device == "cuda" ? memory_kind::cuda
                                            : memory_kind::host};
  }
  if (py::hasattr(obj, "__cuda_array_interface__"))
    return cuda_interface_memory(obj, where, page_bytes);
  if (!PyObject_CheckBuffer(obj.ptr()))
    throw std::invalid_argument(where + "neither a tensor nor a buffer object");
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
      != 0) {
    PyErr_Clear();
    throw std::invalid_argument(where
                                + "the buffer is not writable and contiguous");
  }
  kv_layer_memory m{view.buf, static_cast<uint64_t>(view.len)};
  PyBuffer_Release(&view); // the client keeps the object itself alive
  return m;
}

load_path path_of(const std::string& s) {
  if (s == "auto")
    return load_path::automatic;
  if (s == "pe")
    return load_path::pe;
  if (s == "de")
    return load_path::de;
  if (s == "split")
    return load_path::split;
  throw std::invalid_argument("path '" + s + "': one of auto, pe, de, split");
}

dualpath::scheduler::read_mode reads_of(const std::string& s) {
  using dualpath::scheduler::read_mode;
  for (auto m :
       {read_mode::pe_only, read_mode::shorter_queue, read_mode::split})
    if (to_string(m) == s)
      return m;
  throw std::invalid_argument("reads '" + s
                              + "': one of pe_only, shorter_queue, split");
}

py::dict dict_of(const finished_op& f) {
  py::dict d;
  d["kind"] = f.kind == finished_op::kind_t::load ? "load" : "save";
  d["ticket"] = f.ticket;
  d["request_id"] = f.request_id;
  d["error"] = f.error ? py::object(py::str(dualpath::actors::render(f.error)))
                       : py::object(py::none());
  d["blocks_ok"] = f.blocks_ok;
  d["pe_blocks"] = f.pe_blocks;
  d["de_blocks"] = f.de_blocks;
  return d;
}

// A non-negative number of milliseconds; `name` is the argument's.
std::chrono::milliseconds ms(int64_t x, const char* name = "deadline_ms") {
  if (x < 0)
    throw std::invalid_argument(std::string{name} + " " + std::to_string(x)
                                + " is negative");
  return std::chrono::milliseconds{x};
}

// The Python object: the client and the registered memory's owners.
struct client {
  std::unique_ptr<kv_client> impl;
  std::vector<py::object> owners;
};

} // namespace

PYBIND11_MODULE(dualpath, m) {
  m.doc() = "dualpath's engine integration API (docs/integration.md)";
  py::register_exception<client_error>(m, "Error");
  py::class_<client>(m, "Client")
      .def(py::init([](const std::string& store_dir, uint32_t layers,
                       uint32_t block_tokens, uint32_t bytes_per_token_layer,
                       const std::string& model_id, const std::string& reads,
                       uint32_t buffer_blocks, int64_t deadline_ms) {
             client_config cfg;
             cfg.store_dir = store_dir;
             cfg.model_id = model_id;
             cfg.geometry.layers = layers;
             cfg.geometry.block_tokens = block_tokens;
             cfg.geometry.bytes_per_token_layer = bytes_per_token_layer;
             cfg.reads = reads_of(reads);
             cfg.buffer_blocks = buffer_blocks;
             cfg.default_deadline = ms(deadline_ms);
             return client{value(kv_client::make(std::move(cfg))), {}};
           }),
           py::arg("store_dir"), py::arg("layers"), py::arg("block_tokens"),
           py::arg("bytes_per_token_layer"), py::arg("model_id") = "model",
           py::arg("reads") = "split", py::arg("buffer_blocks") = 64,
           py::arg("deadline_ms") = 10000)
      .def_static(
          "join",
          [](const std::string& cluster_file, const std::string& node,
             const std::string& decode_node,
             std::optional<std::string> config_file,
             std::vector<std::string> sets, const std::string& reads,
             uint32_t buffer_blocks, int64_t deadline_ms, int64_t patience_ms) {
            deployment_config dep;
            dep.cluster_file = cluster_file;
            dep.node = node;
            dep.decode_node = decode_node;
            dep.config_file = std::move(config_file);
            dep.sets = std::move(sets);
            dep.patience = ms(patience_ms, "patience_ms");
            client_config cfg;
            cfg.deployment = std::move(dep);
            cfg.reads = reads_of(reads);
            cfg.buffer_blocks = buffer_blocks;
            cfg.default_deadline = ms(deadline_ms);
            std::optional<caf::expected<std::unique_ptr<kv_client>>> made;
            {
              py::gil_scoped_release nogil; // waits for the deployment
              made = kv_client::make(std::move(cfg));
            }
            return client{value(std::move(*made)), {}};
          },
          py::arg("cluster_file"), py::arg("node"), py::arg("decode_node") = "",
          py::arg("config_file") = py::none(),
          py::arg("sets") = std::vector<std::string>{},
          py::arg("reads") = "split", py::arg("buffer_blocks") = 64,
          py::arg("deadline_ms") = 10000, py::arg("patience_ms") = 30000,
          "Joins a running deployment (docs/integration.md): this process "
          "hosts `node` of the cluster file, the DE path reads on its "
          "decode node.")
      .def_property_readonly(
          "layers", [](const client& c) { return c.impl->geometry().layers; })
      .def_property_readonly("bytes_per_token_layer",
                             [](const client& c) {
                               return c.impl->geometry().bytes_per_token_layer;
                             })
      .def_property_readonly(
          "page_bytes", [](const client& c) { return c.impl->page_bytes(); })
      .def_property_readonly(
          "block_tokens",
          [](const client& c) { return c.impl->geometry().block_tokens; })
      .def_property_readonly("pages",
                             [](const client& c) { return c.impl->pages(); })
      .def_property_readonly(
          "kv_memory_path",
          [](const client& c) { return c.impl->kv_memory_path(); })
      .def("lookup",
           [](client& c, std::vector<uint32_t> tokens) {
             return c.impl->lookup(std::move(tokens));
           })
      .def("lookup_result",
           [](client& c, uint64_t ticket) -> py::object {
             auto r = c.impl->lookup_result(ticket);
             if (!r)
               return py::none();
             auto hit = value(std::move(*r));
             return py::make_tuple(hit.blocks, hit.hit_tokens);
           })
      .def("register_kv",
           [](client& c, const py::list& layers) {
             std::vector<kv_layer_memory> mem;
             std::vector<py::object> owners;
             for (size_t l = 0; l < layers.size(); ++l) {
               owners.push_back(layers[l]);
               mem.push_back(memory_of(owners.back(), l, c.impl->page_bytes()));
             }
             check(c.impl->register_kv(mem));
             c.owners = std::move(owners);
           })
      .def(
          "start_load",
          [](client& c, uint64_t request_id, std::vector<uint64_t> blocks,
             std::vector<uint32_t> pages, const std::string& path,
             int64_t deadline_ms) {
            load_request r;
            r.request_id = request_id;
            r.blocks = std::move(blocks);
            r.pages = std::move(pages);
            r.path = path_of(path);
            r.deadline = ms(deadline_ms);
            return value(c.impl->start_load(std::move(r)));
          },
          py::arg("request_id"), py::arg("blocks"), py::arg("pages"),
          py::arg("path") = "auto", py::arg("deadline_ms") = 0)
      .def(
          "wait_for_layer",
          [](client& c, uint64_t ticket, uint32_t layer) {
            caf::error err;
            {
              py::gil_scoped_release nogil;
              err = c.impl->wait_for_layer(ticket, layer);
            }
            check(err);
          },
          py::arg("ticket"), py::arg("layer"))
      .def(
          "start_save",
          [](client& c, uint64_t request_id, std::vector<uint32_t> tokens,
             uint32_t first_block, std::vector<uint32_t> pages,
             int64_t deadline_ms) {
            save_request r;
            r.request_id = request_id;
            r.tokens = std::move(tokens);
            r.first_block = first_block;
            r.pages = std::move(pages);
            r.deadline = ms(deadline_ms);
            return value(c.impl->start_save(std::move(r)));
          },
          py::arg("request_id"), py::arg("tokens"), py::arg("first_block"),
          py::arg("pages"), py::arg("deadline_ms") = 0)
      .def("wait",
           [](client& c, uint64_t ticket) {
             std::optional<caf::expected<finished_op>> r;
             {
               py::gil_scoped_release nogil;
               r = c.impl->wait(ticket);
             }
             return dict_of(value(std::move(*r)));
           })
      .def("finished",
           [](client& c) {
             py::list out;
             for (auto& f : c.impl->finished())
               out.append(dict_of(f));
             return out;
           })
      .def("load_errors",
           [](client& c, uint64_t ticket) {
             py::list out;
             for (auto& e : c.impl->load_errors(ticket))
               out.append(py::make_tuple(e.index, e.hash,
                                         dualpath::actors::render(e.error)));
             return out;
           })
      .def("block_file", [](const client& c, uint64_t hash) {
        return c.impl->block_file(hash);
      });
}
