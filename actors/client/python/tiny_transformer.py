"""A small decoder-only transformer in PyTorch with paged KV and real
attention: dualpath's first real client (docs/integration.md).

Random weights from a fixed seed; `layers` pre-norm blocks of causal
multi-head attention and an MLP. The KV cache is paged as dualpath's block
format lays out a Layer Block: one CPU tensor per layer of shape
[pages, block_tokens, 2, heads, head_dim] (float32, contiguous), so page p
of layer l holds the keys and values of one block's tokens, token-major.
`prefill` computes only the tokens after `cached` (their prefix's KV is
already in the pages, loaded through dualpath or computed earlier) and
calls `wait(layer)` before each layer's attention reads the pages.

`Engine` wires the model to a dualpath.Client the way an engine's
connector does: look up the stored prefix, load it into freshly allocated
pages while the prefill runs layer by layer, fall back to recomputing from
the first block that failed, save the new full blocks.
"""

import sys
import time

import torch

import dualpath


# The tolerance a prefill with loaded KV meets against a full recompute
# (float32: the two differ only in the order of floating-point sums).
ATOL, RTOL = 1e-5, 1e-4


def logits_match(a, b):
    """(whether a equals b within ATOL + RTOL, the largest |a - b|)."""
    return (torch.allclose(a, b, atol=ATOL, rtol=RTOL),
            (a - b).abs().max().item())


class Checklist:
    """A test's checks: each printed as ok/FAIL, the failed ones kept."""

    def __init__(self):
        self.failures = []

    def check(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)

    def finish(self):
        """Exits 1 naming how many checks failed, else says all passed."""
        if self.failures:
            print(f"{len(self.failures)} check(s) failed")
            sys.exit(1)
        print("all checks passed")

    def same_logits(self, a, b, what):
        ok, diff = logits_match(a, b)
        self.check(ok, f"{what}: logits match a full recompute "
                   f"(max |diff| {diff:.2e})")


class Config:
    def __init__(self, vocab=97, d_model=32, heads=4, layers=3,
                 block_tokens=4, max_tokens=256, seed=1234):
        self.vocab = vocab
        self.d_model = d_model
        self.heads = heads
        self.layers = layers
        self.block_tokens = block_tokens
        self.max_tokens = max_tokens
        self.seed = seed

    @property
    def head_dim(self):
        return self.d_model // self.heads

    @property
    def bytes_per_token_layer(self):
        return 2 * self.d_model * 4  # keys and values, float32


class TinyTransformer:
    def __init__(self, cfg, pages):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        d = cfg.d_model

        def w(*shape):
            return torch.randn(*shape, generator=g) / (shape[0] ** 0.5)

        self.embed = w(cfg.vocab, d)
        self.pos = w(cfg.max_tokens, d)
        self.blocks = [dict(wq=w(d, d), wk=w(d, d), wv=w(d, d), wo=w(d, d),
                            w1=w(d, 4 * d), w2=w(4 * d, d))
                       for _ in range(cfg.layers)]
        self.kv = [torch.zeros(pages, cfg.block_tokens, 2, cfg.heads,
                               cfg.head_dim) for _ in range(cfg.layers)]

    @staticmethod
    def _norm(x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def prefill(self, tokens, pages, cached=0, wait=None):
        """Logits of tokens[cached:]; their KV goes into `pages` (one page per
        block of the prompt, a trailing partial block included)."""
        cfg = self.cfg
        bt, h, hd = cfg.block_tokens, cfg.heads, cfg.head_dim
        n = len(tokens)
        assert len(pages) * bt >= n and 0 <= cached < n
        ids = torch.tensor(tokens[cached:], dtype=torch.long)
        pos = torch.arange(cached, n)
        page_of = torch.tensor([pages[p // bt] for p in range(n)])
        slot_of = torch.arange(n) % bt
        x = self.embed[ids] + self.pos[pos]
        # Query i (position cached + i) attends to positions <= cached + i.
        mask = torch.arange(n)[None, :] <= pos[:, None]
        for layer, blk in enumerate(self.blocks):
            if wait is not None:
                wait(layer)
            y = self._norm(x)
            q = (y @ blk["wq"]).view(-1, h, hd)
            k = (y @ blk["wk"]).view(-1, h, hd)
            v = (y @ blk["wv"]).view(-1, h, hd)
            kv = self.kv[layer]
            kv[page_of[cached:], slot_of[cached:], 0] = k
            kv[page_of[cached:], slot_of[cached:], 1] = v
            keys = kv[page_of, slot_of, 0]      # [n, heads, head_dim]
            values = kv[page_of, slot_of, 1]
            att = torch.einsum("qhd,khd->hqk", q, keys) / (hd ** 0.5)
            att = att.masked_fill(~mask[None], float("-inf")).softmax(-1)
            out = torch.einsum("hqk,khd->qhd", att, values).reshape(-1, h * hd)
            x = x + out @ blk["wo"]
            x = x + torch.relu(self._norm(x) @ blk["w1"]) @ blk["w2"]
        return self._norm(x) @ self.embed.T


class Engine:
    """The model plus a dualpath.Client: what an engine's connector does."""

    def __init__(self, model, client):
        self.model = model
        self.client = client
        self.free = list(range(model.kv[0].shape[0]))
        client.register_kv(model.kv)
        self.request_id = 0
        self.last = {}  # what the last prefill did

    def alloc(self, n):
        assert len(self.free) >= n, "out of KV pages"
        got, self.free = self.free[:n], self.free[n:]
        return got

    def release(self, pages):
        self.free.extend(pages)

    def lookup(self, tokens, timeout_s=10.0):
        ticket = self.client.lookup(tokens)
        end = time.monotonic() + timeout_s
        while True:  # the scheduler polls: "ask again later"
            hit = self.client.lookup_result(ticket)
            if hit is not None:
                return hit
            assert time.monotonic() < end, "lookup did not answer"
            time.sleep(0.001)

    def prefill(self, tokens, path="auto", save=True):
        """Logits of the tokens after the stored prefix, with that prefix's
        KV loaded through dualpath; returns (logits, cached, pages)."""
        bt = self.model.cfg.block_tokens
        self.request_id += 1
        blocks, hit_tokens = self.lookup(tokens)
        if hit_tokens >= len(tokens):  # keep one token to compute
            blocks = blocks[:(len(tokens) - 1) // bt]
        pages = self.alloc(-(-len(tokens) // bt))
        cached = len(blocks) * bt
        self.last = dict(loaded=None, errors=[], cached=cached)
        if blocks:
            t = self.client.start_load(self.request_id, blocks,
                                       pages[:len(blocks)], path=path)
            try:
                logits = self.model.prefill(
                    tokens, pages, cached,
                    wait=lambda layer: self.client.wait_for_layer(t, layer))
            except dualpath.Error:
                logits = None  # the load failed: recomputed below
            finally:
                done = self.client.wait(t)
            errors = self.client.load_errors(t)
            self.client.finished()
            self.last.update(loaded=done, errors=errors)
            if done["error"] is not None or done["blocks_ok"] < len(blocks):
                # Recompute from the first block that did not load.
                cached = done["blocks_ok"] * bt if done["error"] is None else 0
                self.last["cached"] = cached
                logits = self.model.prefill(tokens, pages, cached)
        else:
            logits = self.model.prefill(tokens, pages, 0)
        if save:
            full = len(tokens) // bt
            first = cached // bt
            if full > first:
                t = self.client.start_save(self.request_id, tokens, first,
                                           pages[first:full])
                done = self.client.wait(t)
                self.client.finished()
                assert done["error"] is None, done["error"]
        return logits, cached, pages
