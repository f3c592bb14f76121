# ctest-label: integration
"""dualpath's first real client: a PyTorch transformer (tiny_transformer.py)
whose prefix KV is loaded through `import dualpath` (kv_client over the
embedded nodes, real files). For a multi-turn conversation, prefill of turn
t+1 with its prefix loaded on the PE path, the DE path and split gives the
logits of a full recompute within atol 1e-5 + rtol 1e-4 (float32; the two
runs differ only in the order of floating-point sums), each layer waited for
before its attention; the blocks saved after turn t reload byte-exact; a
block damaged in its file is reported as a load error and the fallback
recompute gives the same logits."""

import os
import random
import shutil
import sys
import tempfile

try:
    import torch
except ImportError as e:
    print(f"SKIP actors.client.torch_model: PyTorch is not installed ({e}); "
          "apt-get install python3-torch")
    sys.exit(77)

import dualpath
import tiny_transformer as tt

checks = tt.Checklist()
check = checks.check
same_logits = checks.same_logits


def main():
    torch.manual_seed(0)
    rng = random.Random(7)
    cfg = tt.Config()
    bt = cfg.block_tokens
    store = tempfile.mkdtemp(prefix="dp-torch-")
    try:
        client = dualpath.Client(store, cfg.layers, bt,
                                 cfg.bytes_per_token_layer, model_id="tiny")
        engine = tt.Engine(tt.TinyTransformer(cfg, pages=96), client)
        reference = tt.TinyTransformer(cfg, pages=96)  # full recomputes

        def full(tokens):
            return reference.prefill(tokens, list(range(-(-len(tokens) // bt))))

        # Turn 1 computes everything and saves it; turns 2..4 load their
        # prefix on each path in turn.
        tokens = [rng.randrange(cfg.vocab) for _ in range(10)]
        for turn, path in enumerate([None, "pe", "de", "split"], start=1):
            logits, cached, pages = engine.prefill(tokens, path=path or "auto")
            want = full(tokens)[cached:]
            if path:
                done = engine.last["loaded"]
                check(cached > 0 and done["error"] is None
                      and done["blocks_ok"] * bt == cached,
                      f"turn {turn}: {cached // bt} prefix blocks loaded "
                      f"on path {path} (pe {done['pe_blocks']}, "
                      f"de {done['de_blocks']})")
                if path == "pe":
                    check(done["de_blocks"] == 0, "pe path: no DE-side block")
                if path == "de":
                    check(done["pe_blocks"] == 0, "de path: no PE-side block")
                if path == "split":
                    check(done["pe_blocks"] > 0 and done["de_blocks"] > 0,
                          "split: blocks on both paths")
            same_logits(logits, want, f"turn {turn} ({len(tokens)} tokens, "
                        f"{cached} cached)")
            # The blocks saved after this turn reload byte-exact.
            blocks, _ = engine.lookup(tokens)
            check(len(blocks) == len(tokens) // bt,
                  f"turn {turn}: every full block stored")
            scratch = engine.alloc(len(blocks))
            t = client.start_load(1000 + turn, blocks, scratch, path="de")
            done = client.wait(t)
            client.finished()
            exact = done["error"] is None and all(
                torch.equal(kv[s], kv[p])
                for kv in engine.model.kv
                for s, p in zip(scratch, pages[:len(blocks)]))
            check(exact, f"turn {turn}: saved blocks reload byte-exact")
            engine.release(scratch)
            engine.release(pages)
            # The reply and the next user message.
            tokens = tokens + [rng.randrange(cfg.vocab) for _ in range(7)]

        # A block damaged in storage: flip bytes of its file's payload.
        blocks, _ = engine.lookup(tokens)
        victim = 2
        path = client.block_file(blocks[victim])
        with open(path, "r+b") as f:
            f.seek(4096 + 10)
            b = f.read(4)
            f.seek(4096 + 10)
            f.write(bytes(x ^ 0xFF for x in b))
        logits, cached, pages = engine.prefill(tokens, path="split")
        errors = engine.last["errors"]
        check([e[0] for e in errors] == [victim],
              f"damaged block {victim} reported as a load error: {errors}")
        check(cached == victim * bt,
              f"fallback recomputes from block {victim} ({cached} cached)")
        same_logits(logits, full(tokens)[cached:], "fallback recompute")
        engine.release(pages)
        # The fallback saved the recomputed blocks again: the file is whole.
        logits, cached, pages = engine.prefill(tokens, path="pe")
        check(engine.last["errors"] == []
              and cached == len(tokens) // bt * bt,
              "after the fallback's save every block loads again")
        same_logits(logits, full(tokens)[cached:], "reload after repair")
        engine.release(pages)

        # Bad input is refused with a clear error, nothing starts.
        try:
            client.start_load(1, blocks[:2], [0, 10_000])
            check(False, "a page past the memory is refused")
        except dualpath.Error as e:
            check("past the registered memory" in str(e),
                  f"a page past the memory is refused: {e}")
        try:
            dualpath.Client(store, cfg.layers, bt,
                            cfg.bytes_per_token_layer).register_kv(
                [torch.zeros(3, 5)] * cfg.layers)
            check(False, "memory of no whole page is refused")
        except dualpath.Error as e:
            check("whole number of pages" in str(e),
                  f"memory of no whole page is refused: {e}")
        try:
            c2 = dualpath.Client(store, cfg.layers, bt,
                                 cfg.bytes_per_token_layer)
            c2.register_kv([torch.zeros(4, bt, 2, cfg.heads,
                                        cfg.head_dim).transpose(0, 1)]
                           * cfg.layers)
            check(False, "a non-contiguous tensor is refused")
        except ValueError as e:
            check("not contiguous" in str(e),
                  f"a non-contiguous tensor is refused: {e}")
    finally:
        shutil.rmtree(store, ignore_errors=True)
    checks.finish()


if __name__ == "__main__":
    main()
