# ctest-label: integration
"""KV pages in CUDA memory through `import dualpath`: objects exposing
__cuda_array_interface__ (v2/v3) and torch CUDA tensors are registered as
device pages without copies. Malformed interfaces (strides not
C-contiguous, read-only, a bad typestr, a size that is no whole number of
the layer's pages, a masked array, an unknown version) raise ValueError
naming what is wrong; where no CUDA device exists a well-formed interface
(a fake device address) and a duck-typed CUDA tensor are refused with
dualpath.Error "... no CUDA device: <the driver's reason>" and nothing is
registered (host pages register afterwards). Where torch has CUDA, CUDA
tensor pages load byte-exact on each path."""

import os
import shutil
import sys
import tempfile

import dualpath

LAYERS, BT, BPT = 2, 4, 64
PAGE = BT * BPT
PAGES = 8
FAKE = 0x7F0000000000

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


class Interface:
    """An object exposing only __cuda_array_interface__ (as numba/cupy do)."""

    def __init__(self, **over):
        self.__cuda_array_interface__ = dict(
            shape=(PAGES, BT, BPT // 2), typestr="<f2", data=(FAKE, False),
            strides=None, version=3, stream=1)
        self.__cuda_array_interface__.update(over)


class Device:
    type = "cuda"


class FakeCudaTensor:
    """Duck-typed like a torch CUDA tensor, at a fake address."""
    device = Device()

    def data_ptr(self):
        return FAKE

    def element_size(self):
        return 2

    def numel(self):
        return PAGES * PAGE // 2

    def is_contiguous(self):
        return True


def refused(client, layers, exc, words, what):
    try:
        client.register_kv(layers)
    except exc as e:
        msg = str(e)
        ok = all(w in msg for w in words)
        check(ok, f"{what}: refused ({msg})")
        return msg
    check(False, f"{what}: accepted")
    return ""


def cuda_available():
    try:
        import torch
    except ImportError as e:
        return None, f"PyTorch is not installed ({e})"
    if not torch.cuda.is_available():
        return None, "torch has no CUDA device (torch.cuda.is_available() " \
                     "is False; Debian's python3-torch is CPU-only)"
    return torch, ""


def main():
    store = tempfile.mkdtemp(prefix="dp-cudapages-")
    try:
        client = dualpath.Client(store, LAYERS, BT, BPT, model_id="m")
        bad = [
            (dict(strides=(PAGE, 2, BPT * 2)), "strides are not C-contiguous"),
            (dict(data=(FAKE, True)), "read-only"),
            (dict(typestr="f2"), "typestr 'f2'"),
            (dict(typestr="<x4"), "typestr '<x4'"),
            (dict(typestr="<f0"), "typestr '<f0'"),
            (dict(version=1), "version 1"),
            (dict(mask=object()), "masked"),
            (dict(data=(0, False)), "null data pointer"),
        ]
        for over, words in bad:
            refused(client, [Interface(**over), Interface()], ValueError,
                    ["layer 0", "__cuda_array_interface__", words], words)
        # Contiguous strides given explicitly are accepted as such.
        contiguous = dict(strides=(PAGE, BPT, 2))
        # A size that is no whole number of pages.
        refused(client, [Interface(shape=(PAGES, BT, BPT // 2 + 1)),
                         Interface()], dualpath.Error,
                ["layer 0", "no whole number of pages"],
                "size not matching the pages")
        refused(client, [Interface(), Interface(shape=(PAGES - 1, BT,
                                                       BPT // 2))],
                dualpath.Error, ["layer 1", "pages, layer 0 has"],
                "layers of different page counts")
        torch, why = cuda_available()
        if torch is None:
            msg = refused(client, [Interface(), Interface(**contiguous)],
                          dualpath.Error, ["layer 0: no CUDA device: "],
                          "well-formed interface, no CUDA device")
            refused(client, [FakeCudaTensor(), FakeCudaTensor()],
                    dualpath.Error, ["layer 0: no CUDA device: "],
                    "duck-typed CUDA tensor, no CUDA device")
            check(client.pages == 0 and client.kv_memory_path == "",
                  "nothing registered after the refusals")
            host = [bytearray(PAGES * PAGE) for _ in range(LAYERS)]
            client.register_kv(host)
            check(client.pages == PAGES
                  and client.kv_memory_path.startswith("host pages"),
                  f"host pages register afterwards ({client.kv_memory_path})")
            print(f"SKIP torch CUDA tensor loads: {why}")
        else:
            run_on_device(torch, client)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)


def run_on_device(torch, client):
    pages = [torch.zeros(PAGES, BT, BPT, dtype=torch.uint8, device="cuda")
             for _ in range(LAYERS)]
    client.register_kv(pages)
    check(client.kv_memory_path.startswith("device pages on cuda device"),
          f"torch CUDA tensors registered ({client.kv_memory_path})")
    # Save blocks computed on the device, reload them into other pages.
    tokens = list(range(1000, 1000 + 3 * BT + 1))
    for l, t in enumerate(pages):
        t[:3] = torch.randint(0, 256, (3, BT, BPT), dtype=torch.uint8,
                              device="cuda", generator=None)
    want = [t[:3].cpu().clone() for t in pages]
    ticket = client.start_save(1, tokens, 0, [0, 1, 2])
    done = client.wait(ticket)
    check(done["error"] is None, f"save from device pages ({done['error']})")
    for path in ["pe", "de", "split"]:
        for t in pages:
            t[4:7].zero_()
        blocks, _ = lookup(client, tokens)
        ticket = client.start_load(2, blocks, [4, 5, 6], path)
        for l in range(LAYERS):
            client.wait_for_layer(ticket, l)
            check(torch.equal(pages[l][4:7].cpu(), want[l]),
                  f"path {path}: layer {l} byte-exact in device memory "
                  "once waited for")
        done = client.wait(ticket)
        check(done["error"] is None and done["blocks_ok"] == 3,
              f"path {path}: load finished ({done['error']})")


def lookup(client, tokens):
    import time
    t = client.lookup(tokens)
    while True:
        r = client.lookup_result(t)
        if r is not None:
            return r
        time.sleep(0.001)


if __name__ == "__main__":
    main()
